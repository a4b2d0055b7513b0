import { randomUUID } from "node:crypto";
import pg from "pg";
import { cut, pidOf, raced, renewedIfWaited } from "./util.js";
import * as calls from "./calls.js";
import type { AcquireOptions, Duration, Lease, Queryable } from "./calls.js";
import { FenceError, LeaseLostError, StaleFenceError, sqlstate, type LossReason } from "./errors.js";

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
    conn: pg.Client | undefined,
    sentAt: number,
    private readonly opts: HoldOptions,
    private readonly keeper?: Keeper,
  ) {
    this.key = lease.key;
    this.current = lease;
    this.ttlMs = calls.millis(opts.ttl);
    this.everyMs = opts.renewEvery === undefined ? this.ttlMs / 3 : calls.millis(opts.renewEvery);
    // A renewal that takes longer than this is given up for another on a new connection.
    this.attemptMs = Math.max(250, Math.min(this.everyMs, this.ttlMs / 6));
    this.deadline = sentAt + this.ttlMs;
    if (conn) this.adopt(conn);
    this.armDeadline();
    this.scheduleRenewal(sentAt + this.everyMs - performance.now());
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

  /** @internal the keeper's renewal, sent at `sent`, answered `expires`. */
  renewed(sent: number, expires: Date): void {
    if (this.stateNow !== "held") return;
    this.current = { ...this.current, expiresAt: expires };
    this.deadline = sent + this.ttlMs;
    this.armDeadline();
    this.scheduleRenewal(sent + this.everyMs - performance.now());
  }

  /** @internal the keeper's renewal found the lease lost: why. */
  lostTo(reason: LossReason): void {
    this.tell("lost", this.explained(reason));
  }

  /** A fast lease the server has no record of was lost with the server's unlogged state: restarted. */
  private explained(reason: LossReason): LossReason {
    return reason === "unknown" && this.current.fast ? "restarted" : reason;
  }

  /** @internal how long the keeper may wait for a renewal's answer. */
  get attemptTimeoutMs(): number {
    return Math.max(500, Math.min(this.everyMs, this.ttlMs / 6));
  }
  /** @internal */
  get ttl(): Duration {
    return this.opts.ttl;
  }

  /**
   * The next renewal `ms` from now: callers count it from the last renewal's send, as the deadline
   * is, so that a slow answer does not put the next renewal later and leave it less time before
   * the deadline (at or below 0: at once).
   */
  private scheduleRenewal(ms: number): void {
    if (this.keeper) return this.keeper.schedule(this, performance.now() + ms);
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
    this.keeper?.forget(this);
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
        this.scheduleRenewal(sent + this.everyMs - performance.now());
        return;
      } catch (err) {
        if (err instanceof LeaseLostError) return this.tell("lost", this.explained(err.reason));
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
    const reason = this.explained((s?.state === "ended" && (s.reason as LossReason | null)) || "unknown");
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
    this.keeper?.forget(this);
    await this.renewing?.catch(() => undefined);
    const released = this.keeper
      ? await this.keeper.call((q) => calls.release(q, this.current))
      : await calls.release(this.pool, this.current);
    if (released) {
      this.stateNow = "released";
      this.stop();
      return true;
    }
    if (this.keeper) await this.keeper.call((q) => this.learn(q));
    else await this.learn(this.pool);
    this.stateNow = "lost";
    return false;
  }

  /**
   * @internal Stops keeping the lease without a release: `released` when it ended otherwise (handed
   * off), `unknown` when it is left to expire.
   */
  abandon(state: "released" | "unknown" = "unknown"): void {
    if (this.stateNow !== "held") return;
    this.stateNow = state;
    this.stop();
  }

  async [Symbol.asyncDispose](): Promise<void> {
    if (this.stateNow === "held") await this.release().catch(() => undefined);
  }
}

const keepers = new WeakMap<pg.Pool, Keeper>();

/** The keeper of the pool's kept leases (started on first use, with `connections` of its own). */
export function keeperOf(pool: pg.Pool, connections = 2): Keeper {
  let keeper = keepers.get(pool);
  if (!keeper) {
    keeper = new Keeper((pool as unknown as { options: pg.ClientConfig }).options, connections);
    keepers.set(pool, keeper);
  }
  return keeper;
}

/**
 * Acquires the key and keeps it renewed: the kept lease, or null when refused. A session-bound
 * lease is acquired and renewed on a connection of its own (its session is the lease); any other is
 * acquired on the pool and renewed by the pool's keeper, with every other kept lease of the pool,
 * over its few connections (fence.lease_renew_many). With `retried` (FenceClient.hold's: its
 * acquire, retried with the token), the acquire of a lease that is not session-bound goes through
 * it; it is tried once otherwise.
 */
export async function hold(
  pool: pg.Pool,
  key: string,
  opts: HoldOptions & { keeperConnections?: number },
  retried?: (opts: HoldOptions & { token: string }) => Promise<Lease | null>,
): Promise<KeptLease | null> {
  const config = (pool as unknown as { options: pg.ClientConfig }).options;
  const keeper = keeperOf(pool, opts.keeperConnections);
  const o = { ...opts, token: opts.token ?? randomUUID() };
  if (!opts.sessionBound) {
    await keeper.start();
    // Before the first try: any of the tries, all with the same token, may be the one granted.
    let sent = performance.now();
    let lease: Lease | null;
    if (retried) lease = await retried(o);
    else {
      const conn = await pool.connect();
      // Not before: a wait in the pool's queue would be counted against the lease's TTL.
      sent = performance.now();
      try {
        lease = await acquireGivingUp(conn, key, o, keeper, opts.signal);
        conn.release();
      } catch (err) {
        conn.release(opts.signal?.aborted ? true : err instanceof Error ? err : undefined);
        throw err;
      }
    }
    if (!lease) return null;
    const granted = lease;
    const renewed = await renewedIfWaited(opts, sent, {
      renew: () => keeper.call((q) => calls.renew(q, granted, opts.ttl)),
      giveBack: () => keeper.call((q) => calls.release(q, granted)),
    });
    const current = renewed.expiresAt ? { ...lease, expiresAt: renewed.expiresAt } : lease;
    return kept(new KeptLease(pool, config, current, undefined, renewed.sent, opts, keeper), opts.signal);
  }
  const conn = new pg.Client(config);
  conn.on("error", () => undefined);
  await conn.connect();
  const sent = performance.now();
  let lease: Lease | null;
  try {
    lease = await acquireGivingUp(conn, key, o, keeper, opts.signal);
  } catch (err) {
    await conn.end().catch(() => undefined);
    throw err;
  }
  if (!lease) {
    await conn.end().catch(() => undefined);
    return null;
  }
  const granted = lease;
  const renewed = await renewedIfWaited(opts, sent, {
    renew: () => calls.renew(conn, granted, opts.ttl),
    giveBack: () => conn.end(), // the session is the lease
  });
  const current = renewed.expiresAt ? { ...lease, expiresAt: renewed.expiresAt } : lease;
  // Renewals go on in the background: they keep no finished process alive.
  unref(conn);
  return kept(new KeptLease(pool, config, current, conn, renewed.sent, opts), opts.signal);
}

/** The kept lease, unless the caller gave up as it was granted: then released, and the give-up thrown. */
async function kept(lease: KeptLease, signal: AbortSignal | undefined): Promise<KeptLease> {
  if (!signal?.aborted) return lease;
  await lease.release().catch(() => undefined);
  throw signal.reason;
}

/**
 * An acquire on `conn`, given up when `signal` aborts: its wait is cancelled on the server, the
 * connection cut, and the token it sent released on the keeper's connections (giveUp).
 */
async function acquireGivingUp(
  conn: pg.Client | pg.PoolClient,
  key: string,
  opts: AcquireOptions & { token: string },
  keeper: Keeper,
  signal: AbortSignal | undefined,
): Promise<Lease | null> {
  if (!signal) return calls.acquire(conn, key, opts);
  const answer = calls.acquire(conn, key, opts);
  answer.catch(() => undefined);
  try {
    return await raced(answer, signal);
  } catch (err) {
    if (signal.aborted) {
      void giveUp(keeper, pidOf(conn), key, opts.token);
      cut(conn);
    }
    throw err;
  }
}

/**
 * What a call given up leaves behind is undone, on the keeper's connections: the backend's wait
 * is cancelled (pg_cancel_backend, while it still runs the acquire), then the token it sent is
 * released, so that a grant whose reply never came is not left to run out its ttl.
 */
export async function giveUp(
  keeper: Keeper,
  pid: number | undefined,
  key: string,
  token: string,
): Promise<void> {
  try {
    await keeper.call(async (q) => {
      for (let i = 0; pid !== undefined && i < 15; i++) {
        const r = await q.query(
          "SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE pid = $1 AND state = 'active' AND query LIKE '%fence.lease_acquire%'",
          [pid],
        );
        if (!r.rowCount) break;
        await pause(50);
      }
      await calls.release(q, { key, token });
    }, 1500);
  } catch {
    // Unreachable: the grant, if any, runs out its ttl.
  }
}

/** Up to this many renewals go in one fence.lease_renew_many. */
const BATCH = 64;

/** A keeper's try that failed for its connection's sake (cut since): another try may succeed. */
class ConnectionFailed {
  constructor(readonly cause: unknown) {}
}

/**
 * Renews many kept leases over a few connections of its own, opened when it starts and made again
 * only when one breaks: the renewals that are due go together, up to 64 a call.
 */
export class Keeper {
  private readonly conns: (pg.Client | undefined)[];
  /** Per connection, the end of the last call given it: one call at a time on a connection. */
  private readonly turns: Promise<void>[];
  /** Per connection, the calls given it that have not ended. */
  private readonly waiting: number[];
  private readonly due = new Map<KeptLease, number>();
  private timer: NodeJS.Timeout | undefined;
  private timerAt = Infinity;
  private started: Promise<void> | undefined;
  private opened = false;
  private readonly failures = new Map<KeptLease, number>();
  /** Renewal calls sent again after a failure. */
  attempts = 0;
  /** Connections made since it started (beyond the first ones): 0 while none broke. */
  reconnections = 0;
  /** Every renewal's round trip, in milliseconds (the last 10,000). */
  readonly latencies: number[] = [];

  constructor(
    private readonly config: pg.ClientConfig,
    readonly connections = 2,
  ) {
    this.conns = new Array<pg.Client | undefined>(connections).fill(undefined);
    this.turns = new Array<Promise<void>>(connections).fill(Promise.resolve());
    this.waiting = new Array<number>(connections).fill(0);
  }

  /** The connection with the fewest calls given it, the first of them on a tie. */
  private leastBusy(): number {
    let best = 0;
    for (let i = 1; i < this.connections; i++) if (this.waiting[i]! < this.waiting[best]!) best = i;
    return best;
  }

  /**
   * Runs `fn` when the calls given connection `i` before it have ended: node-postgres would queue
   * a query sent on a busy client (deprecated, and gone in pg 9), and a call's time bound starts
   * only when its turn comes, not behind another's.
   */
  private async inTurn<T>(i: number, fn: () => Promise<T>): Promise<T> {
    const before = this.turns[i]!;
    let done!: () => void;
    this.turns[i] = new Promise<void>((resolve) => (done = resolve));
    this.waiting[i]!++;
    try {
      await before;
      return await fn();
    } finally {
      this.waiting[i]!--;
      done();
    }
  }

  /** The application_name of the keeper's sessions. */
  get applicationName(): string {
    return `${this.config.application_name ?? "pg_fence"}:keeper`;
  }

  start(): Promise<void> {
    this.started ??= Promise.all(this.conns.map((_, i) => this.connection(i, 30_000))).then(() => {
      this.opened = true;
    });
    return this.started;
  }

  private async connection(i: number, timeoutMs: number): Promise<pg.Client> {
    const have = this.conns[i];
    if (have) return have;
    const conn = new pg.Client({
      ...this.config,
      application_name: this.applicationName,
      connectionTimeoutMillis: timeoutMs,
      keepAlive: true,
    });
    conn.on("error", () => {
      if (this.conns[i] === conn) this.conns[i] = undefined;
    });
    conn.on("end", () => {
      if (this.conns[i] === conn) this.conns[i] = undefined;
    });
    await conn.connect();
    unref(conn);
    if (this.opened) this.reconnections++;
    this.conns[i] = conn;
    return conn;
  }

  private drop(i: number): void {
    const conn = this.conns[i];
    this.conns[i] = undefined;
    if (!conn) return;
    conn.end().catch(() => undefined);
    (conn as unknown as { connection?: { stream?: { destroy(): void } } }).connection?.stream?.destroy();
  }

  /** @internal */
  schedule(lease: KeptLease, at: number): void {
    this.due.set(lease, at);
    if (at < this.timerAt) this.arm(at);
  }

  /** @internal */
  forget(lease: KeptLease): void {
    this.due.delete(lease);
    this.failures.delete(lease);
  }

  private arm(at: number): void {
    clearTimeout(this.timer);
    this.timerAt = at;
    this.timer = unrefTimer(() => this.tick(), at - performance.now());
  }

  private tick(): void {
    this.timerAt = Infinity;
    // What is due now, and what would be due within the next 20 ms, goes now: together.
    const now = performance.now() + 20;
    const batch: KeptLease[] = [];
    let earliest = Infinity;
    for (const [lease, at] of this.due) {
      if (at <= now) batch.push(lease);
      else earliest = Math.min(earliest, at);
    }
    for (const lease of batch) this.due.delete(lease);
    for (let i = 0; i < batch.length; i += BATCH) {
      void this.send(batch.slice(i, i + BATCH), this.leastBusy());
    }
    if (earliest < Infinity) this.arm(earliest);
  }

  private async send(batch: KeptLease[], i: number): Promise<void> {
    if (batch.length === 0) return;
    return this.inTurn(i, () => this.sendInTurn(batch, i));
  }

  private async sendInTurn(waited: KeptLease[], i: number): Promise<void> {
    // Released or lost while it waited for its turn: nothing to renew.
    const batch = waited.filter((lease) => lease.state === "held");
    if (batch.length === 0) return;
    const timeoutMs = Math.min(...batch.map((l) => l.attemptTimeoutMs));
    const sent = performance.now();
    let timer: NodeJS.Timeout | undefined;
    try {
      const conn = await this.connection(i, timeoutMs);
      const answer = conn.query(
        "SELECT expires_at FROM fence.lease_renew_many($1::text[], $2::uuid[], $3::interval[])",
        [batch.map((l) => l.key), batch.map((l) => l.token), batch.map((l) => calls.interval(l.ttl))],
      );
      const result = await Promise.race([
        answer,
        new Promise<never>((_, reject) => {
          timer = unrefTimer(() => reject(new Error("renewal timed out")), timeoutMs);
        }),
      ]);
      const took = performance.now() - sent;
      if (this.latencies.length < 10_000) this.latencies.push(took);
      const lost: KeptLease[] = [];
      result.rows.forEach((row: { expires_at: Date | null }, n: number) => {
        const lease = batch[n]!;
        this.failures.delete(lease);
        if (row.expires_at) lease.renewed(sent, row.expires_at);
        else lost.push(lease);
      });
      for (const lease of lost) {
        const s = await calls.status(conn, lease.key, lease.token).catch(() => undefined);
        lease.lostTo((s?.state === "ended" && (s.reason as LossReason | null)) || "unknown");
      }
    } catch {
      // The connection broke or hung: it goes, and the batch is sent again soon on a new one in
      // its place (another of the keeper's may hang too).
      this.drop(i);
      const again = batch.filter((lease) => lease.state === "held" && !this.due.has(lease));
      if (again.length === 0) return;
      this.attempts++;
      const failures = Math.max(...again.map((l) => (this.failures.get(l) ?? 0) + 1));
      for (const lease of again) this.failures.set(lease, failures);
      unrefTimer(
        () =>
          void this.send(
            again.filter((l) => l.state === "held" && !this.due.has(l)),
            i,
          ),
        Math.random() * Math.min(1000, 50 * 2 ** Math.min(failures, 5)),
      );
    } finally {
      clearTimeout(timer);
    }
  }

  /**
   * Runs a call on one of the keeper's connections, given up after `timeoutMs` for another try
   * on a new connection (a hung one is cut), for at most `attempts` tries.
   */
  async call<T>(fn: (q: pg.Client) => Promise<T>, timeoutMs = 2000, attempts = 5): Promise<T> {
    // A connection that hung is cut and made again in its place: the next try goes there, not to
    // another of the keeper's that may hang too.
    const i = this.leastBusy();
    for (let attempt = 1; ; attempt++) {
      try {
        return await this.inTurn(i, () => this.attempt(i, fn, timeoutMs));
      } catch (err) {
        if (!(err instanceof ConnectionFailed)) throw err;
        if (attempt >= attempts) throw err.cause;
        await pause(Math.random() * Math.min(1000, 50 * 2 ** attempt));
      }
    }
  }

  /** One try of `call`'s, in its turn on connection `i`: cut when it fails for the connection's sake. */
  private async attempt<T>(i: number, fn: (q: pg.Client) => Promise<T>, timeoutMs: number): Promise<T> {
    let timer: NodeJS.Timeout | undefined;
    try {
      const conn = await this.connection(i, timeoutMs);
      return await Promise.race([
        fn(conn),
        new Promise<never>((_, reject) => {
          timer = unrefTimer(() => reject(new Error("pg_fence: the keeper's call timed out")), timeoutMs);
        }),
      ]);
    } catch (err) {
      // The server's answer (a lost lease among them) is no connection's fault.
      if (err instanceof FenceError || (sqlstate(err) !== undefined && !sqlstate(err)!.startsWith("08")))
        throw err;
      this.drop(i);
      throw new ConnectionFailed(err);
    } finally {
      clearTimeout(timer);
    }
  }

  /** Stops renewing and closes its connections (the leases it kept are left to expire). */
  async close(): Promise<void> {
    clearTimeout(this.timer);
    this.due.clear();
    for (let i = 0; i < this.conns.length; i++) this.drop(i);
  }
}

/**
 * Takes the first free key of `keys` in one call (fence.lease_acquire_any) and keeps it, renewed
 * by the pool's keeper: the kept lease, or null when none was free.
 */
export async function holdAny(
  pool: pg.Pool,
  keys: readonly string[],
  opts: Omit<HoldOptions, "wait" | "lockDelay" | "sessionBound"> & { keeperConnections?: number },
): Promise<KeptLease | null> {
  const config = (pool as unknown as { options: pg.ClientConfig }).options;
  const keeper = keeperOf(pool, opts.keeperConnections);
  await keeper.start();
  const sent = performance.now();
  const lease = await calls.acquireAny(pool, keys, opts);
  return lease && new KeptLease(pool, config, lease, undefined, sent, opts, keeper);
}
