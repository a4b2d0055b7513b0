//! One key's rows of its lease tables (see `kinds`), looked up in their primary key indexes
//! without a statement: the read behind fence_guard, which every fenced write pays for, behind a
//! waiting acquire's look at the lease it waits for, and behind a grant's look at the other kind's
//! row. With no statement there is nothing to plan, no privilege to check and no name to resolve on
//! the caller's search_path, so the guard needs neither SECURITY DEFINER nor a pinned search_path;
//! saving and restoring that setting on every call was most of what the guard cost (docs/benchmarks.md,
//! "Targets, and where the time goes").
//!
//! Liveness is decided here in Rust, by the same rule as `live_at!` (src/leases/state/liveness.rs); a
//! `#[pg_test]` compares the two on every kind of row.
use super::found::{Ended, Found, Live};
use super::kinds::Kind;
use super::mode::LeaseMode;
use super::session_lock;
use crate::pg::compat;
use pgrx::pg_sys;
use pgrx::FromDatum;
use std::ffi::CStr;

/// `key`'s rows of this kind in its table, one per slot; none when it has none (or, for fast
/// leases, where the table cannot be read: see `Kind::table`).
pub fn find(kind: Kind, key: &str, now: i64, ends: bool) -> Vec<Found> {
    let Some(table) = kind.table() else { return Vec::new() };
    let name = kind.table_name();
    // SAFETY: the relation stays open (and locked, as a SELECT would) for the scan; the snapshot is
    // registered until the scan ends; each tuple is read before the next is fetched. An error on
    // the way aborts the transaction, which releases all three.
    unsafe {
        let rel = pg_sys::table_open(table, pg_sys::AccessShareLock as pg_sys::LOCKMODE);
        let desc = (*rel).rd_att;
        let columns = Columns::of(desc, kind);
        let key_text = pg_sys::cstring_to_text_with_len(key.as_ptr().cast(), key.len() as i32);
        let mut scan_key: pg_sys::ScanKeyData = std::mem::zeroed();
        // The index orders keys by the column's collation, so the search must compare by it too.
        let collation = compat::attribute(desc, columns.key).attcollation;
        pg_sys::ScanKeyEntryInitialize(
            &mut scan_key,
            0,
            (columns.key + 1) as pg_sys::AttrNumber,
            pg_sys::BTEqualStrategyNumber as pg_sys::StrategyNumber,
            pg_sys::InvalidOid,
            collation,
            pg_sys::regproc::from(pg_sys::F_TEXTEQ),
            pg_sys::Datum::from(key_text),
        );
        let snapshot = pg_sys::RegisterSnapshot(pg_sys::GetLatestSnapshot());
        let index = compat::primary_key_index(rel);
        if index == pg_sys::InvalidOid {
            let table = name.to_string_lossy();
            crate::pg::errors::state_damaged(&format!("table fence.{table} has lost its primary key"));
        }
        // The key is the index's first column: one scan finds every slot of the key.
        let scan = pg_sys::systable_beginscan(rel, index, true, snapshot, 1, &mut scan_key);
        let mut found = Vec::new();
        loop {
            let tuple = pg_sys::systable_getnext(scan);
            if tuple.is_null() {
                break;
            }
            found.push(columns.read(tuple, desc, now, ends));
        }
        pg_sys::systable_endscan(scan);
        pg_sys::UnregisterSnapshot(snapshot);
        pg_sys::table_close(rel, pg_sys::NoLock as pg_sys::LOCKMODE);
        found
    }
}

/// Whether `attname` is `name`, without measuring it: compared on every attribute for every
/// column, on every read of a key's rows.
fn is_named(attname: &pg_sys::NameData, name: &CStr) -> bool {
    let wanted = name.to_bytes_with_nul();
    wanted.len() <= attname.data.len() && wanted.iter().zip(attname.data.iter()).all(|(w, a)| *w == *a as u8)
}

/// Positions (from 0) of the columns liveness reads, found by name so that a column added by a
/// later version cannot shift them.
struct Columns {
    kind: Kind,
    key: usize,
    fence: usize,
    owner: usize,
    acquired_at: usize,
    token_hash: usize,
    expires_at: usize,
    session_pid: usize,
    session_id: usize,
    /// Absent from the objects of versions before 0.5.0, whose rows are all exclusive (slot 0).
    slot: Option<usize>,
    shared: Option<usize>,
    permits: Option<usize>,
    ended_hash: Option<usize>,
    ended_fence: Option<usize>,
    ended_at: Option<usize>,
    ended_reason: Option<usize>,
    lock_delay: Option<usize>,
    handed_to: Option<usize>,
}

impl Columns {
    /// SAFETY: `desc` must be the tuple descriptor of a lease table.
    unsafe fn of(desc: pg_sys::TupleDesc, kind: Kind) -> Self {
        let optional = |name: &CStr| {
            (0..(*desc).natts as usize)
                .map(|i| compat::attribute(desc, i))
                .position(|a| !a.attisdropped && is_named(&a.attname, name))
        };
        let position =
            |name: &CStr| optional(name).unwrap_or_else(|| panic!("a lease table has no column {name:?}"));
        Columns {
            kind,
            key: position(c"key"),
            fence: position(c"fence"),
            owner: position(c"owner"),
            acquired_at: position(c"acquired_at"),
            token_hash: position(c"token_hash"),
            expires_at: position(c"expires_at"),
            session_pid: position(c"session_pid"),
            session_id: position(c"session_id"),
            slot: optional(c"slot"),
            shared: optional(c"shared"),
            permits: optional(c"permits"),
            ended_hash: optional(c"ended_hash"),
            ended_fence: optional(c"ended_fence"),
            ended_at: optional(c"ended_at"),
            ended_reason: optional(c"ended_reason"),
            lock_delay: optional(c"lock_delay"),
            handed_to: optional(c"handed_to"),
        }
    }

    /// The row's fence, and its lease if that is live: `live_at!` in Rust. Not released, not
    /// expired at `now`, and a session-bound lease's session still there. As there, a row with a
    /// session id but no pid is dead, and one with a pid but no session id is a plain lease.
    ///
    /// SAFETY: `tuple` must be a row of the table `desc` describes.
    unsafe fn read(&self, tuple: pg_sys::HeapTuple, desc: pg_sys::TupleDesc, now: i64, ends: bool) -> Found {
        let natts = (*desc).natts as usize;
        let mut values = vec![pg_sys::Datum::from(0); natts];
        let mut nulls = vec![true; natts];
        pg_sys::heap_deform_tuple(tuple, desc, values.as_mut_ptr(), nulls.as_mut_ptr());
        let get = |i: usize| (!nulls[i]).then_some(values[i]);
        let fence = get(self.fence).and_then(|d| i64::from_datum(d, false)).unwrap_or_default();
        let slot = self.slot.and_then(get).and_then(|d| i32::from_datum(d, false)).unwrap_or(0);
        let mode = LeaseMode {
            shared: self.shared.and_then(get).and_then(|d| bool::from_datum(d, false)).unwrap_or(false),
            permits: self.permits.and_then(get).and_then(|d| i32::from_datum(d, false)).unwrap_or(1),
        };
        let expires_at = get(self.expires_at).and_then(|d| i64::from_datum(d, false)).unwrap_or_default();
        let session_id = get(self.session_id).and_then(|d| i64::from_datum(d, false));
        let session_pid = get(self.session_pid).and_then(|d| i32::from_datum(d, false));
        // A session id without a pid is dead (see `live_at!`). Asked only while the lease has a token
        // and time left: the lock table is looked at for nothing else.
        let token_hash = get(self.token_hash).and_then(|d| Vec::<u8>::from_datum(d, false));
        let unreleased = token_hash.is_some();
        let session_alive = session_id
            .filter(|_| unreleased && expires_at > now)
            .map(|id| session_pid.is_some_and(|pid| session_lock::alive(pid, id)));
        let text = |i: Option<usize>| i.and_then(get).and_then(|d| String::from_datum(d, false));
        let handed_to = text(self.handed_to);
        let live = || {
            let token_hash = token_hash.clone()?;
            if expires_at <= now || session_alive == Some(false) {
                return None;
            }
            let session = session_id.and_then(|id| Some((session_pid?, id)));
            let owner = get(self.owner).and_then(|d| String::from_datum(d, false)).unwrap_or_default();
            let acquired_at =
                get(self.acquired_at).and_then(|d| i64::from_datum(d, false)).unwrap_or_default();
            Some(Live {
                kind: self.kind,
                fence,
                slot,
                mode,
                expires_at,
                token_hash,
                owner,
                acquired_at,
                session,
                handed_to: handed_to.clone(),
            })
        };
        let live = live();
        let lock_delay = self.lock_delay.and_then(get).and_then(|d| i64::from_datum(d, false)).unwrap_or(0);
        let ended = || {
            if !ends && lock_delay == 0 {
                return None;
            }
            Some(Ended {
                token_hash: self.ended_hash.and_then(get).and_then(|d| Vec::<u8>::from_datum(d, false))?,
                fence: self.ended_fence.and_then(get).and_then(|d| i64::from_datum(d, false))?,
                at: self.ended_at.and_then(get).and_then(|d| i64::from_datum(d, false))?,
                reason: text(self.ended_reason)?,
            })
        };
        Found {
            kind: self.kind,
            slot,
            mode,
            fence,
            live,
            unreleased,
            token_hash,
            expires_at,
            session_gone: session_alive == Some(false),
            ended: ended(),
            lock_delay,
        }
    }
}
