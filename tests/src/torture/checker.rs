//! The history checker: pg_fence's invariants, judged on what the server recorded (see
//! `recording`), plus "nothing acknowledged was lost", judged against what clients were told.
//!
//! Per key, the recorded lease changes and writes are walked in commit order:
//! - invariant 1: each grant's fence is above every earlier grant's (so no fence is granted twice);
//! - invariant 2: each grant was acquired no earlier than the previous lease ended, the end being
//!   the last `expires_at` recorded for that fence (a renewal moves it later, a release or revoke
//!   moves it to the moment the lease ended). A release lost in a crash left no record, so the
//!   lease's end is what the server kept: this is what the server's clock had to respect;
//! - invariant 3: writes have non-decreasing fences, and no write under F committed after the
//!   grant of a fence above F (nor before F was granted);
//! - invariant 4: a renewal or release changed only the current lease, and only its holder's (a
//!   grant may mark the other kind's expired lease ended, which moves its end nowhere).
//!
//! Then against the clients' acknowledgements: every acknowledged grant is recorded with the same
//! fence and acquired_at (a fence handed out again after a crash would show another acquired_at),
//! every acknowledged renewal is recorded, and every acknowledged write is in the audit history.
//! Calls with an unknown outcome are not checked either way.
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
}

/// A renewal the client saw committed, with the new expires_at it returned.
#[derive(Clone, Debug)]
pub struct AckedRenewal {
    pub key: String,
    pub fence: i64,
    pub expires_us: i64,
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
    /// Invariant 2: a grant acquired before the previous lease of its key ended.
    OverlappingLeases,
    /// Invariant 3: a write under fence F committed after a grant above F, before F's grant, or
    /// after a write under a higher fence.
    LateWrite,
    /// Invariant 4: a renewal or release that changed a lease other than the caller's own.
    ForeignChange,
    /// An acknowledged write missing from the audit history (or recorded under another fence).
    LostWrite,
    /// The recording itself: a key's fence in the lease table is not its last recorded grant.
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

/// Checks the history against the invariants and the acknowledgements.
pub fn check(history: &History, acked: &Acknowledged) -> Violations {
    check_with(history, acked, false).0
}

/// The same, counting the acknowledged grants, renewals and writes missing from the history; with
/// `may_lose` they are not violations (the history was rolled onto a server that never
/// had them). A lost grant's fence must still never be granted again, and nothing recorded may
/// break the invariants: a lost grant is checked as a fast grant lost in a crash is.
pub fn check_with(history: &History, acked: &Acknowledged, may_lose: bool) -> (Violations, Lost) {
    let mut violations = Violations::default();
    let mut lost = Lost::default();
    for (key, events) in events_by_key(history) {
        KeyWalk::new(key, &mut violations).walk(&events);
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
    (violations, lost)
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

/// The current lease of a key during the walk.
struct Current<'h> {
    fence: i64,
    holder: &'h str,
    /// The last expires_at recorded for this fence.
    ends_us: i64,
    /// For a fast lease, when the server that granted it started: a restart or a failover ended it.
    fast_on_server_started_us: Option<i64>,
}

/// The walk through one key's events in commit order.
struct KeyWalk<'h, 'v> {
    key: &'h str,
    violations: &'v mut Violations,
    current: Option<Current<'h>>,
    highest_write_fence: i64,
}

impl<'h, 'v> KeyWalk<'h, 'v> {
    fn new(key: &'h str, violations: &'v mut Violations) -> Self {
        KeyWalk { key, violations, current: None, highest_write_fence: i64::MIN }
    }

    fn walk(mut self, events: &[Event<'h>]) {
        for event in events {
            match *event {
                Event::Lease(change) if change.kind == LeaseChangeKind::Grant => self.grant(change),
                Event::Lease(change) => self.renew_or_end(change),
                Event::Write(write) => self.write(write),
            }
        }
    }

    /// Invariants 1 and 2.
    fn grant(&mut self, grant: &'h LeaseChange) {
        let key = self.key;
        if let Some(previous) = &self.current {
            if grant.fence <= previous.fence {
                let detail = format!("{key}: fence {} granted after fence {}", grant.fence, previous.fence);
                self.violations.add(Violation::FenceNotIncreasing, detail);
            }
            // A restart, or a failover to another server (whose start time differs), ended it.
            let ended_by_restart =
                previous.fast_on_server_started_us.is_some_and(|started| grant.server_start_us != started);
            if grant.acquired_us < previous.ends_us && !ended_by_restart {
                let early_ms = (previous.ends_us - grant.acquired_us) as f64 / 1000.0;
                let detail = format!(
                    "{key}: fence {} acquired {early_ms:.3} ms before fence {} ended",
                    grant.fence, previous.fence
                );
                self.violations.add(Violation::OverlappingLeases, detail);
            }
        }
        let fast_on_server_started_us = (!grant.durable).then_some(grant.server_start_us);
        self.current = Some(Current {
            fence: grant.fence,
            holder: &grant.by,
            ends_us: grant.expires_us,
            fast_on_server_started_us,
        });
    }

    /// Invariant 4. Changes by sessions that are not torture clients (a sweeper, an admin's revoke)
    /// need only be about the current lease.
    fn renew_or_end(&mut self, change: &'h LeaseChange) {
        let key = self.key;
        let Some(current) = &mut self.current else {
            let detail = format!("{key}: {:?} of fence {} before any grant", change.kind, change.fence);
            return self.violations.add(Violation::ForeignChange, detail);
        };
        let by_client = change.by.starts_with("torture-client-");
        // A grant ends the other kind's lease of the key if that one expired unreleased, leaving its
        // end where it was: bookkeeping of a lease already over, not a change by a foreign holder.
        let ends_nothing = change.kind == LeaseChangeKind::End && change.expires_us >= current.ends_us;
        if change.fence != current.fence || (by_client && change.by != current.holder && !ends_nothing) {
            let detail = format!(
                "{key}: {:?} of fence {} by {} while fence {} of {} was current",
                change.kind, change.fence, change.by, current.fence, current.holder
            );
            return self.violations.add(Violation::ForeignChange, detail);
        }
        current.ends_us = change.expires_us;
    }

    /// Invariant 3.
    fn write(&mut self, write: &RecordedWrite) {
        let key = self.key;
        let granted = self.current.as_ref().map_or(i64::MIN, |current| current.fence);
        let problem = if write.fence < granted {
            Some(format!("committed after the grant of fence {granted}"))
        } else if write.fence > granted {
            Some("committed before its fence was granted".to_string())
        } else if write.fence < self.highest_write_fence {
            Some(format!("committed after a write under fence {}", self.highest_write_fence))
        } else {
            None
        };
        if let Some(problem) = problem {
            let detail = format!("{key}: write {} under fence {} {problem}", write.write_id, write.fence);
            self.violations.add(Violation::LateWrite, detail);
        }
        self.highest_write_fence = self.highest_write_fence.max(write.fence);
    }
}

/// Invariant 1 for what clients saw: each acknowledged grant is recorded, with its acquired_at.
/// `allow_loss` says whether a missing durable grant may have been lost (it is counted there).
fn check_acknowledged_grants(
    history: &History,
    acked: &Acknowledged,
    violations: &mut Violations,
    mut allow_loss: impl FnMut(&AckedGrant) -> bool,
) {
    let recorded: HashMap<(&str, i64), i64> = history
        .leases
        .iter()
        .filter(|change| change.kind == LeaseChangeKind::Grant)
        .map(|change| ((change.key.as_str(), change.fence), change.acquired_us))
        .collect();
    for grant in &acked.grants {
        let problem = match recorded.get(&(grant.key.as_str(), grant.fence)) {
            None if !grant.durable || allow_loss(grant) => {
                check_lost_fast_grant(history, grant, violations);
                continue;
            }
            None => "is not in the history",
            Some(&acquired_us) if acquired_us != grant.acquired_us => "was granted again to someone else",
            Some(_) => continue,
        };
        let detail = format!("{}: acknowledged grant of fence {} {problem}", grant.key, grant.fence);
        violations.add(Violation::AcknowledgedLeaseLost, detail);
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
    let recorded: HashSet<(&str, i64, i64)> = history
        .leases
        .iter()
        .filter(|change| change.kind == LeaseChangeKind::Renew)
        .map(|change| (change.key.as_str(), change.fence, change.expires_us))
        .collect();
    let fast: HashSet<(&str, i64)> =
        acked.grants.iter().filter(|g| !g.durable).map(|g| (g.key.as_str(), g.fence)).collect();
    for renewal in &acked.renewals {
        let key = (renewal.key.as_str(), renewal.fence);
        if !recorded.contains(&(key.0, key.1, renewal.expires_us))
            && !fast.contains(&key)
            && !allow_loss(renewal)
        {
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

/// Every grant is recorded: a key's fence in the lease table is its highest recorded grant.
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
