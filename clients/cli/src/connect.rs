//! The connection, as every PostgreSQL tool makes it: `--dsn` first, then the PG* environment, then
//! libpq's defaults. tokio-postgres reads no environment and no password file, and knows neither
//! sslmode verify-ca/verify-full, sslrootcert nor service files, so all of these are read here.
use crate::exit::{Code, Exit};
use pg_fence_client::{BoxError, Connector, PgConnection, TlsConfig};
use postgres_native_tls::MakeTlsConnector;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_postgres::config::{Host, SslMode, TargetSessionAttrs};
use tokio_postgres::{CancelToken, Config};
use tokio_util::sync::CancellationToken;

/// How long pg-fence waits for a server to answer, when PGCONNECT_TIMEOUT and connect_timeout say
/// nothing: libpq would wait for ever, and a cron line on a frozen server would pile up processes.
pub const DEFAULT_ANSWER_LIMIT: Duration = Duration::from_secs(10);

/// The server pg-fence talks to: the config, and the TLS connector its sslmode asks for. Each
/// connection is bounded by the connect timeout (per host, as libpq's), which the driver applies
/// to the TCP connect only: a server that accepts and never answers (stopped, or behind a proxy
/// that stopped forwarding) must fail as an unreachable one does.
#[derive(Clone)]
pub struct Server {
    pub config: Config,
    pub tls: MakeTlsConnector,
}

impl Server {
    /// How long a connect to one host, and each statement, may go unanswered; None: for ever (a
    /// connect_timeout of 0, as in libpq).
    pub fn answer_limit(&self) -> Option<Duration> {
        self.config.get_connect_timeout().copied()
    }

    fn tls_config(&self) -> TlsConfig<MakeTlsConnector> {
        TlsConfig { config: self.config.clone(), tls: self.tls.clone() }
    }

    /// `connect`, bounded by the answer limit for each host, its error naming the server as psql
    /// names it.
    async fn bounded<F>(&self, connect: F) -> Result<PgConnection, BoxError>
    where
        F: std::future::Future<Output = Result<PgConnection, BoxError>>,
    {
        let hosts = self.config.get_hosts().len().max(1) as u32;
        let made = match self.answer_limit() {
            Some(limit) => match tokio::time::timeout(limit * hosts, connect).await {
                Ok(made) => made,
                Err(_) => Err("timeout expired".into()),
            },
            None => connect.await,
        };
        made.map_err(|source| Box::new(ConnectFailed { server: self.failed(), source }) as BoxError)
    }

    /// "connection to server at "HOST", port PORT failed", as psql says it.
    fn failed(&self) -> String {
        format!("connection to server {} failed", self.named())
    }

    /// "at "HOST", port PORT" (or "on socket "PATH"") for each host, as psql names a server.
    pub fn named(&self) -> String {
        let ports = self.config.get_ports();
        let servers: Vec<String> = self
            .config
            .get_hosts()
            .iter()
            .enumerate()
            .map(|(n, host)| {
                let port = ports.get(n).or(ports.first()).copied().unwrap_or(5432);
                match host {
                    Host::Tcp(host) => format!("at \"{host}\", port {port}"),
                    Host::Unix(dir) => format!("on socket \"{}/.s.PGSQL.{port}\"", dir.display()),
                }
            })
            .collect();
        servers.join(" or ")
    }
}

/// A connect that failed, naming the server; its source keeps the driver's error (and the
/// SQLSTATE of a refused login).
#[derive(Debug)]
pub struct ConnectFailed {
    server: String,
    source: BoxError,
}

impl std::fmt::Display for ConnectFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.server)
    }
}

impl std::error::Error for ConnectFailed {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(self.source.as_ref())
    }
}

impl Connector for Server {
    type Conn = PgConnection;

    async fn connect(&self) -> Result<PgConnection, BoxError> {
        self.bounded(self.tls_config().connect()).await
    }

    async fn connect_keeper(&self) -> Result<PgConnection, BoxError> {
        self.bounded(self.tls_config().connect_keeper()).await
    }

    fn closed(conn: &PgConnection) -> Option<CancellationToken> {
        TlsConfig::<MakeTlsConnector>::closed(conn)
    }
}

/// libpq's sslmodes. tokio-postgres has disable, prefer and require; allow is taken as prefer
/// (either connects to a server with or without TLS), the verify modes as require with checks
/// made by the TLS connector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Disable,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl Mode {
    fn parse(text: &str) -> Result<Mode, Exit> {
        Ok(match text {
            "disable" => Mode::Disable,
            "allow" | "prefer" => Mode::Prefer,
            "require" => Mode::Require,
            "verify-ca" => Mode::VerifyCa,
            "verify-full" => Mode::VerifyFull,
            other => return Err(Exit::new(Code::Usage, format!("sslmode {other:?}: not one of libpq's"))),
        })
    }
}

/// The server from `dsn` and the environment `env`, its TLS as libpq sets it up: sslmode (default
/// prefer) and sslrootcert from the DSN, else PGSSLMODE and PGSSLROOTCERT; the root certificate
/// by default `~/.postgresql/root.crt`, `system` for the system's. prefer and require check no
/// certificate, unless (as in libpq) require finds a root certificate: then it checks the chain,
/// as verify-ca does; verify-full also checks the host name.
pub fn server(dsn: Option<&str>, env: &dyn Fn(&str) -> Option<String>) -> Result<Server, Exit> {
    let (dsn, mut taken) = match dsn {
        Some(dsn) => {
            let (rest, taken) = take_options(dsn);
            (Some(rest), taken)
        }
        None => (None, HashMap::new()),
    };
    let service = match taken.remove("service").or_else(|| env("PGSERVICE")) {
        Some(name) => service(&name, env)?,
        None => HashMap::new(),
    };
    // libpq's order: the DSN, then the service, then the environment.
    // The DSN's connect_timeout is read here, as libpq reads it (0: no limit, 1: 2 s), where the
    // driver would take 0 for no setting at all.
    let timeout = taken.remove("connect_timeout");
    let env = |name: &str| match name {
        "PGCONNECT_TIMEOUT" if timeout.is_some() => timeout.clone(),
        _ => service.get(name).cloned().or_else(|| env(name)),
    };
    let mut config = config(dsn.as_deref(), &env)?;
    // A DSN's sslmode that the driver read itself (quoted, or with spaces around `=`): require or
    // disable, as its prefer cannot be told from its default. Else PGSSLMODE would override it,
    // and a require become a prefer that falls back to plaintext.
    let read = match config.get_ssl_mode() {
        SslMode::Require => Some("require".to_owned()),
        SslMode::Disable => Some("disable".to_owned()),
        _ => None,
    };
    let mode = Mode::parse(
        &taken.remove("sslmode").or(read).or_else(|| env("PGSSLMODE")).unwrap_or_else(|| "prefer".into()),
    )?;
    let root =
        taken.remove("sslrootcert").or_else(|| env("PGSSLROOTCERT")).map(PathBuf::from).or_else(|| {
            let default = Path::new(&env("HOME")?).join(".postgresql/root.crt");
            default.exists().then_some(default)
        });
    config.ssl_mode(match mode {
        Mode::Disable => SslMode::Disable,
        Mode::Prefer => SslMode::Prefer,
        Mode::Require | Mode::VerifyCa | Mode::VerifyFull => SslMode::Require,
    });
    let tls = tls_connector(mode, root.as_deref())?;
    Ok(Server { config, tls: MakeTlsConnector::new(tls) })
}

/// How long pg-fence, asked to stop while it waits for a key, tries to end that wait on the server.
pub const ABANDON_LIMIT: Duration = Duration::from_secs(5);

/// The server, keeping the cancel token of the connection it made last: the one an acquire waits
/// on, which the server does not leave when pg-fence exits, but only when cancelled.
#[derive(Clone)]
pub struct Tracking {
    pub server: Server,
    last: Arc<Mutex<Option<CancelToken>>>,
}

impl Tracking {
    pub fn new(server: Server) -> Tracking {
        Tracking { server, last: Arc::default() }
    }

    /// Cancels the statement of the last connection made, if any, within ABANDON_LIMIT.
    pub async fn cancel(&self) {
        let last = self.last.lock().unwrap().take();
        if let Some(cancel) = last {
            let tls = self.server.tls.clone();
            tokio::time::timeout(ABANDON_LIMIT, cancel.cancel_query(tls)).await.ok();
        }
    }
}

impl Connector for Tracking {
    type Conn = PgConnection;

    async fn connect(&self) -> Result<Self::Conn, BoxError> {
        let conn = self.server.connect().await?;
        *self.last.lock().unwrap() = Some(conn.cancel_token());
        Ok(conn)
    }

    fn closed(conn: &Self::Conn) -> Option<CancellationToken> {
        Server::closed(conn)
    }

    async fn connect_keeper(&self) -> Result<Self::Conn, BoxError> {
        self.server.connect_keeper().await
    }
}

fn tls_connector(mode: Mode, root: Option<&Path>) -> Result<native_tls::TlsConnector, Exit> {
    let usage = |message: String| Exit::new(Code::Usage, message);
    let mut builder = native_tls::TlsConnector::builder();
    let checked = match (mode, root) {
        (Mode::VerifyCa | Mode::VerifyFull, None) => return Err(usage(
                "sslmode verify-ca and verify-full need a root certificate: sslrootcert, PGSSLROOTCERT or ~/.postgresql/root.crt".into(),
            )),
        (Mode::Require | Mode::VerifyCa | Mode::VerifyFull, Some(root)) => Some(root),
        _ => None,
    };
    match checked {
        None => {
            builder.danger_accept_invalid_certs(true);
        }
        Some(root) => {
            builder.danger_accept_invalid_hostnames(mode != Mode::VerifyFull);
            if root != Path::new("system") {
                builder.disable_built_in_roots(true);
                let pem = std::fs::read(root)
                    .map_err(|err| usage(format!("root certificate {}: {err}", root.display())))?;
                for cert in split_pem(&pem) {
                    let cert = native_tls::Certificate::from_pem(cert)
                        .map_err(|err| usage(format!("root certificate {}: {err}", root.display())))?;
                    builder.add_root_certificate(cert);
                }
            }
        }
    }
    builder.build().map_err(|err| usage(format!("TLS: {err}")))
}

/// Each certificate of a PEM file that may hold several (a chain of CAs).
fn split_pem(pem: &[u8]) -> Vec<&[u8]> {
    const BEGIN: &[u8] = b"-----BEGIN CERTIFICATE-----";
    let starts: Vec<usize> = (0..pem.len()).filter(|&i| pem[i..].starts_with(BEGIN)).collect();
    starts
        .iter()
        .enumerate()
        .map(|(n, &start)| &pem[start..*starts.get(n + 1).unwrap_or(&pem.len())])
        .collect()
}

/// `dsn` without the options the driver does not know (sslmode's verify modes, sslrootcert,
/// service), and their values: in the keyword form, words `NAME=VALUE` (a quoted value, or spaces
/// around `=`, are left to the driver, which takes only sslmode disable, prefer and require); in a
/// URI, query parameters.
fn take_options(dsn: &str) -> (String, HashMap<&'static str, String>) {
    let mut taken = HashMap::new();
    let mut take = |word: &str| {
        let Some((name, value)) = word.split_once('=') else { return false };
        let known =
            ["sslmode", "sslrootcert", "service", "connect_timeout"].into_iter().find(|known| *known == name);
        match known {
            Some(name) if !value.starts_with('\'') => {
                taken.insert(name, value.to_owned());
                true
            }
            _ => false,
        }
    };
    let rest = if dsn.starts_with("postgres://") || dsn.starts_with("postgresql://") {
        match dsn.split_once('?') {
            Some((base, query)) => {
                let kept: Vec<&str> =
                    query.split('&').filter(|param| !take(&percent_decoded(param))).collect();
                if kept.is_empty() {
                    base.to_owned()
                } else {
                    format!("{base}?{}", kept.join("&"))
                }
            }
            None => dsn.to_owned(),
        }
    } else {
        let mut rest = String::new();
        let mut from = 0;
        for word in dsn.split_whitespace() {
            let start = word.as_ptr() as usize - dsn.as_ptr() as usize;
            if take(word) {
                rest.push_str(&dsn[from..start]);
                from = start + word.len();
            }
        }
        rest.push_str(&dsn[from..]);
        rest
    };
    (rest, taken)
}

/// The parameters of service `name` as the PG* variables they stand for, from the first file that
/// defines it, as libpq looks: PGSERVICEFILE or ~/.pg_service.conf, then pg_service.conf in
/// PGSYSCONFDIR (Debian's libpq: /etc/postgresql-common). A parameter pg-fence does not take is
/// refused rather than ignored.
fn service(name: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<HashMap<&'static str, String>, Exit> {
    let usage = |message: String| Exit::new(Code::Usage, message);
    let user = env("PGSERVICEFILE")
        .map(PathBuf::from)
        .or_else(|| env("HOME").map(|home| Path::new(&home).join(".pg_service.conf")));
    let system = Path::new(&env("PGSYSCONFDIR").unwrap_or_else(|| "/etc/postgresql-common".into()))
        .join("pg_service.conf");
    for file in user.into_iter().chain([system]) {
        let Ok(text) = std::fs::read_to_string(&file) else { continue };
        let Some(params) = service_section(&text, name) else { continue };
        return params
            .into_iter()
            .map(|(key, value)| {
                let variable =
                    SERVICE_PARAMETERS.iter().find(|(param, _)| *param == key).map(|(_, var)| *var);
                let variable = variable.ok_or_else(|| {
                    usage(format!("{}: service {name}: {key} is not supported", file.display()))
                })?;
                Ok((variable, value))
            })
            .collect();
    }
    Err(usage(format!("definition of service {name:?} not found")))
}

/// The parameters a service may set, and the variables that stand for them.
const SERVICE_PARAMETERS: [(&str, &str); 11] = [
    ("host", "PGHOST"),
    ("port", "PGPORT"),
    ("user", "PGUSER"),
    ("dbname", "PGDATABASE"),
    ("password", "PGPASSWORD"),
    ("passfile", "PGPASSFILE"),
    ("application_name", "PGAPPNAME"),
    ("connect_timeout", "PGCONNECT_TIMEOUT"),
    ("target_session_attrs", "PGTARGETSESSIONATTRS"),
    ("sslmode", "PGSSLMODE"),
    ("sslrootcert", "PGSSLROOTCERT"),
];

/// The `key=value` lines of section `[name]` of a service file; None when it has none.
fn service_section(text: &str, name: &str) -> Option<Vec<(String, String)>> {
    let mut found: Option<Vec<(String, String)>> = None;
    for line in text.lines().map(str::trim).filter(|line| !line.is_empty() && !line.starts_with('#')) {
        if let Some(section) = line.strip_prefix('[').and_then(|line| line.strip_suffix(']')) {
            if found.is_some() {
                break;
            }
            found = (section == name).then(Vec::new);
        } else if let (Some(params), Some((key, value))) = (found.as_mut(), line.split_once('=')) {
            params.push((key.trim().to_owned(), value.trim().to_owned()));
        }
    }
    found
}

/// A URI's query parameter with its %XX escapes decoded.
fn percent_decoded(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex =
            bytes.get(i + 1..i + 3).and_then(|h| u8::from_str_radix(std::str::from_utf8(h).ok()?, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(byte)) => {
                out.push(byte);
                i += 3;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The application_name when neither the DSN nor PGAPPNAME gives one: what pg_stat_activity shows.
const APPLICATION_NAME: &str = "pg-fence";

/// The config from `dsn` and the environment `env` (a lookup, so that tests need not touch the
/// process's own).
fn config(dsn: Option<&str>, env: &dyn Fn(&str) -> Option<String>) -> Result<Config, Exit> {
    let usage = |message: String| Exit::new(Code::Usage, message);
    let mut config = match dsn {
        Some(dsn) => Config::from_str(dsn).map_err(|err| usage(format!("--dsn: {err}")))?,
        None => Config::new(),
    };
    if config.get_hosts().is_empty() {
        let hosts = env("PGHOST").unwrap_or_else(default_host);
        for host in hosts.split(',') {
            match host.starts_with('/') {
                true => config.host_path(host),
                false => config.host(host),
            };
        }
    }
    if config.get_ports().is_empty() {
        if let Some(ports) = env("PGPORT") {
            for port in ports.split(',') {
                config.port(port.trim().parse().map_err(|_| usage(format!("PGPORT: bad port {port:?}")))?);
            }
        }
    }
    if config.get_user().is_none() {
        // As libpq: the user this process runs as, not $USER, which a systemd unit or a container
        // may leave unset or set to someone else.
        let user = env("PGUSER").or_else(os_user).ok_or_else(|| {
            usage("no user to connect as: the effective uid has no name; set PGUSER or user= in --dsn".into())
        })?;
        config.user(user);
    }
    if config.get_dbname().is_none() {
        if let Some(dbname) = env("PGDATABASE") {
            config.dbname(dbname);
        }
    }
    if config.get_application_name().is_none() {
        config.application_name(env("PGAPPNAME").unwrap_or_else(|| APPLICATION_NAME.into()));
    }
    if config.get_connect_timeout().is_none() {
        // libpq's reading: 0 (or less) waits indefinitely, where the driver would time out at once,
        // and 1 is taken as 2.
        let secs = env("PGCONNECT_TIMEOUT").and_then(|secs| secs.trim().parse::<i64>().ok());
        match secs {
            Some(secs) if secs > 0 => {
                config.connect_timeout(Duration::from_secs(secs.max(2) as u64));
            }
            Some(_) => {}
            None => {
                config.connect_timeout(DEFAULT_ANSWER_LIMIT);
            }
        }
    }
    if let Some(attrs) = env("PGTARGETSESSIONATTRS") {
        if config.get_target_session_attrs() == TargetSessionAttrs::Any {
            config.target_session_attrs(match attrs.as_str() {
                "read-write" => TargetSessionAttrs::ReadWrite,
                "any" => TargetSessionAttrs::Any,
                other => return Err(usage(format!("PGTARGETSESSIONATTRS={other}: only any and read-write"))),
            });
        }
    }
    if config.get_password().is_none() {
        let password = env("PGPASSWORD").or_else(|| {
            let file = env("PGPASSFILE")
                .map(PathBuf::from)
                .or_else(|| env("HOME").map(|home| Path::new(&home).join(".pgpass")))?;
            pgpass(&file, &config)
        });
        if let Some(password) = password {
            config.password(password);
        }
    }
    Ok(config)
}

/// The name of the effective user, as libpq's default user.
fn os_user() -> Option<String> {
    // SAFETY: getpwuid returns NULL or a pointer to a static record, read here at once; pg-fence
    // reads the connection before it starts any other thread that could call getpw* meanwhile.
    unsafe {
        let record = libc::getpwuid(libc::geteuid());
        if record.is_null() || (*record).pw_name.is_null() {
            return None;
        }
        std::ffi::CStr::from_ptr((*record).pw_name).to_str().ok().map(str::to_owned)
    }
}

/// libpq's default: its socket directory when there is one, else localhost.
fn default_host() -> String {
    let socket = "/var/run/postgresql";
    if Path::new(socket).is_dir() {
        socket.into()
    } else {
        "localhost".into()
    }
}

/// The password `file` (a ~/.pgpass) gives for the first host of `config`, as libpq looks it up:
/// the first line whose host:port:database:user match, `*` matching anything, a socket host
/// matching `localhost`. A file others may read is ignored, as libpq ignores it.
fn pgpass(file: &Path, config: &Config) -> Option<String> {
    use std::os::unix::fs::PermissionsExt;
    let meta = std::fs::metadata(file).ok()?;
    if meta.permissions().mode() & 0o077 != 0 {
        crate::sayln!("pg-fence: password file {} has group or world access; ignored", file.display());
        return None;
    }
    let host = match config.get_hosts().first()? {
        Host::Tcp(host) => host.clone(),
        Host::Unix(_) => "localhost".into(),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432).to_string();
    let user = config.get_user().unwrap_or_default();
    let dbname = config.get_dbname().unwrap_or(user);
    let wanted = [host.as_str(), port.as_str(), dbname, user];
    std::fs::read_to_string(file).ok()?.lines().filter(|line| !line.starts_with('#')).find_map(|line| {
        let fields = pgpass_fields(line);
        let matches =
            fields.len() == 5 && fields.iter().zip(wanted).all(|(field, want)| field == "*" || field == want);
        matches.then(|| fields[4].clone())
    })
}

/// The fields of a .pgpass line: `:` separates, `\` escapes the next character.
fn pgpass_fields(line: &str) -> Vec<String> {
    let (mut fields, mut field, mut chars) = (Vec::new(), String::new(), line.chars());
    while let Some(c) = chars.next() {
        match c {
            '\\' => field.extend(chars.next()),
            ':' if fields.len() < 4 => fields.push(std::mem::take(&mut field)),
            c => field.push(c),
        }
    }
    fields.push(field);
    fields
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn from(dsn: Option<&str>, vars: &[(&str, &str)]) -> Result<Config, Exit> {
        let vars: HashMap<String, String> =
            vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        config(dsn, &move |name| vars.get(name).cloned())
    }

    #[test]
    fn the_environment_fills_in_what_the_dsn_leaves_out() {
        let config = from(
            Some("host=db1,db2 target_session_attrs=read-write"),
            &[("PGHOST", "x"), ("PGPORT", "6432"), ("PGUSER", "app"), ("PGDATABASE", "jobs")],
        )
        .unwrap();
        assert_eq!(config.get_hosts(), [Host::Tcp("db1".into()), Host::Tcp("db2".into())]);
        assert_eq!(config.get_ports(), [6432]);
        assert_eq!((config.get_user(), config.get_dbname()), (Some("app"), Some("jobs")));
        assert_eq!(config.get_target_session_attrs(), TargetSessionAttrs::ReadWrite);
        assert_eq!(config.get_application_name(), Some(APPLICATION_NAME));
        let sockets =
            from(None, &[("PGHOST", "/tmp"), ("USER", "me"), ("PGTARGETSESSIONATTRS", "read-write")])
                .unwrap();
        assert_eq!(sockets.get_hosts(), [Host::Unix("/tmp".into())]);
        assert_eq!(sockets.get_user(), os_user().as_deref(), "the OS user, not $USER");
        assert_eq!(sockets.get_target_session_attrs(), TargetSessionAttrs::ReadWrite);
    }

    #[test]
    fn without_pguser_the_user_is_the_effective_users_name_not_user_nor_postgres() {
        let id = std::process::Command::new("id").arg("-un").output().unwrap();
        let me = String::from_utf8(id.stdout).unwrap().trim().to_owned();
        for vars in [&[][..], &[("USER", "someone-else")]] {
            assert_eq!(from(None, vars).unwrap().get_user(), Some(me.as_str()), "{vars:?}");
        }
        assert_eq!(from(None, &[("PGUSER", "app")]).unwrap().get_user(), Some("app"));
    }

    #[test]
    fn a_connect_timeout_of_zero_is_no_timeout_and_below_two_seconds_two() {
        let timeout =
            |secs| from(None, &[("PGCONNECT_TIMEOUT", secs)]).unwrap().get_connect_timeout().copied();
        assert_eq!(timeout("0"), None, "as libpq: wait indefinitely");
        assert_eq!(timeout("1"), Some(Duration::from_secs(2)), "as libpq: at least 2 s");
        assert_eq!(timeout("10"), Some(Duration::from_secs(10)));
        let unset = from(None, &[]).unwrap().get_connect_timeout().copied();
        assert_eq!(unset, Some(DEFAULT_ANSWER_LIMIT), "bounded when nothing says otherwise");
        let dsn = |dsn: &str| {
            let server = super::server(Some(dsn), &|name| (name == "PGCONNECT_TIMEOUT").then(|| "7".into()));
            server.ok().and_then(|server| server.answer_limit())
        };
        assert_eq!(dsn("host=db connect_timeout=0"), None, "the DSN's 0 over the environment's");
        assert_eq!(dsn("postgres://db?connect_timeout=1"), Some(Duration::from_secs(2)));
        assert_eq!(dsn("host=db"), Some(Duration::from_secs(7)));
    }

    #[test]
    fn what_the_driver_cannot_do_is_refused() {
        assert_eq!(from(None, &[("PGTARGETSESSIONATTRS", "standby")]).unwrap_err().code, Code::Usage);
    }

    #[test]
    fn sslmode_and_sslrootcert_come_from_the_dsn_before_the_environment() {
        let server = |dsn: Option<&str>, vars: &[(&str, &str)]| {
            let vars: HashMap<String, String> =
                vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
            super::server(dsn, &move |name| vars.get(name).cloned())
        };
        let mode = |dsn, vars| server(dsn, vars).map(|server| server.config.get_ssl_mode());
        assert_eq!(mode(None, &[]).unwrap(), SslMode::Prefer);
        assert_eq!(mode(None, &[("PGSSLMODE", "allow")]).unwrap(), SslMode::Prefer);
        assert_eq!(mode(None, &[("PGSSLMODE", "require")]).unwrap(), SslMode::Require);
        assert_eq!(
            mode(Some("host=db sslmode=disable"), &[("PGSSLMODE", "require")]).unwrap(),
            SslMode::Disable
        );
        assert_eq!(mode(None, &[("PGSSLMODE", "verify-full")]).unwrap_err().code, Code::Usage, "no root");
        assert_eq!(mode(None, &[("PGSSLMODE", "bogus")]).unwrap_err().code, Code::Usage);
        let missing = [("PGSSLMODE", "verify-ca"), ("PGSSLROOTCERT", "/nonexistent/root.crt")];
        assert_eq!(mode(None, &missing).unwrap_err().code, Code::Usage, "a root that cannot be read");

        for dsn in ["host=db sslmode = require", "host=db sslmode='require'"] {
            let with_env = mode(Some(dsn), &[("PGSSLMODE", "disable")]);
            assert_eq!(
                (mode(Some(dsn), &[]).unwrap(), with_env.unwrap()),
                (SslMode::Require, SslMode::Require),
                "{dsn}"
            );
        }
        let (rest, taken) =
            take_options("host=db  sslmode=verify-full user=app sslrootcert=/etc/ca.crt password='a  b'");
        assert_eq!(rest, "host=db   user=app  password='a  b'");
        assert_eq!(
            (taken["sslmode"].as_str(), taken["sslrootcert"].as_str()),
            ("verify-full", "/etc/ca.crt")
        );
        let (rest, taken) = take_options(
            "postgresql://app@db/jobs?sslmode=verify-ca&connect_timeout=5&sslrootcert=%2Fca.crt",
        );
        assert_eq!(rest, "postgresql://app@db/jobs");
        assert_eq!((taken["sslmode"].as_str(), taken["sslrootcert"].as_str()), ("verify-ca", "/ca.crt"));
        assert_eq!(taken["connect_timeout"], "5");
        assert_eq!(take_options("postgres://db?sslmode=require").0, "postgres://db");
    }

    #[test]
    fn a_service_fills_in_what_the_dsn_leaves_out_before_the_environment() {
        let dir = std::env::temp_dir().join(format!("pg-fence-service-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (user_file, system_dir) = (dir.join("services"), dir.join("etc"));
        std::fs::create_dir_all(&system_dir).unwrap();
        std::fs::write(
            &user_file,
            "# mine\n[prod]\nhost=db1,db2\nport = 6432\nsslmode=disable\n[bad]\nsslcert=x\n",
        )
        .unwrap();
        std::fs::write(system_dir.join("pg_service.conf"), "[prod]\nhost=shadowed\n[shared]\ndbname=jobs\n")
            .unwrap();
        let (user_file, system_dir) = (user_file.to_str().unwrap(), system_dir.to_str().unwrap());
        let server = |dsn: Option<&str>, vars: &[(&str, &str)]| {
            let mut vars: HashMap<String, String> =
                vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
            vars.insert("PGSERVICEFILE".into(), user_file.into());
            vars.insert("PGSYSCONFDIR".into(), system_dir.into());
            super::server(dsn, &move |name| vars.get(name).cloned())
        };
        let prod = server(None, &[("PGSERVICE", "prod"), ("PGPORT", "1"), ("PGUSER", "app")]).unwrap();
        assert_eq!(prod.config.get_hosts(), [Host::Tcp("db1".into()), Host::Tcp("db2".into())]);
        assert_eq!(prod.config.get_ports(), [6432], "the service's over the environment's");
        assert_eq!(prod.config.get_user(), Some("app"), "the environment's where the service says nothing");
        assert_eq!(prod.config.get_ssl_mode(), SslMode::Disable);
        let dsn = server(Some("service=prod port=7000 sslmode=require"), &[]).unwrap();
        assert_eq!(dsn.config.get_ports(), [7000], "the DSN's over the service's");
        assert_eq!(dsn.config.get_ssl_mode(), SslMode::Require);
        let shared = server(Some("postgres://db?service=shared"), &[]).unwrap();
        assert_eq!(shared.config.get_dbname(), Some("jobs"), "from the system file");
        assert_eq!(
            server(None, &[("PGSERVICE", "bad")]).err().map(|err| err.code),
            Some(Code::Usage),
            "sslcert"
        );
        assert_eq!(server(None, &[("PGSERVICE", "none")]).err().map(|err| err.code), Some(Code::Usage));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_password_file_is_read_as_libpq_reads_it() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("pg-fence-pgpass-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("pgpass");
        std::fs::write(&file, "# comment\nother:*:*:*:no\ndb:5433:*:app:a\\:b\\\\c\n*:*:*:*:fallback\n")
            .unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        let file_text = file.to_str().unwrap();
        let password = |vars: &[(&str, &str)]| {
            let mut vars = vars.to_vec();
            vars.push(("PGPASSFILE", file_text));
            from(None, &vars).unwrap().get_password().map(|p| String::from_utf8(p.to_vec()).unwrap())
        };
        assert_eq!(
            password(&[("PGHOST", "db"), ("PGPORT", "5433"), ("PGUSER", "app")]).as_deref(),
            Some("a:b\\c")
        );
        assert_eq!(password(&[("PGHOST", "db"), ("PGUSER", "app")]).as_deref(), Some("fallback"));
        assert_eq!(password(&[("PGPASSWORD", "env"), ("PGHOST", "db")]).as_deref(), Some("env"));
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert_eq!(password(&[("PGHOST", "db")]), None, "a file others can read is ignored");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
