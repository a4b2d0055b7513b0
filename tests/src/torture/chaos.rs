//! The chaos thread: at random moments it throws one of the selected client faults (a pause or a
//! cut connection, left in a client's mailbox; or pg_terminate_backend of a client's backend), and
//! about every `server_fault_every` a server fault, which it waits for (clients meanwhile retry).
use super::{Counts, Fault, ServerFault, Shared};
use postgres::Client;
use rand::rngs::ThreadRng;
use rand::seq::SliceRandom;
use rand::Rng;
use std::thread;
use std::time::{Duration, Instant};

/// Throws faults until the deadline; returns the terminations and server faults it made.
pub(super) fn run(shared: &Shared, server_fault: Option<&ServerFault<'_>>) -> Counts {
    let mut chaos = Chaos { shared, rng: rand::thread_rng(), connection: None, counts: Counts::default() };
    let client_faults: Vec<Fault> =
        shared.workload.faults.iter().copied().filter(|fault| *fault != Fault::ServerCrash).collect();
    let server_fault = server_fault.filter(|_| shared.workload.faults.contains(&Fault::ServerCrash));
    // The first comes after half the interval, so that a short run gets one too.
    let mut next_server_fault = Instant::now() + chaos.around(shared.workload.server_fault_every / 2, 0.25);

    while !shared.over() {
        let pause = chaos.around(shared.workload.client_fault_every, 0.5);
        chaos.sleep(pause);
        if shared.over() {
            break;
        }
        match server_fault {
            Some(fault) if Instant::now() >= next_server_fault => {
                chaos.server_fault(fault);
                next_server_fault = Instant::now() + chaos.around(shared.workload.server_fault_every, 0.25);
            }
            _ => {
                if let Some(&fault) = client_faults.choose(&mut chaos.rng) {
                    chaos.client_fault(fault);
                }
            }
        }
    }
    chaos.counts
}

struct Chaos<'s> {
    shared: &'s Shared<'s>,
    rng: ThreadRng,
    /// For pg_terminate_backend; reopened after it is lost.
    connection: Option<Client>,
    counts: Counts,
}

impl Chaos<'_> {
    fn client_fault(&mut self, fault: Fault) {
        match fault {
            Fault::TerminateBackend => self.terminate_a_backend(),
            // The client takes it at its next chance (a pause only while it holds a lease).
            _ => {
                let client = self.rng.gen_range(0..self.shared.workload.clients);
                *self.shared.mailboxes[client].lock().unwrap() = Some(fault);
            }
        }
    }

    fn terminate_a_backend(&mut self) {
        const TERMINATE: &str = "
            SELECT pg_terminate_backend(pid) FROM pg_stat_activity
             WHERE application_name LIKE 'torture-client-%' ORDER BY random() LIMIT 1";
        if self.connection.is_none() {
            self.connection = (self.shared.connect)().ok();
        }
        let Some(client) = self.connection.as_mut() else { return };
        match client.query_opt(TERMINATE, &[]) {
            Ok(row) => self.counts.terminations += u64::from(row.is_some_and(|row| row.get::<_, bool>(0))),
            Err(_) => self.connection = None, // the server is down, or restarting: try next time
        }
    }

    fn server_fault(&mut self, fault: &ServerFault<'_>) {
        let started = Instant::now();
        self.connection = None;
        fault();
        self.counts.crashes += 1;
        eprintln!(
            "torture: server fault {} done in {:.1} s",
            self.counts.crashes,
            started.elapsed().as_secs_f64()
        );
    }

    /// `mean`, give or take `spread` of it, at random.
    fn around(&mut self, mean: Duration, spread: f64) -> Duration {
        mean.mul_f64(self.rng.gen_range(1.0 - spread..1.0 + spread))
    }

    /// Sleeps, but not past the deadline.
    fn sleep(&self, duration: Duration) {
        thread::sleep(duration.min(self.shared.deadline.saturating_duration_since(Instant::now())));
    }
}
