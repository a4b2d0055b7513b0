import pg from "pg";
import * as calls from "./calls.js";
import type { Duration, Lease, Leader } from "./calls.js";
import { FenceClient } from "./client.js";
import {
  FenceError,
  InvalidOptionsError,
  LeaseLostError,
  ObserverBlindError,
  type LossReason,
} from "./errors.js";
import { hold, type KeptLease } from "./keeper.js";
import { anySignal } from "./util.js";

/** How long one wait of a campaign lasts before it is asked again (it stays in line meanwhile). */
const CAMPAIGN_WAIT_MS = 60_000;
/** How long past the observed lease's expiry an observer waits for an answer before it says it cannot see. */
const BLIND_SLACK_MS = 500;
/** How long before the observed lease's expiry an observer's wait ends. */
const EARLY_MS = 250;

/**
 * Why a leadership ended: the reason its lease was lost for (`unreachable` at its local deadline),
 * `released` (resigned, or cancelled with releaseOnCancel), `handed_off`, or `cancelled` (cancelled
 * without releaseOnCancel: left to expire).
 */
export type StopReason = LossReason | "handed_off" | "cancelled";

/** The reason of a leadership's signal once it handed the key off. */
export class HandedOffError extends FenceError {
  constructor(
    readonly key: string,
    readonly to: Leader,
  ) {
    super(`pg_fence: leadership of "${key}" handed off to ${to.owner}`);
  }
}

/** What an observer is told: the leader, null (nobody leads), or that it cannot see the key. */
export type Observation = Leader | null | ObserverBlindError;

export interface ElectorOptions {
  /** The key campaigned for and observed. */
  key: string;
  /** This candidate's value: its lease's owner, what observers see (an address, a version). */
  value?: string;
  /** The leadership's lease's ttl: required to campaign, not to observe. */
  ttl?: Duration;
  /** A fast (unlogged) lease: lost in a crash, told `restarted`. */
  fast?: boolean;
  /** The leadership ends with the session that campaigned (on a connection of its own). */
  sessionBound?: boolean;
  /** After a leadership ends other than by a release, nobody leads for this long. */
  lockDelay?: Duration;
  /** How often the leadership is renewed, ttl/3 by default. */
  renewEvery?: Duration;
  /**
   * When the campaign's signal aborts while leading: release the lease, so that the next in line
   * leads at once (true, the default), or stop renewing and leave it to expire (false).
   */
  releaseOnCancel?: boolean;
  /** How long one await_change of an observer waits before asking again, 30 s by default. */
  observeTimeout?: Duration;
  /** Told once elected (the leadership's signal and fence are the leader's work's). */
  onStartedLeading?: (leadership: Leadership) => void;
  /** Told once a leadership that started has ended, after its signal was aborted; `reason` says why. */
  onStoppedLeading?: (leadership: Leadership, reason: StopReason) => void;
  /**
   * Told the present at once (the leader, or null), then each change (a new leader, a proclaimed
   * value, null for vacancy), until close(). Not queued: while one call runs, the changes that come
   * and go are not told; the next call has the latest.
   */
  onNewLeader?: (leader: Leader | null) => void;
  /** The keeper's connections (2 by default). */
  keeperConnections?: number;
}

/** Whether two observations tell the same state: the same leader with the same value, or both vacancy. */
function same(a: Leader | null, b: Leader | null): boolean {
  if (a === null || b === null) return a === b;
  return a.fence === b.fence && a.owner === b.owner;
}

/**
 * Campaigns for a key, observes its leaders and tells of them: etcd's election (campaign, proclaim,
 * resign, leader, observe) and client-go's callbacks, on the server's election functions. A leader
 * is the holder of the key's lease, its value the lease's owner, and its fence fences its writes.
 * Leaderships are kept by the pool's keeper, as every kept lease of the pool.
 */
export class Elector {
  readonly key: string;
  readonly client: FenceClient;
  private readonly opts: ElectorOptions;
  private current: Leadership | undefined;
  private readonly closing = new AbortController();

  constructor(pool: pg.Pool | FenceClient, opts: ElectorOptions) {
    if (!opts.key) throw new InvalidOptionsError("pg_fence: an elector needs a key");
    if (opts.ttl !== undefined && !(calls.millis(opts.ttl) > 0))
      throw new InvalidOptionsError("pg_fence: an elector's ttl must be above 0");
    this.key = opts.key;
    this.opts = opts;
    this.client = pool instanceof FenceClient ? pool : new FenceClient(pool);
    const tell = opts.onNewLeader;
    if (tell) void this.tellNewLeaders(tell);
  }

  /** This elector's value (the owner its campaigns are made with). */
  get value(): string {
    return this.opts.value ?? "";
  }

  /** The current (or last) leadership of this elector; undefined before the first. */
  get leadership(): Leadership | undefined {
    return this.current;
  }

  /** Whether this elector leads now (by its lease's local deadline). */
  get isLeader(): boolean {
    return this.current?.isLeader ?? false;
  }

  /**
   * Waits in line until elected and resolves with the leadership, kept renewed, after telling
   * onStartedLeading. `signal` is the candidate's life: aborted while waiting, the wait is cancelled
   * on the server, the token it sent released, and the campaign rejects with its reason, granting
   * nothing; aborted while leading, the leadership ends (releaseOnCancel says how).
   */
  async campaign(opts: { signal?: AbortSignal } = {}): Promise<Leadership> {
    const { ttl } = this.opts;
    if (ttl === undefined) throw new InvalidOptionsError("pg_fence: ttl is required to campaign");
    // Aborted by the candidate's signal until elected only: the leadership follows it after.
    const waiting = new AbortController();
    const follow = () => waiting.abort(opts.signal!.reason);
    if (opts.signal?.aborted) follow();
    else opts.signal?.addEventListener("abort", follow, { once: true });
    try {
      for (;;) {
        const kept = await hold(this.client.pool, this.key, {
          ttl,
          owner: this.value,
          wait: CAMPAIGN_WAIT_MS,
          fast: this.opts.fast,
          sessionBound: this.opts.sessionBound,
          lockDelay: this.opts.lockDelay,
          renewEvery: this.opts.renewEvery,
          signal: waiting.signal,
          keeperConnections: this.opts.keeperConnections,
        });
        if (kept) return this.elected(kept, opts.signal);
      }
    } finally {
      opts.signal?.removeEventListener("abort", follow);
    }
  }

  private elected(kept: KeptLease, signal: AbortSignal | undefined): Leadership {
    const leadership = new Leadership(this, kept, this.value, signal, this.opts);
    this.current = leadership;
    this.opts.onStartedLeading?.(leadership);
    return leadership;
  }

  /** The key's leader now, or null when nobody leads. */
  leader(): Promise<Leader | null> {
    return this.client.awaitChange(this.key, null, 0);
  }

  /**
   * The key's leaders as they change (fence.await_change in a loop): first the present, at once
   * (the leader, or null when nobody leads), then every change: a new leader, a new value
   * proclaimed (the same fence), null when nobody leads. Changes closer together than the server's
   * pace (50 ms a session) may be skipped: each answer is the latest state. A broken connection is
   * made again without missing a change. While it sees a leader, no answer by that leader's lease
   * expiry (a silent network, a server gone) is an ObserverBlindError, yielded, not the old leader
   * nor a vacancy; the observer goes on, and yields the present once the server answers. Ends
   * (returns) when `signal` aborts or the elector closes; throws what its retries cannot get past.
   */
  async *observe(opts: { signal?: AbortSignal } = {}): AsyncGenerator<Observation, void, undefined> {
    const signal = anySignal(opts.signal, this.closing.signal);
    const timeoutMs = calls.millis(this.opts.observeTimeout ?? 30_000);
    let seen: Leader | null = null;
    let present = true; // the next answer is the present (the first, or after blindness)
    try {
      for (;;) {
        if (present) {
          seen = await this.client.awaitChange(this.key, null, 0, { signal });
          present = false;
          yield seen;
          continue;
        }
        let now: Leader | null;
        if (seen === null) {
          now = await this.client.awaitChange(this.key, null, timeoutMs, { signal });
        } else {
          // The server answers by the lease's expiry at the latest (the same leader, renewed, or
          // the change), so an answer missing then is blindness, whatever its cause.
          // Asked to answer a little before that expiry, so that its answer is due by then.
          const waitMs = Math.min(timeoutMs, Math.max(seen.expiresAt.getTime() - Date.now() - EARLY_MS, 50));
          try {
            now = await this.client.awaitChange(this.key, seen, waitMs, {
              signal,
              boundMs: waitMs + BLIND_SLACK_MS,
            });
          } catch (err) {
            if (signal.aborted) throw err;
            present = true;
            yield new ObserverBlindError(this.key, seen, err);
            continue;
          }
        }
        if (!same(seen, now)) {
          seen = now;
          yield now;
        } else if (now) seen = now; // the same leader, renewed: its new expiry bounds the next wait
      }
    } catch (err) {
      if (signal.aborted) return;
      throw err;
    }
  }

  private async tellNewLeaders(tell: (leader: Leader | null) => void): Promise<void> {
    while (!this.closing.signal.aborted) {
      try {
        for await (const seen of this.observe()) {
          if (!(seen instanceof ObserverBlindError)) tell(seen);
        }
      } catch {
        // What the retries could not get past: looked at again in a second.
        await new Promise((r) => setTimeout(r, 1000).unref());
      }
    }
  }

  /** Stops its observers (and onNewLeader). Leaderships end with their campaign's signal, or by resign. */
  close(): void {
    this.closing.abort();
  }
}

/** A leader's term: its lease, kept renewed, with proclaim, hand-off and resign. */
export class Leadership implements AsyncDisposable {
  private readonly controller = new AbortController();
  private valueNow: string;
  private reasonNow: StopReason | undefined;
  private settledBy: "resign" | "handoff" | "cancel" | undefined;
  private tellStopped!: (reason: StopReason) => void;
  /** Resolves once the leadership has ended and onStoppedLeading was told: why it ended. */
  readonly stopped: Promise<StopReason> = new Promise((resolve) => (this.tellStopped = resolve));

  /** @internal use Elector.campaign() */
  constructor(
    readonly elector: Elector,
    readonly kept: KeptLease,
    value: string,
    candidate: AbortSignal | undefined,
    private readonly opts: ElectorOptions,
  ) {
    this.valueNow = value;
    void kept.lost.then(() => this.end(kept.reason ?? "unknown"));
    if (candidate) {
      const cancelled = () => void this.cancel(candidate.reason);
      if (candidate.aborted) cancelled();
      else candidate.addEventListener("abort", cancelled, { once: true, signal: this.controller.signal });
    }
  }

  /** Aborted the moment the leadership may end: its reason is a LeaseLostError, a HandedOffError, or the campaign signal's. */
  get signal(): AbortSignal {
    return this.controller.signal;
  }
  get lease(): Lease {
    return this.kept.lease;
  }
  /** The leadership's fence, for the leader's guarded writes. */
  get fence(): bigint {
    return this.kept.fence;
  }
  /** The value it was elected with, or the one last proclaimed. */
  get value(): string {
    return this.valueNow;
  }
  /** Why it ended; undefined while it leads. */
  get reason(): StopReason | undefined {
    return this.reasonNow;
  }
  /** Whether it still leads, by its lease's local deadline. */
  get isLeader(): boolean {
    return this.reasonNow === undefined && this.kept.state === "held" && this.kept.remainingMs > 0;
  }
  /** The leader as observers see it. */
  get leader(): Leader {
    const l = this.kept.lease;
    return { fence: l.fence, owner: this.valueNow, acquiredAt: l.acquiredAt, expiresAt: l.expiresAt };
  }

  /** Ends it once: aborts its signal, tells onStoppedLeading, resolves `stopped`. */
  private end(reason: StopReason, why?: unknown): void {
    if (this.reasonNow !== undefined) return;
    this.reasonNow = reason;
    this.controller.abort(why ?? this.kept.signal.reason ?? new LeaseLostError(this.kept.key, "released"));
    try {
      this.opts.onStoppedLeading?.(this, reason);
    } finally {
      this.tellStopped(reason);
    }
  }

  private throwIfEnded(): void {
    if (this.reasonNow === undefined) return this.kept.throwIfLost();
    const reason =
      this.reasonNow === "handed_off" || this.reasonNow === "cancelled" ? "released" : this.reasonNow;
    throw new LeaseLostError(this.kept.key, reason);
  }

  /** The candidate's signal aborted while leading. */
  private async cancel(why: unknown): Promise<void> {
    if (this.reasonNow !== undefined) return;
    this.settledBy = "cancel";
    if (this.opts.releaseOnCancel ?? true) {
      await this.kept.release().catch(() => undefined);
      this.end(this.kept.state === "released" ? "released" : (this.kept.reason ?? "unknown"), why);
    } else {
      this.kept.abandon();
      this.end("cancelled", why);
    }
  }

  /**
   * Changes the value observers see, keeping the fence (fence.lease_proclaim). A LeaseLostError
   * with its reason when it no longer leads.
   */
  async proclaim(value: string): Promise<void> {
    this.throwIfEnded();
    const done = await this.elector.client.proclaim(this.kept.lease, value);
    if (!done) throw await this.lostNow();
    this.valueNow = value;
  }

  /**
   * Ends this leadership and hands the key, with a higher fence, to the candidate campaigning with
   * the value `to`, ahead of the others in line (fence.lease_handoff, for a rolling update): the new
   * leader, once onStoppedLeading was told (`handed_off`). null, changing nothing, when no such
   * candidate waits; a LeaseLostError when it no longer leads.
   */
  async handoff(to: string): Promise<Leader | null> {
    this.throwIfEnded();
    const lease = this.kept.lease;
    const next = await this.elector.client.handoff(lease, to);
    if (!next) {
      // No such candidate; or a retry after a hand-off whose answer was lost: then the lease ended
      // as released, and the leader is whoever leads now.
      const s = await this.elector.client.status(lease.key, lease.token);
      if (s.state !== "ended") return null;
      if (s.reason !== "released") throw await this.lostNow();
      const now = await this.elector.leader();
      if (!now) return null;
      this.handedOff(now);
      return now;
    }
    const leader: Leader = {
      fence: next.fence,
      owner: next.owner,
      acquiredAt: next.acquiredAt,
      expiresAt: next.expiresAt,
    };
    this.handedOff(leader);
    return leader;
  }

  private handedOff(to: Leader): void {
    this.settledBy = "handoff";
    this.kept.abandon("released");
    this.end("handed_off", new HandedOffError(this.kept.key, to));
  }

  /** The server said the lease is not held: lost, for the reason lease_status gives. */
  private async lostNow(): Promise<LeaseLostError> {
    await this.kept.release().catch(() => undefined);
    const reason = this.kept.reason ?? "unknown";
    this.end(reason);
    return new LeaseLostError(this.kept.key, reason);
  }

  /**
   * Releases the leadership, once onStoppedLeading was told: true when this release ended it
   * (`released`); false when it had ended already (`reason` says why it was told, `kept.reason`
   * what the release found).
   */
  async resign(): Promise<boolean> {
    if (this.settledBy === "handoff") return false;
    this.settledBy ??= "resign";
    const released = await this.kept.release();
    this.end(released ? "released" : (this.kept.reason ?? "unknown"));
    return released;
  }

  /** The kept lease's guard: refused before sending once it no longer leads, by the server (PF002) once another leads. */
  guard<T>(write: (tx: pg.PoolClient) => Promise<T>): Promise<T> {
    this.throwIfEnded();
    return this.kept.guard(write);
  }

  async [Symbol.asyncDispose](): Promise<void> {
    if (this.reasonNow === undefined) await this.resign().catch(() => undefined);
  }
}
