//! `pg-fence run`: acquire a key, run the command under its lease, keep the lease renewed, and end
//! it when the command ends (or leave it to expire with `--at-least`).
use crate::args::{ConnArgs, RunArgs};
use crate::child::{self, Ended};
use crate::connect::{Server, Tracking, ABANDON_LIMIT};
use crate::exit::{Code, Exit};
use pg_fence_client::{
    hold, AcquireOptions, Backoff, Connector, Error, HeldLease, KeepOptions, LeaseState, LossReason,
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
        .token(token);
    let wait = if args.no_wait { Some(Duration::ZERO) } else { args.wait };
    let shown = Arc::new(AtomicBool::new(false));
    let showing = (wait != Some(Duration::ZERO) && std::io::stderr().is_terminal())
        .then(|| tokio::spawn(show_holder(server.clone(), args.key.clone(), shown.clone())));
    let mut signals = child::Forwarded::new();
    let tracking = Tracking::new(server.clone());
    let keep = keep_options(conn, args.supervise.ttl);
    let held = tokio::select! {
        held = acquire(&tracking, &args.key, &opts, wait, keep) => held,
        signal = signals.next() => Err(abandon(&tracking, &args.key, token, signal).await),
    };
    if let Some(showing) = showing {
        showing.abort();
        if shown.load(Ordering::SeqCst) {
            crate::sayln!();
        }
    }
    let held = held?;
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
    let child = match child::spawn(&args.supervise.command, &env, signals) {
        Ok(child) => child,
        Err(exit) => {
            held.release().await.ok();
            return Err(exit);
        }
    };
    let lost = async { why_lost(&lease.key, held.lost().await) };
    match child.supervise(lost, args.supervise.kill_after).await {
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
pub fn keep_options(conn: &ConnArgs, ttl: Duration) -> KeepOptions {
    KeepOptions {
        retry: Backoff { max_elapsed: Some(conn.retry_for), ..Backoff::default() },
        margin: Some(ttl / 10),
        ..KeepOptions::default()
    }
}

/// After `signal` stopped the acquire of `key` with `token`: cancels the wait on the server, then
/// releases what it may have granted meanwhile. Bounded, as pg-fence was asked to stop.
async fn abandon(tracking: &Tracking, key: &str, token: Uuid, signal: libc::c_int) -> Exit {
    tracking.cancel().await;
    let release = async {
        let conn = tracking.server.connect().await.ok()?;
        let sql = "SELECT fence.lease_release($1, $2::text::uuid)";
        conn.query_one(sql, &[&key, &token.to_string()]).await.ok()
    };
    if tokio::time::timeout(ABANDON_LIMIT, release).await.ok().flatten().is_none() {
        crate::sayln!("pg-fence: the wait for {key} was not cancelled: a lease it got ends at its TTL");
    }
    interrupted(key, signal)
}

/// pg-fence's exit on `signal`, before the command started.
pub fn interrupted(key: &str, signal: libc::c_int) -> Exit {
    Exit::new(Code::Signalled(signal), format!("signal {signal} before the command started: {key} not held"))
}

/// The lease, waiting up to `wait` (None: as long as it takes); `Code::Held` when it is not granted.
async fn acquire(
    server: &Tracking,
    key: &str,
    opts: &AcquireOptions,
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
            Err(err) => return Err(err.into()),
        }
    }
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
