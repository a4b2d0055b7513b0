use crate::reason::LossReason;
use std::error::Error as StdError;

/// A boxed error from a connector or a timer, kept as the source of `Connect` and `OutcomeUnknown`.
pub type BoxError = Box<dyn StdError + Send + Sync>;

/// What can go wrong. The variants a holder must act on are first: after `LeaseLost` or
/// `StaleFence` stop working under the fence; after `OutcomeUnknown` the call may have taken effect.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// PF001: the token no longer holds the key's live lease (released, revoked, expired, taken over).
    /// `reason`: what the server's lease_status said of it (`FenceClient::renew` and `renew_all` ask;
    /// the one-statement calls of `lease` do not, and leave it None).
    #[error("lease on {key:?} lost: its token no longer holds the live lease (PF001{})", reason_of(.reason))]
    LeaseLost { key: String, reason: Option<LossReason> },
    /// PF002: a fenced write under a fence that is not the key's live one.
    #[error("stale fence {fence}: the write was refused (PF002)")]
    StaleFence { fence: i64 },
    /// An acquire (through `hold`) that did not get the lease before its wait ran out.
    #[error("lease on {key:?} not granted within the wait")]
    WaitTimedOut { key: String },
    /// A waiting acquire ended by the server: 57014 (cancelled, or statement_timeout) or 55P03
    /// (lock_timeout while queued behind other waiters); nothing was granted. `sqlstate` says which.
    #[error("waiting acquire cancelled ({})", code(.0).unwrap_or("?"))]
    WaitCancelled(#[source] tokio_postgres::Error),
    /// The connection broke (or hung) mid-call and the retries ran out: the server may or may not
    /// have done it.
    #[error("outcome unknown: the connection failed mid-call and retries ran out")]
    OutcomeUnknown(#[source] BoxError),
    /// Any other error: from the server (see `sqlstate`), the statement failed and changed nothing.
    #[error(transparent)]
    Db(tokio_postgres::Error),
    /// No connection could be made before the retries ran out; nothing was sent.
    #[error("could not connect")]
    Connect(#[source] BoxError),
    /// An observer (`Elector::observe`) could not reach the server by the expiry of the lease it
    /// saw last (or within the lease TTL it was given, when it saw none): it cannot tell who leads.
    /// Not a vacancy, and not the old leader: the observer goes on, on a new connection, and its next
    /// item is the present again once it can see.
    #[error("the observer cannot see the key: {0}")]
    Blind(String),
    /// Options that cannot work (`hold`: a `renew_every` of zero, or not shorter than ttl less the
    /// margin); checked before anything is sent.
    #[error("invalid options: {0}")]
    Config(String),
}

impl Error {
    /// The SQLSTATE behind this error, when the server gave one.
    pub fn sqlstate(&self) -> Option<&str> {
        match self {
            Error::LeaseLost { .. } => Some("PF001"),
            Error::StaleFence { .. } => Some("PF002"),
            Error::WaitCancelled(err) | Error::Db(err) => code(err),
            Error::Connect(err) => refusal(err.as_ref()),
            _ => None,
        }
    }

    /// Whether the server refused the session for what only its configuration can change: the
    /// login (class 28: a wrong password, an unknown role, pg_hba), a database that does not
    /// exist (3D000) or may not be connected to (42501). Trying again only repeats the refusal.
    pub fn is_refused_login(&self) -> bool {
        matches!(self, Error::Connect(_))
            && self
                .sqlstate()
                .is_some_and(|code| code.starts_with("28") || code == "3D000" || code == "42501")
    }

    /// Whether trying again, on a new connection if need be, can help. Class 08 and the 57P0x
    /// codes are the server ending or refusing the session, not the statement being wrong.
    pub(crate) fn is_retryable(&self) -> bool {
        match self {
            Error::OutcomeUnknown(_) => true,
            Error::Connect(_) => !self.is_refused_login(),
            Error::Db(_) => {
                let code = self.sqlstate().unwrap_or("");
                code.starts_with("08") || code.starts_with("57P0") || code == "53300"
            }
            _ => false,
        }
    }

    /// Whether the call that failed so may still have taken effect. Besides a broken connection,
    /// 57P0x (the server ending the session: terminate, shutdown, crash) can come after the
    /// statement's work, e.g. a terminate during a commit's wait for a synchronous standby, where
    /// the commit stays.
    pub(crate) fn may_have_taken_effect(&self) -> bool {
        match self {
            Error::OutcomeUnknown(_) => true,
            Error::Db(_) => self.sqlstate().is_some_and(|code| code.starts_with("57P0")),
            _ => false,
        }
    }
}

/// A server error (it has a SQLSTATE) means the statement failed and changed nothing; anything else
/// from the driver means the connection failed and the server may or may not have done it.
pub(crate) fn classify(err: tokio_postgres::Error) -> Error {
    if err.code().is_some() {
        Error::Db(err)
    } else {
        Error::OutcomeUnknown(Box::new(err))
    }
}

fn reason_of(reason: &Option<LossReason>) -> String {
    reason.map(|reason| format!(", {reason}")).unwrap_or_default()
}

/// The SQLSTATE of a server error, to match pg_fence's own codes on.
pub(crate) fn code(err: &tokio_postgres::Error) -> Option<&str> {
    err.code().map(|code| code.code())
}

/// The SQLSTATE a failed connect carries somewhere in its sources (a connector may wrap the
/// driver's error): the server's refusal of the session.
fn refusal<'a>(err: &'a (dyn StdError + 'static)) -> Option<&'a str> {
    let mut next = Some(err);
    while let Some(err) = next {
        if let Some(code) = err.downcast_ref::<tokio_postgres::Error>().and_then(code) {
            return Some(code);
        }
        next = err.source();
    }
    None
}
