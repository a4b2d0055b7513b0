// Lease sets: acquireAll, renewAll, releaseAll, and kept sets (holdAll), kept whole or lost.
import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";
import pg from "pg";
import * as fence from "../src/index.js";
import { Cluster } from "./harness.js";

describe("lease sets", () => {
  let cluster: Cluster;
  let pool: pg.Pool;
  let client: fence.FenceClient;

  before(async () => {
    cluster = await Cluster.create("sets", 27859);
    pool = cluster.pool("node_sets");
    client = new fence.FenceClient(pool);
  });
  after(async () => {
    await fence.keeperOf(pool).close();
    await pool.end();
    await cluster.destroy();
  });

  it("grants every key or none, renews and releases them together", async () => {
    const set = await fence.acquireAll(pool, ["acct:2", "acct:1"], { ttl: 30_000, owner: "t" });
    assert.ok(set);
    assert.deepEqual(set.keys, ["acct:1", "acct:2"]);
    assert.equal(new Set(set.leases.map((l) => l.token)).size, 1);
    assert.ok(set.leases.every((l) => typeof l.fence === "bigint"));
    assert.equal(await client.acquireAll(["acct:2", "acct:3"], { ttl: 30_000 }), null);
    assert.ok((await client.renewAll(set, 60_000)) instanceof Date);
    assert.equal(await client.releaseAll(set), 2);
    assert.equal(await fence.releaseAll(pool, set), 0);
    await assert.rejects(fence.renewAll(pool, set, 1000), fence.LeaseLostError);
    await assert.rejects(fence.acquireAll(pool, ["x", "x"], { ttl: 1000 }), { code: "22023" });
  });

  it("a kept set granted after a wait longer than its TTL is held, and kept", async () => {
    const first = (await client.holdAll(["waited:1", "waited:2"], { ttl: 30_000 }))!;
    const released = sleep(3000).then(() => first.release());
    const waited = (await client.holdAll(["waited:2", "waited:3"], { ttl: 1500, wait: 20_000 }))!;
    await released;
    await sleep(2000);
    assert.equal(waited.state, "held", `told ${waited.reason}`);
    await waited.release();
  });

  it("a kept set stays held past its ttl, guards its writes, and is released whole", async () => {
    const kept = await client.holdAll(["kept:1", "kept:2"], { ttl: 900 });
    assert.ok(kept);
    await sleep(1500);
    assert.equal(kept.state, "held");
    await kept.guard((tx) => tx.query("SELECT 1"));
    assert.equal(await kept.release(), true);
    assert.equal(kept.state, "released");
    assert.equal(
      await cluster.value("SELECT count(*) FROM fence.leases WHERE key LIKE 'kept:%' AND live"),
      "0",
    );
  });

  it("a kept set one of whose keys is revoked is told revoked, and lost whole", async () => {
    const kept = await fence.holdAll(pool, ["lost:1", "lost:2"], { ttl: 1500 });
    assert.ok(kept);
    await cluster.sql("SELECT fence.lease_revoke('lost:2')");
    const told = await kept.lost;
    assert.equal(told.reason, "revoked");
    assert.ok(kept.signal.aborted);
    assert.throws(() => kept.throwIfLost(), fence.LeaseLostError);
    await assert.rejects(
      kept.guard((tx) => tx.query("SELECT 1")),
      fence.LeaseLostError,
    );
    assert.equal(await kept.release(), false);
  });
});
