//! `hold`: a lease kept alive by a background task, and the local deadline that tells its holder
//! when to stop even if the server cannot be reached to say so.
use crate::client::FenceClient;
use crate::connect::Connector;
use crate::error::Error;
use crate::lease::{self, AcquireOptions, Lease};
use crate::retry::Backoff;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::{sleep, sleep_until, timeout, timeout_at};
use tokio_postgres::types::Type;
use tokio_util::sync::CancellationToken;

/// Where a held lease stands. Once it leaves `Held` it never comes back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseState {
    Held {
        fence: i64,
        expires_at: SystemTime,
    },
    /// The server said the token no longer holds the lease (PF001): someone else may hold it now.
    Lost,
    /// The local deadline passed without a renewal: the server may still count it as held, but its
    /// holder cannot know, so it must stop as if lost.
    Unknown,
    /// Given up by its holder (`release`, or the HeldLease dropped).
    Released,
}

pub type OnLost = Arc<dyn Fn(LeaseState) + Send + Sync>;

/// How `hold` keeps the lease.
#[derive(Clone)]
pub struct KeepOptions {
    /// How often to renew; ttl / 3 by default, so that two renewals in a row can fail and a third
    /// still has time before the deadline.
    pub renew_every: Option<Duration>,
    /// Backoff between failed tries, of the acquire, a renewal and the release.
    pub retry: Backoff,
    /// Taken off the local deadline, so that the holder is told (which takes the runtime a few
    /// milliseconds) before the server's expiry rather than just after; min(ttl / 50, 100 ms) by
    /// default.
    pub margin: Option<Duration>,
    /// Bounds one try of the acquire (beyond its `wait`) and the whole release.
    pub timeout: Duration,
    /// Called once, from the keeper task, when the lease becomes `Lost` or `Unknown`.
    pub on_lost: Option<OnLost>,
}

impl Default for KeepOptions {
    fn default() -> Self {
        KeepOptions {
            renew_every: None,
            margin: None,
            retry: Backoff::default(),
            timeout: Duration::from_secs(10),
            on_lost: None,
        }
    }
}

impl KeepOptions {
    pub fn renew_every(mut self, every: Duration) -> Self {
        self.renew_every = Some(every);
        self
    }

    pub fn on_lost(mut self, callback: impl Fn(LeaseState) + Send + Sync + 'static) -> Self {
        self.on_lost = Some(Arc::new(callback));
        self
    }
}

/// What the keeper task and the HeldLease share.
struct Shared {
    ttl: Duration,
    /// ttl less the margin.
    span: Duration,
    /// The instant taken just before sending the last acquire or renew that succeeded, plus ttl
    /// (less the margin): the server cannot have expired the lease before then, as its TTL runs
    /// from a later instant.
    deadline: Mutex<Instant>,
    state: watch::Sender<LeaseState>,
    ended: CancellationToken,
    on_lost: Option<OnLost>,
}

impl Shared {
    fn deadline(&self) -> Instant {
        *self.deadline.lock().unwrap()
    }

    fn renewed(&self, sent: Instant, fence: i64, expires_at: SystemTime) {
        *self.deadline.lock().unwrap() = sent + self.span;
        self.state.send_replace(LeaseState::Held { fence, expires_at });
    }

    /// Moves to an end state: from Held to any, from Unknown only to Released (a release after the
    /// deadline settles it); the first end from Held is what `on_lost` hears of.
    fn end(&self, end: LeaseState) {
        let mut from = None;
        self.state.send_if_modified(|state| {
            let moves = matches!(state, LeaseState::Held { .. })
                || (*state == LeaseState::Unknown && end == LeaseState::Released);
            if moves {
                from = Some(*state);
                *state = end;
            }
            moves
        });
        self.ended.cancel();
        if matches!(from, Some(LeaseState::Held { .. })) && end != LeaseState::Released {
            if let Some(callback) = &self.on_lost {
                callback(end);
            }
        }
    }

    /// The state, by the deadline as much as by the keeper: the keeper may not have run yet.
    fn current(&self) -> LeaseState {
        let state = *self.state.borrow();
        match state {
            LeaseState::Held { .. } if Instant::now() >= self.deadline() => LeaseState::Unknown,
            _ => state,
        }
    }
}

/// A lease kept alive in the background. Check `is_held()` before each step of the work, or stop
/// the work when `lost()` returns (or `lost_token()` is cancelled), and guard every write with the
/// fence. Dropping it stops the keeper, which then releases the lease in the background.
pub struct HeldLease {
    lease: Lease,
    shared: Arc<Shared>,
    stop: CancellationToken,
    task: Option<JoinHandle<Result<bool, Error>>>,
}

impl HeldLease {
    pub fn lease(&self) -> &Lease {
        &self.lease
    }

    pub fn fence(&self) -> i64 {
        self.lease.fence
    }

    /// False once the local deadline has passed without a renewal, whether or not the keeper task
    /// has run since.
    pub fn is_held(&self) -> bool {
        matches!(self.shared.current(), LeaseState::Held { .. })
    }

    pub fn state(&self) -> LeaseState {
        self.shared.current()
    }

    /// The local deadline now: the lease is known to be held until then.
    pub fn deadline(&self) -> Instant {
        self.shared.deadline()
    }

    /// Every change of state, renewals included.
    pub fn watch(&self) -> watch::Receiver<LeaseState> {
        self.shared.state.subscribe()
    }

    /// Cancelled when the lease is no longer the holder's: Lost, Unknown or Released.
    pub fn lost_token(&self) -> CancellationToken {
        self.shared.ended.clone()
    }

    /// Returns when the lease is no longer the holder's, with the state that ended it.
    pub async fn lost(&self) -> LeaseState {
        self.shared.ended.cancelled().await;
        self.state()
    }

    /// Stops the keeper and releases the lease: true when the release ended it. Bounded by
    /// `KeepOptions::timeout`: when the server cannot be reached, `OutcomeUnknown` (the TTL ends it).
    pub async fn release(mut self) -> Result<bool, Error> {
        self.stop.cancel();
        let task = self.task.take().expect("the keeper task is taken only here");
        task.await.unwrap_or_else(|join| Err(Error::OutcomeUnknown(Box::new(join))))
    }
}

impl Drop for HeldLease {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Acquires `key` (waiting up to `opts.wait`; `Error::WaitTimedOut` when it is not granted) and
/// keeps it: a task renews it every `renew_every` on its own connection from `connector`, retrying
/// failed renewals with backoff, and declares it `Unknown` when the local deadline passes without
/// a renewal, even if a renewal is still hanging.
pub async fn hold<C: Connector>(
    connector: C,
    key: &str,
    opts: &AcquireOptions,
    keep: KeepOptions,
) -> Result<HeldLease, Error> {
    let opts = opts.with_token();
    let client = FenceClient::with_backoff(connector, keep.retry.clone()).call_timeout(keep.timeout);
    // Taken before the first try: whichever try granted the lease was sent after it.
    let sent = Instant::now();
    let lease =
        client.acquire(key, &opts).await?.ok_or_else(|| Error::WaitTimedOut { key: key.to_owned() })?;
    let margin = keep.margin.unwrap_or((opts.ttl / 50).min(Duration::from_millis(100)));
    let span = opts.ttl.saturating_sub(margin);
    let (state, _) = watch::channel(LeaseState::Held { fence: lease.fence, expires_at: lease.expires_at });
    let shared = Arc::new(Shared {
        ttl: opts.ttl,
        span,
        deadline: Mutex::new(sent + span),
        state,
        ended: CancellationToken::new(),
        on_lost: keep.on_lost.clone(),
    });
    let keeper = Keeper {
        client,
        lease: lease.clone(),
        every: keep.renew_every.unwrap_or(opts.ttl / 3),
        session_bound: opts.session_bound,
        retry: keep.retry,
        timeout: keep.timeout,
        shared: shared.clone(),
    };
    // A long wait, or retries, may have used up the margin that `sent` leaves: renew at once.
    if sent.elapsed() >= keeper.every {
        let renewed = timeout(keep.timeout, keeper.try_renew(keep.timeout)).await;
        let (sent, expires_at) = renewed.map_err(|elapsed| Error::OutcomeUnknown(Box::new(elapsed)))??;
        shared.renewed(sent, lease.fence, expires_at);
    }
    let stop = CancellationToken::new();
    let task = tokio::spawn(keeper.run(stop.clone()));
    Ok(HeldLease { lease, shared, stop, task: Some(task) })
}

struct Keeper<C: Connector> {
    client: FenceClient<C>,
    lease: Lease,
    every: Duration,
    session_bound: bool,
    retry: Backoff,
    timeout: Duration,
    shared: Arc<Shared>,
}

impl<C: Connector> Keeper<C> {
    async fn run(self, stop: CancellationToken) -> Result<bool, Error> {
        let ended = tokio::select! {
            _ = stop.cancelled() => None,
            end = self.renew_until_ended() => Some(end),
        };
        if let Some(end) = ended {
            self.shared.end(end);
            stop.cancelled().await;
            if end == LeaseState::Lost {
                return Ok(false);
            }
        }
        // Unknown or still held: the lease may be live, and releasing it frees the key at once.
        let released = timeout(self.timeout, self.client.release(&self.lease)).await;
        self.shared.end(LeaseState::Released);
        released.unwrap_or_else(|elapsed| Err(Error::OutcomeUnknown(Box::new(elapsed))))
    }

    async fn renew_until_ended(&self) -> LeaseState {
        loop {
            let deadline = self.shared.deadline();
            let sent = deadline - self.shared.span;
            self.pause_until(sent + self.every).await;
            // The deadline bounds the renewal from outside, so it fires even while a call hangs.
            match timeout_at(deadline.into(), self.renew_until_answered(deadline)).await {
                Ok(Some((sent, expires_at))) => self.shared.renewed(sent, self.lease.fence, expires_at),
                Ok(None) => return LeaseState::Lost,
                Err(_) => {
                    self.client.forget().await;
                    return LeaseState::Unknown;
                }
            }
        }
    }

    /// Sleeps until `due`, or until a session-bound lease's connection closes: the lease has ended
    /// with its session then, and the renewal that follows at once finds that out.
    async fn pause_until(&self, due: Instant) {
        let closed = match self.session_bound {
            true => self.client.current().await.as_deref().and_then(C::closed),
            false => None,
        };
        match closed {
            Some(closed) => {
                tokio::select! {
                    _ = sleep_until(due.into()) => {}
                    _ = closed.cancelled() => {}
                }
            }
            None => sleep_until(due.into()).await,
        }
    }

    /// Tries until the server answers: Some((sent, new expiry)), or None for PF001.
    async fn renew_until_answered(&self, deadline: Instant) -> Option<(Instant, SystemTime)> {
        let mut retry = 0;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            // A try that hangs is abandoned in time for another on a new connection, but for a
            // session-bound lease, which would end with its connection.
            let limit = if self.session_bound { left } else { self.every.min(left) };
            match timeout(limit, self.try_renew(limit)).await {
                Ok(Ok(renewed)) => return Some(renewed),
                Ok(Err(Error::LeaseLost { .. })) => return None,
                Ok(Err(_)) => {}
                Err(_) => self.client.forget().await,
            }
            sleep(self.retry.delay(retry)).await;
            retry = retry.saturating_add(1);
        }
    }

    /// One renewal, under a statement_timeout that ends it on the server by the time it is
    /// abandoned here, so that a stuck renewal does not keep holding the key's lock.
    async fn try_renew(&self, limit: Duration) -> Result<(Instant, SystemTime), Error> {
        let conn = self.client.connection().await?;
        let timeout_ms = format!("{}ms", limit.as_millis().max(1));
        conn.query_typed("SELECT set_config('statement_timeout', $1, false)", &[(&timeout_ms, Type::TEXT)])
            .await
            .map_err(crate::error::classify)?;
        let sent = Instant::now();
        let expires_at = lease::renew(&**conn, &self.lease, self.shared.ttl).await?;
        Ok((sent, expires_at))
    }
}
