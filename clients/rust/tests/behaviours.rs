//! The electors' behaviours (clients/behaviours/elector.json, which the Python client's suite runs
//! too), each scenario run through this crate's `Elector` against a real server, one after the
//! other on one cluster; a failing scenario does not stop the others, and each is reported.
mod common;
use common::scenarios::{ensure, kind, load, run_every, seconds};
use common::{config, plain, Frozen};
use pg_fence_client::{AcquireOptions, ElectOptions, Elector, Leader, Leadership, StopReason};
use pg_fence_integration::Cluster;
use serde_json::Value;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::task::JoinHandle;
use tokio_postgres::Config;

const LIMIT: Duration = Duration::from_secs(10);

/// The steps the behaviours file may use (its "steps" documents them).
const KINDS: [&str; 16] = [
    "observe",
    "campaign",
    "leads",
    "waiters",
    "waits",
    "observed",
    "leader",
    "proclaim",
    "resign",
    "stopped",
    "handoff",
    "cancel",
    "revoke",
    "terminate",
    "freeze_server",
    "crash_server",
];

type Shared<T> = Arc<Mutex<T>>;
/// What an observer saw, and how much of it the steps have read.
type Seen = (Shared<Vec<Option<Leader>>>, usize);

/// A candidate: an elector of its own, whose task campaigns and keeps the leadership it wins.
struct Candidate {
    app: String,
    elector: Arc<Elector<Config>>,
    leadership: Arc<tokio::sync::Mutex<Option<Leadership<Config>>>>,
    failed: Shared<Option<String>>,
    started: Shared<Vec<i64>>,
    stopped: Shared<Vec<StopReason>>,
    task: JoinHandle<()>,
}

struct Run<'a> {
    cluster: &'a Cluster,
    scenario: &'a Value,
    key: String,
    elector: Elector<Config>,
    candidates: HashMap<String, Candidate>,
    values: HashMap<String, String>,
    fences: HashMap<String, i64>,
    handed: HashMap<String, Leader>,
    observers: HashMap<String, Seen>,
    observing: Vec<JoinHandle<()>>,
    step_ended: Instant,
}

/// Polls `check` until it is true or `limit` passed.
async fn eventually(limit: Duration, mut check: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if check() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    false
}

impl Run<'_> {
    fn port(&self) -> u16 {
        self.cluster.port()
    }

    async fn admin<T: tokio_postgres::types::FromSqlOwned>(&self, sql: &str, param: &str) -> T {
        plain(self.port()).await.query_one(sql, &[&param]).await.unwrap().get(0)
    }

    fn candidate(&self, step: &Value, field: &str) -> &Candidate {
        &self.candidates[step[field].as_str().unwrap()]
    }

    fn leader_of(&self, name: &Value) -> Option<(i64, String)> {
        let name = name.as_str()?;
        Some((self.fences[name], self.values[name].clone()))
    }

    async fn step(&mut self, step: &Value) -> Result<(), String> {
        let kind = kind(step, &KINDS);
        let name = step[kind].as_str().unwrap_or_default().to_owned();
        match kind {
            "observe" => {
                let seen: Shared<Vec<Option<Leader>>> = Arc::default();
                let mut observer = self.elector.observe();
                let into = seen.clone();
                self.observing.push(tokio::spawn(async move {
                    while let Some(Ok(leader)) = observer.next().await {
                        into.lock().unwrap().push(leader);
                    }
                }));
                self.observers.insert(name, (seen, 0));
            }
            "campaign" => self.campaign(&name, step),
            "leads" => self.leads(&name, step).await?,
            "waiters" => {
                let want = step["waiters"].as_i64().unwrap() as i32;
                let mut count = -1;
                let start = Instant::now();
                while start.elapsed() < LIMIT && count != want {
                    count = self.admin("SELECT fence.waiters($1)", &self.key).await;
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                ensure(count == want, || format!("{count} waiters"))?;
            }
            "waits" => {
                let candidate = self.candidate(step, "waits");
                let waiting = candidate.leadership.lock().await.is_none() && !candidate.task.is_finished();
                ensure(waiting, || "it is not waiting".into())?;
            }
            "observed" => {
                let (seen, read) = self.observers.get_mut(&name).unwrap();
                let (seen, index) = (seen.clone(), *read);
                *read += 1;
                let came = eventually(LIMIT, || seen.lock().unwrap().len() > index).await;
                ensure(came, || format!("observed nothing new after {:?}", seen.lock().unwrap()))?;
                let got = seen.lock().unwrap()[index].clone().map(|leader| (leader.fence, leader.owner));
                let want = self.leader_of(&step["leader"]);
                ensure(got == want, || format!("observed {got:?}, not {want:?}"))?;
            }
            "leader" => {
                let got = self.elector.leader().await.map_err(|err| err.to_string())?;
                let (got, want) =
                    (got.map(|leader| (leader.fence, leader.owner)), self.leader_of(&step["leader"]));
                ensure(got == want, || format!("leader {got:?}, not {want:?}"))?;
            }
            "proclaim" => {
                let value = step["value"].as_str().unwrap();
                let slot = self.candidate(step, "proclaim").leadership.clone();
                let leadership = slot.lock().await;
                leadership.as_ref().unwrap().proclaim(value).await.map_err(|err| err.to_string())?;
                self.values.insert(name, value.to_owned());
            }
            "resign" => {
                let found = step.get("found").and_then(Value::as_str).unwrap_or("released");
                let leadership = self.candidate(step, "resign").leadership.lock().await.take().unwrap();
                let watch = leadership.held().watch();
                let resigned = leadership.resign().await.map_err(|err| err.to_string())?;
                let state = *watch.borrow();
                let how = state.reason().map_or("released", |reason| reason.as_str());
                let as_found = resigned == (found == "released") && how == found;
                ensure(as_found, || format!("resign found {resigned} ({state:?})"))?;
            }
            "stopped" => {
                let stopped = self.candidate(step, "stopped").stopped.clone();
                ensure(eventually(LIMIT, || !stopped.lock().unwrap().is_empty()).await, || {
                    "on_stopped_leading not told".into()
                })?;
                let told: Vec<&str> = stopped.lock().unwrap().iter().map(StopReason::as_str).collect();
                ensure(told == [step["reason"].as_str().unwrap()], || format!("told {told:?}"))?;
            }
            "handoff" => {
                let slot = self.candidate(step, "handoff").leadership.clone();
                let leadership = slot.lock().await;
                let to = step["to"].as_str().unwrap();
                let leader = leadership.as_ref().unwrap().handoff(to).await.map_err(|err| err.to_string())?;
                match step["result"].as_str() {
                    None => ensure(leader.is_none(), || format!("handed to {leader:?}"))?,
                    Some(result) => {
                        let owner = leader.as_ref().map(|leader| leader.owner.as_str());
                        ensure(owner == Some(&self.values[result]), || format!("handed to {leader:?}"))?;
                        self.handed.insert(result.to_owned(), leader.unwrap());
                    }
                }
            }
            "cancel" => {
                let candidate = self.candidate(step, "cancel");
                match candidate.leadership.lock().await.take() {
                    Some(leadership) => drop(leadership),
                    None => candidate.task.abort(),
                }
            }
            "revoke" => {
                let revoked: bool = self.admin("SELECT fence.lease_revoke($1)", &self.key).await;
                ensure(revoked, || "nothing to revoke".into())?;
            }
            "terminate" => {
                let app = &self.candidate(step, "terminate").app;
                let sql = "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = $1";
                let ended: i64 = self.admin(sql, app).await;
                ensure(ended > 0, || "no session to end".into())?;
            }
            "freeze_server" => {
                let frozen = Frozen::server(self.cluster);
                tokio::time::sleep(seconds(&step["freeze_server"])).await;
                drop(frozen);
            }
            "crash_server" => tokio::task::block_in_place(|| {
                self.cluster.crash();
                self.cluster.restart();
            }),
            other => return Err(format!("no step {other}")),
        }
        Ok(())
    }

    fn campaign(&mut self, name: &str, step: &Value) {
        let ttl = step.get("ttl").unwrap_or(&self.scenario["ttl"]);
        let mut lease = AcquireOptions::new(seconds(ttl));
        if let Some(durable) = step.get("durable") {
            lease = lease.durable(durable.as_bool().unwrap());
        }
        if let Some(bound) = step.get("session_bound") {
            lease = lease.session_bound(bound.as_bool().unwrap());
        }
        if let Some(delay) = step.get("lock_delay") {
            lease = lease.lock_delay(seconds(delay));
        }
        let (started, stopped): (Shared<Vec<i64>>, Shared<Vec<StopReason>>) = Default::default();
        let (on_started, on_stopped) = (started.clone(), stopped.clone());
        let opts = ElectOptions::new(lease)
            .on_started_leading(move |lease| on_started.lock().unwrap().push(lease.fence))
            .on_stopped_leading(move |reason| on_stopped.lock().unwrap().push(reason));
        let app = format!("beh_{name}_{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
        let elector = Arc::new(Elector::new(config(self.port(), &app), self.key.clone(), opts));
        let (leadership, failed): (Arc<tokio::sync::Mutex<_>>, Shared<_>) = Default::default();
        let value = step["value"].as_str().unwrap().to_owned();
        let (campaigning, into, failing) = (elector.clone(), leadership.clone(), failed.clone());
        let task = tokio::spawn(async move {
            match campaigning.campaign(&value).await {
                Ok(won) => *into.lock().await = Some(won),
                Err(err) => *failing.lock().unwrap() = Some(err.to_string()),
            }
        });
        self.values.insert(name.to_owned(), step["value"].as_str().unwrap().to_owned());
        let candidate = Candidate { app, elector, leadership, failed, started, stopped, task };
        self.candidates.insert(name.to_owned(), candidate);
    }

    async fn leads(&mut self, name: &str, step: &Value) -> Result<(), String> {
        let limit = step.get("within").map_or(LIMIT, seconds);
        let candidate = &self.candidates[name];
        let start = Instant::now();
        let mut fence = None;
        while start.elapsed() < limit && fence.is_none() && candidate.failed.lock().unwrap().is_none() {
            fence = candidate.leadership.lock().await.as_ref().map(Leadership::fence);
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let failed = candidate.failed.lock().unwrap().clone();
        ensure(failed.is_none(), || format!("the campaign failed: {failed:?}"))?;
        let fence = fence.ok_or_else(|| format!("not elected within {limit:?}"))?;
        let took = self.step_ended.elapsed();
        let not_before = step.get("not_before").map_or(Duration::ZERO, seconds);
        ensure(took >= not_before, || format!("elected after {took:?}"))?;
        let started = candidate.started.clone();
        ensure(eventually(Duration::from_secs(5), || *started.lock().unwrap() == [fence]).await, || {
            format!("on_started_leading told {:?}", started.lock().unwrap())
        })?;
        if let Some(other) = step.get("fence_above").and_then(Value::as_str) {
            ensure(fence > self.fences[other], || format!("fence {fence} not above {other}'s"))?;
        }
        if let Some(handed) = self.handed.get(name) {
            ensure(handed.fence == fence, || format!("fence {fence}, not the hand-off's {}", handed.fence))?;
        }
        self.fences.insert(name.to_owned(), fence);
        Ok(())
    }

    async fn run(mut self) -> Result<(), String> {
        let steps = self.scenario["steps"].as_array().unwrap();
        let mut outcome = Ok(());
        for (number, step) in steps.iter().enumerate() {
            if let Err(err) = self.step(step).await {
                outcome = Err(format!("step {number} {step}: {err}"));
                break;
            }
            self.step_ended = Instant::now();
        }
        for (_, candidate) in self.candidates.drain() {
            if let Some(leadership) = candidate.leadership.lock().await.take() {
                leadership.resign().await.ok();
            }
            candidate.task.abort();
            drop(candidate.elector);
        }
        for task in self.observing.drain(..) {
            task.abort();
        }
        outcome
    }
}

#[test]
fn every_behaviour_of_the_elector() {
    let behaviours = load("elector.json", &KINDS);
    run_every(&behaviours, ("rc_behaviours", 27593), ("rc_behaviours_crash", 27594), |cluster, scenario| {
        Box::pin(elect(cluster, scenario))
    });
}

/// One scenario, with an elector of its own that observes.
async fn elect<'a>(cluster: &'a Cluster, scenario: &'a Value) -> Result<(), String> {
    let key = format!("behaviours:{}", scenario["name"].as_str().unwrap());
    let elector = Elector::new(
        config(cluster.port(), "beh_observer"),
        key.clone(),
        ElectOptions::new(AcquireOptions::new(seconds(&scenario["ttl"]))),
    );
    let run = Run {
        cluster,
        scenario,
        key,
        elector,
        candidates: HashMap::new(),
        values: HashMap::new(),
        fences: HashMap::new(),
        handed: HashMap::new(),
        observers: HashMap::new(),
        observing: Vec::new(),
        step_ended: Instant::now(),
    };
    run.run().await
}
