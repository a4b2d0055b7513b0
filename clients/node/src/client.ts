import { randomUUID } from "node:crypto";
import { setTimeout as sleep } from "node:timers/promises";
import pg from "pg";
import * as calls from "./calls.js";
import type { AcquireOptions, Duration, Lease, LeaseStatus, Leader } from "./calls.js";
import { OutcomeUnknownError, sqlstate } from "./errors.js";
import { hold, type HoldOptions, type KeptLease } from "./keeper.js";

/** Full-jitter exponential backoff: the nth retry sleeps a random time up to min(cap, base·2ⁿ). */
export interface Backoff {
  /** The first retry's ceiling, 50 ms by default. */
  baseMs?: number;
  /** The largest ceiling, 2 s by default. */
  capMs?: number;
  /** Attempts in all, unbounded (but for maxElapsedMs) by default. */
  maxAttempts?: number;
  /** No retry starts after this long, 30 s by default (plus an acquire's wait). */
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

  private async retrying<T>(
    call: (q: pg.PoolClient) => Promise<T>,
    opts: { token?: string; extraMs?: number; signal?: AbortSignal } = {},
  ): Promise<T> {
    const start = performance.now();
    let uncertain: unknown;
    for (let attempt = 0; ; attempt++) {
      opts.signal?.throwIfAborted();
      let sent = false;
      let err: unknown;
      try {
        const conn = await this.pool.connect();
        sent = true;
        // A connection that breaks under a call also emits 'error', fatal unless heard: the
        // call's own rejection tells it.
        const heard = () => undefined;
        conn.on("error", heard);
        try {
          const result = await call(conn);
          conn.release();
          return result;
        } catch (e) {
          // A broken connection goes, a healthy one (the server's refusal) back to the pool.
          conn.release(retryable(e) ? (e as Error) : undefined);
          throw e;
        } finally {
          conn.off("error", heard);
        }
      } catch (e) {
        err = e;
      }
      if (!retryable(err)) {
        // A retry's refusal after an attempt that may have taken effect: the outcome is unknown.
        throw err;
      }
      if (mayHaveTakenEffect(err, sent)) uncertain = err;
      const elapsed = performance.now() - start;
      if (
        attempt + 1 >= this.backoff.maxAttempts ||
        elapsed >= this.backoff.maxElapsedMs + (opts.extraMs ?? 0)
      ) {
        throw uncertain === undefined ? err : new OutcomeUnknownError(opts.token, err);
      }
      await sleep(this.delay(attempt), undefined, { signal: opts.signal });
    }
  }

  /** fence.lease_acquire, retried with its token: the lease, or null when refused. */
  acquire(key: string, opts: AcquireOptions & { signal?: AbortSignal }): Promise<Lease | null> {
    const o = { ...opts, token: opts.token ?? randomUUID() };
    return this.retrying((q) => calls.acquire(q, key, o), {
      token: o.token,
      extraMs: calls.millis(o.wait ?? 0),
      signal: opts.signal,
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

  awaitChange(
    key: string,
    seen: Pick<Leader, "fence" | "owner"> | null,
    timeout: Duration,
  ): Promise<Leader | null> {
    return this.retrying((q) => calls.awaitChange(q, key, seen, timeout), { extraMs: calls.millis(timeout) });
  }

  /** A lease kept renewed on a connection of its own (see KeptLease), or null when refused. */
  hold(key: string, opts: HoldOptions): Promise<KeptLease | null> {
    return hold(this.pool, key, opts);
  }
}
