//! `pg-fence run`: acquire a key, run the command under its lease, keep the lease renewed, and end
//! it when the command ends (or leave it to expire with `--at-least`).
use crate::args::{ConnArgs, RunArgs, Supervise};
use crate::child::{self, Ended, Loss};
use crate::connect::{Server, Tracking, ABANDON_LIMIT};
use crate::exit::{Code, Exit};
use pg_fence_client::{
    hold, AcquireOptions, Backoff, Connector, Error, FenceClient, HeldLease, KeepOptions, Lease, LeaseState,
    LossReason,
};
use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use uuid::Uuid;

/// How long one acquire waits on the server before it is asked again (it keeps its place in the
/// key's queue by waiting again at once): "wait as long as it takes" in bounded statements.
const WAIT_STEP: Duration = Duration::from_secs(60);

pub async fn run(args: RunArgs, conn: &ConnArgs, server: Server) -> Result<i32, Exit> {
    let owner = args.owner.clone().unwrap_or_else(default_name);
    // The token chosen here, so that a lease the server grants to an interrupted wait can be released.
    let token = Uuid::new_v4();
    let opts = AcquireOptions::new(args.supervise.ttl)
        .owner(&owner)
        .shared(args.shared)
        .permits(args.permits)
        .lock_delay(args.supervise.lock_delay)
        .token(token);
    let wait = if args.no_wait { Some(Duration::ZERO) } else { args.wait };
    let shown = Arc::new(AtomicBool::new(false));
    let showing = (wait != Some(Duration::ZERO) && std::io::stderr().is_terminal())
        .then(|| tokio::spawn(show_holder(server.clone(), args.key.clone(), shown.clone())));
    let mut signals = child::Forwarded::new();
    // Read before waiting for the key; the server has the last word once the key is granted.
    if let Some(at_least) = args.at_least {
        at_least_fits(&server, &args.key, at_least).await?;
    }
    let tracking = Tracking::new(server.clone());
    let keep = keep_options(conn, &server, args.supervise.ttl);
    let held = tokio::select! {
        held = acquire(&tracking, &args.key, &opts, token, wait, keep) => held,
        signal = signals.next() => Err(abandon(&tracking, &args.key, token, signal).await),
    };
    if let Some(showing) = showing {
        showing.abort();
        if shown.load(Ordering::SeqCst) {
            crate::sayln!();
        }
    }
    let held = match held {
        Err(exit) if args.quiet && exit.code == Code::Held => return Ok(Code::Held.code()),
        held => held?,
    };
    // A lease of --at-least is asked of the server itself before the command runs: what pg-fence
    // could read of pg_fence.max_ttl above (nothing, for a role that may not read the SQL
    // edition's settings, or a server slow to answer) is not the server's word. Not needed when
    // --at-least is within the TTL just granted.
    if let Some(at_least) = args.at_least.filter(|at_least| *at_least > args.supervise.ttl) {
        if let Err(exit) = lease_for(conn, &server, held.lease(), at_least).await {
            held.release().await.ok();
            return Err(exit);
        }
    }
    if let Some(signal) = signals.caught().await {
        held.release().await.ok();
        return Err(interrupted(&args.key, signal));
    }
    let lease = held.lease().clone();
    let mut env = vec![
        ("PG_FENCE_KEY", lease.key.clone()),
        ("PG_FENCE_FENCE", lease.fence.to_string()),
        ("PG_FENCE_OWNER", owner),
    ];
    if args.export_token {
        env.push(("PG_FENCE_TOKEN", lease.token.to_string()));
    }
    let child = match child::spawn(
        &args.supervise.command,
        &env,
        signals,
        args.supervise.kill_after,
        held.deadline(),
    ) {
        Ok(child) => child,
        Err(exit) => {
            held.release().await.ok();
            return Err(exit);
        }
    };
    let pauses = child::Pauses::start();
    // An exclusive lease's end is watched for on the server too: a revocation stops the command at
    // once rather than at the next renewal. (Of shared leases and permits the server tells only
    // the newest holder's, which need not be this one.)
    let exclusive = !args.shared && args.permits == 1;
    let watched = watch_end(server.clone(), lease.key.clone(), lease.fence, owner_of(&env), lease.token);
    let lost = async {
        tokio::select! {
            state = held.lost() => loss(&lease.key, state, &args.supervise, pauses.longest()),
            reason = watched, if exclusive => {
                loss(&lease.key, LeaseState::Lost(reason), &args.supervise, pauses.longest())
            }
        }
    };
    match child.supervise(&held, lost).await {
        Ended::Stopped => Ok(Code::Lost.code()),
        Ended::Exited(code) => {
            let state = held.watch();
            let ended = match args.at_least {
                Some(at_least) => held.expire_at(lease.acquired_at + at_least).await,
                None => held.release().await,
            };
            let lost = match &ended {
                Ok(false) => state.borrow().reason(),
                Err(Error::LeaseLost { reason, .. }) => Some(reason.unwrap_or(LossReason::Unknown)),
                _ => None,
            };
            if let Some(reason) = lost {
                return Ok(lost_before_end(&format!("the lease on {} ({reason})", lease.key), code));
            }
            if let Err(err) = ended {
                crate::sayln!(
                    "pg-fence: the lease on {} was not released ({}): it ends at its TTL",
                    lease.key,
                    crate::exit::describe(&err)
                );
            }
            Ok(code)
        }
    }
}

/// Refuses an `at_least` longer than the server's `pg_fence.max_ttl`, before the key is waited for:
/// no lease outlives it, so a longer --at-least would end early and let another host run the job
/// again within the period. Refused before the command runs rather than kept by a pg-fence that
/// stays behind renewing: that process would outlive the job by up to days, and a reboot or an OOM
/// kill would end the period early all the same. When the setting cannot be read (the SQL
/// edition's table is not readable by fence_user; no answer in time) the server decides after the
/// grant (`lease_for`).
async fn at_least_fits(server: &Server, key: &str, at_least: Duration) -> Result<(), Exit> {
    // The setting exists once the session has loaded the library, which a call of one of its
    // functions does; the SQL edition keeps it in a table.
    let load = "SELECT fence.current_fence($1)";
    let native = "SELECT extract(epoch FROM current_setting('pg_fence.max_ttl', true)::interval)::float8";
    let sql_edition =
        "SELECT extract(epoch FROM value::interval)::float8 FROM fence.settings WHERE name = 'max_ttl'";
    let asked = async {
        let conn = server.connect().await.ok()?;
        conn.query_one(load, &[&key]).await.ok();
        match conn.query_one(native, &[]).await.ok()?.get::<_, Option<f64>>(0) {
            Some(max_ttl) => Some(max_ttl),
            None => conn.query_opt(sql_edition, &[]).await.ok()??.get::<_, Option<f64>>(0),
        }
    };
    let Some(max_ttl) = tokio::time::timeout(ABANDON_LIMIT, asked).await.ok().flatten() else {
        return Ok(());
    };
    if at_least.as_secs_f64() <= max_ttl {
        return Ok(());
    }
    let max = humantime::format_duration(Duration::from_secs_f64(max_ttl));
    Err(at_least_too_long(at_least, &format!("pg_fence.max_ttl ({max})")))
}

/// The lease extended to `at_least` from now, as the server alone can say whether it keeps a
/// lease that long: refused (class 22: longer than its pg_fence.max_ttl) it is status 64, and with
/// no answer within `--retry-for` pg-fence fails closed (69) rather than run a job whose period
/// may not be kept. The keeper's renewals then bring the expiry back to the TTL; `expire_at` moves
/// it to the end of the period once the command has ended.
async fn lease_for(conn: &ConnArgs, server: &Server, lease: &Lease, at_least: Duration) -> Result<(), Exit> {
    let keep = keep_options(conn, server, at_least);
    let client = FenceClient::with_backoff(server.clone(), keep.retry).call_timeout(keep.timeout);
    let err = match client.renew(lease, at_least).await {
        Ok(_) => return Ok(()),
        Err(err) => err,
    };
    let said = crate::exit::describe(&err);
    Err(match err {
        // The server's message alone: its HINT (renew periodically) is pg-fence's to give.
        Error::Db(err) if err.code().is_some_and(|code| code.code().starts_with("22")) => {
            let refused = err.as_db_error().map_or(said, |db| db.message().to_owned());
            at_least_too_long(at_least, &format!("pg_fence.max_ttl, which refused it ({refused})"))
        }
        Error::LeaseLost { .. } => Exit::new(
            Code::Lost,
            format!("the lease on {} was lost before the command started ({said})", lease.key),
        ),
        err => {
            let code = Exit::from(err).code;
            Exit::new(
                code,
                format!(
                    "the lease on {} could not be extended to --at-least {} ({said}): the command was not \
                     run, as the server may not keep the key that long",
                    lease.key,
                    humantime::format_duration(at_least)
                ),
            )
        }
    })
}

/// Status 64 for an --at-least the server does not keep (`limit` says what it is).
fn at_least_too_long(at_least: Duration, limit: &str) -> Exit {
    Exit::new(
        Code::Usage,
        format!(
            "--at-least {} is longer than the server's {limit}: no lease lasts that long, so the key \
             would be free again before the period ends; the command was not run\n\
             HINT: raise pg_fence.max_ttl (ALTER SYSTEM SET pg_fence.max_ttl = '7d'; SELECT pg_reload_conf(); \
             on the SQL edition, as fence_admin: UPDATE fence.settings SET value = '7 days' WHERE name = 'max_ttl'), \
             or give a shorter --at-least",
            humantime::format_duration(at_least)
        ),
    )
}

/// What was held (`what`, "the lease on KEY (why)") was lost before the command ended with `code`,
/// found at its release: pg-fence hears of a loss at the next renewal, and the command ran on
/// after it (another may have held the key meanwhile). Said, and not a success: status 76.
pub fn lost_before_end(what: &str, code: i32) -> i32 {
    crate::sayln!("pg-fence: {what} was lost before the command ended; it exited {code}");
    Code::Lost.code()
}

/// The keep options of pg-fence for a lease of `ttl`: retries bounded by `--retry-for`, and the
/// local deadline a tenth of the TTL before the server's expiry rather than the client's default
/// 100 ms. The client's holder stops at once; pg-fence's stops only once the signal has been
/// delivered and the command scheduled to act on it, which a loaded machine delays by more than
/// 100 ms. A renewal every third of the TTL still has two retries before that deadline.
/// Each try of a call is bounded by the server's answer limit (the connect timeout) beyond an
/// acquire's wait: a server that stops answering mid-call is unreachable, and retried.
pub fn keep_options(conn: &ConnArgs, server: &Server, ttl: Duration) -> KeepOptions {
    let defaults = KeepOptions::default();
    KeepOptions {
        retry: Backoff { max_elapsed: Some(conn.retry_for), ..Backoff::default() },
        margin: Some(ttl / 10),
        timeout: server.answer_limit().unwrap_or(defaults.timeout),
        ..defaults
    }
}

/// After `signal` stopped the acquire of `key` with `token`: cancels the wait on the server, then
/// releases what it may have granted meanwhile. Bounded, as pg-fence was asked to stop.
async fn abandon(tracking: &Tracking, key: &str, token: Uuid, signal: libc::c_int) -> Exit {
    tracking.cancel().await;
    if !release_token(&tracking.server, key, token).await {
        crate::sayln!("pg-fence: the wait for {key} was not cancelled: a lease it got ends at its TTL");
    }
    interrupted(key, signal)
}

/// Releases whatever lease `token` may hold on `key`, within ABANDON_LIMIT: whether the server
/// answered. Only this process knows the token, so a grant it never heard of (a reply lost with
/// its connection) would hold the key until its TTL.
async fn release_token(server: &Server, key: &str, token: Uuid) -> bool {
    let release = async {
        let conn = server.connect().await.ok()?;
        let sql = "SELECT fence.lease_release($1, $2::text::uuid)";
        conn.query_one(sql, &[&key, &token.to_string()]).await.ok()
    };
    tokio::time::timeout(ABANDON_LIMIT, release).await.ok().flatten().is_some()
}

/// pg-fence's exit on `signal`, before the command started.
pub fn interrupted(key: &str, signal: libc::c_int) -> Exit {
    Exit::new(Code::Signalled(signal), format!("signal {signal} before the command started: {key} not held"))
}

/// The lease, waiting up to `wait` (None: as long as it takes); `Code::Held` when it is not granted.
/// An acquire whose outcome is unknown (its reply lost, and no retry got one) releases `token`,
/// `opts`'s, before pg-fence exits: the client's own release of it runs on a task that would not
/// outlive pg-fence's runtime.
async fn acquire(
    server: &Tracking,
    key: &str,
    opts: &AcquireOptions,
    token: Uuid,
    wait: Option<Duration>,
    keep: KeepOptions,
) -> Result<HeldLease, Exit> {
    let end = wait.map(|wait| tokio::time::Instant::now() + wait);
    loop {
        let left = end.map_or(WAIT_STEP, |end| end.saturating_duration_since(tokio::time::Instant::now()));
        match hold(server.clone(), key, &opts.clone().wait(left.min(WAIT_STEP)), keep.clone()).await {
            Ok(held) => return Ok(held),
            Err(Error::WaitTimedOut { .. }) if end.is_none_or(|end| tokio::time::Instant::now() < end) => {}
            Err(Error::WaitTimedOut { .. }) => {
                return Err(Exit::new(
                    Code::Held,
                    format!("{key} is held by {}", holder_text(&server.server, key).await),
                ))
            }
            Err(err @ Error::OutcomeUnknown(_)) => {
                if !release_token(&server.server, key, token).await {
                    crate::sayln!(
                        "pg-fence: the acquire of {key} may have been granted and could not be released: \
                         such a lease ends at its TTL"
                    );
                }
                return Err(err.into());
            }
            Err(err) => return Err(err.into()),
        }
    }
}

/// The owner passed to the command.
fn owner_of(env: &[(&str, String)]) -> String {
    env.iter().find(|(name, _)| *name == "PG_FENCE_OWNER").map(|(_, owner)| owner.clone()).unwrap_or_default()
}

/// How long one watch of the key waits on the server before it is asked again.
const WATCH_STEP: &str = "30 seconds";

/// The pause before the watch's first reconnect after a failure; doubled after each failure in a
/// row, up to WATCH_PAUSE_MAX, so that a server that keeps failing the watch is not asked every
/// second for as long as the command runs.
const WATCH_PAUSE: Duration = Duration::from_secs(1);
const WATCH_PAUSE_MAX: Duration = Duration::from_secs(60);

/// Completes when the server tells that the lease `token` (its `fence`, held by `owner`) on `key`
/// has ended, with why: `fence.await_change` wakes at a revocation (or any change of the key's live
/// lease), then `fence.lease_status` says whether this lease ended and why. Never completes while
/// the server cannot be reached: that is the keeper's to judge, by its deadline. A refusal that
/// trying again cannot help (see `watch_goes_on`) ends the watch, said once; the keeper's renewals
/// still hear of a revocation.
pub(crate) async fn watch_end(
    server: Server,
    key: String,
    fence: i64,
    owner: String,
    token: Uuid,
) -> LossReason {
    let (mut seen_fence, mut seen_owner) = (Some(fence), Some(owner));
    let change = format!("SELECT fence, owner FROM fence.await_change($1, $2, $3, '{WATCH_STEP}')");
    let status = "SELECT state, reason FROM fence.lease_status($1, $2::text::uuid)";
    let mut pause = WATCH_PAUSE;
    loop {
        let failed: Error = match server.connect().await {
            Err(err) => Error::Connect(err),
            Ok(conn) => loop {
                let row = match conn.query_one(&change, &[&key, &seen_fence, &seen_owner]).await {
                    Ok(row) => row,
                    Err(err) => break Error::Db(err),
                };
                pause = WATCH_PAUSE;
                let now: (Option<i64>, Option<String>) = (row.get(0), row.get(1));
                if now == (seen_fence, seen_owner.clone()) {
                    continue;
                }
                (seen_fence, seen_owner) = now;
                let row = match conn.query_one(status, &[&key, &token.to_string()]).await {
                    Ok(row) => row,
                    Err(err) => break Error::Db(err),
                };
                let (state, reason): (String, Option<String>) = (row.get(0), row.get(1));
                if state != "live" {
                    return match reason.as_deref() {
                        Some("expired") => LossReason::Expired,
                        Some("revoked") => LossReason::Revoked,
                        Some("taken_over") => LossReason::TakenOver,
                        Some("session_ended") => LossReason::SessionEnded,
                        _ => LossReason::Unknown,
                    };
                }
            },
        };
        if !watch_goes_on(failed.sqlstate()) {
            crate::sayln!(
                "pg-fence: not watching {key} for a revocation ({}): a revocation is heard of at the \
                 lease's next renewal instead",
                crate::exit::describe(&failed)
            );
            return std::future::pending().await;
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(WATCH_PAUSE_MAX);
    }
}

/// Whether the watch tries again after a failure with `sqlstate`: with none (the connection broke
/// or the server did not answer) or one of the server ending or refusing the session for now
/// (class 08, 57P0x, 53300 too many connections). Any other refusal (a statement_timeout shorter
/// than a watch's step, a missing privilege, a refused login) would only repeat.
fn watch_goes_on(sqlstate: Option<&str>) -> bool {
    sqlstate.is_none_or(|code| code.starts_with("08") || code.starts_with("57P0") || code == "53300")
}

/// Why the command is stopped, and how long it is given after SIGTERM: `--kill-after` after a
/// revocation; after any other loss (the server could not be reached, the lease expired or was
/// taken over) at most half the margin by which the local deadline comes before the server's
/// expiry (see `keep_options`), so that the command is killed before the server can grant the key
/// to another holder, or soon after another got it, whatever --kill-after says.
/// A pause of pg-fence itself as long as a renewal period (`paused`) is named as the cause of a
/// lease that lapsed.
pub fn loss(key: &str, state: LeaseState, supervise: &Supervise, paused: Duration) -> Loss {
    // A revocation's grace is --lock-delay's to cover; after any other loss the key may be
    // another's already (expired, taken over, lost in a restart), or will be at the server's expiry.
    let kill_after = match state {
        LeaseState::Lost(LossReason::Revoked) => supervise.kill_after,
        _ => supervise.kill_after.min(supervise.ttl / 20),
    };
    // A pause explains a lease let lapse, not one ended by someone else.
    let lapsed = !matches!(state, LeaseState::Lost(LossReason::Revoked | LossReason::SessionEnded));
    let why = match lapsed && paused >= supervise.ttl / 3 {
        true => format!(
            "pg-fence itself did not run for {:.1}s (it was stopped: SIGSTOP, Ctrl-Z, a suspended \
             machine, or starved of CPU), past the renewals of its lease on {key}, which it no longer holds",
            paused.as_secs_f64()
        ),
        false => why_lost(key, state),
    };
    Loss { why, kill_after }
}

/// Why the command is stopped, for stderr.
pub fn why_lost(key: &str, state: LeaseState) -> String {
    match state {
        LeaseState::Unknown => {
            format!("no answer from the server before the local deadline of the lease on {key} (unreachable)")
        }
        state => format!(
            "the lease on {key} was lost ({})",
            state.reason().map_or("unknown".into(), |r| r.to_string())
        ),
    }
}

/// "HOST:PID", the default owner and election value.
pub fn default_name() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    format!("{}:{}", host.trim(), std::process::id())
}

/// Who holds `key` and since when, for people: "OWNER since TIME (fence F)".
async fn holder_text(server: &Server, key: &str) -> String {
    let sql = "SELECT string_agg(format('%s since %s (fence %s)', owner, date_trunc('second', acquired_at), fence), ', ' ORDER BY fence) \
               FROM fence.leases WHERE key = $1 AND live";
    let asked = async {
        let conn = server.connect().await.ok()?;
        conn.query_one(sql, &[&key]).await.ok()?.get::<_, Option<String>>(0)
    };
    tokio::time::timeout(Duration::from_secs(5), asked)
        .await
        .ok()
        .flatten()
        .unwrap_or_else(|| "another holder".into())
}

/// While waiting on a terminal: who holds the key, on one line rewritten every second; `shown` once
/// written. Not before a second has passed: a key granted at once is not waited for, and would be
/// said to be held by "another holder" (nobody's).
async fn show_holder(server: Server, key: String, shown: Arc<AtomicBool>) {
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let holder = holder_text(&server, &key).await;
        shown.store(true, Ordering::SeqCst);
        crate::say!("\r\x1b[Kpg-fence: waiting for {key}, held by {holder}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn supervise(ttl: u64, kill_after: u64) -> Supervise {
        Supervise {
            ttl: Duration::from_secs(ttl),
            kill_after: Duration::from_secs(kill_after),
            lock_delay: Duration::ZERO,
            command: vec!["true".into()],
        }
    }

    #[test]
    fn after_a_loss_that_may_free_the_key_the_grace_ends_before_the_next_holder_can_start() {
        // The defaults: TTL 30 s, --kill-after 10 s; a twentieth of the TTL is 1.5 s.
        let defaults = supervise(30, 10);
        for state in [
            LeaseState::Unknown,
            LeaseState::Lost(LossReason::Expired),
            LeaseState::Lost(LossReason::TakenOver),
            LeaseState::Lost(LossReason::Restarted),
            LeaseState::Lost(LossReason::Unknown),
        ] {
            let loss = loss("job", state, &defaults, Duration::ZERO);
            assert_eq!(loss.kill_after, Duration::from_millis(1500), "{state:?}: {}", loss.why);
        }
        // A shorter --kill-after is kept.
        assert_eq!(
            loss("job", LeaseState::Unknown, &supervise(30, 1), Duration::ZERO).kill_after,
            Duration::from_secs(1)
        );
    }

    #[test]
    fn after_a_revocation_the_grace_is_kill_after_which_lock_delay_covers() {
        let loss = loss("job", LeaseState::Lost(LossReason::Revoked), &supervise(30, 10), Duration::ZERO);
        assert_eq!(loss.kill_after, Duration::from_secs(10));
    }

    #[test]
    fn the_watch_gives_up_on_refusals_that_would_only_repeat() {
        for transient in [None, Some("08006"), Some("57P01"), Some("57P03"), Some("53300")] {
            assert!(watch_goes_on(transient), "{transient:?} is tried again");
        }
        for lasting in [Some("57014"), Some("42501"), Some("28P01"), Some("42883")] {
            assert!(!watch_goes_on(lasting), "{lasting:?} ends the watch");
        }
    }
}
