//! A release that grants the key to the first in line: a hot key passes from holder to waiter in
//! one transaction, the release's, instead of two in series (the release, then the waiter's grant
//! with its own commit and flush).
//!
//! - A waiting acquire *posts* its request (key, token, TTL, owner, mode, kind, session, lock-delay)
//!   on the board: one entry per backend, in shared memory, so it needs pg_fence in
//!   shared_preload_libraries. It writes the post before it queues and withdraws it when its call
//!   ends. Without preload nothing is posted, and a release only wakes the head, which grants itself.
//! - lease_release, having ended a lease, finds the head of the key's queue (the holder of its
//!   waiting room, see `waiting`), *chooses* its post, and grants the key on its behalf, under the
//!   same key lock: the waiter's token, TTL and session, a fence above the old one. Its commit
//!   flushes that grant as any grant's does. The head, woken after that commit, finds its own
//!   token's lease (the look every waiter makes for a retried acquire) and returns it; its own
//!   transaction writes nothing.
//! - Both calls must be whole transactions of their own (autocommit, not in a transaction block):
//!   the grant belongs to the release's transaction, so a waiter that could still roll its call
//!   back, or a release that could stay open (or be prepared) after choosing, does not take part.
//!   Nor does anything under REPEATABLE READ, whose grants may fail with 40001.
//! - The release grants in a subtransaction of its own: whatever goes wrong in the waiter's grant
//!   (a row lock, no room after all) leaves the release as it was, and only wakes the head, which
//!   grants itself as before. It waits for no writer under the old fence.
//! - Each entry's state is one atomic word: EMPTY, WAITING, CHOSEN (a release is granting on its
//!   behalf), GRANTED (a release committed a grant for it; no other release chooses it again) and
//!   ABANDONED (its waiter left while chosen), with a generation that changes at every post, so a
//!   chooser's late move never touches a later post. Only the waiter writes its post, while its
//!   entry is EMPTY; a chooser reads it only after moving it to CHOSEN.
//! - The chooser's commit moves the entry to GRANTED, its rollback back to WAITING. A waiter whose
//!   wait runs out while it is CHOSEN waits for the release's statement to end (the key lock) and
//!   returns the lease if it was granted: a waiter never walks away from a grant made for it. An
//!   error that ends the waiting call meanwhile (a cancel, statement_timeout) leaves such a lease
//!   behind, which runs out its TTL as any lease whose reply was lost (a retry with the acquire's
//!   token gets it).
//! - A waiter that gets its lease this way makes sure its grant is as durable as its own would be:
//!   flushed and on the synchronous standby (the release's commit waited for both, unless its wait
//!   for the standby was cancelled).
use super::acquire::{Lease, Request};
use super::kinds::Kind;
use super::modes::LeaseMode;
use super::{row, waiting};
use crate::locks::keylock::{self, Mode};
use crate::pg::compat;
use crate::pg::shmem::Region;
use crate::pg::{clock, input, settings};
use pgrx::pg_sys;
use pgrx::pg_sys::panic::CaughtError;
use pgrx::{register_xact_callback, PgSqlErrorCode, PgTryBuilder, PgXactCallbackEvent, Uuid};
use std::cell::{Cell, RefCell, UnsafeCell};
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU64, Ordering};

const EMPTY: u64 = 0;
const WAITING: u64 = 1;
const CHOSEN: u64 = 2;
const GRANTED: u64 = 3;
const ABANDONED: u64 = 4;

/// A state word: the generation of the post above the low byte, the state in it.
fn word(generation: u64, state: u64) -> u64 {
    generation << 8 | state
}

fn state_of(word: u64) -> u64 {
    word & 0xff
}

/// What a waiting acquire asks for, as a release needs it to grant the key in its name.
#[derive(Clone, Copy)]
#[repr(C)]
struct Post {
    /// The waiting backend's.
    pid: i32,
    database: u32,
    key_len: u16,
    key: [u8; input::MAX_KEY_BYTES],
    owner_len: u16,
    owner: [u8; input::MAX_OWNER_BYTES],
    token: [u8; 16],
    ttl: i64,
    lock_delay: i64,
    /// The waiter's session, for a session-bound lease.
    session_bound: bool,
    session: (i32, i64),
    durable: bool,
    shared: bool,
    permits: i32,
}

#[repr(C)]
struct Entry {
    state: AtomicU64,
    /// Where the WAL of the last commit that granted this entry's request ends.
    granted_at_lsn: AtomicU64,
    post: UnsafeCell<Post>,
}

static BOARD: Region = Region::new(c"pg_fence waiters' requests", board_size);

fn board_size() -> usize {
    // SAFETY: final once shared memory is being sized.
    let backends = usize::try_from(unsafe { pg_sys::MaxBackends }).unwrap_or(0);
    backends * std::mem::size_of::<Entry>()
}

/// Called from _PG_init.
pub fn init() {
    BOARD.request();
}

/// The board's entry of the backend in `slot`; None without preload.
fn entry(slot: compat::ProcSlot) -> Option<&'static Entry> {
    let (base, len) = BOARD.bytes()?;
    let index = compat::slot_index(slot)?;
    if (index + 1) * std::mem::size_of::<Entry>() > len {
        return None;
    }
    // SAFETY: in bounds of the region, which is zeroed (EMPTY) when placed and suitably aligned
    // (ShmemInitStruct aligns to the cache line; every Entry has the same size).
    Some(unsafe { &*base.cast::<Entry>().add(index) })
}

fn my_entry() -> Option<&'static Entry> {
    entry(compat::my_slot())
}

thread_local! {
    /// Whether this backend withdraws its post when it exits (see `post`).
    static EXIT_HOOK_SET: Cell<bool> = const { Cell::new(false) };
    /// The entries this transaction chose, with the word it left each in: put back at its end.
    static CHOSEN_HERE: RefCell<Vec<(&'static Entry, u64)>> = const { RefCell::new(Vec::new()) };
}

/// Posts `request` for a release to grant; false when it cannot (no preload, a post of an earlier
/// call still chosen), and the wait goes on without. The request must carry its token.
pub(super) fn post(request: &Request, session: Option<(i32, i64)>) -> bool {
    let (Some(entry), Some(token)) = (my_entry(), request.token) else { return false };
    if !a_transaction_of_its_own() {
        return false;
    }
    let mut current = entry.state.load(Ordering::Acquire);
    if matches!(state_of(current), WAITING | GRANTED) {
        // Left by an earlier call of this backend that ended without withdrawing it.
        let empty = word(current >> 8, EMPTY);
        if entry.state.compare_exchange(current, empty, Ordering::AcqRel, Ordering::Acquire).is_ok() {
            current = empty;
        }
    }
    if state_of(current) != EMPTY {
        return false;
    }
    if !EXIT_HOOK_SET.replace(true) {
        // A FATAL error or a terminate ends the backend without unwinding through the wait: the
        // post must not outlive it, for the next backend in this slot.
        // SAFETY: registered once; it only stores to this backend's own entry.
        unsafe { pg_sys::before_shmem_exit(Some(withdraw_at_exit), pg_sys::Datum::from(0)) };
    }
    let owner = request.owner.as_bytes();
    let mut post = Post {
        // SAFETY: set once when the backend starts.
        pid: unsafe { pg_sys::MyProcPid },
        // SAFETY: set for the life of a backend connected to a database.
        database: unsafe { pg_sys::MyDatabaseId }.to_u32(),
        key_len: request.key.len() as u16,
        key: [0; input::MAX_KEY_BYTES],
        owner_len: owner.len() as u16,
        owner: [0; input::MAX_OWNER_BYTES],
        token: *token.as_bytes(),
        ttl: request.ttl,
        lock_delay: request.lock_delay,
        session_bound: session.is_some(),
        session: session.unwrap_or_default(),
        durable: request.kind == Kind::Durable,
        shared: request.mode.shared,
        permits: request.mode.permits,
    };
    post.key[..request.key.len()].copy_from_slice(request.key.as_bytes());
    post.owner[..owner.len()].copy_from_slice(owner);
    // SAFETY: EMPTY: nobody else reads or writes the post.
    unsafe { *entry.post.get() = post };
    entry.state.store(word((current >> 8) + 1, WAITING), Ordering::Release);
    true
}

/// The call that posted is ending with `granted`: withdraws the post. A post a release chose is
/// waited for (until that release's transaction ends), and the lease it granted, if any, is the
/// call's answer: `granted_since` looks for it.
pub(super) fn withdraw(granted: Option<Lease>, granted_since: impl Fn() -> Option<Lease>) -> Option<Lease> {
    let Some(entry) = my_entry() else { return granted };
    let mut granted = granted;
    loop {
        let current = entry.state.load(Ordering::Acquire);
        match state_of(current) {
            WAITING | GRANTED => {
                if entry
                    .state
                    .compare_exchange(current, word(current >> 8, EMPTY), Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
                {
                    // A release that granted and committed just before: its lease is ours.
                    return granted.or_else(granted_since);
                }
            }
            CHOSEN => {
                // The chooser holds the key lock until its statement (its whole transaction) ends,
                // and moves the post on before it lets go. Holding that lock, nobody is choosing: a
                // post still CHOSEN is one whose chooser ended without moving it, never a new choice.
                let key = posted_key(entry);
                keylock::lock(&key, Mode::Change);
                let waiting = word(current >> 8, WAITING);
                let _ = entry.state.compare_exchange(current, waiting, Ordering::AcqRel, Ordering::Acquire);
                keylock::unlock(&key, Mode::Change);
                granted = granted.or_else(&granted_since);
            }
            _ => return granted,
        }
    }
}

/// The call that posted ends with an error: a chosen post is left for its chooser to empty.
pub(super) fn withdraw_on_error() {
    let Some(entry) = my_entry() else { return };
    let current = entry.state.load(Ordering::Acquire);
    let next = match state_of(current) {
        WAITING | GRANTED => EMPTY,
        CHOSEN => ABANDONED,
        _ => return,
    };
    // A chooser's move in between is from WAITING to CHOSEN only: then once more.
    if entry
        .state
        .compare_exchange(current, word(current >> 8, next), Ordering::AcqRel, Ordering::Acquire)
        .is_err()
    {
        withdraw_on_error();
    }
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn withdraw_at_exit(_code: std::ffi::c_int, _arg: pg_sys::Datum) {
    withdraw_on_error();
}

fn posted_key(entry: &Entry) -> String {
    // SAFETY: the post does not change while its waiter (this backend) is in its call.
    let post = unsafe { &*entry.post.get() };
    String::from_utf8_lossy(&post.key[..post.key_len as usize]).into_owned()
}

/// Where the WAL of the commit that granted this backend's last post ends: a waiter that finds its
/// lease granted waits for that to be flushed and replicated (see `durability`).
pub(super) fn granted_at_lsn() -> u64 {
    my_entry().map_or(0, |entry| entry.granted_at_lsn.load(Ordering::Acquire))
}

/// After this transaction ended a lease of `key` by a release: grants the key to the head of its
/// queue, if that head posted a request that a grant can serve at once. Returns whether it did.
pub(super) fn grant_to_head(key: &str) -> bool {
    // SAFETY: the backend's isolation level for the current transaction.
    let read_committed = unsafe { pg_sys::XactIsoLevel } < pg_sys::XACT_REPEATABLE_READ as i32;
    if !read_committed || !a_transaction_of_its_own() || !settings::hand_off_in_release() {
        return false;
    }
    let Some(head) = waiting::head(key) else { return false };
    let Some(entry) = entry(head) else { return false };
    let current = entry.state.load(Ordering::Acquire);
    if state_of(current) != WAITING {
        return false;
    }
    let chosen = word(current >> 8, CHOSEN);
    if entry.state.compare_exchange(current, chosen, Ordering::AcqRel, Ordering::Acquire).is_err() {
        return false;
    }
    // From here on the entry goes back at this transaction's end, whatever happens.
    remember_chosen(entry, chosen);
    // SAFETY: CHOSEN: the waiter leaves the post as it is.
    let post = unsafe { *entry.post.get() };
    let granted =
        post.asks_for(key, head) && in_a_subtransaction(|| grant_briefly(key, &post)).unwrap_or(false);
    if !granted {
        forget_chosen(entry);
        put_back_entry(entry, chosen, false);
    }
    granted
}

/// Whether the current call is its transaction's only statement: not in a transaction block (nor
/// in a subtransaction of one).
fn a_transaction_of_its_own() -> bool {
    // SAFETY: reads the backend's transaction state.
    unsafe { !pg_sys::IsTransactionBlock() && pg_sys::GetCurrentTransactionNestLevel() == 1 }
}

/// Runs `f` in a subtransaction: None, with everything it did undone, when it raised an error
/// other than a cancel or a shutdown (which go on up to the caller).
fn in_a_subtransaction<R>(f: impl FnOnce() -> R) -> Option<R> {
    // SAFETY: the sequence PL/pgSQL's exec_stmt_block uses around an EXCEPTION block, as in
    // `keylock`: memory context and resource owner restored on both paths.
    unsafe {
        let memory = pg_sys::CurrentMemoryContext;
        let resource_owner = pg_sys::CurrentResourceOwner;
        pg_sys::BeginInternalSubTransaction(std::ptr::null());
        pg_sys::MemoryContextSwitchTo(memory);
        let result = PgTryBuilder::new(AssertUnwindSafe(|| {
            let result = f();
            pg_sys::ReleaseCurrentSubTransaction();
            Some(result)
        }))
        .catch_others(|error| {
            pg_sys::MemoryContextSwitchTo(memory);
            pg_sys::RollbackAndReleaseCurrentSubTransaction();
            match &error {
                CaughtError::PostgresError(report)
                    if !matches!(
                        report.sql_error_code(),
                        PgSqlErrorCode::ERRCODE_QUERY_CANCELED | PgSqlErrorCode::ERRCODE_ADMIN_SHUTDOWN
                    ) =>
                {
                    None
                }
                _ => error.rethrow(),
            }
        })
        .execute();
        pg_sys::MemoryContextSwitchTo(memory);
        pg_sys::CurrentResourceOwner = resource_owner;
        result
    }
}

impl Post {
    /// Whether this is the live request of the backend in `slot` for `key` in this database, not
    /// one left by a backend that exited and whose slot is now another's.
    fn asks_for(&self, key: &str, slot: compat::ProcSlot) -> bool {
        // SAFETY: set for the life of a backend connected to a database; the PGPROC of a slot
        // stays mapped, its pid read as PostgreSQL's own pg_stat functions do.
        let (here, pid) = unsafe {
            let proc = compat::proc_of(slot);
            (pg_sys::MyDatabaseId.to_u32(), if proc.is_null() { 0 } else { (*proc).pid })
        };
        self.database == here && self.pid == pid && &self.key[..self.key_len as usize] == key.as_bytes()
    }
}

/// `grant_for`, waiting at most LOCK_WAIT_MS for any lock it meets (a row a sweep holds): the
/// release does not wait on the waiter's behalf.
fn grant_briefly(key: &str, post: &Post) -> bool {
    // SAFETY: a GUC nesting level of this subtransaction's, undone before it ends.
    let level = unsafe { pg_sys::NewGUCNestLevel() };
    settings::set_server_setting(c"lock_timeout", LOCK_WAIT_MS, pg_sys::GucAction::GUC_ACTION_SAVE);
    let granted = grant_for(key, post);
    // SAFETY: as above.
    unsafe { pg_sys::AtEOXact_GUC(true, level) };
    granted
}

const LOCK_WAIT_MS: &std::ffi::CStr = c"50";

/// Grants `key` to the request `post` under the release's key lock, as the waiter would at once.
fn grant_for(key: &str, post: &Post) -> bool {
    let owner = String::from_utf8_lossy(&post.owner[..post.owner_len as usize]).into_owned();
    let mode = LeaseMode { shared: post.shared, permits: post.permits };
    let kind = Kind::of(post.durable);
    let token = Some(Uuid::from_bytes(post.token));
    let mut request = Request::new(key, post.ttl, owner, post.session_bound, kind, token, mode);
    if row::held_with(key, &super::token_hash(Uuid::from_bytes(post.token)), clock::now()).is_some() {
        return false; // it holds the key already (a retry of an acquire that was granted)
    }
    request.lock_delay = post.lock_delay;
    request.holder_session = post.session_bound.then_some(post.session);
    // The release holds the key lock in Change mode; an exclusive grant needs it in Grant mode,
    // which writers under the old fence in other transactions would make it wait for.
    keylock::try_lock(key, request.key_lock()) && request.grant_locked(None).is_some()
}

fn remember_chosen(entry: &'static Entry, chosen: u64) {
    let first = CHOSEN_HERE.with_borrow_mut(|list| {
        list.push((entry, chosen));
        list.len() == 1
    });
    if first {
        register_xact_callback(PgXactCallbackEvent::Commit, || put_back(true));
        register_xact_callback(PgXactCallbackEvent::Abort, || put_back(false));
    }
}

/// At the end of the transaction that chose them: each chosen entry back to WAITING; after a
/// commit, with where its WAL ends.
fn put_back(committed: bool) {
    for (entry, chosen) in CHOSEN_HERE.take() {
        put_back_entry(entry, chosen, committed);
    }
}

fn forget_chosen(entry: &'static Entry) {
    CHOSEN_HERE.with_borrow_mut(|list| list.retain(|(each, _)| !std::ptr::eq(*each, entry)));
}

/// `entry`, chosen as `chosen`, on to GRANTED after a commit, else back to WAITING; EMPTY if its
/// waiter left meanwhile.
fn put_back_entry(entry: &Entry, chosen: u64, committed: bool) {
    if committed {
        // SAFETY: the end of this transaction's commit record, set before the callbacks run.
        entry.granted_at_lsn.store(unsafe { pg_sys::XactLastCommitEnd }, Ordering::Release);
    }
    let generation = chosen >> 8;
    let next = word(generation, if committed { GRANTED } else { WAITING });
    let abandoned = word(generation, ABANDONED);
    if entry.state.compare_exchange(chosen, next, Ordering::AcqRel, Ordering::Acquire).is_err() {
        let _ = entry.state.compare_exchange(
            abandoned,
            word(generation, EMPTY),
            Ordering::AcqRel,
            Ordering::Acquire,
        );
    }
}
