package pgfence

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
)

// campaignWait is how long one wait of a campaign lasts before it is asked again (it stays in
// the key's queue meanwhile): a bound on how long one statement holds its snapshot.
const campaignWait = 60 * time.Second

// ErrHandedOff is the cause of a leadership's Context once it handed the key off.
var ErrHandedOff = errors.New("pgfence: leadership handed off")

// StopReason is why a leadership ended: a LossReason's name when it was lost (unreachable at
// the local deadline), or one of these.
type StopReason string

const (
	// StopReleased: resigned, or cancelled with ReleaseOnCancel.
	StopReleased StopReason = "released"
	// StopHandedOff: handed off to another candidate (Leadership.Handoff).
	StopHandedOff StopReason = "handed_off"
	// StopCancelled: cancelled without ReleaseOnCancel: left to expire at its TTL.
	StopCancelled StopReason = "cancelled"
)

type leadershipKey struct{}

// LeadershipOf is the leadership whose context ctx is (or derives from): what OnStartedLeading's
// ctx carries; nil for another context.
func LeadershipOf(ctx context.Context) *Leadership {
	l, _ := ctx.Value(leadershipKey{}).(*Leadership)
	return l
}

// LeaderCallbacks are client-go's leader election callbacks.
type LeaderCallbacks struct {
	// OnStartedLeading runs in a goroutine of its own once elected, with the leadership's
	// context: cancelled the moment the leadership may end (context.Cause says why);
	// LeadershipOf(ctx) is the leadership, with its fence. Neither Run nor Resign waits for it
	// to return: stop its work when ctx is done.
	OnStartedLeading func(ctx context.Context)
	// OnStoppedLeading is called once a leadership that started has ended, after its Context
	// was cancelled; Leadership.StopReason says why.
	OnStoppedLeading func()
	// OnNewLeader is called first with the present (the leader's identity, or "" when nobody
	// leads), then with the identity (the value) of each new leader of the key as it is
	// observed, this candidate included, and "" when nobody leads; from a goroutine of the
	// elector's that observes until Close. Calls are not queued: while one runs, the changes
	// that come and go are not told; the next call has the latest leader (keep it short).
	OnNewLeader func(identity string)
}

// ElectorConfig is what an Elector campaigns with.
type ElectorConfig struct {
	Key string
	// Identity is this candidate's value: its lease's owner, what observers and OnNewLeader see
	// (an address, a version).
	Identity string
	// HoldOptions is the leadership's lease (TTL, Fast, SessionBound, LockDelay) and how it is
	// kept (RenewEvery, Margin, Timeout). TTL is required to campaign, not to observe. The
	// elector sets the owner, the wait and the token, and OnLost is its own (use the callbacks):
	// NewElector refuses them set, as it does Shared and Permits.
	HoldOptions
	// ReleaseOnCancel: when the context a leadership was campaigned with ends, release the
	// lease, so that the next candidate is elected at once (true), or stop renewing and leave it
	// to expire at its TTL (false, client-go's default, for work that may outlive the cancel).
	ReleaseOnCancel bool
	// ObserveTimeout is how long one await_change of an observer waits before asking again; 0:
	// 30 s.
	ObserveTimeout time.Duration
	Callbacks      LeaderCallbacks
}

// Elector campaigns for a key, observes its leaders and calls back: client-go's leader election
// (Run, the callbacks, ReleaseOnCancel) and etcd's concurrency.Election (Campaign, Proclaim,
// Resign, Leader, Observe), on the server's election functions. A leader is the holder of the
// key's lease, its value the lease's owner, and its fence fences its writes.
type Elector struct {
	client *Client
	cfg    ElectorConfig

	mu         sync.Mutex
	leadership *Leadership

	stopWatching context.CancelFunc
	watching     chan struct{}
}

// NewElector checks cfg and, with an OnNewLeader callback, starts observing the key until Close.
func NewElector(client *Client, cfg ElectorConfig) (*Elector, error) {
	if cfg.Key == "" || cfg.Shared || cfg.permits() != 1 {
		return nil, fmt.Errorf("%w: an elector needs a key, and its lease is exclusive", ErrInvalidOptions)
	}
	// Set, they would be silently overridden by the elector's own: refused instead.
	for name, set := range map[string]bool{"Owner": cfg.Owner != "", "Wait": cfg.Wait != 0, "OnLost": cfg.OnLost != nil,
		"Token": cfg.Token != uuid.Nil} {
		if set {
			return nil, fmt.Errorf("%w: %s is the elector's own (use Identity and the callbacks)", ErrInvalidOptions, name)
		}
	}
	// An elector that only observes needs no TTL; Campaign says it is required.
	if cfg.TTL != 0 {
		if _, _, _, err := cfg.timing(); err != nil {
			return nil, err
		}
	}
	if cfg.ObserveTimeout <= 0 {
		cfg.ObserveTimeout = 30 * time.Second
	}
	e := &Elector{client: client, cfg: cfg, stopWatching: func() {}}
	if callback := cfg.Callbacks.OnNewLeader; callback != nil {
		ctx, cancel := context.WithCancel(context.Background())
		e.stopWatching, e.watching = cancel, make(chan struct{})
		go e.callBack(ctx, callback)
	}
	return e, nil
}

// Close stops the observing of OnNewLeader. Leaderships end with the context they were
// campaigned with, or by Resign.
func (e *Elector) Close() {
	e.stopWatching()
	if e.watching != nil {
		<-e.watching
	}
}

// callBack observes for as long as the elector lives, trying again a second after an error
// (from the state it saw last, so that it misses no change).
func (e *Elector) callBack(ctx context.Context, callback func(string)) {
	defer close(e.watching)
	o := e.observing()
	for ctx.Err() == nil {
		leader, err := o.next(ctx)
		if err != nil {
			sleep(ctx, time.Second)
			continue
		}
		identity := ""
		if leader != nil {
			identity = leader.Owner
		}
		callback(identity)
	}
}

// Run is client-go's: campaigns until elected (OnStartedLeading), leads until the leadership
// ends (lost, resigned, handed off, or ctx ended: released with ReleaseOnCancel, else left to
// expire), and returns once OnStoppedLeading has been told. An error only when the campaign
// failed (ctx's when it ended first).
func (e *Elector) Run(ctx context.Context) error {
	l, err := e.Campaign(ctx)
	if err != nil {
		return err
	}
	<-l.stopped
	return nil
}

// Campaign waits until elected with the configured identity and returns the leadership, kept
// renewed, after starting OnStartedLeading. ctx is the candidate's life: when it ends during the
// campaign, the wait is cancelled on the server and nothing is left granted; when it ends while
// leading, the leadership ends (ReleaseOnCancel says how).
func (e *Elector) Campaign(ctx context.Context) (*Leadership, error) {
	if e.cfg.TTL <= 0 {
		return nil, fmt.Errorf("%w: TTL is required to campaign", ErrInvalidOptions)
	}
	opts := e.cfg.HoldOptions
	opts.Owner, opts.Wait, opts.OnLost = e.cfg.Identity, campaignWait, nil
	for {
		opts.Token = uuid.Nil
		kept, err := e.client.Hold(ctx, e.cfg.Key, opts)
		switch {
		case err == nil:
			return e.elected(ctx, kept), nil
		case ctx.Err() != nil:
			return nil, ctx.Err()
		case !errors.Is(err, ErrWaitTimedOut):
			return nil, err
		}
	}
}

func (e *Elector) elected(ctx context.Context, kept *KeptLease) *Leadership {
	l := &Leadership{elector: e, kept: kept, value: e.cfg.Identity, stopped: make(chan struct{}), telling: make(chan struct{})}
	l.ctx, l.cancel = context.WithCancelCause(ctx)
	// The callback gets the leadership with its context, so that it need not capture the elector.
	l.ctx = context.WithValue(l.ctx, leadershipKey{}, l)
	e.mu.Lock()
	e.leadership = l
	e.mu.Unlock()
	if obs := e.observer(); obs != nil {
		obs.LeadershipGained(e.cfg.Key)
	}
	go l.watch(ctx)
	if start := e.cfg.Callbacks.OnStartedLeading; start != nil {
		go start(l.ctx)
	}
	return l
}

// Leadership is the current (or last) leadership of this elector; nil before the first.
func (e *Elector) Leadership() *Leadership {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.leadership
}

// IsLeader is whether this elector leads now (by its lease's local deadline).
func (e *Elector) IsLeader() bool {
	l := e.Leadership()
	return l != nil && l.IsLeader()
}

// Leader is the key's leader now; nil when nobody leads.
func (e *Elector) Leader(ctx context.Context) (*Leader, error) {
	return e.client.Leader(ctx, e.cfg.Key)
}

// Observe yields the key's leaders as they change (fence.await_change in a loop): first the
// present, at once (the leader, or nil when nobody leads), then every change: a new leader (a higher fence), a
// new value proclaimed (the same fence), nil when nobody leads (a resign, a revoke, an expiry, a
// session's end, a fast lease lost in a crash). A broken connection is made again without
// missing a change. While it sees a leader, no answer by that leader's lease expiry (a silent
// network, a server gone) yields an *ObserverBlindError (errors.Is ErrObserverBlind), not the
// old leader nor a vacancy; Observe goes on, and yields what the server says once it answers.
// Any other error the retries could not get past, or ctx's, is the last item.
func (e *Elector) Observe(ctx context.Context) iter.Seq2[*Leader, error] {
	return func(yield func(*Leader, error) bool) {
		o := e.observing()
		for {
			leader, err := o.next(ctx)
			if !yield(leader, err) || err != nil && !errors.Is(err, ErrObserverBlind) {
				return
			}
		}
	}
}

// observing follows a key's leader; seen is what it saw last (nil: nobody, or nothing yet), blind
// that it last said it cannot see, started that it has told the present.
type observing struct {
	elector *Elector
	seen    *Leader
	blind   bool
	started bool
}

// blindSlack is how long past the observed lease's expiry an observer waits for an answer before
// it says it cannot see: the server's answer at that expiry needs its round trip.
const blindSlack = 500 * time.Millisecond

func (e *Elector) observing() *observing { return &observing{elector: e} }

// next is the next change; the first is the present, at once (nil when nobody leads).
// While a leader is seen, no answer by its lease's expiry is an *ObserverBlindError: the leader
// it saw may be gone, and only the server can say; after it, what the server says is news.
func (o *observing) next(ctx context.Context) (*Leader, error) {
	for {
		e := o.elector
		if o.blind || !o.started {
			now, err := e.client.AwaitChange(ctx, e.cfg.Key, nil, 0)
			if err != nil {
				return nil, observeEnded(ctx, err)
			}
			o.seen, o.blind, o.started = now, false, true
			return now, nil
		}
		if o.seen == nil || o.seen.ExpiresAt.IsZero() {
			now, err := e.client.AwaitChange(ctx, e.cfg.Key, o.seen, e.cfg.ObserveTimeout)
			if err != nil {
				return nil, observeEnded(ctx, err)
			}
			if !o.seen.Same(now) {
				o.seen = now
				return now, nil
			}
			continue
		}
		// The server answers by the lease's expiry at the latest (with the same leader if it
		// renewed), so an answer missing then is blindness, whatever its cause.
		wait := min(e.cfg.ObserveTimeout, max(time.Until(o.seen.ExpiresAt), 50*time.Millisecond))
		bounded, cancel := context.WithTimeout(ctx, wait+blindSlack)
		now, err := e.client.AwaitChange(bounded, e.cfg.Key, o.seen, wait)
		cancel()
		switch {
		case err != nil && ctx.Err() != nil:
			return nil, observeEnded(ctx, err)
		case err != nil:
			o.blind = true
			return nil, &ObserverBlindError{Key: e.cfg.Key, Last: o.seen, Err: err}
		case !o.seen.Same(now):
			o.seen = now
			return now, nil
		case now != nil:
			o.seen = now // the same leader, renewed: its new expiry bounds the next wait
		}
	}
}

// observeEnded is ctx's cause once ctx has ended: an await_change given up by its observer changed
// nothing, whatever the retries made of it ("outcome unknown").
func observeEnded(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return context.Cause(ctx)
	}
	return err
}

// Leadership is a leader's term: its lease, kept renewed, with proclaim, hand-off and resign.
type Leadership struct {
	elector *Elector
	kept    *KeptLease
	ctx     context.Context
	cancel  context.CancelCauseFunc

	mu        sync.Mutex
	value     string
	reason    StopReason
	handedOff atomic.Bool
	cancelled atomic.Bool
	stopped   chan struct{} // closed once OnStoppedLeading was told
	// telling is closed just before OnStoppedLeading is called: Resign waits for it, not for
	// stopped, so that OnStoppedLeading may resign too.
	telling chan struct{}
}

// watch ends the leadership with its lease, or with the candidate's context, and tells
// OnStoppedLeading, once.
func (l *Leadership) watch(ctx context.Context) {
	select {
	case <-l.kept.Done():
	case <-ctx.Done():
		l.cancel(context.Cause(ctx))
		if l.elector.cfg.ReleaseOnCancel {
			_ = l.kept.Close()
		} else {
			l.cancelled.Store(true)
			l.kept.abandon(StateUnknown, ReasonUnreachable, context.Cause(ctx))
		}
	}
	l.cancel(context.Cause(l.kept.ctx))
	l.kept.settling()
	reason := StopReleased
	switch {
	case l.handedOff.Load():
		reason = StopHandedOff
	case l.cancelled.Load():
		reason = StopCancelled
	case l.kept.State() != StateReleased:
		reason = StopReason(l.kept.Reason())
	}
	l.mu.Lock()
	l.reason = reason
	l.mu.Unlock()
	if obs := l.elector.observer(); obs != nil {
		obs.LeadershipLost(l.elector.cfg.Key)
	}
	close(l.telling)
	if stopped := l.elector.cfg.Callbacks.OnStoppedLeading; stopped != nil {
		stopped()
	}
	close(l.stopped)
}

// Context is cancelled the moment the leadership may end; context.Cause says why (a
// *LeaseLostError, ErrReleased, ErrHandedOff, or the candidate's context's cause). Judged by the
// lease's deadline at the call too, as a kept lease's Context is: the watch that ends it when the
// lease ends may not have run yet.
func (l *Leadership) Context() context.Context {
	// Only once the lease's Context has its cause: a release or a hand-off sets the state first.
	if !l.kept.IsHeld() && l.kept.ctx.Err() != nil {
		l.cancel(context.Cause(l.kept.ctx))
	}
	return l.ctx
}

// Kept is the leadership's kept lease.
func (l *Leadership) Kept() *KeptLease { return l.kept }

// Lease is the leadership's lease; Fence its fence, for the leader's guarded writes.
func (l *Leadership) Lease() *Lease { return l.kept.Lease() }
func (l *Leadership) Fence() int64  { return l.kept.Fence() }

// IsLeader is whether it still leads, by the lease's local deadline.
func (l *Leadership) IsLeader() bool { return l.kept.IsHeld() }

// Guard is the kept lease's Guard: refused before anything is sent once it no longer leads, and by
// the server (PF002) once another was granted the key.
func (l *Leadership) Guard(ctx context.Context, q Querier) error { return l.kept.Guard(ctx, q) }

// Value is the leader's value: the identity it was elected with, or the one last proclaimed.
func (l *Leadership) Value() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.value
}

// StopReason is why the leadership ended; "" while it leads.
func (l *Leadership) StopReason() StopReason {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.reason
}

// Leader is the leader as observers see it now.
func (l *Leadership) Leader() *Leader {
	lease := l.Lease()
	return &Leader{Fence: lease.Fence, Owner: l.Value(), AcquiredAt: lease.AcquiredAt, ExpiresAt: lease.ExpiresAt}
}

// Proclaim changes the value observers see, keeping the fence (fence.lease_proclaim); a
// *LeaseLostError with its reason when it no longer leads. It never meets a renewal in flight.
func (l *Leadership) Proclaim(ctx context.Context, value string) error {
	if err := l.kept.Err(); err != nil {
		return err
	}
	if !l.kept.lockRenewing(ctx) {
		return ctx.Err()
	}
	done, err := l.elector.client.Proclaim(ctx, l.Lease(), value)
	l.kept.unlockRenewing()
	if err != nil {
		return err
	}
	if !done {
		return l.lostNow(ctx)
	}
	l.mu.Lock()
	l.value = value
	l.mu.Unlock()
	return nil
}

// Handoff ends this leadership and hands the key, with a higher fence, to the candidate
// campaigning with the identity toIdentity, ahead of the others in line (fence.lease_handoff, for
// a rolling update): the new leader, once OnStoppedLeading was told (StopHandedOff). nil,
// changing nothing, when no such candidate waits; a *LeaseLostError when it no longer leads.
func (l *Leadership) Handoff(ctx context.Context, toIdentity string) (*Leader, error) {
	if err := l.kept.Err(); err != nil {
		return nil, err
	}
	leader, err := l.handoff(ctx, toIdentity)
	if leader == nil || err != nil {
		return nil, err
	}
	l.handedOff.Store(true)
	l.kept.abandon(StateReleased, "", ErrHandedOff)
	<-l.stopped
	return leader, nil
}

func (l *Leadership) handoff(ctx context.Context, to string) (*Leader, error) {
	client, lease := l.elector.client, l.Lease()
	if !l.kept.lockRenewing(ctx) {
		return nil, ctx.Err()
	}
	defer l.kept.unlockRenewing()
	leader, err := client.Handoff(ctx, lease, to)
	if leader != nil || err != nil {
		return leader, err
	}
	// No such candidate; or a retry after a hand-off whose answer was lost: then the lease ended
	// as released, and the leader is whoever leads now.
	why, err := client.ended(ctx, lease)
	switch {
	case err != nil || why == nil:
		return nil, err
	case why.released:
		return client.Leader(ctx, lease.Key)
	}
	l.kept.end(StateLost, why.reason)
	return nil, &LeaseLostError{Key: lease.Key, Reason: why.reason}
}

// lostNow: the server said the lease is not held: lost, for the reason lease_status gives.
func (l *Leadership) lostNow(ctx context.Context) error {
	reason := ReasonUnknown
	if why, _ := l.elector.client.ended(ctx, l.Lease()); why != nil {
		reason = why.reason
	}
	l.kept.end(StateLost, reason)
	return &LeaseLostError{Key: l.Lease().Key, Reason: reason}
}

// Resign releases the leadership and returns, as Run does, once OnStoppedLeading has returned:
// true when the server said so (StopReleased); false when it had ended already (StopReason says
// why, and Kept().Reason() what the release found). A Resign once OnStoppedLeading was called
// (from it, which may resign too) returns without waiting for it. Neither Resign nor Run waits
// for OnStartedLeading to return.
func (l *Leadership) Resign(ctx context.Context) (bool, error) {
	told := false
	select {
	case <-l.telling:
		told = true // maybe from OnStoppedLeading itself, which waiting would deadlock
	default:
	}
	released, err := l.kept.Release(ctx)
	if told {
		<-l.telling
	} else {
		<-l.stopped
	}
	return released, err
}

// observer is the client's Observer; nil for none (or no client, in the package's own tests).
func (e *Elector) observer() Observer {
	if e.client == nil {
		return nil
	}
	return e.client.Observer
}
