// Scratch clusters of the repository's pg_test/cluster for the Node suite, and the faults its
// tests make (a proxy that loses a reply). The Node suite takes ports 27850-27899 (clusters
// 27850-27879, proxies 27880-27899), each moved by $PG_FENCE_PORT_OFFSET.
import { execFile } from "node:child_process";
import { existsSync, readFileSync } from "node:fs";
import net from "node:net";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import pg from "pg";
import type * as fence from "../src/index.js";

const run = promisify(execFile);

/** The repository's root: the first directory above this file with pg_test/cluster. */
export function root(): string {
  for (let dir = dirname(fileURLToPath(import.meta.url)); dir !== dirname(dir); dir = dirname(dir)) {
    if (existsSync(join(dir, "pg_test", "cluster"))) return dir;
  }
  throw new Error("pg_test/cluster not found above the suite");
}

/** A port of the suite's own, moved by $PG_FENCE_PORT_OFFSET. */
export function port(base: number): number {
  return base + Number(process.env.PG_FENCE_PORT_OFFSET ?? 0);
}

/** A scratch cluster with pg_fence created. */
export class Cluster {
  private admin: pg.Client | undefined;

  private constructor(
    readonly name: string,
    readonly port: number,
  ) {}

  /** Destroys what a previous run left, creates, starts, creates pg_fence. */
  static async create(name: string, basePort: number): Promise<Cluster> {
    const c = new Cluster(`node_${name}`, port(basePort));
    await c.run("destroy").catch(() => undefined);
    // fsync off, as the Rust suites' clusters: the other suites beside this one (the test command
    // runs them together) load the disk, and a commit's flush waiting on it slows renewals of a
    // 1 s TTL past their deadline. A kill -9 of the server loses nothing with it off (no OS crash).
    await c.run("create", String(c.port), "fsync=off");
    await c.run("start");
    await c.sql("CREATE EXTENSION pg_fence");
    return c;
  }

  async run(...args: string[]): Promise<void> {
    const [cmd, ...rest] = args;
    try {
      await run(join(root(), "pg_test", "cluster"), [cmd!, this.name, ...rest], { timeout: 120_000 });
    } catch (err) {
      const e = err as { stderr?: string; message: string };
      throw new Error(`pg_test/cluster ${args.join(" ")}: ${e.message} ${e.stderr ?? ""}`);
    }
  }

  config(app: string, toPort = this.port): pg.ClientConfig {
    return { host: "127.0.0.1", port: toPort, user: "postgres", database: "postgres", application_name: app };
  }

  pool(app: string, toPort = this.port, max = 10): pg.Pool {
    return new pg.Pool({ ...this.config(app, toPort), max });
  }

  async client(app: string, toPort = this.port): Promise<pg.Client> {
    const c = new pg.Client(this.config(app, toPort));
    await c.connect();
    return c;
  }

  /** The rows of a statement run as the superuser, on one connection made again after a crash. */
  async sql(text: string, values: unknown[] = []): Promise<Record<string, unknown>[]> {
    for (let attempt = 0; ; attempt++) {
      if (!this.admin) {
        const admin = new pg.Client(this.config("pg_fence_node_test"));
        admin.on("error", () => {
          if (this.admin === admin) this.admin = undefined;
        });
        await admin.connect();
        this.admin = admin;
      }
      try {
        return (await this.admin.query(text, values)).rows as Record<string, unknown>[];
      } catch (err) {
        if (attempt > 0 || (err as { code?: string }).code !== undefined) throw err;
        this.admin = undefined;
      }
    }
  }

  /** The first column of the first row, as text (null for none or NULL). */
  async value(text: string, values: unknown[] = []): Promise<string | null> {
    const rows = await this.sql(`SELECT (${text})::text AS v`, values);
    return (rows[0]?.v as string | null | undefined) ?? null;
  }

  /** Sends SIGSTOP or SIGCONT to the postmaster and every process it started. */
  async signal(sig: "SIGSTOP" | "SIGCONT"): Promise<void> {
    const dir = process.env.PG_FENCE_TEST_DIR || "/tmp/pg_fence_test";
    const pid = readFileSync(join(dir, this.name, "postmaster.pid"), "utf8").split("\n")[0]!;
    const kids = await run("pgrep", ["-P", pid]).then(
      (r) => r.stdout.split(/\s+/).filter(Boolean),
      () => [] as string[],
    );
    for (const each of [pid, ...kids]) {
      try {
        process.kill(Number(each), sig);
      } catch (err) {
        if ((err as { code?: string }).code !== "ESRCH") throw err;
      }
    }
  }

  /** kill -9 of the server, then started again. */
  async crash(): Promise<void> {
    await this.admin?.end().catch(() => undefined);
    this.admin = undefined;
    await this.run("crash");
    await this.run("start");
  }

  /** Ends every session of `app`. */
  async terminate(app: string): Promise<void> {
    await this.sql("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1", [
      app,
    ]);
  }

  async destroy(): Promise<void> {
    await this.admin?.end().catch(() => undefined);
    this.admin = undefined;
    await this.run("destroy");
  }
}

/** A TCP proxy to a cluster that can lose the reply to a message holding a marker. */
export class Proxy {
  private marker: Buffer | undefined;
  private readonly hung = new WeakSet<net.Socket>();
  private readonly sockets = new Set<net.Socket>();
  dropped = 0;

  private constructor(private readonly server: net.Server) {}

  static async create(listen: number, to: number): Promise<Proxy> {
    const server = net.createServer();
    const proxy = new Proxy(server);
    server.on("connection", (client) => proxy.pair(client, to));
    await new Promise<void>((resolve, reject) => {
      server.once("error", reject);
      server.listen(port(listen), "127.0.0.1", resolve);
    });
    return proxy;
  }

  get port(): number {
    return (this.server.address() as net.AddressInfo).port;
  }

  /** The reply to the next message that holds `marker` is lost, and its client's connection closed. */
  dropReplyAfter(marker: string): void {
    this.marker = Buffer.from(marker);
  }

  /** The connections open now stop carrying data either way (no reset, no answer); later ones work. */
  hangExisting(): void {
    for (const s of this.sockets) this.hung.add(s);
  }

  private pair(client: net.Socket, to: number): void {
    const upstream = net.connect(to, "127.0.0.1");
    this.sockets.add(client).add(upstream);
    let armed = false;
    const end = () => {
      this.sockets.delete(client);
      this.sockets.delete(upstream);
      client.destroy();
      upstream.destroy();
    };
    client.on("error", end).on("close", end);
    upstream.on("error", end).on("close", end);
    client.on("data", (chunk: Buffer) => {
      if (this.hung.has(client)) return;
      if (this.marker && chunk.includes(this.marker)) {
        this.marker = undefined;
        armed = true;
      }
      upstream.write(chunk);
    });
    upstream.on("data", (chunk: Buffer) => {
      if (this.hung.has(client)) return;
      if (armed) {
        // The server has answered (after its commit): the client never learns it.
        this.dropped++;
        end();
        return;
      }
      client.write(chunk);
    });
  }

  async close(): Promise<void> {
    for (const s of this.sockets) s.destroy();
    await new Promise<void>((resolve) => this.server.close(() => resolve()));
  }
}

/** Waits until `check` holds, polling every 20 ms, for at most `ms`. */
export async function eventually(
  check: () => Promise<boolean> | boolean,
  ms = 10_000,
  what = "condition",
): Promise<void> {
  const until = performance.now() + ms;
  while (!(await check())) {
    if (performance.now() > until) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

/** What an observer records of what its observe() yields, in order. */
export class Observer {
  readonly seen: fence.Observation[] = [];
  private wake: (() => void) | undefined;
  readonly controller = new AbortController();
  readonly done: Promise<void>;

  constructor(
    readonly elector: fence.Elector,
    readonly pool: pg.Pool,
  ) {
    this.done = (async () => {
      for await (const item of elector.observe({ signal: this.controller.signal })) {
        this.seen.push(item);
        this.wake?.();
      }
    })();
    this.done.catch(() => undefined);
  }

  /** The next thing it saw, waiting up to `ms` for it. */
  async next(ms: number): Promise<fence.Observation> {
    const until = performance.now() + ms;
    while (this.seen.length === 0) {
      const left = until - performance.now();
      if (left <= 0) throw new Error("the observer saw nothing");
      await new Promise<void>((resolve) => {
        this.wake = resolve;
        setTimeout(resolve, left).unref();
      });
    }
    return this.seen.shift()!;
  }
}
