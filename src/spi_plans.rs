//! Runs pg_fence's statements through plans prepared once per backend (SPI_keepplan), so the hot
//! path neither parses nor plans. That covers the fixed statements and the UPDATEs built for fenced
//! writes (one plan per table and set of columns). Plans name tables schema-qualified; PostgreSQL's
//! plan cache re-plans them by itself after DDL, DROP/CREATE EXTENSION, or a change of role.
use pgrx::datum::DatumWithOid;
use pgrx::pg_sys::panic::ErrorReportable;
use pgrx::pg_sys::PgOid;
use pgrx::spi::{OwnedPreparedStatement, Spi, SpiTupleTable};
use std::cell::RefCell;
use std::collections::HashMap;

thread_local! {
    static PLANS: RefCell<HashMap<String, OwnedPreparedStatement>> = RefCell::new(HashMap::new());
}

/// Executes `sql` with `args` (their types fix the plan's parameter types) and hands the result to
/// `read`, which must copy out what it needs: SPI frees the rows when it returns.
pub fn execute<R>(sql: &str, args: &[DatumWithOid], read: impl FnOnce(SpiTupleTable) -> R) -> R {
    Spi::connect_mut(|client| {
        PLANS.with(|plans| {
            let mut plans = plans.borrow_mut();
            if !plans.contains_key(sql) {
                let types: Vec<PgOid> = args.iter().map(|arg| PgOid::from_untagged(arg.oid())).collect();
                let plan = client.prepare_mut(sql, &types).unwrap_or_report().keep();
                plans.insert(sql.to_owned(), plan);
            }
            read(client.update(&plans[sql], None, args).unwrap_or_report())
        })
    })
}
