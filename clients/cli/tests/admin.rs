//! `leases`, `status`, `stats`: tables for people, JSON for scripts, from a real cluster.
mod common;
use common::Setup;

#[test]
fn leases_status_and_stats_as_tables_and_json() {
    let setup = Setup::new("cli_admin", 27930);
    let mut holder = setup.hold_until("holder", &["--owner", "w1", "job:1"], "started", "go");
    let (code, stdout, _) = setup.run("leases", &["leases", "job:*"]);
    assert_eq!(code, 0);
    let mut lines = stdout.lines();
    assert!(lines.next().unwrap().starts_with("key    owner  fence"), "{stdout}");
    assert!(lines.next().unwrap().starts_with("job:1  w1 "), "{stdout}");
    let (_, json, _) = setup.run("leases_json", &["leases", "--json"]);
    let row: serde_json::Value = serde_json::from_str(json.trim()).unwrap();
    assert_eq!(
        (row["key"].as_str(), row["owner"].as_str(), row["live"].as_bool()),
        (Some("job:1"), Some("w1"), Some(true))
    );
    assert_eq!(setup.run("none", &["leases", "other*"]).1, "(none)\n");

    let (code, stdout, _) = setup.run("status", &["status", "job:1"]);
    assert_eq!(code, 0, "held");
    assert!(stdout.starts_with("key            job:1\nheld           true\n"), "{stdout}");
    let (_, json, _) = setup.run("status_json", &["status", "job:1", "--json"]);
    let status: serde_json::Value = serde_json::from_str(json.trim()).unwrap();
    assert_eq!(status["leases"][0]["fence"], status["current_fence"]);
    assert_eq!(setup.run("free", &["status", "job:2"]).0, 1, "not held");

    setup.touch("go");
    assert_eq!(holder.exit_code(), 0);
    let (code, stdout, _) = setup.run("stats", &["stats", "--json"]);
    assert_eq!(code, 0);
    let stats: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    assert!(stats.get("grants_durable").is_some(), "{stdout}");
    assert!(setup.run("stats_table", &["stats"]).1.starts_with("available"));
    for shell in ["bash", "zsh", "fish"] {
        let (code, script, _) = setup.run(&format!("completions_{shell}"), &["completions", shell]);
        assert!(code == 0 && script.contains("pg-fence"), "{shell}");
    }
    let (_, man, _) = setup.run("man", &["man"]);
    assert!(man.contains(".TH pg-fence"), "{man}");
}

#[test]
fn leases_watch_prints_each_change() {
    let setup = Setup::new("cli_watch", 27931);
    let mut watch = setup.spawn("watch", &["leases", "--watch", "--interval", "100ms", "job*"]);
    assert!(common::eventually(common::LIMIT, || watch.stdout().starts_with("(none)\n")));
    let mut holder = setup.hold_until("holder", &["--owner", "w1", "job:1"], "started", "go");
    // Each listing is a table after a blank line; the lease's row in one of them with live true,
    // and in a later one, once released, with live false.
    let live_in = |live: &str| {
        let listings: Vec<String> = watch.stdout().split("\n\n").map(str::to_owned).collect();
        listings.iter().position(|listing| {
            listing
                .lines()
                .any(|line| line.starts_with("job:1  w1 ") && line.split_whitespace().nth(3) == Some(live))
        })
    };
    assert!(common::eventually(common::LIMIT, || live_in("true").is_some()), "{}", watch.stdout());
    setup.touch("go");
    assert_eq!(holder.exit_code(), 0);
    assert!(common::eventually(common::LIMIT, || live_in("false") > live_in("true")), "{}", watch.stdout());
    assert!(watch.running(), "it watches until interrupted");
}

#[test]
fn odd_keys_are_escaped_in_the_table_and_exact_in_json() {
    let setup = Setup::new("cli_odd_keys", 27943);
    let key = "job\tone\nline two 日本";
    let mut holder = setup.hold_until("holder", &[key], "started", "go");
    let (code, stdout, _) = setup.run("leases", &["leases"]);
    assert_eq!(code, 0);
    assert_eq!(stdout.lines().count(), 2, "a header and a row: {stdout}");
    assert!(stdout.lines().nth(1).unwrap().starts_with("job\\tone\\nline two 日本  "), "{stdout}");
    let (_, json, _) = setup.run("leases_json", &["leases", "--json"]);
    let row: serde_json::Value = serde_json::from_str(json.trim()).unwrap();
    assert_eq!(row["key"].as_str(), Some(key), "exact in JSON");
    setup.touch("go");
    assert_eq!(holder.exit_code(), 0);
}
