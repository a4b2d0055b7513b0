//! The exit statuses of pg-fence, apart from the command's own. They follow sysexits.h where one
//! fits, so that a wrapper script can tell "someone else has the key" from "the database is down"
//! (as `flock -E` and `consul lock` let it); a command that exits with one of these numbers itself
//! cannot be told apart, which the README says.
use pg_fence_client::Error;

/// `eprint!`, but a stderr nobody reads (a closed pipe) is ignored rather than a panic: a panic
/// there would end pg-fence before it stops the command whose lease was lost.
#[macro_export]
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write;
        let _ = write!(std::io::stderr(), $($arg)*);
    }};
}

/// `eprintln!` as `say!` writes it.
#[macro_export]
macro_rules! sayln {
    () => { $crate::say!("\n") };
    ($($arg:tt)*) => {{
        use std::io::Write;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}
use std::fmt;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    /// The command line cannot work (EX_USAGE).
    Usage,
    /// The server could not be reached, or stopped answering before the lease was granted
    /// (EX_UNAVAILABLE).
    Unreachable,
    /// The server refused a statement for another reason: no pg_fence, a permission (EX_SOFTWARE).
    Failed,
    /// The server refused the login or the database: a wrong password, an unknown role, pg_hba,
    /// a database that does not exist (EX_CONFIG). Not retried: only the configuration can help.
    Config,
    /// The key is held: `--no-wait`, or `--wait` ran out (EX_TEMPFAIL: try again later).
    Held,
    /// The lease was lost while the command ran (revoked, expired, taken over, or the local
    /// deadline passed without an answer): the command was stopped.
    Lost,
    /// `status`: the key is not held; `revoke`: there was nothing to revoke.
    NotHeld,
    /// The command could not be started: 127 not found, 126 not runnable (as a shell says).
    Command(i32),
    /// pg-fence was sent this signal before the command started: 128 + N, as a shell says.
    Signalled(i32),
}

impl Code {
    pub fn code(self) -> i32 {
        match self {
            Code::Usage => 64,
            Code::Unreachable => 69,
            Code::Failed => 70,
            Code::Held => 75,
            Code::Config => 78,
            Code::Lost => 76,
            Code::NotHeld => 1,
            Code::Command(code) => code,
            Code::Signalled(signal) => 128 + signal,
        }
    }
}

/// Why pg-fence stops before or besides the command's own end: its status and what stderr says.
#[derive(Debug)]
pub struct Exit {
    pub code: Code,
    pub message: String,
}

impl Exit {
    pub fn new(code: Code, message: impl Into<String>) -> Exit {
        Exit { code, message: message.into() }
    }
}

impl fmt::Display for Exit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

/// Whether the server refused a statement's input (class 22: an empty or too long key, a TTL
/// above pg_fence.max_ttl, ...): the command line asked for what cannot be.
fn bad_input(sqlstate: Option<&str>) -> bool {
    sqlstate.is_some_and(|code| code.starts_with("22"))
}

/// A client error as an exit: a refused login is Config, no connection (or no answer) is
/// Unreachable, bad options or input the server refuses are Usage, another refusal is Failed.
impl From<Error> for Exit {
    fn from(err: Error) -> Exit {
        let code = match &err {
            err if err.is_refused_login() => Code::Config,
            err if bad_input(err.sqlstate()) => Code::Usage,
            Error::Connect(_) | Error::OutcomeUnknown(_) => Code::Unreachable,
            Error::Config(_) => Code::Usage,
            Error::WaitTimedOut { .. } => Code::Held,
            _ => Code::Failed,
        };
        Exit::new(code, describe(&err))
    }
}

impl From<tokio_postgres::Error> for Exit {
    fn from(err: tokio_postgres::Error) -> Exit {
        let code = match err.code().map(|code| code.code()) {
            sqlstate if bad_input(sqlstate) => Code::Usage,
            Some(_) => Code::Failed,
            None => Code::Unreachable,
        };
        Exit::new(code, describe(&err))
    }
}

/// An error and its sources, one line: the driver's own messages say what the server said.
pub fn describe(err: &(dyn std::error::Error + 'static)) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        let line = cause.to_string();
        if !text.contains(&line) {
            text = format!("{text}: {line}");
        }
        source = cause.source();
    }
    text
}
