package pgfence

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// DefaultKeeperConnections is how many connections a client's keeper renews over when
// Client.KeeperConnections is 0.
const DefaultKeeperConnections = 2

// renewMany is the most leases one lease_renew_many call renews (the server refuses more).
const renewMany = 64

// keeper renews every kept lease of a client (but session-bound ones, whose session is the lease)
// over a few connections of its own, made from the pool's config but outside the pool: a pool
// taken whole by the application must not keep a renewal from being sent, and a hundred kept
// leases must not be a hundred backends. Renewals that are due at once are sent together.
type keeper struct {
	observer Observer      // the client's, when the keeper was made
	slots    chan *ownConn // a connection is used by one call at a time: taken from here, put back
	made     atomic.Int64  // connections made since the keeper started

	mu      sync.Mutex
	pending []*renewReq
	samples []time.Duration // renewal round trips, for RenewalLatency
}

// renewReq is one lease's renewal waiting to be sent; reply is buffered so that a sender never
// waits on a requester that gave up.
type renewReq struct {
	kept  kept
	ttl   time.Duration
	until time.Time // the try is abandoned then: the requester needs time to try again
	taken bool      // in a call already: the requester waits for its reply
	reply chan renewResult
}

type renewResult struct {
	sent    time.Time
	expires time.Time
	err     error
}

func newKeeper(config *pgx.ConnConfig, n int) *keeper {
	if n <= 0 {
		n = DefaultKeeperConnections
	}
	config = config.Copy()
	// Its own name, so that its connections can be told from the pool's in pg_stat_activity.
	config.RuntimeParams["application_name"] = config.RuntimeParams["application_name"] + "_keeper"
	kp := &keeper{slots: make(chan *ownConn, n)}
	for range n {
		kp.slots <- &ownConn{config: config, made: &kp.made}
	}
	return kp
}

// keeperOf is the client's keeper, made with its first kept lease.
func (c *Client) keeperOf() *keeper {
	c.keeperOnce.Do(func() {
		c.keeper = newKeeper(c.Pool.Config().ConnConfig, c.KeeperConnections)
		c.keeper.observer = c.Observer
	})
	return c.keeper
}

// KeeperStats is what a client's keeper has done: the connections it made, and the round trip
// of its renewal calls (p50 and p99; zero before any).
type KeeperStats struct {
	ConnectionsMade int
	RenewalP50      time.Duration
	RenewalP99      time.Duration
}

// KeeperStats says how the client's keeper has kept its leases so far.
func (c *Client) KeeperStats() KeeperStats {
	kp := c.keeperOf()
	kp.mu.Lock()
	samples := append([]time.Duration(nil), kp.samples...)
	kp.mu.Unlock()
	stats := KeeperStats{ConnectionsMade: int(kp.made.Load())}
	if len(samples) > 0 {
		sort.Slice(samples, func(i, j int) bool { return samples[i] < samples[j] })
		stats.RenewalP50 = samples[len(samples)*50/100]
		stats.RenewalP99 = samples[min(len(samples)*99/100, len(samples)-1)]
	}
	return stats
}

// Close closes the keeper's connections; kept leases must be released first. The client may be
// used again: its keeper then makes new ones.
func (c *Client) Close() {
	kp := c.keeperOf()
	for range cap(kp.slots) {
		slot := <-kp.slots
		slot.drop()
		kp.slots <- slot
	}
}

// get is a getConn over the keeper's connections: one of them, until done is called.
func (kp *keeper) get(ctx context.Context) (*pgx.Conn, func(bool), error) {
	var slot *ownConn
	select {
	case slot = <-kp.slots:
	case <-ctx.Done():
		return nil, nil, ctx.Err()
	}
	conn, _, err := slot.get(ctx)
	if err != nil {
		kp.slots <- slot
		return nil, nil, err
	}
	return conn, func(broken bool) {
		if broken {
			slot.drop()
		}
		kp.slots <- slot
	}, nil
}

// renew renews one kept lease, in a call with whatever other renewals are waiting: the caller
// whose request finds a connection free sends every request waiting (up to 64 a call), its own
// among them, so that no goroutine of the keeper's own runs between kept leases.
func (kp *keeper) renew(ctx context.Context, what kept, ttl time.Duration, limit time.Duration) (time.Time, time.Time, error) {
	req := &renewReq{kept: what, ttl: ttl, until: time.Now().Add(limit), reply: make(chan renewResult, 1)}
	kp.mu.Lock()
	kp.pending = append(kp.pending, req)
	kp.mu.Unlock()
	for {
		kp.mu.Lock()
		taken := req.taken
		kp.mu.Unlock()
		free := kp.slots
		if taken {
			free = nil // in another's call: only its reply is awaited
		}
		select {
		case res := <-req.reply:
			return res.sent, res.expires, res.err
		case slot := <-free:
			if batch := kp.take(); len(batch) > 0 {
				kp.send(slot, batch)
			}
			kp.slots <- slot
		case <-ctx.Done():
			kp.forget(req)
			return time.Time{}, time.Time{}, ctx.Err()
		}
	}
}

// take takes the requests to send in one call: a set alone (renewed with lease_renew_all), or up
// to 64 single leases.
func (kp *keeper) take() []*renewReq {
	kp.mu.Lock()
	defer kp.mu.Unlock()
	var batch []*renewReq
	rest := kp.pending[:0]
	for _, req := range kp.pending {
		switch {
		case len(batch) > 0 && (batch[0].kept.set != nil || req.kept.set != nil || len(batch) == renewMany):
			rest = append(rest, req)
		default:
			req.taken = true
			batch = append(batch, req)
		}
	}
	clear(kp.pending[len(rest):])
	kp.pending = rest
	return batch
}

func (kp *keeper) forget(req *renewReq) {
	kp.mu.Lock()
	defer kp.mu.Unlock()
	for i, r := range kp.pending {
		if r == req {
			kp.pending = append(kp.pending[:i], kp.pending[i+1:]...)
			return
		}
	}
}

// send sends one call on slot and replies to each request. The call is bounded by the earliest
// of its requests' limits, and by a statement_timeout that ends it on the server by then, so that
// a stuck call does not keep holding the keys' locks; a call that failed or hung gives up its
// connection, and the next is made anew.
func (kp *keeper) send(slot *ownConn, batch []*renewReq) {
	until := batch[0].until
	for _, req := range batch[1:] {
		if req.until.Before(until) {
			until = req.until
		}
	}
	ctx, cancel := context.WithDeadline(context.Background(), until)
	defer cancel()
	sent := time.Now()
	expires, err := kp.call(ctx, slot, batch, max(time.Until(until), time.Millisecond))
	if err != nil {
		slot.drop()
	} else {
		kp.mu.Lock()
		kp.samples = append(kp.samples, time.Since(sent))
		if len(kp.samples) > 100_000 {
			kp.samples = kp.samples[len(kp.samples)/2:]
		}
		kp.mu.Unlock()
	}
	for i, req := range batch {
		res := renewResult{sent: sent, err: err}
		if err == nil {
			res.expires = expires[i]
			if expires[i].IsZero() {
				res.err = &LeaseLostError{Key: req.kept.label()}
			}
		}
		req.reply <- res
	}
	if kp.observer != nil {
		lost := false
		for i := range expires {
			lost = lost || expires[i].IsZero()
		}
		kp.observer.RenewFinished(time.Since(sent), renewOutcome(err, err == nil && lost), len(batch))
	}
}

// call is one round trip: statement_timeout set, the renewals, and the timeout reset, pipelined;
// a zero time for a lease the server no longer has under that token.
func (kp *keeper) call(ctx context.Context, slot *ownConn, batch []*renewReq, limit time.Duration) ([]time.Time, error) {
	conn, _, err := slot.get(ctx)
	if err != nil {
		return nil, err
	}
	b := &pgx.Batch{}
	b.Queue("SELECT set_config('statement_timeout', $1, false)", fmt.Sprintf("%dms", max(limit.Milliseconds(), 1)))
	var label string
	if set := batch[0].kept.set; set != nil {
		r := renewAllOf(set, batch[0].ttl)
		label = r.label
		b.Queue(r.sql, r.args...)
	} else {
		keys, tokens, ttls := make([]string, len(batch)), make([]uuid.UUID, len(batch)), make([]time.Duration, len(batch))
		for i, req := range batch {
			keys[i], tokens[i], ttls[i] = req.kept.lease.Key, req.kept.lease.Token, req.ttl
		}
		b.Queue("SELECT expires_at FROM fence.lease_renew_many($1::text[], $2::uuid[], $3::interval[])", keys, tokens, ttls)
	}
	b.Queue("RESET statement_timeout")
	results := conn.SendBatch(ctx, b)
	_, setErr := results.Exec()
	expires := make([]time.Time, 0, len(batch))
	var renewErr error
	if batch[0].kept.set != nil {
		var at time.Time
		renewErr = results.QueryRow().Scan(&at)
		expires = append(expires, at)
	} else if rows, err := results.Query(); err != nil {
		renewErr = err
	} else {
		for rows.Next() {
			var at *time.Time
			if err := rows.Scan(&at); err != nil {
				renewErr = err
				break
			}
			expires = append(expires, deref(at))
		}
		rows.Close()
		renewErr = errors.Join(renewErr, rows.Err())
	}
	_, resetErr := results.Exec()
	closeErr := results.Close()
	if err := errors.Join(renewErr, setErr, resetErr, closeErr); err != nil {
		if lost := (*LeaseLostError)(nil); errors.As(typed(err, label, 0), &lost) {
			// A set's lease_renew_all says PF001 for the set as a whole.
			return make([]time.Time, len(batch)), nil
		}
		return nil, typed(err, label, 0)
	}
	if len(expires) != len(batch) {
		return nil, fmt.Errorf("pgfence: %d renewals answered for %d sent", len(expires), len(batch))
	}
	return expires, nil
}
