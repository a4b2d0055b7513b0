// Leader election: three candidates campaign for a key with the Elector, and an observer prints
// every change of leader. The leader writes runs guarded by its fence; its lease is revoked twice,
// and each time another is elected with a higher fence while the deposed one is told, by
// onStoppedLeading, why.
//
//   node dist/examples/leader_election.js postgres://postgres@127.0.0.1/postgres
import { setTimeout as sleep } from "node:timers/promises";
import pg from "pg";
import * as fence from "../src/index.js";
import { main, type Say } from "./common.js";

const key = "leader:scheduler";

export async function run(pool: pg.Pool, say: Say): Promise<void> {
  await pool.query(`DROP TABLE IF EXISTS runs;
    CREATE TABLE runs (n serial PRIMARY KEY, leader text, fence bigint)`);
  const client = new fence.FenceClient(pool);
  const stop = new AbortController();
  const giveUp = AbortSignal.timeout(30_000); // no new leader within 30 s

  const observer = new fence.Elector(client, { key });
  const observing = (async () => {
    for await (const leader of observer.observe({ signal: stop.signal })) {
      if (leader instanceof fence.ObserverBlindError) say("observer: cannot see the key");
      else if (leader === null) say("observer: nobody leads");
      else say(`observer: the leader is ${leader.owner} (fence ${leader.fence})`);
    }
  })();

  const elected: fence.Leadership[] = [];
  const leading: Promise<void>[] = [];
  let wake: () => void = () => undefined;
  const candidates = ["node-a", "node-b", "node-c"].map(async (name) => {
    const elector = new fence.Elector(client, {
      key,
      value: name,
      ttl: 3000,
      onStartedLeading: (l) => {
        say(`${name}: leading with fence ${l.fence}`);
        elected.push(l);
        wake();
        leading.push(lead(pool, say, name, l, stop.signal));
      },
      onStoppedLeading: (_l, reason) => say(`${name}: stopped leading: ${reason}`),
    });
    // Campaign again after each leadership, until the example ends.
    while (!stop.signal.aborted) {
      try {
        const l = await elector.campaign({ signal: stop.signal });
        await l.stopped;
      } catch (err) {
        if (!stop.signal.aborted) say(`${name}: ${(err as Error).message}`);
      }
    }
  });

  const fences: bigint[] = [];
  for (let revokes = 0; ; revokes++) {
    while (elected.length === 0) {
      if (giveUp.aborted) throw new Error("no new leader within 30 s");
      await new Promise<void>((resolve) => {
        wake = resolve;
        setTimeout(resolve, 100).unref();
      });
    }
    const l = elected.shift()!;
    if (fences.length > 0 && l.fence <= fences[fences.length - 1]!)
      throw new Error(`fences did not increase`);
    fences.push(l.fence);
    await sleep(500); // the leader does some work
    if (revokes === 2) break;
    await fence.revoke(pool, key);
    say(`operator: revoked ${l.value}'s lease`);
  }
  stop.abort();
  await Promise.all(candidates);
  // A leader's write in flight when the example stops ends before the runs are counted.
  await Promise.all(leading);
  await observing;
  const { rows } = await pool.query<{ runs: string; leaders: string }>(
    "SELECT count(*) AS runs, count(DISTINCT fence) AS leaders FROM runs",
  );
  say(`${rows[0]!.runs} runs written by ${rows[0]!.leaders} leaders, each under its own fence`);
  await fence.keeperOf(pool).close();
}

/** Writes a run every 100 ms, guarded by the leader's fence, until the leadership ends. */
async function lead(
  pool: pg.Pool,
  say: Say,
  name: string,
  l: fence.Leadership,
  stopping: AbortSignal,
): Promise<void> {
  while (!l.signal.aborted) {
    try {
      await l.guard((tx) =>
        tx.query("INSERT INTO runs (leader, fence) VALUES ($1, $2)", [name, l.fence.toString()]),
      );
    } catch (err) {
      // Refused after the example stopped, the leadership was released, not deposed.
      if (err instanceof fence.StaleFenceError && !stopping.aborted)
        say(`${name}: a run refused, deposed: ${err.message}`);
      return;
    }
    await sleep(100);
  }
}

main(import.meta, run);
