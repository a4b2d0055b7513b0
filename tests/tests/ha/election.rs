//! Leader election beside the torture workload, through the same failovers: candidates campaign for
//! one key (lease_acquire with wait), renew, and log guarded writes under their fence; an observer
//! follows the key with await_change. Afterwards, on the primary's surviving history: each fence
//! belongs to one leader, no write under a fence landed after a write under a higher one, and the
//! observer saw every leader that wrote, but for terms that fell wholly within one of its own
//! reconnections (measured, and reported).
use super::Dsn;
use postgres::Client;
use std::sync::Mutex;
use std::thread;
use std::time::{Duration, Instant};

pub const KEY: &str = "ha-leader";
const CANDIDATES: usize = 3;

/// What the election's threads saw: each leader's acknowledged writes by fence (first and last
/// acknowledgement), the observer's states in order, and when the observer was not connected.
#[derive(Default)]
pub struct Election {
    terms: Mutex<Vec<(i64, String, Instant, Instant)>>,
    observed: Mutex<Vec<(Option<i64>, Option<String>)>>,
    observer_gaps: Mutex<Vec<(Instant, Instant)>>,
}

/// Creates the election's database, with pg_fence, through `client` (on the primary); returns `dsn`
/// for that database.
pub fn prepare(client: &mut Client, dsn: &Dsn) -> Dsn {
    let exists = "SELECT 1 FROM pg_database WHERE datname = 'ha_election'";
    if client.query_opt(exists, &[]).unwrap().is_none() {
        client.batch_execute("CREATE DATABASE ha_election").unwrap();
    }
    let dsn =
        Dsn { hosts: dsn.hosts.clone(), rest: dsn.rest.replace("dbname=postgres", "dbname=ha_election") };
    let mut client = dsn.connect().expect("connect to the election's database");
    client
        .batch_execute("CREATE EXTENSION IF NOT EXISTS pg_fence; DROP TABLE IF EXISTS ha_election")
        .unwrap();
    dsn
}

/// Connects through `connect` until it succeeds or `until` passes.
fn connected(connect: &dyn Fn() -> Result<Client, String>, until: Instant) -> Option<Client> {
    while Instant::now() < until {
        if let Ok(client) = connect() {
            return Some(client);
        }
        thread::sleep(Duration::from_millis(200));
    }
    None
}

impl Election {
    /// Runs the candidates and the observer until `until`, in `scope`.
    pub fn run<'s>(
        &'s self,
        scope: &'s thread::Scope<'s, '_>,
        connect: &'s (dyn Fn() -> Result<Client, String> + Sync),
        until: Instant,
    ) {
        let mut setup = connected(connect, until).expect("connect for the election");
        setup
            .batch_execute("CREATE TABLE IF NOT EXISTS ha_election (id bigserial PRIMARY KEY, fence bigint, leader text)")
            .unwrap();
        for n in 0..CANDIDATES {
            scope.spawn(move || self.candidate(&format!("candidate-{n}"), connect, until));
        }
        scope.spawn(move || self.observe(connect, until));
    }

    fn candidate(&self, name: &str, connect: &dyn Fn() -> Result<Client, String>, until: Instant) {
        while let Some(mut client) = connected(connect, until) {
            let acquire =
                "SELECT fence, token FROM fence.lease_acquire($1, '3 seconds', $2, wait => '2 seconds')";
            let Ok(row) = client.query_one(acquire, &[&KEY, &name]) else { continue };
            let (Some(fence), Some(token)): (Option<i64>, Option<uuid::Uuid>) = (row.get(0), row.get(1))
            else {
                continue;
            };
            let mut first = None;
            // Lead: renew and write under the fence until either is refused or fails.
            while Instant::now() < until {
                let write = client.transaction().and_then(|mut tx| {
                    tx.query_one("SELECT fence.fence_guard($1, $2)", &[&KEY, &fence])?;
                    tx.execute("INSERT INTO ha_election (fence, leader) VALUES ($1, $2)", &[&fence, &name])?;
                    tx.commit()
                });
                if write.is_err() {
                    break;
                }
                let now = Instant::now();
                let started = *first.get_or_insert(now);
                let mut terms = self.terms.lock().unwrap();
                match terms.iter_mut().find(|term| term.0 == fence) {
                    Some(term) => term.3 = now,
                    None => terms.push((fence, name.to_string(), started, now)),
                }
                drop(terms);
                thread::sleep(Duration::from_millis(300));
                let renew = "SELECT fence.lease_renew($1, $2, '3 seconds')";
                if client.query_one(renew, &[&KEY, &token]).is_err() {
                    break;
                }
            }
            if Instant::now() >= until {
                let _ = client.execute("SELECT fence.lease_release($1, $2)", &[&KEY, &token]);
                return;
            }
        }
    }

    fn observe(&self, connect: &dyn Fn() -> Result<Client, String>, until: Instant) {
        let mut seen: (Option<i64>, Option<String>) = (None, None);
        let mut lost_at = Instant::now();
        while let Some(mut client) = connected(connect, until) {
            self.observer_gaps.lock().unwrap().push((lost_at, Instant::now()));
            let watch = "SELECT fence, owner FROM fence.await_change($1, $2, $3, '1 second')";
            while Instant::now() < until {
                let Ok(row) = client.query_one(watch, &[&KEY, &seen.0, &seen.1]) else { break };
                let state = (row.get(0), row.get(1));
                if state != seen {
                    seen = state;
                    self.observed.lock().unwrap().push(seen.clone());
                }
            }
            lost_at = Instant::now();
            if lost_at >= until {
                return;
            }
        }
    }

    /// Checks the history the primary kept; returns the summary line and the problems found.
    pub fn check(&self, client: &mut Client) -> (String, Vec<String>) {
        let rows = client.query("SELECT fence, leader FROM ha_election ORDER BY id", &[]).unwrap();
        let writes: Vec<(i64, String)> = rows.iter().map(|row| (row.get(0), row.get(1))).collect();
        let mut problems = Vec::new();
        let mut leaders: Vec<(i64, &str)> = Vec::new();
        let mut highest = i64::MIN;
        for (fence, leader) in &writes {
            if *fence < highest {
                problems.push(format!("a write under fence {fence} landed after one under {highest}"));
            }
            highest = highest.max(*fence);
            match leaders.iter().find(|(f, _)| f == fence) {
                Some((_, other)) if other != leader => {
                    problems.push(format!("fence {fence} wrote for {other} and {leader}"))
                }
                Some(_) => {}
                None => leaders.push((*fence, leader)),
            }
        }
        let observed: Vec<i64> = self.observed.lock().unwrap().iter().filter_map(|state| state.0).collect();
        if observed.windows(2).any(|pair| pair[1] < pair[0]) {
            problems.push(format!("the observer saw an older leader after a newer one: {observed:?}"));
        }
        let terms = self.terms.lock().unwrap();
        let gaps = self.observer_gaps.lock().unwrap();
        let (mut unseen_in_gaps, mut missed) = (0, 0);
        for (fence, _) in &leaders {
            if observed.contains(fence) {
                continue;
            }
            let term = terms.iter().find(|term| term.0 == *fence);
            let in_gap = term.is_some_and(|(_, _, first, last)| {
                gaps.iter().any(|(from, to)| *from <= *first && *last <= *to + Duration::from_secs(1))
            });
            if in_gap {
                unseen_in_gaps += 1;
            } else {
                missed += 1;
                problems.push(format!("the observer never saw the leader of fence {fence}"));
            }
        }
        let line = format!(
            "election: {} writes by {} leaders, {} leader states observed, {} terms unseen during the observer's {} reconnections, {} missed",
            writes.len(),
            leaders.len(),
            observed.len(),
            unseen_in_gaps,
            gaps.len().saturating_sub(1),
            missed
        );
        (line, problems)
    }
}
