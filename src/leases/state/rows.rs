//! A key's rows of both kinds, in the latest committed state (a fresh snapshot, not the
//! transaction's), from whichever store holds each kind: durable rows and, without shared memory,
//! fast ones in their tables (`table_rows`); fast ones in shared memory (`memory`) when it is in
//! use. Every call and the guard read leases through here.
use super::found::{Found, Live};
use super::kinds::Kind;
use super::{memory, table_rows};

/// `key`'s live leases, of both kinds and every slot, at `now` (microseconds, as clock::now()), in
/// the latest committed state of the tables (a fresh snapshot, not the transaction's).
pub fn live(key: &str, now: i64) -> impl Iterator<Item = Live> {
    all(key, now).into_iter().filter_map(|found| found.live)
}

/// `key`'s live lease if the token with this hash holds it. A token holds one lease of a key at a
/// time, so the fast rows are read first: found there (in shared memory, as a fast lease's release
/// or renewal does), the durable table's index is not read at all.
pub fn held_with(key: &str, token_hash: &[u8], now: i64) -> Option<Live> {
    held_with_of_kind(Kind::Fast, key, token_hash, now)
        .or_else(|| held_with_of_kind(Kind::Durable, key, token_hash, now))
}

/// `held_with` among the rows of one kind only: for a call that found the token's lease of that
/// kind before it took the key's lock. (A token holds one lease of a key at a time: if that lease
/// ended meanwhile, there was a moment when the token held none, and "not held" is a true answer.)
pub fn held_with_of_kind(kind: Kind, key: &str, token_hash: &[u8], now: i64) -> Option<Live> {
    find(kind, key, now, false)
        .into_iter()
        .filter_map(|found| found.live)
        .find(|lease| lease.token_hash == token_hash)
}

/// Every row of `key`, of both kinds, in the latest committed state. Their `ended` only where a
/// lock-delay needs it: decoding it on every fenced write's read would cost for nothing.
pub fn all(key: &str, now: i64) -> Vec<Found> {
    let mut rows = find(Kind::Durable, key, now, false);
    rows.extend(find(Kind::Fast, key, now, false));
    rows
}

/// `all`, with every row's `ended` (see `ended`).
pub fn all_with_ends(key: &str, now: i64) -> Vec<Found> {
    let mut rows = find(Kind::Durable, key, now, true);
    rows.extend(find(Kind::Fast, key, now, true));
    rows
}

/// `key`'s rows of this kind, one per slot, in the latest committed state; none when it has none
/// (or, for fast leases, where they cannot be read: see `Kind::table`).
pub fn find(kind: Kind, key: &str, now: i64, ends: bool) -> Vec<Found> {
    if kind == Kind::Fast && memory::changes::in_use() {
        return memory::changes::found(key, now, ends);
    }
    table_rows::find(kind, key, now, ends)
}
