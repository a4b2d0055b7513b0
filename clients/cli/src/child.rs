//! The command pg-fence runs under a lease: started in a process group of its own, so that a lost
//! lease stops all of it (a shell and what it started), given the signals pg-fence is sent, and
//! stopped with SIGTERM, then SIGKILL, when the lease it runs under is lost.
use crate::exit::{Code, Exit};
use std::future::Future;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::time::Duration;
use tokio::signal::unix::{signal, SignalKind};

/// How a supervised command ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Ended {
    /// On its own: its exit status, 128 + N when signal N ended it (as a shell says).
    Exited(i32),
    /// Stopped because its lease was lost.
    Stopped,
}

pub struct Child {
    child: tokio::process::Child,
    group: libc::pid_t,
    forwarded: Forwarded,
    terminal: Terminal,
}

/// The terminal, given to the command's group when pg-fence had it in the foreground: a group of
/// its own is otherwise a background job, stopped (SIGTTIN) at its first read of the terminal (a
/// prompt) while its lease is renewed for ever. Taken back when dropped, once the group has ended.
struct Terminal(Option<libc::c_int>);

impl Terminal {
    /// The first of stdin, stdout and stderr that is a terminal with pg-fence's group in front.
    fn foreground() -> Terminal {
        // SAFETY: isatty, tcgetpgrp and getpgrp only read.
        Terminal(
            (0..3).find(|&fd| unsafe { libc::isatty(fd) == 1 && libc::tcgetpgrp(fd) == libc::getpgrp() }),
        )
    }

    /// In the command, between fork and exec (async-signal-safe calls only): its group in front.
    /// From the background that raises SIGTTOU, blocked meanwhile.
    fn take(fd: libc::c_int) {
        // SAFETY: a local signal set, and the calling process's own mask and terminal.
        unsafe {
            let (mut set, mut old) = (std::mem::zeroed(), std::mem::zeroed());
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, libc::SIGTTOU);
            libc::sigprocmask(libc::SIG_BLOCK, &set, &mut old);
            libc::tcsetpgrp(fd, libc::getpgrp());
            libc::sigprocmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
        }
    }

    /// In pg-fence, once the command runs: the same from this side (whichever comes first), and
    /// SIGTTOU ignored from now on, so that pg-fence, in the background, still writes its messages
    /// under `stty tostop` and takes the terminal back.
    fn give(&self, group: libc::pid_t) {
        if let Some(fd) = self.0 {
            // SAFETY: this process's disposition of SIGTTOU, and its terminal's foreground group.
            unsafe {
                libc::signal(libc::SIGTTOU, libc::SIG_IGN);
                libc::tcsetpgrp(fd, group);
            }
        }
    }
}

impl Drop for Terminal {
    fn drop(&mut self) {
        if let Some(fd) = self.0 {
            // SAFETY: as in `give`.
            unsafe {
                libc::signal(libc::SIGTTOU, libc::SIG_IGN);
                libc::tcsetpgrp(fd, libc::getpgrp());
            }
        }
    }
}

/// Starts `command` with `env` added to pg-fence's own environment, the signals `forwarded`
/// catches going to it. 127 when it cannot be found, 126 when it cannot be run, as a shell says.
pub fn spawn(command: &[String], env: &[(&str, String)], forwarded: Forwarded) -> Result<Child, Exit> {
    // The group's processes whose parent ends come to pg-fence rather than to init, which may
    // never reap them (a container's): the group then ends when its last process does.
    // SAFETY: prctl only sets a flag of this process.
    #[cfg(target_os = "linux")]
    unsafe {
        libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1)
    };
    let mut cmd = std::process::Command::new(&command[0]);
    cmd.args(&command[1..]).envs(env.iter().map(|(name, value)| (name, value))).process_group(0);
    // SAFETY: getpid only reads.
    let parent = unsafe { libc::getpid() };
    // SAFETY: between fork and exec, async-signal-safe calls only (prctl, getppid, kill).
    unsafe {
        cmd.pre_exec(move || {
            // pg-fence killed (SIGKILL, the OOM killer) renews the lease no more: the command is
            // told at once, not left to run past its expiry. Unless pg-fence died before this.
            // (It comes when the thread that forked ends: the main thread, which runs `block_on`.)
            #[cfg(target_os = "linux")]
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
            if libc::getppid() != parent {
                libc::kill(libc::getpid(), libc::SIGTERM);
            }
            Ok(())
        })
    };
    let terminal = Terminal::foreground();
    if let Some(fd) = terminal.0 {
        // SAFETY: `Terminal::take` makes only async-signal-safe calls.
        unsafe {
            cmd.pre_exec(move || {
                Terminal::take(fd);
                Ok(())
            })
        };
    }
    let child = tokio::process::Command::from(cmd).spawn().map_err(|err| {
        let code = if err.kind() == std::io::ErrorKind::NotFound { 127 } else { 126 };
        Exit::new(Code::Command(code), format!("cannot run {}: {err}", command[0]))
    })?;
    let group = child.id().expect("a child just spawned has its pid") as libc::pid_t;
    terminal.give(group);
    Ok(Child { child, group, forwarded, terminal })
}

/// Sends `signal` to the process group `group`.
fn signal_group(group: libc::pid_t, signal: libc::c_int) {
    // SAFETY: killpg only sends a signal; a group that is gone returns ESRCH, which is harmless.
    unsafe { libc::killpg(group, signal) };
}

/// How often a group whose leader has ended is looked at: it cannot be waited for.
const GROUP_POLL: Duration = Duration::from_millis(50);

/// How often orphans that came to pg-fence (see `spawn`) are reaped while the command runs.
const REAP_EVERY: Duration = Duration::from_secs(1);

/// Reaps pg-fence's children that have ended but `leader`, whose status is the runtime's to take:
/// orphans of the command, which would otherwise pile up as zombies as long as it runs.
fn reap_orphans(leader: libc::pid_t) {
    loop {
        // SAFETY: a local siginfo; WNOWAIT only looks, so the leader's status is left in place.
        let ended = unsafe {
            let mut info: libc::siginfo_t = std::mem::zeroed();
            let looked =
                libc::waitid(libc::P_ALL, 0, &mut info, libc::WEXITED | libc::WNOHANG | libc::WNOWAIT);
            if looked == 0 {
                info.si_pid()
            } else {
                0
            }
        };
        if ended == 0 || ended == leader {
            return;
        }
        // SAFETY: reaps the one ended child just looked at, which is not the leader.
        unsafe { libc::waitpid(ended, std::ptr::null_mut(), libc::WNOHANG) };
    }
}

/// Whether no process is left in the process group `group`, once its leader has been reaped.
fn group_gone(group: libc::pid_t) -> bool {
    // Those whose parent ended are pg-fence's children (see `spawn`): reaped here, as a zombie
    // counts as a member until it is.
    // SAFETY: waitpid on the group only reaps pg-fence's own children in it, the leader being
    // reaped already.
    while unsafe { libc::waitpid(-group, std::ptr::null_mut(), libc::WNOHANG) } > 0 {}
    // SAFETY: signal 0 sends nothing; it only asks whether the group has a process left.
    let asked = unsafe { libc::killpg(group, 0) };
    asked != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
}

async fn exit_code(child: &mut tokio::process::Child) -> i32 {
    match child.wait().await {
        Ok(status) => status.code().unwrap_or_else(|| 128 + status.signal().unwrap_or(0)),
        Err(_) => 1,
    }
}

impl Child {
    /// Waits for the command to end, forwarding SIGINT, SIGTERM and SIGHUP to its group. When `lost`
    /// completes first (with why, for stderr), sends SIGTERM to the group and SIGKILL `kill_after`
    /// later if it is still running, and returns once it has ended.
    pub async fn supervise(self, lost: impl Future<Output = String>, kill_after: Duration) -> Ended {
        let Child { mut child, group, mut forwarded, terminal: _back } = self;
        tokio::pin!(lost);
        // What the command left running in its group (a job it put in the background) is part of
        // it: the lease is kept, and the loss handled, until the group has ended too.
        let mut ended = None;
        let why = loop {
            tokio::select! {
                code = exit_code(&mut child), if ended.is_none() => ended = Some(code),
                _ = tokio::time::sleep(REAP_EVERY), if ended.is_none() => reap_orphans(group),
                _ = tokio::time::sleep(GROUP_POLL), if ended.is_some() => {}
                signal = forwarded.next() => signal_group(group, signal),
                why = &mut lost => break why,
            }
            if let Some(code) = ended.filter(|_| group_gone(group)) {
                return Ended::Exited(code);
            }
        };
        crate::sayln!("pg-fence: {why}: sending SIGTERM to the command");
        signal_group(group, libc::SIGTERM);
        let killed = tokio::time::sleep(kill_after);
        tokio::pin!(killed);
        // The command's end is not its group's: what it started and that ignores SIGTERM would run
        // on without the lease, so the group is waited for, and killed at the deadline.
        let mut leader_ended = false;
        loop {
            tokio::select! {
                _ = exit_code(&mut child), if !leader_ended => leader_ended = true,
                _ = tokio::time::sleep(GROUP_POLL), if leader_ended => {}
                signal = forwarded.next() => signal_group(group, signal),
                _ = &mut killed => break,
            }
            if leader_ended && group_gone(group) {
                return Ended::Stopped;
            }
        }
        crate::sayln!("pg-fence: the command still ran {:?} after SIGTERM: sending SIGKILL", kill_after);
        signal_group(group, libc::SIGKILL);
        exit_code(&mut child).await;
        Ended::Stopped
    }
}

/// The signals pg-fence passes on to the command. Caught from before the key is asked for: by
/// default they would end pg-fence in the middle of a wait the server goes on with, or between the
/// grant and the command's start, leaving a lease nobody uses until its TTL.
pub struct Forwarded {
    streams: Vec<(libc::c_int, tokio::signal::unix::Signal)>,
}

impl Forwarded {
    pub fn new() -> Forwarded {
        let kinds = [
            (libc::SIGINT, SignalKind::interrupt()),
            (libc::SIGTERM, SignalKind::terminate()),
            (libc::SIGHUP, SignalKind::hangup()),
        ];
        let streams = kinds
            .into_iter()
            .map(|(number, kind)| (number, signal(kind).expect("a signal handler")))
            .collect();
        Forwarded { streams }
    }

    pub async fn next(&mut self) -> libc::c_int {
        let (first, rest) = self.streams.split_at_mut(1);
        let (second, third) = rest.split_at_mut(1);
        tokio::select! {
            _ = first[0].1.recv() => first[0].0,
            _ = second[0].1.recv() => second[0].0,
            _ = third[0].1.recv() => third[0].0,
        }
    }

    /// A signal already caught, without waiting for one.
    pub async fn caught(&mut self) -> Option<libc::c_int> {
        tokio::select! {
            biased;
            signal = self.next() => Some(signal),
            _ = std::future::ready(()) => None,
        }
    }
}
