//! `hold`: a lease kept alive by a background task, and the local deadline that tells its holder
//! when to stop even if the server cannot be reached to say so.
use crate::client::FenceClient;
use crate::clock::Stamp;
use crate::connect::Connector;
use crate::error::Error;
use crate::lease::{self, AcquireOptions, Lease, LeaseSet};
use crate::reason::{Ended, LossReason};
use crate::renewer::{self, Renewer};
use crate::retry::Backoff;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::{sleep, sleep_until, timeout, timeout_at};
use tokio_postgres::GenericClient;
use tokio_util::sync::CancellationToken;

/// Where a held lease stands. Once it leaves `Held` it never comes back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseState {
    Held {
        fence: i64,
        expires_at: SystemTime,
    },
    /// The server said the token no longer holds the lease (PF001, or the holder's release found
    /// it held nothing): someone else may hold it now. The reason is what the server's lease_status
    /// said then (`SessionEnded` also for a session-bound lease whose session this client lost).
    Lost(LossReason),
    /// The local deadline passed without a renewal: the server may still count it as held, but its
    /// holder cannot know, so it must stop as if lost (its reason `LossReason::Unreachable`). Also a
    /// lease whose holder's release got no answer: it may stay live until its TTL. A release that
    /// gets an answer says what became of it: `Released` when it was still live, else `Lost`.
    Unknown,
    /// Ended by its holder (`release`, or the HeldLease dropped): the server said so.
    Released,
}

impl LeaseState {
    /// Why the lease was lost: the reason of `Lost`, `Unreachable` for `Unknown`; None while held
    /// and once released.
    pub fn reason(&self) -> Option<LossReason> {
        match self {
            LeaseState::Lost(reason) => Some(*reason),
            LeaseState::Unknown => Some(LossReason::Unreachable),
            LeaseState::Held { .. } | LeaseState::Released => None,
        }
    }
}

pub type OnLost = Arc<dyn Fn(LeaseState) + Send + Sync>;

/// How `hold` keeps the lease.
#[derive(Clone)]
pub struct KeepOptions {
    /// How often to renew; ttl / 3 by default, so that two renewals in a row can fail and a third
    /// still has time before the deadline. Must be above zero and below ttl less the margin
    /// (`Error::Config` otherwise).
    pub renew_every: Option<Duration>,
    /// Backoff between failed tries, of the acquire, a renewal and the release.
    pub retry: Backoff,
    /// Taken off the local deadline, so that the holder is told before the server's expiry rather
    /// than just after: it covers the milliseconds telling takes, and clocks (this host's and the
    /// server's) that run at rates up to 0.1 % apart. By default max(ttl / 1000, min(ttl / 50,
    /// 100 ms)): 100 ms for TTLs from 5 s to 100 s, 0.1 % of longer ones.
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
    /// from a later instant (if the clocks' rates differ by less than the margin covers).
    deadline: Mutex<Stamp>,
    state: watch::Sender<LeaseState>,
    ended: CancellationToken,
    on_lost: Option<OnLost>,
    /// Held around each renewal, and by a hand-off or a proclaim (the elector's `Leadership`), which
    /// must not meet a renewal in flight.
    renewing: Arc<tokio::sync::Mutex<()>>,
    /// Set when the keeper is to stop without releasing: the lease was handed off, or left to expire.
    abandoned: AtomicBool,
    /// Wakes the keeper to renew now: a guard found the fence stale, so the lease is lost whatever
    /// the last renewal said, and the renewal that fails tells why.
    check_now: tokio::sync::Notify,
    /// `KeepOptions::timeout`.
    timeout: Duration,
    /// Set by `expire_at`: on stopping, the keeper moves the expiry there instead of releasing.
    expire_at: Mutex<Option<SystemTime>>,
}

impl Shared {
    fn deadline(&self) -> Stamp {
        *self.deadline.lock().unwrap()
    }

    fn renewed(&self, sent: Stamp, fence: i64, expires_at: SystemTime) {
        *self.deadline.lock().unwrap() = sent + self.span;
        self.state.send_replace(LeaseState::Held { fence, expires_at });
    }

    /// Moves a held lease to Lost or Unknown, which `on_lost` hears of.
    fn end(&self, end: LeaseState) {
        if self.move_to(end, |state| matches!(state, LeaseState::Held { .. })) {
            if let Some(callback) = &self.on_lost {
                callback(end);
            }
        }
    }

    /// Takes the outcome of the holder's release: Released only when the server said the release
    /// ended the lease, Lost when it said the token no longer held it (for the reason `ended` gives,
    /// lease_status's after that answer: Released when an earlier try of this release ended it and
    /// its answer was lost), Unknown when no answer came (the lease may stay live until its TTL); a
    /// lease already Unknown moves on only on an answer. `on_lost` is not called: the holder has
    /// stopped using the lease.
    fn released(&self, answer: &Result<bool, Error>, ended: Option<Ended>) {
        let end = match (answer, ended) {
            (Ok(true), _) | (Ok(false), Some(Ended::Released)) => LeaseState::Released,
            (Ok(false), _) => LeaseState::Lost(ended.map_or(LossReason::Unknown, Ended::loss)),
            (Err(_), _) => LeaseState::Unknown,
        };
        self.move_to(end, |state| matches!(state, LeaseState::Held { .. } | LeaseState::Unknown));
    }

    /// Moves to `end` from a state `from` accepts; whether it moved. Ended either way.
    fn move_to(&self, end: LeaseState, from: impl Fn(&LeaseState) -> bool) -> bool {
        let moved = self.state.send_if_modified(|state| {
            let moves = from(state) && *state != end;
            if moves {
                *state = end;
            }
            moves
        });
        self.ended.cancel();
        moved
    }

    /// The state, by the deadline as much as by the keeper: the keeper may not have run yet.
    fn current(&self) -> LeaseState {
        let state = *self.state.borrow();
        match state {
            LeaseState::Held { .. } if self.deadline().passed() => LeaseState::Unknown,
            _ => state,
        }
    }
}

/// A lease (`HeldLease`, from `hold`) or a lease set (`HeldLeaseSet`, from `hold_all`) kept alive
/// in the background. Check `is_held()` before each step of the work, or stop the work when `lost()`
/// returns (or `lost_token()` is cancelled), and guard every write with the fence. Dropping it stops
/// the keeper, which then releases the lease in the background.
pub struct Held<T> {
    lease: T,
    shared: Arc<Shared>,
    stop: CancellationToken,
    task: Option<JoinHandle<Result<bool, Error>>>,
}

/// A lease kept alive by `hold`.
pub type HeldLease = Held<Lease>;

/// A lease set kept alive by `hold_all`: renewed in one call for the whole set, lost as a whole when
/// any of its leases is (`LeaseState::Lost`), released as a whole. Its `LeaseState::Held` carries
/// the fence of its first key (in key order); `fence(key)` gives each key's.
pub type HeldLeaseSet = Held<LeaseSet>;

impl Held<Lease> {
    pub fn lease(&self) -> &Lease {
        &self.lease
    }

    pub fn fence(&self) -> i64 {
        self.lease.fence
    }

    /// `lease::fence_guard` under this lease's fence, in the caller's transaction on `client`. Once
    /// the lease is not held, `Error::LeaseLost` (with the reason) and nothing is sent. When the
    /// server refuses the fence (`Error::StaleFence`) the lease is not held, whatever the last
    /// renewal said: the keeper asks at once, and by the time this returns the lease is Lost with
    /// its reason and `on_lost` told (unless the server cannot say within `KeepOptions::timeout`).
    pub async fn guard(&self, client: &impl GenericClient) -> Result<(), Error> {
        let state = self.state();
        if !matches!(state, LeaseState::Held { .. }) {
            return Err(Error::LeaseLost { key: self.lease.key.clone(), reason: state.reason() });
        }
        let guarded = lease::fence_guard(client, &self.lease.key, self.lease.fence).await;
        if let Err(Error::StaleFence { .. }) = guarded {
            self.shared.check_now.notify_one();
            timeout(self.shared.timeout, self.shared.ended.cancelled()).await.ok();
        }
        guarded
    }
}

impl Held<LeaseSet> {
    pub fn lease_set(&self) -> &LeaseSet {
        &self.lease
    }

    pub fn keys(&self) -> Vec<&str> {
        self.lease.keys()
    }

    /// The fence of the set's lease on `key`, to guard writes under it; None for a key outside the set.
    pub fn fence(&self, key: &str) -> Option<i64> {
        self.lease.fence(key)
    }
}

impl Held<Lease> {
    /// Stops the keeper and, instead of releasing, leaves the lease to expire at `at` by the server's
    /// clock (ShedLock's lockAtLeastFor: a job started by the same schedule on hosts whose clocks
    /// differ runs at most once per period). Released as `release` does when `at` has passed by the
    /// server's clock. True when the server said the lease ends then (or the release ended it);
    /// the state ends Unknown then, as the lease stays live until `at`.
    pub async fn expire_at(self, at: SystemTime) -> Result<bool, Error> {
        *self.shared.expire_at.lock().unwrap() = Some(at);
        self.release().await
    }
}

impl<T> Held<T> {
    /// False once the local deadline has passed without a renewal, whether or not the keeper task
    /// has run since. Judged by CLOCK_BOOTTIME on Linux, so a suspend of this host counts.
    pub fn is_held(&self) -> bool {
        matches!(self.shared.current(), LeaseState::Held { .. })
    }

    pub fn state(&self) -> LeaseState {
        self.shared.current()
    }

    /// The local deadline now: the lease is known to be held until then. An `Instant` does not
    /// count a suspend, so this is now plus the time left by the clock `is_held` judges by.
    pub fn deadline(&self) -> Instant {
        Instant::now() + self.shared.deadline().left()
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

    /// The lock each renewal holds.
    pub(crate) fn renewing(&self) -> Arc<tokio::sync::Mutex<()>> {
        self.shared.renewing.clone()
    }

    /// Stops the keeper without releasing: the lease ended by the holder's own hand-off (Released),
    /// or is left to expire at its TTL (Unknown). `on_lost` is not called.
    pub(crate) fn abandon(&self, end: LeaseState) {
        self.shared.abandoned.store(true, Ordering::SeqCst);
        self.shared.move_to(end, |state| matches!(state, LeaseState::Held { .. }));
        self.stop.cancel();
    }

    /// The server said the lease is not held (for `reason`): Lost, told as the keeper tells it.
    pub(crate) fn lost_for(&self, reason: LossReason) {
        self.shared.end(LeaseState::Lost(reason));
    }

    /// Stops the keeper and releases the lease, on a new connection if its own broke: true when the
    /// server said the release ended it (for a set: every one of its leases). Bounded by
    /// `KeepOptions::timeout`: when the server cannot be reached, `OutcomeUnknown` (the TTL ends it).
    /// The state (see `watch`) ends Released only when the server said so: Lost when the token no
    /// longer held the lease (or one of the set's), Unknown with no answer.
    pub async fn release(mut self) -> Result<bool, Error> {
        self.stop.cancel();
        let task = self.task.take().expect("the keeper task is taken only here");
        task.await.unwrap_or_else(|join| Err(Error::OutcomeUnknown(Box::new(join))))
    }
}

impl<T> Drop for Held<T> {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Acquires `key` (waiting up to `opts.wait`; `Error::WaitTimedOut` when it is not granted) and
/// keeps it: a task renews it every `renew_every` on its own connection from `connector`, retrying
/// failed renewals with backoff, and declares it `Unknown` when the local deadline passes without
/// a renewal, even if a renewal is still hanging. `opts.shared` and `opts.permits` keep a shared
/// lease or a semaphore's permit the same way.
pub async fn hold<C: Connector>(
    connector: C,
    key: &str,
    opts: &AcquireOptions,
    keep: KeepOptions,
) -> Result<HeldLease, Error> {
    opts.check()?;
    let opts = opts.with_token();
    let timing = Timing::of(&opts, &keep)?;
    let client = FenceClient::with_backoff(connector, keep.retry.clone()).call_timeout(keep.timeout);
    // Taken before the first try: whichever try granted the lease was sent after it.
    let sent = Stamp::now();
    let granted = match opts.session_bound {
        true => client.acquire_session_bound(key, &opts).await?.map(|(lease, conn)| (lease, Some(conn))),
        false => client.acquire(key, &opts).await?.map(|lease| (lease, None)),
    };
    let (lease, bound) = granted.ok_or_else(|| Error::WaitTimedOut { key: key.to_owned() })?;
    let kept = Kept::One(lease.clone());
    start(Keeper::new(client, kept, bound, None, timing, &keep, sent), sent, &keep, lease).await
}

impl<C: Connector> FenceClient<C> {
    /// Acquires `key` as `hold` does, through this client's connection (its calls' retries and
    /// timeout), and keeps it with the client's keeper: its renewals go with the other leases' due
    /// then, in one call on one of the keeper's `keeper_connections` connections, however many
    /// leases the client keeps. Each lease keeps its own local deadline and is told its own loss,
    /// as with `hold`. A session-bound lease keeps a connection of its own (the session is the
    /// lease). If the caller gives the acquire up once it may have been sent (drops the future, a
    /// timeout) or it fails with its outcome unknown, the keeper releases the token it carried, so
    /// that a grant whose reply never came does not hold the key until its TTL.
    pub async fn hold(
        &self,
        key: &str,
        opts: &AcquireOptions,
        keep: KeepOptions,
    ) -> Result<HeldLease, Error> {
        match opts.session_bound {
            true => hold_kept_by(&self.sibling(), self, key, opts, keep).await,
            false => hold_kept_by(self, self, key, opts, keep).await,
        }
    }

    /// `hold_first_free`, through this client and kept by its keeper (see `hold`).
    pub async fn hold_first_free<K: AsRef<str> + Sync>(
        &self,
        keys: &[K],
        opts: &AcquireOptions,
        keep: KeepOptions,
    ) -> Result<Option<HeldLease>, Error> {
        if opts.session_bound {
            return Err(Error::Config("hold_first_free keeps a plain lease, not a session-bound one".into()));
        }
        let opts = opts.with_token();
        let timing = Timing::of(&opts, &keep)?;
        let keeper = self.keeper();
        keeper.open(self.try_timeout()).await;
        let sent = Stamp::now();
        let granted = self.acquire_any(keys, &opts).await?;
        let Some(lease) = granted else { return Ok(None) };
        let kept = Kept::One(lease.clone());
        let keeping = Keeper::new(self.sibling(), kept, None, Some(keeper), timing, &keep, sent);
        start(keeping, sent, &keep, lease).await.map(Some)
    }

    /// `hold_all`, through this client and kept by its keeper: the set is renewed with
    /// `lease_renew_all` on the keeper's connections (a session-bound set on a connection of its
    /// own). The set's token is the server's, so a set whose reply was lost cannot be released by
    /// it: it ends at its TTL.
    pub async fn hold_all<K: AsRef<str> + Sync>(
        &self,
        keys: &[K],
        opts: &AcquireOptions,
        keep: KeepOptions,
    ) -> Result<HeldLeaseSet, Error> {
        opts.check_for_set()?;
        let timing = Timing::of(opts, &keep)?;
        let keeper = self.keeper();
        keeper.open(self.try_timeout()).await;
        let own = self.sibling();
        let through = if opts.session_bound { &own } else { self };
        let sent = Stamp::now();
        let granted = through.acquire_all_on(keys, opts).await?;
        let label = || keys.iter().map(AsRef::as_ref).collect::<Vec<_>>().join(", ");
        let (set, conn) = granted.ok_or_else(|| Error::WaitTimedOut { key: label() })?;
        let (bound, keeper) = match opts.session_bound {
            true => (Some(conn), None),
            false => (None, Some(keeper)),
        };
        let kept = Kept::Set(set.clone());
        start(Keeper::new(own, kept, bound, keeper, timing, &keep, sent), sent, &keep, set).await
    }
}

/// `hold`, the lease acquired through `acquirer` and kept by `keeper`'s keeper (a session-bound one
/// on the connection that took it): `FenceClient::hold`, and an elector's campaign, whose acquire
/// goes through connections it can cancel.
pub(crate) async fn hold_kept_by<A, K>(
    acquirer: &FenceClient<A>,
    keeper: &FenceClient<K>,
    key: &str,
    opts: &AcquireOptions,
    keep: KeepOptions,
) -> Result<HeldLease, Error>
where
    A: Connector<Conn = K::Conn>,
    K: Connector,
{
    opts.check()?;
    let opts = opts.with_token();
    let timing = Timing::of(&opts, &keep)?;
    let renewer = keeper.keeper();
    renewer.open(keeper.try_timeout()).await;
    let sent = Stamp::now();
    if opts.session_bound {
        let granted = acquirer.acquire_session_bound(key, &opts).await?;
        let (lease, bound) = granted.ok_or_else(|| Error::WaitTimedOut { key: key.to_owned() })?;
        let kept = Kept::One(lease.clone());
        let keeping = Keeper::new(keeper.sibling(), kept, Some(bound), None, timing, &keep, sent);
        return start(keeping, sent, &keep, lease).await;
    }
    // Given up (dropped) while it may have been granted, `acquire` releases its token.
    let granted = acquirer.acquire(key, &opts).await?;
    let lease = granted.ok_or_else(|| Error::WaitTimedOut { key: key.to_owned() })?;
    let kept = Kept::One(lease.clone());
    let keeping = Keeper::new(keeper.sibling(), kept, None, Some(renewer), timing, &keep, sent);
    start(keeping, sent, &keep, lease).await
}

/// Takes the first free key of `keys`, in order, in one round trip (`lease::acquire_any`, as SKIP
/// LOCKED takes the first unlocked row) and keeps it as `hold` does: None when none is free (it never
/// waits). For worker pools: "the next free item" without a loop of refused `hold`s. The lease is
/// exclusive and not session-bound (`Error::Config` otherwise).
pub async fn hold_first_free<C: Connector, K: AsRef<str> + Sync>(
    connector: C,
    keys: &[K],
    opts: &AcquireOptions,
    keep: KeepOptions,
) -> Result<Option<HeldLease>, Error> {
    if opts.session_bound {
        return Err(Error::Config("hold_first_free keeps a plain lease, not a session-bound one".into()));
    }
    let opts = opts.with_token();
    let timing = Timing::of(&opts, &keep)?;
    let client = FenceClient::with_backoff(connector, keep.retry.clone()).call_timeout(keep.timeout);
    let sent = Stamp::now();
    let Some(lease) = client.acquire_any(keys, &opts).await? else { return Ok(None) };
    let kept = Kept::One(lease.clone());
    start(Keeper::new(client, kept, None, None, timing, &keep, sent), sent, &keep, lease).await.map(Some)
}

/// As `hold`, for every key of `keys` or none (`lease::acquire_all`): one lease per key, kept as a
/// set, renewed with `lease_renew_all` in one call per renewal, released with `lease_release_all`.
/// `Error::WaitTimedOut` (its key the keys, comma-separated) when the set is not granted within
/// `opts.wait`. The acquire is not retried once a try may have been granted (it takes no token):
/// `Error::OutcomeUnknown` then, and the set, if granted, ends at its TTL.
pub async fn hold_all<C: Connector, K: AsRef<str> + Sync>(
    connector: C,
    keys: &[K],
    opts: &AcquireOptions,
    keep: KeepOptions,
) -> Result<HeldLeaseSet, Error> {
    opts.check_for_set()?;
    let timing = Timing::of(opts, &keep)?;
    let client = FenceClient::with_backoff(connector, keep.retry.clone()).call_timeout(keep.timeout);
    let sent = Stamp::now();
    let granted = client.acquire_all_on(keys, opts).await?;
    let label = || keys.iter().map(AsRef::as_ref).collect::<Vec<_>>().join(", ");
    let (set, conn) = granted.ok_or_else(|| Error::WaitTimedOut { key: label() })?;
    // A session-bound set lives with the session that took it; a plain one is renewed on any.
    let bound = opts.session_bound.then_some(conn);
    let kept = Kept::Set(set.clone());
    start(Keeper::new(client, kept, bound, None, timing, &keep, sent), sent, &keep, set).await
}

/// How often a keeper renews, and its deadline's span (ttl less the margin).
struct Timing {
    ttl: Duration,
    span: Duration,
    every: Duration,
}

impl Timing {
    /// `Error::Config` for a renew_every that leaves no time to renew.
    fn of(opts: &AcquireOptions, keep: &KeepOptions) -> Result<Timing, Error> {
        let span = opts.ttl.saturating_sub(keep.margin.unwrap_or(default_margin(opts.ttl)));
        let every = keep.renew_every.unwrap_or(opts.ttl / 3);
        if every.is_zero() || every >= span {
            let why =
                format!("renew_every {every:?} must be above zero and below ttl less the margin, {span:?}");
            return Err(Error::Config(why));
        }
        Ok(Timing { ttl: opts.ttl, span, every })
    }
}

/// Starts the keeper of what was granted after `sent`, and hands `granted` to the holder.
async fn start<C: Connector, T>(
    keeper: Keeper<C>,
    sent: Stamp,
    keep: &KeepOptions,
    granted: T,
) -> Result<Held<T>, Error> {
    // A long wait, or retries, may have used up the margin that `sent` leaves: renew at once.
    if sent.elapsed() >= keeper.every {
        let renewed = timeout(keep.timeout, keeper.try_renew(keep.timeout)).await;
        match renewed.map_err(|elapsed| Error::OutcomeUnknown(Box::new(elapsed))).and_then(|tried| tried) {
            Ok((sent, expires_at)) => keeper.shared.renewed(sent, keeper.kept.fence(), expires_at),
            Err(err) => {
                // The lease may be live, and the caller never gets its token: free the key, on a
                // new connection (this one may hang).
                keeper.client.forget().await;
                keeper.release().await.ok();
                return Err(err);
            }
        }
    }
    let shared = keeper.shared.clone();
    let stop = CancellationToken::new();
    let task = tokio::spawn(keeper.run(stop.clone()));
    Ok(Held { lease: granted, shared, stop, task: Some(task) })
}

/// What a keeper keeps.
#[derive(Debug, Clone)]
enum Kept {
    One(Lease),
    Set(LeaseSet),
}

impl Kept {
    /// The fence `LeaseState::Held` carries: the lease's, or the set's first.
    fn fence(&self) -> i64 {
        match self {
            Kept::One(lease) => lease.fence,
            Kept::Set(set) => set.leases[0].fence,
        }
    }

    fn expires_at(&self) -> SystemTime {
        match self {
            Kept::One(lease) => lease.expires_at,
            Kept::Set(set) => set.expires_at(),
        }
    }

    async fn renew(&self, client: &impl GenericClient, ttl: Duration) -> Result<SystemTime, Error> {
        match self {
            Kept::One(lease) => lease::renew(client, lease, ttl).await,
            Kept::Set(set) => lease::renew_all(client, set, ttl).await,
        }
    }

    /// Whether the release on `client` ended it: the lease, or every lease of the set.
    async fn release_on(&self, client: &impl GenericClient) -> Result<bool, Error> {
        match self {
            Kept::One(lease) => lease::release(client, lease).await,
            Kept::Set(set) => Ok(lease::release_all(client, set).await? as usize == set.leases.len()),
        }
    }

    /// Whether the release ended it: the lease, or every lease of the set.
    async fn release<C: Connector>(&self, client: &FenceClient<C>) -> Result<bool, Error> {
        match self {
            Kept::One(lease) => client.release(lease).await,
            Kept::Set(set) => Ok(client.release_all(set).await? as usize == set.leases.len()),
        }
    }

    /// How the server says it ended (the first of the set's leases that did); None while live.
    async fn ended(&self, client: &impl GenericClient) -> Result<Option<Ended>, Error> {
        match self {
            Kept::One(lease) => lease::ended(client, &[&lease.key], lease.token, lease.durable).await,
            Kept::Set(set) => lease::ended(client, &set.keys(), set.token, set.leases[0].durable).await,
        }
    }
}

/// See `KeepOptions::margin`.
fn default_margin(ttl: Duration) -> Duration {
    (ttl / 1000).max((ttl / 50).min(Duration::from_millis(100)))
}

struct Keeper<C: Connector> {
    client: FenceClient<C>,
    kept: Kept,
    every: Duration,
    /// A session-bound lease's connection: the lease lives with its session, so it is renewed there
    /// or not at all. None for a plain lease, renewed on any connection.
    bound: Option<Arc<C::Conn>>,
    /// The client's keeper, for a lease kept by `FenceClient::hold`: its renewals, release and
    /// questions go on the keeper's connections. None for `hold`'s lease, kept on a connection of
    /// its own, and for a session-bound lease.
    renewer: Option<Arc<Renewer<C>>>,
    retry: Backoff,
    timeout: Duration,
    shared: Arc<Shared>,
}

impl<C: Connector> Keeper<C> {
    /// The keeper of what was granted by a try sent no earlier than `sent`.
    fn new(
        client: FenceClient<C>,
        kept: Kept,
        bound: Option<Arc<C::Conn>>,
        renewer: Option<Arc<Renewer<C>>>,
        timing: Timing,
        keep: &KeepOptions,
        sent: Stamp,
    ) -> Self {
        let (state, _) =
            watch::channel(LeaseState::Held { fence: kept.fence(), expires_at: kept.expires_at() });
        let shared = Arc::new(Shared {
            ttl: timing.ttl,
            span: timing.span,
            deadline: Mutex::new(sent + timing.span),
            state,
            ended: CancellationToken::new(),
            on_lost: keep.on_lost.clone(),
            renewing: Arc::new(tokio::sync::Mutex::new(())),
            abandoned: AtomicBool::new(false),
            check_now: tokio::sync::Notify::new(),
            timeout: keep.timeout,
            expire_at: Mutex::new(None),
        });
        Keeper {
            client,
            kept,
            every: timing.every,
            bound,
            renewer,
            retry: keep.retry.clone(),
            timeout: keep.timeout,
            shared,
        }
    }

    async fn run(self, stop: CancellationToken) -> Result<bool, Error> {
        let ended = tokio::select! {
            _ = stop.cancelled() => None,
            end = self.renew_until_ended() => Some(end),
        };
        if let Some(end) = ended {
            self.shared.end(end);
            if matches!(end, LeaseState::Lost(_)) {
                // A session-bound lease is Lost also when its connection broke on this side only:
                // its backend may live on, holding the key, until the server notices. A set is Lost
                // when one of its leases is: the others are held for nothing. Harmless otherwise: a
                // token that holds nothing releases nothing.
                if self.bound.is_some() || matches!(self.kept, Kept::Set(_)) {
                    self.release().await.ok();
                }
                stop.cancelled().await;
                return Ok(false);
            }
            stop.cancelled().await;
        }
        if self.shared.abandoned.load(Ordering::SeqCst) {
            return Ok(false);
        }
        let expire_at = *self.shared.expire_at.lock().unwrap();
        if let (Some(at), Kept::One(lease)) = (expire_at, &self.kept) {
            let moved = match &self.renewer {
                Some(keeper) => {
                    let renew_to =
                        |conn: Arc<C::Conn>| async move { lease::renew_to(&**conn, lease, at).await };
                    Ok(keeper.call_retrying(self.timeout, self.timeout, renew_to).await)
                }
                None => {
                    timeout(self.timeout, async {
                        lease::renew_to(&**self.client.connection().await?, lease, at).await
                    })
                    .await
                }
            };
            // Live until `at` (or, without an answer, until its last expiry): Unknown either way.
            let held = |state: &LeaseState| matches!(state, LeaseState::Held { .. });
            match moved.unwrap_or_else(|elapsed| Err(Error::OutcomeUnknown(Box::new(elapsed)))) {
                Ok(Some(_)) => {
                    self.shared.move_to(LeaseState::Unknown, held);
                    return Ok(true);
                }
                Ok(None) => {}
                Err(err) => {
                    self.shared.move_to(LeaseState::Unknown, held);
                    return Err(err);
                }
            }
        }
        // Unknown or still held: the lease may be live, and releasing it frees the key at once.
        let released = self.release().await;
        let ended = match released {
            Ok(false) => self.ended(self.timeout).await,
            _ => None,
        };
        self.shared.released(&released, ended);
        released
    }

    /// How the server says the lease ended, asked on a working connection within `limit`; None when
    /// it is live or no answer came.
    async fn ended(&self, limit: Duration) -> Option<Ended> {
        if let Some(keeper) = &self.renewer {
            let ask = |conn: Arc<C::Conn>| async move { self.kept.ended(&**conn).await };
            return keeper.call(limit, ask).await.ok().flatten();
        }
        let ask = async { self.kept.ended(&**self.client.connection().await?).await };
        timeout(limit, ask).await.ok().and_then(Result::ok).flatten()
    }

    /// Releases by token on a working connection, bounded by the timeout.
    async fn release(&self) -> Result<bool, Error> {
        if let Some(keeper) = &self.renewer {
            let release = |conn: Arc<C::Conn>| async move { self.kept.release_on(&**conn).await };
            // Each try bounded as a renewal is, so that a hung keeper connection is left in time.
            return keeper.call_retrying(self.timeout, self.every.min(self.timeout), release).await;
        }
        let released = timeout(self.timeout, self.kept.release(&self.client)).await;
        released.unwrap_or_else(|elapsed| Err(Error::OutcomeUnknown(Box::new(elapsed))))
    }

    async fn renew_until_ended(&self) -> LeaseState {
        loop {
            let deadline = self.shared.deadline();
            self.pause_until((deadline - self.shared.span).at + self.every).await;
            // The deadline bounds the renewal from outside, so it fires even while a call hangs.
            // Tokio's timers stop during a suspend, so the time left is asked of the boot clock,
            // and a renewal answered once the deadline passed by it comes too late.
            let bound = Instant::now() + deadline.left();
            match timeout_at(bound.into(), self.renew_until_answered(deadline)).await {
                Ok(Ok((sent, expires_at))) if !deadline.passed() => {
                    self.shared.renewed(sent, self.kept.fence(), expires_at)
                }
                Ok(Err(otherwise)) => {
                    // Told one statement later, with the reason.
                    let ended = self.ended(self.every.min(self.timeout)).await;
                    return LeaseState::Lost(ended.map_or(otherwise, Ended::loss));
                }
                _ => {
                    self.client.forget().await;
                    return LeaseState::Unknown;
                }
            }
        }
    }

    /// Sleeps until `due`, until a guard found the fence stale, or until a session-bound lease's
    /// connection closes: the lease has ended with its session then (or lives on in an orphaned
    /// backend). The renewal that follows at once turns either into Lost.
    async fn pause_until(&self, due: Instant) {
        let closed = self.bound.as_deref().and_then(C::closed);
        let session_closed = async {
            match &closed {
                Some(closed) => closed.cancelled().await,
                None => std::future::pending().await,
            }
        };
        // Kept by the client's keeper: due on its grid, so that leases due together are sent together.
        let due = if self.renewer.is_some() { renewer::on_grid(due) } else { due };
        tokio::select! {
            _ = sleep_until(due.into()) => {}
            _ = self.shared.check_now.notified() => {}
            _ = session_closed => {}
        }
    }

    /// Tries until the server answers: Ok((sent, new expiry)), or Err when the lease is lost: PF001,
    /// or a session-bound lease whose connection failed (the reason unless the server says more:
    /// Unknown, or SessionEnded, as the session holding it is gone or out of reach).
    async fn renew_until_answered(&self, deadline: Stamp) -> Result<(Stamp, SystemTime), LossReason> {
        let mut retry = 0;
        loop {
            let left = deadline.left();
            // A try that hangs is abandoned in time for another on a new connection, but for a
            // session-bound lease, which would end with its connection.
            let limit = if self.bound.is_some() { left } else { self.every.min(left) };
            let renewing = self.shared.renewing.lock().await;
            let held = matches!(*self.shared.state.borrow(), LeaseState::Held { .. });
            let tried = if held { Some(timeout(limit, self.try_renew(limit)).await) } else { None };
            drop(renewing);
            // Handed off, or declared lost by a proclaim, meanwhile: the stop follows.
            let Some(tried) = tried else { return std::future::pending().await };
            match tried {
                Ok(Ok(renewed)) => return Ok(renewed),
                Ok(Err(Error::LeaseLost { .. })) => return Err(LossReason::Unknown),
                // A session-bound lease cannot move to another connection: once its own broke (or
                // may have), the session holding it is gone or out of reach.
                Ok(Err(err))
                    if self.bound.is_some() && (err.may_have_taken_effect() || self.bound_closed()) =>
                {
                    self.client.forget().await;
                    return Err(LossReason::SessionEnded);
                }
                Ok(Err(_)) => {}
                Err(_) => self.client.forget().await,
            }
            sleep(self.retry.delay(retry)).await;
            retry = retry.saturating_add(1);
        }
    }

    fn bound_closed(&self) -> bool {
        self.bound.as_ref().is_some_and(|conn| conn.is_closed())
    }

    /// One renewal, under a statement_timeout that ends it on the server by the time it is
    /// abandoned here, so that a stuck renewal does not keep holding the key's lock. The timeout is
    /// reset in the same round trip (the three statements are pipelined), so the connection, which
    /// may go back to a pool, does not keep it.
    async fn try_renew(&self, limit: Duration) -> Result<(Stamp, SystemTime), Error> {
        if let Some(keeper) = &self.renewer {
            return match &self.kept {
                Kept::One(lease) => {
                    let (sent, renewed) = keeper.renew(lease, self.shared.ttl, limit).await?;
                    let lost = || Error::LeaseLost { key: lease.key.clone(), reason: None };
                    Ok((sent, renewed.ok_or_else(lost)?))
                }
                Kept::Set(set) => {
                    let renew = |conn: Arc<C::Conn>| async move {
                        let sent = Stamp::now();
                        let renewed = lease::renew_all(&**conn, set, self.shared.ttl);
                        Ok((sent, renewer::bounded(&conn, limit, renewed).await?))
                    };
                    keeper.call(limit, renew).await
                }
            };
        }
        let conn = match &self.bound {
            Some(conn) if conn.is_closed() => {
                return Err(Error::OutcomeUnknown("the lease's session closed".into()))
            }
            Some(conn) => conn.clone(),
            None => self.client.connection().await?,
        };
        let sent = Stamp::now();
        let expires_at = renewer::bounded(&conn, limit, self.kept.renew(&**conn, self.shared.ttl)).await?;
        Ok((sent, expires_at))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_margin_is_100ms_or_a_thousandth_of_long_ttls() {
        let margin = |secs: f64| default_margin(Duration::from_secs_f64(secs));
        assert_eq!(margin(1.0), Duration::from_millis(20));
        assert_eq!(margin(30.0), Duration::from_millis(100));
        assert_eq!(margin(3600.0), Duration::from_millis(3600), "0.1 % of an hour");
    }

    #[test]
    fn the_deadline_is_judged_by_the_boot_clock() {
        let shared = Shared {
            ttl: Duration::from_secs(30),
            span: Duration::from_secs(30),
            deadline: Mutex::new(Stamp::now() + Duration::from_secs(30)),
            state: watch::channel(LeaseState::Held { fence: 1, expires_at: SystemTime::now() }).0,
            ended: CancellationToken::new(),
            on_lost: None,
            renewing: Default::default(),
            abandoned: AtomicBool::new(false),
            check_now: Default::default(),
            timeout: Duration::from_secs(10),
            expire_at: Mutex::new(None),
        };
        assert!(matches!(shared.current(), LeaseState::Held { .. }));
        // As after a suspend of a minute: CLOCK_MONOTONIC (and so `at`) did not move, boot time did.
        let suspended = shared.deadline().after_suspend(Duration::from_secs(60));
        *shared.deadline.lock().unwrap() = suspended;
        assert_eq!(shared.current(), LeaseState::Unknown);
    }
}
