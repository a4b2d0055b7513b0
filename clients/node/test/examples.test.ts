// Runs each example of clients/node/examples against a scratch cluster and checks its story.
import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import pg from "pg";
import * as invoiceWorkers from "../examples/invoice_workers.js";
import * as leaderElection from "../examples/leader_election.js";
import * as singletonJob from "../examples/singleton_job.js";
import { Cluster } from "./harness.js";

const count = (lines: string[], part: string) => lines.filter((l) => l.includes(part)).length;

describe("examples", () => {
  let cluster: Cluster;
  before(async () => {
    cluster = await Cluster.create("examples", 27857);
  });
  after(async () => {
    await cluster.destroy();
  });

  async function story(
    run: (pool: pg.Pool, say: (line: string) => void) => Promise<void>,
  ): Promise<string[]> {
    const pool = cluster.pool("example");
    pool.on("error", () => undefined);
    const lines: string[] = [];
    try {
      await run(pool, (line) => lines.push(line));
    } finally {
      await pool.end();
    }
    console.log(lines.map((l) => `  ${l}`).join("\n"));
    return lines;
  }

  it("singleton_job", async () => {
    const lines = await story(singletonJob.run);
    assert.equal(count(lines, "ran the job with fence"), 5);
    assert.equal(count(lines, "skips"), 8);
    assert.equal(count(lines, "its late write is refused"), 1);
    assert.ok(lines.includes("day 5's report was written by instance-2"));
  });

  it("invoice_workers", async () => {
    const lines = await story(invoiceWorkers.run);
    assert.equal(count(lines, "operator: revoked invoice 3's lease"), 1);
    assert.equal(count(lines, 'is lost (pg_fence: lease on "invoice:3" lost: revoked); stops'), 1);
    assert.equal(count(lines, "its next step on invoice 3 is refused"), 1);
    assert.equal(lines.at(-1), "5 of 5 invoices done, under 5 fences");
  });

  it("leader_election", async () => {
    const lines = await story(leaderElection.run);
    assert.equal(count(lines, "stopped leading: revoked"), 2);
    assert.equal(count(lines, ": leading with fence"), 3);
    assert.ok(count(lines, "observer: the leader is") >= 1);
    assert.ok(count(lines, "deposed") <= 2, "only a revoked leader is told it was deposed");
    assert.match(lines.at(-1)!, /written by 3 leaders/);
  });
});
