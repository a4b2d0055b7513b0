package pgfence

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// Querier runs one statement: pgx.Tx, *pgx.Conn, *pgxpool.Pool and *pgxpool.Conn are all one.
// Every call of this file runs one statement through it, in the caller's transaction as any
// statement does (a grant rolled back is no grant), and never retries: the Client does.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// AcquireOptions is what lease_acquire is asked for. The zero value of each field is the
// server's default, so only TTL must be set.
type AcquireOptions struct {
	TTL time.Duration
	// Owner is a label for humans, and an elector's value; empty: the session's application_name.
	Owner string
	// Wait up to this long for the key to become free (0: answer at once).
	Wait time.Duration
	// SessionBound: the lease also ends when the session that took it ends.
	SessionBound bool
	// Fast: durable => false, a lease that waits for no WAL flush and is lost in a crash.
	Fast bool
	// Shared: a reader's lease; any number at once, never beside an exclusive one.
	Shared bool
	// Permits: one of at most this many live leases of the key (a semaphore); 0 or 1 is the
	// exclusive lease.
	Permits int
	// Token: the lease's secret. A retried acquire must send the same one, so that a retry after
	// a lost reply gets the lease that reply granted; the Client and Hold draw one per acquire.
	Token uuid.UUID
	// LockDelay: after an end that is not a release (expiry, revoke, session end), nobody is
	// granted the key for this long (Consul's lock-delay).
	LockDelay time.Duration
}

func (o AcquireOptions) check() error {
	if o.Permits < 0 {
		return fmt.Errorf("%w: permits %d below 1", ErrInvalidOptions, o.Permits)
	}
	if o.Shared && o.Permits > 1 {
		return fmt.Errorf("%w: a shared lease cannot have permits", ErrInvalidOptions)
	}
	return nil
}

func (o AcquireOptions) permits() int { return max(o.Permits, 1) }

// withToken is o with a token: its own, or a fresh random one.
func (o AcquireOptions) withToken() AcquireOptions {
	if o.Token == uuid.Nil {
		o.Token = uuid.New()
	}
	return o
}

// Lease is a granted lease. Token is the secret renew and release need; Fence is what fenced
// writes compare (opaque: compare it, never compute with it).
type Lease struct {
	Key        string
	Owner      string
	Fence      int64
	Token      uuid.UUID
	AcquiredAt time.Time
	ExpiresAt  time.Time
	Durable    bool
	Shared     bool
	Permits    int
}

const leaseColumns = "SELECT key, owner, fence, token, acquired_at, expires_at FROM "

// Acquire grants key when it can, waiting up to opts.Wait; nil, nil when it is held (or all its
// permits are) or the wait ran out. Without opts.Token, a fresh one is drawn for this call.
func Acquire(ctx context.Context, q Querier, key string, opts AcquireOptions) (*Lease, error) {
	if err := opts.check(); err != nil {
		return nil, err
	}
	opts = opts.withToken()
	sql, args := acquireSQL(key, opts)
	rows, err := q.Query(ctx, sql, args...)
	if err != nil {
		return nil, typed(err, key, 0)
	}
	leases, err := scanLeases(rows, opts)
	if err != nil || len(leases) == 0 {
		return nil, typed(err, key, 0)
	}
	return &leases[0], nil
}

// acquireSQL passes shared, permits and lock_delay by name, and only when asked for, so that a
// plain lease works against a server without them.
func acquireSQL(key string, opts AcquireOptions) (string, []any) {
	var owner any
	if opts.Owner != "" {
		owner = opts.Owner
	}
	args := []any{key, opts.TTL, owner, opts.Wait, opts.SessionBound, !opts.Fast, opts.Token}
	named := ""
	add := func(name string, value any, cast string) {
		args = append(args, value)
		named += fmt.Sprintf(", %s => $%d%s", name, len(args), cast)
	}
	if opts.Shared {
		add("shared", true, "")
	}
	if opts.permits() != 1 {
		add("permits", opts.Permits, "::int")
	}
	if opts.LockDelay > 0 {
		add("lock_delay", opts.LockDelay, "::interval")
	}
	return leaseColumns + "fence.lease_acquire($1, $2::interval, $3::text, $4::interval, $5, $6, $7::uuid" + named + ")", args
}

// scanLeases reads lease rows, skipping the row of NULLs the server answers a refusal with.
func scanLeases(rows pgx.Rows, opts AcquireOptions) ([]Lease, error) {
	defer rows.Close()
	var leases []Lease
	for rows.Next() {
		var (
			key, owner *string
			fence      *int64
			token      *uuid.UUID
			from, to   *time.Time
		)
		if err := rows.Scan(&key, &owner, &fence, &token, &from, &to); err != nil {
			return nil, err
		}
		if fence == nil {
			continue
		}
		lease := Lease{Key: *key, Fence: *fence, Token: *token, AcquiredAt: *from, ExpiresAt: *to,
			Durable: !opts.Fast, Shared: opts.Shared, Permits: opts.permits()}
		if owner != nil {
			lease.Owner = *owner
		}
		leases = append(leases, lease)
	}
	return leases, rows.Err()
}

// Renew extends the lease to now + ttl by the server's clock and returns the new expiry; a
// *LeaseLostError (without its reason: the Client asks) when the token no longer holds it.
func Renew(ctx context.Context, q Querier, lease *Lease, ttl time.Duration) (time.Time, error) {
	return renewWith(ctx, q, renewOf(lease, ttl))
}

// renewal is a renew's statement, kept apart so that the keeper can send it in a pipeline.
type renewal struct {
	sql   string
	args  []any
	label string // the key, or a set's keys, as a *LeaseLostError names them
}

func renewOf(lease *Lease, ttl time.Duration) renewal {
	return renewal{"SELECT fence.lease_renew($1, $2, $3::interval)", []any{lease.Key, lease.Token, ttl}, lease.Key}
}

func renewWith(ctx context.Context, q Querier, r renewal) (time.Time, error) {
	var expires time.Time
	err := q.QueryRow(ctx, r.sql, r.args...).Scan(&expires)
	return expires, typed(err, r.label, 0)
}

// Release ends the lease: true when this call ended it, false when the token held nothing (so a
// retry is harmless and never touches a newer holder).
func Release(ctx context.Context, q Querier, lease *Lease) (bool, error) {
	return ReleaseToken(ctx, q, lease.Key, lease.Token)
}

// ReleaseToken is Release by key and token alone: for a lease whose grant may have happened
// but was never seen (an *OutcomeUnknownError's token).
func ReleaseToken(ctx context.Context, q Querier, key string, token uuid.UUID) (bool, error) {
	var released bool
	err := q.QueryRow(ctx, "SELECT fence.lease_release($1, $2)", key, token).Scan(&released)
	return released, err
}

// LeaseStatus is fence.lease_status of a token: whether its lease on a key is live, or why it
// ended.
type LeaseStatus struct {
	State string // "live" or "ended"
	// Reason is the server's word while ended: released, expired, revoked, taken_over,
	// session_ended, or unknown (the row is gone, or the token never held the key).
	Reason       string
	Fence        int64 // 0 when the server knows nothing of the token
	ExpiresAt    time.Time
	CurrentFence int64 // the key's last fence (CurrentFence)
}

func (s *LeaseStatus) Live() bool { return s.State == "live" }

// Status is fence.lease_status(key, token).
func Status(ctx context.Context, q Querier, key string, token uuid.UUID) (*LeaseStatus, error) {
	var (
		reason         *string
		fence, current *int64
		expires        *time.Time
		status         LeaseStatus
	)
	err := q.QueryRow(ctx, "SELECT state, reason, fence, expires_at, current_fence FROM fence.lease_status($1, $2)",
		key, token).Scan(&status.State, &reason, &fence, &expires, &current)
	if err != nil {
		return nil, err
	}
	status.Reason, status.Fence, status.ExpiresAt, status.CurrentFence = deref(reason), deref(fence), deref(expires), deref(current)
	return &status, nil
}

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}

// endedOn asks lease_status, in one statement, how the first of the leases token was granted
// on keys (in their order) ended; nil while every one is live.
func endedOn(ctx context.Context, q Querier, keys []string, token uuid.UUID, durable bool) (*ended, error) {
	rows, err := q.Query(ctx, `SELECT s.state, coalesce(s.reason, '')
		FROM unnest($1::text[]) WITH ORDINALITY AS k(key, n)
		CROSS JOIN LATERAL fence.lease_status(k.key, $2) AS s ORDER BY k.n`, keys, token)
	if err != nil {
		return nil, err
	}
	states, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) ([2]string, error) {
		var state [2]string
		return state, row.Scan(&state[0], &state[1])
	})
	if err != nil {
		return nil, err
	}
	return endedOf(states, durable), nil
}

// CurrentFence is the last fence granted for key (the highest of its holders'); 0 when it was
// never granted, or its row was swept. Fences are never 0.
func CurrentFence(ctx context.Context, q Querier, key string) (int64, error) {
	var fence *int64
	err := q.QueryRow(ctx, "SELECT fence.current_fence($1)", key).Scan(&fence)
	return deref(fence), err
}

// Waiters is how many sessions wait for key now (fence.waiters).
func Waiters(ctx context.Context, q Querier, key string) (int, error) {
	var waiting int
	err := q.QueryRow(ctx, "SELECT fence.waiters($1)", key).Scan(&waiting)
	return waiting, err
}

// Revoke ends the key's live lease, whoever holds it (fence.lease_revoke, for fence_admin):
// true when there was one.
func Revoke(ctx context.Context, q Querier, key string) (bool, error) {
	var revoked bool
	err := q.QueryRow(ctx, "SELECT fence.lease_revoke($1)", key).Scan(&revoked)
	return revoked, err
}

// AcquireAny grants the first key of keys, in order, that is free now (never waiting, as SKIP
// LOCKED takes the first free row), an exclusive lease; nil, nil when none is. Without opts.Token,
// a fresh one is drawn for this call; a retry with the same token and keys gets the lease it
// already holds. Wait, Shared, Permits and LockDelay are refused: the server's call has none.
func AcquireAny(ctx context.Context, q Querier, keys []string, opts AcquireOptions) (*Lease, error) {
	if err := opts.checkAny(); err != nil {
		return nil, err
	}
	opts = opts.withToken()
	var owner any
	if opts.Owner != "" {
		owner = opts.Owner
	}
	rows, err := q.Query(ctx, leaseColumns+"fence.lease_acquire_any($1::text[], $2::interval, $3::text, $4, $5, $6::uuid)",
		keys, opts.TTL, owner, opts.SessionBound, !opts.Fast, opts.Token)
	if err != nil {
		return nil, typed(err, strings.Join(keys, ", "), 0)
	}
	leases, err := scanLeases(rows, opts)
	if err != nil || len(leases) == 0 {
		return nil, typed(err, strings.Join(keys, ", "), 0)
	}
	return &leases[0], nil
}

func (o AcquireOptions) checkAny() error {
	if err := o.check(); err != nil {
		return err
	}
	if o.Wait > 0 || o.Shared || o.Permits > 1 || o.LockDelay > 0 {
		return fmt.Errorf("%w: the first free key is taken without a wait, exclusive, without a lock delay", ErrInvalidOptions)
	}
	return nil
}
