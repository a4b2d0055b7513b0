import pg from "pg";
import * as calls from "./calls.js";
import type { AcquireOptions, Duration, Lease, LeaseSet } from "./calls.js";
import { LeaseLostError, StaleFenceError, type LossReason } from "./errors.js";
import { keeperOf, type KeptState, type Keeper } from "./keeper.js";
import { renewedIfWaited, unrefTimeout } from "./util.js";

export interface HoldSetOptions extends Omit<AcquireOptions, "shared" | "permits" | "lockDelay" | "token"> {
  /** How often to renew, ttl/3 by default. */
  renewEvery?: Duration;
  /** Aborted while acquiring, the acquire is given up; after, the set is released. */
  signal?: AbortSignal;
  keeperConnections?: number;
}

/**
 * A lease set kept renewed whole (fence.lease_renew_all) on the pool's keeper's connections: kept
 * whole or lost. `signal` is aborted the moment it may be lost (a LeaseLostError naming why), by
 * the same deadline rule as a kept lease: a renewal sent at t keeps it to t + ttl locally.
 */
export class KeptLeaseSet implements AsyncDisposable {
  private stateNow: KeptState = "held";
  private reasonNow: LossReason | undefined;
  private readonly controller = new AbortController();
  private tellLost!: (err: LeaseLostError) => void;
  /** Resolves, once, when the set may be lost. */
  readonly lost: Promise<LeaseLostError> = new Promise((resolve) => (this.tellLost = resolve));
  private deadline: number;
  private renewTimer: NodeJS.Timeout | undefined;
  private deadlineTimer: NodeJS.Timeout | undefined;
  private renewing: Promise<void> | undefined;
  private readonly ttlMs: number;
  private readonly everyMs: number;

  /** @internal use holdAll() */
  constructor(
    private readonly pool: pg.Pool,
    private readonly keeper: Keeper,
    readonly set: LeaseSet,
    sentAt: number,
    private readonly opts: HoldSetOptions,
  ) {
    this.ttlMs = calls.millis(opts.ttl);
    this.everyMs = opts.renewEvery === undefined ? this.ttlMs / 3 : calls.millis(opts.renewEvery);
    this.deadline = sentAt + this.ttlMs;
    this.armDeadline();
    // From the send, as the deadline: a slow answer does not put the next renewal later.
    this.schedule(sentAt + this.everyMs - performance.now());
    opts.signal?.addEventListener("abort", () => void this.release().catch(() => undefined), { once: true });
  }

  get keys(): readonly string[] {
    return this.set.keys;
  }
  get leases(): readonly Lease[] {
    return this.set.leases;
  }
  /** Each key's fence. */
  fenceOf(key: string): bigint {
    const lease = this.set.leases.find((l) => l.key === key);
    if (!lease) throw new RangeError(`pg_fence: "${key}" is not a key of the set`);
    return lease.fence;
  }
  get state(): KeptState {
    return this.stateNow;
  }
  get reason(): LossReason | undefined {
    return this.reasonNow;
  }
  get signal(): AbortSignal {
    return this.controller.signal;
  }

  private armDeadline(): void {
    clearTimeout(this.deadlineTimer);
    this.deadlineTimer = unrefTimeout(
      () => this.tell("unknown", "unreachable"),
      this.deadline - performance.now(),
    );
  }

  private schedule(ms: number): void {
    clearTimeout(this.renewTimer);
    this.renewTimer = unrefTimeout(() => (this.renewing = this.renew()), ms);
  }

  private async renew(): Promise<void> {
    const attemptMs = Math.max(250, Math.min(this.everyMs, this.ttlMs / 6));
    while (this.stateNow === "held") {
      const sent = performance.now();
      try {
        await this.keeper.call((q) => calls.renewAll(q, this.set, this.opts.ttl), attemptMs, 1);
        if (this.stateNow !== "held") return;
        this.deadline = sent + this.ttlMs;
        this.armDeadline();
        return this.schedule(sent + this.everyMs - performance.now());
      } catch (err) {
        if (err instanceof LeaseLostError) return this.tell("lost", err.reason);
        await new Promise((r) => unrefTimeout(() => r(undefined), Math.random() * 200));
      }
    }
  }

  private tell(state: "lost" | "unknown", reason: LossReason): void {
    if (this.stateNow !== "held") return;
    this.stateNow = state;
    this.reasonNow = reason;
    clearTimeout(this.renewTimer);
    clearTimeout(this.deadlineTimer);
    const err = new LeaseLostError(this.set.keys.join(", "), reason);
    this.controller.abort(err);
    this.tellLost(err);
  }

  throwIfLost(): void {
    if (this.stateNow === "released") throw new LeaseLostError(this.set.keys.join(", "), "released");
    if (this.stateNow !== "held") throw this.controller.signal.reason as LeaseLostError;
  }

  /**
   * Runs `write` in a transaction of its own on the pool, after fence_guard with each key's fence;
   * refused before sending once the set may be lost. A stale fence ends the kept set.
   */
  async guard<T>(write: (tx: pg.PoolClient) => Promise<T>): Promise<T> {
    this.throwIfLost();
    const tx = await this.pool.connect();
    try {
      await tx.query("BEGIN");
      for (const lease of this.set.leases) await calls.fenceGuard(tx, lease.key, lease.fence);
      const result = await write(tx);
      await tx.query("COMMIT");
      return result;
    } catch (err) {
      await tx.query("ROLLBACK").catch(() => undefined);
      if (err instanceof StaleFenceError) {
        const s = await calls.status(this.pool, err.key, this.set.token).catch(() => undefined);
        this.tell("lost", (s?.state === "ended" && (s.reason as LossReason | null)) || "unknown");
      }
      throw err;
    } finally {
      tx.release();
    }
  }

  /** Stops renewing and releases every lease of the set: true when this release ended them all. */
  async release(): Promise<boolean> {
    if (this.stateNow === "released") return false;
    clearTimeout(this.renewTimer);
    clearTimeout(this.deadlineTimer);
    await this.renewing?.catch(() => undefined);
    const ended = await this.keeper.call((q) => calls.releaseAll(q, this.set));
    if (this.stateNow === "held" && ended === this.set.keys.length) {
      this.stateNow = "released";
      return true;
    }
    if (this.stateNow === "held") {
      this.stateNow = "lost";
      this.reasonNow = "unknown";
    }
    return false;
  }

  async [Symbol.asyncDispose](): Promise<void> {
    if (this.stateNow === "held") await this.release().catch(() => undefined);
  }
}

/**
 * Acquires every key of `keys` or none (fence.lease_acquire_all, on the pool) and keeps the set
 * renewed whole on the pool's keeper's connections: the kept set, or null when any key is held.
 */
export async function holdAll(
  pool: pg.Pool,
  keys: readonly string[],
  opts: HoldSetOptions,
): Promise<KeptLeaseSet | null> {
  const keeper = keeperOf(pool, opts.keeperConnections);
  await keeper.start();
  opts.signal?.throwIfAborted();
  const sent = performance.now();
  const set = await calls.acquireAll(pool, keys, opts);
  if (!set) return null;
  const renewed = await renewedIfWaited(opts, sent, {
    renew: () => keeper.call((q) => calls.renewAll(q, set, opts.ttl)),
    giveBack: () => keeper.call((q) => calls.releaseAll(q, set)),
  });
  const kept = new KeptLeaseSet(pool, keeper, set, renewed.sent, opts);
  if (opts.signal?.aborted) {
    await kept.release().catch(() => undefined);
    throw opts.signal.reason;
  }
  return kept;
}
