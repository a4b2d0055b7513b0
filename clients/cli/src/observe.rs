//! `pg-fence observe`: a line per change of a key's leader, vacancy included (fence.await_change,
//! through the client's observer).
use crate::args::{ConnArgs, ObserveArgs};
use crate::connect::Server;
use crate::exit::Exit;
use crate::run::keep_options;
use pg_fence_client::{AcquireOptions, ElectOptions, Elector, Error, Leader};
use serde_json::json;
use std::time::{Duration, SystemTime};

pub async fn observe(args: ObserveArgs, conn: &ConnArgs, server: Server) -> Result<i32, Exit> {
    let ttl = Duration::from_secs(30);
    let keep = keep_options(conn, &server, ttl);
    // The observer's first item is the present, the vacancy included.
    let opts = ElectOptions::new(AcquireOptions::new(ttl)).keep(keep);
    let elector = Elector::new(server, &args.name, opts);
    let mut observer = elector.observe();
    let mut last = None;
    while let Some(news) = observer.next().await {
        let leader = match news {
            Err(Error::Blind(why)) => {
                // Not a vacancy, nor the old leader: the observer cannot tell; it goes on.
                print_blind(&args, &why);
                last = None;
                continue;
            }
            news => news?,
        };
        if last.as_ref() != Some(&leader) {
            print(&args, &leader);
            last = Some(leader);
        }
    }
    Ok(0)
}

fn print(args: &ObserveArgs, leader: &Option<Leader>) {
    let line = match (args.json, leader) {
        (true, Some(leader)) => json!({
            "name": args.name, "leader": true, "value": leader.owner, "fence": leader.fence,
            "acquired_at": time(leader.acquired_at), "expires_at": time(leader.expires_at),
        })
        .to_string(),
        (true, None) => json!({ "name": args.name, "leader": false }).to_string(),
        (false, Some(leader)) => {
            format!(
                "{}: leader {} (fence {}, since {})",
                args.name,
                leader.owner,
                leader.fence,
                time(leader.acquired_at)
            )
        }
        (false, None) => format!("{}: no leader", args.name),
    };
    println!("{line}");
}

fn print_blind(args: &ObserveArgs, why: &str) {
    match args.json {
        true => println!("{}", json!({ "name": args.name, "blind": true, "why": why })),
        false => println!("{}: cannot see ({why})", args.name),
    }
}

fn time(at: SystemTime) -> String {
    humantime::format_rfc3339_millis(at).to_string()
}
