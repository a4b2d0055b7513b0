//! The kept lease's behaviours (clients/behaviours/keeper.json, which the Java suite runs too), each
//! scenario run twice against a real server: through `hold`'s HeldLease (a connection of its own),
//! then through `FenceClient::hold` (the client's keeper, whose connections are named
//! `<app>_keeper`). Prints how long each loss took to be told.
mod common;
use common::proxy::Proxy;
use common::scenarios::{ensure, kind, load, run_every, seconds};
use common::{config, eventually, plain, recording_losses, Frozen, Told};
use pg_fence_client::{hold, lease, AcquireOptions, Error, FenceClient, HeldLease, KeepOptions, LeaseState};
use pg_fence_integration::Cluster;
use serde_json::Value;
use std::collections::HashMap;
use std::time::{Duration, Instant};
use tokio::task::JoinHandle;
use tokio_postgres::Client;

/// The steps the behaviours file may use (its "steps" documents them).
const KINDS: [&str; 12] = [
    "hold",
    "held",
    "revoke",
    "terminate",
    "stop_server_for",
    "crash_server",
    "hang_connections",
    "take_over",
    "told",
    "not_told",
    "guard",
    "release",
];

/// A holder: a client of its own (its sessions named `app`), its held lease, and what `on_lost` told.
struct Holder {
    app: String,
    /// The client whose keeper keeps the lease (through `FenceClient::hold`).
    _client: Option<FenceClient<tokio_postgres::Config>>,
    held: HeldLease,
    told: Told,
    proxy: Option<Proxy>,
}

struct Run<'a> {
    cluster: &'a Cluster,
    scenario: &'a Value,
    key: String,
    /// The administrator's session, made before the steps that time a loss from their start.
    admin: Client,
    holders: HashMap<String, Holder>,
    /// Whether leases are kept by a client's keeper (`FenceClient::hold`) rather than `hold`.
    by_client: bool,
    /// The tasks that resume a stopped server.
    resumes: Vec<JoinHandle<()>>,
    /// When the step before this one began, and its kind: a loss is told within a time of it.
    previous: (Instant, &'static str),
    current: (Instant, &'static str),
}

fn state_name(state: &LeaseState) -> &'static str {
    match state {
        LeaseState::Held { .. } => "held",
        LeaseState::Lost(_) => "lost",
        LeaseState::Unknown => "unknown",
        LeaseState::Released => "released",
    }
}

fn reason_name(state: &LeaseState) -> &'static str {
    state.reason().map_or("none", |reason| reason.as_str())
}

fn told_now(told: &Told) -> Vec<LeaseState> {
    told.lock().unwrap().iter().map(|(state, _)| *state).collect()
}

impl Run<'_> {
    fn holder(&self, step: &Value, kind: &str) -> Result<&Holder, String> {
        let name = step[kind].as_str().unwrap();
        self.holders.get(name).ok_or_else(|| format!("no holder {name}"))
    }

    async fn step(&mut self, kind: &str, step: &Value) -> Result<(), String> {
        match kind {
            "hold" => self.hold(step).await?,
            "held" => {
                let holder = self.holder(step, kind)?;
                let until = Instant::now() + seconds(&step["for"]);
                while Instant::now() < until {
                    let state = holder.held.state();
                    ensure(holder.held.is_held(), || format!("not held: {state:?}"))?;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                let told = told_now(&holder.told);
                ensure(told.is_empty(), || format!("told {told:?}"))?;
            }
            "revoke" => {
                let revoked = self.admin.query_one("SELECT fence.lease_revoke($1)", &[&self.key]).await;
                ensure(revoked.map_err(|err| err.to_string())?.get(0), || "nothing to revoke".into())?;
            }
            "terminate" => {
                let app = &self.holder(step, kind)?.app;
                // The holder's sessions, its keeper's included.
                let sql = "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
                           WHERE application_name IN ($1, $1 || '_keeper')";
                let ended: i64 =
                    self.admin.query_one(sql, &[app]).await.map_err(|err| err.to_string())?.get(0);
                ensure(ended > 0, || "no session to end".into())?;
            }
            "stop_server_for" => {
                // Resumed in the background: the steps that follow run while it is stopped.
                let frozen = Frozen::server(self.cluster);
                let resume_in = seconds(&step[kind]);
                self.resumes.push(tokio::spawn(async move {
                    tokio::time::sleep(resume_in).await;
                    drop(frozen);
                }));
            }
            "crash_server" => {
                tokio::task::block_in_place(|| {
                    self.cluster.crash();
                    self.cluster.restart();
                });
                self.admin = plain(self.cluster.port()).await;
            }
            "hang_connections" => {
                let proxy =
                    self.holder(step, kind)?.proxy.as_ref().ok_or("its connections are not proxied")?;
                proxy.hang();
            }
            "take_over" => {
                let fence = self.holder(step, kind)?.held.fence();
                let opts = AcquireOptions::new(Duration::from_secs(30)).wait(seconds(&step["wait"]));
                let taken =
                    lease::acquire(&self.admin, &self.key, &opts).await.map_err(|err| err.to_string())?;
                let taken = taken.ok_or("not granted")?;
                ensure(taken.fence > fence, || format!("granted fence {}, not above {fence}", taken.fence))?;
            }
            "told" => self.told(step).await?,
            "not_told" => {
                let holder = self.holder(step, kind)?;
                let told = told_now(&holder.told);
                ensure(told.is_empty(), || format!("told {told:?}"))?;
                ensure(holder.held.is_held(), || format!("not held: {:?}", holder.held.state()))?;
            }
            "guard" => {
                let guarded = self.guard(self.holder(step, kind)?).await?;
                let want = step["result"].as_str().unwrap();
                ensure(guarded == want, || format!("the guard was {guarded}, not {want}"))?;
            }
            "release" => self.release(step).await?,
            other => return Err(format!("no step {other}")),
        }
        Ok(())
    }

    async fn hold(&mut self, step: &Value) -> Result<(), String> {
        let name = step["hold"].as_str().unwrap();
        let flag = |field: &str| step.get(field).map(|value| value.as_bool().unwrap());
        let mut opts =
            AcquireOptions::new(seconds(step.get("ttl").unwrap_or(&self.scenario["ttl"]))).owner(name);
        if let Some(durable) = flag("durable") {
            opts = opts.durable(durable);
        }
        if let Some(bound) = flag("session_bound") {
            opts = opts.session_bound(bound);
        }
        let mut keep = KeepOptions::default();
        if let Some(every) = step.get("renew_every") {
            keep = keep.renew_every(seconds(every));
        }
        let (keep, told) = recording_losses(keep);
        let proxy = match flag("via_proxy") {
            Some(true) => Some(Proxy::start(self.cluster.port()).await),
            _ => None,
        };
        let port = proxy.as_ref().map_or(self.cluster.port(), |proxy| proxy.port);
        let app = format!("beh_{name}_{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
        let (held, client) = match self.by_client {
            true => {
                let client = FenceClient::new(config(port, &app));
                (client.hold(&self.key, &opts, keep).await, Some(client))
            }
            false => (hold(config(port, &app), &self.key, &opts, keep).await, None),
        };
        let held = held.map_err(|err| err.to_string())?;
        ensure(held.is_held(), || format!("not held at once: {:?}", held.state()))?;
        self.holders.insert(name.to_owned(), Holder { app, _client: client, held, told, proxy });
        Ok(())
    }

    /// Told once, by `on_lost` and `lost()` alike, in time.
    async fn told(&self, step: &Value) -> Result<(), String> {
        let holder = self.holder(step, "told")?;
        let within = seconds(&step["within"]);
        let (since, after) = self.previous;
        // Waits past the limit, so that a late telling is measured rather than missed.
        let wait = (since + within + Duration::from_secs(5)).saturating_duration_since(Instant::now());
        eventually(wait, || async { !holder.told.lock().unwrap().is_empty() }).await;
        let told = holder.told.lock().unwrap().clone();
        let [(state, at)] = told[..] else { return Err(format!("told {:?}", told_now(&holder.told))) };
        let want = step["reason"].as_str().unwrap();
        ensure(reason_name(&state) == want, || format!("told {state:?}, not {want}"))?;
        let lost = tokio::time::timeout(Duration::from_secs(1), holder.held.lost()).await;
        ensure(lost == Ok(state), || format!("lost() says {lost:?}, on_lost {state:?}"))?;
        let now = holder.held.state();
        let want = step["state"].as_str().unwrap();
        ensure(state_name(&now) == want, || format!("its state is {now:?}, not {want}"))?;
        ensure(!holder.held.is_held(), || "held still".into())?;
        let took = at - since;
        println!(
            "[behaviour] {}: told {} {:.1} ms after the {after} began (limit {:.0} ms)",
            self.scenario["name"].as_str().unwrap(),
            reason_name(&state),
            took.as_secs_f64() * 1000.0,
            within.as_secs_f64() * 1000.0,
        );
        ensure(took <= within, || format!("told after {took:?}, more than {within:?}"))
    }

    /// Guards in a transaction of its own: "ok" (committed), "stale" or "lost".
    async fn guard(&self, holder: &Holder) -> Result<&'static str, String> {
        let mut writer = plain(self.cluster.port()).await;
        let tx = writer.transaction().await.map_err(|err| err.to_string())?;
        match holder.held.guard(&tx).await {
            Ok(()) => tx.commit().await.map(|()| "ok").map_err(|err| err.to_string()),
            Err(Error::StaleFence { .. }) => Ok("stale"),
            Err(Error::LeaseLost { .. }) => {
                // A guard the server refused would have aborted the transaction.
                let sent = tx.query_one("SELECT 1", &[]).await.err();
                ensure(sent.is_none(), || format!("the guard was sent: {sent:?}"))?;
                Ok("lost")
            }
            Err(other) => Err(other.to_string()),
        }
    }

    async fn release(&mut self, step: &Value) -> Result<(), String> {
        let name = step["release"].as_str().unwrap();
        let holder = self.holders.remove(name).ok_or_else(|| format!("no holder {name}"))?;
        let told = told_now(&holder.told);
        let watch = holder.held.watch();
        let released = holder.held.release().await.map_err(|err| err.to_string())?;
        let want = step["result"].as_bool().unwrap();
        ensure(released == want, || format!("the release said {released}, not {want}"))?;
        let state = *watch.borrow();
        let want = step["state"].as_str().unwrap();
        ensure(state_name(&state) == want, || format!("its state is {state:?}, not {want}"))?;
        if let Some(want) = step.get("reason").and_then(Value::as_str) {
            ensure(reason_name(&state) == want, || format!("the release found {state:?}, not {want}"))?;
        }
        // on_lost is for losses the holder did not cause: a release is not told.
        let after = told_now(&holder.told);
        ensure(after == told, || format!("told {after:?} by the release"))
    }

    async fn run(mut self) -> Result<(), String> {
        let steps = self.scenario["steps"].as_array().unwrap();
        let mut outcome = Ok(());
        for (number, step) in steps.iter().enumerate() {
            let kind = kind(step, &KINDS);
            self.previous = std::mem::replace(&mut self.current, (Instant::now(), kind));
            if let Err(err) = self.step(kind, step).await {
                outcome = Err(format!("step {number} {step}: {err}"));
                break;
            }
        }
        for resume in self.resumes.drain(..) {
            resume.await.ok();
        }
        for (_, holder) in self.holders.drain() {
            holder.held.release().await.ok();
        }
        outcome
    }
}

#[test]
fn every_behaviour_of_the_kept_lease() {
    let behaviours = load("keeper.json", &KINDS);
    for by_client in [false, true] {
        println!("kept by {}:", if by_client { "the client's keeper" } else { "hold" });
        run_every(
            &behaviours,
            ("rc_keeper_behaviours", 27630),
            ("rc_keeper_behaviours_crash", 27631),
            |cluster, scenario| Box::pin(keep(cluster, scenario, by_client)),
        );
    }
}

/// One scenario, on a key of its own.
async fn keep<'a>(cluster: &'a Cluster, scenario: &'a Value, by_client: bool) -> Result<(), String> {
    let run = Run {
        by_client,
        cluster,
        scenario,
        key: format!("keeper:{}", scenario["name"].as_str().unwrap()),
        admin: plain(cluster.port()).await,
        holders: HashMap::new(),
        resumes: Vec::new(),
        previous: (Instant::now(), ""),
        current: (Instant::now(), ""),
    };
    run.run().await
}
