// Runs every scenario of clients/behaviours/elector.json against a real cluster, as the other
// clients' suites do, through the Node elector, and prints when each leader was told it stopped.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";
import pg from "pg";
import * as fence from "../src/index.js";
import { Cluster, Observer, eventually, root } from "./harness.js";

type Step = Record<string, unknown>;
interface Scenario {
  name: string;
  ttl: number;
  steps: Step[];
}

const spec = JSON.parse(readFileSync(join(root(), "clients", "behaviours", "elector.json"), "utf8")) as {
  steps: Record<string, string>;
  scenarios: Scenario[];
};

/** The step's kind: the first of its fields that names a step of elector.json; any other is refused. */
function kindOf(step: Step, known: Record<string, string>): string {
  const kind = Object.keys(step).find((k) => k in known);
  if (!kind) throw new Error(`unknown step ${JSON.stringify(step)}: the runner refuses it`);
  return kind;
}

interface Candidate {
  name: string;
  elector: fence.Elector;
  pool: pg.Pool;
  controller: AbortController;
  campaign: Promise<fence.Leadership>;
  settled: boolean;
  leadership?: fence.Leadership;
  started: number;
  stoppedAt?: number;
  stoppedReason?: fence.StopReason;
  /** The fence a hand-off to it returned. */
  handedFence?: bigint;
}

describe("elector.json", () => {
  let cluster: Cluster;

  before(async () => {
    cluster = await Cluster.create("elector", 27856);
  });
  after(async () => {
    await cluster.destroy();
  });

  it("refuses a step it does not know", () => {
    assert.throws(() => kindOf({ tango: "a" }, spec.steps), /unknown step/);
  });

  for (const scenario of spec.scenarios) {
    it(scenario.name, async () => {
      const key = `elector:${scenario.name}`;
      const candidates = new Map<string, Candidate>();
      const observers = new Map<string, Observer>();
      const pools: pg.Pool[] = [];
      const resumes: Promise<void>[] = [];
      let previous = { name: "", at: performance.now() };
      const poolOf = (name: string) => {
        const pool = cluster.pool(`beh_${name}`);
        pool.on("error", () => undefined);
        pools.push(pool);
        return pool;
      };
      const candidate = (name: unknown) => {
        const c = candidates.get(name as string);
        assert.ok(c, `no candidate ${String(name)}`);
        return c;
      };
      const leadership = (name: unknown) => {
        const l = candidate(name).leadership;
        assert.ok(l, `${String(name)} does not lead`);
        return l;
      };
      const byValue = (value: unknown) => [...candidates.values()].find((c) => c.elector.value === value);
      const admin = new fence.Elector(poolOf("admin"), { key });
      try {
        for (const step of scenario.steps) {
          const kind = kindOf(step, spec.steps);
          const at = performance.now();
          switch (kind) {
            case "observe": {
              const name = step.observe as string;
              const pool = poolOf(name);
              observers.set(name, new Observer(new fence.Elector(pool, { key }), pool));
              break;
            }
            case "campaign": {
              const name = step.campaign as string;
              const pool = poolOf(name);
              const ttl = ((step.ttl as number | undefined) ?? scenario.ttl) * 1000;
              const lockDelay = step.lock_delay as number | undefined;
              const c = { name, pool, controller: new AbortController(), settled: false } as Candidate;
              c.elector = new fence.Elector(pool, {
                key,
                value: step.value as string,
                ttl,
                fast: step.durable === false,
                sessionBound: step.session_bound === true,
                lockDelay: lockDelay === undefined ? undefined : lockDelay * 1000,
                onStartedLeading: () => (c.started = (c.started ?? 0) + 1),
                onStoppedLeading: (_l, reason) => {
                  c.stoppedAt = performance.now();
                  c.stoppedReason = reason;
                },
              });
              c.campaign = c.elector.campaign({ signal: c.controller.signal });
              c.campaign.then(
                (l) => {
                  c.leadership = l;
                  c.settled = true;
                },
                () => (c.settled = true),
              );
              candidates.set(name, c);
              break;
            }
            case "leads": {
              const c = candidate(step.leads);
              const l = await Promise.race([
                c.campaign,
                sleep(10_000).then(() => assert.fail(`${c.name} did not lead within 10 s`)),
              ]);
              const after = performance.now() - previous.at;
              assert.equal(c.started, 1, "on_started_leading was not told once");
              assert.ok(l.isLeader);
              if (step.fence_above !== undefined) {
                const below = leadership(step.fence_above);
                assert.ok(l.fence > below.fence, `fence ${l.fence} is not above ${below.fence}`);
              }
              if (c.handedFence !== undefined) assert.equal(l.fence, c.handedFence);
              if (step.not_before !== undefined)
                assert.ok(after >= (step.not_before as number) * 1000, `led ${Math.round(after)} ms after`);
              if (step.within !== undefined)
                assert.ok(after <= (step.within as number) * 1000, `led ${Math.round(after)} ms after`);
              break;
            }
            case "waiters":
              await eventually(
                async () =>
                  Number(await cluster.value("SELECT fence.waiters($1)", [key])) === (step.waiters as number),
                10_000,
                `${String(step.waiters)} waiters`,
              );
              break;
            case "waits": {
              const c = candidate(step.waits);
              await sleep(50);
              assert.equal(c.settled, false, `${c.name}'s campaign returned`);
              break;
            }
            case "observed": {
              const o = observers.get(step.observed as string);
              assert.ok(o, `no observer ${String(step.observed)}`);
              const seen = await o.next(10_000);
              assert.ok(!(seen instanceof fence.ObserverBlindError), "the observer cannot see");
              if (step.leader === null) assert.equal(seen, null, `saw ${seen?.owner} leading`);
              else {
                const l = leadership(step.leader);
                assert.ok(seen, "saw nobody leading");
                assert.equal(seen.fence, l.fence);
                assert.equal(seen.owner, l.value);
              }
              break;
            }
            case "leader": {
              const now = await admin.leader();
              if (step.leader === null) assert.equal(now, null, `${now?.owner} leads`);
              else {
                const l = leadership(step.leader);
                assert.ok(now, "nobody leads");
                assert.equal(now.fence, l.fence);
                assert.equal(now.owner, l.value);
              }
              break;
            }
            case "proclaim": {
              const l = leadership(step.proclaim);
              await l.proclaim(step.value as string);
              assert.equal(l.value, step.value);
              break;
            }
            case "resign": {
              const l = leadership(step.resign);
              const found = (step.found as string | undefined) ?? "released";
              const released = await l.resign();
              assert.equal(released, found === "released", `the resign found ${l.kept.reason}`);
              if (found !== "released") assert.equal(l.kept.reason, found);
              break;
            }
            case "stopped": {
              const c = candidate(step.stopped);
              const l = leadership(step.stopped);
              await Promise.race([l.stopped, sleep(10_000)]);
              assert.ok(c.stoppedAt !== undefined, `${c.name} was not told it stopped`);
              console.log(
                `[behaviour] ${scenario.name}: told ${c.stoppedReason} ${Math.round(c.stoppedAt - previous.at)} ms after ${previous.name}`,
              );
              assert.equal(c.stoppedReason, step.reason);
              assert.ok(l.signal.aborted);
              assert.ok(!l.isLeader);
              break;
            }
            case "handoff": {
              const l = leadership(step.handoff);
              const to = await l.handoff(step.to as string);
              if (step.result === null) assert.equal(to, null);
              else {
                assert.ok(to, "the hand-off found nobody");
                const c = candidate(step.result);
                assert.equal(to.owner, c.elector.value);
                assert.ok(to.fence > l.fence);
                c.handedFence = to.fence;
                assert.ok(l.signal.reason instanceof fence.HandedOffError);
              }
              assert.equal(byValue(step.to)?.name ?? null, step.result === null ? null : step.result);
              break;
            }
            case "cancel": {
              const c = candidate(step.cancel);
              c.controller.abort();
              if (!c.leadership) {
                await assert.rejects(c.campaign, { name: "AbortError" });
                assert.equal(c.started, undefined);
              }
              break;
            }
            case "revoke":
              await cluster.sql("SELECT fence.lease_revoke($1)", [key]);
              break;
            case "terminate":
              await cluster.terminate(`beh_${String(step.terminate)}`);
              break;
            case "freeze_server":
              await cluster.signal("SIGSTOP");
              resumes.push(
                sleep((step.freeze_server as number) * 1000).then(() => cluster.signal("SIGCONT")),
              );
              break;
            case "crash_server":
              await cluster.crash();
              break;
            default:
              throw new Error(`step ${kind} has no runner`);
          }
          previous = { name: kind, at };
        }
      } finally {
        await Promise.all(resumes);
        for (const o of observers.values()) {
          o.controller.abort();
          await o.done.catch(() => undefined);
        }
        for (const c of candidates.values()) {
          c.controller.abort();
          await c.campaign.catch(() => undefined);
          await c.leadership?.[Symbol.asyncDispose]();
        }
        for (const pool of pools) {
          await fence.keeperOf(pool).close();
          await pool.end().catch(() => undefined);
        }
      }
    });
  }
});
