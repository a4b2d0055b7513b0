//! pg-fence: run a command under a pg_fence lease, elect a leader, observe it, and list, inspect
//! and revoke leases, from the shell.
mod admin;
mod args;
mod child;
mod connect;
mod elect;
mod exit;
mod observe;
mod run;

use args::{Cli, Command};
use clap::{CommandFactory, Parser};
use exit::{Code, Exit};

fn main() {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(err) => {
            let usage = err.use_stderr();
            err.print().ok();
            std::process::exit(if usage { Code::Usage.code() } else { 0 });
        }
    };
    let code = match dispatch(cli) {
        Ok(code) => code,
        Err(exit) => {
            crate::sayln!("pg-fence: {exit}");
            exit.code.code()
        }
    };
    std::process::exit(code);
}

fn dispatch(cli: Cli) -> Result<i32, Exit> {
    if !matches!(cli.command, Command::Run(_) | Command::Elect(_)) {
        // What only prints ends, as other tools do, when its reader has gone (`| head`), instead
        // of panicking. Not run and elect: they must outlive their output to stop their command.
        // SAFETY: sets this process's disposition of SIGPIPE, before any thread is started.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    }
    let mut stdout = std::io::stdout();
    match cli.command {
        Command::Completions { shell } => {
            clap_complete::generate(shell, &mut Cli::command(), "pg-fence", &mut stdout);
            return Ok(0);
        }
        Command::Man { dir } => {
            // Without the help subcommand, as generate_to leaves it out: its page is not written,
            // so the top page must not name it.
            let command = Cli::command().disable_help_subcommand(true);
            let written = match dir {
                Some(dir) => clap_mangen::generate_to(command, &dir)
                    .map_err(|err| format!("cannot write the man pages to {}: {err}", dir.display())),
                None => clap_mangen::Man::new(command).render(&mut stdout).map_err(|err| err.to_string()),
            };
            written.map_err(|err| Exit::new(Code::Failed, err))?;
            return Ok(0);
        }
        _ => {}
    }
    args::check(&cli.command).map_err(|message| Exit::new(Code::Usage, message))?;
    let server = connect::server(cli.conn.dsn.as_deref(), &|name| std::env::var(name).ok())?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a Tokio runtime");
    let conn = &cli.conn;
    runtime.block_on(async move {
        match cli.command {
            Command::Run(args) => run::run(args, conn, server).await,
            Command::Elect(args) => elect::elect(args, conn, server).await,
            Command::Observe(args) => observe::observe(args, conn, server).await,
            Command::Leases(args) => admin::leases(args, conn, server).await,
            Command::Status(args) => admin::status(args, conn, server).await,
            Command::Revoke(args) => admin::revoke(args, conn, server).await,
            Command::Stats(args) => admin::stats(args, conn, server).await,
            Command::Completions { .. } | Command::Man { .. } => unreachable!("answered above"),
        }
    })
}
