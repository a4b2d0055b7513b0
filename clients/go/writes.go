package pgfence

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// GuardSQL is the guard to put in a write's own WHERE clause, with the key and the fence as its
// two arguments: "UPDATE invoices SET ... WHERE id = 42 AND " + pgfence.GuardSQL("$1", "$2").
// Map the write's error with Typed(err, key, fence) to get *StaleFenceError for PF002.
func GuardSQL(key, fence string) string { return "fence.fence_guard(" + key + ", " + fence + ")" }

// Typed maps a server error from a statement that guarded key with fence: PF002 becomes a
// *StaleFenceError, PF001 a *LeaseLostError, 40001 ErrVersionConflict; anything else is err.
func Typed(err error, key string, fence int64) error { return typed(err, key, fence) }

// FenceGuard returns nil when fence is the key's live fence, else a *StaleFenceError. Call it in
// the transaction that makes the writes: once it passes, no grant of a higher fence can commit
// until that transaction ends. On a pool, or on a connection outside a transaction block, it would
// run in a transaction of its own and protect nothing: ErrNotInTransaction, before anything is sent.
func FenceGuard(ctx context.Context, q Querier, key string, fence int64) error {
	if !inTransaction(q) {
		return ErrNotInTransaction
	}
	var ok bool
	err := q.QueryRow(ctx, "SELECT fence.fence_guard($1, $2)", key, fence).Scan(&ok)
	return typed(err, key, fence)
}

// inTransaction is false for what surely runs each statement in a transaction of its own: a pool,
// or a connection outside a transaction block. Anything else (a pgx.Tx, a Querier of the
// caller's own making) is trusted.
func inTransaction(q Querier) bool {
	switch q := q.(type) {
	case *pgxpool.Pool:
		return false
	case *pgx.Conn:
		return q.PgConn().TxStatus() != 'I'
	case *pgxpool.Conn:
		return q.Conn().PgConn().TxStatus() != 'I'
	}
	return true
}

// FencedUpdate runs the guard, then UPDATE table SET changes WHERE filter, in one statement:
// the number of rows updated, or a *StaleFenceError. changes and filter map columns to values
// (sent as JSON; filter's are ANDed equalities).
func FencedUpdate(ctx context.Context, q Querier, key string, fence int64, table string, changes, filter map[string]any) (int64, error) {
	var updated int64
	err := q.QueryRow(ctx, "SELECT fence.fenced_update($1, $2, $3::text::regclass, $4::jsonb, $5::jsonb)",
		key, fence, table, changes, filter).Scan(&updated)
	return updated, typed(err, key, fence)
}

// FencedWrite updates the rows matching filter only if none holds a higher fence in
// fenceColumn, and stamps them with fence; a *StaleFenceError otherwise. No lease is looked up:
// the rows are the fence (for tokens from elsewhere too).
func FencedWrite(ctx context.Context, q Querier, table, fenceColumn string, fence int64, changes, filter map[string]any) (int64, error) {
	var updated int64
	err := q.QueryRow(ctx, "SELECT fence.fenced_write($1::text::regclass, $2::text::name, $3, $4::jsonb, $5::jsonb)",
		table, fenceColumn, fence, changes, filter).Scan(&updated)
	return updated, typed(err, "", fence)
}

// VersionedUpdate updates the single row matching filter only if its versionColumn is expected,
// and returns its new version (expected + 1); ErrVersionConflict when it has another. No row
// (P0002) or more than one (21000) stay the server's *pgconn.PgError.
func VersionedUpdate(ctx context.Context, q Querier, table, versionColumn string, expected int64, changes, filter map[string]any) (int64, error) {
	var version int64
	err := q.QueryRow(ctx, "SELECT fence.versioned_update($1::text::regclass, $2::text::name, $3, $4::jsonb, $5::jsonb)",
		table, versionColumn, expected, changes, filter).Scan(&version)
	return version, typed(err, "", 0)
}
