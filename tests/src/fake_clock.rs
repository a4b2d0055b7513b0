//! A server wall clock the tests can step: the server runs under libfaketime with an offset they
//! rewrite, while CLOCK_MONOTONIC keeps running (FAKETIME_DONT_FAKE_MONOTONIC), as it does through
//! a real step (an NTP correction, a resumed VM).
use crate::{eventually, Cluster};
use postgres::Client;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

/// The offset of the server's wall clock from the real one, in a file libfaketime reads.
pub struct FakeClock {
    path: PathBuf,
}

impl FakeClock {
    pub fn new(name: &str) -> FakeClock {
        assert!(
            Path::new(LIBFAKETIME).exists(),
            "{LIBFAKETIME} is missing: install faketime (pg_test/setup)"
        );
        let clock = FakeClock { path: std::env::temp_dir().join(format!("pg_fence_it_{name}.faketime")) };
        clock.write(0);
        clock
    }

    /// A scratch cluster whose every process reads its wall clock through this offset.
    pub fn start_cluster(&self, name: &str, port: u16, settings: &[&str]) -> Cluster {
        Cluster::start_with_env(name, port, settings, &self.server_env())
    }

    /// Starts `cluster` again after a crash or a stop, its clock still read through this offset.
    pub fn restart(&self, cluster: &Cluster) {
        cluster.restart_with_env(&self.server_env());
        cluster.wait_until_ready();
    }

    fn server_env(&self) -> [(&'static str, &str); 5] {
        [
            ("LD_PRELOAD", LIBFAKETIME),
            ("FAKETIME_TIMESTAMP_FILE", self.path.to_str().unwrap()),
            // The file is otherwise read again only every 10 s: a step must take effect at once.
            ("FAKETIME_NO_CACHE", "1"),
            // A real step leaves the monotonic clock alone, and that is what the waits rely on.
            ("FAKETIME_DONT_FAKE_MONOTONIC", "1"),
            // Nor does it shift the timestamps of files already written, which libfaketime
            // would otherwise do in stat().
            ("NO_FAKE_STAT", "1"),
        ]
    }

    /// Sets the offset to `seconds` (libfaketime's relative format: a sign, then seconds; a
    /// fraction is allowed).
    pub fn write_seconds(&self, seconds: f64) {
        // Written aside and renamed, so that a server reading the file never sees it half-written
        // (with FAKETIME_NO_CACHE, every read of the clock reads the file). The server runs as
        // `postgres`, not as us.
        let aside = self.path.with_extension("new");
        fs::write(&aside, format!("{seconds:+.6}\n")).unwrap();
        fs::set_permissions(&aside, fs::Permissions::from_mode(0o644)).unwrap();
        fs::rename(&aside, &self.path).unwrap();
    }

    pub fn write(&self, seconds: i64) {
        self.write_seconds(seconds as f64);
    }

    /// Steps the server's wall clock to `seconds` from the real one and checks, through `client`,
    /// that the server's clock says so.
    pub fn step(&self, client: &mut Client, seconds: i64) {
        self.step_to(client, seconds as f64);
    }

    /// `step` to a fraction of a second.
    pub fn step_to(&self, client: &mut Client, seconds: f64) {
        self.write_seconds(seconds);
        let mut seen = f64::NAN;
        let stepped = eventually(Duration::from_secs(20), || {
            seen = server_offset(client);
            (seen - seconds).abs() < 0.5
        });
        assert!(stepped, "stepped the clock to {seconds:+} s, but the server's clock is {seen:+.3} s off");
    }
}

impl Drop for FakeClock {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.path);
    }
}

/// How far the server's wall clock is ahead of ours, in seconds.
pub fn server_offset(client: &mut Client) -> f64 {
    let server: f64 =
        client.query_one("SELECT extract(epoch FROM clock_timestamp())::float8", &[]).unwrap().get(0);
    server - SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs_f64()
}
