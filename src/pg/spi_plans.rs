//! Runs pg_fence's statements through plans prepared once per backend (SPI_keepplan), so the hot
//! path neither parses nor plans. That covers the fixed statements and the UPDATEs built for fenced
//! writes (one plan per table, set of columns and their types). Plans name tables schema-qualified;
//! PostgreSQL's plan cache re-plans them by itself after DDL, DROP/CREATE EXTENSION, or a change of
//! role. A plan is found by its text and its parameters' types: the fenced writes pass values as
//! parameters of the columns' types, which a migration can change (an enum or domain made anew
//! under the same name) without changing the text, and a statement may declare parameters it
//! does not use, whose number the text does not show.
use pgrx::datum::{DatumWithOid, FromDatum, IntoDatum};
use pgrx::pg_sys::panic::ErrorReportable;
use pgrx::pg_sys::{self, PgOid};
use pgrx::spi::{OwnedPreparedStatement, Spi, SpiTupleTable};
use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

/// The plans of one statement text, by their parameters' types (nearly always just one).
type Plans = Vec<(Vec<pg_sys::Oid>, Rc<OwnedPreparedStatement>)>;

thread_local! {
    static PLANS: RefCell<HashMap<String, Plans>> = RefCell::new(HashMap::new());
}

/// Executes `sql` with `args` (their types fix the plan's parameter types) and hands the result to
/// `read`, which must copy out what it needs: SPI frees the rows when it returns.
pub fn execute<R>(sql: &str, args: &[DatumWithOid], read: impl FnOnce(SpiTupleTable) -> R) -> R {
    Spi::connect_mut(|client| {
        // Not borrowed while the statement runs: it may call back into pg_fence (a trigger on a
        // table that a fenced write updates may), which runs statements of its own.
        let types: Vec<pg_sys::Oid> = args.iter().map(DatumWithOid::oid).collect();
        let cached = PLANS.with(|plans| {
            let plans = plans.borrow();
            let same_types = plans.get(sql)?.iter().find(|(t, _)| *t == types);
            same_types.map(|(_, plan)| plan.clone())
        });
        let plan = cached.unwrap_or_else(|| {
            let pg_types: Vec<PgOid> = types.iter().map(|&oid| PgOid::from_untagged(oid)).collect();
            let plan = Rc::new(client.prepare_mut(sql, &pg_types).unwrap_or_report().keep());
            PLANS.with(|plans| {
                plans.borrow_mut().entry(sql.to_owned()).or_default().push((types, plan.clone()))
            });
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
