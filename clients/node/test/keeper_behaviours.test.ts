// Runs every scenario of clients/behaviours/keeper.json against a real cluster, as the other
// clients' suites do, and prints when each holder was told.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";
import pg from "pg";
import * as fence from "../src/index.js";
import { Cluster, Proxy, root } from "./harness.js";

type Step = Record<string, unknown>;
interface Scenario {
  name: string;
  ttl: number;
  steps: Step[];
}

const spec = JSON.parse(readFileSync(join(root(), "clients", "behaviours", "keeper.json"), "utf8")) as {
  steps: Record<string, string>;
  scenarios: Scenario[];
};

/** The step's kind: the first of its fields that names a step of keeper.json. */
export function kindOf(step: Step, known: Record<string, string>): string {
  const kind = Object.keys(step).find((k) => k in known);
  if (!kind) throw new Error(`unknown step ${JSON.stringify(step)}: the runner refuses it`);
  return kind;
}

interface Holder {
  pool: pg.Pool;
  kept: fence.KeptLease;
  toldAt?: number;
  tells: number;
}

describe("keeper.json", () => {
  let cluster: Cluster;
  let proxy: Proxy;

  before(async () => {
    cluster = await Cluster.create("keeper", 27852);
    proxy = await Proxy.create(27881, cluster.port);
  });
  after(async () => {
    await proxy.close();
    await cluster.destroy();
  });

  it("refuses a step it does not know", () => {
    assert.throws(() => kindOf({ dance: "a" }, spec.steps), /unknown step/);
  });

  for (const scenario of spec.scenarios) {
    it(scenario.name, async () => {
      const key = `beh:${scenario.name}`;
      const holders = new Map<string, Holder>();
      const pools: pg.Pool[] = [];
      const resumes: Promise<void>[] = [];
      let previous = { name: "", at: performance.now() };
      const holder = (name: unknown) => {
        const h = holders.get(name as string);
        assert.ok(h, `no holder ${String(name)}`);
        return h;
      };
      try {
        for (const step of scenario.steps) {
          const kind = kindOf(step, spec.steps);
          const at = performance.now();
          switch (kind) {
            case "hold": {
              const name = step.hold as string;
              const pool = cluster.pool(`beh_${name}`, step.via_proxy ? proxy.port : cluster.port);
              pool.on("error", () => undefined);
              pools.push(pool);
              const kept = await fence.hold(pool, key, {
                ttl: ((step.ttl as number | undefined) ?? scenario.ttl) * 1000,
                fast: step.durable === false,
                sessionBound: step.session_bound === true,
                renewEvery: step.renew_every === undefined ? undefined : (step.renew_every as number) * 1000,
              });
              assert.ok(kept, `${name} was refused the key`);
              const h: Holder = { pool, kept, tells: 0 };
              kept.signal.addEventListener("abort", () => {
                h.toldAt ??= performance.now();
                h.tells++;
              });
              holders.set(name, h);
              break;
            }
            case "held": {
              const h = holder(step.held);
              const until = performance.now() + (step.for as number) * 1000;
              while (performance.now() < until) {
                assert.equal(
                  h.kept.state,
                  "held",
                  `${String(step.held)} was told ${String(h.kept.signal.reason)}`,
                );
                await sleep(50);
              }
              assert.equal(h.tells, 0);
              break;
            }
            case "revoke":
              await cluster.sql("SELECT fence.lease_revoke($1)", [key]);
              break;
            case "terminate":
              await cluster.terminate(`beh_${String(step.terminate)}`);
              break;
            case "stop_server_for": {
              await cluster.signal("SIGSTOP");
              resumes.push(
                sleep((step.stop_server_for as number) * 1000).then(() => cluster.signal("SIGCONT")),
              );
              break;
            }
            case "crash_server":
              await cluster.crash();
              break;
            case "hang_connections":
              proxy.hangExisting();
              break;
            case "take_over": {
              const h = holder(step.take_over);
              const pool = cluster.pool("beh_takeover");
              pools.push(pool);
              const client = new fence.FenceClient(pool);
              const lease = await client.acquire(key, { ttl: 30_000, wait: (step.wait as number) * 1000 });
              assert.ok(lease, "the take-over was refused");
              assert.ok(lease.fence > h.kept.fence, "the take-over's fence is not above the holder's");
              break;
            }
            case "told": {
              const h = holder(step.told);
              const within = (step.within as number) * 1000;
              await Promise.race([
                h.kept.lost,
                sleep(Math.max(0, previous.at + within - performance.now()) + 2000),
              ]);
              assert.ok(h.toldAt !== undefined, `${String(step.told)} was not told`);
              const after = h.toldAt - previous.at;
              const reason = (h.kept.signal.reason as fence.LeaseLostError).reason;
              console.log(
                `[behaviour] ${scenario.name}: told ${reason} ${Math.round(after)} ms after ${previous.name}`,
              );
              assert.equal(reason, step.reason);
              assert.equal(h.kept.state, step.state);
              assert.equal(h.tells, 1);
              assert.ok(
                after <= within,
                `told ${Math.round(after)} ms after ${previous.name}, not within ${within} ms`,
              );
              break;
            }
            case "not_told":
              assert.equal(holder(step.not_told).tells, 0);
              break;
            case "guard": {
              const h = holder(step.guard);
              const write = h.kept.guard((tx) => tx.query("SELECT 1"));
              if (step.result === "ok") await write;
              else if (step.result === "stale") await assert.rejects(write, fence.StaleFenceError);
              else if (step.result === "lost") await assert.rejects(write, fence.LeaseLostError);
              else throw new Error(`unknown guard result ${String(step.result)}`);
              break;
            }
            case "release": {
              const h = holder(step.release);
              assert.equal(await h.kept.release(), step.result);
              assert.equal(h.kept.state, step.state);
              if (step.reason !== undefined) assert.equal(h.kept.reason, step.reason);
              break;
            }
            default:
              throw new Error(`step ${kind} has no runner`);
          }
          previous = { name: kind, at };
        }
      } finally {
        await Promise.all(resumes);
        for (const h of holders.values()) await h.kept[Symbol.asyncDispose]();
        for (const pool of pools) {
          await fence.keeperOf(pool).close();
          await pool.end().catch(() => undefined);
        }
      }
    });
  }
});
