//! `leases`, `status`, `revoke`, `stats`: the server's views as tables for people and JSON lines for
//! scripts. The server writes the JSON (row_to_json), so both outputs show the same columns.
use crate::args::{ConnArgs, JsonArg, KeyArgs, LeasesArgs};
use crate::connect::Server;
use crate::exit::{Code, Exit};
use pg_fence_client::{Backoff, Connector, Error, PgConnection};
use serde_json::{Map, Value};
use std::io::IsTerminal;
use tokio::time::Instant;
use tokio_postgres::types::ToSql;
use tokio_postgres::Row;
use unicode_width::UnicodeWidthStr;

const LEASE_COLUMNS: &str =
    "key, owner, fence, live, acquired_at, expires_at, durable, shared, permits, session_pid";

/// The server's statements, each bounded by its answer limit and retried on a new connection while
/// the server cannot be reached, until --retry-for has passed since the first failure.
struct Asker {
    server: Server,
    retry: Backoff,
    conn: Option<PgConnection>,
}

impl Asker {
    fn new(conn: &ConnArgs, server: Server) -> Asker {
        Asker {
            server,
            retry: Backoff { max_elapsed: Some(conn.retry_for), ..Backoff::default() },
            conn: None,
        }
    }

    /// The rows of `sql`. With `resend` false, a statement whose connection broke (or went
    /// unanswered) after it was sent is not sent again: it may have taken effect, and a second
    /// answer would not tell of the first.
    async fn rows(
        &mut self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
        resend: bool,
    ) -> Result<Vec<Row>, Exit> {
        let (mut failed_at, mut tries) = (None, 0);
        loop {
            let (error, sent) = match self.try_rows(sql, params).await {
                Ok(rows) => return Ok(rows),
                Err(failed) => failed,
            };
            self.conn = None;
            tries += 1;
            let started = *failed_at.get_or_insert_with(Instant::now);
            let retry = error.code == Code::Unreachable && (resend || !sent);
            match self.retry.next(tries, started.into_std()).filter(|_| retry) {
                Some(delay) => tokio::time::sleep(delay).await,
                None => return Err(error),
            }
        }
    }

    /// One try: its rows, or why not and whether the statement was sent. A statement the server
    /// refused is final (its code other than Unreachable), unless the server ended the session.
    async fn try_rows(
        &mut self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, (Exit, bool)> {
        if self.conn.as_ref().is_none_or(|conn| conn.is_closed()) {
            let conn = self.server.connect().await.map_err(|err| (Exit::from(Error::Connect(err)), false))?;
            self.conn = Some(conn);
        }
        let conn = self.conn.as_ref().expect("connected above");
        let answered = match self.server.answer_limit() {
            Some(limit) => tokio::time::timeout(limit, conn.query(sql, params)).await,
            None => Ok(conn.query(sql, params).await),
        };
        match answered {
            Ok(Ok(rows)) => Ok(rows),
            Ok(Err(err)) => {
                let ended = err
                    .code()
                    .map(|code| code.code())
                    .is_none_or(|code| code.starts_with("08") || code.starts_with("57P0") || code == "53300");
                let exit = Exit::from(err);
                match ended {
                    true => Err((Exit::new(Code::Unreachable, exit.message), true)),
                    false => Err((exit, true)),
                }
            }
            Err(_) => {
                let limit = self.server.answer_limit().unwrap_or_default();
                Err((
                    Exit::new(
                        Code::Unreachable,
                        format!("no answer from the server {} within {limit:?}", self.server.named()),
                    ),
                    true,
                ))
            }
        }
    }
}

/// The rows of `sql`, whose one column is a row's JSON text.
async fn objects(
    asker: &mut Asker,
    sql: &str,
    params: &[&(dyn ToSql + Sync)],
) -> Result<Vec<Map<String, Value>>, Exit> {
    let rows = asker.rows(sql, params, true).await?;
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
    let mut asker = Asker::new(conn, server);
    let pattern = like(args.pattern.as_deref().unwrap_or("*"));
    let sql = format!("SELECT row_to_json(l)::text FROM (SELECT {LEASE_COLUMNS} FROM fence.leases WHERE key LIKE $1 ORDER BY key, fence) l");
    let clear = args.watch && !args.json && std::io::stdout().is_terminal();
    loop {
        let rows = objects(&mut asker, &sql, &[&pattern]).await?;
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
    let mut asker = Asker::new(conn, server);
    let sql = format!(
        "SELECT json_build_object('key', $1::text, 'held', coalesce(bool_or(l.live), false), \
         'current_fence', fence.current_fence($1), 'waiters', fence.waiters($1), \
         'leases', coalesce(json_agg(l ORDER BY l.fence) FILTER (WHERE l.key IS NOT NULL), '[]'))::text \
         FROM (SELECT {LEASE_COLUMNS} FROM fence.leases WHERE key = $1) l"
    );
    let found = objects(&mut asker, &sql, &[&args.key]).await?.remove(0);
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
    let mut asker = Asker::new(conn, server);
    let revoked: bool = asker.rows("SELECT fence.lease_revoke($1)", &[&args.key], false).await?[0].get(0);
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
    let mut asker = Asker::new(conn, server);
    let rows = objects(&mut asker, "SELECT row_to_json(s)::text FROM fence.stats s", &[]).await?;
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

/// The widest a table's cell is shown, in terminal columns: a longer key is cut, with `…`, so that
/// the columns after it stay on the line (`--json` has it whole).
const CELL_COLUMNS: usize = 48;

/// A value as one table cell: what would move the cursor (tab, newline, other control characters)
/// written as an escape, `\` doubled so that the escapes can be told from the text, cut to
/// CELL_COLUMNS; with its width in terminal columns (a wide character takes two).
fn cell(value: &Value) -> (String, usize) {
    let mut shown = String::new();
    let mut width = 0;
    for c in text(value).chars() {
        let escaped = match c {
            '\t' => "\\t".into(),
            '\n' => "\\n".into(),
            '\r' => "\\r".into(),
            '\\' => "\\\\".into(),
            c if c.is_control() => c.escape_unicode().to_string(),
            c => c.to_string(),
        };
        let columns = UnicodeWidthStr::width(escaped.as_str());
        if width + columns > CELL_COLUMNS - 1 {
            shown.push('…');
            width += 1;
            break;
        }
        shown.push_str(&escaped);
        width += columns;
    }
    (shown, width)
}

/// Rows as an aligned table under their column names; "(none)" for no rows.
fn table(rows: &[Map<String, Value>]) -> String {
    let Some(first) = rows.first() else { return "(none)\n".into() };
    let header: Vec<(String, usize)> = first.keys().map(|name| (name.clone(), name.len())).collect();
    let cells: Vec<Vec<(String, usize)>> = rows.iter().map(|row| row.values().map(cell).collect()).collect();
    let widths: Vec<usize> =
        (0..header.len()).map(|i| cells.iter().map(|r| r[i].1).chain([header[i].1]).max().unwrap()).collect();
    let line = |cells: &[(String, usize)]| {
        let padded: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|((cell, shown), width)| format!("{cell}{}", " ".repeat(width - shown)))
            .collect();
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

    #[test]
    fn odd_keys_keep_the_table_a_table() {
        let long = "k".repeat(100);
        let rows: Vec<Map<String, Value>> = serde_json::from_value(serde_json::json!([
            {"key": "tab\there", "fence": 1},
            {"key": "two\nlines\\n", "fence": 2},
            {"key": "日本語", "fence": 3},
            {"key": long, "fence": 4},
            {"key": "bell\u{7}", "fence": 5},
        ]))
        .unwrap();
        let shown = table(&rows);
        let lines: Vec<&str> = shown.lines().collect();
        assert_eq!(lines.len(), 6, "a line a row: {shown}");
        assert_eq!(lines[1], format!("tab\\there{}1", " ".repeat(48 - 9 + 2)));
        assert_eq!(lines[2], format!("two\\nlines\\\\n{}2", " ".repeat(48 - 13 + 2)));
        // Three wide characters take six columns: the fence is in the same column as the others'.
        assert_eq!(lines[3], format!("日本語{}3", " ".repeat(48 - 6 + 2)));
        assert_eq!(lines[4], format!("{}…  4", "k".repeat(47)));
        assert_eq!(lines[5], format!("bell\\u{{7}}{}5", " ".repeat(48 - 9 + 2)));
    }
}
