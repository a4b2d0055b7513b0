//! The command line: subcommands, options and the examples `--help` shows.
use clap::{Args, Parser, Subcommand};
use std::time::Duration;

const RUN_EXAMPLES: &str = "\
Examples:
  # Only one instance runs the migration; the others wait for it, then find nothing to do
  pg-fence run --wait 10m migrate -- ./migrate.sh

  # A cron job that skips this run when another host has the key (exit status 75)
  pg-fence run --no-wait --at-least 50s nightly-report -- ./report.sh

  # The job writes under its fence: its writes are refused once it has lost the key
  pg-fence run job:42 -- sh -c 'psql -v ON_ERROR_STOP=1 -c \"UPDATE jobs SET state = 2
    WHERE id = 42 AND fence.fence_guard(\\$\\$$PG_FENCE_KEY\\$\\$, $PG_FENCE_FENCE)\"'

Exit status: the command's own (128 + N when signal N ended it); 75 the key is held, 76 the lease
was lost while the command ran (it was stopped), 69 the server could not be reached, 70 the server
refused a statement, 78 the server refused the login or the database (not retried), 64 bad usage
(input the server would refuse included).";

const ELECT_EXAMPLES: &str = "\
Examples:
  # Run the scheduler on whichever host leads; another takes over when it stops or dies
  pg-fence elect scheduler --value \"$(hostname)\" -- ./scheduler

Exit status: as for run.";

const OBSERVE_EXAMPLES: &str = "\
Examples:
  pg-fence observe scheduler
  pg-fence observe scheduler --json | jq .value";

const LEASES_EXAMPLES: &str = "\
Examples:
  pg-fence leases                 # every key in use
  pg-fence leases 'job:*' --json  # JSON lines, one per lease
  pg-fence leases --watch         # again every 2 seconds";

const STATUS_EXAMPLES: &str = "\
Examples:
  pg-fence status nightly-report && echo held

Exit status: 0 when a live lease holds the key, 1 when none does.";

const REVOKE_EXAMPLES: &str = "\
Examples:
  pg-fence revoke nightly-report  # needs fence_admin

Exit status: 0 when a live lease was ended, 1 when there was none.";

const STATS_EXAMPLES: &str = "\
Examples:
  pg-fence stats
  pg-fence stats --json";

const CONNECTION: &str = "\
Connection: as psql: PGHOST, PGPORT, PGUSER (default: the user pg-fence runs as), PGDATABASE,
PGPASSWORD, PGPASSFILE (or ~/.pgpass), PGAPPNAME, PGCONNECT_TIMEOUT, PGTARGETSESSIONATTRS, or --dsn
with a connection string or URI (several hosts: host=a,b target_session_attrs=read-write).
The connect timeout (connect_timeout, PGCONNECT_TIMEOUT; default 10 s, 0 for none) bounds each
connect and each statement: a server that does not answer within it is unreachable, and retried
within --retry-for.";

#[derive(Parser, Debug)]
#[command(
    name = "pg-fence",
    version,
    about = "Leases with fencing tokens from PostgreSQL (pg_fence), for shell commands"
)]
#[command(after_help = CONNECTION)]
pub struct Cli {
    #[command(flatten)]
    pub conn: ConnArgs,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Args, Debug, Clone)]
pub struct ConnArgs {
    /// Connection string or URI (the PG* environment fills in what it leaves out)
    #[arg(long, global = true, value_name = "DSN")]
    pub dsn: Option<String>,
    /// How long to keep trying to reach the server, from its first failure, before giving up (exit
    /// status 69)
    #[arg(long, global = true, value_name = "DURATION", default_value = "10s", allow_hyphen_values = true, value_parser = duration)]
    pub retry_for: Duration,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run a command while holding a key's lease, and stop it if the lease is lost
    #[command(after_help = RUN_EXAMPLES)]
    Run(RunArgs),
    /// Campaign for leadership of NAME, and run a command while leading
    #[command(after_help = ELECT_EXAMPLES)]
    Elect(ElectArgs),
    /// Print each change of NAME's leader (and each vacancy), a line each
    #[command(after_help = OBSERVE_EXAMPLES)]
    Observe(ObserveArgs),
    /// List the leases (tables for people, JSON lines with --json)
    #[command(after_help = LEASES_EXAMPLES)]
    Leases(LeasesArgs),
    /// Show a key's lease
    #[command(after_help = STATUS_EXAMPLES)]
    Status(KeyArgs),
    /// End a key's live lease, whoever holds it (needs fence_admin)
    #[command(after_help = REVOKE_EXAMPLES)]
    Revoke(KeyArgs),
    /// Show pg_fence's counters (fence.stats)
    #[command(after_help = STATS_EXAMPLES)]
    Stats(JsonArg),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell)
    Completions { shell: clap_complete::Shell },
    /// Print the man page (roff), or with --dir write one page per command there (pg-fence.1,
    /// pg-fence-run.1, ...), as packages install them
    #[command(hide = true)]
    Man {
        /// The directory to write the pages to
        #[arg(long, value_name = "DIR")]
        dir: Option<std::path::PathBuf>,
    },
}

/// What `run` and `elect` share: the lease and how the command is stopped.
#[derive(Args, Debug, Clone)]
pub struct Supervise {
    /// The lease's time to live, above zero and at most the server's pg_fence.max_ttl (1 day by
    /// default); it is renewed every third of it
    #[arg(long, value_name = "DURATION", default_value = "30s", allow_hyphen_values = true, value_parser = positive_duration)]
    pub ttl: Duration,
    /// After SIGTERM to the command (its lease lost, or pg-fence sent SIGTERM), how long before
    /// SIGKILL; when the server cannot be reached, SIGKILL comes before the lease's expiry anyway
    #[arg(long, value_name = "DURATION", default_value = "10s", allow_hyphen_values = true, value_parser = duration)]
    pub kill_after: Duration,
    /// After this lease expires or is revoked, nobody is granted the key for this long (the
    /// server's lock-delay, at most 1h): at least --kill-after, and a command slow to stop after a
    /// revocation never runs beside the next holder (elect, --shared, --permits: + TTL/3)
    #[arg(long, value_name = "DURATION", default_value = "0s", allow_hyphen_values = true, value_parser = duration)]
    pub lock_delay: Duration,
    /// The command and its arguments
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<String>,
}

#[derive(Args, Debug)]
pub struct RunArgs {
    /// The key to hold
    pub key: String,
    /// Wait this long at most for the key (default: wait as long as it takes)
    #[arg(long, value_name = "DURATION", allow_hyphen_values = true, value_parser = duration, conflicts_with = "no_wait")]
    pub wait: Option<Duration>,
    /// Exit at once with status 75 when the key is held
    #[arg(long)]
    pub no_wait: bool,
    /// Say nothing when the key is held (status 75): the cron hosts that lose the race each period
    #[arg(long, short)]
    pub quiet: bool,
    /// A shared lease: any number of shared holders at once, never beside an exclusive one
    #[arg(long, conflicts_with = "permits")]
    pub shared: bool,
    /// At most N holders at once (a semaphore's permit), 1 to 10,000
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=MAX_PERMITS as i64))]
    pub permits: u32,
    /// The holder's name, shown to others (default: HOST:PID)
    #[arg(long, value_name = "NAME")]
    pub owner: Option<String>,
    /// Keep the key until this long after the grant even when the command ends sooner (then the
    /// lease is left to expire at that time, not released)
    #[arg(long, value_name = "DURATION", allow_hyphen_values = true, value_parser = duration)]
    pub at_least: Option<Duration>,
    /// Also pass the lease's token (PG_FENCE_TOKEN), which lets the command renew or release it
    #[arg(long)]
    pub export_token: bool,
    #[command(flatten)]
    pub supervise: Supervise,
}

#[derive(Args, Debug)]
pub struct ElectArgs {
    /// The election's key
    pub name: String,
    /// The value observers see while this candidate leads (default: HOST:PID)
    #[arg(long, value_name = "V")]
    pub value: Option<String>,
    #[command(flatten)]
    pub supervise: Supervise,
}

#[derive(Args, Debug)]
pub struct ObserveArgs {
    /// The election's key
    pub name: String,
    /// JSON lines instead of text
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct LeasesArgs {
    /// Only keys matching this pattern (* and ? as in the shell)
    pub pattern: Option<String>,
    /// JSON lines, one per lease
    #[arg(long)]
    pub json: bool,
    /// List again every --interval until interrupted
    #[arg(long)]
    pub watch: bool,
    /// With --watch: how often
    #[arg(long, value_name = "DURATION", default_value = "2s", allow_hyphen_values = true, value_parser = positive_duration)]
    pub interval: Duration,
}

#[derive(Args, Debug)]
pub struct KeyArgs {
    pub key: String,
    /// JSON instead of a table
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct JsonArg {
    /// JSON instead of a table
    #[arg(long)]
    pub json: bool,
}

/// The longest duration taken: a deadline that far off must still be an instant of this host
/// (some hundreds of years are; 1e19 s panics) and an interval of the server's.
const LONGEST: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// The server's limits on what it takes (docs/reference.md, lease_acquire), checked before
/// connecting: input the server would refuse is bad usage, said at once.
pub const MAX_KEY_BYTES: usize = 512;
pub const MAX_OWNER_BYTES: usize = 256;
pub const MAX_PERMITS: u32 = 10_000;

/// A key the server takes: not empty, at most MAX_KEY_BYTES bytes.
pub fn check_key(what: &str, key: &str) -> Result<(), String> {
    match key.len() {
        0 => Err(format!("{what} is empty")),
        n if n > MAX_KEY_BYTES => {
            Err(format!("{what} is {n} bytes long; the server takes at most {MAX_KEY_BYTES}"))
        }
        _ => Ok(()),
    }
}

/// An owner name the server takes: at most MAX_OWNER_BYTES bytes.
pub fn check_owner(what: &str, owner: &str) -> Result<(), String> {
    match owner.len() {
        n if n > MAX_OWNER_BYTES => {
            Err(format!("{what} is {n} bytes long; the server takes at most {MAX_OWNER_BYTES}"))
        }
        _ => Ok(()),
    }
}

/// What the command line asks of the server that the server is known to refuse.
pub fn check(command: &Command) -> Result<(), String> {
    match command {
        Command::Run(args) => {
            check_key("the key", &args.key)?;
            args.owner.as_deref().map_or(Ok(()), |owner| check_owner("--owner", owner))
        }
        Command::Elect(args) => {
            check_key("the election's name", &args.name)?;
            args.value.as_deref().map_or(Ok(()), |value| check_owner("--value", value))
        }
        Command::Observe(args) => check_key("the election's name", &args.name),
        Command::Status(args) | Command::Revoke(args) => check_key("the key", &args.key),
        _ => Ok(()),
    }
}

/// "30s", "1m 30s", "500ms", "2h"; a bare number is seconds. At most 100 years, never negative.
pub fn duration(text: &str) -> Result<Duration, String> {
    if let Some(magnitude) = text.trim_start().strip_prefix('-') {
        // Taken as a value (not an option) so as to say this rather than clap's "use '-- -1s'".
        return match duration(magnitude) {
            Ok(_) => Err("a duration cannot be negative".into()),
            Err(err) => Err(err),
        };
    }
    let parsed = match text.parse::<f64>() {
        Ok(secs) => Duration::try_from_secs_f64(secs).map_err(|err| err.to_string())?,
        Err(_) => {
            humantime::parse_duration(text).map_err(|err| format!("{err} (as in 30s, 1m30s, 500ms)"))?
        }
    };
    match parsed > LONGEST {
        true => Err("longer than 100 years".into()),
        false => Ok(parsed),
    }
}

/// `duration`, above zero: a pause that must pause.
pub fn positive_duration(text: &str) -> Result<Duration, String> {
    match duration(text)? {
        Duration::ZERO => Err("must be above zero".into()),
        positive => Ok(positive),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn durations_read_as_people_write_them() {
        assert_eq!(duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(duration("1.5"), Ok(Duration::from_millis(1500)));
        assert_eq!(duration("1m 30s"), Ok(Duration::from_secs(90)));
        assert!(duration("soon").is_err() && duration("-1").is_err());
        assert_eq!(duration("-1s"), Err("a duration cannot be negative".into()));
        assert!(duration("1e19").is_err() && duration("200y").is_err() && duration("50y").is_ok());
    }
}
