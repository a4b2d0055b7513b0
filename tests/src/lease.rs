//! The lease calls of the client tests, typed: `acquire` (or `Acquire` for its optional arguments)
//! grants a `Lease`, which renews and releases itself.
//!
//! Every call goes as one unnamed statement with its parameter types given (query_typed): that
//! works on a direct connection, in a transaction, and through PgBouncer in transaction pooling
//! mode, where a named prepared statement would stay behind on one server connection. An optional
//! argument is passed only when it is set, so that the calls also work with the older versions of
//! the extension (tests/tests/upgrade.rs), which lack some of them.
use postgres::types::{ToSql, Type};
use postgres::GenericClient;
use uuid::Uuid;

/// A lease that fence.lease_acquire granted.
#[derive(Debug, Clone, PartialEq)]
pub struct Lease {
    pub key: String,
    pub owner: String,
    pub fence: i64,
    pub token: Uuid,
    /// Seconds since 1970 by the server's clock, to compare with its clock_timestamp().
    pub acquired_at: f64,
    pub expires_at: f64,
}

/// Acquires `key` for `ttl` (an interval, such as "1 minute") with the defaults of every other
/// argument: the lease, or None when the key is held. Panics on an error.
pub fn acquire(client: &mut impl GenericClient, key: &str, ttl: &str) -> Option<Lease> {
    Acquire::new(key, ttl).run(client)
}

/// A call of fence.lease_acquire with the optional arguments that are set.
#[derive(Debug, Clone, Copy)]
pub struct Acquire<'a> {
    key: &'a str,
    ttl: &'a str,
    owner: Option<&'a str>,
    wait: Option<&'a str>,
    session_bound: Option<bool>,
    durable: Option<bool>,
    token: Option<Uuid>,
    shared: Option<bool>,
    permits: Option<i32>,
    lock_delay: Option<&'a str>,
}

impl<'a> Acquire<'a> {
    pub fn new(key: &'a str, ttl: &'a str) -> Acquire<'a> {
        Acquire {
            key,
            ttl,
            owner: None,
            wait: None,
            session_bound: None,
            durable: None,
            token: None,
            shared: None,
            permits: None,
            lock_delay: None,
        }
    }

    /// A shared lease: beside other shared ones, never beside another mode.
    pub fn shared(self, shared: bool) -> Acquire<'a> {
        Acquire { shared: Some(shared), ..self }
    }

    /// One of at most `permits` live leases of the key (a semaphore).
    pub fn permits(self, permits: i32) -> Acquire<'a> {
        Acquire { permits: Some(permits), ..self }
    }

    /// How long an end other than a release keeps the key from every grant, an interval.
    pub fn lock_delay(self, lock_delay: &'a str) -> Acquire<'a> {
        Acquire { lock_delay: Some(lock_delay), ..self }
    }

    pub fn owner(self, owner: &'a str) -> Acquire<'a> {
        Acquire { owner: Some(owner), ..self }
    }

    /// How long to wait for a held key, an interval such as "30 seconds".
    pub fn wait(self, wait: &'a str) -> Acquire<'a> {
        Acquire { wait: Some(wait), ..self }
    }

    pub fn session_bound(self, session_bound: bool) -> Acquire<'a> {
        Acquire { session_bound: Some(session_bound), ..self }
    }

    pub fn durable(self, durable: bool) -> Acquire<'a> {
        Acquire { durable: Some(durable), ..self }
    }

    /// The caller's own token, which makes a retried acquire return the lease it granted.
    pub fn token(self, token: Uuid) -> Acquire<'a> {
        Acquire { token: Some(token), ..self }
    }

    /// The lease, or None when the key is held. Panics on an error.
    pub fn run(&self, client: &mut impl GenericClient) -> Option<Lease> {
        self.try_run(client).unwrap_or_else(|err| panic!("lease_acquire of {}: {err}", self.key))
    }

    /// The lease, None when the key is held, or the error the call failed with.
    pub fn try_run(&self, client: &mut impl GenericClient) -> Result<Option<Lease>, postgres::Error> {
        let mut arguments = vec!["$1".to_string(), "$2::text::interval".to_string()];
        let mut params: Vec<(&(dyn ToSql + Sync), Type)> =
            vec![(&self.key, Type::TEXT), (&self.ttl, Type::TEXT)];
        let optional: [(&str, &str, Option<&(dyn ToSql + Sync)>, Type); 8] = [
            ("owner", "", self.owner.as_ref().map(|v| v as _), Type::TEXT),
            ("wait", "::text::interval", self.wait.as_ref().map(|v| v as _), Type::TEXT),
            ("session_bound", "", self.session_bound.as_ref().map(|v| v as _), Type::BOOL),
            ("durable", "", self.durable.as_ref().map(|v| v as _), Type::BOOL),
            ("token", "", self.token.as_ref().map(|v| v as _), Type::UUID),
            ("shared", "", self.shared.as_ref().map(|v| v as _), Type::BOOL),
            ("permits", "", self.permits.as_ref().map(|v| v as _), Type::INT4),
            ("lock_delay", "::text::interval", self.lock_delay.as_ref().map(|v| v as _), Type::TEXT),
        ];
        for (name, cast, value, type_) in optional {
            if let Some(value) = value {
                arguments.push(format!("{name} => ${}{cast}", params.len() + 1));
                params.push((value, type_));
            }
        }
        let sql = format!(
            "SELECT key, owner, fence, token, extract(epoch FROM acquired_at)::float8,
                    extract(epoch FROM expires_at)::float8
               FROM fence.lease_acquire({})",
            arguments.join(", ")
        );
        let row = client.query_typed_one(&sql, &params)?;
        Ok(row.get::<_, Option<i64>>(2).map(|fence| Lease {
            key: row.get(0),
            owner: row.get(1),
            fence,
            token: row.get(3),
            acquired_at: row.get(4),
            expires_at: row.get(5),
        }))
    }
}

impl Lease {
    /// fence.lease_renew for `ttl`: the new expiry (seconds since 1970, server clock), or the error,
    /// PF001 when the lease is lost.
    pub fn renew(&self, client: &mut impl GenericClient, ttl: &str) -> Result<f64, postgres::Error> {
        let sql = "SELECT extract(epoch FROM fence.lease_renew($1, $2, $3::text::interval))::float8";
        let row = client.query_typed_one(
            sql,
            &[(&self.key, Type::TEXT), (&self.token, Type::UUID), (&ttl, Type::TEXT)],
        )?;
        Ok(row.get(0))
    }

    /// fence.lease_release: whether it ended the lease (false when it had ended already). Panics on
    /// an error.
    pub fn release(&self, client: &mut impl GenericClient) -> bool {
        self.try_release(client).unwrap_or_else(|err| panic!("lease_release of {}: {err}", self.key))
    }

    pub fn try_release(&self, client: &mut impl GenericClient) -> Result<bool, postgres::Error> {
        let sql = "SELECT fence.lease_release($1, $2)";
        Ok(client.query_typed_one(sql, &[(&self.key, Type::TEXT), (&self.token, Type::UUID)])?.get(0))
    }
}
