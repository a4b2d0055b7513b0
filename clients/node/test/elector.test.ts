// The elector's own tests, beside elector.json's scenarios: its options, onNewLeader, a campaign
// given up by a timeout, a leadership's signal and guard.
import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import pg from "pg";
import * as fence from "../src/index.js";
import { Cluster, eventually } from "./harness.js";

describe("elector", () => {
  let cluster: Cluster;
  let pool: pg.Pool;

  before(async () => {
    cluster = await Cluster.create("elector_unit", 27858);
    pool = cluster.pool("node_elector");
  });
  after(async () => {
    await fence.keeperOf(pool).close();
    await pool.end();
    await cluster.destroy();
  });

  it("refuses bad options before sending anything", async () => {
    assert.throws(() => new fence.Elector(pool, { key: "" }), fence.InvalidOptionsError);
    assert.throws(() => new fence.Elector(pool, { key: "k", ttl: 0 }), fence.InvalidOptionsError);
    await assert.rejects(new fence.Elector(pool, { key: "k" }).campaign(), fence.InvalidOptionsError);
  });

  it("tells onNewLeader the present first (the vacancy), then each change", async () => {
    const told: (string | null)[] = [];
    const watcher = new fence.Elector(pool, {
      key: "el:news",
      onNewLeader: (l) => told.push(l?.owner ?? null),
    });
    await eventually(() => told.length === 1, 10_000, "the present");
    assert.deepEqual(told, [null]);
    const a = new fence.Elector(pool, { key: "el:news", value: "a", ttl: 5000 });
    const l = await a.campaign();
    await eventually(() => told.length === 2, 10_000, "the leader");
    await l.proclaim("a2");
    await eventually(() => told.length === 3, 10_000, "the proclaim");
    await l.resign();
    await eventually(() => told.length === 4, 10_000, "the vacancy");
    assert.deepEqual(told, [null, "a", "a2", null]);
    watcher.close();
  });

  it("a campaign given up by its signal's timeout grants nothing, and a leadership's signal tells its end", async () => {
    const a = new fence.Elector(pool, { key: "el:timeout", value: "a", ttl: 5000 });
    const b = new fence.Elector(pool, { key: "el:timeout", value: "b", ttl: 5000 });
    const l = await a.campaign();
    assert.ok(a.isLeader);
    await assert.rejects(b.campaign({ signal: AbortSignal.timeout(300) }), { name: "TimeoutError" });
    await eventually(
      async () => Number(await cluster.value("SELECT fence.waiters('el:timeout')")) === 0,
      10_000,
      "no waiter",
    );
    await l.guard((tx) => tx.query("SELECT 1"));
    assert.equal(await l.resign(), true);
    assert.equal(l.reason, "released");
    assert.ok(l.signal.aborted);
    assert.equal(await l.stopped, "released");
    await assert.rejects(l.proclaim("late"), fence.LeaseLostError);
    assert.equal(await a.leader(), null);
  });

  it("FenceClient.acquire given up by its timeout leaves the queue, granted nothing", async () => {
    const client = new fence.FenceClient(pool);
    const held = await client.acquire("el:acquire", { ttl: 30_000 });
    assert.ok(held);
    await assert.rejects(client.acquire("el:acquire", { ttl: 30_000, wait: 20_000, timeout: 300 }), {
      name: "TimeoutError",
    });
    await eventually(
      async () => Number(await cluster.value("SELECT fence.waiters('el:acquire')")) === 0,
      10_000,
      "no waiter",
    );
    assert.equal(await client.release(held), true);
    assert.equal(
      await cluster.value("SELECT count(*) FROM fence.leases WHERE key = 'el:acquire' AND live"),
      "0",
    );
  });

  it("cancelled without releaseOnCancel, a leadership is left to expire (cancelled); await using resigns", async () => {
    const stop = new AbortController();
    const a = new fence.Elector(pool, { key: "el:cancel", value: "a", ttl: 30_000, releaseOnCancel: false });
    const l = await a.campaign({ signal: stop.signal });
    stop.abort();
    assert.equal(await l.stopped, "cancelled");
    assert.ok(l.signal.aborted);
    assert.equal((await a.leader())?.owner, "a"); // still granted on the server, renewed by nobody
    await cluster.sql("SELECT fence.lease_revoke('el:cancel')");
    {
      await using b = await new fence.Elector(pool, { key: "el:cancel", value: "b", ttl: 30_000 }).campaign();
      assert.ok(b.isLeader);
    }
    assert.equal(await a.leader(), null);
  });
});
