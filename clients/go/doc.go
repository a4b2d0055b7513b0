// Package pgfence is the Go client of pg_fence: leases with fencing tokens, granted by
// PostgreSQL, on pgx v5.
//
//   - The calls (Acquire, Renew, Release, FenceGuard, FencedUpdate, ...): one statement each,
//     on any Querier (pgx.Tx, *pgx.Conn, *pgxpool.Pool), in the caller's transaction.
//   - Client: the same calls over a pool, retried with full jitter; a retried acquire is safe
//     because its token is drawn once, before the first try.
//   - Client.Hold: a lease kept renewed in the background, whose Context is cancelled the moment
//     the lease may be lost, with context.Cause saying why.
//   - Elector: leader election on a key, in client-go's shape (Run, the callbacks,
//     ReleaseOnCancel) and etcd's (Campaign, Proclaim, Resign, Observe, Leader), with hand-off.
//
// Whatever the client believes, only the fence protects the data: guard every write with
// FenceGuard or FencedUpdate in the writing transaction.
package pgfence
