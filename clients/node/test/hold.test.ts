import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { after, before, describe, it } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";
import { promisify } from "node:util";
import pg from "pg";
import * as fence from "../src/index.js";
import { Cluster, eventually } from "./harness.js";

describe("hold", () => {
  let cluster: Cluster;
  let pool: pg.Pool;
  let client: fence.FenceClient;

  before(async () => {
    cluster = await Cluster.create("hold", 27853);
    pool = cluster.pool("node_hold");
    client = new fence.FenceClient(pool);
  });
  after(async () => {
    await fence.keeperOf(pool).close();
    await pool.end();
    await cluster.destroy();
  });

  it("aborts its signal with the reason the moment the lease is lost", async () => {
    const kept = (await client.hold("hold:abort", { ttl: 1500 }))!;
    assert.equal(kept.signal.aborted, false);
    await cluster.sql("SELECT fence.lease_revoke('hold:abort')");
    const told = await kept.lost;
    assert.ok(kept.signal.aborted);
    assert.equal(kept.signal.reason, told);
    assert.ok(told instanceof fence.LeaseLostError);
    assert.equal(told.reason, "revoked");
    assert.throws(() => kept.throwIfLost(), fence.LeaseLostError);
  });

  it("a grant after a wait longer than its TTL is held, and kept", async () => {
    // The server starts the TTL of a waited grant when it grants: the local deadline must not
    // count from the acquire's send, 3 s before.
    for (const sessionBound of [false, true]) {
      const key = `hold:waited-${sessionBound}`;
      const first = (await client.hold(key, { ttl: 30_000 }))!;
      const released = sleep(3000).then(() => first.release());
      const waited = (await client.hold(key, { ttl: 1500, wait: 20_000, sessionBound }))!;
      await released;
      await sleep(2000);
      assert.equal(waited.state, "held", `session-bound ${sessionBound}: told ${waited.reason}`);
      assert.equal((await client.status(key, waited.token)).state, "live");
      await waited.release();
    }
  });

  it("a wait in the pool's queue is not a wait for the key: no renewal of its own before hand-over", async () => {
    const one = cluster.pool("node_hold_queue_one", cluster.port, 1);
    one.on("error", () => undefined);
    const keeper = fence.keeperOf(one);
    const call = keeper.call.bind(keeper);
    let calls = 0;
    keeper.call = ((...args: Parameters<typeof call>) => {
      calls++;
      return call(...args);
    }) as typeof keeper.call;
    try {
      const hog = await one.connect();
      const freed = sleep(600).then(() => hog.release());
      // Queued 600 ms for the pool's one connection: longer than a renewal period (333 ms).
      const kept = (await fence.hold(one, "hold:queue-one", { ttl: 1000 }))!;
      await freed;
      assert.equal(calls, 0, "a renewal was sent before the grant was handed over");
      await sleep(1500);
      assert.equal(kept.state, "held", `told ${kept.reason}`);
      await kept.release();
    } finally {
      await keeper.close();
      await one.end();
    }
  });

  it("holds queued for the pool's few connections are each kept, their renewals batched", async () => {
    // 300 holds over a pool of 2: most wait in the pool's queue longer than a renewal period
    // (333 ms), a wait on the client that must not count as the server's (a renewal each before
    // hand-over, queued on the keeper's two connections, came past the TTL under load).
    const small = cluster.pool("node_hold_queued", cluster.port, 2);
    small.on("error", () => undefined);
    try {
      const kept = await Promise.all(
        Array.from({ length: 300 }, (_, n) => fence.hold(small, `hold:queued-${n}`, { ttl: 1000 })),
      );
      await sleep(2500);
      const told = kept.filter((k) => k!.state !== "held").map((k) => `${k!.key}: ${k!.reason}`);
      assert.deepEqual(told, []);
      await Promise.all(kept.map((k) => k!.release()));
    } finally {
      await fence.keeperOf(small).close();
      await small.end();
    }
  });

  it("refuses a held key with null, and fenced updates under a kept lease", async () => {
    const kept = (await client.hold("hold:busy", { ttl: 30_000 }))!;
    assert.equal(await client.hold("hold:busy", { ttl: 30_000 }), null);
    await cluster.sql(
      "CREATE TABLE hold_rows (id int PRIMARY KEY, body text); INSERT INTO hold_rows VALUES (1, 'a')",
    );
    assert.equal(await kept.fencedUpdate("hold_rows", { body: "b" }, { id: 1 }), 1n);
    await cluster.sql("SELECT fence.lease_revoke('hold:busy')");
    await assert.rejects(kept.fencedUpdate("hold_rows", { body: "c" }, { id: 1 }), fence.StaleFenceError);
    assert.equal(kept.state, "lost");
    assert.equal(kept.reason, "revoked");
  });

  it("releases at the end of an `await using` block", async () => {
    let token = "";
    {
      await using kept = (await client.hold("hold:using", { ttl: 30_000 }))!;
      token = kept.token;
      assert.equal((await client.status("hold:using", token)).state, "live");
    }
    const s = await client.status("hold:using", token);
    assert.deepEqual([s.state, s.reason], ["ended", "released"]);
  });

  it("releases when the caller's signal aborts", async () => {
    const stop = new AbortController();
    const kept = (await client.hold("hold:caller", { ttl: 30_000, signal: stop.signal }))!;
    stop.abort();
    await eventually(() => kept.state === "released", 10_000, "the release");
    assert.equal((await client.status("hold:caller", kept.token)).reason, "released");
  });

  it("keeps no finished process alive", async () => {
    const script = `
      import pg from "pg";
      import { hold } from "${new URL("../src/index.js", import.meta.url).href}";
      const pool = new pg.Pool(${JSON.stringify(cluster.config("node_hold_child"))});
      const kept = await hold(pool, "hold:child", { ttl: 60000 });
      await pool.end();
      console.log(kept.state);
    `;
    // Bounded generously: the process must end by itself, with its lease still held.
    const { stdout } = await promisify(execFile)(process.execPath, ["--input-type=module", "-e", script], {
      timeout: 60_000,
      cwd: new URL("..", import.meta.url).pathname,
    });
    assert.equal(stdout.trim(), "held");
  });
});
