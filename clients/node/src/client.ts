import { randomUUID } from "node:crypto";
import { setTimeout as sleep } from "node:timers/promises";
import pg from "pg";
import * as calls from "./calls.js";
import type { AcquireOptions, Duration, Lease, LeaseSet, LeaseStatus, Leader } from "./calls.js";
import { holdAll, type HoldSetOptions, type KeptLeaseSet } from "./sets.js";
import { BoundExceededError, OutcomeUnknownError, sqlstate } from "./errors.js";
import { anySignal, cut, pidOf, raced, unrefTimeout } from "./util.js";
import { giveUp, hold, keeperOf, type HoldOptions, type Keeper, type KeptLease } from "./keeper.js";

/** Full-jitter exponential backoff: the nth retry sleeps a random time up to min(cap, base·2ⁿ). */
export interface Backoff {
  /** The first retry's ceiling, 50 ms by default. */
  baseMs?: number;
  /** The largest ceiling, 2 s by default. */
  capMs?: number;
  /** Attempts in all, unbounded (but for maxElapsedMs) by default. */
  maxAttempts?: number;
  /**
   * No retry starts after this long since the call's first failure, 30 s by default (plus an
   * acquire's wait, which a retry waits again). Counted from the failure, not from the call: an
   * acquire that waited on the server longer than this still gets its retries when its connection
   * then breaks.
   */
  maxElapsedMs?: number;
}

/** Whether a failure is the connection's or the server's going away, worth a retry on another connection. */
export function retryable(err: unknown): boolean {
  const code = sqlstate(err);
  if (code === undefined) return !(err instanceof Error && err.name === "AbortError");
  return code.startsWith("08") || code.startsWith("57P0") || code === "53300";
}

/** Whether a failure may have come after the server received the call (not a refused connection). */
function mayHaveTakenEffect(err: unknown, sent: boolean): boolean {
  if (!sent) return false;
  const code = sqlstate(err);
  return code === undefined || code.startsWith("57P0");
}

export interface ClientOptions {
  backoff?: Backoff;
}

/**
 * pg_fence's calls over a pg.Pool, each retried on a broken connection with full jitter. A retried
 * acquire resends its token, so a grant whose reply was lost is returned, not refused; when no
 * retry succeeds after one may have taken effect, OutcomeUnknownError carries that token.
 */
export class FenceClient {
  readonly pool: pg.Pool;
  readonly backoff: Required<Backoff>;

  constructor(pool: pg.Pool, opts: ClientOptions = {}) {
    this.pool = pool;
    // An idle connection's break is the pool's 'error' event, fatal unless heard: the next call's
    // retry deals with it.
    if (pool.listenerCount("error") === 0) pool.on("error", () => undefined);
    this.backoff = {
      baseMs: opts.backoff?.baseMs ?? 50,
      capMs: opts.backoff?.capMs ?? 2000,
      maxAttempts: opts.backoff?.maxAttempts ?? Infinity,
      maxElapsedMs: opts.backoff?.maxElapsedMs ?? 30_000,
    };
  }

  /** The delay before retry n (0-based): uniform in [0, min(cap, base·2ⁿ)]. */
  delay(retry: number): number {
    const ceiling = Math.min(this.backoff.capMs, this.backoff.baseMs * 2 ** Math.min(retry, 30));
    return Math.random() * ceiling;
  }

  /**
   * @internal Runs `call` on a connection of the pool, retried on a broken one. Given up when
   * `signal` aborts (its reason is thrown) or, with `boundMs`, when no answer came that long after
   * the start (BoundExceededError): the connection is cut, and `onGiveUp` is told its backend's pid.
   */
  async retrying<T>(
    call: (q: pg.PoolClient) => Promise<T>,
    opts: {
      token?: string;
      extraMs?: number;
      signal?: AbortSignal;
      boundMs?: number;
      onGiveUp?: (pid: number | undefined) => void;
    } = {},
  ): Promise<T> {
    let failedAt: number | undefined;
    const stop = new AbortController();
    const follow = () => stop.abort(opts.signal!.reason);
    if (opts.signal?.aborted) follow();
    else opts.signal?.addEventListener("abort", follow, { once: true });
    const bound =
      opts.boundMs === undefined
        ? undefined
        : unrefTimeout(() => stop.abort(new BoundExceededError(opts.boundMs!)), opts.boundMs);
    let uncertain: unknown;
    try {
      for (let attempt = 0; ; attempt++) {
        stop.signal.throwIfAborted();
        let sent = false;
        let err: unknown;
        try {
          const pending = this.pool.connect();
          let conn: pg.PoolClient;
          try {
            conn = await raced(pending, stop.signal);
          } catch (e) {
            if (stop.signal.aborted)
              pending.then(
                (c) => c.release(true),
                () => undefined,
              );
            throw e;
          }
          sent = true;
          // A connection that breaks under a call also emits 'error', fatal unless heard: the
          // call's own rejection tells it.
          const heard = () => undefined;
          conn.on("error", heard);
          try {
            const answer = call(conn);
            answer.catch(() => undefined);
            const result = await raced(answer, stop.signal);
            conn.release();
            return result;
          } catch (e) {
            if (stop.signal.aborted) {
              opts.onGiveUp?.(pidOf(conn));
              cut(conn);
              conn.release(true);
            } else {
              // A broken connection goes, a healthy one (the server's refusal) back to the pool.
              conn.release(retryable(e) ? (e as Error) : undefined);
            }
            throw e;
          } finally {
            conn.off("error", heard);
          }
        } catch (e) {
          err = e;
        }
        if (stop.signal.aborted) throw stop.signal.reason;
        if (!retryable(err)) {
          // A retry's refusal after an attempt that may have taken effect: the outcome is unknown.
          throw err;
        }
        if (mayHaveTakenEffect(err, sent)) uncertain = err;
        failedAt ??= performance.now();
        const elapsed = performance.now() - failedAt;
        if (
          attempt + 1 >= this.backoff.maxAttempts ||
          elapsed >= this.backoff.maxElapsedMs + (opts.extraMs ?? 0)
        ) {
          throw uncertain === undefined ? err : new OutcomeUnknownError(opts.token, err);
        }
        await sleep(this.delay(attempt), undefined, { signal: stop.signal }).catch(() => undefined);
      }
    } finally {
      clearTimeout(bound);
      opts.signal?.removeEventListener("abort", follow);
    }
  }

  /** The pool's keeper (started on first use): kept leases, leaderships, and the releases of calls given up. */
  get keeper(): Keeper {
    return keeperOf(this.pool);
  }

  /**
   * fence.lease_acquire, retried with its token: the lease, or null when refused. Given up when
   * `signal` aborts or after `timeout` (rejected with the signal's reason, a TimeoutError for the
   * timeout): its wait is cancelled on the server, its connection cut, and the token it sent is
   * released on the keeper's connections, so that a grant whose reply never came is not left to
   * run out its ttl.
   */
  acquire(
    key: string,
    opts: AcquireOptions & { signal?: AbortSignal; timeout?: Duration },
  ): Promise<Lease | null> {
    const { signal, timeout, ...rest } = opts;
    const o = { ...rest, token: rest.token ?? randomUUID() };
    const given =
      timeout === undefined ? signal : anySignal(signal, AbortSignal.timeout(calls.millis(timeout)));
    let gaveUp = false;
    return this.retrying((q) => calls.acquire(q, key, o), {
      token: o.token,
      extraMs: calls.millis(o.wait ?? 0),
      signal: given,
      onGiveUp: (pid) => {
        gaveUp = true;
        void giveUp(this.keeper, pid, key, o.token);
      },
    }).catch((err: unknown) => {
      // Given up between attempts, after one that may have been granted: its token is released too.
      if (given?.aborted && !gaveUp) void giveUp(this.keeper, undefined, key, o.token);
      throw err;
    });
  }

  /** fence.lease_acquire_any, retried with its token. */
  acquireAny(
    keys: readonly string[],
    opts: Omit<AcquireOptions, "wait" | "shared" | "permits" | "lockDelay">,
  ): Promise<Lease | null> {
    const o = { ...opts, token: opts.token ?? randomUUID() };
    return this.retrying((q) => calls.acquireAny(q, keys, o), { token: o.token });
  }

  /** fence.lease_acquire_all, retried while nothing was sent: the set, or null when any key is held. */
  acquireAll(
    keys: readonly string[],
    opts: Omit<AcquireOptions, "shared" | "permits" | "lockDelay" | "token"> & { signal?: AbortSignal },
  ): Promise<LeaseSet | null> {
    const { signal, ...o } = opts;
    return this.retrying((q) => calls.acquireAll(q, keys, o), { extraMs: calls.millis(o.wait ?? 0), signal });
  }

  renewAll(set: Pick<LeaseSet, "keys" | "token">, ttl: Duration): Promise<Date> {
    return this.retrying((q) => calls.renewAll(q, set, ttl));
  }

  releaseAll(set: Pick<LeaseSet, "keys" | "token">): Promise<number> {
    return this.retrying((q) => calls.releaseAll(q, set));
  }

  /** A lease set kept renewed whole by the pool's keeper (see KeptLeaseSet), or null when any key is held. */
  holdAll(keys: readonly string[], opts: HoldSetOptions): Promise<KeptLeaseSet | null> {
    return holdAll(this.pool, keys, opts);
  }

  renew(lease: Pick<Lease, "key" | "token">, ttl: Duration): Promise<Date> {
    return this.retrying((q) => calls.renew(q, lease, ttl));
  }

  release(lease: Pick<Lease, "key" | "token">): Promise<boolean> {
    return this.retrying((q) => calls.release(q, lease));
  }

  status(key: string, token: string): Promise<LeaseStatus> {
    return this.retrying((q) => calls.status(q, key, token));
  }

  currentFence(key: string): Promise<bigint> {
    return this.retrying((q) => calls.currentFence(q, key));
  }

  proclaim(lease: Pick<Lease, "key" | "token">, owner: string): Promise<boolean> {
    return this.retrying((q) => calls.proclaim(q, lease, owner));
  }

  /** fence.await_change, retried; given up (its connection cut) when `signal` aborts. */
  awaitChange(
    key: string,
    seen: Pick<Leader, "fence" | "owner"> | null,
    timeout: Duration,
    opts: { signal?: AbortSignal; boundMs?: number } = {},
  ): Promise<Leader | null> {
    return this.retrying((q) => calls.awaitChange(q, key, seen, timeout), {
      extraMs: calls.millis(timeout),
      ...opts,
    });
  }

  handoff(lease: Pick<Lease, "key" | "token">, toOwner: string): ReturnType<typeof calls.handoff> {
    return this.retrying((q) => calls.handoff(q, lease, toOwner));
  }

  /**
   * A lease kept renewed (see KeptLease), or null when refused. Its acquire is retried as
   * acquire() is, with its token (but a session-bound one's, on a connection of its own).
   */
  hold(key: string, opts: HoldOptions): Promise<KeptLease | null> {
    return hold(this.pool, key, opts, (o) => this.acquire(key, o));
  }
}
