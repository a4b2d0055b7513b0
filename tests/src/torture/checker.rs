//! The history checker: pg_fence's invariants, judged on what the server recorded (see
//! `recording`), plus "nothing acknowledged was lost", judged against what clients were told.
//!
//! A key has a holder per row, (key, slot) in either lease table: an exclusive lease in slot 0, a
//! semaphore's permits in slots 0 .. N-1, shared leases in any slot (see src/leases/state/slots.rs). Per
//! key, the recorded lease changes and writes are walked in commit order:
//! - invariant 1: each grant's fence is above every earlier grant's of the key, in every slot and
//!   mode (so no fence is granted twice);
//! - invariant 3: no write under F committed after a grant that replaced F (nor before F was
//!   granted). A grant replaces F when it could not be made while F was live, so it had to wait
//!   for F's writers: a grant into F's slot, a grant of the other side of shared and non-shared, or
//!   beside an exclusive lease. Shared leases never replace each other, nor do permits of other
//!   slots (a grant of another count beside a live permit waits for no writer of it);
//! - invariant 4: a renewal or release changed only its row's current lease, and only its holder's
//!   (a grant may mark another row's expired lease ended, which moves its end nowhere).
//!
//! Then invariant 2, on the intervals of the key's leases by the server's clock, from acquired_at
//! to the last `expires_at` recorded for the fence (a renewal moves it later, a release or revoke
//! to the moment the lease ended; a release lost in a crash left no record, so the lease's end is
//! what the server kept, which is what its clock had to respect): at no instant is a shared lease
//! live beside a non-shared one, nor are more non-shared leases live than the smallest `permits`
//! among them (for exclusive leases: two at once). A restart or a failover ends a fast lease.
//!
//! Then against the clients' acknowledgements: every acknowledged grant is recorded with the same
//! fence, acquired_at (a fence handed out again after a crash would show another acquired_at) and
//! mode, every acknowledged renewal is recorded, and every acknowledged write is in the audit
//! history. Calls with an unknown outcome are not checked either way.
//!
//! Commit timestamps are taken before a transaction releases its locks, and pg_fence serializes
//! the changes of a key (and a grant against fenced writes) with a lock, so causally ordered
//! changes have ordered timestamps. Equal timestamps (microseconds) are ordered in the way that
//! cannot raise a false alarm: lower fence first, and a grant before the writes under it.
use super::recording::{History, LeaseChange, LeaseChangeKind, RecordedWrite};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;

/// A grant the client saw committed.
#[derive(Clone, Debug)]
pub struct AckedGrant {
    pub key: String,
    pub fence: i64,
    pub acquired_us: i64,
    /// false for a fast lease, which a crash may take with its record.
    pub durable: bool,
    /// The mode the client asked for (a lease set's leases are exclusive: not shared, 1 permit).
    pub shared: bool,
    pub permits: i32,
}

/// A renewal the client saw committed, with the new expires_at it returned.
#[derive(Clone, Debug)]
pub struct AckedRenewal {
    pub key: String,
    pub fence: i64,
    pub expires_us: i64,
    /// lease_renew_all returns the earliest new expiry of its keys: this key's is at least that.
    pub at_least: bool,
}

/// A release that returned true.
#[derive(Clone, Debug)]
pub struct AckedRelease {
    pub key: String,
    pub fence: i64,
}

/// A fenced write the client saw committed.
#[derive(Clone, Debug)]
pub struct AckedWrite {
    pub key: String,
    pub fence: i64,
    pub write_id: i64,
}

/// Everything clients were told succeeded, and what they saw that broke invariant 4 directly.
#[derive(Clone, Debug, Default)]
pub struct Acknowledged {
    pub grants: Vec<AckedGrant>,
    pub renewals: Vec<AckedRenewal>,
    pub releases: Vec<AckedRelease>,
    pub writes: Vec<AckedWrite>,
    /// A release that returned true for a lease the client had already been told was lost or stale.
    pub stale_releases_accepted: Vec<String>,
}

impl Acknowledged {
    pub fn extend(&mut self, other: Acknowledged) {
        self.grants.extend(other.grants);
        self.renewals.extend(other.renewals);
        self.releases.extend(other.releases);
        self.writes.extend(other.writes);
        self.stale_releases_accepted.extend(other.stale_releases_accepted);
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Violation {
    /// Invariant 1: a grant whose fence is not above every earlier grant of its key.
    FenceNotIncreasing,
    /// Invariant 1: an acknowledged grant or renewal missing from the history, or its fence
    /// recorded for another grant (handed out again).
    AcknowledgedLeaseLost,
    /// An acknowledged grant recorded in another mode (shared, permits) than the client asked for.
    WrongMode,
    /// Invariant 2: more non-shared leases of a key live at one instant than the smallest `permits`
    /// among them (two exclusive leases at once, or a semaphore over its count).
    TooManyLive,
    /// Invariant 2: a shared lease live at the same instant as a non-shared lease of its key.
    SharedBesideOther,
    /// Invariant 3: a write under fence F committed after a grant that replaced F, or before F's
    /// grant.
    LateWrite,
    /// Invariant 4: a renewal or release that changed a lease other than the caller's own.
    ForeignChange,
    /// An acknowledged write missing from the audit history (or recorded under another fence).
    LostWrite,
    /// The recording itself: a fence in the lease tables is not a recorded grant.
    IncompleteHistory,
}

/// Violations found, by kind, with a few examples.
#[derive(Debug, Default)]
pub struct Violations {
    pub counts: BTreeMap<Violation, u64>,
    pub examples: Vec<String>,
}

impl Violations {
    pub fn total(&self) -> u64 {
        self.counts.values().sum()
    }

    pub fn of(&self, kind: Violation) -> u64 {
        self.counts.get(&kind).copied().unwrap_or(0)
    }

    fn add(&mut self, kind: Violation, detail: String) {
        *self.counts.entry(kind).or_insert(0) += 1;
        if self.examples.len() < 20 {
            self.examples.push(format!("{kind:?}: {detail}"));
        }
    }
}

impl fmt::Display for Violations {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "  violations {}", self.total())?;
        for (kind, count) in &self.counts {
            writeln!(f, "    {kind:?}: {count}")?;
        }
        for example in &self.examples {
            writeln!(f, "    e.g. {example}")?;
        }
        Ok(())
    }
}

/// Acknowledged durable changes that the history does not have: violations, unless they may have
/// been lost (a failover to an asynchronous standby that had not received them).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Lost {
    pub grants: u64,
    pub renewals: u64,
    pub writes: u64,
}

/// The most leases of one key the history shows live at one instant, per mode: evidence that the
/// run made holders meet, without which invariant 2 would be checked on nothing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AtOnce {
    /// Shared leases.
    pub shared: usize,
    /// Permits of a semaphore (non-shared leases granted with `permits` above 1).
    pub permits: usize,
}

/// What `check_with` found.
#[derive(Debug, Default)]
pub struct Checked {
    pub violations: Violations,
    pub lost: Lost,
    pub most_at_once: AtOnce,
}

/// Checks the history against the invariants and the acknowledgements.
pub fn check(history: &History, acked: &Acknowledged) -> Violations {
    check_with(history, acked, false).violations
}

/// The same, counting the acknowledged grants, renewals and writes missing from the history; with
/// `may_lose` they are not violations (the history was rolled onto a server that never
/// had them). A lost grant's fence must still never be granted again, and nothing recorded may
/// break the invariants: a lost grant is checked as a fast grant lost in a crash is.
pub fn check_with(history: &History, acked: &Acknowledged, may_lose: bool) -> Checked {
    let mut violations = Violations::default();
    let mut lost = Lost::default();
    let mut most_at_once = AtOnce::default();
    for (key, events) in events_by_key(history) {
        let leases = KeyWalk::new(key, &mut violations).walk(&events);
        let at_once = check_live_at_once(key, &leases, &mut violations);
        most_at_once.shared = most_at_once.shared.max(at_once.shared);
        most_at_once.permits = most_at_once.permits.max(at_once.permits);
    }
    let lose = |count: &mut u64| {
        *count += 1;
        may_lose
    };
    check_acknowledged_grants(history, acked, &mut violations, |_| lose(&mut lost.grants));
    check_acknowledged_renewals(history, acked, &mut violations, |_| lose(&mut lost.renewals));
    check_acknowledged_writes(history, acked, &mut violations, |_| lose(&mut lost.writes));
    check_recording_complete(history, &mut violations);
    for detail in &acked.stale_releases_accepted {
        violations.add(Violation::ForeignChange, detail.clone());
    }
    Checked { violations, lost, most_at_once }
}

/// The (key, fence) of every recorded lease change of this kind.
fn recorded(history: &History, kind: LeaseChangeKind) -> HashSet<(&str, i64)> {
    history
        .leases
        .iter()
        .filter(|change| change.kind == kind)
        .map(|change| (change.key.as_str(), change.fence))
        .collect()
}

/// Acknowledged releases with no recorded end of their lease: lost in a crash (allowed).
pub fn releases_missing(history: &History, acked: &Acknowledged) -> u64 {
    let ended = recorded(history, LeaseChangeKind::End);
    acked.releases.iter().filter(|release| !ended.contains(&(release.key.as_str(), release.fence))).count()
        as u64
}

/// One recorded change of a key, lease or write.
#[derive(Clone, Copy)]
enum Event<'h> {
    Lease(&'h LeaseChange),
    Write(&'h RecordedWrite),
}

impl Event<'_> {
    /// Commit order; ties as explained in the module comment.
    fn order(&self) -> (i64, i64, u8) {
        match self {
            Event::Lease(change) => {
                let rank = match change.kind {
                    LeaseChangeKind::Grant => 0,
                    LeaseChangeKind::Renew => 2,
                    LeaseChangeKind::End => 3,
                };
                (change.committed_us, change.fence, rank)
            }
            Event::Write(write) => (write.committed_us, write.fence, 1),
        }
    }
}

fn events_by_key(history: &History) -> BTreeMap<&str, Vec<Event<'_>>> {
    let mut by_key: BTreeMap<&str, Vec<Event>> = BTreeMap::new();
    for change in &history.leases {
        by_key.entry(&change.key).or_default().push(Event::Lease(change));
    }
    for write in &history.writes {
        by_key.entry(&write.key).or_default().push(Event::Write(write));
    }
    for events in by_key.values_mut() {
        events.sort_by_key(Event::order);
    }
    by_key
}

/// A lease of the key, as the walk has seen it so far.
struct Lease<'h> {
    grant: &'h LeaseChange,
    /// The last expires_at recorded for this fence.
    ends_us: i64,
    /// The fence of the first grant that replaced this lease (see the module comment): every write
    /// under it must have committed before that grant.
    replaced_by: Option<i64>,
}

impl Lease<'_> {
    /// Whether `grant`, committed after this lease's grant, could not be made while this lease was
    /// live, or took its slot: either way pg_fence made it wait for this lease's writers.
    fn is_replaced_by(&self, grant: &LeaseChange) -> bool {
        let held = self.grant;
        if held.shared != grant.shared {
            return true;
        }
        // Shared leases stand beside each other, and take over one another's rows without waiting.
        // Permits of other slots stand beside a permit whatever count each asked for; an exclusive
        // lease stands beside none.
        !held.shared && (held.slot == grant.slot || held.permits.min(grant.permits) < 2)
    }

    /// A fast lease ends with the server that granted it: it is not live beside a lease granted
    /// after it on a restarted (or promoted) server, whose start time differs.
    fn gone_before(&self, later: &LeaseChange) -> bool {
        !self.grant.durable && later.server_start_us != self.grant.server_start_us
    }
}

/// The walk through one key's events in commit order.
struct KeyWalk<'h, 'v> {
    key: &'h str,
    violations: &'v mut Violations,
    /// Every lease of the key, in the commit order of their grants.
    leases: Vec<Lease<'h>>,
    by_fence: HashMap<i64, usize>,
    /// Each row's current lease: (slot, durable) to its index in `leases`.
    rows: HashMap<(i32, bool), usize>,
    /// The leases no grant has replaced yet.
    unreplaced: Vec<usize>,
    highest_fence: Option<i64>,
}

impl<'h, 'v> KeyWalk<'h, 'v> {
    fn new(key: &'h str, violations: &'v mut Violations) -> Self {
        KeyWalk {
            key,
            violations,
            leases: Vec::new(),
            by_fence: HashMap::new(),
            rows: HashMap::new(),
            unreplaced: Vec::new(),
            highest_fence: None,
        }
    }

    /// Walks the events; returns the key's leases, with their ends.
    fn walk(mut self, events: &[Event<'h>]) -> Vec<Lease<'h>> {
        for event in events {
            match *event {
                Event::Lease(change) if change.kind == LeaseChangeKind::Grant => self.grant(change),
                Event::Lease(change) => self.renew_or_end(change),
                Event::Write(write) => self.write(write),
            }
        }
        self.leases
    }

    /// Invariant 1, and which leases the grant replaces (for invariant 3).
    fn grant(&mut self, grant: &'h LeaseChange) {
        let key = self.key;
        if let Some(highest) = self.highest_fence.filter(|highest| grant.fence <= *highest) {
            let detail = format!("{key}: fence {} granted after fence {highest}", grant.fence);
            self.violations.add(Violation::FenceNotIncreasing, detail);
        }
        self.highest_fence = self.highest_fence.max(Some(grant.fence));
        let leases = &mut self.leases;
        self.unreplaced.retain(|&index| {
            let replaced = leases[index].is_replaced_by(grant);
            if replaced {
                leases[index].replaced_by = Some(grant.fence);
            }
            !replaced
        });
        let index = self.leases.len();
        self.leases.push(Lease { grant, ends_us: grant.expires_us, replaced_by: None });
        self.by_fence.insert(grant.fence, index);
        self.rows.insert((grant.slot, grant.durable), index);
        self.unreplaced.push(index);
    }

    /// Invariant 4. Changes by sessions that are not torture clients (a sweeper, an admin's revoke)
    /// need only be about the row's current lease.
    fn renew_or_end(&mut self, change: &'h LeaseChange) {
        let key = self.key;
        let Some(&index) = self.rows.get(&(change.slot, change.durable)) else {
            let detail = format!(
                "{key}: {:?} of fence {} in slot {} before any grant there",
                change.kind, change.fence, change.slot
            );
            return self.violations.add(Violation::ForeignChange, detail);
        };
        let current = &mut self.leases[index];
        let by_client = change.by.starts_with("torture-client-");
        // A grant ends the key's other rows whose leases expired unreleased, leaving their ends
        // where they were: bookkeeping of leases already over, not a change by a foreign holder.
        let ends_nothing = change.kind == LeaseChangeKind::End && change.expires_us >= current.ends_us;
        let holder = &current.grant.by;
        if change.fence != current.grant.fence || (by_client && change.by != *holder && !ends_nothing) {
            let detail = format!(
                "{key}: {:?} of fence {} by {} while fence {} of {holder} was current in slot {}",
                change.kind, change.fence, change.by, current.grant.fence, change.slot
            );
            return self.violations.add(Violation::ForeignChange, detail);
        }
        current.ends_us = change.expires_us;
    }

    /// Invariant 3.
    fn write(&mut self, write: &RecordedWrite) {
        let lease = self.by_fence.get(&write.fence).map(|&index| &self.leases[index]);
        let problem = match lease {
            None => "committed before its fence was granted".to_string(),
            Some(Lease { replaced_by: Some(fence), .. }) => {
                format!("committed after the grant of fence {fence}")
            }
            Some(_) => return,
        };
        let detail = format!("{}: write {} under fence {} {problem}", self.key, write.write_id, write.fence);
        self.violations.add(Violation::LateWrite, detail);
    }
}

/// Invariant 2 on one key's leases (in the commit order of their grants): at the instant each
/// lease was acquired, the leases live then. Every instant at which the live leases break it comes
/// after the latest acquisition among them, while they all are still live: so looking at the
/// acquisitions misses none. Returns the most leases of each mode found live at once.
fn check_live_at_once(key: &str, leases: &[Lease], violations: &mut Violations) -> AtOnce {
    let mut by_start: Vec<usize> = (0..leases.len()).collect();
    by_start.sort_by_key(|&index| (leases[index].grant.acquired_us, index));
    let mut most = AtOnce::default();
    let mut live: Vec<usize> = Vec::new();
    for index in by_start {
        let at = leases[index].grant.acquired_us;
        live.retain(|&other| leases[other].ends_us > at);
        if leases[index].ends_us <= at {
            continue; // ended (released) at the instant it was granted: never live
        }
        live.push(index);
        // Indices are commit order: a fast lease is over once a later grant came from another server.
        let counted: Vec<&Lease> = live
            .iter()
            .filter(|&&this| {
                !live.iter().any(|&later| later > this && leases[this].gone_before(leases[later].grant))
            })
            .map(|&this| &leases[this])
            .collect();
        let (shared, others): (Vec<&Lease>, Vec<&Lease>) =
            counted.iter().partition(|lease| lease.grant.shared);
        most.shared = most.shared.max(shared.len());
        let permits = others.iter().filter(|lease| lease.grant.permits > 1).count();
        most.permits = most.permits.max(permits);
        let fences = |of: &[&Lease]| {
            of.iter().map(|lease| lease.grant.fence.to_string()).collect::<Vec<_>>().join(", ")
        };
        let fence = leases[index].grant.fence;
        if !shared.is_empty() && !others.is_empty() {
            let detail = format!(
                "{key}: when fence {fence} was acquired, shared fences [{}] were live beside fences [{}]",
                fences(&shared),
                fences(&others)
            );
            violations.add(Violation::SharedBesideOther, detail);
        }
        let limit = others.iter().map(|lease| lease.grant.permits).min().unwrap_or(i32::MAX);
        if others.len() > limit as usize {
            let detail = format!(
                "{key}: when fence {fence} was acquired, {} leases were live, fences [{}], one of them granted with permits {limit}",
                others.len(),
                fences(&others)
            );
            violations.add(Violation::TooManyLive, detail);
        }
    }
    most
}

/// Invariant 1 for what clients saw: each acknowledged grant is recorded, with its acquired_at and
/// the mode the client asked for. `allow_loss` says whether a missing durable grant may have been
/// lost (it is counted there).
fn check_acknowledged_grants(
    history: &History,
    acked: &Acknowledged,
    violations: &mut Violations,
    mut allow_loss: impl FnMut(&AckedGrant) -> bool,
) {
    let recorded: HashMap<(&str, i64), &LeaseChange> = history
        .leases
        .iter()
        .filter(|change| change.kind == LeaseChangeKind::Grant)
        .map(|change| ((change.key.as_str(), change.fence), change))
        .collect();
    for grant in &acked.grants {
        let (kind, problem) = match recorded.get(&(grant.key.as_str(), grant.fence)) {
            None if !grant.durable || allow_loss(grant) => {
                check_lost_fast_grant(history, grant, violations);
                continue;
            }
            None => (Violation::AcknowledgedLeaseLost, "is not in the history".to_string()),
            Some(change) if change.acquired_us != grant.acquired_us => {
                (Violation::AcknowledgedLeaseLost, "was granted again to someone else".to_string())
            }
            Some(change) if (change.shared, change.permits) != (grant.shared, grant.permits) => (
                Violation::WrongMode,
                format!(
                    "asked shared {} permits {}, is recorded shared {} permits {}",
                    grant.shared, grant.permits, change.shared, change.permits
                ),
            ),
            Some(_) => continue,
        };
        let detail = format!("{}: acknowledged grant of fence {} {problem}", grant.key, grant.fence);
        violations.add(kind, detail);
    }
}

/// A fast grant commits without a flush when it is all its transaction writes (its record, written
/// by a trigger during the call, included), so a crash may take it and its record: allowed, as
/// long as no grant recorded after it has a fence at or below its own (invariant 1 for what the
/// client was told).
fn check_lost_fast_grant(history: &History, grant: &AckedGrant, violations: &mut Violations) {
    let reissued = history.leases.iter().find(|change| {
        change.kind == LeaseChangeKind::Grant
            && change.key == grant.key
            && change.acquired_us > grant.acquired_us
            && change.fence <= grant.fence
    });
    if let Some(change) = reissued {
        let detail = format!(
            "{}: fence {} granted after the acknowledged fast grant of fence {} lost in a crash",
            grant.key, change.fence, grant.fence
        );
        violations.add(Violation::FenceNotIncreasing, detail);
    }
}

/// Acknowledged fast grants whose record a crash took (allowed, see `check_lost_fast_grant`).
pub fn fast_grants_missing(history: &History, acked: &Acknowledged) -> u64 {
    let recorded = recorded(history, LeaseChangeKind::Grant);
    acked.grants.iter().filter(|g| !g.durable && !recorded.contains(&(g.key.as_str(), g.fence))).count()
        as u64
}

/// Renewals are flushed before they are acknowledged, so each must be recorded; but for a fast
/// lease's, which a crash may take as it takes the lease.
fn check_acknowledged_renewals(
    history: &History,
    acked: &Acknowledged,
    violations: &mut Violations,
    mut allow_loss: impl FnMut(&AckedRenewal) -> bool,
) {
    let recorded: HashMap<(&str, i64), Vec<i64>> = history
        .leases
        .iter()
        .filter(|change| change.kind == LeaseChangeKind::Renew)
        .fold(HashMap::new(), |mut recorded, change| {
            recorded.entry((change.key.as_str(), change.fence)).or_default().push(change.expires_us);
            recorded
        });
    let fast: HashSet<(&str, i64)> =
        acked.grants.iter().filter(|g| !g.durable).map(|g| (g.key.as_str(), g.fence)).collect();
    for renewal in &acked.renewals {
        let key = (renewal.key.as_str(), renewal.fence);
        let expiries = recorded.get(&key).map_or(&[][..], Vec::as_slice);
        let found = expiries.iter().any(|&expires_us| {
            expires_us == renewal.expires_us || (renewal.at_least && expires_us > renewal.expires_us)
        });
        if !found && !fast.contains(&key) && !allow_loss(renewal) {
            let detail = format!(
                "{}: acknowledged renewal of fence {} is not in the history",
                renewal.key, renewal.fence
            );
            violations.add(Violation::AcknowledgedLeaseLost, detail);
        }
    }
}

/// No acknowledged write is lost: each is in the audit history, under the fence it was made with.
fn check_acknowledged_writes(
    history: &History,
    acked: &Acknowledged,
    violations: &mut Violations,
    mut allow_loss: impl FnMut(&AckedWrite) -> bool,
) {
    let recorded: HashMap<i64, (&str, i64)> =
        history.writes.iter().map(|write| (write.write_id, (write.key.as_str(), write.fence))).collect();
    for write in &acked.writes {
        let problem = match recorded.get(&write.write_id) {
            None if allow_loss(write) => continue,
            None => "is not in the audit history".to_string(),
            Some(&(key, fence)) if key != write.key || fence != write.fence => {
                format!("is recorded for {key} under fence {fence}")
            }
            Some(_) => continue,
        };
        let detail = format!(
            "{}: acknowledged write {} under fence {} {problem}",
            write.key, write.write_id, write.fence
        );
        violations.add(Violation::LostWrite, detail);
    }
}

/// Every grant is recorded: the fence of every row of the lease tables is a recorded grant.
fn check_recording_complete(history: &History, violations: &mut Violations) {
    let recorded = recorded(history, LeaseChangeKind::Grant);
    let keys: HashSet<&str> = recorded.iter().map(|(key, _)| *key).collect();
    // Keys never granted since the recording was installed are not the run's (a grant the
    // recording missed entirely also shows as an acknowledged grant that is not in the history).
    for (key, fence) in &history.final_fences {
        if keys.contains(key.as_str()) && !recorded.contains(&(key.as_str(), *fence)) {
            let detail = format!("{key}: fence {fence} is in the lease tables but was never recorded");
            violations.add(Violation::IncompleteHistory, detail);
        }
    }
}
