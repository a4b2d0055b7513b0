//! The SQL API, one statement per call, on any client or transaction. These calls do not retry:
//! `FenceClient` and the keeper do, on top of them.
use crate::error::{classify, code, Error};
use serde_json::Value;
use std::time::{Duration, SystemTime};
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::GenericClient;
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
    /// The lease's token. Retrying callers must set it (FenceClient and `hold` do) so that a retry
    /// after a lost reply gets the lease that reply carried instead of finding the key held.
    pub token: Option<Uuid>,
}

impl AcquireOptions {
    pub fn new(ttl: Duration) -> Self {
        AcquireOptions {
            ttl,
            owner: None,
            wait: Duration::ZERO,
            session_bound: false,
            durable: true,
            token: None,
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

    pub fn token(mut self, token: Uuid) -> Self {
        self.token = Some(token);
        self
    }

    /// These options with a token: the given one, or a fresh random one.
    pub fn with_token(&self) -> AcquireOptions {
        AcquireOptions { token: Some(self.token.unwrap_or_else(Uuid::new_v4)), ..self.clone() }
    }
}

const ACQUIRE: &str = "SELECT key, owner, fence, token, acquired_at, expires_at FROM fence.lease_acquire(
    $1, make_interval(secs => $2), $3, make_interval(secs => $4), $5, $6, $7)";

/// Grants `key` when it is free (waiting up to `opts.wait`); None when it is held or the wait ran
/// out. The server answers a refusal with a row of NULLs, which is None here.
pub async fn acquire(
    client: &impl GenericClient,
    key: &str,
    opts: &AcquireOptions,
) -> Result<Option<Lease>, Error> {
    let token = opts.token.unwrap_or_else(Uuid::new_v4);
    let params: [(&(dyn ToSql + Sync), Type); 7] = [
        (&key, Type::TEXT),
        (&opts.ttl.as_secs_f64(), Type::FLOAT8),
        (&opts.owner, Type::TEXT),
        (&opts.wait.as_secs_f64(), Type::FLOAT8),
        (&opts.session_bound, Type::BOOL),
        (&opts.durable, Type::BOOL),
        (&token, Type::UUID),
    ];
    let row = client.query_typed_one(ACQUIRE, &params).await.map_err(|err| match code(&err) {
        Some("57014" | "55P03") => Error::WaitCancelled(err),
        _ => classify(err),
    })?;
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
    }))
}

/// Extends the lease to now + `ttl` (by the server's clock) and returns the new expiry.
/// `Error::LeaseLost` when the token no longer holds the live lease.
pub async fn renew(client: &impl GenericClient, lease: &Lease, ttl: Duration) -> Result<SystemTime, Error> {
    let params: [(&(dyn ToSql + Sync), Type); 3] =
        [(&lease.key, Type::TEXT), (&lease.token, Type::UUID), (&ttl.as_secs_f64(), Type::FLOAT8)];
    let row = client
        .query_typed_one("SELECT fence.lease_renew($1, $2, make_interval(secs => $3))", &params)
        .await
        .map_err(|err| match code(&err) {
            Some("PF001") => Error::LeaseLost { key: lease.key.clone() },
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

/// Whether a session-bound `lease` is bound to the session of `client` (false when it is bound to
/// another one, or its row is gone).
pub(crate) async fn bound_here(client: &impl GenericClient, lease: &Lease) -> Result<bool, Error> {
    let sql = "SELECT session_pid = pg_backend_pid() FROM fence.leases WHERE key = $1 AND fence = $2";
    let params: [(&(dyn ToSql + Sync), Type); 2] = [(&lease.key, Type::TEXT), (&lease.fence, Type::INT8)];
    let row = client.query_typed(sql, &params).await.map_err(classify)?;
    Ok(row.first().and_then(|row| row.get::<_, Option<bool>>(0)).unwrap_or(false))
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
