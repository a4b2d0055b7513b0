//! For pg_fence's own tests: with `pg_fence.trace_fast_changes` on, each change to a fast lease in
//! shared memory is handed to `fence.trace_fast_change`, in the changing call's
//! transaction. A table's history can be kept by triggers; shared memory has none, and the torture
//! test's checker needs every version of every row (tests/src/torture/recording.rs). The function
//! runs with pg_fence's rights (the lease functions are SECURITY DEFINER): it is looked for in
//! schema fence, where only its owner can create one, never on a path others can write to.
use super::row::Row;
use crate::pg::clock::timestamp;
use crate::pg::spi_plans;

const CALL: &str = "SELECT fence.trace_fast_change($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)";

/// `before` is the row as this transaction saw it (None: a new row). The kinds are those of the
/// recording trigger on the table: a grant (a new row or a new fence), an end (no token left) or a
/// renewal (anything else, a proclaimed owner included).
pub fn change(key: &str, before: Option<&Row>, after: &Row) {
    let kind = match before {
        Some(before) if before.fence == after.fence && after.token_hash.is_none() => "end",
        Some(before) if before.fence == after.fence => "renew",
        _ => "grant",
    };
    let args = [
        key.into(),
        after.slot.into(),
        after.shared.into(),
        after.permits.into(),
        after.fence.into(),
        kind.into(),
        after.token_hash.is_some().into(),
        timestamp(after.acquired_at).into(),
        timestamp(after.expires_at).into(),
        after.owner().into(),
    ];
    spi_plans::execute(CALL, &args, |_| ());
}
