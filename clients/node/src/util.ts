import type pg from "pg";

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
