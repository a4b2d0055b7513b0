package pgfence_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgconn"
	"pgfence.io/pgfence"
)

const ttl = 30 * time.Second

// The calls' cluster, shared by the tests of this file (each on keys of its own).
var callsCluster = shared("calls", 27730)

func key(t *testing.T) string { return fmt.Sprintf("%s:%d", t.Name(), time.Now().UnixNano()) }

// pgCode is the SQLSTATE of err's *pgconn.PgError, "" when it has none.
func pgCode(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}

func must[T any](t *testing.T) func(T, error) T {
	return func(value T, err error) T {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return value
	}
}

func TestAcquireRenewReleaseAndARefusalIsNil(t *testing.T) {
	t.Parallel()
	c, ctx, k := callsCluster(t), context.Background(), key(t)
	conn := c.Conn(t, "calls")
	lease := must[*pgfence.Lease](t)(pgfence.Acquire(ctx, conn, k, pgfence.AcquireOptions{TTL: ttl, Owner: "a"}))
	if lease == nil || lease.Key != k || lease.Owner != "a" || lease.Fence <= 0 || !lease.ExpiresAt.After(lease.AcquiredAt) {
		t.Fatalf("lease %+v", lease)
	}
	if !lease.Durable || lease.Shared || lease.Permits != 1 {
		t.Fatalf("modes %+v", lease)
	}
	if refused, err := pgfence.Acquire(ctx, conn, k, pgfence.AcquireOptions{TTL: ttl}); refused != nil || err != nil {
		t.Fatalf("a held key: %v, %v", refused, err)
	}
	renewed := must[time.Time](t)(pgfence.Renew(ctx, conn, lease, 60*time.Second))
	if !renewed.After(lease.ExpiresAt) {
		t.Fatalf("renewed to %v", renewed)
	}
	if fence := must[int64](t)(pgfence.CurrentFence(ctx, conn, k)); fence != lease.Fence {
		t.Fatalf("current fence %d", fence)
	}
	if status := must[*pgfence.LeaseStatus](t)(pgfence.Status(ctx, conn, k, lease.Token)); !status.Live() || status.Fence != lease.Fence {
		t.Fatalf("status %+v", status)
	}
	if !must[bool](t)(pgfence.Release(ctx, conn, lease)) || must[bool](t)(pgfence.Release(ctx, conn, lease)) {
		t.Fatal("a release ends the lease once")
	}
	if status := must[*pgfence.LeaseStatus](t)(pgfence.Status(ctx, conn, k, lease.Token)); status.Reason != "released" {
		t.Fatalf("status %+v", status)
	}
	_, err := pgfence.Renew(ctx, conn, lease, ttl)
	var lost *pgfence.LeaseLostError
	if !errors.Is(err, pgfence.ErrLeaseLost) || !errors.As(err, &lost) || pgCode(err) != "PF001" || lost.Reason != "" || lost.Key != k {
		t.Fatalf("renew of a released lease: %v", err)
	}
	next := must[*pgfence.Lease](t)(pgfence.Acquire(ctx, conn, k, pgfence.AcquireOptions{TTL: ttl}))
	if next.Fence <= lease.Fence {
		t.Fatalf("fence %d after %d", next.Fence, lease.Fence)
	}
	if fence := must[int64](t)(pgfence.CurrentFence(ctx, conn, k+":never")); fence != 0 {
		t.Fatalf("a key never granted has fence %d", fence)
	}
}

func TestTheCallsTakePartInTheCallersTransaction(t *testing.T) {
	t.Parallel()
	c, ctx, k := callsCluster(t), context.Background(), key(t)
	conn := c.Conn(t, "calls")
	tx := must[pgxTx](t)(conn.Begin(ctx))
	lease := must[*pgfence.Lease](t)(pgfence.Acquire(ctx, tx, k, pgfence.AcquireOptions{TTL: ttl}))
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if status := must[*pgfence.LeaseStatus](t)(pgfence.Status(ctx, conn, k, lease.Token)); status.Reason != "unknown" {
		t.Fatalf("rolled back, yet %+v", status)
	}
	pool := c.Pool(t, "calls_pool")
	if lease := must[*pgfence.Lease](t)(pgfence.Acquire(ctx, pool, k, pgfence.AcquireOptions{TTL: ttl})); lease == nil {
		t.Fatal("a pool is a Querier too")
	}
}

func TestTheTokenOfARetriedAcquireGetsItsOwnLeaseBack(t *testing.T) {
	t.Parallel()
	c, ctx, k := callsCluster(t), context.Background(), key(t)
	conn := c.Conn(t, "calls")
	opts := pgfence.AcquireOptions{TTL: ttl, Token: uuid.New()}
	first := must[*pgfence.Lease](t)(pgfence.Acquire(ctx, conn, k, opts))
	again := must[*pgfence.Lease](t)(pgfence.Acquire(ctx, conn, k, opts))
	if first.Token != opts.Token || again == nil || again.Fence != first.Fence {
		t.Fatalf("first %+v, again %+v", first, again)
	}
}

func TestTheGuardRefusesAStaleFenceAndAGuardOutsideATransaction(t *testing.T) {
	t.Parallel()
	c, ctx, k := callsCluster(t), context.Background(), key(t)
	table := "invoices_" + strings.ToLower(uuid.NewString()[:8])
	c.Exec(t, fmt.Sprintf("CREATE TABLE %s (id int PRIMARY KEY, status text); INSERT INTO %[1]s VALUES (42, 'new')", table))
	conn := c.Conn(t, "calls")
	lease := must[*pgfence.Lease](t)(pgfence.Acquire(ctx, conn, k, pgfence.AcquireOptions{TTL: ttl}))
	if err := pgfence.FenceGuard(ctx, conn, k, lease.Fence); !errors.Is(err, pgfence.ErrNotInTransaction) {
		t.Fatalf("a guard in a transaction of its own protects nothing: %v", err)
	}
	if err := pgfence.FenceGuard(ctx, c.Pool(t, "calls_pool"), k, lease.Fence); !errors.Is(err, pgfence.ErrNotInTransaction) {
		t.Fatalf("nor on a pool: %v", err)
	}
	tx := must[pgxTx](t)(conn.Begin(ctx))
	if err := pgfence.FenceGuard(ctx, tx, k, lease.Fence); err != nil {
		t.Fatal(err)
	}
	must[pgconn.CommandTag](t)(tx.Exec(ctx, "UPDATE "+table+" SET status = 'guarded' WHERE id = 42"))
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	update := func(status string) (int64, error) {
		return pgfence.FencedUpdate(ctx, conn, k, lease.Fence, table, map[string]any{"status": status}, map[string]any{"id": 42})
	}
	if n := must[int64](t)(update("paid")); n != 1 {
		t.Fatalf("%d rows", n)
	}
	c.Revoke(t, k)
	tx = must[pgxTx](t)(conn.Begin(ctx))
	err := pgfence.FenceGuard(ctx, tx, k, lease.Fence)
	var stale *pgfence.StaleFenceError
	if !errors.Is(err, pgfence.ErrStaleFence) || !errors.As(err, &stale) || stale.Fence != lease.Fence || pgCode(err) != "PF002" {
		t.Fatalf("guard after a revoke: %v", err)
	}
	_ = tx.Rollback(ctx)
	if _, err := update("late"); !errors.Is(err, pgfence.ErrStaleFence) {
		t.Fatalf("fenced update after a revoke: %v", err)
	}
	in := "UPDATE " + table + " SET status = 'in the where' WHERE id = 42 AND " + pgfence.GuardSQL("$1", "$2")
	_, err = conn.Exec(ctx, in, k, lease.Fence)
	if err = pgfence.Typed(err, k, lease.Fence); !errors.Is(err, pgfence.ErrStaleFence) {
		t.Fatalf("a guard in the write's WHERE: %v", err)
	}
	if status := c.SQL(t, "SELECT status FROM "+table+" WHERE id = 42"); status != "paid" {
		t.Fatalf("status %q", status)
	}
}

func TestFencedAndVersionedWrites(t *testing.T) {
	t.Parallel()
	c, ctx := callsCluster(t), context.Background()
	table := "docs_" + strings.ToLower(uuid.NewString()[:8])
	c.Exec(t, fmt.Sprintf("CREATE TABLE %s (id int PRIMARY KEY, body text, fence bigint, version bigint); INSERT INTO %[1]s VALUES (1, 'a', NULL, 1)", table))
	conn := c.Conn(t, "calls")
	body := func(b string) map[string]any { return map[string]any{"body": b} }
	one := map[string]any{"id": 1}
	if n := must[int64](t)(pgfence.FencedWrite(ctx, conn, table, "fence", 10, body("b"), one)); n != 1 {
		t.Fatalf("%d rows", n)
	}
	_, err := pgfence.FencedWrite(ctx, conn, table, "fence", 9, body("c"), one)
	var stale *pgfence.StaleFenceError
	if !errors.As(err, &stale) || stale.Fence != 9 {
		t.Fatalf("a lower fence: %v", err)
	}
	if version := must[int64](t)(pgfence.VersionedUpdate(ctx, conn, table, "version", 1, body("d"), one)); version != 2 {
		t.Fatalf("version %d", version)
	}
	_, err = pgfence.VersionedUpdate(ctx, conn, table, "version", 1, body("e"), one)
	if !errors.Is(err, pgfence.ErrVersionConflict) || pgCode(err) != "40001" {
		t.Fatalf("an old version: %v", err)
	}
	_, err = pgfence.VersionedUpdate(ctx, conn, table, "version", 2, body("e"), map[string]any{"id": 7})
	if errors.Is(err, pgfence.ErrVersionConflict) || pgCode(err) != "P0002" {
		t.Fatalf("no row: %v", err)
	}
	if b := c.SQL(t, "SELECT body FROM "+table+" WHERE id = 1"); b != "d" {
		t.Fatalf("body %q", b)
	}
}

func TestBadInputIsTheServersOwnErrorWithItsSqlstate(t *testing.T) {
	t.Parallel()
	c, ctx, k := callsCluster(t), context.Background(), key(t)
	conn := c.Conn(t, "calls")
	if _, err := pgfence.Acquire(ctx, conn, k, pgfence.AcquireOptions{TTL: 0}); pgCode(err) != "22023" {
		t.Fatalf("a zero ttl: %v", err)
	}
	if _, err := pgfence.Acquire(ctx, conn, "", pgfence.AcquireOptions{TTL: ttl}); pgCode(err) != "22023" {
		t.Fatalf("an empty key: %v", err)
	}
	for _, bad := range []pgfence.AcquireOptions{{TTL: ttl, Permits: -1}, {TTL: ttl, Shared: true, Permits: 2}} {
		if _, err := pgfence.Acquire(ctx, conn, k, bad); !errors.Is(err, pgfence.ErrInvalidOptions) {
			t.Fatalf("%+v: %v", bad, err)
		}
	}
	tx := must[pgxTx](t)(conn.BeginTx(ctx, readOnly))
	if _, err := pgfence.Acquire(ctx, tx, k, pgfence.AcquireOptions{TTL: ttl}); pgCode(err) != "25006" {
		t.Fatalf("read only: %v", err)
	}
	_ = tx.Rollback(ctx)
}

func TestAWaitingAcquireEndedByTheServerIsWaitCancelled(t *testing.T) {
	t.Parallel()
	c, ctx, k := callsCluster(t), context.Background(), key(t)
	holder, waiter := c.Conn(t, "calls"), c.Conn(t, "calls")
	held := must[*pgfence.Lease](t)(pgfence.Acquire(ctx, holder, k, pgfence.AcquireOptions{TTL: ttl}))
	must[pgconn.CommandTag](t)(waiter.Exec(ctx, "SET statement_timeout = 200"))
	_, err := pgfence.Acquire(ctx, waiter, k, pgfence.AcquireOptions{TTL: ttl, Wait: 10 * time.Second})
	if !errors.Is(err, pgfence.ErrWaitCancelled) || pgCode(err) != "57014" {
		t.Fatalf("statement_timeout while waiting: %v", err)
	}
	must[pgconn.CommandTag](t)(waiter.Exec(ctx, "RESET statement_timeout"))
	granted := make(chan *pgfence.Lease, 1)
	go func() {
		lease, _ := pgfence.Acquire(ctx, waiter, k, pgfence.AcquireOptions{TTL: ttl, Wait: 10 * time.Second})
		granted <- lease
	}()
	eventually(t, 10*time.Second, "a waiter", func() bool { return must[int](t)(pgfence.Waiters(ctx, holder, k)) == 1 })
	if !must[bool](t)(pgfence.Release(ctx, holder, held)) {
		t.Fatal("not released")
	}
	if lease := <-granted; lease == nil || lease.Fence <= held.Fence {
		t.Fatalf("the waiter got %+v", lease)
	}
}

func TestSharedLeasesAndPermits(t *testing.T) {
	t.Parallel()
	c, ctx, k := callsCluster(t), context.Background(), key(t)
	conn := c.Conn(t, "calls")
	reader := pgfence.AcquireOptions{TTL: ttl, Shared: true}
	one := must[*pgfence.Lease](t)(pgfence.Acquire(ctx, conn, k, reader))
	two := must[*pgfence.Lease](t)(pgfence.Acquire(ctx, conn, k, reader))
	if !one.Shared || two == nil || two.Fence <= one.Fence {
		t.Fatalf("readers %+v %+v", one, two)
	}
	if writer := must[*pgfence.Lease](t)(pgfence.Acquire(ctx, conn, k, pgfence.AcquireOptions{TTL: ttl})); writer != nil {
		t.Fatal("a writer beside readers")
	}
	permit := pgfence.AcquireOptions{TTL: ttl, Permits: 2}
	p1 := must[*pgfence.Lease](t)(pgfence.Acquire(ctx, conn, k+":sem", permit))
	p2 := must[*pgfence.Lease](t)(pgfence.Acquire(ctx, conn, k+":sem", permit))
	if p1 == nil || p2 == nil || p1.Permits != 2 || must[*pgfence.Lease](t)(pgfence.Acquire(ctx, conn, k+":sem", permit)) != nil {
		t.Fatal("two permits, and no third")
	}
	must[bool](t)(pgfence.Release(ctx, conn, p1))
	if must[*pgfence.Lease](t)(pgfence.Acquire(ctx, conn, k+":sem", permit)) == nil {
		t.Fatal("a released permit is granted again")
	}
}

func TestLeaseSetsAllOrNone(t *testing.T) {
	t.Parallel()
	c, ctx, k := callsCluster(t), context.Background(), key(t)
	conn := c.Conn(t, "calls")
	keys := []string{k + ":b", k + ":a"}
	set := must[*pgfence.LeaseSet](t)(pgfence.AcquireAll(ctx, conn, keys, pgfence.AcquireOptions{TTL: ttl}))
	if got := strings.Join(set.Keys(), ","); got != k+":a,"+k+":b" {
		t.Fatalf("not in key order: %s", got)
	}
	if _, ok := set.Fence(k + ":a"); !ok {
		t.Fatal("no fence of a key of the set")
	}
	if again := must[*pgfence.LeaseSet](t)(pgfence.AcquireAll(ctx, conn, keys, pgfence.AcquireOptions{TTL: ttl})); again != nil {
		t.Fatal("granted twice")
	}
	if renewed := must[time.Time](t)(pgfence.RenewAll(ctx, conn, set, ttl)); !renewed.After(time.Now()) {
		t.Fatalf("renewed to %v", renewed)
	}
	c.Revoke(t, k+":b")
	if _, err := pgfence.RenewAll(ctx, conn, set, ttl); !errors.Is(err, pgfence.ErrLeaseLost) {
		t.Fatalf("renew of a set with a revoked key: %v", err)
	}
	if n := must[int](t)(pgfence.ReleaseAll(ctx, conn, set)); n != 1 {
		t.Fatalf("released %d", n)
	}
	if _, err := pgfence.AcquireAll(ctx, conn, keys, pgfence.AcquireOptions{TTL: ttl, Shared: true}); !errors.Is(err, pgfence.ErrInvalidOptions) {
		t.Fatalf("a shared set: %v", err)
	}
}

func TestLeadersProclaimsAndHandoffs(t *testing.T) {
	t.Parallel()
	c, ctx, k := callsCluster(t), context.Background(), key(t)
	conn, other := c.Conn(t, "calls"), c.Conn(t, "calls")
	if nobody := must[*pgfence.Leader](t)(pgfence.AwaitChange(ctx, conn, k, nil, 0)); nobody != nil {
		t.Fatalf("a leader of a key never granted: %+v", nobody)
	}
	lease := must[*pgfence.Lease](t)(pgfence.Acquire(ctx, conn, k, pgfence.AcquireOptions{TTL: ttl, Owner: "v1"}))
	leader := must[*pgfence.Leader](t)(pgfence.AwaitChange(ctx, conn, k, nil, 0))
	if leader.Fence != lease.Fence || leader.Owner != "v1" {
		t.Fatalf("leader %+v", leader)
	}
	if !must[bool](t)(pgfence.Proclaim(ctx, conn, lease, "v2")) {
		t.Fatal("not proclaimed")
	}
	if changed := must[*pgfence.Leader](t)(pgfence.AwaitChange(ctx, conn, k, leader, 5*time.Second)); changed.Owner != "v2" || changed.Fence != lease.Fence {
		t.Fatalf("after a proclaim %+v", changed)
	}
	if nobody := must[*pgfence.Leader](t)(pgfence.Handoff(ctx, conn, lease, "nobody")); nobody != nil {
		t.Fatalf("handed to %+v", nobody)
	}
	granted := make(chan *pgfence.Lease, 1)
	go func() {
		lease, _ := pgfence.Acquire(ctx, other, k, pgfence.AcquireOptions{TTL: ttl, Owner: "b", Wait: 10 * time.Second})
		granted <- lease
	}()
	eventually(t, 10*time.Second, "a candidate", func() bool { return must[int](t)(pgfence.Waiters(ctx, conn, k)) == 1 })
	next := must[*pgfence.Leader](t)(pgfence.Handoff(ctx, conn, lease, "b"))
	if next == nil || next.Fence <= lease.Fence || next.Owner != "b" {
		t.Fatalf("handed to %+v", next)
	}
	if got := <-granted; got == nil || got.Fence != next.Fence {
		t.Fatalf("the candidate got %+v", got)
	}
	if status := must[*pgfence.LeaseStatus](t)(pgfence.Status(ctx, conn, k, lease.Token)); status.Reason != "released" {
		t.Fatalf("status %+v", status)
	}
}

func TestTheClientRetriesAndExplainsALoss(t *testing.T) {
	t.Parallel()
	c, ctx, k := callsCluster(t), context.Background(), key(t)
	client := c.Client(t, "calls_client")
	lease := must[*pgfence.Lease](t)(client.Acquire(ctx, k, pgfence.AcquireOptions{TTL: ttl}))
	if again := must[*pgfence.Lease](t)(client.Acquire(ctx, k, pgfence.AcquireOptions{TTL: ttl})); again != nil {
		t.Fatal("granted twice")
	}
	must[time.Time](t)(client.Renew(ctx, lease, ttl))
	c.Revoke(t, k)
	_, err := client.Renew(ctx, lease, ttl)
	var lost *pgfence.LeaseLostError
	if !errors.As(err, &lost) || lost.Reason != pgfence.ReasonRevoked || pgCode(err) != "PF001" {
		t.Fatalf("renew after a revoke: %v", err)
	}
	if must[bool](t)(client.Release(ctx, lease)) {
		t.Fatal("released a revoked lease")
	}
	if fence := must[int64](t)(client.CurrentFence(ctx, k)); fence != lease.Fence {
		t.Fatalf("fence %d", fence)
	}
	if status := must[*pgfence.LeaseStatus](t)(client.Status(ctx, k, lease.Token)); status.Reason != "revoked" {
		t.Fatalf("status %+v", status)
	}
	if _, err := client.Acquire(ctx, k, pgfence.AcquireOptions{TTL: -time.Second}); pgCode(err) != "22023" {
		t.Fatalf("bad input is not retried, and keeps its SQLSTATE: %v", err)
	}
}
