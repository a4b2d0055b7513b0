//! `pg-fence elect`: campaign for a key, run the command while leading (stopped as `run` stops it
//! when the leadership is lost), resign when it ends.
use crate::args::{ConnArgs, ElectArgs};
use crate::child::{self, Ended};
use crate::connect::Server;
use crate::exit::{Code, Exit};
use crate::run::{default_name, keep_options, why_lost};
use pg_fence_client::{AcquireOptions, ElectOptions, Elector};

pub async fn elect(args: ElectArgs, conn: &ConnArgs, server: Server) -> Result<i32, Exit> {
    let value = args.value.unwrap_or_else(default_name);
    let opts = ElectOptions::new(AcquireOptions::new(args.supervise.ttl))
        .keep(keep_options(conn, args.supervise.ttl));
    let elector = Elector::new(server, &args.name, opts);
    let leadership = elector.campaign(&value).await?;
    let env = [
        ("PG_FENCE_KEY", args.name.clone()),
        ("PG_FENCE_FENCE", leadership.fence().to_string()),
        ("PG_FENCE_OWNER", value),
    ];
    let child = match child::spawn(&args.supervise.command, &env, child::Forwarded::new()) {
        Ok(child) => child,
        Err(exit) => {
            leadership.resign().await.ok();
            return Err(exit);
        }
    };
    let lost = async { why_lost(&args.name, leadership.lost().await) };
    match child.supervise(lost, args.supervise.kill_after).await {
        Ended::Stopped => Ok(Code::Lost.code()),
        Ended::Exited(code) => {
            if let Err(err) = leadership.resign().await {
                eprintln!(
                    "pg-fence: the leadership of {} was not released ({}): it ends at its TTL",
                    args.name,
                    crate::exit::describe(&err)
                );
            }
            Ok(code)
        }
    }
}
