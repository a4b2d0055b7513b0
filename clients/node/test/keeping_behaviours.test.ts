// Runs the scenarios of clients/behaviours/keeping.json (kept leases at scale) against a real
// cluster; the scenarios whose steps this client does not run yet are marked todo.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";
import pg from "pg";
import * as fence from "../src/index.js";
import { Cluster, Observer, Proxy, eventually, root } from "./harness.js";

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
  "acquire_waiting",
  "waiters",
  "hang_connections",
  "release_other",
  "give_up",
  "key_free",
  "lead",
  "observe",
  "observed",
  "blind",
  "pause",
  "terminate",
  "granted",
]);

/** How a waiting acquire is made: a kept acquire (hold), or FenceClient.acquire (a plain lease). */
type Acquirer = "hold" | "FenceClient.acquire";

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

  const runsOf = (scenario: { name: string; steps: Step[] }) =>
    scenario.steps.some((s) => "acquire_waiting" in s)
      ? (["hold", "FenceClient.acquire"] as const).map((by) => ({ by, title: `${scenario.name} (${by})` }))
      : [{ by: "hold" as Acquirer, title: scenario.name }];
  for (const scenario of spec.scenarios) {
    const missing = scenario.steps.map(kindOf).filter((k) => !runs.has(k));
    const todo = missing.length ? `steps not run by the Node client yet: ${missing.join(", ")}` : false;
    for (const { by, title } of runsOf(scenario))
      it(title, { todo }, async () => {
        if (todo) return;
        const key = `keeping:${title}`;
        const pools = new Map<string, pg.Pool>();
        const kept = new Map<string, fence.KeptLease[]>();
        const hogs: pg.PoolClient[] = [];
        const extra: pg.Pool[] = [];
        const proxied = new Set<string>();
        const waiting = new Map<string, { controller: AbortController; call: Promise<unknown> }>();
        const plain: { pool: pg.Pool; lease: fence.Lease }[] = [];
        const observers = new Map<string, Observer>();
        const leaders = new Map<string, fence.Leadership>();
        let proxy: Proxy | undefined;
        let previous = { name: "", at: performance.now() };
        const poolOf = (name: string, max = 10) => {
          let pool = pools.get(name);
          if (!pool) {
            pool = cluster.pool(`beh_${name}`, proxied.has(name) ? proxy!.port : cluster.port, max);
            pool.on("error", () => undefined);
            pools.set(name, pool);
          }
          return pool;
        };
        const viaProxy = async (name: string) => {
          proxy ??= await Proxy.create(27882, cluster.port);
          proxied.add(name);
          return poolOf(name);
        };
        try {
          for (const step of scenario.steps) {
            const kind = kindOf(step);
            const at = performance.now();
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
              case "acquire_waiting": {
                const name = step.acquire_waiting as string;
                const pool = await viaProxy(name);
                const controller = new AbortController();
                const opts = { ttl: (step.ttl as number) * 1000, wait: (step.wait as number) * 1000 };
                // The retries' longest time when the step gives it; the client's default otherwise.
                const retryFor = step.retry_for as number | undefined;
                const client = new fence.FenceClient(
                  pool,
                  retryFor === undefined ? {} : { backoff: { maxElapsedMs: retryFor * 1000 } },
                );
                const call =
                  by === "FenceClient.acquire"
                    ? client.acquire(key, { ...opts, signal: controller.signal })
                    : retryFor === undefined
                      ? fence.hold(pool, key, { ...opts, signal: controller.signal })
                      : client.hold(key, { ...opts, signal: controller.signal });
                call.catch(() => undefined);
                waiting.set(name, { controller, call });
                break;
              }
              case "waiters":
                await eventually(
                  async () => Number(await cluster.value("SELECT fence.waiters($1)", [key])) === step.waiters,
                  10_000,
                  `${String(step.waiters)} waiters`,
                );
                break;
              case "hang_connections":
                proxy!.hangExisting();
                break;
              case "release_other": {
                const lease = kept.get(step.by as string)![0]!;
                assert.equal(await lease.release(), true);
                // The waiting acquire is granted on the server (its reply cannot reach the client).
                const owner = `beh_${String(step.release_other)}`;
                await eventually(
                  async () =>
                    Number(
                      await cluster.value(
                        "SELECT count(*) FROM fence.leases WHERE key = $1 AND live AND owner = $2",
                        [key, owner],
                      ),
                    ) === 1,
                  10_000,
                  `the grant to ${owner}`,
                );
                break;
              }
              case "give_up": {
                const w = waiting.get(step.give_up as string)!;
                w.controller.abort();
                await assert.rejects(w.call, { name: "AbortError" });
                break;
              }
              case "key_free": {
                const within = (step.within as number) * 1000;
                await eventually(
                  async () =>
                    Number(
                      await cluster.value("SELECT count(*) FROM fence.leases WHERE key = $1 AND live", [key]),
                    ) === 0,
                  Math.max(0, previous.at + within - performance.now()),
                  `the key free within ${within} ms`,
                );
                console.log(
                  `[behaviour] ${title}: the given-up grant released ${Math.round(performance.now() - previous.at)} ms after ${previous.name}`,
                );
                break;
              }
              case "pause":
                await sleep((step.pause as number) * 1000);
                break;
              case "terminate": {
                const ended = await cluster.value(
                  "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name LIKE $1 || '%'",
                  [`beh_${String(step.terminate)}`],
                );
                assert.ok(Number(ended) > 0, "no session of the client to end");
                break;
              }
              case "granted": {
                const name = step.granted as string;
                const w = waiting.get(name);
                assert.ok(w, "no acquire running");
                waiting.delete(name);
                const within = (step.within as number) * 1000;
                let timer: NodeJS.Timeout | undefined;
                const late = new Promise<never>((_, reject) => {
                  timer = setTimeout(() => reject(new Error(`no answer within ${within} ms`)), within);
                });
                let got: unknown;
                try {
                  got = await Promise.race([w.call, late]);
                } catch (err) {
                  waiting.set(name, w);
                  throw new Error(`the acquire failed: ${String(err)}`, { cause: err });
                } finally {
                  clearTimeout(timer);
                }
                if (got instanceof fence.KeptLease) {
                  kept.set(name, [got]);
                  assert.equal(got.state, "held", `told ${got.reason}`);
                } else {
                  const lease = got as fence.Lease | null;
                  assert.ok(lease, "refused");
                  plain.push({ pool: poolOf(name), lease });
                  const status = await fence.status(poolOf(name), key, lease.token);
                  assert.equal(status.state, "live");
                }
                break;
              }
              case "lead": {
                const name = step.lead as string;
                const elector = new fence.Elector(poolOf(name), {
                  key,
                  value: name,
                  ttl: (step.ttl as number) * 1000,
                });
                leaders.set(name, await elector.campaign());
                break;
              }
              case "observe": {
                const name = step.observe as string;
                const pool = await viaProxy(name);
                observers.set(name, new Observer(new fence.Elector(pool, { key }), pool));
                break;
              }
              case "observed": {
                const seen = await observers.get(step.observed as string)!.next(10_000);
                const l = leaders.get(step.leader as string)!;
                assert.ok(seen && !(seen instanceof fence.ObserverBlindError), `saw ${String(seen)}`);
                assert.equal(seen.fence, l.fence);
                assert.equal(seen.owner, l.value);
                break;
              }
              case "blind": {
                const within = (step.within as number) * 1000;
                const o = observers.get(step.blind as string)!;
                const seen = await o.next(Math.max(0, previous.at + within - performance.now()));
                const after = performance.now() - previous.at;
                assert.ok(
                  seen instanceof fence.ObserverBlindError,
                  `told ${seen === null ? "vacancy" : (seen as fence.Leader).owner}, not blind`,
                );
                console.log(
                  `[behaviour] ${title}: told blind ${Math.round(after)} ms after ${previous.name}`,
                );
                assert.ok(after <= within, `told blind ${Math.round(after)} ms after ${previous.name}`);
                // Then it reconnects (the proxy's later connections work) and says the present again.
                const again = await o.next(10_000);
                assert.ok(again && !(again instanceof fence.ObserverBlindError), "not the leader again");
                assert.equal(again.fence, [...leaders.values()][0]!.fence);
                break;
              }
              default:
                throw new Error(`step ${kind} has no runner`);
            }
            previous = { name: kind, at };
          }
        } finally {
          for (const w of waiting.values()) {
            w.controller.abort();
            await w.call.catch(() => undefined);
          }
          for (const o of observers.values()) {
            o.controller.abort();
            await o.done.catch(() => undefined);
          }
          for (const l of leaders.values()) await l[Symbol.asyncDispose]();
          for (const hog of hogs) hog.release();
          for (const leases of kept.values()) for (const l of leases) await l[Symbol.asyncDispose]();
          for (const { pool, lease } of plain) await fence.release(pool, lease).catch(() => undefined);
          for (const pool of [...pools.values(), ...extra]) {
            await fence.keeperOf(pool).close();
            await pool.end().catch(() => undefined);
          }
          await proxy?.close();
        }
      });
  }
});
