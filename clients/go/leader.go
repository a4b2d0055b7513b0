package pgfence

import (
	"context"
	"time"
)

// Leader is a key's leader as observers see it: the fence and owner of its live lease (for
// shared leases and semaphores, the live one with the highest fence). Owner is the leader's
// value: what it was granted with, or last proclaimed.
type Leader struct {
	Fence      int64
	Owner      string
	AcquiredAt time.Time
	ExpiresAt  time.Time
}

// Same is whether two leaders (nil: nobody leads) are one state of the key: the same fence and
// owner.
func (l *Leader) Same(other *Leader) bool {
	if l == nil || other == nil {
		return l == other
	}
	return l.Fence == other.Fence && l.Owner == other.Owner
}

// scanLeader reads a row (fence, owner, acquired_at, expires_at); nil for the row of NULLs.
func scanLeader(row interface{ Scan(...any) error }) (*Leader, error) {
	var (
		fence    *int64
		owner    *string
		from, to *time.Time
	)
	if err := row.Scan(&fence, &owner, &from, &to); err != nil || fence == nil {
		return nil, err
	}
	return &Leader{Fence: *fence, Owner: deref(owner), AcquiredAt: deref(from), ExpiresAt: deref(to)}, nil
}

// AwaitChange is fence.await_change: the key's leader (nil: nobody leads) as soon as it differs
// from seen, or when timeout runs out, unchanged. seen nil with a timeout waits for a leader; a
// zero timeout answers at once.
func AwaitChange(ctx context.Context, q Querier, key string, seen *Leader, timeout time.Duration) (*Leader, error) {
	var fence, owner any
	if seen != nil {
		fence, owner = seen.Fence, seen.Owner
	}
	return scanLeader(q.QueryRow(ctx, `SELECT fence, owner, acquired_at, expires_at
		FROM fence.await_change($1, $2::bigint, $3::text, $4::interval)`, key, fence, owner, timeout))
}

// Proclaim changes the owner (the leader's value) of the live lease, keeping its fence:
// false when the token no longer holds it.
func Proclaim(ctx context.Context, q Querier, lease *Lease, owner string) (bool, error) {
	var done bool
	err := q.QueryRow(ctx, "SELECT fence.lease_proclaim($1, $2, $3)", lease.Key, lease.Token, owner).Scan(&done)
	return done, err
}

// Handoff ends the lease and grants the key, with a higher fence, to a session waiting for it
// whose owner is toOwner, ahead of the queue: that new leader. nil, changing nothing, when no
// such acquirer waits, or the token no longer holds the lease (Status then says released, after
// a hand-off whose answer was lost).
func Handoff(ctx context.Context, q Querier, lease *Lease, toOwner string) (*Leader, error) {
	return scanLeader(q.QueryRow(ctx, "SELECT fence, owner, acquired_at, expires_at FROM fence.lease_handoff($1, $2, $3)",
		lease.Key, lease.Token, toOwner))
}
