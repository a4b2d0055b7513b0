// Singleton job: three instances fire the nightly report at every tick; one runs it under a kept
// lease, the others skip. On one tick the runner stalls past its ttl (a GC pause, a stopped
// process: modelled by a lease nobody renews), another instance runs the job meanwhile, and the
// stalled run's late write is refused by its fence.
//
//   node dist/examples/singleton_job.js postgres://postgres@127.0.0.1/postgres
import { setTimeout as sleep } from "node:timers/promises";
import pg from "pg";
import * as fence from "../src/index.js";
import { main, type Say } from "./common.js";

const job = "singleton:nightly-report";

export async function run(pool: pg.Pool, say: Say): Promise<void> {
  await pool.query(`DROP TABLE IF EXISTS reports;
    CREATE TABLE reports (day int PRIMARY KEY, written_by text, fence bigint)`);
  const client = new fence.FenceClient(pool);
  for (let day = 1; day <= 4; day++) {
    // The three instances fire at once; the job runs under a kept lease while it runs.
    const lines = await Promise.all(
      ["instance-1", "instance-2", "instance-3"].map((name) => fire(client, day, name)),
    );
    lines.forEach((line) => say(line));
    const ran = lines.filter((line) => line.includes("ran the job"));
    if (ran.length !== 1) throw new Error(`day ${day}: ran ${ran.length} times`);
  }
  await stalled(pool, say);
  await fence.keeperOf(pool).close();
}

/** One instance at one tick: it runs the job if it gets the lease, else skips. */
async function fire(client: fence.FenceClient, day: number, name: string): Promise<string> {
  await using kept = await client.hold(job, { ttl: 2000, owner: name });
  if (!kept) return `day ${day}: ${name} skips, the job runs elsewhere`;
  await kept.guard((tx) => write(tx, day, name, kept.fence));
  // The job takes a while: the other instances fire meanwhile, and find it held.
  await sleep(200);
  return `day ${day}: ${name} ran the job with fence ${kept.fence}`;
}

/** A run whose process stops past its ttl while another instance runs the job. */
async function stalled(pool: pg.Pool, say: Say): Promise<void> {
  const lease = await fence.acquire(pool, job, { ttl: 1000, owner: "instance-1" });
  if (!lease) throw new Error("day 5: not granted");
  say(`day 5: instance-1 runs the job with fence ${lease.fence}, and stalls past its ttl`);
  await sleep(1200);
  const other = await fence.acquire(pool, job, { ttl: 10_000, owner: "instance-2" });
  if (!other) throw new Error("day 5: not taken over");
  await guardedWrite(pool, 5, "instance-2", other.fence);
  say(`day 5: instance-2 ran the job with fence ${other.fence}`);
  try {
    await guardedWrite(pool, 5, "instance-1", lease.fence);
    throw new Error("the late write was not refused");
  } catch (err) {
    if (!(err instanceof fence.StaleFenceError)) throw err;
    say(`day 5: instance-1 wakes up; its late write is refused: ${err.message}`);
  }
  const { rows } = await pool.query<{ written_by: string }>("SELECT written_by FROM reports WHERE day = 5");
  say(`day 5's report was written by ${rows[0]?.written_by}`);
  await fence.release(pool, other);
}

async function guardedWrite(pool: pg.Pool, day: number, name: string, f: bigint): Promise<void> {
  const tx = await pool.connect();
  try {
    await tx.query("BEGIN");
    await fence.fenceGuard(tx, job, f);
    await write(tx, day, name, f);
    await tx.query("COMMIT");
  } catch (err) {
    await tx.query("ROLLBACK");
    throw err;
  } finally {
    tx.release();
  }
}

async function write(tx: pg.PoolClient, day: number, name: string, f: bigint): Promise<void> {
  await tx.query(
    `INSERT INTO reports VALUES ($1, $2, $3) ON CONFLICT (day) DO UPDATE SET written_by = $2, fence = $3`,
    [day, name, f.toString()],
  );
}

main(import.meta, run);
