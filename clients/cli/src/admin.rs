//! `leases`, `status`, `revoke`, `stats`: the server's views as tables for people and JSON lines for
//! scripts. The server writes the JSON (row_to_json), so both outputs show the same columns.
use crate::args::{ConnArgs, JsonArg, KeyArgs, LeasesArgs};
use crate::connect::Server;
use crate::exit::{Code, Exit};
use pg_fence_client::{Backoff, FenceClient, PgConnection};
use serde_json::{Map, Value};
use std::io::IsTerminal;
use std::sync::Arc;
use tokio_postgres::types::ToSql;

const LEASE_COLUMNS: &str =
    "key, owner, fence, live, acquired_at, expires_at, durable, shared, permits, session_pid";

async fn connect(conn: &ConnArgs, server: Server) -> Result<Arc<PgConnection>, Exit> {
    let backoff = Backoff { max_elapsed: Some(conn.retry_for), ..Backoff::default() };
    Ok(FenceClient::with_backoff(server, backoff).connection().await?)
}

/// The rows of `sql`, whose one column is a row's JSON text.
async fn objects(
    client: &PgConnection,
    sql: &str,
    params: &[&(dyn ToSql + Sync)],
) -> Result<Vec<Map<String, Value>>, Exit> {
    let rows = client.query(sql, params).await?;
    let parse = |text: &str| {
        serde_json::from_str::<Map<String, Value>>(text)
            .map_err(|err| Exit::new(Code::Failed, err.to_string()))
    };
    rows.iter().map(|row| parse(row.get(0))).collect()
}

fn print(rows: &[Map<String, Value>], json: bool) {
    if json {
        for row in rows {
            println!("{}", Value::Object(row.clone()));
        }
    } else {
        print!("{}", table(rows));
    }
}

pub async fn leases(args: LeasesArgs, conn: &ConnArgs, server: Server) -> Result<i32, Exit> {
    let client = connect(conn, server).await?;
    let pattern = like(args.pattern.as_deref().unwrap_or("*"));
    let sql = format!("SELECT row_to_json(l)::text FROM (SELECT {LEASE_COLUMNS} FROM fence.leases WHERE key LIKE $1 ORDER BY key, fence) l");
    let clear = args.watch && !args.json && std::io::stdout().is_terminal();
    loop {
        let rows = objects(&client, &sql, &[&pattern]).await?;
        if clear {
            print!("\x1b[H\x1b[2J");
        }
        print(&rows, args.json);
        if !args.watch {
            return Ok(0);
        }
        if !args.json && !clear {
            println!();
        }
        tokio::time::sleep(args.interval).await;
    }
}

pub async fn status(args: KeyArgs, conn: &ConnArgs, server: Server) -> Result<i32, Exit> {
    let client = connect(conn, server).await?;
    let sql = format!(
        "SELECT json_build_object('key', $1::text, 'held', coalesce(bool_or(l.live), false), \
         'current_fence', fence.current_fence($1), 'waiters', fence.waiters($1), \
         'leases', coalesce(json_agg(l ORDER BY l.fence) FILTER (WHERE l.key IS NOT NULL), '[]'))::text \
         FROM (SELECT {LEASE_COLUMNS} FROM fence.leases WHERE key = $1) l"
    );
    let found = objects(&client, &sql, &[&args.key]).await?.remove(0);
    let held = found["held"] == Value::Bool(true);
    if args.json {
        println!("{}", Value::Object(found));
    } else {
        let leases: Vec<Map<String, Value>> =
            found["leases"].as_array().into_iter().flatten().filter_map(|l| l.as_object().cloned()).collect();
        let mut summary = found;
        summary.remove("leases");
        print!("{}", fields(&summary));
        if !leases.is_empty() {
            print!("\n{}", table(&leases));
        }
    }
    Ok(if held { 0 } else { Code::NotHeld.code() })
}

pub async fn revoke(args: KeyArgs, conn: &ConnArgs, server: Server) -> Result<i32, Exit> {
    let client = connect(conn, server).await?;
    let revoked: bool = client.query_one("SELECT fence.lease_revoke($1)", &[&args.key]).await?.get(0);
    if args.json {
        println!("{}", serde_json::json!({ "key": args.key, "revoked": revoked }));
    } else if revoked {
        println!("revoked the live lease on {}", args.key);
    } else {
        println!("{} had no live lease", args.key);
    }
    Ok(if revoked { 0 } else { Code::NotHeld.code() })
}

pub async fn stats(args: JsonArg, conn: &ConnArgs, server: Server) -> Result<i32, Exit> {
    let client = connect(conn, server).await?;
    let rows = objects(&client, "SELECT row_to_json(s)::text FROM fence.stats s", &[]).await?;
    match args.json {
        true => print(&rows, true),
        false => rows.iter().for_each(|row| print!("{}", fields(row))),
    }
    Ok(0)
}

/// A shell pattern (`*`, `?`) as a LIKE pattern.
fn like(glob: &str) -> String {
    glob.chars()
        .map(|c| match c {
            '*' => "%".into(),
            '?' => "_".into(),
            '%' | '_' | '\\' => format!("\\{c}"),
            c => c.to_string(),
        })
        .collect()
}

fn text(value: &Value) -> String {
    match value {
        Value::Null => String::new(),
        Value::String(text) => text.clone(),
        other => other.to_string(),
    }
}

/// Rows as an aligned table under their column names; "(none)" for no rows.
fn table(rows: &[Map<String, Value>]) -> String {
    let Some(first) = rows.first() else { return "(none)\n".into() };
    let header: Vec<String> = first.keys().cloned().collect();
    let cells: Vec<Vec<String>> = rows.iter().map(|row| row.values().map(text).collect()).collect();
    let widths: Vec<usize> = (0..header.len())
        .map(|i| cells.iter().map(|r| r[i].len()).chain([header[i].len()]).max().unwrap())
        .collect();
    let line = |cells: &[String]| {
        let padded: Vec<String> =
            cells.iter().zip(&widths).map(|(cell, width)| format!("{cell:width$}")).collect();
        format!("{}\n", padded.join("  ").trim_end())
    };
    std::iter::once(line(&header)).chain(cells.iter().map(|row| line(row))).collect()
}

/// One object as "name  value" lines.
fn fields(row: &Map<String, Value>) -> String {
    let width = row.keys().map(String::len).max().unwrap_or(0);
    row.iter().map(|(name, value)| format!("{name:width$}  {}\n", text(value))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shell_patterns_become_like_patterns() {
        assert_eq!(like("job:*"), "job:%");
        assert_eq!(like("a?_%\\"), "a_\\_\\%\\\\");
    }

    #[test]
    fn tables_align_their_columns() {
        let rows: Vec<Map<String, Value>> = serde_json::from_str(
            r#"[{"key":"a","fence":12,"owner":null},{"key":"long-key","fence":3,"owner":"w"}]"#,
        )
        .unwrap();
        assert_eq!(table(&rows), "key       fence  owner\na         12\nlong-key  3      w\n");
        assert_eq!(table(&[]), "(none)\n");
    }
}
