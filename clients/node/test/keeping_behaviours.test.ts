// Runs the scenarios of clients/behaviours/keeping.json (kept leases at scale) against a real
// cluster; the scenarios whose steps this client does not run yet are marked todo.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";
import pg from "pg";
import * as fence from "../src/index.js";
import { Cluster, root } from "./harness.js";

type Step = Record<string, unknown>;
const spec = JSON.parse(readFileSync(join(root(), "clients", "behaviours", "keeping.json"), "utf8")) as {
  steps: Record<string, string>;
  scenarios: { name: string; steps: Step[] }[];
};

/** The steps this runner runs; keeping.json's others are refused. */
const runs = new Set([
  "hold_many",
  "all_held",
  "connections",
  "hold",
  "hog_pool",
  "release_pool",
  "held",
  "release",
  "hold_first_free",
  "hold_other",
]);

function kindOf(step: Step): string {
  const kind = Object.keys(step).find((k) => k in spec.steps);
  if (!kind) throw new Error(`unknown step ${JSON.stringify(step)}: the runner refuses it`);
  return kind;
}

function percentile(sorted: number[], p: number): number {
  return sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))] ?? NaN;
}

describe("keeping.json", () => {
  let cluster: Cluster;
  before(async () => {
    cluster = await Cluster.create("keeping", 27854);
  });
  after(async () => {
    await cluster.destroy();
  });

  it("refuses a step it does not know", () => {
    assert.throws(() => kindOf({ juggle: "k" }), /unknown step/);
  });

  for (const scenario of spec.scenarios) {
    const missing = scenario.steps.map(kindOf).filter((k) => !runs.has(k));
    const todo = missing.length ? `steps not run by the Node client yet: ${missing.join(", ")}` : false;
    it(scenario.name, { todo }, async () => {
      if (todo) return;
      const key = `keeping:${scenario.name}`;
      const pools = new Map<string, pg.Pool>();
      const kept = new Map<string, fence.KeptLease[]>();
      const hogs: pg.PoolClient[] = [];
      const extra: pg.Pool[] = [];
      const poolOf = (name: string, max = 10) => {
        let pool = pools.get(name);
        if (!pool) {
          pool = cluster.pool(`beh_${name}`, cluster.port, max);
          pool.on("error", () => undefined);
          pools.set(name, pool);
        }
        return pool;
      };
      try {
        for (const step of scenario.steps) {
          const kind = kindOf(step);
          switch (kind) {
            case "hold_many": {
              const name = step.hold_many as string;
              const pool = poolOf(name);
              const count = step.count as number;
              const connections = step.keeper_connections as number;
              const leases = await Promise.all(
                Array.from({ length: count }, (_, i) =>
                  fence.hold(pool, `${key}-${i}`, {
                    ttl: (step.ttl as number) * 1000,
                    keeperConnections: connections,
                  }),
                ),
              );
              assert.ok(leases.every((l) => l !== null));
              kept.set(name, leases as fence.KeptLease[]);
              break;
            }
            case "all_held": {
              const name = step.all_held as string;
              const leases = kept.get(name)!;
              const keeper = fence.keeperOf(poolOf(name));
              keeper.latencies.length = 0;
              const until = performance.now() + (step.for as number) * 1000;
              while (performance.now() < until) {
                const told = leases.find((l) => l.state !== "held");
                assert.equal(told, undefined, `${told?.key} was told ${told?.reason}`);
                await sleep(50);
              }
              const sorted = [...keeper.latencies].sort((a, b) => a - b);
              console.log(
                `[behaviour] ${scenario.name}: ${leases.length} leases kept over ${keeper.connections} connections, renewals p50 ${percentile(sorted, 50).toFixed(1)} ms, p99 ${percentile(sorted, 99).toFixed(1)} ms`,
              );
              break;
            }
            case "connections": {
              const name = step.connections as string;
              const keeper = fence.keeperOf(poolOf(name));
              const count = await cluster.value(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1",
                [keeper.applicationName],
              );
              assert.ok(Number(count) <= (step.at_most as number), `${count} keeper connections`);
              assert.equal(keeper.reconnections, 0);
              break;
            }
            case "hold": {
              const name = step.hold as string;
              const pool = poolOf(name, step.pool as number);
              const lease = await fence.hold(pool, key, { ttl: (step.ttl as number) * 1000 });
              assert.ok(lease);
              kept.set(name, [lease]);
              break;
            }
            case "hog_pool": {
              const pool = poolOf(step.hog_pool as string);
              const max = (pool as unknown as { options: { max: number } }).options.max;
              for (let i = 0; i < max; i++) hogs.push(await pool.connect());
              break;
            }
            case "release_pool":
              for (const hog of hogs.splice(0)) hog.release();
              break;
            case "held": {
              const lease = kept.get(step.held as string)![0]!;
              const until = performance.now() + (step.for as number) * 1000;
              while (performance.now() < until) {
                assert.equal(lease.state, "held", `told ${lease.reason}`);
                await sleep(50);
              }
              break;
            }
            case "release": {
              const lease = kept.get(step.release as string)![0]!;
              assert.equal(await lease.release(), step.result);
              break;
            }
            case "hold_other": {
              const pool = cluster.pool("beh_other");
              extra.push(pool);
              assert.ok(await fence.acquire(pool, `${key}-${String(step.index)}`, { ttl: { hours: 1 } }));
              break;
            }
            case "hold_first_free": {
              const name = step.hold_first_free as string;
              const keys = Array.from({ length: step.count as number }, (_, i) => `${key}-${i}`);
              const lease = await fence.holdAny(poolOf(name), keys, { ttl: (step.ttl as number) * 1000 });
              if (step.got === null) assert.equal(lease, null);
              else {
                assert.equal(lease?.key, `${key}-${String(step.got)}`);
                kept.set(name, [lease!]);
              }
              break;
            }
            default:
              throw new Error(`step ${kind} has no runner`);
          }
        }
      } finally {
        for (const hog of hogs) hog.release();
        for (const leases of kept.values()) for (const l of leases) await l[Symbol.asyncDispose]();
        for (const pool of [...pools.values(), ...extra]) {
          await fence.keeperOf(pool).close();
          await pool.end().catch(() => undefined);
        }
      }
    });
  }
});
