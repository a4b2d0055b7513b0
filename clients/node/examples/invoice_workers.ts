// Per-invoice workers: four workers race for five invoices, each kept as a lease while it is
// worked on in fenced steps. One lease is revoked mid-work: its worker is told (its signal is
// aborted, with the reason) and stops; another finishes the invoice under a higher fence, and the
// step the first would still write is refused.
//
//   node dist/examples/invoice_workers.js postgres://postgres@127.0.0.1/postgres
import { setTimeout as sleep } from "node:timers/promises";
import pg from "pg";
import * as fence from "../src/index.js";
import { main, type Say } from "./common.js";

const invoices = 5;
const steps = 3;

export async function run(pool: pg.Pool, say: Say): Promise<void> {
  await pool.query(`DROP TABLE IF EXISTS invoices;
    CREATE TABLE invoices (id int PRIMARY KEY, step int NOT NULL DEFAULT 0, worker text, fence bigint);
    INSERT INTO invoices (id) SELECT generate_series(1, ${invoices})`);
  const client = new fence.FenceClient(pool);
  // An operator revokes invoice 3's lease while it is worked on.
  const operator = (async () => {
    for (;;) {
      const { rows } = await pool.query<{ step: number }>("SELECT step FROM invoices WHERE id = 3");
      if ((rows[0]?.step ?? 0) >= 1) break;
      await sleep(5);
    }
    if (await fence.revoke(pool, "invoice:3")) say("operator: revoked invoice 3's lease");
  })();
  await Promise.all(["worker-1", "worker-2", "worker-3", "worker-4"].map((name) => work(client, say, name)));
  await operator;
  const { rows } = await pool.query<{ done: string; fences: string }>(
    "SELECT count(*) FILTER (WHERE step = $1) AS done, count(DISTINCT fence) AS fences FROM invoices",
    [steps],
  );
  // Each invoice finished under the fence of the worker that finished it.
  say(`${rows[0]!.done} of ${invoices} invoices done, under ${rows[0]!.fences} fences`);
  await fence.keeperOf(pool).close();
}

/** Takes any invoice not yet done and not held, until every one is done. */
async function work(client: fence.FenceClient, say: Say, name: string): Promise<void> {
  for (;;) {
    const { rows } = await client.pool.query<{ id: number }>(
      "SELECT id FROM invoices WHERE step < $1 ORDER BY id",
      [steps],
    );
    if (rows.length === 0) return;
    for (const { id } of rows) await workOn(client, say, name, id);
    await sleep(20);
  }
}

/** Does the steps of invoice `id` left to do, each a fenced update, if it gets its lease. */
async function workOn(client: fence.FenceClient, say: Say, name: string, id: number): Promise<void> {
  await using kept = await client.hold(`invoice:${id}`, { ttl: 5000, owner: name });
  if (!kept) return; // another worker has it
  for (;;) {
    const { rows } = await client.pool.query<{ step: number }>("SELECT step FROM invoices WHERE id = $1", [
      id,
    ]);
    const step = rows[0]!.step;
    if (step === steps) return;
    if (step === 1 && id === 3) {
      // Slow on this step: the operator's revoke lands meanwhile, and the keeper tells it at its
      // next renewal (every ttl/3).
      await sleep(5000, undefined, { signal: kept.signal }).catch(() => undefined);
    }
    if (kept.signal.aborted) {
      say(
        `${name}: told its lease on invoice ${id} is lost (${(kept.signal.reason as Error).message}); stops`,
      );
      try {
        await fence.fencedUpdate(client.pool, kept.key, kept.fence, "invoices", { step: step + 1 }, { id });
      } catch (err) {
        say(`${name}: its next step on invoice ${id} is refused: ${(err as Error).message}`);
      }
      return;
    }
    const changes = { step: step + 1, worker: name, fence: kept.fence };
    try {
      await kept.fencedUpdate("invoices", changes, { id });
    } catch (err) {
      say(`${name}: step ${step + 1} of invoice ${id} refused: ${(err as Error).message}`);
      return;
    }
    say(`${name}: invoice ${id} step ${step + 1} under fence ${kept.fence}`);
    await sleep(30);
  }
}

main(import.meta, run);
