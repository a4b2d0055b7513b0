//! Keeping leases at scale (clients/behaviours/keeping.json, which every client's suite runs): each
//! scenario run through a `FenceClient`'s keeper against a real server. Prints the connections and
//! the renewal latency of the 200 kept leases.
mod common;
use common::proxy::Proxy;
use common::scenarios::{ensure, kind, load, run_every, seconds};
use common::{config, eventually, plain, recording_losses, Told};
use pg_fence_client::{
    lease, AcquireOptions, Backoff, ElectOptions, Elector, Error, FenceClient, HeldLease, KeepOptions,
    Leader, Leadership,
};
use pg_fence_integration::Cluster;
use serde_json::Value;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_postgres::{Client, Config};

/// The steps the behaviours file may use (its "steps" documents them).
const KINDS: [&str; 23] = [
    "hold_many",
    "all_held",
    "connections",
    "hold",
    "hog_pool",
    "release_pool",
    "held",
    "acquire_waiting",
    "waiters",
    "hang_connections",
    "release_other",
    "give_up",
    "key_free",
    "release",
    "hold_first_free",
    "hold_other",
    "lead",
    "observe",
    "observed",
    "blind",
    "pause",
    "terminate",
    "granted",
];

/// A client of its own: its sessions are named `app`, its keeper's `app`_keeper.
struct Party {
    app: String,
    client: Arc<FenceClient<Config>>,
    kept: Vec<(HeldLease, Told)>,
    proxy: Option<Proxy>,
    /// The acquire running in the background (`acquire_waiting`).
    waiting: Option<JoinHandle<Result<HeldLease, Error>>>,
    /// The work that takes the client's connection (`hog_pool`).
    hog: Option<JoinHandle<()>>,
    leadership: Option<Leadership<Config>>,
    /// What an observer was told, in order.
    observed: Option<mpsc::UnboundedReceiver<Result<Option<Leader>, Error>>>,
    observing: Option<JoinHandle<()>>,
}

struct Run<'a> {
    cluster: &'a Cluster,
    scenario: &'a Value,
    key: String,
    admin: Client,
    parties: HashMap<String, Party>,
    previous: Instant,
    current: Instant,
}

fn name<'v>(step: &'v Value, kind: &str) -> &'v str {
    step[kind].as_str().unwrap()
}

fn text(err: impl ToString) -> String {
    err.to_string()
}

impl Run<'_> {
    fn scenario_name(&self) -> &str {
        self.scenario["name"].as_str().unwrap()
    }

    /// Party `name`, made at its first step: through a proxy the test controls when `proxied`, its
    /// retries taking `retry_for` at most (the default backoff's when None).
    async fn party(
        &mut self,
        name: &str,
        proxied: bool,
        keeper_connections: usize,
        retry_for: Option<Duration>,
    ) -> &mut Party {
        if !self.parties.contains_key(name) {
            let proxy = match proxied {
                true => Some(Proxy::start(self.cluster.port()).await),
                false => None,
            };
            let port = proxy.as_ref().map_or(self.cluster.port(), |proxy| proxy.port);
            let app = format!("beh_{name}_{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
            let backoff =
                Backoff { max_elapsed: retry_for.or(Backoff::default().max_elapsed), ..Backoff::default() };
            let client = FenceClient::with_backoff(config(port, &app), backoff)
                .call_timeout(Duration::from_secs(10))
                .keeper_connections(keeper_connections);
            let party = Party {
                app,
                client: Arc::new(client),
                kept: Vec::new(),
                proxy,
                waiting: None,
                hog: None,
                leadership: None,
                observed: None,
                observing: None,
            };
            self.parties.insert(name.to_owned(), party);
        }
        self.parties.get_mut(name).unwrap()
    }

    fn known(&mut self, step: &Value, kind: &str) -> Result<&mut Party, String> {
        let name = name(step, kind);
        self.parties.get_mut(name).ok_or_else(|| format!("no client {name}"))
    }

    async fn step(&mut self, kind: &str, step: &Value) -> Result<(), String> {
        let key = self.key.clone();
        let opts = |step: &Value, name: &str| AcquireOptions::new(seconds(&step["ttl"])).owner(name);
        match kind {
            "hold_many" => {
                let name = name(step, kind);
                let connections = step["keeper_connections"].as_u64().unwrap() as usize;
                let party = self.party(name, false, connections, None).await;
                let opts = opts(step, name);
                for index in 0..step["count"].as_u64().unwrap() {
                    let (keep, told) = recording_losses(KeepOptions::default());
                    let held = party.client.hold(&format!("{key}-{index}"), &opts, keep).await;
                    let held = held.map_err(|err| format!("hold {index}: {err}"))?;
                    party.kept.push((held, told));
                }
                all_held(party)?;
            }
            "all_held" => {
                let until = Instant::now() + seconds(&step["for"]);
                let party = self.known(step, kind)?;
                while Instant::now() < until {
                    all_held(party)?;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                let stats = party.client.keeper_stats();
                let (count, app) = (party.kept.len(), party.app.clone());
                let open = self.keeper_backends(&app).await?;
                println!(
                    "[behaviour] {}: {count} leases kept over {open} connections, renewals p50 {:.1} ms, \
                     p99 {:.1} ms ({} renewals, {} connections made)",
                    self.scenario_name(),
                    stats.renewal_p50.as_secs_f64() * 1000.0,
                    stats.renewal_p99.as_secs_f64() * 1000.0,
                    stats.renewals,
                    stats.connections_made,
                );
            }
            "connections" => {
                let at_most = step["at_most"].as_i64().unwrap();
                let party = self.known(step, kind)?;
                let (app, made) = (party.app.clone(), party.client.keeper_stats().connections_made);
                let open = self.keeper_backends(&app).await?;
                ensure(open <= at_most, || format!("{open} keeper connections, more than {at_most}"))?;
                ensure(made as i64 <= at_most, || format!("the keeper made {made} connections"))?;
            }
            "hold" => {
                let name = name(step, kind);
                let opts = opts(step, name);
                let party = self.party(name, false, 2, None).await;
                let (keep, told) = recording_losses(KeepOptions::default());
                let held = party.client.hold(&key, &opts, keep).await.map_err(text)?;
                ensure(held.is_held(), || format!("not held at once: {:?}", held.state()))?;
                party.kept.push((held, told));
            }
            "hog_pool" => {
                // The client's own connection, its calls' "pool", kept busy until release_pool.
                let party = self.known(step, kind)?;
                let conn = party.client.connection().await.map_err(text)?;
                party.hog = Some(tokio::spawn(async move {
                    conn.batch_execute("SELECT pg_sleep(3600)").await.ok();
                }));
                let app = party.app.clone();
                let busy = "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 \
                            AND query LIKE '%pg_sleep(3600)%' AND state = 'active'";
                let admin = &self.admin;
                let hogged = eventually(Duration::from_secs(5), || async {
                    admin.query_one(busy, &[&app]).await.map(|row| row.get::<_, i64>(0) == 1).unwrap_or(false)
                })
                .await;
                ensure(hogged, || "the client's connection is not busy".into())?;
            }
            "release_pool" => {
                let app = self.known(step, kind)?.app.clone();
                let cancel =
                    "SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE application_name = $1 \
                              AND query LIKE '%pg_sleep(3600)%'";
                self.admin.execute(cancel, &[&app]).await.map_err(text)?;
                if let Some(hog) = self.known(step, kind)?.hog.take() {
                    hog.await.map_err(text)?;
                }
            }
            "held" => {
                let party = self.known(step, kind)?;
                let (held, told) = party.kept.last().ok_or("nothing kept")?;
                let until = Instant::now() + seconds(&step["for"]);
                while Instant::now() < until {
                    ensure(held.is_held(), || format!("not held: {:?}", held.state()))?;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                let told = told.lock().unwrap().clone();
                ensure(told.is_empty(), || format!("told {told:?}"))?;
            }
            "acquire_waiting" => {
                let name = name(step, kind);
                let opts = opts(step, name).wait(seconds(&step["wait"]));
                let retry_for = step.get("retry_for").map(seconds);
                let party = self.party(name, true, 2, retry_for).await;
                let client = party.client.clone();
                party.waiting =
                    Some(tokio::spawn(async move { client.hold(&key, &opts, KeepOptions::default()).await }));
            }
            "waiters" => {
                let want = step["waiters"].as_i64().unwrap();
                let admin = &self.admin;
                let waiting = eventually(Duration::from_secs(10), || async {
                    let row = admin.query_one("SELECT fence.waiters($1)::bigint", &[&key]).await;
                    row.map(|row| row.get::<_, i64>(0) == want).unwrap_or(false)
                })
                .await;
                ensure(waiting, || format!("fence.waiters is not {want}"))?;
            }
            "hang_connections" => {
                let party = self.known(step, kind)?;
                party.proxy.as_ref().ok_or("its connections are not proxied")?.hang();
            }
            "release_other" => {
                let by = step["by"].as_str().unwrap();
                let party = self.parties.get_mut(by).ok_or_else(|| format!("no client {by}"))?;
                let (held, _) = party.kept.pop().ok_or("nothing kept")?;
                ensure(held.release().await.map_err(text)?, || "the release ended nothing".into())?;
            }
            "give_up" => {
                let party = self.known(step, kind)?;
                let waiting = party.waiting.take().ok_or("no acquire running")?;
                waiting.abort();
                match waiting.await {
                    Err(join) if join.is_cancelled() => {}
                    Ok(Ok(held)) => return Err(format!("the acquire was granted: {:?}", held.lease())),
                    other => return Err(format!("the acquire ended with {:?}, not cancelled", other.err())),
                }
            }
            "key_free" => {
                let within = seconds(&step["within"]);
                let since = self.previous;
                let admin = &self.admin;
                let live = "SELECT count(*) FROM fence.leases WHERE key = $1 AND live";
                let wait = (since + within).saturating_duration_since(Instant::now());
                let free = eventually(wait, || async {
                    admin.query_one(live, &[&key]).await.map(|row| row.get::<_, i64>(0) == 0).unwrap_or(false)
                })
                .await;
                ensure(free, || format!("the key is still held {within:?} after the give-up"))?;
                println!(
                    "[behaviour] {}: the given-up grant released {:.0} ms after the give-up",
                    self.scenario_name(),
                    since.elapsed().as_secs_f64() * 1000.0
                );
            }
            "pause" => tokio::time::sleep(seconds(&step["pause"])).await,
            "terminate" => {
                let app = self.known(step, kind)?.app.clone();
                let end = "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
                           WHERE application_name LIKE $1 || '%'";
                let ended: i64 = self.admin.query_one(end, &[&app]).await.map_err(text)?.get(0);
                ensure(ended > 0, || "no session of the client to end".into())?;
            }
            "granted" => {
                let within = seconds(&step["within"]);
                let party = self.known(step, kind)?;
                let waiting = party.waiting.take().ok_or("no acquire running")?;
                let ended = tokio::time::timeout(within, waiting).await;
                let held = ended.map_err(|_| format!("no answer within {within:?}"))?.map_err(text)?;
                let held = held.map_err(|err| format!("the acquire failed: {err:?}"))?;
                ensure(held.is_held(), || format!("not held: {:?}", held.state()))?;
                party.kept.push((held, Told::default()));
            }
            "release" => {
                let party = self.known(step, kind)?;
                let (held, _) = party.kept.pop().ok_or("nothing kept")?;
                let released = held.release().await.map_err(text)?;
                let want = step["result"].as_bool().unwrap();
                ensure(released == want, || format!("the release said {released}, not {want}"))?;
            }
            "hold_first_free" => {
                let name = name(step, kind);
                let opts = opts(step, name);
                let keys: Vec<String> =
                    (0..step["count"].as_u64().unwrap()).map(|index| format!("{key}-{index}")).collect();
                let party = self.party(name, false, 2, None).await;
                let (keep, told) = recording_losses(KeepOptions::default());
                let held = party.client.hold_first_free(&keys, &opts, keep).await.map_err(text)?;
                let got =
                    held.as_ref().map(|held| keys.iter().position(|key| *key == held.lease().key).unwrap());
                let want = step["got"].as_u64().map(|index| index as usize);
                ensure(got == want, || format!("got {got:?}, not {want:?}"))?;
                if let Some(held) = held {
                    party.kept.push((held, told));
                }
            }
            "hold_other" => {
                let index = step["index"].as_u64().unwrap();
                let opts = AcquireOptions::new(Duration::from_secs(3600)).owner("other");
                let granted = lease::acquire(&self.admin, &format!("{key}-{index}"), &opts).await;
                ensure(granted.map_err(text)?.is_some(), || "not granted".into())?;
            }
            "lead" => {
                let name = name(step, kind);
                let opts = ElectOptions::new(AcquireOptions::new(seconds(&step["ttl"])));
                let port = self.cluster.port();
                let party = self.party(name, false, 2, None).await;
                let elector = Elector::new(config(port, &party.app), &key, opts);
                party.leadership = Some(elector.campaign(name).await.map_err(text)?);
            }
            "observe" => {
                let name = name(step, kind);
                let opts = ElectOptions::new(AcquireOptions::new(seconds(&step["ttl"])));
                let party = self.party(name, true, 2, None).await;
                let port = party.proxy.as_ref().unwrap().port;
                let elector = Elector::new(config(port, &party.app), &key, opts);
                let (sender, receiver) = mpsc::unbounded_channel();
                party.observed = Some(receiver);
                party.observing = Some(tokio::spawn(async move {
                    let mut observer = elector.observe();
                    while let Some(news) = observer.next().await {
                        if sender.send(news).is_err() {
                            return;
                        }
                    }
                }));
            }
            "observed" => {
                let party = self.known(step, kind)?;
                let told = party.observed.as_mut().ok_or("not observing")?;
                let news = tokio::time::timeout(Duration::from_secs(10), told.recv()).await;
                let news = news.map_err(|_| "told nothing within 10 s")?.ok_or("the observing ended")?;
                let leader = news.map_err(text)?;
                let want = step["leader"].as_str();
                ensure(leader.as_ref().map(|leader| leader.owner.as_str()) == want, || {
                    format!("told {leader:?}, not {want:?}")
                })?;
            }
            "blind" => {
                let within = seconds(&step["within"]);
                let since = self.previous;
                let party = self.known(step, kind)?;
                let told = party.observed.as_mut().ok_or("not observing")?;
                let wait = since + within + Duration::from_secs(5);
                let news = tokio::time::timeout_at(wait.into(), told.recv()).await;
                let news = news.map_err(|_| format!("told nothing within {within:?} and 5 s more"))?;
                let took = since.elapsed();
                match news {
                    Some(Err(Error::Blind(why))) => println!(
                        "[behaviour] {}: told it cannot see {:.0} ms after the hang ({why})",
                        self.scenario_name(),
                        took.as_secs_f64() * 1000.0
                    ),
                    other => return Err(format!("told {other:?}, not that it cannot see")),
                }
                ensure(took <= within, || format!("told after {took:?}, more than {within:?}"))?;
            }
            other => return Err(format!("no step {other}")),
        }
        Ok(())
    }

    /// The keeper's backends of client `app` open now.
    async fn keeper_backends(&self, app: &str) -> Result<i64, String> {
        let sql = "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1";
        let row = self.admin.query_one(sql, &[&format!("{app}_keeper")]).await.map_err(text)?;
        Ok(row.get(0))
    }

    async fn run(mut self) -> Result<(), String> {
        let steps = self.scenario["steps"].as_array().unwrap();
        let mut outcome = Ok(());
        for (number, step) in steps.iter().enumerate() {
            let kind = kind(step, &KINDS);
            self.previous = std::mem::replace(&mut self.current, Instant::now());
            if let Err(err) = self.step(kind, step).await {
                outcome = Err(format!("step {number} {step}: {err}"));
                break;
            }
        }
        for (_, mut party) in self.parties.drain() {
            if let Some(hog) = party.hog.take() {
                hog.abort();
            }
            if let Some(observing) = party.observing.take() {
                observing.abort();
            }
            for (held, _) in party.kept.drain(..) {
                held.release().await.ok();
            }
            if let Some(leadership) = party.leadership.take() {
                leadership.resign().await.ok();
            }
        }
        outcome
    }
}

/// Every kept lease of `party` is held, and none was told a loss.
fn all_held(party: &Party) -> Result<(), String> {
    for (held, told) in &party.kept {
        ensure(held.is_held(), || format!("{} not held: {:?}", held.lease().key, held.state()))?;
        let told = told.lock().unwrap();
        ensure(told.is_empty(), || format!("{} told {told:?}", held.lease().key))?;
    }
    Ok(())
}

#[test]
fn every_behaviour_of_keeping_at_scale() {
    let behaviours = load("keeping.json", &KINDS);
    run_every(
        &behaviours,
        ("rc_keeping_behaviours", 27634),
        ("rc_keeping_behaviours_crash", 27635),
        |cluster, scenario| Box::pin(keep(cluster, scenario)),
    );
}

/// One scenario, on keys of its own.
async fn keep<'a>(cluster: &'a Cluster, scenario: &'a Value) -> Result<(), String> {
    let run = Run {
        cluster,
        scenario,
        key: format!("keeping:{}:{}", scenario["name"].as_str().unwrap(), uuid::Uuid::new_v4().simple()),
        admin: plain(cluster.port()).await,
        parties: HashMap::new(),
        previous: Instant::now(),
        current: Instant::now(),
    };
    run.run().await
}
