//! TLS where the server asks for it: a scratch cluster that accepts TCP connections over TLS alone,
//! with a self-signed certificate, reached with each sslmode, from the environment, the DSN and a
//! service file.
mod common;
use common::Setup;
use std::path::Path;
use std::process::Command;

/// A self-signed certificate for the name `host` (and no IP address), its key beside it.
fn certificate(dir: &Path, name: &str, host: &str) {
    let status = Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-days",
            "2",
        ])
        .args(["-subj", &format!("/CN={host}"), "-addext", &format!("subjectAltName=DNS:{host}")])
        .arg("-keyout")
        .arg(dir.join(format!("{name}.key")))
        .arg("-out")
        .arg(dir.join(format!("{name}.crt")))
        .stderr(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(status.success(), "openssl req");
}

#[test]
fn each_sslmode_against_a_server_that_accepts_tls_alone() {
    let setup = Setup::new("cli_tls", 27942);
    let data = setup.cluster.log_path().parent().unwrap().to_owned();
    certificate(&data, "server", "pg-fence-test");
    certificate(setup.dir.path(), "other", "pg-fence-test");
    // The key must belong to the server's user, readable by it alone.
    let status = Command::new("chown").args(["postgres"]).arg(data.join("server.key")).status().unwrap();
    assert!(status.success());
    std::fs::copy(data.join("server.crt"), setup.path("root.crt")).unwrap();
    let hba = "local all all trust\nhostssl all all 127.0.0.1/32 trust\n";
    std::fs::write(data.join("pg_hba.conf"), hba).unwrap();
    // One statement at a time: ALTER SYSTEM refuses to run in the transaction a batch makes.
    let settings = ["ssl = on", "ssl_cert_file = 'server.crt'", "ssl_key_file = 'server.key'"];
    for setting in settings {
        setup.execute(&format!("ALTER SYSTEM SET {setting}"));
    }
    setup.execute("SELECT pg_reload_conf()");
    assert!(
        common::eventually(common::LIMIT, || setup.run("probe", &["--retry-for", "1s", "stats"]).0 == 0),
        "the server speaks TLS: {}",
        setup.read("probe.err")
    );

    let root = setup.path("root.crt");
    let other = setup.dir.path().join("other.crt");
    let (root, other) = (root.to_str().unwrap(), other.to_str().unwrap());
    let run = |env: &[(&str, &str)], dsn: Option<&str>| {
        let mut args = vec!["--retry-for", "300ms"];
        if let Some(dsn) = dsn {
            args.extend(["--dsn", dsn]);
        }
        args.extend(["run", "--no-wait", "job", "--", "true"]);
        let mut cmd = setup.pg_fence(&args);
        cmd.envs(env.iter().copied()).env("HOME", setup.dir.path());
        let output = cmd.output().unwrap();
        (output.status.code().unwrap_or(-1), String::from_utf8_lossy(&output.stderr).into_owned())
    };
    // Without sslmode (prefer), and with require: TLS, the certificate unchecked.
    assert_eq!(run(&[], None), (0, String::new()));
    assert_eq!(run(&[("PGSSLMODE", "require")], None), (0, String::new()));
    let (code, stderr) = run(&[("PGSSLMODE", "disable")], None);
    assert!(code != 0 && stderr.contains("no encryption"), "refused without TLS: {code} {stderr}");
    // verify-ca checks the chain, verify-full the name too: the certificate names pg-fence-test,
    // not 127.0.0.1.
    assert_eq!(run(&[("PGSSLMODE", "verify-ca"), ("PGSSLROOTCERT", root)], None), (0, String::new()));
    let (code, stderr) = run(&[("PGSSLMODE", "verify-full"), ("PGSSLROOTCERT", root)], None);
    assert!(code != 0 && stderr.contains("certificate verify failed"), "the name: {code} {stderr}");
    let (code, stderr) = run(&[("PGSSLMODE", "verify-ca"), ("PGSSLROOTCERT", other)], None);
    assert!(code != 0 && stderr.contains("certificate verify failed"), "another root: {code} {stderr}");
    // As libpq: require with a root certificate checks the chain.
    let (code, _) = run(&[("PGSSLMODE", "require"), ("PGSSLROOTCERT", other)], None);
    assert_ne!(code, 0, "require with a root certificate that does not match");
    let (code, stderr) = run(&[("PGSSLMODE", "verify-full")], None);
    assert_eq!(code, 64, "verify-full without a root certificate: {stderr}");
    // The DSN's sslmode and sslrootcert, keyword and URI forms, over the environment's.
    let port = setup.cluster.port();
    let keywords = format!("host=127.0.0.1 port={port} sslmode=verify-ca sslrootcert={root}");
    assert_eq!(run(&[("PGSSLMODE", "disable")], Some(&keywords)), (0, String::new()));
    let uri =
        format!("postgresql://postgres@127.0.0.1:{port}/postgres?sslmode=verify-full&sslrootcert={root}");
    let (code, stderr) = run(&[], Some(&uri));
    assert!(code != 0 && stderr.contains("certificate verify failed"), "{code} {stderr}");
    // A service file's, over the environment's (whose port is wrong).
    let services = setup.path("services");
    std::fs::write(
        &services,
        format!("[tls]\nhost=127.0.0.1\nport={port}\nsslmode=verify-ca\nsslrootcert={root}\n"),
    )
    .unwrap();
    let service = [("PGSERVICEFILE", services.to_str().unwrap()), ("PGSERVICE", "tls"), ("PGPORT", "27949")];
    assert_eq!(run(&service, None), (0, String::new()));
}
