package pgfence

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
)

// LeaseSet is what lease_acquire_all granted: a lease per key, in key order, each with its own
// fence, all sharing one token; renewed and released together.
type LeaseSet struct {
	Leases []Lease
	Token  uuid.UUID
}

func (s *LeaseSet) Keys() []string {
	keys := make([]string, len(s.Leases))
	for i, lease := range s.Leases {
		keys[i] = lease.Key
	}
	return keys
}

// Fence is the fence of the set's lease on key; false for a key outside the set.
func (s *LeaseSet) Fence(key string) (int64, bool) {
	for _, lease := range s.Leases {
		if lease.Key == key {
			return lease.Fence, true
		}
	}
	return 0, false
}

// ExpiresAt is the earliest expiry of the set's leases.
func (s *LeaseSet) ExpiresAt() time.Time {
	earliest := s.Leases[0].ExpiresAt
	for _, lease := range s.Leases[1:] {
		if lease.ExpiresAt.Before(earliest) {
			earliest = lease.ExpiresAt
		}
	}
	return earliest
}

// label names the set as errors do: its keys, comma-separated.
func (s *LeaseSet) label() string { return strings.Join(s.Keys(), ", ") }

// checkSet refuses what lease_acquire_all cannot take: it draws the set's token itself, and its
// leases are exclusive.
func checkSet(opts AcquireOptions) error {
	if opts.Token != uuid.Nil || opts.Shared || opts.permits() != 1 || opts.LockDelay != 0 {
		return fmt.Errorf("%w: a lease set takes no token, shared, permits or lock delay", ErrInvalidOptions)
	}
	return nil
}

// AcquireAll grants every key, or none: nil, nil when one of them is held and the wait ran out.
// The server draws the set's token, so a try whose reply was lost cannot be asked again for the
// set it may have granted: the Client does not retry such a try.
func AcquireAll(ctx context.Context, q Querier, keys []string, opts AcquireOptions) (*LeaseSet, error) {
	if err := checkSet(opts); err != nil {
		return nil, err
	}
	var owner any
	if opts.Owner != "" {
		owner = opts.Owner
	}
	rows, err := q.Query(ctx, leaseColumns+"fence.lease_acquire_all($1::text[], $2::interval, $3::text, $4::interval, $5, $6)",
		keys, opts.TTL, owner, opts.Wait, opts.SessionBound, !opts.Fast)
	if err != nil {
		return nil, typed(err, strings.Join(keys, ", "), 0)
	}
	leases, err := scanLeases(rows, opts)
	if err != nil || len(leases) == 0 {
		return nil, typed(err, strings.Join(keys, ", "), 0)
	}
	return &LeaseSet{Leases: leases, Token: leases[0].Token}, nil
}

// RenewAll renews every lease of the set and returns the earliest new expiry; a *LeaseLostError
// naming the set's keys when the token no longer holds one of them, and then none is renewed.
func RenewAll(ctx context.Context, q Querier, set *LeaseSet, ttl time.Duration) (time.Time, error) {
	return renewWith(ctx, q, renewAllOf(set, ttl))
}

func renewAllOf(set *LeaseSet, ttl time.Duration) renewal {
	return renewal{"SELECT fence.lease_renew_all($1::text[], $2, $3::interval)", []any{set.Keys(), set.Token, ttl}, set.label()}
}

// ReleaseAll ends every lease of the set still held with its token: how many this call ended (0
// when none was, so a retry is harmless).
func ReleaseAll(ctx context.Context, q Querier, set *LeaseSet) (int, error) {
	var released int
	err := q.QueryRow(ctx, "SELECT fence.lease_release_all($1::text[], $2)", set.Keys(), set.Token).Scan(&released)
	return released, err
}
