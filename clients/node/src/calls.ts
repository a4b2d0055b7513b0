import { randomUUID } from "node:crypto";
import pg from "pg";
import { InvalidOptionsError, NotInTransactionError, typed } from "./errors.js";

/** Where a call runs: a pool (each call on any connection), a client, or a pool's client inside the caller's transaction. */
export type Queryable = pg.Pool | pg.Client | pg.PoolClient;

/** A duration: milliseconds, or an object of parts, as `{ seconds: 30 }` or `{ minutes: 1, milliseconds: 500 }`. */
export type Duration = number | { hours?: number; minutes?: number; seconds?: number; milliseconds?: number };

/** The duration in milliseconds. */
export function millis(d: Duration): number {
  const ms =
    typeof d === "number"
      ? d
      : (d.hours ?? 0) * 3_600_000 +
        (d.minutes ?? 0) * 60_000 +
        (d.seconds ?? 0) * 1000 +
        (d.milliseconds ?? 0);
  if (!Number.isFinite(ms)) throw new InvalidOptionsError(`pg_fence: duration ${String(ms)} is not finite`);
  return ms;
}

/** The duration as an interval's text, to the microsecond. */
export function interval(d: Duration): string {
  return `${Math.round(millis(d) * 1000)} microseconds`;
}

export interface AcquireOptions {
  /** How long the lease lives unless renewed. */
  ttl: Duration;
  /** A label for humans (the session's application_name when absent). */
  owner?: string;
  /** How long to wait for the key when held (0, the default: refused at once). */
  wait?: Duration;
  /** Ends with the session that acquired it. */
  sessionBound?: boolean;
  /** Kept in unlogged state: no WAL flush, lost in a crash or a failover. */
  fast?: boolean;
  /** A shared lease: several holders at once, none exclusive. */
  shared?: boolean;
  /** A semaphore's permit: up to `permits` holders. */
  permits?: number;
  /** After this lease ends without a release, the key stays free of grants for this long. */
  lockDelay?: Duration;
  /** The lease's token (a uuid): a retry with the same one returns the lease it granted. Drawn when absent. */
  token?: string;
}

export interface Lease {
  readonly key: string;
  readonly owner: string;
  /** The fence: an opaque bigint, compared, never computed with. */
  readonly fence: bigint;
  /** The secret renew and release require. */
  readonly token: string;
  readonly acquiredAt: Date;
  readonly expiresAt: Date;
  readonly fast: boolean;
}

export interface LeaseStatus {
  /** "live" or "ended". */
  readonly state: string;
  readonly reason: string | null;
  /** 0n when the server knows nothing of the token. */
  readonly fence: bigint;
  readonly expiresAt: Date | null;
  readonly currentFence: bigint;
}

/** A key's state as an observer sees it: its live lease's fence and owner, or null for vacancy. */
export interface Leader {
  readonly fence: bigint;
  readonly owner: string;
  readonly acquiredAt: Date;
  readonly expiresAt: Date;
}

const leaseColumns = "SELECT key, owner, fence::text, token::text, acquired_at, expires_at FROM ";

function big(value: unknown): bigint {
  return value === null || value === undefined ? 0n : BigInt(value as string);
}

type Row = Record<string, unknown>;

async function query(q: Queryable, text: string, values: unknown[], key: string, fence = 0n): Promise<Row[]> {
  try {
    const result = await q.query(text, values);
    return result.rows as Row[];
  } catch (err) {
    throw typed(err, key, fence);
  }
}

function checked(opts: AcquireOptions): Required<Pick<AcquireOptions, "token">> & AcquireOptions {
  if (opts.permits !== undefined && (!Number.isInteger(opts.permits) || opts.permits < 1))
    throw new InvalidOptionsError(`pg_fence: permits ${opts.permits} is not a whole number above 0`);
  if (opts.shared && (opts.permits ?? 1) > 1)
    throw new InvalidOptionsError("pg_fence: a shared lease cannot have permits");
  return { ...opts, token: opts.token ?? randomUUID() };
}

function leaseOf(row: Row, fast: boolean): Lease | null {
  if (row.fence === null) return null;
  return {
    key: row.key as string,
    owner: (row.owner as string | null) ?? "",
    fence: big(row.fence),
    token: row.token as string,
    acquiredAt: row.acquired_at as Date,
    expiresAt: row.expires_at as Date,
    fast,
  };
}

/** The acquire's statement: the other clients' fence.lease_acquire, with its named options. */
function acquireStatement(key: string, opts: AcquireOptions & { token: string }): [string, unknown[]] {
  const values: unknown[] = [
    key,
    interval(opts.ttl),
    opts.owner || null,
    interval(opts.wait ?? 0),
    opts.sessionBound ?? false,
    !opts.fast,
    opts.token,
  ];
  let named = "";
  const add = (name: string, value: unknown, cast: string) => {
    values.push(value);
    named += `, ${name} => $${values.length}${cast}`;
  };
  if (opts.shared) add("shared", true, "");
  if ((opts.permits ?? 1) !== 1) add("permits", opts.permits, "::int");
  if (opts.lockDelay !== undefined && millis(opts.lockDelay) > 0)
    add("lock_delay", interval(opts.lockDelay), "::interval");
  return [
    `${leaseColumns}fence.lease_acquire($1, $2::interval, $3::text, $4::interval, $5, $6, $7::uuid${named})`,
    values,
  ];
}

/** Grants the key, or null when another live lease holds it (after `wait`, if any). */
export async function acquire(q: Queryable, key: string, opts: AcquireOptions): Promise<Lease | null> {
  const o = checked(opts);
  const [text, values] = acquireStatement(key, o);
  const rows = await query(q, text, values, key);
  return rows.length ? leaseOf(rows[0]!, !!o.fast) : null;
}

/** The first free key of `keys`, or null when all are held (no wait, exclusive). */
export async function acquireAny(
  q: Queryable,
  keys: readonly string[],
  opts: Omit<AcquireOptions, "wait" | "shared" | "permits" | "lockDelay">,
): Promise<Lease | null> {
  const o = checked(opts);
  const rows = await query(
    q,
    `${leaseColumns}fence.lease_acquire_any($1::text[], $2::interval, $3::text, $4, $5, $6::uuid)`,
    [keys, interval(o.ttl), o.owner || null, o.sessionBound ?? false, !o.fast, o.token],
    keys.join(", "),
  );
  return rows.length ? leaseOf(rows[0]!, !!o.fast) : null;
}

/** A lease set: one lease per key (in key order), each with its own fence, all sharing one token. */
export interface LeaseSet {
  readonly keys: readonly string[];
  readonly token: string;
  readonly leases: readonly Lease[];
}

/**
 * Grants every key of `keys`, or none (fence.lease_acquire_all): the set, or null when any is held
 * (after `wait`, if any, for all of them to be free at once). Up to 64 keys; no deadlock between sets.
 */
export async function acquireAll(
  q: Queryable,
  keys: readonly string[],
  opts: Omit<AcquireOptions, "shared" | "permits" | "lockDelay" | "token">,
): Promise<LeaseSet | null> {
  const rows = await query(
    q,
    `${leaseColumns}fence.lease_acquire_all($1::text[], $2::interval, $3::text, $4::interval, $5, $6)`,
    [
      keys,
      interval(opts.ttl),
      opts.owner || null,
      interval(opts.wait ?? 0),
      opts.sessionBound ?? false,
      !opts.fast,
    ],
    keys.join(", "),
  );
  if (rows.length === 0) return null;
  const leases = rows.map((row) => leaseOf(row, !!opts.fast)!);
  return { keys: leases.map((l) => l.key), token: leases[0]!.token, leases };
}

/** Renews every lease of the set, or none: the earliest new expiry; LeaseLostError (naming the first key lost, and why) otherwise. */
export async function renewAll(
  q: Queryable,
  set: Pick<LeaseSet, "keys" | "token">,
  ttl: Duration,
): Promise<Date> {
  const rows = await query(
    q,
    "SELECT fence.lease_renew_all($1::text[], $2::uuid, $3::interval) AS e",
    [set.keys, set.token, interval(ttl)],
    set.keys.join(", "),
  );
  return rows[0]!.e as Date;
}

/** Ends every lease of the set still held with its token: how many this call ended. */
export async function releaseAll(q: Queryable, set: Pick<LeaseSet, "keys" | "token">): Promise<number> {
  const rows = await query(
    q,
    "SELECT fence.lease_release_all($1::text[], $2::uuid) AS n",
    [set.keys, set.token],
    set.keys.join(", "),
  );
  return Number(rows[0]!.n);
}

/** Extends the lease by `ttl` from now: its new expiry; LeaseLostError when the token no longer holds it. */
export async function renew(q: Queryable, lease: Pick<Lease, "key" | "token">, ttl: Duration): Promise<Date> {
  const rows = await query(
    q,
    "SELECT fence.lease_renew($1, $2::uuid, $3::interval) AS e",
    [lease.key, lease.token, interval(ttl)],
    lease.key,
  );
  return rows[0]!.e as Date;
}

/** Ends the lease: true, or false when the token no longer held it. */
export async function release(q: Queryable, lease: Pick<Lease, "key" | "token">): Promise<boolean> {
  const rows = await query(
    q,
    "SELECT fence.lease_release($1, $2::uuid) AS r",
    [lease.key, lease.token],
    lease.key,
  );
  return rows[0]!.r as boolean;
}

/** What became of the lease the token holds or held. */
export async function status(q: Queryable, key: string, token: string): Promise<LeaseStatus> {
  const rows = await query(
    q,
    "SELECT state, reason, fence::text, expires_at, current_fence::text FROM fence.lease_status($1, $2::uuid)",
    [key, token],
    key,
  );
  const row = rows[0]!;
  return {
    state: row.state as string,
    reason: row.reason as string | null,
    fence: big(row.fence),
    expiresAt: row.expires_at as Date | null,
    currentFence: big(row.current_fence),
  };
}

/** The key's last fence, 0n when it was never granted. */
export async function currentFence(q: Queryable, key: string): Promise<bigint> {
  const rows = await query(q, "SELECT fence.current_fence($1)::text AS f", [key], key);
  return big(rows[0]!.f);
}

/** Ends the key's live lease (fence_admin): true when there was one. */
export async function revoke(q: Queryable, key: string): Promise<boolean> {
  const rows = await query(q, "SELECT fence.lease_revoke($1) AS r", [key], key);
  return rows[0]!.r as boolean;
}

/** Sets the advertised owner of the lease the token holds: false when it no longer holds it. */
export async function proclaim(
  q: Queryable,
  lease: Pick<Lease, "key" | "token">,
  owner: string,
): Promise<boolean> {
  const rows = await query(
    q,
    "SELECT fence.lease_proclaim($1, $2::uuid, $3) AS p",
    [lease.key, lease.token, owner],
    lease.key,
  );
  return rows[0]!.p as boolean;
}

/** Hands the key to a waiting acquirer whose owner is `toOwner`: the new lease (without its token), or null. */
export async function handoff(
  q: Queryable,
  lease: Pick<Lease, "key" | "token">,
  toOwner: string,
): Promise<Omit<Lease, "token" | "fast"> | null> {
  const rows = await query(
    q,
    "SELECT key, owner, fence::text, acquired_at, expires_at FROM fence.lease_handoff($1, $2::uuid, $3)",
    [lease.key, lease.token, toOwner],
    lease.key,
  );
  const row = rows[0];
  if (!row || row.fence === null) return null;
  return {
    key: row.key as string,
    owner: (row.owner as string | null) ?? "",
    fence: big(row.fence),
    acquiredAt: row.acquired_at as Date,
    expiresAt: row.expires_at as Date,
  };
}

/**
 * The key's state once it differs from `seen` (null: vacancy), or `seen` again after `timeout`.
 * Paced by the server (pg_fence.observe_interval): intermediate states may be skipped.
 */
export async function awaitChange(
  q: Queryable,
  key: string,
  seen: Pick<Leader, "fence" | "owner"> | null,
  timeout: Duration,
): Promise<Leader | null> {
  const rows = await query(
    q,
    "SELECT fence::text, owner, live, acquired_at, expires_at FROM fence.await_change($1, $2::bigint, $3::text, $4::interval)",
    [key, seen ? seen.fence.toString() : null, seen ? seen.owner : null, interval(timeout)],
    key,
  );
  const row = rows[0]!;
  if (!row.live) return null;
  return {
    fence: big(row.fence),
    owner: (row.owner as string | null) ?? "",
    acquiredAt: row.acquired_at as Date,
    expiresAt: row.expires_at as Date,
  };
}

function inTransaction(q: Queryable): boolean {
  if (q instanceof pg.Pool) return false;
  const status = (q as pg.Client).getTransactionStatus?.();
  return status === undefined || status === null ? true : status !== "I";
}

/**
 * Refuses (StaleFenceError) the rest of the caller's transaction unless `fence` is the key's live
 * one: call it inside the transaction that writes. Refused before sending on a pool or outside a
 * transaction block.
 */
export async function fenceGuard(q: Queryable, key: string, fence: bigint): Promise<void> {
  if (!inTransaction(q)) throw new NotInTransactionError();
  await query(q, "SELECT fence.fence_guard($1, $2::bigint)", [key, fence.toString()], key, fence);
}

/**
 * The guard as a fragment of the caller's own SQL, for its WHERE: `guardSql("$1", "$2")` is
 * `fence.fence_guard($1, $2::bigint)`, true or raising PF002.
 */
export function guardSql(key: string, fence: string): string {
  return `fence.fence_guard(${key}, ${fence}::bigint)`;
}

type Json = Record<string, unknown>;

function json(value: Json): string {
  return JSON.stringify(value, (_k, v: unknown) => (typeof v === "bigint" ? v.toString() : v));
}

/** Updates the rows of `table` that match `filter` with `changes`, under the key's live fence: how many. */
export async function fencedUpdate(
  q: Queryable,
  key: string,
  fence: bigint,
  table: string,
  changes: Json,
  filter: Json,
): Promise<bigint> {
  const rows = await query(
    q,
    "SELECT fence.fenced_update($1, $2::bigint, $3::text::regclass, $4::jsonb, $5::jsonb)::text AS n",
    [key, fence.toString(), table, json(changes), json(filter)],
    key,
    fence,
  );
  return big(rows[0]!.n);
}

/** Writes `changes` and `fence` into the matching rows unless their `fenceColumn` holds a higher fence: how many. */
export async function fencedWrite(
  q: Queryable,
  table: string,
  fenceColumn: string,
  fence: bigint,
  changes: Json,
  filter: Json,
): Promise<bigint> {
  const rows = await query(
    q,
    "SELECT fence.fenced_write($1::text::regclass, $2::text::name, $3::bigint, $4::jsonb, $5::jsonb)::text AS n",
    [table, fenceColumn, fence.toString(), json(changes), json(filter)],
    "",
    fence,
  );
  return big(rows[0]!.n);
}

/** Updates the one row matching `filter` if its version is `expected`: the new version; VersionConflictError otherwise. */
export async function versionedUpdate(
  q: Queryable,
  table: string,
  versionColumn: string,
  expected: bigint,
  changes: Json,
  filter: Json,
): Promise<bigint> {
  const rows = await query(
    q,
    "SELECT fence.versioned_update($1::text::regclass, $2::text::name, $3::bigint, $4::jsonb, $5::jsonb)::text AS v",
    [table, versionColumn, expected.toString(), json(changes), json(filter)],
    "",
  );
  return big(rows[0]!.v);
}
