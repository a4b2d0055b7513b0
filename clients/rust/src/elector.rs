//! Leader election on a key, after etcd's `concurrency.Election` (campaign with a value, proclaim,
//! resign, observe, leader) and client-go's leader election (callbacks on started and stopped
//! leading and on a new leader, release on cancel, hand-off to a preferred holder). A leader is the
//! holder of the key's lease, its value the lease's owner, and its fence fences its writes.
use crate::client::FenceClient;
use crate::connect::Connector;
use crate::error::{BoxError, Error};
use crate::keeper::{hold_kept_by, HeldLease, KeepOptions, LeaseState};
use crate::lease::{self, AcquireOptions, Leader, Lease};
use crate::reason::{Ended, LossReason};
use std::fmt;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant, SystemTime};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_postgres::{CancelToken, NoTls};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// How long one wait of a campaign lasts before it is asked again (it stays in the key's queue).
const CAMPAIGN_WAIT: Duration = Duration::from_secs(60);

/// How long a cancel request may take: a stopped server answers nothing.
const CANCEL_TIMEOUT: Duration = Duration::from_secs(2);

/// How long before the expiry of the lease it saw an observer asks the server to answer (unchanged,
/// if nothing changed), so that the answer, and its round trip, come before the expiry: an observer
/// with no answer by the expiry says it cannot see.
const BLIND_GRACE: Duration = Duration::from_millis(500);

/// Why a leadership ended (`on_stopped_leading`, `Leadership::stopped_reason`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    /// The lease was lost (`LossReason::Unreachable` when the local deadline passed).
    Lost(LossReason),
    /// Released by `resign`, or by the `Leadership` dropped (release on cancel).
    Released,
    /// Handed off to another candidate (`Leadership::handoff`).
    HandedOff,
    /// Dropped with `release_on_cancel(false)`: left to expire at its TTL.
    Cancelled,
}

impl StopReason {
    /// The name both clients use: a `LossReason`'s, or `released`, `handed_off`, `cancelled`.
    pub fn as_str(&self) -> &'static str {
        match self {
            StopReason::Lost(reason) => reason.as_str(),
            StopReason::Released => "released",
            StopReason::HandedOff => "handed_off",
            StopReason::Cancelled => "cancelled",
        }
    }
}

impl fmt::Display for StopReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

type Callback<T> = Arc<dyn Fn(T) + Send + Sync>;
type OnStarted = Arc<dyn Fn(&Lease) + Send + Sync>;

/// What an `Elector` campaigns with, and its callbacks.
#[derive(Clone)]
pub struct ElectOptions {
    /// The leadership's lease: its `ttl`, `durable` (a fast lease is `LossReason::Restarted` when a
    /// crash or a failover loses it), `session_bound` and `lock_delay`. The campaign sets its owner
    /// (the value), wait and token; `shared` and `permits` are refused (`Error::Config`).
    pub lease: AcquireOptions,
    /// How the leadership's lease is kept (`on_lost` is the elector's own: use `on_stopped_leading`).
    pub keep: KeepOptions,
    /// How long one `await_change` of an observer waits before it asks again; 30 s by default.
    pub observe_timeout: Duration,
    /// Whether a `Leadership` dropped without `resign` (a cancelled task) releases its lease (the
    /// default) or stops renewing and leaves it to expire at its TTL (client-go's default, for work
    /// that may outlive the cancel).
    pub release_on_cancel: bool,
    on_started_leading: Option<OnStarted>,
    on_stopped_leading: Option<Callback<StopReason>>,
    on_new_leader: Option<Callback<Option<Leader>>>,
}

impl ElectOptions {
    /// Campaigns for leases as `lease` says (`AcquireOptions::new(ttl)`, durable by default).
    pub fn new(lease: AcquireOptions) -> Self {
        ElectOptions {
            lease,
            keep: KeepOptions::default(),
            observe_timeout: Duration::from_secs(30),
            release_on_cancel: true,
            on_started_leading: None,
            on_stopped_leading: None,
            on_new_leader: None,
        }
    }

    pub fn keep(mut self, keep: KeepOptions) -> Self {
        self.keep = keep;
        self
    }

    pub fn observe_timeout(mut self, timeout: Duration) -> Self {
        self.observe_timeout = timeout;
        self
    }

    pub fn release_on_cancel(mut self, release: bool) -> Self {
        self.release_on_cancel = release;
        self
    }

    /// Called by `campaign` when elected, with the leadership's lease, before it returns.
    pub fn on_started_leading(mut self, callback: impl Fn(&Lease) + Send + Sync + 'static) -> Self {
        self.on_started_leading = Some(Arc::new(callback));
        self
    }

    /// Called once when a leadership ends, with why (after `on_started_leading`).
    pub fn on_stopped_leading(mut self, callback: impl Fn(StopReason) + Send + Sync + 'static) -> Self {
        self.on_stopped_leading = Some(Arc::new(callback));
        self
    }

    /// Called with every change of the key's leader (None: nobody leads), from a task of the
    /// elector's that observes the key while the elector lives.
    pub fn on_new_leader(mut self, callback: impl Fn(Option<Leader>) + Send + Sync + 'static) -> Self {
        self.on_new_leader = Some(Arc::new(callback));
        self
    }

    fn acquire(&self, value: &str, wait: Duration, token: Uuid) -> Result<AcquireOptions, Error> {
        if self.lease.shared || self.lease.permits != 1 {
            return Err(Error::Config("a leadership's lease is exclusive: no shared, no permits".into()));
        }
        Ok(self.lease.clone().owner(value).wait(wait).token(token))
    }

    fn client<C: Connector>(&self, connector: Arc<C>) -> FenceClient<Arc<C>> {
        FenceClient::with_backoff(connector, self.keep.retry.clone()).call_timeout(self.keep.timeout)
    }
}

impl<C: Connector> FenceClient<C> {
    /// An `Elector` of `key` whose leaderships this client's keeper keeps, with its other kept
    /// leases (`Elector::new` makes a keeper of the elector's own). The campaigns' acquires and the
    /// observers go on connections of their own, as with `Elector::new`.
    pub fn elector(&self, key: impl Into<String>, opts: ElectOptions) -> Elector<C> {
        Elector::kept_by(self.sibling(), key, opts)
    }
}

/// Campaigns for a key, observes its leaders and calls back. `Elector::new` with an
/// `on_new_leader` callback must be called within a Tokio runtime (it starts the observing task,
/// which ends when the elector is dropped).
pub struct Elector<C: Connector> {
    connector: Arc<C>,
    /// Whose keeper keeps the leaderships: the elector's own, or the client's it was made from
    /// (`FenceClient::elector`), shared with the client's other kept leases.
    keeper: FenceClient<C>,
    key: String,
    opts: ElectOptions,
    watcher: Option<JoinHandle<()>>,
}

impl<C: Connector> Elector<C> {
    pub fn new(connector: C, key: impl Into<String>, opts: ElectOptions) -> Self {
        // One connection: the elector keeps one leadership at a time.
        let keeper = FenceClient::with_backoff(connector, opts.keep.retry.clone())
            .call_timeout(opts.keep.timeout)
            .keeper_connections(1);
        Elector::kept_by(keeper, key, opts)
    }

    /// An elector whose leaderships `keeper`'s keeper keeps.
    fn kept_by(keeper: FenceClient<C>, key: impl Into<String>, opts: ElectOptions) -> Self {
        let (connector, key) = (keeper.connector(), key.into());
        let watcher = opts.on_new_leader.clone().map(|callback| {
            let observing =
                Observing { client: opts.client(connector.clone()), key: key.clone(), opts: opts.clone() };
            tokio::spawn(observing.call_back(callback))
        });
        Elector { connector, keeper, key, opts, watcher }
    }

    pub fn key(&self) -> &str {
        &self.key
    }

    /// Waits until elected with `value` (the lease's owner, which observers see) and returns the
    /// leadership, kept renewed; calls `on_started_leading`. Dropping the future (a cancelled task)
    /// ends its wait on the server and gives up whatever it may have been granted.
    pub async fn campaign(&self, value: &str) -> Result<Leadership<C>, Error> {
        self.campaign_until(value, None).await
    }

    /// `campaign`, waiting `wait` at most: `Error::WaitTimedOut` when not elected by then.
    pub async fn campaign_for(&self, value: &str, wait: Duration) -> Result<Leadership<C>, Error> {
        self.campaign_until(value, Some(Instant::now() + wait)).await
    }

    async fn campaign_until(&self, value: &str, end: Option<Instant>) -> Result<Leadership<C>, Error> {
        loop {
            let left = end.map_or(CAMPAIGN_WAIT, |end| end.saturating_duration_since(Instant::now()));
            let token = Uuid::new_v4();
            let opts = self.opts.acquire(value, left.min(CAMPAIGN_WAIT), token)?;
            let mut campaign = Campaign::new(self.connector.clone(), &self.key, token);
            let acquirer = FenceClient::with_backoff(campaign.connector(), self.opts.keep.retry.clone())
                .call_timeout(self.opts.keep.timeout);
            let held = hold_kept_by(&acquirer, &self.keeper, &self.key, &opts, self.opts.keep.clone()).await;
            match held {
                Ok(held) => {
                    campaign.done();
                    return Ok(self.elected(held, value));
                }
                Err(Error::WaitTimedOut { .. }) => {
                    campaign.done();
                    if end.is_some_and(|end| Instant::now() >= end) {
                        return Err(Error::WaitTimedOut { key: self.key.clone() });
                    }
                }
                Err(err) => return Err(err),
            }
        }
    }

    fn elected(&self, held: HeldLease, value: &str) -> Leadership<C> {
        if let Some(callback) = &self.opts.on_started_leading {
            callback(held.lease());
        }
        let told = Told::new(held.watch(), self.opts.on_stopped_leading.clone());
        Leadership {
            held: Some(held),
            client: self.opts.client(self.connector.clone()),
            value: Mutex::new(value.to_owned()),
            told,
            release_on_cancel: self.opts.release_on_cancel,
        }
    }

    /// The key's leader now; None when nobody leads.
    pub async fn leader(&self) -> Result<Option<Leader>, Error> {
        self.opts.client(self.connector.clone()).leader(&self.key).await
    }

    /// The key's leaders as they change, as a stream (`futures_core::Stream`, or `next()`): the
    /// present at once (the leader, or None when nobody leads), then every change: a new leader (a higher fence), a
    /// new value proclaimed (the same fence), None when nobody leads (a resign, a revoke, an expiry,
    /// a session's end, a fast lease lost in a crash). On a connection of its own; an error the
    /// retries could not get past (an outage longer than `Backoff::max_elapsed`) is its last item.
    /// An observer that gets no answer by the expiry of the lease it saw last (by the TTL of
    /// `ElectOptions::lease` while it saw none) yields `Err(Error::Blind(why))`, neither a vacancy
    /// nor the old leader, and goes on, on a new connection: its next item is the present again.
    pub fn observe(&self) -> Observer {
        let observing = Observing {
            client: self.opts.client(self.connector.clone()),
            key: self.key.clone(),
            opts: self.opts.clone(),
        };
        let (sender, receiver) = mpsc::channel(16);
        Observer { receiver, task: tokio::spawn(observing.send_to(sender)) }
    }
}

impl<C: Connector> Drop for Elector<C> {
    fn drop(&mut self) {
        if let Some(watcher) = self.watcher.take() {
            watcher.abort();
        }
    }
}

/// A campaign in progress: the connections it makes, whose statements a drop cancels (then it
/// releases its token, in case a grant came meanwhile), until `done`.
struct Campaign<C: Connector> {
    connector: Arc<C>,
    key: String,
    token: Uuid,
    cancel: Arc<Mutex<Option<CancelToken>>>,
    running: bool,
}

impl<C: Connector> Campaign<C> {
    fn new(connector: Arc<C>, key: &str, token: Uuid) -> Self {
        Campaign { connector, key: key.to_owned(), token, cancel: Arc::default(), running: true }
    }

    fn connector(&self) -> Tracking<C> {
        Tracking { inner: self.connector.clone(), cancel: self.cancel.clone() }
    }

    fn done(&mut self) {
        self.running = false;
    }
}

impl<C: Connector> Drop for Campaign<C> {
    fn drop(&mut self) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        if !self.running {
            return;
        }
        let (connector, key, token) = (self.connector.clone(), self.key.clone(), self.token);
        let cancel = self.cancel.lock().unwrap().take();
        runtime.spawn(async move {
            if let Some(cancel) = cancel {
                tokio::time::timeout(CANCEL_TIMEOUT, cancel.cancel_query(NoTls)).await.ok();
            }
            if let Ok(conn) = connector.connect().await {
                lease::release(&*conn, &release_of(&key, token)).await.ok();
            }
        });
    }
}

/// A lease to release by `key` and `token` alone.
fn release_of(key: &str, token: Uuid) -> Lease {
    Lease {
        key: key.to_owned(),
        owner: String::new(),
        fence: 0,
        token,
        acquired_at: std::time::UNIX_EPOCH,
        expires_at: std::time::UNIX_EPOCH,
        durable: true,
        shared: false,
        permits: 1,
    }
}

/// A connector that keeps the cancel token of the last connection it made.
struct Tracking<C: Connector> {
    inner: Arc<C>,
    cancel: Arc<Mutex<Option<CancelToken>>>,
}

impl<C: Connector> Connector for Tracking<C> {
    type Conn = C::Conn;

    async fn connect(&self) -> Result<C::Conn, BoxError> {
        let conn = self.inner.connect().await?;
        *self.cancel.lock().unwrap() = Some(conn.cancel_token());
        Ok(conn)
    }

    fn closed(conn: &C::Conn) -> Option<CancellationToken> {
        C::closed(conn)
    }
}

/// How a leadership ended, told once to `on_stopped_leading`.
struct Told {
    handed_off: AtomicBool,
    cancelled: AtomicBool,
    reason: Mutex<Option<StopReason>>,
    callback: Option<Callback<StopReason>>,
}

impl Told {
    /// Tells `callback` how the lease whose states `watch` carries ends, once it leaves Held.
    fn new(mut watch: watch::Receiver<LeaseState>, callback: Option<Callback<StopReason>>) -> Arc<Told> {
        let (handed_off, cancelled, reason) =
            (AtomicBool::new(false), AtomicBool::new(false), Mutex::new(None));
        let told = Arc::new(Told { handed_off, cancelled, reason, callback });
        let telling = told.clone();
        tokio::spawn(async move {
            loop {
                let state = *watch.borrow_and_update();
                if !matches!(state, LeaseState::Held { .. }) || watch.changed().await.is_err() {
                    let state = *watch.borrow();
                    telling.tell(state);
                    return;
                }
            }
        });
        told
    }

    fn tell(&self, state: LeaseState) {
        let reason = if self.handed_off.load(Ordering::SeqCst) {
            StopReason::HandedOff
        } else if self.cancelled.load(Ordering::SeqCst) {
            StopReason::Cancelled
        } else {
            match state {
                LeaseState::Held { .. } => return,
                LeaseState::Lost(reason) => StopReason::Lost(reason),
                LeaseState::Unknown => StopReason::Lost(LossReason::Unreachable),
                LeaseState::Released => StopReason::Released,
            }
        };
        {
            let mut told = self.reason.lock().unwrap();
            if told.is_some() {
                return;
            }
            *told = Some(reason);
        }
        if let Some(callback) = &self.callback {
            callback(reason);
        }
    }
}

/// A leadership: the leader's lease, kept renewed (`held()`: `fence()`, `lost()`, `lost_token()`,
/// `watch()`, ... as a `HeldLease`), with proclaim, hand-off and resign. Dropping it (a cancelled
/// task) releases the lease in the background, or, with `release_on_cancel(false)`, stops renewing
/// and leaves it to expire.
pub struct Leadership<C: Connector> {
    held: Option<HeldLease>,
    client: FenceClient<Arc<C>>,
    value: Mutex<String>,
    told: Arc<Told>,
    release_on_cancel: bool,
}

impl<C: Connector> Leadership<C> {
    /// The leader's lease, kept renewed.
    pub fn held(&self) -> &HeldLease {
        self.held.as_ref().expect("a leadership holds its lease until resign or drop")
    }

    pub fn lease(&self) -> &Lease {
        self.held().lease()
    }

    pub fn fence(&self) -> i64 {
        self.held().fence()
    }

    /// The leader's value: the one it was elected with, or last proclaimed.
    pub fn value(&self) -> String {
        self.value.lock().unwrap().clone()
    }

    /// Whether it still leads: the lease is held by its local deadline.
    pub fn is_leader(&self) -> bool {
        self.held().is_held()
    }

    /// Returns when the leadership ends, with the lease's state then.
    pub async fn lost(&self) -> LeaseState {
        self.held().lost().await
    }

    /// Why the leadership ended (what `on_stopped_leading` was told); None while it leads.
    pub fn stopped_reason(&self) -> Option<StopReason> {
        *self.told.reason.lock().unwrap()
    }

    /// The leader as observers see it now.
    pub fn leader(&self) -> Leader {
        let lease = self.lease();
        Leader {
            fence: lease.fence,
            owner: self.value(),
            acquired_at: lease.acquired_at,
            expires_at: lease.expires_at,
        }
    }

    fn must_lead(&self) -> Result<&HeldLease, Error> {
        let held = self.held();
        match held.state().reason() {
            None if held.is_held() => Ok(held),
            reason => Err(Error::LeaseLost { key: held.lease().key.clone(), reason }),
        }
    }

    /// The server said the lease is not held: Lost, for the reason lease_status gives.
    async fn lost_now(&self, held: &HeldLease, ended: Option<Ended>) -> Error {
        let ended = match ended {
            Some(ended) => Some(ended),
            None => self.client.ended(held.lease()).await.ok().flatten(),
        };
        let reason = ended.map_or(LossReason::Unknown, Ended::loss);
        held.lost_for(reason);
        self.told.tell(LeaseState::Lost(reason));
        Error::LeaseLost { key: held.lease().key.clone(), reason: Some(reason) }
    }

    /// Changes the leader's value (the lease's owner), keeping its fence: observers see the new
    /// value. `Error::LeaseLost` (with its reason) when it no longer leads.
    pub async fn proclaim(&self, value: &str) -> Result<(), Error> {
        let held = self.must_lead()?;
        let renewing = held.renewing();
        let _renewing = renewing.lock().await;
        if self.client.proclaim(held.lease(), value).await? {
            *self.value.lock().unwrap() = value.to_owned();
            return Ok(());
        }
        Err(self.lost_now(held, None).await)
    }

    /// Ends this leadership and hands the key, with a higher fence, to the candidate campaigning
    /// with the value `to_owner`, ahead of the others: the new leader (`on_stopped_leading`:
    /// `HandedOff`). None, changing nothing, when no such candidate waits. `Error::LeaseLost` when it
    /// no longer leads.
    pub async fn handoff(&self, to_owner: &str) -> Result<Option<Leader>, Error> {
        let held = self.must_lead()?;
        let renewing = held.renewing();
        let _renewing = renewing.lock().await;
        let leader = match self.client.handoff(held.lease(), to_owner).await? {
            Some(leader) => Some(leader),
            // No such candidate; or a retry after a hand-off whose answer was lost: then the lease
            // ended as released, and the leader is whoever leads now.
            None => match self.client.ended(held.lease()).await? {
                None => return Ok(None),
                Some(Ended::Released) => self.client.leader(&held.lease().key).await?,
                lost => return Err(self.lost_now(held, lost).await),
            },
        };
        self.told.handed_off.store(true, Ordering::SeqCst);
        held.abandon(LeaseState::Released);
        self.told.tell(LeaseState::Released);
        Ok(leader)
    }

    /// Releases the leadership: true when the server said so (`on_stopped_leading`: `Released`);
    /// false when it had ended already (`on_stopped_leading` has told why).
    pub async fn resign(mut self) -> Result<bool, Error> {
        let held = self.held.take().expect("a leadership holds its lease until resign or drop");
        let watch = held.watch();
        let released = held.release().await;
        let state = *watch.borrow();
        self.told.tell(state);
        released
    }
}

impl<C: Connector> Drop for Leadership<C> {
    fn drop(&mut self) {
        let Some(held) = self.held.take() else { return };
        if !self.release_on_cancel && held.is_held() {
            self.told.cancelled.store(true, Ordering::SeqCst);
            held.abandon(LeaseState::Unknown);
        }
    }
}

/// The leaders of a key as they change (`Elector::observe`): a `futures_core::Stream` of
/// `Result<Option<Leader>, Error>`, or `next().await`. Dropping it stops the observing.
pub struct Observer {
    receiver: mpsc::Receiver<Result<Option<Leader>, Error>>,
    task: JoinHandle<()>,
}

impl Observer {
    /// The next change of leader; None once an error ended the observing.
    pub async fn next(&mut self) -> Option<Result<Option<Leader>, Error>> {
        self.receiver.recv().await
    }
}

impl futures_core::Stream for Observer {
    type Item = Result<Option<Leader>, Error>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.get_mut().receiver.poll_recv(cx)
    }
}

impl Drop for Observer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// An observer's loop of await_change.
struct Observing<C: Connector> {
    client: FenceClient<Arc<C>>,
    key: String,
    opts: ElectOptions,
}

impl<C: Connector> Observing<C> {
    /// One await_change: the change it saw (Some(leader), or Some(None) for a vacancy), or None
    /// when the state is what `seen` says (the timeout ran out). `seen` is None until something was
    /// seen: the first look does not wait, and its answer is news whatever it is (the present, the
    /// vacancy included, as elector.json says).
    ///
    /// Each question is answered by the expiry of the lease seen (the lease TTL of the options when
    /// none was seen) or the observer cannot see: `Error::Blind`, after which it asks again on a new
    /// connection, and the first answer it gets is news again.
    async fn news(&self, seen: &mut Option<Option<Leader>>) -> Result<Option<Option<Leader>>, Error> {
        let asked = seen.clone().flatten();
        let mut wait = if seen.is_none() { Duration::ZERO } else { self.opts.observe_timeout };
        let sight = match &asked {
            Some(leader) => leader.expires_at.duration_since(SystemTime::now()).unwrap_or_default(),
            None => self.opts.lease.ttl,
        };
        // The server answers an unchanged leader when the wait runs out, by the lease's expiry.
        let sight = sight.max(BLIND_GRACE);
        wait = wait.min(sight.saturating_sub(BLIND_GRACE));
        let asking = self.client.await_change(&self.key, asked.as_ref(), wait);
        let now = match tokio::time::timeout(sight, asking).await {
            Ok(now) => now?,
            Err(_) => {
                self.client.forget().await;
                *seen = None;
                return Err(Error::Blind(format!("no answer from the server within {sight:?}")));
            }
        };
        let news = seen.as_ref().is_none_or(|before| *before != now);
        // Kept even when unchanged: the expiry moves with each renewal the leader makes.
        *seen = Some(now.clone());
        Ok(news.then_some(now))
    }

    /// Sends every change to `sender` until it is dropped, or an error (sent last).
    async fn send_to(self, sender: mpsc::Sender<Result<Option<Leader>, Error>>) {
        let mut seen = None;
        loop {
            let news = match self.news(&mut seen).await {
                Ok(None) => continue,
                Ok(Some(leader)) => Ok(leader),
                Err(err) => Err(err),
            };
            // Blind is told, and the observing goes on.
            let failed = news.as_ref().is_err_and(|err| !matches!(err, Error::Blind(_)));
            if sender.send(news).await.is_err() || failed {
                return;
            }
        }
    }

    /// `on_new_leader`'s task: observes for as long as the elector lives, trying again a second
    /// after an error (from the state it saw last, so that it misses no change).
    async fn call_back(self, callback: Callback<Option<Leader>>) {
        let mut seen = None;
        loop {
            match self.news(&mut seen).await {
                Ok(Some(leader)) => callback(leader),
                Ok(None) => {}
                Err(_) => tokio::time::sleep(Duration::from_secs(1)).await,
            }
        }
    }
}
