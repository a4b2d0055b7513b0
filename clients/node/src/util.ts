import type pg from "pg";
import { millis, type Duration } from "./calls.js";

/** @internal A timer that keeps no finished process alive. */
export function unrefTimeout(fn: () => void, ms: number): NodeJS.Timeout {
  const t = setTimeout(fn, Math.max(0, ms));
  t.unref();
  return t;
}

/** @internal `p`, or the signal's reason once it aborts first. */
export function raced<T>(p: Promise<T>, signal: AbortSignal): Promise<T> {
  if (signal.aborted) return Promise.reject(signal.reason as Error);
  return new Promise<T>((resolve, reject) => {
    const onAbort = () => reject(signal.reason as Error);
    signal.addEventListener("abort", onAbort, { once: true });
    p.then(
      (v) => {
        signal.removeEventListener("abort", onAbort);
        resolve(v);
      },
      (e: unknown) => {
        signal.removeEventListener("abort", onAbort);
        reject(e as Error);
      },
    );
  });
}

/** @internal A signal aborted when any of `signals` is (AbortSignal.any, for Node 18). */
export function anySignal(...signals: (AbortSignal | undefined)[]): AbortSignal {
  const controller = new AbortController();
  for (const s of signals) {
    if (!s) continue;
    if (s.aborted) {
      controller.abort(s.reason);
      break;
    }
    s.addEventListener("abort", () => controller.abort(s.reason), { once: true, signal: controller.signal });
  }
  return controller.signal;
}

/** @internal The backend's pid of a connection. */
export function pidOf(conn: pg.ClientBase): number | undefined {
  return (conn as unknown as { processID?: number }).processID ?? undefined;
}

/** @internal Cuts a connection's socket (a hung one never finishes its end). */
export function cut(conn: pg.ClientBase): void {
  (conn as unknown as { connection?: { stream?: { destroy(): void } } }).connection?.stream?.destroy();
}

/**
 * The instant a kept lease's (or set's) local deadline counts from: the acquire's send, or, for a
 * grant that came so long after it (a wait) that less than a renewal period of the TTL is left
 * counted from there, the send of a renewal made now, before the grant is handed over, with the
 * expiry it answered. The server starts a waited grant's TTL when it grants, which the client
 * cannot see: counted from the acquire's send, a wait longer than the TTL would leave a deadline
 * already past, the grant told unreachable at once while it is the caller's. A grant with more
 * left is handed over as it is, its first renewal due at once, with the keeper's others (a
 * renewal each, as 200 holds at once make, would queue on the keeper's few connections past
 * their TTL). A renewal that fails gives the grant back (nothing is left granted that the caller
 * cannot use) and throws.
 */
export async function renewedIfWaited(
  opts: { ttl: Duration; renewEvery?: Duration },
  sent: number,
  how: { renew: () => Promise<Date>; giveBack: () => Promise<unknown> },
): Promise<{ sent: number; expiresAt?: Date }> {
  const ttlMs = millis(opts.ttl);
  const everyMs = opts.renewEvery === undefined ? ttlMs / 3 : millis(opts.renewEvery);
  if (performance.now() - sent < ttlMs - everyMs) return { sent };
  const renewedAt = performance.now();
  try {
    return { sent: renewedAt, expiresAt: await how.renew() };
  } catch (err) {
    await how.giveBack().catch(() => undefined);
    throw err;
  }
}
