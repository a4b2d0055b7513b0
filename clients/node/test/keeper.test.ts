// The pool's keeper: how it shares its few connections between the renewals and its other calls.
import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import * as fence from "../src/index.js";
import { Cluster, eventually } from "./harness.js";

describe("keeper", () => {
  let cluster: Cluster;
  before(async () => {
    cluster = await Cluster.create("keeper_turns", 27860);
  });
  after(async () => {
    await cluster.destroy();
  });

  it("sends one call at a time on a connection: a renewal due during another call waits its turn", async () => {
    // node-postgres queues a query sent on a busy client, with a deprecation warning (an error in
    // pg 9), once per process: this file's process sees it first.
    const warnings: string[] = [];
    const onWarning = (w: Error) => warnings.push(w.message);
    process.on("warning", onWarning);
    const pool = cluster.pool("node_keeper_turns");
    pool.on("error", () => undefined);
    const keeper = fence.keeperOf(pool, 1);
    try {
      const kept = (await fence.hold(pool, "keeper:turns", { ttl: 3000, keeperConnections: 1 }))!;
      const granted = kept.lease.expiresAt.getTime();
      // Longer than a renewal period (1 s): a renewal falls due while each runs.
      for (let n = 0; n < 2; n++) await keeper.call((q) => q.query("SELECT pg_sleep(1.5)"), 5000);
      await eventually(() => kept.lease.expiresAt.getTime() > granted + 2000, 5000);
      assert.equal(kept.state, "held", `told ${kept.reason}`);
      await kept.release();
      assert.deepEqual(
        warnings.filter((w) => w.includes("already executing a query")),
        [],
        "a call was sent on a connection still running another",
      );
    } finally {
      process.off("warning", onWarning);
      await keeper.close();
      await pool.end();
    }
  });
});
