//! Tokens and the server log. With statement logging on (log_min_duration_statement = 0, common on
//! staging, or log_statement = 'all') PostgreSQL logs each statement's bind parameters, tokens
//! included, where anyone who reads the log can use them. docs/operations.md's remedy (Security), shown to work here:
//! `ALTER ROLE <the roles that hold leases> SET log_parameter_max_length = 0`.
use pg_fence_integration::Cluster;
use uuid::Uuid;

#[test]
fn statement_logging_shows_tokens_unless_parameters_are_kept_out() {
    let cluster = Cluster::start("server_log", 26931, &["log_min_duration_statement=0"]);
    cluster.connect().batch_execute("CREATE ROLE app LOGIN; GRANT fence_user TO app").unwrap();
    let log = || std::fs::read_to_string(cluster.log_path()).unwrap();

    let renew = |key: &str| {
        let mut app = cluster.connect_as("app");
        let token: Uuid =
            app.query_one("SELECT (fence.lease_acquire($1, '1 minute')).token", &[&key]).unwrap().get(0);
        app.query_one("SELECT fence.lease_renew($1, $2, '1 minute')", &[&key, &token]).unwrap();
        token.to_string()
    };

    let token = renew("logged");
    assert!(log().contains(&token), "the log did not show the bind parameter: the remedy tests nothing");

    cluster.connect().batch_execute("ALTER ROLE app SET log_parameter_max_length = 0").unwrap();
    let token = renew("kept-out");
    let log = log();
    assert!(log.contains("fence.lease_renew"), "the statement itself is still logged");
    assert!(!log.contains(&token), "a token reached the log despite log_parameter_max_length = 0");
}
