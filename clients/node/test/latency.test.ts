// Prints acquire and release latency (p50/p99) from Node: figures, not assertions.
import assert from "node:assert/strict";
import { after, before, it } from "node:test";
import pg from "pg";
import * as fence from "../src/index.js";
import { Cluster } from "./harness.js";

let cluster: Cluster;
let pool: pg.Pool;
before(async () => {
  cluster = await Cluster.create("latency", 27855);
  pool = cluster.pool("node_latency", cluster.port, 1);
});
after(async () => {
  await pool.end();
  await cluster.destroy();
});

const pct = (xs: number[], p: number) =>
  [...xs].sort((a, b) => a - b)[Math.floor((p / 100) * (xs.length - 1))]!;

for (const fast of [false, true]) {
  it(`acquire and release latency (${fast ? "fast" : "durable"})`, async () => {
    const acquires: number[] = [];
    const releases: number[] = [];
    for (let i = 0; i < 200; i++) {
      let t = performance.now();
      const lease = await fence.acquire(pool, "latency", { ttl: 30_000, fast });
      acquires.push(performance.now() - t);
      assert.ok(lease);
      t = performance.now();
      assert.equal(await fence.release(pool, lease), true);
      releases.push(performance.now() - t);
    }
    const f = (xs: number[]) => `p50 ${pct(xs, 50).toFixed(2)} ms, p99 ${pct(xs, 99).toFixed(2)} ms`;
    console.log(`[latency] ${fast ? "fast" : "durable"} acquire ${f(acquires)}; release ${f(releases)}`);
  });
}
