//! `pg-fence elect`: campaign for a key, run the command while leading (stopped as `run` stops it
//! when the leadership is lost), resign when it ends.
use crate::args::{ConnArgs, ElectArgs};
use crate::child::{self, Ended};
use crate::connect::{Server, Tracking, ABANDON_LIMIT};
use crate::exit::{Code, Exit};
use crate::run::{default_name, interrupted, keep_options, loss, lost_before_end, watch_end};
use pg_fence_client::{AcquireOptions, Connector, ElectOptions, Elector, LeaseState};
use std::time::Duration;

pub async fn elect(args: ElectArgs, conn: &ConnArgs, server: Server) -> Result<i32, Exit> {
    let value = args.value.unwrap_or_else(default_name);
    let opts =
        ElectOptions::new(AcquireOptions::new(args.supervise.ttl).lock_delay(args.supervise.lock_delay))
            .keep(keep_options(conn, &server, args.supervise.ttl));
    let mut signals = child::Forwarded::new();
    let tracking = Tracking::new(server.clone());
    let elector = Elector::new(tracking.clone(), &args.name, opts);
    let campaigned = tokio::select! {
        leadership = elector.campaign(&value) => Ok(leadership),
        signal = signals.next() => Err(signal),
    };
    let leadership = match campaigned {
        Ok(leadership) => leadership?,
        Err(signal) => return Err(abandon(&tracking, &args.name, &value, signal).await),
    };
    if let Some(signal) = signals.caught().await {
        leadership.resign().await.ok();
        return Err(interrupted(&args.name, signal));
    }
    let env = [
        ("PG_FENCE_KEY", args.name.clone()),
        ("PG_FENCE_FENCE", leadership.fence().to_string()),
        ("PG_FENCE_OWNER", value.clone()),
    ];
    let child = match child::spawn(
        &args.supervise.command,
        &env,
        signals,
        args.supervise.kill_after,
        leadership.held().deadline(),
    ) {
        Ok(child) => child,
        Err(exit) => {
            leadership.resign().await.ok();
            return Err(exit);
        }
    };
    let pauses = child::Pauses::start();
    // The leadership's end is watched for on the server too, as `run` watches an exclusive lease:
    // a revocation stops the command at once rather than at the next renewal.
    let lease = leadership.lease();
    let watched = watch_end(server, args.name.clone(), lease.fence, value, lease.token);
    let lost = async {
        tokio::select! {
            state = leadership.lost() => loss(&args.name, state, &args.supervise, pauses.longest()),
            reason = watched => loss(&args.name, LeaseState::Lost(reason), &args.supervise, pauses.longest()),
        }
    };
    match child.supervise(leadership.held(), lost).await {
        Ended::Stopped => Ok(Code::Lost.code()),
        Ended::Exited(code) => {
            let resigned = leadership.resign().await;
            if let Ok(false) = resigned {
                return Ok(lost_before_end(&format!("the leadership of {}", args.name), code));
            }
            if let Err(err) = resigned {
                crate::sayln!(
                    "pg-fence: the leadership of {} was not released ({}): it ends at its TTL",
                    args.name,
                    crate::exit::describe(&err)
                );
            }
            Ok(code)
        }
    }
}

/// After `signal` stopped the campaign for `name`: cancels its wait on the server, so that no grant
/// follows, then waits (bounded) until no lease of this candidate's `value` is live. The dropped
/// campaign releases what it was granted, in a task that pg-fence's exit would cut short; until
/// then observers would see a leader that runs nothing.
async fn abandon(tracking: &Tracking, name: &str, value: &str, signal: libc::c_int) -> Exit {
    tracking.cancel().await;
    let sql = "SELECT count(*) FROM fence.leases WHERE key = $1 AND owner = $2 AND live";
    let released = async {
        let conn = tracking.server.connect().await.ok()?;
        while conn.query_one(sql, &[&name, &value]).await.ok()?.get::<_, i64>(0) > 0 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Some(())
    };
    if tokio::time::timeout(ABANDON_LIMIT, released).await.ok().flatten().is_none() {
        crate::sayln!("pg-fence: the campaign for {name} may have been granted a lease: it ends at its TTL");
    }
    interrupted(name, signal)
}
