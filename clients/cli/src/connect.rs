//! The connection, as every PostgreSQL tool makes it: `--dsn` first, then the PG* environment, then
//! libpq's defaults. tokio-postgres reads no environment and no password file, so both are read
//! here; what it cannot do (TLS, service files) is refused with a message rather than ignored.
use crate::exit::{Code, Exit};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;
use tokio_postgres::config::{Host, TargetSessionAttrs};
use tokio_postgres::Config;

/// The application_name when neither the DSN nor PGAPPNAME gives one: what pg_stat_activity shows.
const APPLICATION_NAME: &str = "pg-fence";

/// The config from `dsn` and the environment `env` (a lookup, so that tests need not touch the
/// process's own).
pub fn config(dsn: Option<&str>, env: &dyn Fn(&str) -> Option<String>) -> Result<Config, Exit> {
    let usage = |message: String| Exit::new(Code::Usage, message);
    for unsupported in ["PGSERVICE", "PGSERVICEFILE"] {
        if env(unsupported).is_some() {
            return Err(usage(format!("{unsupported} is not supported (no service files): use --dsn")));
        }
    }
    if let Some(mode) =
        env("PGSSLMODE").filter(|mode| !matches!(mode.as_str(), "disable" | "allow" | "prefer"))
    {
        return Err(usage(format!("PGSSLMODE={mode}: pg-fence does not speak TLS yet")));
    }
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
        config.user(env("PGUSER").or_else(|| env("USER")).unwrap_or_else(|| "postgres".into()));
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
        if let Some(secs) = env("PGCONNECT_TIMEOUT").and_then(|secs| secs.parse().ok()) {
            config.connect_timeout(Duration::from_secs(secs));
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
        eprintln!("pg-fence: password file {} has group or world access; ignored", file.display());
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
        assert_eq!(sockets.get_user(), Some("me"));
        assert_eq!(sockets.get_target_session_attrs(), TargetSessionAttrs::ReadWrite);
    }

    #[test]
    fn what_the_driver_cannot_do_is_refused() {
        for vars in
            [[("PGSERVICE", "prod")], [("PGSSLMODE", "require")], [("PGTARGETSESSIONATTRS", "standby")]]
        {
            assert_eq!(from(None, &vars).unwrap_err().code, Code::Usage, "{vars:?}");
        }
        assert!(from(None, &[("PGSSLMODE", "prefer")]).is_ok());
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
