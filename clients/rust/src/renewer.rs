//! The keeper a `FenceClient` shares among the leases it keeps (`FenceClient::hold`): a few
//! connections of its own (`keeper_connections`, 2 by default), made from the client's connector
//! with the application_name `<name>_keeper`, opened when first needed and reused, never the
//! connection the caller's calls go on. Each kept lease keeps its own task, deadline and told loss;
//! what it hands here is its renewal. Renewals wait in one queue; whenever a connection is free, a
//! sender takes every waiting renewal (up to 64) and sends them in one `fence.lease_renew_many`
//! call, bounded by the earliest limit among them: a call that does not answer in time drops its
//! connection (a new one is made for the next call), and each lease retries as it always did.
//! Releases, lease_status questions and the renewals of kept sets (`lease_renew_all`) go on the
//! same connections, one call at a time.
use crate::clock::Stamp;
use crate::connect::Connector;
use crate::error::{classify, Error};
use crate::lease::{self, Lease};
use crate::retry::Backoff;
use std::collections::VecDeque;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime};
use tokio::sync::{oneshot, Notify, OwnedSemaphorePermit, Semaphore};
use tokio::time::{sleep, timeout_at};
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::Client;

/// The most renewals one `lease_renew_many` call takes (the server's bound).
const BATCH: usize = 64;

/// How many renewal latencies the keeper remembers for `KeeperStats`.
const SAMPLES: usize = 20_000;

/// Renewals fall due on this grid, so that leases renewed at nearly the same time are sent together.
pub(crate) const GRID: Duration = Duration::from_millis(25);

/// How a client's keeper has kept its leases so far (`FenceClient::keeper_stats`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeeperStats {
    /// Connections the keeper has made since it started (one per keeper connection, unless one
    /// hung or broke and was made again).
    pub connections_made: usize,
    /// How many lease renewals it has sent (a lease renewed in a call of 64 counts once).
    pub renewals: usize,
    /// The round trip of the call that carried a renewal, per renewal: the median and the 99th
    /// percentile of the last 20,000.
    pub renewal_p50: Duration,
    pub renewal_p99: Duration,
}

/// The answer to a renewal: the instant taken before its call was sent, and the lease's new expiry
/// (None: its token no longer holds a live lease).
type Renewed = Result<(Stamp, Option<SystemTime>), Error>;

struct Request {
    lease: Lease,
    ttl: Duration,
    /// The latest the caller waits for the answer: the call carrying it is bounded by the earliest.
    limit: Instant,
    reply: oneshot::Sender<Renewed>,
}

pub(crate) struct Renewer<C: Connector> {
    connector: Arc<C>,
    /// One permit per keeper connection; `idle` holds the connection (or None, not made yet, or
    /// dropped) of every free permit.
    slots: Arc<Semaphore>,
    idle: Mutex<Vec<Option<Arc<C::Conn>>>>,
    queue: Mutex<VecDeque<Request>>,
    wake: Notify,
    made: AtomicUsize,
    renewals: AtomicUsize,
    latencies: Mutex<VecDeque<Duration>>,
    retry: Backoff,
    connections: usize,
    /// Whether every keeper connection has been made once (`open`).
    opened: tokio::sync::Mutex<bool>,
}

impl<C: Connector> Renewer<C> {
    /// A keeper of `connections` connections from `connector`, and its sender task, which ends once
    /// the keeper is no longer used (the client and every lease it kept are gone).
    pub fn start(connector: Arc<C>, connections: usize, retry: Backoff) -> Arc<Self> {
        let connections = connections.max(1);
        let renewer = Arc::new(Renewer {
            connector,
            slots: Arc::new(Semaphore::new(connections)),
            idle: Mutex::new(vec![None; connections]),
            queue: Mutex::new(VecDeque::new()),
            wake: Notify::new(),
            made: AtomicUsize::new(0),
            renewals: AtomicUsize::new(0),
            latencies: Mutex::new(VecDeque::new()),
            retry,
            connections,
            opened: tokio::sync::Mutex::new(false),
        });
        tokio::spawn(renewer.clone().dispatch());
        renewer
    }

    pub fn stats(&self) -> KeeperStats {
        let mut samples: Vec<Duration> = self.latencies.lock().unwrap().iter().copied().collect();
        samples.sort_unstable();
        let at = |percent: usize| {
            samples.get((samples.len() * percent / 100).min(samples.len().saturating_sub(1))).copied()
        };
        KeeperStats {
            connections_made: self.made.load(Ordering::Relaxed),
            renewals: self.renewals.load(Ordering::Relaxed),
            renewal_p50: at(50).unwrap_or_default(),
            renewal_p99: at(99).unwrap_or_default(),
        }
    }

    /// Makes the keeper's connections, once, before its first lease is acquired (within `limit`):
    /// from a connector that is a pool, they are taken while it has them to give, so a pool
    /// exhausted later, at the grant or after it, does not hold a renewal back. Best effort: a
    /// connection not made now is made when first needed.
    pub async fn open(self: &Arc<Self>, limit: Duration) {
        let mut opened = self.opened.lock().await;
        if *opened {
            return;
        }
        let bound = Instant::now() + limit;
        let mut slots = Vec::with_capacity(self.connections);
        for _ in 0..self.connections {
            match timeout_at(bound.into(), self.slot()).await {
                Ok(slot) => slots.push(slot),
                Err(_) => return,
            }
        }
        let mut made = 0;
        for slot in &mut slots {
            made += usize::from(slot.conn(bound).await.is_ok());
        }
        *opened = made == self.connections;
    }

    /// Renews `lease` for `ttl` in the next call a free connection sends; the caller waits until
    /// `limit` at most (and bounds its wait itself: an answer after it is dropped).
    pub async fn renew(&self, lease: &Lease, ttl: Duration, limit: Duration) -> Renewed {
        let (reply, answer) = oneshot::channel();
        let limit = Instant::now() + limit;
        self.queue.lock().unwrap().push_back(Request { lease: lease.clone(), ttl, limit, reply });
        self.wake.notify_one();
        answer.await.unwrap_or_else(|_| Err(Error::OutcomeUnknown("the keeper stopped".into())))
    }

    /// Runs `call` once on a keeper connection, within `limit` (the wait for a free connection
    /// included). A connection whose call hung or broke is dropped, to be made again.
    pub async fn call<T, F, Fut>(self: &Arc<Self>, limit: Duration, call: F) -> Result<T, Error>
    where
        F: FnOnce(Arc<C::Conn>) -> Fut,
        Fut: Future<Output = Result<T, Error>>,
    {
        let bound = Instant::now() + limit;
        let elapsed = |elapsed| Error::OutcomeUnknown(Box::new(elapsed));
        let mut slot = timeout_at(bound.into(), self.slot()).await.map_err(elapsed)?;
        let conn = slot.conn(bound).await?;
        match timeout_at(bound.into(), call(conn)).await {
            Ok(Ok(done)) => Ok(done),
            Ok(Err(err)) => {
                if err.is_retryable() || err.may_have_taken_effect() {
                    slot.conn = None;
                }
                Err(err)
            }
            Err(hung) => {
                slot.conn = None;
                self.hung();
                Err(elapsed(hung))
            }
        }
    }

    /// `call`, tried again (with backoff, each try within `per_try`) until it gets an answer other
    /// than a broken or hung connection, or `within` has passed.
    pub async fn call_retrying<T, F, Fut>(
        self: &Arc<Self>,
        within: Duration,
        per_try: Duration,
        call: F,
    ) -> Result<T, Error>
    where
        F: Fn(Arc<C::Conn>) -> Fut,
        Fut: Future<Output = Result<T, Error>>,
    {
        let end = Instant::now() + within;
        let mut retry = 0;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            match self.call(per_try.min(left), &call).await {
                Err(err) if err.is_retryable() && Instant::now() + self.retry.ceiling(retry) < end => {
                    sleep(self.retry.delay(retry)).await;
                    retry = retry.saturating_add(1);
                }
                done => return done,
            }
        }
    }

    async fn slot(self: &Arc<Self>) -> Slot<C> {
        let permit =
            self.slots.clone().acquire_owned().await.expect("the keeper's semaphore is never closed");
        let conn = self.idle.lock().unwrap().pop().expect("a free permit has its connection");
        Slot { renewer: self.clone(), conn, _permit: permit }
    }

    /// Sends the waiting renewals, as many calls at once as there are free connections.
    async fn dispatch(self: Arc<Self>) {
        loop {
            while self.queue.lock().unwrap().is_empty() {
                // Woken by a renewal, or now and then to see whether the keeper is still used.
                tokio::select! {
                    _ = self.wake.notified() => {}
                    _ = sleep(Duration::from_secs(1)) => {}
                }
                if Arc::strong_count(&self) == 1 {
                    return;
                }
            }
            let slot = self.slot().await;
            let batch: Vec<Request> = {
                let mut queue = self.queue.lock().unwrap();
                queue.retain(|request| !request.reply.is_closed());
                let take = queue.len().min(BATCH);
                queue.drain(..take).collect()
            };
            if !batch.is_empty() {
                tokio::spawn(self.clone().send(slot, batch));
            }
        }
    }

    /// One `lease_renew_many` call for `batch`, on `slot`'s connection, each renewal told its answer.
    async fn send(self: Arc<Self>, mut slot: Slot<C>, batch: Vec<Request>) {
        let limit = batch.iter().map(|request| request.limit).min().expect("a batch is not empty");
        let leases: Vec<(&Lease, Duration)> =
            batch.iter().map(|request| (&request.lease, request.ttl)).collect();
        let sent = Stamp::now();
        let call = async {
            let conn = slot.conn(limit).await?;
            let sent = (Stamp::now(), Instant::now());
            let left = limit.saturating_duration_since(sent.1);
            let renewed = bounded(&conn, left, lease::renew_many_each(&**conn, &leases)).await?;
            Ok::<_, Error>((sent, renewed))
        };
        let answer = timeout_at(limit.into(), call).await;
        drop(leases);
        match answer {
            Ok(Ok(((sent, started), renewed))) => {
                let took = started.elapsed();
                self.record(took, batch.len());
                for (request, expiry) in batch.into_iter().zip(renewed) {
                    request.reply.send(Ok((sent, expiry))).ok();
                }
            }
            failed => {
                let why = match failed {
                    Ok(Err(err)) => {
                        if err.is_retryable() || err.may_have_taken_effect() {
                            slot.conn = None;
                        }
                        err.to_string()
                    }
                    _ => {
                        slot.conn = None;
                        self.hung();
                        format!("the keeper's call hung for {:?}", sent.elapsed())
                    }
                };
                for request in batch {
                    request.reply.send(Err(Error::OutcomeUnknown(why.clone().into()))).ok();
                }
            }
        }
    }

    /// A call hung: the idle connections are dropped with its own, as whatever silenced it (a dead
    /// route, a proxy) has most likely silenced them too, and a renewal retried on one of them would
    /// hang again. New ones are made as they are needed (in milliseconds, when the server can be
    /// reached).
    fn hung(&self) {
        self.idle.lock().unwrap().iter_mut().for_each(|conn| *conn = None);
    }

    fn record(&self, took: Duration, renewals: usize) {
        self.renewals.fetch_add(renewals, Ordering::Relaxed);
        let mut latencies = self.latencies.lock().unwrap();
        for _ in 0..renewals {
            if latencies.len() == SAMPLES {
                latencies.pop_front();
            }
            latencies.push_back(took);
        }
    }
}

/// A free keeper connection, taken until dropped (then it is free again, with its connection, or
/// without it when it hung or broke).
struct Slot<C: Connector> {
    renewer: Arc<Renewer<C>>,
    conn: Option<Arc<C::Conn>>,
    _permit: OwnedSemaphorePermit,
}

impl<C: Connector> Slot<C> {
    /// Its connection, made (by `limit`) if it has none or it closed.
    async fn conn(&mut self, limit: Instant) -> Result<Arc<C::Conn>, Error> {
        if let Some(live) = self.conn.as_ref().filter(|conn| !conn.is_closed()) {
            return Ok(live.clone());
        }
        self.conn = None;
        let connect = self.renewer.connector.connect_keeper();
        let made =
            timeout_at(limit.into(), connect).await.map_err(|elapsed| Error::Connect(Box::new(elapsed)))?;
        let made = Arc::new(made.map_err(Error::Connect)?);
        self.renewer.made.fetch_add(1, Ordering::Relaxed);
        self.conn = Some(made.clone());
        Ok(made)
    }
}

impl<C: Connector> Drop for Slot<C> {
    fn drop(&mut self) {
        self.renewer.idle.lock().unwrap().push(self.conn.take());
    }
}

/// `call` on `conn` under a statement_timeout of `limit`, which ends it on the server by the time it
/// is abandoned here, so that a stuck call does not keep holding a key's lock. The timeout is reset
/// in the same round trip (the three statements are pipelined), so the connection does not keep it.
pub(crate) async fn bounded<T>(
    conn: &Client,
    limit: Duration,
    call: impl Future<Output = Result<T, Error>>,
) -> Result<T, Error> {
    let timeout_ms = format!("{}ms", limit.as_millis().max(1));
    let timeout_ms = [(&timeout_ms as &(dyn ToSql + Sync), Type::TEXT)];
    let (set, done, reset) = tokio::join!(
        conn.query_typed("SELECT set_config('statement_timeout', $1, false)", &timeout_ms),
        call,
        conn.batch_execute("RESET statement_timeout"),
    );
    let done = done?;
    set.map(drop).and(reset).map_err(classify)?;
    Ok(done)
}

/// The instant `due` moved back onto the renewal grid, so that renewals due within one step of it
/// are due together.
pub(crate) fn on_grid(due: Instant) -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    let epoch = *EPOCH.get_or_init(Instant::now);
    let since = due.saturating_duration_since(epoch);
    let steps = since.as_nanos() / GRID.as_nanos();
    epoch + GRID * steps as u32
}

/// Releases the token of an acquire its caller gave up (a dropped future, a timeout, a lost
/// connection) once the acquire may have been sent: the server may have granted it, and the caller
/// will never hold what it granted. Disarmed once the caller has the grant (or was refused).
pub(crate) struct GiveUp<C: Connector> {
    armed: Option<Unsure<C>>,
}

/// The token an acquire sent, on its keys, and for how long a grant of it would live.
struct Unsure<C: Connector> {
    keeper: Arc<Renewer<C>>,
    keys: Vec<String>,
    token: uuid::Uuid,
    ttl: Duration,
}

impl<C: Connector> GiveUp<C> {
    pub fn arm(keeper: Arc<Renewer<C>>, keys: Vec<String>, token: uuid::Uuid, ttl: Duration) -> Self {
        GiveUp { armed: Some(Unsure { keeper, keys, token, ttl }) }
    }

    pub fn disarm(mut self) {
        self.armed = None;
    }
}

impl<C: Connector> Drop for GiveUp<C> {
    fn drop(&mut self) {
        let Some(Unsure { keeper, keys, token, ttl }) = self.armed.take() else { return };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        // Tried until the TTL: after it, the grant (if any) has ended by itself. A try is bounded
        // by a second (a release takes milliseconds; trying again is harmless), as the keeper's
        // connections may have hung with the call's.
        runtime.spawn(async move {
            let per_try = Duration::from_secs(1).min(ttl);
            for key in &keys {
                let release =
                    |conn: Arc<C::Conn>| async move { lease::release_token(&**conn, key, token).await };
                keeper.call_retrying(ttl, per_try, release).await.ok();
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renewals_due_within_a_step_of_the_grid_are_due_together() {
        let start = on_grid(Instant::now());
        let (early, late) = (start + Duration::from_millis(1), start + GRID - Duration::from_millis(1));
        assert_eq!(on_grid(early), on_grid(late), "both fall due at the same step");
        assert!(on_grid(late) <= late, "never later than asked");
        assert_eq!(on_grid(start + GRID), start + GRID);
    }
}
