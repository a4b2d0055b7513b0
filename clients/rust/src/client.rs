use crate::connect::Connector;
use crate::error::Error;
use crate::lease::{self, AcquireOptions, Leader, Lease, LeaseSet, LeaseStatus};
use crate::reason::Ended;
use crate::renewer::{GiveUp, KeeperStats, Renewer};
use crate::retry::Backoff;
use serde_json::Value;
use std::future::Future;
use std::sync::{Arc, Mutex as StdMutex, OnceLock};
use std::time::{Duration, Instant, SystemTime};
use tokio::sync::Mutex;
use uuid::Uuid;

/// The lease calls with retries: a broken connection is made again (with backoff) and the call
/// retried, which is safe for each of them: an acquire carries the token chosen before its first try,
/// so a retry after a lost reply gets the lease that reply granted; renew and release are safe as they
/// are. Fenced writes are not here: a write must be retried by the caller, who knows its transaction.
///
/// The client is also the keeper of the leases it holds (`hold`, `hold_first_free`, `hold_all`):
/// they are renewed together over `keeper_connections` connections of its own (see the README).
pub struct FenceClient<C: Connector> {
    connector: Arc<C>,
    backoff: Backoff,
    call_timeout: Duration,
    conn: Mutex<Option<Arc<C::Conn>>>,
    keeper_connections: usize,
    keeper: Arc<OnceLock<Arc<Renewer<C>>>>,
}

impl<C: Connector> FenceClient<C> {
    pub fn new(connector: C) -> Self {
        FenceClient::with_backoff(connector, Backoff::default())
    }

    pub fn with_backoff(connector: C, backoff: Backoff) -> Self {
        FenceClient::shared(Arc::new(connector), backoff)
    }

    /// A client of a connector others use too.
    pub(crate) fn shared(connector: Arc<C>, backoff: Backoff) -> Self {
        FenceClient {
            connector,
            backoff,
            call_timeout: Duration::from_secs(30),
            conn: Mutex::new(None),
            keeper_connections: 2,
            keeper: Arc::default(),
        }
    }

    /// How many connections the client's keeper keeps its leases over; 2 by default (at least 1).
    /// Set it before the first `hold`: the keeper starts with it.
    pub fn keeper_connections(mut self, connections: usize) -> Self {
        self.keeper_connections = connections.max(1);
        self
    }

    /// How the keeper has kept the client's leases so far: the connections it made, and the
    /// latency of its renewals.
    pub fn keeper_stats(&self) -> KeeperStats {
        self.keeper.get().map(|keeper| keeper.stats()).unwrap_or_default()
    }

    pub(crate) fn connector(&self) -> Arc<C> {
        self.connector.clone()
    }

    /// What bounds each try of a call.
    pub(crate) fn try_timeout(&self) -> Duration {
        self.call_timeout
    }

    /// The client's keeper, started at its first use.
    pub(crate) fn keeper(&self) -> Arc<Renewer<C>> {
        let start = || Renewer::start(self.connector.clone(), self.keeper_connections, self.backoff.clone());
        self.keeper.get_or_init(start).clone()
    }

    /// A client of the same connector and keeper, with a connection of its own: for a session-bound
    /// lease, which lives with the session that took it.
    pub(crate) fn sibling(&self) -> FenceClient<C> {
        FenceClient {
            connector: self.connector.clone(),
            backoff: self.backoff.clone(),
            call_timeout: self.call_timeout,
            conn: Mutex::new(None),
            keeper_connections: self.keeper_connections,
            keeper: self.keeper.clone(),
        }
    }

    /// Bounds each try of a call (beyond an acquire's `wait`); 30 s by default.
    pub fn call_timeout(mut self, timeout: Duration) -> Self {
        self.call_timeout = timeout;
        self
    }

    /// The connection the calls use, made now if there is none or it broke.
    pub async fn connection(&self) -> Result<Arc<C::Conn>, Error> {
        let mut conn = self.conn.lock().await;
        if let Some(live) = conn.as_ref().filter(|c| !c.is_closed()) {
            return Ok(live.clone());
        }
        *conn = None;
        let made = Arc::new(self.connector.connect().await.map_err(Error::Connect)?);
        *conn = Some(made.clone());
        Ok(made)
    }

    /// Each try is bounded by `call_timeout` plus `extra` (an acquire's wait): a server that hangs
    /// (stopped, or a dead route keepalives have not found yet) must not hang the caller.
    async fn retrying<T, F, Fut>(&self, extra: Duration, call: F) -> Result<T, Error>
    where
        F: Fn(Arc<C::Conn>) -> Fut,
        Fut: Future<Output = Result<T, Error>>,
    {
        self.retrying_if(extra, true, call).await
    }

    /// `retrying`; with `resend` false, a try that may have taken effect is not sent again: its
    /// outcome is unknown at once (for a call that cannot be retried safely, `lease_acquire_all`).
    async fn retrying_if<T, F, Fut>(&self, extra: Duration, resend: bool, call: F) -> Result<T, Error>
    where
        F: Fn(Arc<C::Conn>) -> Fut,
        Fut: Future<Output = Result<T, Error>>,
    {
        // The retries' time counts from the first failure, not from the call: an acquire that
        // waited its `wait` before the connection broke still has all of `max_elapsed` to retry.
        let mut failed_at = None;
        let mut tries = 0;
        // Once one try may have taken effect, running out of retries leaves the outcome unknown,
        // even if the later tries only failed to connect.
        let mut maybe_done = false;
        loop {
            let error = match self.connection().await {
                Ok(conn) => match tokio::time::timeout(self.call_timeout + extra, call(conn.clone())).await {
                    Ok(Err(err)) if err.is_retryable() => {
                        self.discard(&conn).await;
                        err
                    }
                    Ok(done) => return done,
                    Err(elapsed) => {
                        self.discard(&conn).await;
                        Error::OutcomeUnknown(Box::new(elapsed))
                    }
                },
                // A refused login ends the retries, but not the doubt an earlier try left.
                Err(err) if !err.is_retryable() => {
                    return Err(if maybe_done { Error::OutcomeUnknown(Box::new(err)) } else { err })
                }
                Err(err) => err,
            };
            let started = *failed_at.get_or_insert_with(Instant::now);
            maybe_done |= error.may_have_taken_effect();
            tries += 1;
            let next = if maybe_done && !resend { None } else { self.backoff.next(tries, started) };
            match next {
                Some(delay) => tokio::time::sleep(delay).await,
                None if maybe_done && !matches!(error, Error::OutcomeUnknown(_)) => {
                    return Err(Error::OutcomeUnknown(Box::new(error)))
                }
                None => return Err(error),
            }
        }
    }

    /// Forgets the current connection: it hung, and the next call must not wait on it again.
    pub(crate) async fn forget(&self) {
        *self.conn.lock().await = None;
    }

    /// Forgets `conn` if it is still the current one: it broke or hung, the next call reconnects.
    pub(crate) async fn discard(&self, conn: &Arc<C::Conn>) {
        let mut current = self.conn.lock().await;
        if current.as_ref().is_some_and(|c| Arc::ptr_eq(c, conn)) {
            *current = None;
        }
    }

    /// `lease::acquire`, retried. The token is chosen once (or taken from `opts`) for every try.
    /// A call given up once it may have been sent (its future dropped, a timeout around it) or
    /// ended with its outcome unknown has its token released by the client's keeper (on the
    /// keeper's connections, tried until the TTL), so that a grant whose reply never came does not
    /// hold the key until its TTL.
    pub async fn acquire(&self, key: &str, opts: &AcquireOptions) -> Result<Option<Lease>, Error> {
        opts.check()?;
        let opts = &opts.with_token();
        let give_up = self.give_up(&[key], opts);
        let granted =
            self.retrying(opts.wait, |conn| async move { lease::acquire(&**conn, key, opts).await }).await;
        Self::settled(give_up, granted)
    }

    /// Armed until the acquire with `opts`'s token on `keys` is settled: dropped armed, it releases
    /// the token.
    fn give_up<K: AsRef<str>>(&self, keys: &[K], opts: &AcquireOptions) -> GiveUp<C> {
        let keys = keys.iter().map(|key| key.as_ref().to_owned()).collect();
        GiveUp::arm(self.keeper(), keys, opts.token.expect("with_token gave it one"), opts.ttl)
    }

    /// `granted`, the give-up disarmed unless its outcome is unknown (then the token is released).
    fn settled<T>(give_up: GiveUp<C>, granted: Result<T, Error>) -> Result<T, Error> {
        match &granted {
            Err(err) if err.may_have_taken_effect() => drop(give_up),
            _ => give_up.disarm(),
        }
        granted
    }

    /// `lease::acquire_any`, retried: the first free key of `keys`, in one round trip; None when
    /// none is free. The token is chosen once (or taken from `opts`) for every try, so a retry after
    /// a lost reply gets the lease that reply granted.
    pub async fn acquire_any<K: AsRef<str> + Sync>(
        &self,
        keys: &[K],
        opts: &AcquireOptions,
    ) -> Result<Option<Lease>, Error> {
        let opts = &opts.with_token();
        let give_up = self.give_up(keys, opts);
        let granted = self
            .retrying(Duration::ZERO, |conn| async move { lease::acquire_any(&**conn, keys, opts).await })
            .await;
        Self::settled(give_up, granted)
    }

    /// `lease::acquire_all`, retried only while no try can have been granted (no connection, a
    /// standby, a server starting up): it takes no token, so a try whose reply was lost cannot be
    /// asked again for the set it may have granted. Such a try ends it with `OutcomeUnknown`; the set,
    /// if granted, stays held until its TTL.
    pub async fn acquire_all<K: AsRef<str> + Sync>(
        &self,
        keys: &[K],
        opts: &AcquireOptions,
    ) -> Result<Option<LeaseSet>, Error> {
        Ok(self.acquire_all_on(keys, opts).await?.map(|(set, _)| set))
    }

    /// `acquire_all`, with the connection that took the set (a session-bound set lives with it).
    pub(crate) async fn acquire_all_on<K: AsRef<str> + Sync>(
        &self,
        keys: &[K],
        opts: &AcquireOptions,
    ) -> Result<Option<(LeaseSet, Arc<C::Conn>)>, Error> {
        opts.check_for_set()?;
        self.retrying_if(opts.wait, false, |conn| async move {
            Ok(lease::acquire_all(&**conn, keys, opts).await?.map(|set| (set, conn)))
        })
        .await
    }

    /// `lease::acquire` of a session-bound lease, retried, with the connection it is bound to. The
    /// server returns the lease a token holds to whichever session asks, and a session-bound lease
    /// lives with the backend that took it: after a try whose outcome is unknown (its connection
    /// broke on this side only, or timed out, while its backend lives on), a retry with that token
    /// would get a lease bound to that orphaned backend, ending whenever it does. So each retry first
    /// releases the previous try's token, then asks with a fresh one, and the grant is checked to be
    /// bound to the session it came on.
    pub(crate) async fn acquire_session_bound(
        &self,
        key: &str,
        opts: &AcquireOptions,
    ) -> Result<Option<(Lease, Arc<C::Conn>)>, Error> {
        // The caller's token, for the first try; and the token of a try that may have been granted.
        let tokens = &StdMutex::new((opts.token, None::<Uuid>));
        self.retrying(opts.wait, |conn| async move {
            let unsure = tokens.lock().unwrap().1;
            if let Some(token) = unsure {
                lease::release_token(&**conn, key, token).await?;
            }
            let token = {
                let mut tokens = tokens.lock().unwrap();
                *tokens = (None, Some(tokens.0.unwrap_or_else(Uuid::new_v4)));
                tokens.1
            };
            let granted = lease::acquire(&**conn, key, &AcquireOptions { token, ..opts.clone() }).await?;
            if let Some(lease) = &granted {
                if !lease::bound_here(&**conn, lease).await? {
                    // The token was already another session's (a caller's token used twice): left
                    // unsure, so the next try releases it and takes a fresh one.
                    return Err(Error::OutcomeUnknown("granted to another session".into()));
                }
            }
            tokens.lock().unwrap().1 = None;
            Ok(granted.map(|lease| (lease, conn)))
        })
        .await
    }

    /// `lease::renew`, retried; `Error::LeaseLost` with the reason lease_status gives.
    pub async fn renew(&self, lease: &Lease, ttl: Duration) -> Result<SystemTime, Error> {
        let renewed = self
            .retrying(Duration::ZERO, |conn| async move { lease::renew(&**conn, lease, ttl).await })
            .await;
        self.explained(renewed, &[&lease.key], lease.token, lease.durable).await
    }

    pub async fn release(&self, lease: &Lease) -> Result<bool, Error> {
        self.retrying(Duration::ZERO, |conn| async move { lease::release(&**conn, lease).await }).await
    }

    /// `lease::renew_all`, retried; `Error::LeaseLost` with the reason lease_status gives.
    pub async fn renew_all(&self, set: &LeaseSet, ttl: Duration) -> Result<SystemTime, Error> {
        let renewed = self
            .retrying(Duration::ZERO, |conn| async move { lease::renew_all(&**conn, set, ttl).await })
            .await;
        self.explained(renewed, &set.keys(), set.token, set.leases[0].durable).await
    }

    /// `result`, its `LeaseLost` with the reason the server gives for the leases `token` was granted
    /// on `keys` (one statement, bounded by the call timeout; none when no answer came).
    async fn explained<T>(
        &self,
        result: Result<T, Error>,
        keys: &[&str],
        token: Uuid,
        durable: bool,
    ) -> Result<T, Error> {
        let Err(Error::LeaseLost { key, .. }) = result else { return result };
        let ask = async { lease::ended(&**self.connection().await?, keys, token, durable).await };
        let ended = tokio::time::timeout(self.call_timeout, ask).await.ok().and_then(Result::ok).flatten();
        Err(Error::LeaseLost { key, reason: ended.map(Ended::loss) })
    }

    /// How the server says the lease ended (lease_status); None while it is live.
    pub(crate) async fn ended(&self, lease: &Lease) -> Result<Option<Ended>, Error> {
        let keys = [lease.key.as_str()];
        self.retrying(Duration::ZERO, |conn| async move {
            lease::ended(&**conn, &keys, lease.token, lease.durable).await
        })
        .await
    }

    /// `lease::await_change`, retried; each try waits `timeout` at most (beyond the call timeout).
    pub async fn await_change(
        &self,
        key: &str,
        seen: Option<&Leader>,
        timeout: Duration,
    ) -> Result<Option<Leader>, Error> {
        self.retrying(timeout, |conn| async move { lease::await_change(&**conn, key, seen, timeout).await })
            .await
    }

    /// The key's leader now (None: nobody leads).
    pub async fn leader(&self, key: &str) -> Result<Option<Leader>, Error> {
        self.await_change(key, None, Duration::ZERO).await
    }

    /// `lease::proclaim`, retried (a proclaim done twice is done once).
    pub async fn proclaim(&self, lease: &Lease, owner: &str) -> Result<bool, Error> {
        self.retrying(Duration::ZERO, |conn| async move { lease::proclaim(&**conn, lease, owner).await })
            .await
    }

    /// `lease::handoff`, retried: a retry after a hand-off whose answer was lost finds the token
    /// holding nothing and returns None; `status` then says `released`.
    pub async fn handoff(&self, lease: &Lease, to_owner: &str) -> Result<Option<Leader>, Error> {
        self.retrying(Duration::ZERO, |conn| async move { lease::handoff(&**conn, lease, to_owner).await })
            .await
    }

    /// `lease::status`, retried.
    pub async fn status(&self, key: &str, token: Uuid) -> Result<LeaseStatus, Error> {
        self.retrying(Duration::ZERO, |conn| async move { lease::status(&**conn, key, token).await }).await
    }

    pub async fn release_all(&self, set: &LeaseSet) -> Result<u32, Error> {
        self.retrying(Duration::ZERO, |conn| async move { lease::release_all(&**conn, set).await }).await
    }

    pub async fn current_fence(&self, key: &str) -> Result<Option<i64>, Error> {
        self.retrying(Duration::ZERO, |conn| async move { lease::current_fence(&**conn, key).await }).await
    }

    /// `lease::fence_guard` on its own, retried (it changes nothing). To guard writes, call
    /// `lease::fence_guard` in their transaction instead.
    pub async fn fence_guard(&self, key: &str, fence: i64) -> Result<(), Error> {
        self.retrying(Duration::ZERO, |conn| async move { lease::fence_guard(&**conn, key, fence).await })
            .await
    }

    /// `lease::fenced_update`, not retried: after a broken connection its outcome is unknown, and
    /// only the caller can tell whether doing it twice is harmless.
    pub async fn fenced_update(
        &self,
        key: &str,
        fence: i64,
        table: &str,
        changes: &Value,
        filter: &Value,
    ) -> Result<i64, Error> {
        let conn = self.connection().await?;
        lease::fenced_update(&**conn, key, fence, table, changes, filter).await
    }
}
