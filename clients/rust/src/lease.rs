//! The SQL API, one statement per call, on any client or transaction. These calls do not retry:
//! `FenceClient` and the keeper do, on top of them.
use crate::error::{classify, code, Error};
use crate::reason::{self, Ended};
use serde_json::Value;
use std::time::{Duration, SystemTime};
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{GenericClient, Row};
use uuid::Uuid;

/// A granted lease. `token` is the secret renew and release need; `fence` is what fenced writes
/// compare (opaque: compare it, do not compute with it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    pub key: String,
    pub owner: String,
    pub fence: i64,
    pub token: Uuid,
    pub acquired_at: SystemTime,
    pub expires_at: SystemTime,
    pub durable: bool,
    /// Granted as a shared lease (`AcquireOptions::shared`).
    pub shared: bool,
    /// The permits it was granted under (`AcquireOptions::permits`); 1 for an exclusive lease.
    pub permits: u32,
}

/// What `lease_acquire_all` granted: a lease per key, in key order, each with its own fence, all
/// sharing one token; renewed and released together (`renew_all`, `release_all`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseSet {
    pub leases: Vec<Lease>,
    pub token: Uuid,
}

impl LeaseSet {
    pub fn keys(&self) -> Vec<&str> {
        self.leases.iter().map(|lease| lease.key.as_str()).collect()
    }

    /// The fence of the set's lease on `key`; None for a key outside the set.
    pub fn fence(&self, key: &str) -> Option<i64> {
        self.leases.iter().find(|lease| lease.key == key).map(|lease| lease.fence)
    }

    /// The earliest expiry of the set's leases.
    pub fn expires_at(&self) -> SystemTime {
        self.leases.iter().map(|lease| lease.expires_at).min().expect("a set has a lease")
    }

    /// The set's keys, comma-separated, as `Error::LeaseLost` names a set.
    pub fn label(&self) -> String {
        self.keys().join(", ")
    }
}

/// What `lease_acquire` is asked for. `ttl` has no sensible default, so it is the one argument of
/// `new`; the rest are the server's defaults.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AcquireOptions {
    pub ttl: Duration,
    pub owner: Option<String>,
    pub wait: Duration,
    pub session_bound: bool,
    pub durable: bool,
    /// A shared lease: any number of shared leases of the key may be live at once, never beside
    /// an exclusive one (or a semaphore's). Not with `permits` above 1.
    pub shared: bool,
    /// At most this many live leases of the key at once (a counting semaphore), each with its own
    /// token and fence; 1, the default, is the exclusive lease. At least 1 (the server's bound
    /// above is 10000).
    pub permits: u32,
    /// The lease's token. Retrying callers must set it (FenceClient and `hold` do) so that a retry
    /// after a lost reply gets the lease that reply carried instead of finding the key held.
    pub token: Option<Uuid>,
    /// When this lease ends other than by a release or a hand-off (it expires, is revoked, or its
    /// session ends), nobody is granted the key until this long after that end (Consul's
    /// lock-delay; at most an hour). Zero, the default, for none.
    pub lock_delay: Duration,
}

impl AcquireOptions {
    pub fn new(ttl: Duration) -> Self {
        AcquireOptions {
            ttl,
            owner: None,
            wait: Duration::ZERO,
            session_bound: false,
            durable: true,
            shared: false,
            permits: 1,
            token: None,
            lock_delay: Duration::ZERO,
        }
    }

    pub fn owner(mut self, owner: impl Into<String>) -> Self {
        self.owner = Some(owner.into());
        self
    }

    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }

    pub fn session_bound(mut self, session_bound: bool) -> Self {
        self.session_bound = session_bound;
        self
    }

    pub fn durable(mut self, durable: bool) -> Self {
        self.durable = durable;
        self
    }

    pub fn shared(mut self, shared: bool) -> Self {
        self.shared = shared;
        self
    }

    pub fn permits(mut self, permits: u32) -> Self {
        self.permits = permits;
        self
    }

    pub fn token(mut self, token: Uuid) -> Self {
        self.token = Some(token);
        self
    }

    pub fn lock_delay(mut self, lock_delay: Duration) -> Self {
        self.lock_delay = lock_delay;
        self
    }

    /// `Error::Config` for options that cannot work together, before anything is sent: `permits`
    /// of 0, or `shared` with `permits` above 1.
    pub fn check(&self) -> Result<(), Error> {
        if self.permits == 0 {
            return Err(Error::Config("permits must be at least 1".into()));
        }
        if self.shared && self.permits > 1 {
            return Err(Error::Config(
                "a shared lease cannot have permits: shared or permits, not both".into(),
            ));
        }
        Ok(())
    }

    /// `check`, and what `lease_acquire_all` cannot take: it draws the set's token itself, and its
    /// leases are exclusive.
    pub(crate) fn check_for_set(&self) -> Result<(), Error> {
        self.check()?;
        if self.token.is_some() || self.shared || self.permits != 1 || !self.lock_delay.is_zero() {
            return Err(Error::Config("a lease set takes no token, shared, permits or lock_delay".into()));
        }
        Ok(())
    }

    /// These options with a token: the given one, or a fresh random one.
    pub fn with_token(&self) -> AcquireOptions {
        AcquireOptions { token: Some(self.token.unwrap_or_else(Uuid::new_v4)), ..self.clone() }
    }
}

const COLUMNS: &str = "SELECT key, owner, fence, token, acquired_at, expires_at FROM";

/// Grants `key` when it can (waiting up to `opts.wait`); None when it is held (or all its permits
/// are) or the wait ran out. The server answers a refusal with a row of NULLs, which is None here.
/// `Error::Config`, before anything is sent, for options `AcquireOptions::check` refuses.
pub async fn acquire(
    client: &impl GenericClient,
    key: &str,
    opts: &AcquireOptions,
) -> Result<Option<Lease>, Error> {
    opts.check()?;
    let token = opts.token.unwrap_or_else(Uuid::new_v4);
    let permits = i32::try_from(opts.permits).unwrap_or(i32::MAX);
    let (ttl, wait, lock_delay) =
        (opts.ttl.as_secs_f64(), opts.wait.as_secs_f64(), opts.lock_delay.as_secs_f64());
    let mut params: Vec<(&(dyn ToSql + Sync), Type)> = vec![
        (&key, Type::TEXT),
        (&ttl, Type::FLOAT8),
        (&opts.owner, Type::TEXT),
        (&wait, Type::FLOAT8),
        (&opts.session_bound, Type::BOOL),
        (&opts.durable, Type::BOOL),
        (&token, Type::UUID),
    ];
    // In the order acquire_sql names them.
    if opts.shared {
        params.push((&opts.shared, Type::BOOL));
    }
    if opts.permits != 1 {
        params.push((&permits, Type::INT4));
    }
    if !opts.lock_delay.is_zero() {
        params.push((&lock_delay, Type::FLOAT8));
    }
    let rows = client.query_typed(&acquire_sql(opts), &params).await.map_err(acquire_error)?;
    let Some(row) = rows.first() else { return Ok(None) };
    let Some(mut lease) = lease_of(row, opts)? else { return Ok(None) };
    (lease.shared, lease.permits) = (opts.shared, opts.permits);
    Ok(Some(lease))
}

/// lease_acquire's statement: `shared`, `permits` and `lock_delay` are passed by name, and only when
/// asked for, so that plain leases keep working on servers without them.
fn acquire_sql(opts: &AcquireOptions) -> String {
    let (mut modes, mut last) = (String::new(), 7);
    if opts.shared {
        last += 1;
        modes += &format!(", shared => ${last}");
    }
    if opts.permits != 1 {
        last += 1;
        modes += &format!(", permits => ${last}");
    }
    if !opts.lock_delay.is_zero() {
        last += 1;
        modes += &format!(", lock_delay => make_interval(secs => ${last})");
    }
    format!(
        "{COLUMNS} fence.lease_acquire($1, make_interval(secs => $2), $3, make_interval(secs => $4), $5, $6, $7{modes})"
    )
}

/// Grants every key of `keys`, or none (None when any of them is held and the wait ran out): one
/// lease per key, each with its own fence, sharing one token the server draws. With no token to send
/// again, a try whose reply was lost cannot be retried safely: `FenceClient::acquire_all` does not.
/// `Error::Config` before anything is sent when `opts` has a token, `shared` or `permits`.
pub async fn acquire_all<K: AsRef<str>>(
    client: &impl GenericClient,
    keys: &[K],
    opts: &AcquireOptions,
) -> Result<Option<LeaseSet>, Error> {
    opts.check_for_set()?;
    let keys: Vec<&str> = keys.iter().map(AsRef::as_ref).collect();
    let params: [(&(dyn ToSql + Sync), Type); 6] = [
        (&keys, Type::TEXT_ARRAY),
        (&opts.ttl.as_secs_f64(), Type::FLOAT8),
        (&opts.owner, Type::TEXT),
        (&opts.wait.as_secs_f64(), Type::FLOAT8),
        (&opts.session_bound, Type::BOOL),
        (&opts.durable, Type::BOOL),
    ];
    let sql = format!(
        "{COLUMNS} fence.lease_acquire_all($1, make_interval(secs => $2), $3, make_interval(secs => $4), $5, $6)"
    );
    let rows = client.query_typed(&sql, &params).await.map_err(acquire_error)?;
    let leases =
        rows.iter().filter_map(|row| lease_of(row, opts).transpose()).collect::<Result<Vec<_>, _>>()?;
    Ok(leases.first().map(|first| first.token).map(|token| LeaseSet { leases, token }))
}

fn acquire_error(err: tokio_postgres::Error) -> Error {
    match code(&err) {
        Some("57014" | "55P03") => Error::WaitCancelled(err),
        _ => classify(err),
    }
}

/// The lease of a `fence.lease` row; None for the row of NULLs of a refusal.
fn lease_of(row: &Row, opts: &AcquireOptions) -> Result<Option<Lease>, Error> {
    let Some(fence) = row.try_get::<_, Option<i64>>("fence").map_err(Error::Db)? else {
        return Ok(None);
    };
    Ok(Some(Lease {
        key: row.try_get("key").map_err(Error::Db)?,
        owner: row.try_get::<_, Option<String>>("owner").map_err(Error::Db)?.unwrap_or_default(),
        fence,
        token: row.try_get("token").map_err(Error::Db)?,
        acquired_at: row.try_get("acquired_at").map_err(Error::Db)?,
        expires_at: row.try_get("expires_at").map_err(Error::Db)?,
        durable: opts.durable,
        shared: false,
        permits: 1,
    }))
}

/// Extends the lease to now + `ttl` (by the server's clock) and returns the new expiry.
/// `Error::LeaseLost` when the token no longer holds the live lease.
pub async fn renew(client: &impl GenericClient, lease: &Lease, ttl: Duration) -> Result<SystemTime, Error> {
    let sql = "SELECT fence.lease_renew($1, $2, make_interval(secs => $3))";
    renew_by(client, sql, (&lease.key, Type::TEXT), &lease.token, ttl, &lease.key).await
}

/// Renews every lease of the set and returns the earliest new expiry; `Error::LeaseLost` (its `key`
/// the set's keys, comma-separated) when the token no longer holds one of them, and then none is
/// renewed.
pub async fn renew_all(
    client: &impl GenericClient,
    set: &LeaseSet,
    ttl: Duration,
) -> Result<SystemTime, Error> {
    let sql = "SELECT fence.lease_renew_all($1, $2, make_interval(secs => $3))";
    renew_by(client, sql, (&set.keys(), Type::TEXT_ARRAY), &set.token, ttl, &set.label()).await
}

async fn renew_by(
    client: &impl GenericClient,
    sql: &str,
    keys: (&(dyn ToSql + Sync), Type),
    token: &Uuid,
    ttl: Duration,
    label: &str,
) -> Result<SystemTime, Error> {
    let params: [(&(dyn ToSql + Sync), Type); 3] =
        [keys, (token, Type::UUID), (&ttl.as_secs_f64(), Type::FLOAT8)];
    let row = client.query_typed_one(sql, &params).await.map_err(|err| match code(&err) {
        Some("PF001") => Error::LeaseLost { key: label.to_owned(), reason: None },
        _ => classify(err),
    })?;
    row.try_get(0).map_err(Error::Db)
}

/// Renews many leases in one call and one commit (fence.lease_renew_many; the server takes at most
/// 64), each for `ttl`: for each lease, in the order given, its new expiry, or None when its token no
/// longer holds a live lease of its key (what `renew` says as `Error::LeaseLost`; `status` says why).
pub async fn renew_many(
    client: &impl GenericClient,
    leases: &[&Lease],
    ttl: Duration,
) -> Result<Vec<Option<SystemTime>>, Error> {
    let each: Vec<(&Lease, Duration)> = leases.iter().map(|lease| (*lease, ttl)).collect();
    renew_many_each(client, &each).await
}

/// `renew_many`, each lease for a TTL of its own.
pub(crate) async fn renew_many_each(
    client: &impl GenericClient,
    leases: &[(&Lease, Duration)],
) -> Result<Vec<Option<SystemTime>>, Error> {
    let keys: Vec<&str> = leases.iter().map(|(lease, _)| lease.key.as_str()).collect();
    let tokens: Vec<Uuid> = leases.iter().map(|(lease, _)| lease.token).collect();
    let ttls: Vec<f64> = leases.iter().map(|(_, ttl)| ttl.as_secs_f64()).collect();
    let params: [(&(dyn ToSql + Sync), Type); 3] =
        [(&keys, Type::TEXT_ARRAY), (&tokens, Type::UUID_ARRAY), (&ttls, Type::FLOAT8_ARRAY)];
    let sql = "SELECT r.expires_at FROM fence.lease_renew_many($1, $2, \
               ARRAY(SELECT make_interval(secs => s) FROM unnest($3::float8[]) WITH ORDINALITY AS t(s, n) ORDER BY n)) \
               WITH ORDINALITY AS r(key, token, expires_at, n) ORDER BY r.n";
    let rows = client.query_typed(sql, &params).await.map_err(classify)?;
    rows.iter().map(|row| row.try_get(0).map_err(Error::Db)).collect()
}

/// Grants the first key of `keys`, in order, that is free now (fence.lease_acquire_any: it never
/// waits, and skips a held key as SKIP LOCKED skips a locked row): an exclusive lease; None when
/// none is free. Sent again with the same token (`opts.token`), it returns the lease that token
/// holds. `Error::Config` before anything is sent for a wait, `shared`, `permits` or a lock delay.
pub async fn acquire_any<K: AsRef<str>>(
    client: &impl GenericClient,
    keys: &[K],
    opts: &AcquireOptions,
) -> Result<Option<Lease>, Error> {
    opts.check()?;
    if !opts.wait.is_zero() || opts.shared || opts.permits != 1 || !opts.lock_delay.is_zero() {
        return Err(Error::Config("acquire_any takes an exclusive lease and never waits".into()));
    }
    let keys: Vec<&str> = keys.iter().map(AsRef::as_ref).collect();
    let token = opts.token.unwrap_or_else(Uuid::new_v4);
    let ttl = opts.ttl.as_secs_f64();
    let params: [(&(dyn ToSql + Sync), Type); 6] = [
        (&keys, Type::TEXT_ARRAY),
        (&ttl, Type::FLOAT8),
        (&opts.owner, Type::TEXT),
        (&opts.session_bound, Type::BOOL),
        (&opts.durable, Type::BOOL),
        (&token, Type::UUID),
    ];
    let sql = format!("{COLUMNS} fence.lease_acquire_any($1, make_interval(secs => $2), $3, $4, $5, $6)");
    let rows = client.query_typed(&sql, &params).await.map_err(acquire_error)?;
    let Some(row) = rows.first() else { return Ok(None) };
    lease_of(row, opts)
}

/// Moves the live lease's expiry to `at`, by the server's clock (a renew whose ttl is `at` less the
/// server's now): the new expiry; None, changing nothing, when `at` has passed by the server's clock.
/// `Error::LeaseLost` when the token no longer holds the live lease.
pub async fn renew_to(
    client: &impl GenericClient,
    lease: &Lease,
    at: SystemTime,
) -> Result<Option<SystemTime>, Error> {
    let params: [(&(dyn ToSql + Sync), Type); 3] =
        [(&lease.key, Type::TEXT), (&lease.token, Type::UUID), (&at, Type::TIMESTAMPTZ)];
    let sql = "SELECT CASE WHEN $3 > clock_timestamp() \
               THEN fence.lease_renew($1, $2, $3 - clock_timestamp()) END";
    let row = client.query_typed_one(sql, &params).await.map_err(|err| match code(&err) {
        Some("PF001") => Error::LeaseLost { key: lease.key.clone(), reason: None },
        _ => classify(err),
    })?;
    row.try_get(0).map_err(Error::Db)
}

/// Ends the lease: true when this call ended it, false when the token held nothing (so a retry is
/// harmless and never touches a newer holder).
pub async fn release(client: &impl GenericClient, lease: &Lease) -> Result<bool, Error> {
    release_token(client, &lease.key, lease.token).await
}

/// `release` by the token alone: for a lease whose grant may have happened but was never seen.
pub(crate) async fn release_token(
    client: &impl GenericClient,
    key: &str,
    token: Uuid,
) -> Result<bool, Error> {
    let params: [(&(dyn ToSql + Sync), Type); 2] = [(&key, Type::TEXT), (&token, Type::UUID)];
    let row =
        client.query_typed_one("SELECT fence.lease_release($1, $2)", &params).await.map_err(classify)?;
    row.try_get(0).map_err(Error::Db)
}

/// Ends every lease of the set still held with its token; how many this call ended (0 when none
/// was held any more, so a retry is harmless).
pub async fn release_all(client: &impl GenericClient, set: &LeaseSet) -> Result<u32, Error> {
    let params: [(&(dyn ToSql + Sync), Type); 2] =
        [(&set.keys(), Type::TEXT_ARRAY), (&set.token, Type::UUID)];
    let row =
        client.query_typed_one("SELECT fence.lease_release_all($1, $2)", &params).await.map_err(classify)?;
    let ended: i32 = row.try_get(0).map_err(Error::Db)?;
    Ok(ended.max(0) as u32)
}

/// Whether a session-bound `lease` is bound to the session of `client` (false when it is bound to
/// another one, or its row is gone).
pub(crate) async fn bound_here(client: &impl GenericClient, lease: &Lease) -> Result<bool, Error> {
    let sql = "SELECT session_pid = pg_backend_pid() FROM fence.leases WHERE key = $1 AND fence = $2";
    let params: [(&(dyn ToSql + Sync), Type); 2] = [(&lease.key, Type::TEXT), (&lease.fence, Type::INT8)];
    let row = client.query_typed(sql, &params).await.map_err(classify)?;
    Ok(row.first().and_then(|row| row.get::<_, Option<bool>>(0)).unwrap_or(false))
}

/// `fence.lease_status` of a token: whether the lease it was granted on a key is live, and if not,
/// why it ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseStatus {
    /// `live` or `ended`.
    pub state: String,
    /// Why it ended, the server's word: `released`, `expired`, `revoked`, `taken_over`,
    /// `session_ended` or `unknown` (the row is gone, or the token never held the key); None while
    /// live. `HeldLease` turns it into a `LossReason` (`unknown` of a fast lease is `Restarted`).
    pub reason: Option<String>,
    /// The lease's fence and expiry; None when the server knows nothing of the token.
    pub fence: Option<i64>,
    pub expires_at: Option<SystemTime>,
    /// The key's current fence (`current_fence`).
    pub current_fence: Option<i64>,
}

impl LeaseStatus {
    pub fn is_live(&self) -> bool {
        self.state == "live"
    }
}

/// `fence.lease_status(key, token)`.
pub async fn status(client: &impl GenericClient, key: &str, token: Uuid) -> Result<LeaseStatus, Error> {
    let params: [(&(dyn ToSql + Sync), Type); 2] = [(&key, Type::TEXT), (&token, Type::UUID)];
    let sql = "SELECT state, reason, fence, expires_at, current_fence FROM fence.lease_status($1, $2)";
    let row = client.query_typed_one(sql, &params).await.map_err(classify)?;
    let get = |err| Error::Db(err);
    Ok(LeaseStatus {
        state: row.try_get(0).map_err(get)?,
        reason: row.try_get(1).map_err(get)?,
        fence: row.try_get(2).map_err(get)?,
        expires_at: row.try_get(3).map_err(get)?,
        current_fence: row.try_get(4).map_err(get)?,
    })
}

/// How the first of the leases `token` was granted on `keys` (in their order) ended, by
/// lease_status: one statement for a lease or a set; None when every one is live.
pub(crate) async fn ended(
    client: &impl GenericClient,
    keys: &[&str],
    token: Uuid,
    durable: bool,
) -> Result<Option<Ended>, Error> {
    let params: [(&(dyn ToSql + Sync), Type); 2] = [(&keys, Type::TEXT_ARRAY), (&token, Type::UUID)];
    let sql = "SELECT s.state, s.reason FROM unnest($1::text[]) WITH ORDINALITY AS k(key, n) \
               CROSS JOIN LATERAL fence.lease_status(k.key, $2) AS s ORDER BY k.n";
    let rows = client.query_typed(sql, &params).await.map_err(classify)?;
    let rows = rows
        .iter()
        .map(|row| Ok((row.try_get::<_, &str>(0)?, row.try_get::<_, Option<&str>>(1)?)))
        .collect::<Result<Vec<_>, tokio_postgres::Error>>()
        .map_err(Error::Db)?;
    Ok(reason::ended(rows, durable))
}

/// A key's leader as observers see it: the fence and owner of its live lease (for shared leases and
/// semaphores, the live one with the highest fence). Two leaders are equal when their fence and
/// owner are.
#[derive(Debug, Clone, Eq)]
pub struct Leader {
    pub fence: i64,
    /// The leader's value: the owner it was granted with, or last proclaimed.
    pub owner: String,
    pub acquired_at: SystemTime,
    pub expires_at: SystemTime,
}

impl PartialEq for Leader {
    fn eq(&self, other: &Leader) -> bool {
        (self.fence, &self.owner) == (other.fence, &other.owner)
    }
}

/// The leader of a row (fence, owner, .., acquired_at, expires_at); None for the row of NULLs.
fn leader_of(row: &Row) -> Result<Option<Leader>, Error> {
    let Some(fence) = row.try_get::<_, Option<i64>>("fence").map_err(Error::Db)? else {
        return Ok(None);
    };
    Ok(Some(Leader {
        fence,
        owner: row.try_get::<_, Option<String>>("owner").map_err(Error::Db)?.unwrap_or_default(),
        acquired_at: row.try_get("acquired_at").map_err(Error::Db)?,
        expires_at: row.try_get("expires_at").map_err(Error::Db)?,
    }))
}

/// `fence.await_change`: the key's leader (None: nobody leads) as soon as it differs from `seen`,
/// or when `timeout` runs out, unchanged. `seen` None with a timeout waits for a leader; a zero
/// timeout answers at once.
pub async fn await_change(
    client: &impl GenericClient,
    key: &str,
    seen: Option<&Leader>,
    timeout: Duration,
) -> Result<Option<Leader>, Error> {
    let (fence, owner) = (seen.map(|leader| leader.fence), seen.map(|leader| leader.owner.as_str()));
    let params: [(&(dyn ToSql + Sync), Type); 4] = [
        (&key, Type::TEXT),
        (&fence, Type::INT8),
        (&owner, Type::TEXT),
        (&timeout.as_secs_f64(), Type::FLOAT8),
    ];
    let sql = "SELECT fence, owner, live, acquired_at, expires_at \
               FROM fence.await_change($1, $2, $3, make_interval(secs => $4))";
    leader_of(&client.query_typed_one(sql, &params).await.map_err(classify)?)
}

/// `fence.lease_proclaim`: changes the owner (the leader's value) of the live lease, keeping its
/// fence; false when the token no longer holds it.
pub async fn proclaim(client: &impl GenericClient, lease: &Lease, owner: &str) -> Result<bool, Error> {
    let params: [(&(dyn ToSql + Sync), Type); 3] =
        [(&lease.key, Type::TEXT), (&lease.token, Type::UUID), (&owner, Type::TEXT)];
    let row = client.query_typed_one("SELECT fence.lease_proclaim($1, $2, $3)", &params).await;
    row.map_err(classify)?.try_get(0).map_err(Error::Db)
}

/// `fence.lease_handoff`: ends the lease and grants the key, with a higher fence, to a session
/// waiting for it whose owner is `to_owner`, ahead of the queue: that new leader. None, changing
/// nothing, when no such acquirer waits (or the token no longer holds the lease).
pub async fn handoff(
    client: &impl GenericClient,
    lease: &Lease,
    to_owner: &str,
) -> Result<Option<Leader>, Error> {
    let params: [(&(dyn ToSql + Sync), Type); 3] =
        [(&lease.key, Type::TEXT), (&lease.token, Type::UUID), (&to_owner, Type::TEXT)];
    let sql = "SELECT fence, owner, acquired_at, expires_at FROM fence.lease_handoff($1, $2, $3)";
    leader_of(&client.query_typed_one(sql, &params).await.map_err(classify)?)
}

/// The last fence granted for `key`; None if it was never granted (or its row was swept).
pub async fn current_fence(client: &impl GenericClient, key: &str) -> Result<Option<i64>, Error> {
    let row = client
        .query_typed_one("SELECT fence.current_fence($1)", &[(&key, Type::TEXT)])
        .await
        .map_err(classify)?;
    row.try_get(0).map_err(Error::Db)
}

fn stale(fence: i64) -> impl Fn(tokio_postgres::Error) -> Error {
    move |err| match code(&err) {
        Some("PF002") => Error::StaleFence { fence },
        _ => classify(err),
    }
}

/// Ok when `fence` is the key's live fence, else `Error::StaleFence`. Call it inside the
/// transaction that does the writes: the guard holds until that transaction ends.
pub async fn fence_guard(client: &impl GenericClient, key: &str, fence: i64) -> Result<(), Error> {
    let params: [(&(dyn ToSql + Sync), Type); 2] = [(&key, Type::TEXT), (&fence, Type::INT8)];
    client.query_typed_one("SELECT fence.fence_guard($1, $2)", &params).await.map_err(stale(fence))?;
    Ok(())
}

/// `UPDATE table SET changes WHERE filter` under the guard; the number of rows updated.
/// `changes` and `filter` are JSON objects of column to value.
pub async fn fenced_update(
    client: &impl GenericClient,
    key: &str,
    fence: i64,
    table: &str,
    changes: &Value,
    filter: &Value,
) -> Result<i64, Error> {
    let params: [(&(dyn ToSql + Sync), Type); 5] = [
        (&key, Type::TEXT),
        (&fence, Type::INT8),
        (&table, Type::TEXT),
        (changes, Type::JSONB),
        (filter, Type::JSONB),
    ];
    let sql = "SELECT fence.fenced_update($1, $2, $3::regclass, $4, $5)";
    let row = client.query_typed_one(sql, &params).await.map_err(stale(fence))?;
    row.try_get(0).map_err(Error::Db)
}

/// Updates the rows matching `filter` only if none holds a higher fence in `fence_column`, and
/// stamps them with `fence`; `Error::StaleFence` otherwise. No lease lookup: the rows are the fence.
pub async fn fenced_write(
    client: &impl GenericClient,
    table: &str,
    fence_column: &str,
    fence: i64,
    changes: &Value,
    filter: &Value,
) -> Result<i64, Error> {
    let params: [(&(dyn ToSql + Sync), Type); 5] = [
        (&table, Type::TEXT),
        (&fence_column, Type::TEXT),
        (&fence, Type::INT8),
        (changes, Type::JSONB),
        (filter, Type::JSONB),
    ];
    let sql = "SELECT fence.fenced_write($1::regclass, $2::name, $3, $4, $5)";
    let row = client.query_typed_one(sql, &params).await.map_err(stale(fence))?;
    row.try_get(0).map_err(Error::Db)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_are_sent_by_name_and_only_when_asked_for() {
        let opts = AcquireOptions::new(Duration::from_secs(30));
        let plain = acquire_sql(&opts);
        assert!(
            !plain.contains("shared") && !plain.contains("permits"),
            "a server without them fails: {plain}"
        );
        assert!(acquire_sql(&opts.clone().shared(true)).ends_with("$7, shared => $8)"));
        assert!(acquire_sql(&opts.clone().permits(4)).ends_with("$7, permits => $8)"));
        let delayed = acquire_sql(&opts.clone().permits(2).lock_delay(Duration::from_secs(2)));
        assert!(
            delayed.ends_with("$7, permits => $8, lock_delay => make_interval(secs => $9))"),
            "{delayed}"
        );
        assert!(!plain.contains("lock_delay"));
    }

    #[test]
    fn options_that_cannot_work_together_are_refused() {
        let opts = AcquireOptions::new(Duration::from_secs(30));
        assert!(opts.check().is_ok() && opts.clone().shared(true).check().is_ok());
        for bad in [opts.clone().shared(true).permits(2), opts.clone().permits(0)] {
            assert!(matches!(bad.check(), Err(Error::Config(_))), "{bad:?}");
        }
        for bad in [opts.clone().token(Uuid::new_v4()), opts.clone().shared(true), opts.clone().permits(2)] {
            assert!(matches!(bad.check_for_set(), Err(Error::Config(_))), "{bad:?}");
        }
    }
}
