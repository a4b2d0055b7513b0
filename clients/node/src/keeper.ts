import pg from "pg";
import * as calls from "./calls.js";
import type { AcquireOptions, Duration, Lease, Queryable } from "./calls.js";
import { LeaseLostError, StaleFenceError, type LossReason } from "./errors.js";

/** What a kept lease is: held, lost (the server said so), unknown (its deadline passed unanswered), released. */
export type KeptState = "held" | "lost" | "unknown" | "released";

export interface HoldOptions extends Omit<AcquireOptions, "shared" | "permits"> {
  /** How often to renew, ttl/3 by default. */
  renewEvery?: Duration;
  /** Aborted with the caller's own: ends the kept lease (released). */
  signal?: AbortSignal;
}

function unrefTimer(fn: () => void, ms: number): NodeJS.Timeout {
  const t = setTimeout(fn, Math.max(0, ms));
  t.unref();
  return t;
}

/** The connection's socket no longer keeps the process alive. */
function unref(conn: pg.Client): void {
  (conn as unknown as { unref?: () => void }).unref?.();
}

const pause = (ms: number) => new Promise<void>((resolve) => unrefTimer(resolve, ms));

/**
 * A lease kept renewed every ttl/3 on a connection of its own. `signal` is aborted the moment the
 * lease may be lost, with a LeaseLostError whose `reason` says why; `lost` resolves with the same.
 * The local deadline: a renewal (or the acquire) sent at t keeps the lease to t + ttl by
 * `performance.now()`, taken before sending; when it passes with no answer the holder is told
 * `unreachable` (state `unknown`), before the server's expiry. Every timer is unref'ed.
 */
export class KeptLease implements AsyncDisposable {
  readonly key: string;
  private current: Lease;
  private stateNow: KeptState = "held";
  private reasonNow: LossReason | undefined;
  private readonly controller = new AbortController();
  private tellLost!: (err: LeaseLostError) => void;
  /** Resolves, once, when the lease may be lost. */
  readonly lost: Promise<LeaseLostError> = new Promise((resolve) => (this.tellLost = resolve));
  private deadline: number;
  private renewTimer: NodeJS.Timeout | undefined;
  private deadlineTimer: NodeJS.Timeout | undefined;
  private conn: pg.Client | undefined;
  private renewing: Promise<void> | undefined;
  private readonly ttlMs: number;
  private readonly everyMs: number;
  private readonly attemptMs: number;

  /** @internal use hold() */
  constructor(
    private readonly pool: pg.Pool,
    private readonly config: pg.ClientConfig,
    lease: Lease,
    conn: pg.Client,
    sentAt: number,
    private readonly opts: HoldOptions,
  ) {
    this.key = lease.key;
    this.current = lease;
    this.ttlMs = calls.millis(opts.ttl);
    this.everyMs = opts.renewEvery === undefined ? this.ttlMs / 3 : calls.millis(opts.renewEvery);
    // A renewal that takes longer than this is given up for another on a new connection.
    this.attemptMs = Math.max(250, Math.min(this.everyMs, this.ttlMs / 6));
    this.deadline = sentAt + this.ttlMs;
    this.adopt(conn);
    this.armDeadline();
    this.scheduleRenewal(this.everyMs);
    opts.signal?.addEventListener("abort", () => void this.release().catch(() => undefined), { once: true });
  }

  /** The lease as last granted or renewed (its fence never changes). */
  get lease(): Lease {
    return this.current;
  }
  get fence(): bigint {
    return this.current.fence;
  }
  get token(): string {
    return this.current.token;
  }
  get state(): KeptState {
    return this.stateNow;
  }
  /** Why the lease is not held: what the holder was told, or what a release found since. */
  get reason(): LossReason | undefined {
    return this.reasonNow;
  }
  /** Aborted the moment the lease may be lost; its `reason` is a LeaseLostError. */
  get signal(): AbortSignal {
    return this.controller.signal;
  }
  /** Milliseconds (on performance.now()) until the local deadline. */
  get remainingMs(): number {
    return this.deadline - performance.now();
  }

  private adopt(conn: pg.Client): void {
    this.conn = conn;
    const broke = () => {
      if (this.conn !== conn) return;
      this.drop();
      // A session-bound lease ends with its session: nothing to wait for.
      if (this.opts.sessionBound) this.tell("lost", "session_ended");
    };
    conn.on("error", broke);
    conn.on("end", broke);
  }

  private drop(): void {
    const conn = this.conn;
    this.conn = undefined;
    if (!conn) return;
    conn.end().catch(() => undefined);
    // A hung connection never finishes its end: cut it.
    (conn as unknown as { connection?: { stream?: { destroy(): void } } }).connection?.stream?.destroy();
  }

  private armDeadline(): void {
    clearTimeout(this.deadlineTimer);
    this.deadlineTimer = unrefTimer(
      () => this.tell("unknown", "unreachable"),
      this.deadline - performance.now(),
    );
  }

  private scheduleRenewal(ms: number): void {
    clearTimeout(this.renewTimer);
    this.renewTimer = unrefTimer(() => {
      this.renewing = this.renew();
    }, ms);
  }

  /** Ends the kept lease locally (once) and tells the holder. */
  private tell(state: "lost" | "unknown", reason: LossReason): void {
    if (this.stateNow !== "held") return;
    this.stateNow = state;
    this.reasonNow = reason;
    this.stop();
    const err = new LeaseLostError(this.key, reason);
    this.controller.abort(err);
    this.tellLost(err);
  }

  private stop(): void {
    clearTimeout(this.renewTimer);
    clearTimeout(this.deadlineTimer);
    const conn = this.conn;
    this.conn = undefined;
    conn?.end().catch(() => undefined);
  }

  private async connection(): Promise<pg.Client> {
    if (this.conn) return this.conn;
    const conn = new pg.Client({ ...this.config, connectionTimeoutMillis: this.attemptMs, keepAlive: true });
    conn.on("error", () => undefined);
    try {
      await conn.connect();
    } catch (err) {
      conn.end().catch(() => undefined);
      throw err;
    }
    unref(conn);
    if (this.stateNow !== "held") {
      conn.end().catch(() => undefined);
      throw new Error("ended");
    }
    this.adopt(conn);
    return conn;
  }

  private async renew(): Promise<void> {
    for (let attempt = 0; this.stateNow === "held"; attempt++) {
      const sent = performance.now();
      let timer: NodeJS.Timeout | undefined;
      try {
        const conn = await this.connection();
        const expires = await Promise.race([
          calls.renew(conn, this.current, this.opts.ttl),
          new Promise<never>((_, reject) => {
            timer = unrefTimer(() => reject(new Error("renewal timed out")), this.attemptMs);
          }),
        ]);
        if (this.stateNow !== "held") return;
        this.current = { ...this.current, expiresAt: expires };
        this.deadline = sent + this.ttlMs;
        this.armDeadline();
        this.scheduleRenewal(this.everyMs);
        return;
      } catch (err) {
        if (err instanceof LeaseLostError) return this.tell("lost", err.reason);
        this.drop();
        if (this.opts.sessionBound) return this.tell("lost", "session_ended");
        await pause(Math.random() * Math.min(1000, 50 * 2 ** Math.min(attempt, 5)));
      } finally {
        clearTimeout(timer);
      }
    }
  }

  /** What the server says became of the lease, told to the holder. */
  private async learn(q: Queryable): Promise<LossReason> {
    const s = await calls.status(q, this.key, this.current.token).catch(() => undefined);
    const reason = (s?.state === "ended" && (s.reason as LossReason | null)) || "unknown";
    this.tell("lost", reason);
    this.reasonNow = reason;
    return reason;
  }

  /**
   * Runs `write` in a transaction of its own on the pool, after fence_guard with this lease's
   * fence; refused before sending once the lease may be lost. A stale fence ends the kept lease.
   */
  async guard<T>(write: (tx: pg.PoolClient) => Promise<T>): Promise<T> {
    this.throwIfLost();
    const tx = await this.pool.connect();
    try {
      await tx.query("BEGIN");
      await calls.fenceGuard(tx, this.key, this.current.fence);
      const result = await write(tx);
      await tx.query("COMMIT");
      return result;
    } catch (err) {
      await tx.query("ROLLBACK").catch(() => undefined);
      if (err instanceof StaleFenceError) await this.learn(this.pool);
      throw err;
    } finally {
      tx.release();
    }
  }

  /** fence.fenced_update under this lease's fence; a stale fence ends the kept lease. */
  async fencedUpdate(
    table: string,
    changes: Record<string, unknown>,
    filter: Record<string, unknown>,
  ): Promise<bigint> {
    this.throwIfLost();
    try {
      return await calls.fencedUpdate(this.pool, this.key, this.current.fence, table, changes, filter);
    } catch (err) {
      if (err instanceof StaleFenceError) await this.learn(this.pool);
      throw err;
    }
  }

  /** Throws the LeaseLostError the holder was told, if it was. */
  throwIfLost(): void {
    if (this.stateNow === "released") throw new LeaseLostError(this.key, "released");
    if (this.stateNow !== "held") throw this.controller.signal.reason as LeaseLostError;
  }

  /**
   * Stops renewing and releases: true when this release ended the lease. Otherwise the state
   * says what became of it (lost, with the server's reason).
   */
  async release(): Promise<boolean> {
    if (this.stateNow === "released") return false;
    clearTimeout(this.renewTimer);
    clearTimeout(this.deadlineTimer);
    await this.renewing?.catch(() => undefined);
    const released = await calls.release(this.pool, this.current);
    if (released) {
      this.stateNow = "released";
      this.stop();
      return true;
    }
    await this.learn(this.pool);
    this.stateNow = "lost";
    return false;
  }

  async [Symbol.asyncDispose](): Promise<void> {
    if (this.stateNow === "held") await this.release().catch(() => undefined);
  }
}

/** Acquires the key on a connection of its own and keeps it renewed: the kept lease, or null when refused. */
export async function hold(pool: pg.Pool, key: string, opts: HoldOptions): Promise<KeptLease | null> {
  const config = (pool as unknown as { options: pg.ClientConfig }).options;
  const conn = new pg.Client(config);
  conn.on("error", () => undefined);
  await conn.connect();
  const sent = performance.now();
  let lease: Lease | null;
  try {
    lease = await calls.acquire(conn, key, opts);
  } catch (err) {
    await conn.end().catch(() => undefined);
    throw err;
  }
  if (!lease) {
    await conn.end().catch(() => undefined);
    return null;
  }
  // Renewals go on in the background: they keep no finished process alive.
  unref(conn);
  return new KeptLease(pool, config, lease, conn, sent, opts);
}
