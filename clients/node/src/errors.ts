import pg from "pg";

/** Why a lease was lost, as fence.lease_status and PF001's DETAIL name it. */
export type LossReason =
  | "expired"
  | "released"
  | "taken_over"
  | "revoked"
  | "session_ended"
  | "restarted"
  | "unreachable"
  | "unknown";

const reasons: readonly LossReason[] = [
  "expired",
  "released",
  "taken_over",
  "revoked",
  "session_ended",
  "restarted",
  "unreachable",
  "unknown",
];

/** The base of pg_fence's own errors: `code` is the SQLSTATE when the server said it. */
export class FenceError extends Error {
  readonly code: string | undefined;
  constructor(message: string, code?: string, cause?: unknown) {
    super(message, cause === undefined ? undefined : { cause });
    this.name = new.target.name;
    this.code = code;
  }
}

/** PF001: the token no longer holds the key's live lease; `reason` says why. */
export class LeaseLostError extends FenceError {
  constructor(
    readonly key: string,
    readonly reason: LossReason,
    cause?: unknown,
  ) {
    super(`pg_fence: lease on "${key}" lost: ${reason}`, "PF001", cause);
  }
}

/** PF002: a write under a fence that is not the key's live one (or lower than the row's). */
export class StaleFenceError extends FenceError {
  constructor(
    readonly key: string,
    readonly fence: bigint,
    cause?: unknown,
  ) {
    super(
      `pg_fence: stale fence ${fence}${key ? ` for "${key}"` : ""}: the write was refused`,
      "PF002",
      cause,
    );
  }
}

/** 40001: a versioned update found another version. */
export class VersionConflictError extends FenceError {
  constructor(cause?: unknown) {
    super("pg_fence: version conflict", "40001", cause);
  }
}

/** 57014 or 55P03: a waiting acquire was cancelled (or ran into a timeout); nothing was granted. */
export class WaitCancelledError extends FenceError {
  constructor(code: string, cause?: unknown) {
    super("pg_fence: waiting acquire cancelled", code, cause);
  }
}

/**
 * The call may have taken effect: its connection broke after it was sent. An acquire's carries
 * its `token`: acquire again with it (or release with it) to learn or undo the grant.
 */
export class OutcomeUnknownError extends FenceError {
  constructor(
    readonly token: string | undefined,
    cause: unknown,
  ) {
    super(
      `pg_fence: outcome unknown, the call may have taken effect: ${String((cause as Error)?.message ?? cause)}`,
      undefined,
      cause,
    );
  }
}

/** A call given up because no answer came within its bound (`boundMs`). */
export class BoundExceededError extends FenceError {
  constructor(readonly boundMs: number) {
    super(`pg_fence: no answer within ${boundMs} ms`);
  }
}

/**
 * An observer cannot see the key: no answer came by the expiry of the lease it saw (a silent
 * network, a server gone). Not a vacancy, nor the old leader: `last` is what it saw before.
 */
export class ObserverBlindError extends FenceError {
  constructor(
    readonly key: string,
    readonly last: { readonly fence: bigint; readonly owner: string } | null,
    cause?: unknown,
  ) {
    super(`pg_fence: the observer of "${key}" cannot see it`, undefined, cause);
  }
}

/** Options a call refuses before sending anything. */
export class InvalidOptionsError extends FenceError {}

/** fenceGuard on a pool or outside a transaction block, where it would protect nothing. */
export class NotInTransactionError extends FenceError {
  constructor() {
    super("pg_fence: a guard outside a transaction block protects nothing");
  }
}

/** The SQLSTATE of a server's error, or undefined. */
export function sqlstate(err: unknown): string | undefined {
  return err instanceof pg.DatabaseError ? err.code : undefined;
}

function reasonOf(err: unknown): LossReason {
  const detail = err instanceof pg.DatabaseError ? `${err.detail ?? ""} ${err.message}` : "";
  return reasons.find((r) => detail.includes(r)) ?? "unknown";
}

/** pg_fence's errors as their classes; anything else (bad input among them) as it came. */
export function typed(err: unknown, key: string, fence = 0n): unknown {
  switch (sqlstate(err)) {
    case "PF001":
      return new LeaseLostError(key, reasonOf(err), err);
    case "PF002":
      return new StaleFenceError(key, fence, err);
    case "40001":
      return new VersionConflictError(err);
    case "57014":
    case "55P03":
      return new WaitCancelledError(sqlstate(err)!, err);
  }
  return err;
}
