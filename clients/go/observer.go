package pgfence

import "time"

// Observer is told what a Client does, for metrics: acquires and renewals with how long they
// took, kept leases starting and ending, losses with their reason, leaderships gained and lost.
// Set it as Client.Observer before the client's first call; the fenceprom package has one for
// Prometheus. Embed NopObserver to implement only some methods.
//
// Its methods are called on the goroutine that did the work (the caller's, a kept lease's, the
// keeper's), concurrently: they must be safe for that, short, and never block.
type Observer interface {
	// AcquireFinished: an acquire ended (Acquire, AcquireAll, and the acquire of every kept lease:
	// Hold, HoldFirstFree, HoldAll, an elector's campaign), retries and the wait included.
	AcquireFinished(took time.Duration, outcome AcquireOutcome)
	// RenewFinished: a renewal call of kept leases ended: one round trip of the client's keeper
	// (leases: how many kept leases it renewed, a set counting once), or one renewal of a
	// session-bound lease (leases: 1).
	RenewFinished(took time.Duration, outcome RenewOutcome, leases int)
	// KeptLeaseStarted: a kept lease was granted and is kept from now on.
	KeptLeaseStarted(lease *KeptLease)
	// KeptLeaseEnded: a kept lease is kept no more (lost, released, handed off or left to
	// expire). Told once, after KeptLeaseStarted.
	KeptLeaseEnded(lease *KeptLease)
	// LeaseLost: a kept lease was lost while held (as HoldOptions.OnLost is told), or its
	// holder's release found it lost already.
	LeaseLost(lease *KeptLease, reason LossReason)
	// LeadershipGained: an elector of this client won its campaign; election is its key.
	LeadershipGained(election string)
	// LeadershipLost: a leadership that was gained ended. Told once, after LeadershipGained.
	LeadershipLost(election string)
}

// AcquireOutcome is how an acquire ended, as metrics label it.
type AcquireOutcome string

const (
	// AcquireGranted: the lease was granted.
	AcquireGranted AcquireOutcome = "granted"
	// AcquireRefused: the key was held by others (after the wait, if any).
	AcquireRefused AcquireOutcome = "refused"
	// AcquireError: the acquire returned an error (the server out of reach, the call refused, the
	// caller's context done).
	AcquireError AcquireOutcome = "error"
)

// RenewOutcome is how a renewal call ended, as metrics label it.
type RenewOutcome string

const (
	// RenewOK: every lease of the call was renewed.
	RenewOK RenewOutcome = "ok"
	// RenewLost: the server said at least one lease of the call was no longer held.
	RenewLost RenewOutcome = "lost"
	// RenewError: the call failed (no answer, a broken connection); it is tried again while time
	// is left.
	RenewError RenewOutcome = "error"
)

// NopObserver does nothing: embed it in an Observer that needs only some of the methods.
type NopObserver struct{}

// AcquireFinished does nothing.
func (NopObserver) AcquireFinished(time.Duration, AcquireOutcome) {}

// RenewFinished does nothing.
func (NopObserver) RenewFinished(time.Duration, RenewOutcome, int) {}

// KeptLeaseStarted does nothing.
func (NopObserver) KeptLeaseStarted(*KeptLease) {}

// KeptLeaseEnded does nothing.
func (NopObserver) KeptLeaseEnded(*KeptLease) {}

// LeaseLost does nothing.
func (NopObserver) LeaseLost(*KeptLease, LossReason) {}

// LeadershipGained does nothing.
func (NopObserver) LeadershipGained(string) {}

// LeadershipLost does nothing.
func (NopObserver) LeadershipLost(string) {}

// acquired tells the client's observer of an acquire sent at start.
func (c *Client) acquired(start time.Time, granted bool, err error) {
	if c.Observer == nil {
		return
	}
	outcome := AcquireRefused
	switch {
	case err != nil:
		outcome = AcquireError
	case granted:
		outcome = AcquireGranted
	}
	c.Observer.AcquireFinished(time.Since(start), outcome)
}

// renewOutcome is the outcome of a renewal call that returned err.
func renewOutcome(err error, lost bool) RenewOutcome {
	switch {
	case lost:
		return RenewLost
	case err != nil:
		return RenewError
	}
	return RenewOK
}
