//! Where pg_fence can be installed: only in UTF8 databases, whose text its Rust code reads as
//! UTF-8. In any other encoding (LATIN1, or SQL_ASCII, which does not even check its bytes) a
//! non-ASCII key would fail with an internal error (XX000), so CREATE EXTENSION refuses such a
//! database up front, with the reason.
use pg_fence_integration::{acquire, sqlstate, Cluster};

#[test]
fn create_extension_refuses_a_database_that_is_not_utf8() {
    let cluster = Cluster::start_without_extension("encoding", 26921, &[]);
    let mut admin = cluster.connect();
    for encoding in ["LATIN1", "SQL_ASCII"] {
        let db = format!("in_{}", encoding.to_lowercase());
        admin
            .batch_execute(&format!(
                "CREATE DATABASE {db} ENCODING '{encoding}' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0"
            ))
            .unwrap();
        let mut client = cluster.connect_to(&db);
        let err = client.batch_execute("CREATE EXTENSION pg_fence").unwrap_err();
        assert_eq!(sqlstate(&err), "0A000", "{encoding}: {err}");
        let message = err.as_db_error().unwrap().message().to_string();
        assert!(message.contains("UTF8") && message.contains(encoding), "{message}");
        let installed: i64 = client
            .query_one("SELECT count(*) FROM pg_extension WHERE extname = 'pg_fence'", &[])
            .unwrap()
            .get(0);
        assert_eq!(installed, 0);
    }
    // A UTF8 database takes it, and non-ASCII keys are plain keys, compared byte for byte.
    let mut client = cluster.connect();
    client.batch_execute("CREATE EXTENSION pg_fence").unwrap();
    let keys = ["café", "cafe\u{301}", "Café", "ключ:1"];
    for key in keys {
        let fence = acquire(&mut client, key, "1 minute")
            .unwrap_or_else(|| panic!("{key} was taken as another key"))
            .fence;
        let current: Option<i64> =
            client.query_one("SELECT fence.current_fence($1)", &[&key]).unwrap().get(0);
        assert_eq!(current, Some(fence), "{key}");
    }
    let rows: i64 = client.query_one("SELECT count(DISTINCT key) FROM fence.leases", &[]).unwrap().get(0);
    assert_eq!(rows, keys.len() as i64, "keys were stored as one another");
}
