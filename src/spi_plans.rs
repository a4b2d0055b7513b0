//! Runs pg_fence's statements through plans prepared once per backend (SPI_keepplan), so the hot
//! path neither parses nor plans. That covers the fixed statements and the UPDATEs built for fenced
//! writes (one plan per table and set of columns). Plans name tables schema-qualified; PostgreSQL's
//! plan cache re-plans them by itself after DDL, DROP/CREATE EXTENSION, or a change of role.
use pgrx::datum::{DatumWithOid, FromDatum, IntoDatum};
use pgrx::pg_sys::panic::ErrorReportable;
use pgrx::pg_sys::PgOid;
use pgrx::spi::{OwnedPreparedStatement, Spi, SpiTupleTable};
use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

thread_local! {
    static PLANS: RefCell<HashMap<String, Rc<OwnedPreparedStatement>>> = RefCell::new(HashMap::new());
}

/// Executes `sql` with `args` (their types fix the plan's parameter types) and hands the result to
/// `read`, which must copy out what it needs: SPI frees the rows when it returns.
pub fn execute<R>(sql: &str, args: &[DatumWithOid], read: impl FnOnce(SpiTupleTable) -> R) -> R {
    Spi::connect_mut(|client| {
        // Not borrowed while the statement runs: it may call back into pg_fence (fenced_update's
        // statement calls fence_holds), which runs statements of its own.
        let cached = PLANS.with(|plans| plans.borrow().get(sql).cloned());
        let plan = cached.unwrap_or_else(|| {
            let types: Vec<PgOid> = args.iter().map(|arg| PgOid::from_untagged(arg.oid())).collect();
            let plan = Rc::new(client.prepare_mut(sql, &types).unwrap_or_report().keep());
            PLANS.with(|plans| plans.borrow_mut().insert(sql.to_owned(), plan.clone()));
            plan
        });
        // `select` on a plan prepared with prepare_mut runs it read-write (each statement sees the
        // latest commits, as the lock-then-read order needs) without what `update` adds: asking
        // for a transaction id, which would make read-only calls write a commit record (and fail
        // on a standby).
        read(client.select(&*plan, None, args).unwrap_or_report())
    })
}

/// Executes `sql` and returns the first column of its first row: None when there is no row (or the
/// value is NULL).
pub fn execute_first<T: IntoDatum + FromDatum>(sql: &str, args: &[DatumWithOid]) -> Option<T> {
    execute(
        sql,
        args,
        |rows| if rows.is_empty() { None } else { rows.first().get::<T>(1).unwrap_or_report() },
    )
}
