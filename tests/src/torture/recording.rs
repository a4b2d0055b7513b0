//! The server-side record of a torture run: an audit table that clients write under their fences,
//! and triggers that append every lease change and every accepted write to history tables. A
//! history row is inserted by the transaction that makes the change, so it commits with the change
//! or vanishes with it, crashes included; its commit timestamp orders it among all the others.
use postgres::Client;

/// The objects, created once (it is safe to run this again). Names outside schema `fence` are
/// schema-qualified because the trigger on `fence.lease_state` runs inside pg_fence's functions,
/// whose search_path is pinned to pg_catalog.
const SCHEMA: &str = r#"
    -- The audit table: one row per key, which clients change only with fence.fenced_update.
    CREATE TABLE IF NOT EXISTS public.torture_resource (
        key        text PRIMARY KEY,
        last_fence bigint,
        write_id   bigint
    );

    -- Every accepted write: the fence it was made under and the client's id for it.
    CREATE TABLE IF NOT EXISTS public.torture_writes (
        key      text   NOT NULL,
        fence    bigint NOT NULL,
        write_id bigint NOT NULL
    );
    CREATE OR REPLACE FUNCTION public.torture_record_write() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        INSERT INTO public.torture_writes VALUES (NEW.key, NEW.last_fence, NEW.write_id);
        RETURN NULL;
    END $$;
    CREATE OR REPLACE TRIGGER torture_record_write AFTER UPDATE ON public.torture_resource
        FOR EACH ROW EXECUTE FUNCTION public.torture_record_write();

    -- Every new version of a lease row, with what the change was and which session made it. A key
    -- has a row per holder, (key, slot) in each lease table: a grant overwrites its slot's row.
    CREATE TABLE IF NOT EXISTS public.torture_leases (
        key         text        NOT NULL,
        slot        integer     NOT NULL,
        shared      boolean     NOT NULL,
        permits     integer     NOT NULL,
        fence       bigint      NOT NULL,
        kind        text        NOT NULL,  -- 'grant', 'renew' or 'end' (release, revoke, sweep)
        held        boolean     NOT NULL,  -- token_hash IS NOT NULL
        acquired_at timestamptz NOT NULL,
        expires_at  timestamptz NOT NULL,
        by          text        NOT NULL,  -- application_name of the session (a grant's: its owner)
        durable     boolean     NOT NULL,  -- false: a fast lease's row (fence.fast_lease_state)
        -- when the server that made the change started: a fast lease ends when the server does
        server_start timestamptz NOT NULL DEFAULT pg_catalog.pg_postmaster_start_time()
    );
    CREATE OR REPLACE FUNCTION public.torture_record(
        key text, slot integer, shared boolean, permits integer, fence bigint, kind text,
        held boolean, acquired_at timestamptz, expires_at timestamptz, owner text, durable boolean
    ) RETURNS void LANGUAGE plpgsql AS $$
    BEGIN
        INSERT INTO public.torture_leases
               (key, slot, shared, permits, fence, kind, held, acquired_at, expires_at, by, durable)
        VALUES (key, slot, shared, permits, fence, kind, held, acquired_at, expires_at,
                -- A grant is the acquirer's, whose application_name is its default owner.
                CASE WHEN kind = 'grant' THEN owner ELSE current_setting('application_name') END,
                durable);
        -- pg_fence commits a release without a WAL flush when the release is all its transaction
        -- writes. This insert is a second write, which would make the release's commit flush; keep
        -- the documented behaviour (an acknowledged release can be lost in a crash) under test.
        IF NOT durable AND kind <> 'end' THEN
            -- A fast lease's grant and renewal commit without a flush when they are all their
            -- transaction wrote, this record included (it is written during the call).
            -- remote_apply, which pg_fence never lowers, keeps the record of what a client was
            -- told; the checker would still allow its loss (see `check_lost_fast_grant`).
            PERFORM set_config('synchronous_commit', 'remote_apply', true);
        ELSIF kind = 'end' AND current_setting('synchronous_commit') <> 'remote_apply' THEN
            -- Not when a fast grant ends the durable row's expired lease in the same transaction.
            PERFORM set_config('synchronous_commit', 'off', true);
        END IF;
    END $$;
    CREATE OR REPLACE FUNCTION public.torture_record_lease() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        PERFORM public.torture_record(
            NEW.key, NEW.slot, NEW.shared, NEW.permits, NEW.fence,
            CASE WHEN TG_OP = 'INSERT' OR NEW.fence <> OLD.fence THEN 'grant'
                 WHEN NEW.token_hash IS NULL THEN 'end'
                 ELSE 'renew' END,
            NEW.token_hash IS NOT NULL, NEW.acquired_at, NEW.expires_at, NEW.owner,
            TG_TABLE_NAME = 'lease_state');
        RETURN NULL;
    END $$;
    -- Fast leases in shared memory (pg_fence preloaded) have no table: pg_fence hands each change
    -- to this function when pg_fence.trace_fast_changes is on (set below for the database). It runs
    -- with pg_fence's rights, so pg_fence looks for it in its own schema only.
    CREATE OR REPLACE FUNCTION fence.trace_fast_change(
        key text, slot integer, shared boolean, permits integer, fence bigint, kind text,
        held boolean, acquired_at timestamptz, expires_at timestamptz, owner text
    ) RETURNS void LANGUAGE sql AS $$
        SELECT public.torture_record(key, slot, shared, permits, fence, kind, held, acquired_at,
                                     expires_at, owner, false)
    $$;
    CREATE OR REPLACE TRIGGER torture_record_lease AFTER INSERT OR UPDATE ON fence.lease_state
        FOR EACH ROW EXECUTE FUNCTION public.torture_record_lease();
    -- Not the reset marker, the row under the empty key that no lease has (src/leases/state/fences.rs).
    CREATE OR REPLACE TRIGGER torture_record_lease AFTER INSERT OR UPDATE ON fence.fast_lease_state
        FOR EACH ROW WHEN (NEW.key <> '') EXECUTE FUNCTION public.torture_record_lease();
"#;

/// Creates the audit table with a row per key, and the recording triggers.
pub fn install(client: &mut Client, keys: &[String]) -> Result<(), postgres::Error> {
    let on: String = client.query_one("SHOW track_commit_timestamp", &[])?.get(0);
    assert_eq!(on, "on", "the torture checker orders changes by commit timestamp");
    client.batch_execute(SCHEMA)?;
    // For the sessions that connect from now on, the sweeper worker included (it connects after
    // each restart, and on each new primary).
    client.batch_execute(
        "DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET pg_fence.trace_fast_changes = on', \
         current_database()); END $$",
    )?;
    for key in keys {
        client.execute(
            "INSERT INTO public.torture_resource (key) VALUES ($1) ON CONFLICT DO NOTHING",
            &[key],
        )?;
    }
    Ok(())
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum LeaseChangeKind {
    Grant,
    Renew,
    /// Release (or revoke, or sweep): `expires_at` is the moment the lease ended.
    End,
}

/// One recorded version of a lease row. Times are microseconds since the Unix epoch.
#[derive(Clone, Debug)]
pub struct LeaseChange {
    pub key: String,
    /// The row's slot: a row of the key is (key, slot) in its table (`durable`).
    pub slot: i32,
    /// The mode the row's lease was granted in.
    pub shared: bool,
    pub permits: i32,
    pub fence: i64,
    pub kind: LeaseChangeKind,
    pub acquired_us: i64,
    pub expires_us: i64,
    /// application_name of the session that made the change.
    pub by: String,
    pub committed_us: i64,
    /// false for a fast lease (ended by a restart of the server).
    pub durable: bool,
    /// When the server that made the change started (µs).
    pub server_start_us: i64,
}

/// One recorded accepted write.
#[derive(Clone, Debug)]
pub struct RecordedWrite {
    pub key: String,
    pub fence: i64,
    pub write_id: i64,
    pub committed_us: i64,
}

/// Everything the server recorded, read in one snapshot.
#[derive(Clone, Debug, Default)]
pub struct History {
    pub leases: Vec<LeaseChange>,
    pub writes: Vec<RecordedWrite>,
    /// The fence of every row of the lease tables (both kinds, every slot), to check that no grant
    /// escaped the recording.
    pub final_fences: Vec<(String, i64)>,
}

/// A timestamptz as microseconds since the epoch, exactly (extract gives a numeric).
macro_rules! micros {
    ($column:literal) => {
        concat!("(extract(epoch FROM ", $column, ") * 1000000)::bigint")
    };
}

const LEASES: &str = concat!(
    "SELECT key, slot, shared, permits, fence, kind, ",
    micros!("acquired_at"),
    ", ",
    micros!("expires_at"),
    ", by, ",
    micros!("pg_xact_commit_timestamp(xmin)"),
    ", durable, ",
    micros!("server_start"),
    " FROM public.torture_leases"
);

const WRITES: &str = concat!(
    "SELECT key, fence, write_id, ",
    micros!("pg_xact_commit_timestamp(xmin)"),
    " FROM public.torture_writes"
);

pub fn load_history(client: &mut Client) -> Result<History, postgres::Error> {
    let mut snapshot =
        client.build_transaction().isolation_level(postgres::IsolationLevel::RepeatableRead).start()?;
    let leases = snapshot.query(LEASES, &[])?.iter().map(lease_change).collect();
    let writes = snapshot
        .query(WRITES, &[])?
        .iter()
        .map(|row| RecordedWrite {
            key: row.get(0),
            fence: row.get(1),
            write_id: row.get(2),
            committed_us: row.get(3),
        })
        .collect();
    let final_fences = snapshot
        .query(
            "SELECT key, fence FROM fence.lease_state
             UNION ALL SELECT key, fence FROM fence.fast_lease_rows() WHERE key <> ''",
            &[],
        )?
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect();
    snapshot.commit()?;
    Ok(History { leases, writes, final_fences })
}

fn lease_change(row: &postgres::Row) -> LeaseChange {
    let kind = match row.get::<_, &str>(5) {
        "grant" => LeaseChangeKind::Grant,
        "renew" => LeaseChangeKind::Renew,
        _ => LeaseChangeKind::End,
    };
    LeaseChange {
        key: row.get(0),
        slot: row.get(1),
        shared: row.get(2),
        permits: row.get(3),
        fence: row.get(4),
        kind,
        acquired_us: row.get(6),
        expires_us: row.get(7),
        by: row.get(8),
        committed_us: row.get(9),
        durable: row.get(10),
        server_start_us: row.get(11),
    }
}
