package pgfence

import (
	"context"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Client is the calls with retries, over a pool: a broken connection is made again (with backoff,
// full jitter) and the call retried, which is safe for each of them: an acquire carries the token
// drawn before its first try, so a retry after a lost reply gets the lease that reply granted;
// renew and release are safe as they are. Fenced writes are tried once: only the caller knows
// whether a write may happen twice. It is also where kept leases (Hold) and electors start.
type Client struct {
	Pool *pgxpool.Pool
	// Backoff between tries; the zero value is the default (see Backoff).
	Backoff Backoff
	// CallTimeout bounds each try of a call (beyond an acquire's wait); 0: 30 s.
	CallTimeout time.Duration
	// KeeperConnections is how many connections of its own the client's keeper renews its kept
	// leases over (session-bound ones aside); 0: DefaultKeeperConnections. Read when the first
	// lease is kept.
	KeeperConnections int
	// Observer, when set, is told of the client's acquires, renewals, kept leases, losses and
	// leaderships (for metrics: see the fenceprom package). Set it before the first call.
	Observer Observer

	keeperOnce sync.Once
	keeper     *keeper
}

// NewClient is a Client over pool (see ParsePoolConfig for a pool tuned for it).
func NewClient(pool *pgxpool.Pool) *Client { return &Client{Pool: pool} }

func (c *Client) retry(extra time.Duration) retry {
	limit := c.CallTimeout
	if limit <= 0 {
		limit = 30 * time.Second
	}
	return retry{get: pooled(c.Pool), backoff: c.Backoff, limit: limit + extra, resend: true}
}

// on runs a one-statement call, retried.
func on[T any](ctx context.Context, r retry, call func(context.Context, Querier) (T, error)) (T, error) {
	return retrying(ctx, r, func(ctx context.Context, conn *pgx.Conn) (T, error) { return call(ctx, conn) })
}

// Acquire is the one-statement Acquire, retried with one token for every try (opts.Token, or one
// drawn now). When the outcome is unknown the *OutcomeUnknownError carries that token. An acquire
// its caller gives up (ctx cancelled or timed out, during a try or its wait) returns ctx's error
// and leaves no grant behind: the client releases that token in the background (over the pool,
// bounded by the TTL), so a grant whose reply never came
// ends within moments, not at its TTL.
func (c *Client) Acquire(ctx context.Context, key string, opts AcquireOptions) (*Lease, error) {
	if err := opts.check(); err != nil {
		return nil, err
	}
	opts = opts.withToken()
	r := c.retry(opts.Wait)
	r.token = opts.Token
	start := time.Now()
	lease, err := on(ctx, r, func(ctx context.Context, q Querier) (*Lease, error) { return Acquire(ctx, q, key, opts) })
	c.acquired(start, lease != nil, err)
	if err != nil && ctx.Err() != nil {
		go c.releaseGivenUp(key, opts.Token, opts.TTL)
		return nil, context.Cause(ctx)
	}
	return lease, err
}

// releaseGivenUp releases, in the background, the token of an acquire its caller gave up after
// it may have been sent (cancelled or timed out): a grant its caller will never
// see is not left to its TTL. Short tries over the pool (a hung connection is soon given up),
// again until released or the TTL has passed, when any grant of that token has ended anyway.
func (c *Client) releaseGivenUp(key string, token uuid.UUID, ttl time.Duration) {
	if ttl <= 0 {
		ttl = 60 * time.Second // the server's default TTL bounds it then
	}
	ctx, cancel := context.WithTimeout(context.Background(), ttl)
	defer cancel()
	r := c.retry(0)
	r.limit = min(r.limit, time.Second)
	for ctx.Err() == nil {
		_, err := on(ctx, r, func(ctx context.Context, q Querier) (bool, error) { return ReleaseToken(ctx, q, key, token) })
		if err == nil {
			return
		}
		sleep(ctx, 100*time.Millisecond)
	}
}

// AcquireAll is the one-statement AcquireAll, retried only while no try can have been granted
// (no connection, the server starting up): it takes no token, so a try whose reply was lost
// cannot be asked again for the set it may have granted. Such a try ends it with an
// *OutcomeUnknownError; the set, if granted, stays held until its TTL.
func (c *Client) AcquireAll(ctx context.Context, keys []string, opts AcquireOptions) (*LeaseSet, error) {
	if err := checkSet(opts); err != nil {
		return nil, err
	}
	r := c.retry(opts.Wait)
	r.resend = false
	start := time.Now()
	set, err := on(ctx, r, func(ctx context.Context, q Querier) (*LeaseSet, error) { return AcquireAll(ctx, q, keys, opts) })
	c.acquired(start, set != nil, err)
	return set, err
}

// Renew is the one-statement Renew, retried; its *LeaseLostError says why (lease_status).
func (c *Client) Renew(ctx context.Context, lease *Lease, ttl time.Duration) (time.Time, error) {
	renewed, err := on(ctx, c.retry(0), func(ctx context.Context, q Querier) (time.Time, error) { return Renew(ctx, q, lease, ttl) })
	return renewed, c.explained(ctx, err, []string{lease.Key}, lease.Token, lease.Durable)
}

// RenewAll is the one-statement RenewAll, retried; its *LeaseLostError says why.
func (c *Client) RenewAll(ctx context.Context, set *LeaseSet, ttl time.Duration) (time.Time, error) {
	renewed, err := on(ctx, c.retry(0), func(ctx context.Context, q Querier) (time.Time, error) { return RenewAll(ctx, q, set, ttl) })
	return renewed, c.explained(ctx, err, set.Keys(), set.Token, set.Leases[0].Durable)
}

// explained gives a *LeaseLostError the reason the server has for it: one statement, one try,
// bounded by the call timeout; without an answer the reason stays empty.
func (c *Client) explained(ctx context.Context, err error, keys []string, token uuid.UUID, durable bool) error {
	lost, ok := err.(*LeaseLostError)
	if !ok {
		return err
	}
	if why := c.endedOnce(ctx, keys, token, durable); why != nil {
		lost.Reason = why.reason
	}
	return lost
}

// endedOnce asks lease_status in one try; nil when live or no answer came.
func (c *Client) endedOnce(ctx context.Context, keys []string, token uuid.UUID, durable bool) *ended {
	r := c.retry(0)
	r.backoff.MaxAttempts = 1
	why, _ := on(ctx, r, func(ctx context.Context, q Querier) (*ended, error) { return endedOn(ctx, q, keys, token, durable) })
	return why
}

// ended asks lease_status, retried; nil while the lease is live.
func (c *Client) ended(ctx context.Context, lease *Lease) (*ended, error) {
	return on(ctx, c.retry(0), func(ctx context.Context, q Querier) (*ended, error) {
		return endedOn(ctx, q, []string{lease.Key}, lease.Token, lease.Durable)
	})
}

// Release is the one-statement Release, retried (a release done twice is done once).
func (c *Client) Release(ctx context.Context, lease *Lease) (bool, error) {
	return c.ReleaseToken(ctx, lease.Key, lease.Token)
}

// ReleaseToken is Release by key and token: what an *OutcomeUnknownError's token may have granted.
// A retry that finds the token holding nothing asks lease_status: an earlier try whose answer was
// lost may have been the one that ended it, and then this call did release it.
func (c *Client) ReleaseToken(ctx context.Context, key string, token uuid.UUID) (bool, error) {
	tries := 0
	return on(ctx, c.retry(0), func(ctx context.Context, q Querier) (bool, error) {
		tries++
		released, err := ReleaseToken(ctx, q, key, token)
		if err != nil || released || tries == 1 {
			return released, err
		}
		status, err := Status(ctx, q, key, token)
		if err != nil {
			return false, err
		}
		return !status.Live() && status.Reason == "released", nil
	})
}

// ReleaseAll is the one-statement ReleaseAll, retried.
func (c *Client) ReleaseAll(ctx context.Context, set *LeaseSet) (int, error) {
	return on(ctx, c.retry(0), func(ctx context.Context, q Querier) (int, error) { return ReleaseAll(ctx, q, set) })
}

// Status is the one-statement Status, retried.
func (c *Client) Status(ctx context.Context, key string, token uuid.UUID) (*LeaseStatus, error) {
	return on(ctx, c.retry(0), func(ctx context.Context, q Querier) (*LeaseStatus, error) { return Status(ctx, q, key, token) })
}

// CurrentFence is the one-statement CurrentFence, retried.
func (c *Client) CurrentFence(ctx context.Context, key string) (int64, error) {
	return on(ctx, c.retry(0), func(ctx context.Context, q Querier) (int64, error) { return CurrentFence(ctx, q, key) })
}

// FencedUpdate is the one-statement FencedUpdate on a connection of the pool, tried once: after
// a broken connection its outcome is unknown, and only the caller can tell whether doing it twice
// is harmless.
func (c *Client) FencedUpdate(ctx context.Context, key string, fence int64, table string, changes, filter map[string]any) (int64, error) {
	return FencedUpdate(ctx, c.Pool, key, fence, table, changes, filter)
}

// AwaitChange is the one-statement AwaitChange, retried; each try waits timeout at most (beyond
// the call timeout).
func (c *Client) AwaitChange(ctx context.Context, key string, seen *Leader, timeout time.Duration) (*Leader, error) {
	return on(ctx, c.retry(timeout), func(ctx context.Context, q Querier) (*Leader, error) { return AwaitChange(ctx, q, key, seen, timeout) })
}

// Leader is the key's leader now; nil when nobody leads.
func (c *Client) Leader(ctx context.Context, key string) (*Leader, error) {
	return c.AwaitChange(ctx, key, nil, 0)
}

// Proclaim is the one-statement Proclaim, retried (a proclaim done twice is done once).
func (c *Client) Proclaim(ctx context.Context, lease *Lease, owner string) (bool, error) {
	return on(ctx, c.retry(0), func(ctx context.Context, q Querier) (bool, error) { return Proclaim(ctx, q, lease, owner) })
}

// Handoff is the one-statement Handoff, retried: a retry after a hand-off whose answer was lost
// finds the token holding nothing and returns nil; Status then says released.
func (c *Client) Handoff(ctx context.Context, lease *Lease, toOwner string) (*Leader, error) {
	return on(ctx, c.retry(0), func(ctx context.Context, q Querier) (*Leader, error) { return Handoff(ctx, q, lease, toOwner) })
}
