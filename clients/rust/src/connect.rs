use crate::error::BoxError;
use std::future::Future;
use std::ops::Deref;
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinHandle;
use tokio_postgres::tls::{MakeTlsConnect, TlsConnect};
use tokio_postgres::{Client, Config, NoTls, Socket};
use tokio_util::sync::CancellationToken;

/// Where the retrying client and the keeper get connections from. Implemented for a
/// `tokio_postgres::Config` (plain TCP, no TLS) and for a [`TlsConfig`]; implement it for a pool. A pool's
/// connection works as `Conn` through a newtype that derefs to `Client` (see the README).
///
/// The keeper holds its connection for as long as it keeps the lease (a session-bound lease lives
/// exactly as long as the session that took it), and drops it when it hangs or breaks.
pub trait Connector: Send + Sync + 'static {
    type Conn: Deref<Target = Client> + Send + Sync + 'static;

    fn connect(&self) -> impl Future<Output = Result<Self::Conn, BoxError>> + Send;

    /// Cancelled once `conn` has closed, if the connector can tell. The server closes an idle
    /// session only to end it (pg_terminate_backend, a shutdown), and a session-bound lease ends
    /// with it: with this the keeper learns of that at once instead of at its next renewal.
    fn closed(_conn: &Self::Conn) -> Option<CancellationToken> {
        None
    }

    /// A connection for a client's keeper (`FenceClient::hold`), which keeps it open and uses it
    /// for renewals and releases only. By default `connect`; a `Config` (and a `TlsConfig`) names
    /// its session `<application_name>_keeper`, so that the keeper's backends can be told apart.
    fn connect_keeper(&self) -> impl Future<Output = Result<Self::Conn, BoxError>> + Send {
        self.connect()
    }
}

/// `config` for a keeper's sessions: its application_name (or the default) with `_keeper`.
fn keeper_config(config: &Config) -> Config {
    let mut config = config.clone();
    let name = config.get_application_name().unwrap_or(APPLICATION_NAME).to_owned();
    config.application_name(format!("{name}_keeper"));
    config
}

/// A connection made from a `Config`: the client and the task driving its socket, which is ended
/// with it, so a connection abandoned because it hung closes its socket at once.
pub struct PgConnection {
    client: Client,
    task: JoinHandle<()>,
    closed: CancellationToken,
}

impl Deref for PgConnection {
    type Target = Client;

    fn deref(&self) -> &Client {
        &self.client
    }
}

impl Drop for PgConnection {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The application_name set when the config has none, so that a holder's backends can be found in
/// pg_stat_activity.
pub const APPLICATION_NAME: &str = "pg_fence_client";

/// The config as `connect` uses it: an application_name, keepalives, a connect timeout.
fn tuned(config: &Config) -> Config {
    let mut config = config.clone();
    if config.get_application_name().is_none() {
        config.application_name(APPLICATION_NAME);
    }
    // Keepalives find a peer that vanished (a dead host, a dropped route) within 10 + 3 * 2 = 16 s
    // of silence rather than the kernel's two hours and more; a hung but reachable server is
    // bounded by timeouts instead.
    config.keepalives(true);
    if config.get_keepalives_idle() >= Duration::from_secs(60) {
        config.keepalives_idle(Duration::from_secs(10));
    }
    if config.get_keepalives_interval().is_none() {
        config.keepalives_interval(Duration::from_secs(2));
    }
    if config.get_keepalives_retries().is_none() {
        config.keepalives_retries(3);
    }
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(Duration::from_secs(10));
    }
    config
}

async fn connect_with<T>(config: &Config, tls: T) -> Result<PgConnection, BoxError>
where
    T: MakeTlsConnect<Socket>,
    T::Stream: Send + 'static,
{
    let (client, connection) = tuned(config).connect(tls).await?;
    let closed = CancellationToken::new();
    let on_close = closed.clone();
    let task = tokio::spawn(async move {
        let _ = connection.await;
        on_close.cancel();
    });
    Ok(PgConnection { client, task, closed })
}

impl Connector for Config {
    type Conn = PgConnection;

    async fn connect(&self) -> Result<PgConnection, BoxError> {
        connect_with(self, NoTls).await
    }

    async fn connect_keeper(&self) -> Result<PgConnection, BoxError> {
        connect_with(&keeper_config(self), NoTls).await
    }

    fn closed(conn: &PgConnection) -> Option<CancellationToken> {
        Some(conn.closed.clone())
    }
}

/// A `Config` with a TLS connector (postgres-native-tls's `MakeTlsConnector`, tokio-postgres-rustls's,
/// ...), used as the config's `sslmode` says: the client itself depends on no TLS library, so that
/// a program without TLS builds none. Connects as the `Config` connector does otherwise.
#[derive(Clone)]
pub struct TlsConfig<T> {
    pub config: Config,
    pub tls: T,
}

impl<T> Connector for TlsConfig<T>
where
    T: MakeTlsConnect<Socket> + Clone + Send + Sync + 'static,
    T::Stream: Send + 'static,
    T::TlsConnect: Send,
    <T::TlsConnect as TlsConnect<Socket>>::Future: Send,
{
    type Conn = PgConnection;

    async fn connect(&self) -> Result<PgConnection, BoxError> {
        connect_with(&self.config, self.tls.clone()).await
    }

    async fn connect_keeper(&self) -> Result<PgConnection, BoxError> {
        connect_with(&keeper_config(&self.config), self.tls.clone()).await
    }

    fn closed(conn: &PgConnection) -> Option<CancellationToken> {
        Some(conn.closed.clone())
    }
}

impl<T: Connector> Connector for Arc<T> {
    type Conn = T::Conn;

    fn connect(&self) -> impl Future<Output = Result<T::Conn, BoxError>> + Send {
        (**self).connect()
    }

    fn closed(conn: &T::Conn) -> Option<CancellationToken> {
        T::closed(conn)
    }

    fn connect_keeper(&self) -> impl Future<Output = Result<T::Conn, BoxError>> + Send {
        (**self).connect_keeper()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keepalives_give_up_on_a_silent_peer_in_seconds() {
        let config = tuned(&"host=db user=app".parse().unwrap());
        assert_eq!(config.get_keepalives_idle(), Duration::from_secs(10));
        assert_eq!(config.get_keepalives_interval(), Some(Duration::from_secs(2)));
        assert_eq!(config.get_keepalives_retries(), Some(3));
        let chosen =
            tuned(&"host=db keepalives_idle=5 keepalives_interval=1 keepalives_retries=9".parse().unwrap());
        assert_eq!(chosen.get_keepalives_interval(), Some(Duration::from_secs(1)), "the caller's kept");
        assert_eq!(chosen.get_keepalives_retries(), Some(9));
    }
}
