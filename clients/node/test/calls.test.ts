import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { after, before, describe, it } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";
import pg from "pg";
import * as fence from "../src/index.js";
import { Cluster, Proxy, eventually } from "./harness.js";

const TWO_53 = 2n ** 53n;

describe("calls", () => {
  let cluster: Cluster;
  let pool: pg.Pool;

  before(async () => {
    cluster = await Cluster.create("calls", 27850);
    pool = cluster.pool("node_calls");
  });
  after(async () => {
    await pool.end();
    await cluster.destroy();
  });

  it("acquires, refuses a held key, renews, tells the status, releases", async () => {
    const lease = await fence.acquire(pool, "calls:a", { ttl: { seconds: 30 }, owner: "me" });
    assert.ok(lease);
    assert.equal(typeof lease.fence, "bigint");
    assert.equal(lease.owner, "me");
    assert.equal(await fence.acquire(pool, "calls:a", { ttl: 30_000 }), null);
    const expires = await fence.renew(pool, lease, { minutes: 1 });
    assert.ok(expires > lease.expiresAt);
    const s = await fence.status(pool, "calls:a", lease.token);
    assert.equal(s.state, "live");
    assert.equal(s.fence, lease.fence);
    assert.equal(await fence.currentFence(pool, "calls:a"), lease.fence);
    assert.equal(await fence.release(pool, lease), true);
    assert.equal(await fence.release(pool, lease), false);
    const next = await fence.acquire(pool, "calls:a", { ttl: 1000, fast: true });
    assert.ok(next && next.fence > lease.fence && next.fast);
  });

  it("grants shared leases and permits, and refuses options that cannot be", async () => {
    const a = await fence.acquire(pool, "calls:shared", { ttl: 30_000, shared: true });
    const b = await fence.acquire(pool, "calls:shared", { ttl: 30_000, shared: true });
    assert.ok(a && b);
    const p1 = await fence.acquire(pool, "calls:sem", { ttl: 30_000, permits: 2 });
    const p2 = await fence.acquire(pool, "calls:sem", { ttl: 30_000, permits: 2 });
    const p3 = await fence.acquire(pool, "calls:sem", { ttl: 30_000, permits: 2 });
    assert.ok(p1 && p2);
    assert.equal(p3, null);
    await assert.rejects(fence.acquire(pool, "k", { ttl: 1000, permits: 0 }), fence.InvalidOptionsError);
    await assert.rejects(
      fence.acquire(pool, "k", { ttl: 1000, shared: true, permits: 2 }),
      fence.InvalidOptionsError,
    );
  });

  it("leaves bad input as node-postgres's DatabaseError with its code", async () => {
    const bad = (code: string) => (err: unknown) => err instanceof pg.DatabaseError && err.code === code;
    await assert.rejects(fence.acquire(pool, "", { ttl: 1000 }), bad("22023"));
    await assert.rejects(fence.acquire(pool, "calls:bad", { ttl: 0 }), bad("22023"));
    await assert.rejects(fence.acquire(pool, "x".repeat(513), { ttl: 1000 }), bad("22023"));
    await assert.rejects(fence.renew(pool, { key: "calls:bad", token: "not a uuid" }, 1000), bad("22P02"));
  });

  it("tells a lost lease with its reason (PF001)", async () => {
    const lease = (await fence.acquire(pool, "calls:lost", { ttl: 30_000 }))!;
    await fence.revoke(pool, "calls:lost");
    await assert.rejects(fence.renew(pool, lease, 30_000), (err: unknown) => {
      assert.ok(err instanceof fence.LeaseLostError);
      assert.equal(err.code, "PF001");
      assert.equal(err.reason, "revoked");
      assert.equal(err.key, "calls:lost");
      assert.ok(err.cause instanceof pg.DatabaseError);
      return true;
    });
    const released = (await fence.acquire(pool, "calls:lost", { ttl: 30_000 }))!;
    await fence.release(pool, released);
    await assert.rejects(fence.renew(pool, released, 1000), { name: "LeaseLostError", reason: "released" });
  });

  it("guards writes: stale fences refused (PF002), guards on a pool or outside a transaction refused before sending", async () => {
    const old = (await fence.acquire(pool, "calls:guard", { ttl: 30_000 }))!;
    await fence.revoke(pool, "calls:guard");
    const live = (await fence.acquire(pool, "calls:guard", { ttl: 30_000 }))!;
    await assert.rejects(fence.fenceGuard(pool, "calls:guard", live.fence), fence.NotInTransactionError);
    const conn = await pool.connect();
    try {
      await assert.rejects(fence.fenceGuard(conn, "calls:guard", live.fence), fence.NotInTransactionError);
      await conn.query("BEGIN");
      await fence.fenceGuard(conn, "calls:guard", live.fence);
      await conn.query("COMMIT");
      await conn.query("BEGIN");
      await assert.rejects(fence.fenceGuard(conn, "calls:guard", old.fence), (err: unknown) => {
        assert.ok(err instanceof fence.StaleFenceError);
        assert.equal(err.code, "PF002");
        assert.equal(err.fence, old.fence);
        return true;
      });
      await conn.query("ROLLBACK");
      await conn.query("BEGIN");
      const rows = await conn.query(`SELECT ${fence.guardSql("$1", "$2")} AS ok`, [
        "calls:guard",
        live.fence.toString(),
      ]);
      assert.equal(rows.rows[0].ok, true);
      await conn.query("COMMIT");
    } finally {
      conn.release();
    }
  });

  it("writes fenced and versioned rows, with bigints above 2^53 exact", async () => {
    await cluster.sql(
      "CREATE TABLE calls_rows (id int PRIMARY KEY, body text, fence bigint, version bigint); INSERT INTO calls_rows VALUES (1, 'a', NULL, 1)",
    );
    const lease = (await fence.acquire(pool, "calls:rows", { ttl: 30_000 }))!;
    assert.equal(
      await fence.fencedUpdate(pool, "calls:rows", lease.fence, "calls_rows", { body: "b" }, { id: 1 }),
      1n,
    );
    await fence.revoke(pool, "calls:rows");
    await assert.rejects(
      fence.fencedUpdate(pool, "calls:rows", lease.fence, "calls_rows", { body: "c" }, { id: 1 }),
      fence.StaleFenceError,
    );

    // Fences and versions above 2^53, which a number would round: 2^53 + 1 is not a double.
    const high = TWO_53 + 1n;
    assert.equal(await fence.fencedWrite(pool, "calls_rows", "fence", high, { body: "d" }, { id: 1 }), 1n);
    assert.equal(await cluster.value("SELECT fence FROM calls_rows WHERE id = 1"), high.toString());
    await assert.rejects(
      fence.fencedWrite(pool, "calls_rows", "fence", high - 1n, { body: "e" }, { id: 1 }),
      (err: unknown) => err instanceof fence.StaleFenceError && err.fence === high - 1n,
    );
    await cluster.sql("UPDATE calls_rows SET version = $1 WHERE id = 1", [high.toString()]);
    assert.equal(
      await fence.versionedUpdate(pool, "calls_rows", "version", high, { body: "f" }, { id: 1 }),
      high + 1n,
    );
    await assert.rejects(
      fence.versionedUpdate(pool, "calls_rows", "version", high, { body: "g" }, { id: 1 }),
      fence.VersionConflictError,
    );
    await assert.rejects(fence.awaitChange(pool, "calls:rows", { fence: high, owner: "x" }, -1), {
      code: "22023",
    });
  });

  it("tells a cancelled wait (57014) as WaitCancelledError", async () => {
    await fence.acquire(pool, "calls:wait", { ttl: 30_000 });
    const conn = await cluster.client("node_calls_wait");
    try {
      await conn.query("SET statement_timeout = 200");
      await assert.rejects(fence.acquire(conn, "calls:wait", { ttl: 1000, wait: { seconds: 10 } }), {
        name: "WaitCancelledError",
        code: "57014",
      });
    } finally {
      await conn.end();
    }
  });

  it("observes, proclaims and hands off", async () => {
    assert.equal(await fence.awaitChange(pool, "calls:obs", null, 0), null);
    const lease = (await fence.acquire(pool, "calls:obs", { ttl: 30_000, owner: "one" }))!;
    const seen = await fence.awaitChange(pool, "calls:obs", null, 5000);
    assert.deepEqual([seen?.fence, seen?.owner], [lease.fence, "one"]);
    assert.equal(await fence.proclaim(pool, lease, "one at 10.0.0.1"), true);
    const told = await fence.awaitChange(pool, "calls:obs", seen, 5000);
    assert.equal(told?.owner, "one at 10.0.0.1");

    const waiter = fence.acquire(pool, "calls:obs", { ttl: 30_000, owner: "two", wait: { seconds: 20 } });
    let handed: Awaited<ReturnType<typeof fence.handoff>> = null;
    for (let i = 0; i < 500 && !handed; i++) {
      handed = await fence.handoff(pool, lease, "two");
      if (!handed) await new Promise((r) => setTimeout(r, 20));
    }
    assert.ok(handed && handed.fence > lease.fence && handed.owner === "two");
    const second = await waiter;
    assert.equal(second?.fence, handed.fence);
    await assert.rejects(fence.renew(pool, lease, 1000), { name: "LeaseLostError", reason: "released" });
  });
});

describe("client", () => {
  let cluster: Cluster;
  let proxy: Proxy;

  before(async () => {
    cluster = await Cluster.create("client", 27851);
    proxy = await Proxy.create(27880, cluster.port);
  });
  after(async () => {
    await proxy.close();
    await cluster.destroy();
  });

  it("reuses the acquire's token when its reply is lost: the retry returns the granted lease", async () => {
    const pool = cluster.pool("node_client", proxy.port);
    const client = new fence.FenceClient(pool, { backoff: { baseMs: 10 } });
    try {
      proxy.dropReplyAfter("lease_acquire");
      const lease = await client.acquire("client:lost", { ttl: 30_000 });
      assert.equal(proxy.dropped, 1);
      assert.ok(lease, "the retry was refused: it did not resend the first attempt's token");
      const s = await client.status("client:lost", lease.token);
      assert.equal(s.state, "live");
      assert.equal(s.currentFence, lease.fence);
      assert.equal(await client.release(lease), true);
    } finally {
      await pool.end();
    }
  });

  it("carries the token in OutcomeUnknownError when no retry is left", async () => {
    const pool = cluster.pool("node_client_unknown", proxy.port);
    const client = new fence.FenceClient(pool, { backoff: { maxAttempts: 1 } });
    try {
      const token = randomUUID();
      proxy.dropReplyAfter("lease_acquire");
      const err = await client.acquire("client:unknown", { ttl: 30_000, token }).then(
        () => assert.fail("the lost reply was not told"),
        (e: unknown) => e,
      );
      assert.ok(err instanceof fence.OutcomeUnknownError);
      assert.equal(err.token, token);
      // The grant did commit: its token releases it.
      assert.equal(await client.release({ key: "client:unknown", token }), true);
    } finally {
      await pool.end();
    }
  });

  it("retries past a connection the server ended", async () => {
    const pool = cluster.pool("node_client_term");
    const client = new fence.FenceClient(pool, { backoff: { baseMs: 10 } });
    try {
      const lease = (await client.acquire("client:term", { ttl: 30_000 }))!;
      await cluster.sql(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'node_client_term'",
      );
      assert.ok((await client.renew(lease, 30_000)) > lease.expiresAt);
      assert.equal(await client.currentFence("client:term"), lease.fence);
    } finally {
      await pool.end();
    }
  });

  it("counts maxElapsedMs from the first failure, not from the call's start", async () => {
    const pool = cluster.pool("node_client_late");
    const client = new fence.FenceClient(pool, { backoff: { baseMs: 10, maxElapsedMs: 500 } });
    try {
      let tries = 0;
      // The first try outlasts maxElapsedMs on the server before its session is ended; the retry answers.
      const call = client.retrying(async (q) => {
        tries++;
        await q.query(tries === 1 ? "SELECT pg_sleep(60)" : "SELECT 1");
        return tries;
      });
      call.catch(() => undefined);
      await eventually(
        async () =>
          Number(
            await cluster.value(
              "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'node_client_late' AND query LIKE '%pg_sleep%'",
            ),
          ) === 1,
        10_000,
        "the first try on the server",
      );
      await sleep(1000);
      await cluster.terminate("node_client_late");
      assert.equal(await call, 2);
    } finally {
      await pool.end();
    }
  });

  it("draws full-jitter delays under min(cap, base·2^n)", () => {
    const client = new fence.FenceClient(new pg.Pool(), { backoff: { baseMs: 10, capMs: 100 } });
    for (let n = 0; n < 10; n++) {
      const d = client.delay(n);
      assert.ok(d >= 0 && d <= Math.min(100, 10 * 2 ** n));
    }
  });
});
