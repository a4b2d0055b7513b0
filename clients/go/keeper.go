package pgfence

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// HoldOptions is what Hold asks for: the lease, and how it is kept.
type HoldOptions struct {
	AcquireOptions
	// RenewEvery: how often to renew; 0: TTL/3, so that two renewals in a row can fail and a third
	// still has time. It must be below TTL less the margin (ErrInvalidOptions otherwise).
	RenewEvery time.Duration
	// Margin is taken off the local deadline, so that the holder is told before the server's
	// expiry rather than just after: it covers the telling, and clocks (this host's and the
	// server's) whose rates differ by up to 0.1 %. 0: max(TTL/1000, min(TTL/50, 100 ms)).
	Margin time.Duration
	// Timeout bounds one try of the acquire (beyond its Wait) and the whole release; 0: 10 s.
	Timeout time.Duration
	// OnLost is called once, from the keeper, the moment the lease becomes lost or unknown (not
	// when released), with the cause its Context is cancelled with. Keep it short.
	OnLost func(cause error)
}

// timing is how often a keeper renews, and how long a renewal keeps the lease by its deadline.
func (o HoldOptions) timing() (span, every, timeout time.Duration, err error) {
	margin := o.Margin
	if margin <= 0 {
		margin = max(o.TTL/1000, min(o.TTL/50, 100*time.Millisecond))
	}
	span, every, timeout = o.TTL-margin, o.RenewEvery, o.Timeout
	if every <= 0 {
		every = o.TTL / 3
	}
	if timeout <= 0 {
		timeout = 10 * time.Second
	}
	if every <= 0 || every >= span {
		err = fmt.Errorf("%w: renew every %v must be above zero and below the ttl less the margin, %v", ErrInvalidOptions, every, span)
	}
	return span, every, timeout, err
}

// kept is what a keeper keeps: one lease, or a set.
type kept struct {
	lease *Lease
	set   *LeaseSet
}

func (k kept) keys() []string {
	if k.set != nil {
		return k.set.Keys()
	}
	return []string{k.lease.Key}
}

func (k kept) label() string { return strings.Join(k.keys(), ", ") }

func (k kept) first() *Lease {
	if k.set != nil {
		return &k.set.Leases[0]
	}
	return k.lease
}

func (k kept) renewal(ttl time.Duration) renewal {
	if k.set != nil {
		return renewAllOf(k.set, ttl)
	}
	return renewOf(k.lease, ttl)
}

// release: whether it ended the lease, or every lease of the set.
func (k kept) release(ctx context.Context, q Querier) (bool, error) {
	if k.set != nil {
		n, err := ReleaseAll(ctx, q, k.set)
		return n == len(k.set.Leases), err
	}
	return Release(ctx, q, k.lease)
}

func (k kept) ended(ctx context.Context, q Querier) (*ended, error) {
	return endedOn(ctx, q, k.keys(), k.first().Token, k.first().Durable)
}

// KeptLease is a lease (Hold) or a lease set (HoldAll) kept renewed in the background by the
// client's keeper, over its few connections (a session-bound lease: on the connection that took
// it). Its Context is cancelled the moment the lease may be lost, with a cause
// (context.Cause) that says why: a *LeaseLostError with its Reason, or ErrReleased. Stop the work
// then, and guard every write with its fence anyway: stopping is never guaranteed to be in time.
type KeptLease struct {
	client  *Client
	kept    kept
	ttl     time.Duration
	span    time.Duration // ttl less the margin
	every   time.Duration
	timeout time.Duration
	bound   bool // session-bound: renewed on the connection that took it, or not at all
	onLost  func(error)

	ctx    context.Context
	cancel context.CancelCauseFunc
	stop   context.CancelFunc // ends the keeper's goroutine
	halt   context.Context    // done once stop is called
	done   chan struct{}      // closed when the keeper's goroutine has ended

	mu     sync.Mutex
	state  State
	reason LossReason
	// sent is when the last acquire or renew that succeeded was sent; deadline is sent plus the
	// span. The server started the TTL later than sent, so it cannot have expired the lease before
	// the deadline however long the network took (if the clocks' rates differ by less than the
	// margin covers).
	sent      time.Time
	deadline  time.Time
	abandoned bool // stopped without a release: handed off, or left to expire
	// startTold: the observer was told the lease is kept; endTold: that it ended (or it never
	// will be, when the start failed).
	startTold, endTold bool

	// renewing is held around each renewal; an elector's proclaim and hand-off take it too. A
	// channel, not a mutex: the keeper waits for it only until the deadline, so that a proclaim
	// hanging while it holds it cannot keep the lease told held past the deadline.
	renewing chan struct{}
	// keeper renews the lease, with the client's others; nil for a session-bound lease, which
	// keeps its own connection: own, used by its goroutine, and by Release once that has ended.
	keeper *keeper
	own    ownConn

	releaseOnce sync.Once
	// releasing: a release was sent, which may end the lease and grant the key to a waiter
	// before its answer comes: not held from then on. releaseDone is closed once it settled.
	releasing   bool
	releaseDone chan struct{}
	released    bool
	releaseErr  error
}

// Hold acquires key (waiting up to opts.Wait; ErrWaitTimedOut when not granted) and keeps it: a
// goroutine renews it every opts.RenewEvery through the client's keeper (its few connections of
// its own, outside the pool; a session-bound lease on the connection that took it), retrying
// failed renewals, and cancels its Context when the server
// says it is lost, when its session ends (session-bound: told at once, the connection is
// watched), or at the local deadline when no renewal succeeded in time. ctx bounds the acquire;
// the kept lease lives until Release or Close. A shared lease or a permit is kept the same way.
func (c *Client) Hold(ctx context.Context, key string, opts HoldOptions) (*KeptLease, error) {
	if err := opts.check(); err != nil {
		return nil, err
	}
	opts.AcquireOptions = opts.AcquireOptions.withToken()
	k, err := c.newKept(opts)
	if err != nil {
		return nil, err
	}
	// Taken before the first try: whichever try granted the lease was sent after it.
	sent := time.Now()
	var lease *Lease
	token := opts.Token
	if opts.SessionBound {
		lease, token, err = k.acquireBound(ctx, key, opts.AcquireOptions)
	} else {
		lease, err = retrying(ctx, k.acquiring(opts.Wait, opts.Token), func(ctx context.Context, conn *pgx.Conn) (*Lease, error) {
			return Acquire(ctx, conn, key, opts.AcquireOptions)
		})
	}
	c.acquired(sent, lease != nil, err)
	if err != nil || lease == nil {
		return nil, k.notGranted(err, key, token)
	}
	k.kept = kept{lease: lease}
	return k.start(sent)
}

// HoldFirstFree takes the first key of keys, in order, that is free now (fence.lease_acquire_any,
// one round trip, never waiting) and keeps it as Hold does: nil, nil when none is free. For a
// worker pool that wants any one item of many. opts.Wait, Shared, Permits, LockDelay and
// SessionBound are refused (ErrInvalidOptions). A call given up after it was sent releases its
// token, whichever key it may have been granted.
func (c *Client) HoldFirstFree(ctx context.Context, keys []string, opts HoldOptions) (*KeptLease, error) {
	if err := opts.checkAny(); err != nil {
		return nil, err
	}
	if opts.SessionBound {
		return nil, fmt.Errorf("%w: the first free key is kept by the keeper, not session-bound", ErrInvalidOptions)
	}
	opts.AcquireOptions = opts.AcquireOptions.withToken()
	k, err := c.newKept(opts)
	if err != nil {
		return nil, err
	}
	sent := time.Now()
	lease, err := retrying(ctx, k.acquiring(0, opts.Token), func(ctx context.Context, conn *pgx.Conn) (*Lease, error) {
		return AcquireAny(ctx, conn, keys, opts.AcquireOptions)
	})
	c.acquired(sent, lease != nil, err)
	if err != nil {
		for _, key := range keys {
			_ = k.notGranted(err, key, opts.Token)
		}
		return nil, err
	}
	if lease == nil {
		return nil, nil
	}
	k.kept = kept{lease: lease}
	return k.start(sent)
}

// HoldAll is Hold for every key of keys, or none: one lease per key, kept as a set, renewed with
// one lease_renew_all, released with one lease_release_all, and lost as a whole (the keeper then
// releases the set's other leases at once). Its acquire takes no token, so it is not sent again
// after a try that may have been granted: an *OutcomeUnknownError then, and such a set ends at its
// TTL.
func (c *Client) HoldAll(ctx context.Context, keys []string, opts HoldOptions) (*KeptLease, error) {
	if err := checkSet(opts.AcquireOptions); err != nil {
		return nil, err
	}
	k, err := c.newKept(opts)
	if err != nil {
		return nil, err
	}
	sent := time.Now()
	r := k.acquiring(opts.Wait, uuid.Nil)
	r.resend = false
	set, err := retrying(ctx, r, func(ctx context.Context, conn *pgx.Conn) (*LeaseSet, error) {
		return AcquireAll(ctx, conn, keys, opts.AcquireOptions)
	})
	c.acquired(sent, set != nil, err)
	if err != nil || set == nil {
		return nil, k.notGranted(err, strings.Join(keys, ", "), uuid.Nil)
	}
	k.kept = kept{set: set}
	return k.start(sent)
}

func (c *Client) newKept(opts HoldOptions) (*KeptLease, error) {
	span, every, timeout, err := opts.timing()
	if err != nil {
		return nil, err
	}
	k := &KeptLease{client: c, ttl: opts.TTL, span: span, every: every, timeout: timeout,
		bound: opts.SessionBound, onLost: opts.OnLost, state: StateHeld, done: make(chan struct{}), renewing: make(chan struct{}, 1), releaseDone: make(chan struct{}),
		own: ownConn{config: c.Pool.Config().ConnConfig}}
	if !k.bound {
		k.keeper = c.keeperOf()
	}
	k.ctx, k.cancel = context.WithCancelCause(context.Background())
	k.halt, k.stop = context.WithCancel(context.Background())
	return k, nil
}

// retry is how the keeper's calls are tried again: on the client keeper's connections, or a
// session-bound lease's own, made anew after one broke or hung.
func (k *KeptLease) retry(extra time.Duration, token uuid.UUID) retry {
	get := k.own.get
	if k.keeper != nil {
		get = k.keeper.get
	}
	return retry{get: get, backoff: k.client.Backoff, limit: k.timeout + extra, resend: true, token: token}
}

// acquiring is how an acquire is tried: where the caller's calls go (the pool), since the lease
// is the keeper's only once granted; a session-bound lease's on the connection that will be its
// session.
func (k *KeptLease) acquiring(extra time.Duration, token uuid.UUID) retry {
	r := k.retry(extra, token)
	if !k.bound {
		r.get = pooled(k.client.Pool)
	}
	return r
}

// acquireBound acquires a session-bound lease. The server returns the lease a token holds to
// whichever session asks, and a session-bound lease lives with the backend that took it: after a
// try whose outcome is unknown (its connection broke on this side only, or timed out, while its
// backend lives on), a retry with that token would get a lease bound to that orphaned backend,
// ending whenever it does. So each retry first releases the previous try's token, then asks with
// a fresh one, and the grant is checked to be bound to the session it came on. The token is the
// last one sent: when the retries run out, only its grant may still be held, so it is the one the
// *OutcomeUnknownError carries and the one to release.
func (k *KeptLease) acquireBound(ctx context.Context, key string, opts AcquireOptions) (*Lease, uuid.UUID, error) {
	next, unsure, last := opts.Token, uuid.Nil, opts.Token
	lease, err := retrying(ctx, k.retry(opts.Wait, opts.Token), func(ctx context.Context, conn *pgx.Conn) (*Lease, error) {
		if unsure != uuid.Nil {
			if _, err := ReleaseToken(ctx, conn, key, unsure); err != nil {
				return nil, err
			}
		}
		if next == uuid.Nil {
			next = uuid.New()
		}
		opts.Token, unsure, last, next = next, next, next, uuid.Nil
		lease, err := Acquire(ctx, conn, key, opts)
		if err != nil || lease == nil {
			return lease, err
		}
		var here *bool
		err = conn.QueryRow(ctx, "SELECT session_pid = pg_backend_pid() FROM fence.leases WHERE key = $1 AND fence = $2",
			key, lease.Fence).Scan(&here)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return nil, err
		}
		if !deref(here) {
			// The token was already another session's (a caller's token used twice): left unsure,
			// so the next try releases it and takes a fresh one.
			return nil, errors.New("pgfence: granted to another session")
		}
		unsure = uuid.Nil
		return lease, nil
	})
	if unknown := (*OutcomeUnknownError)(nil); errors.As(err, &unknown) {
		unknown.Token = last
	}
	return lease, last, err
}

// notGranted is the error of an acquire that got no lease. When the caller gave up, or the
// outcome is unknown, a grant may have come meanwhile that nobody would use: its token is
// released first (within the timeout), so nothing is left held behind the caller's back.
func (k *KeptLease) notGranted(err error, key string, token uuid.UUID) error {
	k.own.drop()
	if err == nil {
		return fmt.Errorf("%w: %q", ErrWaitTimedOut, key)
	}
	if token != uuid.Nil && (errors.Is(err, ErrOutcomeUnknown) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)) {
		k.releaseGivenUp(key, token)
	}
	return err
}

// releaseGivenUp releases the token of an acquire its caller gave up, on the keeper's
// connections (not the caller's, which may be the ones that hung): the caller waits for it up to
// the timeout, and it goes on in the background until done or the TTL has passed, when any grant
// of that token has ended anyway. Each try is short, so that a hung connection is soon replaced.
func (k *KeptLease) releaseGivenUp(key string, token uuid.UUID) {
	until := time.Now().Add(k.ttl)
	r := k.retry(0, token)
	r.limit = min(k.timeout, max(k.every, time.Second))
	release := func(ctx context.Context) bool {
		_, err := retrying(ctx, r, func(ctx context.Context, conn *pgx.Conn) (bool, error) {
			return ReleaseToken(ctx, conn, key, token)
		})
		return err == nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), min(k.ttl, k.timeout))
	defer cancel()
	if release(ctx) || !time.Now().Before(until) {
		return
	}
	go func() {
		ctx, cancel := context.WithDeadline(context.Background(), until)
		defer cancel()
		for ctx.Err() == nil && !release(ctx) {
			sleep(ctx, k.retryDelay(0))
		}
	}()
}

// start starts the keeper of what was granted by a try sent no earlier than sent.
func (k *KeptLease) start(sent time.Time) (*KeptLease, error) {
	k.sent, k.deadline = sent, sent.Add(k.span)
	// A long wait, or retries, may have used up the margin that sent leaves: renew at once.
	if time.Since(sent) >= k.every {
		ctx, cancel := context.WithTimeout(context.Background(), k.timeout)
		defer cancel()
		renewedAt := time.Now()
		if _, err := k.tryRenew(ctx, k.timeout); err != nil {
			k.own.drop()
			_, _ = k.releaseBy(ctx)
			return nil, err
		}
		k.sent, k.deadline = renewedAt, renewedAt.Add(k.span)
	}
	if obs := k.observer(); obs != nil {
		k.mu.Lock()
		k.startTold = true
		k.mu.Unlock()
		obs.KeptLeaseStarted(k)
	}
	go k.run()
	return k, nil
}

func (k *KeptLease) run() {
	state, reason := k.renewUntilEnded()
	cause := k.settle(state, reason)
	// Release waits for the keeper only this far, and the keeper is done with its connection:
	// OnLost, next, may well close the kept lease.
	close(k.done)
	if cause == nil {
		return
	}
	k.tell(cause)
	// A session-bound lease is lost also when its connection broke on this side only: its
	// backend may live on, holding the key, until the server notices. A set is lost when one of
	// its leases is: the others are held for nothing. Harmless otherwise: a token that holds
	// nothing releases nothing. On the pool's connections: the keeper's own is given up.
	if state == StateLost && (k.bound || k.kept.set != nil) {
		ctx, cancel := context.WithTimeout(context.Background(), k.timeout)
		defer cancel()
		if k.kept.set != nil {
			_, _ = k.client.ReleaseAll(ctx, k.kept.set)
		} else {
			_, _ = k.client.Release(ctx, k.kept.lease)
		}
	}
}

// errSessionLost: a session-bound lease's connection broke, or may have.
var errSessionLost = errors.New("pgfence: the lease's session ended or was lost")

// renewUntilEnded renews until the lease is lost (StateLost with its reason), the deadline passes
// without a renewal (StateUnknown), or the keeper is stopped ("").
func (k *KeptLease) renewUntilEnded() (State, LossReason) {
	for {
		k.mu.Lock()
		due, deadline := k.sent.Add(k.every), k.deadline
		k.mu.Unlock()
		if closed := k.pause(due); k.halt.Err() != nil {
			return "", ""
		} else if closed {
			return StateLost, ReasonSessionEnded
		}
		// The deadline bounds the renewal from outside, so that it fires while a call hangs.
		ctx, cancel := context.WithDeadline(k.halt, deadline)
		sent, err := k.renewUntilAnswered(ctx, deadline)
		cancel()
		switch {
		case k.halt.Err() != nil:
			return "", ""
		case err == nil && time.Now().Before(deadline):
			k.mu.Lock()
			k.sent, k.deadline = sent, sent.Add(k.span)
			k.mu.Unlock()
		case errors.Is(err, ErrLeaseLost):
			// Told one statement later, with the reason.
			ctx, cancel := context.WithTimeout(k.halt, min(k.every, k.timeout))
			why := k.whyEnded(ctx)
			cancel()
			if why == nil {
				return StateLost, ReasonUnknown
			}
			return StateLost, why.reason
		case errors.Is(err, errSessionLost):
			return StateLost, ReasonSessionEnded
		default:
			k.own.drop()
			return StateUnknown, ReasonUnreachable
		}
	}
}

// whyEnded asks lease_status once, on the connection the renewal came back on; nil without an
// answer.
func (k *KeptLease) whyEnded(ctx context.Context) *ended {
	if k.keeper == nil {
		why, _ := k.kept.ended(ctx, k.own.conn)
		return why
	}
	r := k.retry(0, uuid.Nil)
	r.backoff.MaxAttempts = 1
	why, _ := retrying(ctx, r, func(ctx context.Context, conn *pgx.Conn) (*ended, error) { return k.kept.ended(ctx, conn) })
	return why
}

// pause sleeps until due, or until the keeper is stopped; for a session-bound lease it watches
// the connection meanwhile: the server writes to an idle session only to end it (a terminate, a
// shutdown, a crash), so the read that returns early tells that the lease ended with its session.
// Whether it did.
func (k *KeptLease) pause(due time.Time) (closed bool) {
	if !k.bound {
		// Early to a grid, so that the renewals of leases kept at about the same period fall
		// due together and are sent in one call.
		due = due.Truncate(min(k.every/8, 50*time.Millisecond))
	}
	ctx, cancel := context.WithDeadline(k.halt, due)
	defer cancel()
	if !k.bound {
		<-ctx.Done()
		return false
	}
	for ctx.Err() == nil {
		conn := k.own.conn
		if conn == nil || conn.IsClosed() {
			return true
		}
		if err := conn.PgConn().WaitForNotification(ctx); err != nil && ctx.Err() == nil || conn.IsClosed() {
			return true
		}
	}
	return false
}

// renewUntilAnswered tries until the server answers: when the renewal that succeeded was sent,
// or an error: ErrLeaseLost (PF001), errSessionLost, or ctx's when the deadline passed or the
// keeper was stopped.
func (k *KeptLease) renewUntilAnswered(ctx context.Context, deadline time.Time) (time.Time, error) {
	for retry := 0; ; retry++ {
		// A try that hangs is abandoned in time for another on a new connection; but a
		// session-bound lease would end with its connection.
		limit := time.Until(deadline)
		if !k.bound {
			limit = min(k.every, limit)
		}
		if !k.lockRenewing(ctx) {
			return time.Time{}, ctx.Err()
		}
		if k.State() != StateHeld {
			// Handed off, or found lost by a proclaim, meanwhile: the stop follows.
			k.unlockRenewing()
			<-ctx.Done()
			return time.Time{}, ctx.Err()
		}
		sent := time.Now()
		_, err := k.tryRenew(ctx, limit)
		k.unlockRenewing()
		switch {
		case err == nil:
			return sent, nil
		case errors.Is(err, ErrLeaseLost):
			return sent, err
		case ctx.Err() != nil:
			return sent, ctx.Err()
		case k.bound && (mayHaveTakenEffect(err) || errors.Is(err, errSessionLost) || k.own.conn == nil || k.own.conn.IsClosed()):
			k.own.drop()
			return sent, errSessionLost
		}
		k.own.drop()
		if !sleep(ctx, k.retryDelay(retry)) {
			return sent, ctx.Err()
		}
	}
}

// lockRenewing takes the renewal lock, unless ctx ends first: whether it did.
func (k *KeptLease) lockRenewing(ctx context.Context) bool {
	select {
	case k.renewing <- struct{}{}:
		return true
	case <-ctx.Done():
		return false
	}
}

func (k *KeptLease) unlockRenewing() { <-k.renewing }

// retryDelay is the sleep before a renewal's retry n: the client's backoff, capped at a quarter
// of the renewal period, so that a renewal is tried several times before the deadline and a
// server back from a restart is heard from within that, not after the backoff's 2 s.
func (k *KeptLease) retryDelay(retry int) time.Duration {
	backoff := k.client.Backoff.orDefault()
	backoff.Cap = max(min(backoff.Cap, k.every/4), time.Millisecond)
	return backoff.Delay(retry)
}

// tryRenew is one renewal, under a statement_timeout that ends it on the server by the time it is
// abandoned here, so that a stuck renewal does not keep holding the key's lock. The timeout is
// reset in the same round trip (the three statements are pipelined; the first is undone if the
// renewal fails), so that the connection does not keep it.
func (k *KeptLease) tryRenew(ctx context.Context, limit time.Duration) (time.Time, error) {
	if k.bound && (k.own.conn == nil || k.own.conn.IsClosed()) {
		return time.Time{}, errSessionLost
	}
	if k.keeper != nil {
		_, expires, err := k.keeper.renew(ctx, k.kept, k.ttl, limit)
		return expires, err
	}
	if obs := k.observer(); obs != nil {
		start := time.Now()
		expires, err := k.renewOwn(ctx, limit)
		obs.RenewFinished(time.Since(start), renewOutcome(err, errors.Is(err, ErrLeaseLost)), 1)
		return expires, err
	}
	return k.renewOwn(ctx, limit)
}

// renewOwn renews a session-bound lease on its own connection.
func (k *KeptLease) renewOwn(ctx context.Context, limit time.Duration) (time.Time, error) {
	conn, _, err := k.own.get(ctx)
	if err != nil {
		return time.Time{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	renew := k.kept.renewal(k.ttl)
	batch := &pgx.Batch{}
	batch.Queue("SELECT set_config('statement_timeout', $1, false)", fmt.Sprintf("%dms", max(limit.Milliseconds(), 1)))
	batch.Queue(renew.sql, renew.args...)
	batch.Queue("RESET statement_timeout")
	results := conn.SendBatch(ctx, batch)
	_, setErr := results.Exec()
	var expires time.Time
	renewErr := results.QueryRow().Scan(&expires)
	_, resetErr := results.Exec()
	closeErr := results.Close()
	return expires, typed(errors.Join(renewErr, setErr, resetErr, closeErr), renew.label, 0)
}

// end moves a held lease to lost or unknown, cancels its Context and tells OnLost: once.
func (k *KeptLease) end(state State, reason LossReason) bool {
	cause := k.settle(state, reason)
	if cause != nil {
		k.tell(cause)
	}
	return cause != nil
}

// settle is end without OnLost: the cause to tell, nil when it did not move the lease ("" is no
// move).
func (k *KeptLease) settle(state State, reason LossReason) *LeaseLostError {
	k.mu.Lock()
	if state == "" || k.state != StateHeld {
		k.mu.Unlock()
		return nil
	}
	k.state, k.reason = state, reason
	k.mu.Unlock()
	cause := &LeaseLostError{Key: k.kept.label(), Reason: reason}
	k.cancel(cause)
	k.ended()
	if obs := k.observer(); obs != nil {
		obs.LeaseLost(k, reason)
	}
	return cause
}

func (k *KeptLease) tell(cause error) {
	if k.onLost != nil {
		k.onLost(cause)
	}
}

// abandon stops the keeper without a release: the lease was handed off (released), or is left to
// expire at its TTL (unknown). OnLost is not told.
func (k *KeptLease) abandon(state State, reason LossReason, cause error) {
	k.mu.Lock()
	k.abandoned = true
	if k.state == StateHeld {
		k.state, k.reason = state, reason
	}
	k.mu.Unlock()
	k.cancel(cause)
	k.stop()
	k.ended()
}

// ended tells the observer once that the lease is kept no more, if it was told it started.
func (k *KeptLease) ended() {
	obs := k.observer()
	if obs == nil {
		return
	}
	k.mu.Lock()
	tell := k.startTold && !k.endTold
	k.endTold = true
	k.mu.Unlock()
	if tell {
		obs.KeptLeaseEnded(k)
	}
}

// Release stops the keeper and releases the lease on a connection of its own (made again if
// need be), retried within HoldOptions.Timeout: true when the server said this release ended
// it (for a set: every one of its leases). The state then says what became of it: released;
// lost, for the reason the server gives, when the token no longer held it (a lease unknown at its
// deadline learns here whether it was taken over); unknown with no answer (its TTL ends it). A
// lease already lost is not sent again: false. Later calls return what the first did.
func (k *KeptLease) Release(ctx context.Context) (bool, error) {
	k.releaseOnce.Do(func() {
		defer close(k.releaseDone)
		defer k.ended()
		k.stop()
		<-k.done
		k.mu.Lock()
		sendable := !k.abandoned && (k.state == StateHeld || k.state == StateUnknown)
		k.releasing = sendable
		k.mu.Unlock()
		if sendable {
			k.cancel(ErrReleased)
			ctx, cancel := context.WithTimeout(ctx, k.timeout)
			defer cancel()
			k.released, k.releaseErr = k.releaseBy(ctx)
		}
		k.own.drop()
	})
	return k.released, k.releaseErr
}

// Close is Release, for defer: its error, if any.
func (k *KeptLease) Close() error {
	_, err := k.Release(context.Background())
	return err
}

// releaseBy releases by token and settles the state on the answer: released only when the server
// said it ended the lease (or an earlier try of this release did, its answer lost: lease_status
// says released), lost when the token no longer held it, unknown with no answer. OnLost is not
// told: the holder has stopped using the lease.
func (k *KeptLease) releaseBy(ctx context.Context) (bool, error) {
	released, err := retrying(ctx, k.retry(0, uuid.Nil), func(ctx context.Context, conn *pgx.Conn) (bool, error) {
		return k.kept.release(ctx, conn)
	})
	to, reason, cause := StateReleased, LossReason(""), error(ErrReleased)
	switch {
	case err != nil:
		to, reason = StateUnknown, ReasonUnreachable
	case !released:
		why, _ := retrying(ctx, k.retry(0, uuid.Nil), func(ctx context.Context, conn *pgx.Conn) (*ended, error) {
			return k.kept.ended(ctx, conn)
		})
		if why == nil || !why.released {
			to, reason = StateLost, ReasonUnknown
			if why != nil {
				reason = why.reason
			}
		}
	}
	if to != StateReleased {
		cause = &LeaseLostError{Key: k.kept.label(), Reason: reason}
	}
	k.mu.Lock()
	wasHeld := k.state == StateHeld
	if k.state == StateHeld || k.state == StateUnknown {
		k.state, k.reason = to, reason
	}
	told := k.startTold
	k.mu.Unlock()
	k.cancel(cause)
	if obs := k.observer(); obs != nil && told && wasHeld && to == StateLost {
		obs.LeaseLost(k, reason)
	}
	return released, err
}

// Context is cancelled the moment the lease may be lost, or once its release is sent; context.Cause
// says why: a *LeaseLostError (errors.Is ErrLeaseLost) with its Reason, or ErrReleased.
func (k *KeptLease) Context() context.Context {
	k.IsHeld()
	return k.ctx
}

// Done is Context().Done().
func (k *KeptLease) Done() <-chan struct{} { return k.Context().Done() }

// Err is nil while the lease is held, else why not (as context.Cause of its Context).
func (k *KeptLease) Err() error {
	if k.IsHeld() {
		return nil
	}
	return context.Cause(k.ctx)
}

// IsHeld is false once the local deadline has passed without a renewal, whether or not the
// keeper's goroutine has run since (after this process was stopped, say), or the lease was lost
// or released, or its release was sent.
func (k *KeptLease) IsHeld() bool {
	k.mu.Lock()
	held, late := k.state == StateHeld && !k.releasing, !time.Now().Before(k.deadline)
	k.mu.Unlock()
	if held && late {
		k.end(StateUnknown, ReasonUnreachable)
		return false
	}
	return held
}

// State is where the lease stands (by its deadline too).
func (k *KeptLease) State() State {
	k.IsHeld()
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.state
}

// Reason is why the lease was lost: the reason of StateLost, ReasonUnreachable for StateUnknown;
// "" while held and once released.
func (k *KeptLease) Reason() LossReason {
	k.IsHeld()
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.reason
}

// Deadline is the local deadline: the lease is known to be held until then.
func (k *KeptLease) Deadline() time.Time {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.deadline
}

// Lease is the kept lease (a set's first, in key order).
func (k *KeptLease) Lease() *Lease { return k.kept.first() }

// Set is the kept lease set; nil for a single lease.
func (k *KeptLease) Set() *LeaseSet { return k.kept.set }

// Key is the lease's key (a set's keys, comma-separated).
func (k *KeptLease) Key() string { return k.kept.label() }

// Fence is the lease's fence (a set's first), to guard writes under it.
func (k *KeptLease) Fence() int64 { return k.kept.first().Fence }

// FenceOf is the fence of the kept lease on key; false for a key it does not keep.
func (k *KeptLease) FenceOf(key string) (int64, bool) {
	if k.kept.set != nil {
		return k.kept.set.Fence(key)
	}
	return k.kept.lease.Fence, key == k.kept.lease.Key
}

// Guard checks, before anything is sent, that the lease is held (its *LeaseLostError otherwise),
// then runs the server's guard in q's transaction: a *StaleFenceError when the server refuses the
// fence, which also ends the kept lease, for the reason the server gives.
func (k *KeptLease) Guard(ctx context.Context, q Querier) error {
	return k.GuardKey(ctx, q, k.Lease().Key)
}

// GuardKey is Guard for one key of a kept set.
func (k *KeptLease) GuardKey(ctx context.Context, q Querier, key string) error {
	fence, ok := k.FenceOf(key)
	if !ok {
		return fmt.Errorf("%w: %q is not a key of this lease", ErrInvalidOptions, key)
	}
	if err := k.Err(); err != nil {
		return err
	}
	return k.refusedBy(FenceGuard(ctx, q, key, fence))
}

// FencedUpdate is Guard's check, then the server's FencedUpdate under the lease's fence.
func (k *KeptLease) FencedUpdate(ctx context.Context, q Querier, table string, changes, filter map[string]any) (int64, error) {
	if err := k.Err(); err != nil {
		return 0, err
	}
	updated, err := FencedUpdate(ctx, q, k.Lease().Key, k.Fence(), table, changes, filter)
	return updated, k.refusedBy(err)
}

// refusedBy ends the kept lease when err is the server refusing its fence: the lease is lost, for
// the reason lease_status gives (one statement, one try).
func (k *KeptLease) refusedBy(err error) error {
	if errors.Is(err, ErrStaleFence) {
		ctx, cancel := context.WithTimeout(context.Background(), k.timeout)
		defer cancel()
		first := k.kept.first()
		reason := ReasonUnknown
		if why := k.client.endedOnce(ctx, k.kept.keys(), first.Token, first.Durable); why != nil {
			reason = why.reason
		}
		k.end(StateLost, reason)
	}
	return err
}

// settling waits, when a release was sent, until it settled the state.
func (k *KeptLease) settling() {
	k.mu.Lock()
	releasing := k.releasing
	k.mu.Unlock()
	if releasing {
		<-k.releaseDone
	}
}

// observer is the client's Observer; nil for none (or no client, in the package's own tests).
func (k *KeptLease) observer() Observer {
	if k.client == nil {
		return nil
	}
	return k.client.Observer
}
