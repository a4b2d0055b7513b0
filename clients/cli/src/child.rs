//! The command pg-fence runs under a lease: started in a process group of its own, so that a lost
//! lease stops all of it (a shell and what it started), given the signals pg-fence is sent, and
//! stopped with SIGTERM, then SIGKILL, when the lease it runs under is lost.
use crate::exit::{Code, Exit};
use pg_fence_client::HeldLease;
use std::future::Future;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};
use std::time::{Duration, Instant};
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
    kill_after: Duration,
    watchdog: Option<Watchdog>,
    /// SIGCHLD, on a terminal: the command's stops, which there are the user's Ctrl-Z.
    children: Option<tokio::signal::unix::Signal>,
}

/// Why the lease was lost, for stderr, and how long the command is given after SIGTERM.
pub struct Loss {
    pub why: String,
    pub kill_after: Duration,
}

/// The terminal, given to the command's group when pg-fence had it in the foreground: a group of
/// its own is otherwise a background job, stopped (SIGTTIN) at its first read of the terminal (a
/// prompt) while its lease is renewed for ever. Taken back when dropped, once the group has ended,
/// if the command's group still has it: after Ctrl-Z and `bg` the shell has it, and keeps it.
struct Terminal {
    fd: Option<libc::c_int>,
    /// The command's group, once it runs.
    group: libc::pid_t,
}

impl Terminal {
    /// The first of stdin, stdout and stderr that is a terminal with pg-fence's group in front.
    fn foreground() -> Terminal {
        // SAFETY: isatty, tcgetpgrp and getpgrp only read.
        let fd =
            (0..3).find(|&fd| unsafe { libc::isatty(fd) == 1 && libc::tcgetpgrp(fd) == libc::getpgrp() });
        Terminal { fd, group: 0 }
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
    fn give(&mut self, group: libc::pid_t) {
        self.group = group;
        if let Some(fd) = self.fd {
            // SAFETY: this process's disposition of SIGTTOU, and its terminal's foreground group.
            unsafe {
                libc::signal(libc::SIGTTOU, libc::SIG_IGN);
                libc::tcsetpgrp(fd, group);
            }
        }
    }
}

impl Terminal {
    /// The command's group, in front, was stopped from the terminal (Ctrl-Z): pg-fence takes the
    /// terminal back and stops itself, so that the shell sees its job stopped and gets the terminal,
    /// instead of waiting on a pg-fence that runs for ever beside a stopped command. Returns once
    /// pg-fence is continued (`fg`, `bg`), the command left stopped: whether it may run again
    /// depends on the lease, which may have ended meanwhile (see `resume`).
    fn suspend(&self) {
        if let Some(fd) = self.fd {
            // SAFETY: this process's terminal and signals.
            unsafe {
                libc::tcsetpgrp(fd, libc::getpgrp());
                libc::kill(libc::getpid(), libc::SIGSTOP);
            }
        }
    }

    /// After `suspend`, the lease still held: continues the command, giving it the terminal again
    /// when pg-fence has it (`fg`).
    fn resume(&self) {
        if let Some(fd) = self.fd {
            // SAFETY: this process's terminal, and the command's group.
            unsafe {
                if libc::tcgetpgrp(fd) == libc::getpgrp() {
                    libc::tcsetpgrp(fd, self.group);
                }
                libc::killpg(self.group, libc::SIGCONT);
            }
        }
    }
}

/// Whether `leader` has stopped since last asked (the report taken, its exit left to be waited for).
fn stopped(leader: libc::pid_t) -> bool {
    // SAFETY: a local siginfo; WSTOPPED without WEXITED takes only a stop's report.
    unsafe {
        let mut info: libc::siginfo_t = std::mem::zeroed();
        libc::waitid(libc::P_PID, leader as libc::id_t, &mut info, libc::WSTOPPED | libc::WNOHANG) == 0
            && info.si_pid() == leader
    }
}

impl Drop for Terminal {
    fn drop(&mut self) {
        if let Some(fd) = self.fd {
            // SAFETY: as in `give`.
            unsafe {
                if libc::tcgetpgrp(fd) == self.group {
                    libc::signal(libc::SIGTTOU, libc::SIG_IGN);
                    libc::tcsetpgrp(fd, libc::getpgrp());
                }
            }
        }
    }
}

/// Starts `command` with `env` added to pg-fence's own environment, the signals `forwarded`
/// catches going to it, under a lease held until `deadline`. 127 when it cannot be found, 126 when
/// it cannot be run, as a shell says.
pub fn spawn(
    command: &[String],
    env: &[(&str, String)],
    forwarded: Forwarded,
    kill_after: Duration,
    deadline: Instant,
) -> Result<Child, Exit> {
    // The group's processes whose parent ends come to pg-fence rather than to init, which may
    // never reap them (a container's): the group then ends when its last process does.
    // SAFETY: prctl only sets a flag of this process.
    #[cfg(target_os = "linux")]
    unsafe {
        libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1)
    };
    // In place before the command starts: pg-fence may be killed at any moment after that.
    let watchdog = Watchdog::start(kill_after, deadline);
    let told = watchdog.as_ref().map(|watchdog| watchdog.shared as usize);
    let mut cmd = std::process::Command::new(&command[0]);
    cmd.args(&command[1..]).envs(env.iter().map(|(name, value)| (name, value))).process_group(0);
    // SAFETY: getpid only reads.
    let parent = unsafe { libc::getpid() };
    // SAFETY: between fork and exec, async-signal-safe calls only (getpid, an atomic store, prctl,
    // getppid); `told` is the watchdog's mapping, which lives until pg-fence's end.
    unsafe {
        cmd.pre_exec(move || {
            // The watchdog learns the group before the command can run, so that it stops it
            // whenever pg-fence ends from here on.
            if let Some(shared) = told {
                (*(shared as *const Shared)).group.store(libc::getpid(), Ordering::SeqCst);
            }
            // pg-fence killed (SIGKILL, the OOM killer) renews the lease no more: the command's
            // first process is told at once. (It comes when the thread that forked ends: the main
            // thread, which runs `block_on`.)
            #[cfg(target_os = "linux")]
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
            // pg-fence already gone: its signal, caught by pg-fence's own handlers until the
            // exec, would never reach the command, so it is not started.
            if libc::getppid() != parent {
                if let Some(shared) = told {
                    (*(shared as *const Shared)).group.store(0, Ordering::SeqCst);
                }
                return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        })
    };
    let mut terminal = Terminal::foreground();
    // Listened for before the command starts: a stop that comes before would go unseen.
    let children = terminal.fd.and_then(|_| signal(SignalKind::child()).ok());
    if let Some(fd) = terminal.fd {
        // SAFETY: `Terminal::take` makes only async-signal-safe calls.
        unsafe {
            cmd.pre_exec(move || {
                Terminal::take(fd);
                Ok(())
            })
        };
    }
    let child = match tokio::process::Command::from(cmd).spawn() {
        Ok(child) => child,
        Err(err) => {
            Watchdog::ended(watchdog);
            let code = if err.kind() == std::io::ErrorKind::NotFound { 127 } else { 126 };
            return Err(Exit::new(Code::Command(code), format!("cannot run {}: {err}", command[0])));
        }
    };
    let group = child.id().expect("a child just spawned has its pid") as libc::pid_t;
    terminal.give(group);
    Ok(Child { child, group, forwarded, terminal, kill_after, watchdog, children })
}

/// A process forked from pg-fence that outlives it only to stop the command's group when pg-fence
/// ends without having stopped it (SIGKILL, the OOM killer): then nothing renews the lease, and the
/// parent-death signal reaches only the command's first process, which may ignore it. It waits on
/// a pipe whose writing end only pg-fence holds: a byte says the group has ended, the end of the
/// file that pg-fence is gone (or gave up on the command without stopping it: an unwind). It runs
/// in a session of its own, so that a signal to pg-fence's whole group (`kill -9 -PGID`, timeout(1),
/// a supervisor's group kill) or the terminal's hangup does not end it with pg-fence, and ignores
/// the signals of job control and of the terminal; the command starts only once it is so. Its
/// SIGKILL comes `--kill-after` after its SIGTERM, or at the lease's local deadline if that comes
/// first.
struct Watchdog {
    pid: libc::pid_t,
    tell: libc::c_int,
    /// Whether the command's group has ended.
    ended: bool,
    /// Shared with the watchdog; left in place by pg-fence's end.
    shared: *const Shared,
}

/// What pg-fence and its watchdog share, in a mapping both see.
#[repr(C)]
struct Shared {
    /// The lease's local deadline, in `now_ms`' milliseconds, written at each renewal.
    deadline: AtomicU64,
    /// The command's process group, written by the command itself before its exec: 0 until then.
    group: AtomicI32,
}

impl Shared {
    fn held_until(&self, deadline: Instant) {
        let left = deadline.saturating_duration_since(Instant::now());
        let at = now_ms().saturating_add(left.as_millis().min(u64::MAX as u128) as u64);
        self.deadline.store(at, Ordering::SeqCst);
    }
}

// SAFETY: `shared` points to a mapping that lives as long as the Watchdog, only used atomically.
unsafe impl Send for Watchdog {}

impl Watchdog {
    /// None when no pipe or process could be made: the parent-death signal still stops the command.
    /// Returns once the watchdog is in a session of its own, deaf to the signals it ignores.
    fn start(kill_after: Duration, deadline: Instant) -> Option<Watchdog> {
        // Close-on-exec keeps the writing ends from the command, whose copies would keep the pipes
        // open after pg-fence's end.
        let [read, tell] = pipe()?;
        let Some([wait_ready, ready]) = pipe() else {
            close_all(&[read, tell]);
            return None;
        };
        let grace_ms = kill_after.as_millis().min(u32::MAX as u128) as u64;
        // SAFETY: a new anonymous mapping, shared with the process forked below.
        let shared = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                std::mem::size_of::<Shared>(),
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if shared == libc::MAP_FAILED {
            close_all(&[read, tell, wait_ready, ready]);
            return None;
        }
        let shared = shared as *const Shared;
        // SAFETY: a zeroed mapping is a valid Shared, with no group yet.
        unsafe { (*shared).held_until(deadline) };
        // SAFETY: the forked process (one thread, a copy of this one) makes only async-signal-safe
        // calls and ends with _exit, never returning into Rust code that could allocate or lock.
        match unsafe { libc::fork() } {
            -1 => {
                close_all(&[read, tell, wait_ready, ready]);
                // SAFETY: the mapping just made, used by nothing else.
                unsafe { libc::munmap(shared as *mut libc::c_void, std::mem::size_of::<Shared>()) };
                None
            }
            // SAFETY: see above.
            0 => unsafe { watch([read, ready], [tell, wait_ready], grace_ms, &*shared) },
            pid => {
                // The reading end is the watchdog's alone; its byte says it is ready.
                close_all(&[read, ready]);
                let mut byte = 0u8;
                let read = loop {
                    // SAFETY: reads into a local byte; EOF instead if the watchdog died first.
                    let read = unsafe { libc::read(wait_ready, (&mut byte as *mut u8).cast(), 1) };
                    if read >= 0 || std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted
                    {
                        break read;
                    }
                };
                close_all(&[wait_ready]);
                // Dead before it was ready: given up, and reaped when dropped (as `ended` says).
                let alive = read == 1;
                let watchdog = Watchdog { pid, tell, ended: !alive, shared };
                alive.then_some(watchdog)
            }
        }
    }

    /// The lease is held until `held`'s local deadline now: the watchdog kills by then.
    fn held_until(watchdog: &Option<Watchdog>, held: &HeldLease) {
        if let Some(watchdog) = watchdog {
            // SAFETY: the mapping lives as long as the Watchdog.
            unsafe { (*watchdog.shared).held_until(held.deadline()) };
        }
    }

    /// Once the command's group has ended (or was sent SIGKILL, or never started): the watchdog is
    /// told so, and reaped, rather than stopping a group that is gone.
    fn ended(watchdog: Option<Watchdog>) {
        if let Some(mut watchdog) = watchdog {
            watchdog.ended = true;
        }
    }
}

/// A pipe whose ends are closed on exec: its reading end, then its writing end.
fn pipe() -> Option<[libc::c_int; 2]> {
    let mut ends = [0; 2];
    // SAFETY: pipe2 fills the two descriptors.
    (unsafe { libc::pipe2(ends.as_mut_ptr(), libc::O_CLOEXEC) } == 0).then_some(ends)
}

fn close_all(fds: &[libc::c_int]) {
    for fd in fds {
        // SAFETY: each is a descriptor this process made and uses no more.
        unsafe { libc::close(*fd) };
    }
}

impl Drop for Watchdog {
    /// Closes pg-fence's end of the pipe: without the byte of `ended` the watchdog stops the group.
    fn drop(&mut self) {
        // SAFETY: writes to and closes pg-fence's own end of the pipe; waits for its own child,
        // which ends on reading the byte (ECHILD if it was reaped with the orphans already); unmaps
        // the shared words, used by nothing else in this process.
        unsafe {
            if self.ended {
                libc::write(self.tell, b"x".as_ptr().cast(), 1);
            }
            libc::close(self.tell);
            if self.ended {
                libc::waitpid(self.pid, std::ptr::null_mut(), 0);
            }
            libc::munmap(self.shared as *mut libc::c_void, std::mem::size_of::<Shared>());
        }
    }
}

/// The watchdog's life, in the forked process: async-signal-safe calls only.
unsafe fn watch(
    [read, ready]: [libc::c_int; 2],
    pg_fences: [libc::c_int; 2],
    grace_ms: u64,
    shared: &Shared,
) -> ! {
    // pg-fence's ends of the pipes, closed by name: a copy of its writing end kept open here would
    // hide pg-fence's end.
    for fd in pg_fences {
        libc::close(fd);
    }
    libc::setsid();
    for signal in [
        libc::SIGINT,
        libc::SIGTERM,
        libc::SIGHUP,
        libc::SIGQUIT,
        libc::SIGTSTP,
        libc::SIGTTIN,
        libc::SIGTTOU,
        libc::SIGPIPE,
    ] {
        libc::signal(signal, libc::SIG_IGN);
    }
    libc::write(ready, b"x".as_ptr().cast(), 1);
    // Only the pipe and stderr kept: pg-fence's connections and its stdout would otherwise stay
    // open after its end (a reader of its output never seeing the end of it).
    let read = match libc::dup2(read, 3) {
        3 => 3,
        _ => read,
    };
    libc::close(0);
    libc::close(1);
    if read == 3 && libc::syscall(libc::SYS_close_range, 4u32, u32::MAX, 0u32) != 0 {
        for fd in 4..65536 {
            libc::close(fd);
        }
    }
    let mut byte = 0u8;
    loop {
        match libc::read(read, (&mut byte as *mut u8).cast(), 1) {
            -1 if *libc::__errno_location() == libc::EINTR => continue,
            0 => break,
            _ => libc::_exit(0),
        }
    }
    // No group: pg-fence ended before the command's exec, which then never comes (see `spawn`).
    let group = shared.group.load(Ordering::SeqCst);
    if group <= 0 {
        libc::_exit(0);
    }
    let kill_at = now_ms().saturating_add(grace_ms).min(shared.deadline.load(Ordering::SeqCst));
    // Past the deadline, a stopped group is not continued even for a SIGTERM.
    if now_ms() < kill_at {
        let said =
            b"pg-fence: ended without stopping its command (killed?): sending SIGTERM to the command\n";
        libc::write(2, said.as_ptr().cast(), said.len());
        libc::killpg(group, libc::SIGTERM);
        // A group stopped (Ctrl-Z, SIGSTOP) would not act on it until continued.
        libc::killpg(group, libc::SIGCONT);
    }
    while now_ms() < kill_at {
        if libc::killpg(group, 0) != 0 {
            libc::_exit(0);
        }
        let pause = libc::timespec { tv_sec: 0, tv_nsec: 50_000_000 };
        libc::nanosleep(&pause, std::ptr::null_mut());
    }
    let said = b"pg-fence: the command still ran after SIGTERM: sending SIGKILL\n";
    libc::write(2, said.as_ptr().cast(), said.len());
    libc::killpg(group, libc::SIGKILL);
    libc::_exit(0)
}

/// The clock of the lease's local deadline in milliseconds, which counts a suspend of the host
/// (clock_gettime is async-signal-safe).
fn now_ms() -> u64 {
    let mut now = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: fills a local timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut now) };
    now.tv_sec as u64 * 1000 + now.tv_nsec as u64 / 1_000_000
}

/// Sends `signal` to the process group `group`.
fn signal_group(group: libc::pid_t, signal: libc::c_int) {
    // SAFETY: killpg only sends a signal; a group that is gone returns ESRCH, which is harmless.
    unsafe { libc::killpg(group, signal) };
}

/// How long the keeper is given to say why a lease whose local deadline has passed was lost.
const LOSS_TOLD: Duration = Duration::from_secs(5);

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
    /// Waits for the command to end, forwarding SIGINT, SIGTERM and SIGHUP to its group; a SIGTERM
    /// it outlives by `kill_after` is followed by SIGKILL, as a supervisor that sent it expects.
    /// When `lost` completes first, sends SIGTERM to the group and SIGKILL the loss's `kill_after`
    /// later if it is still running, and returns once it has ended. `held` is the lease it runs
    /// under: a command stopped from the terminal is continued only while it is held.
    pub async fn supervise(self, held: &HeldLease, lost: impl Future<Output = Loss>) -> Ended {
        let Child { mut child, group, mut forwarded, terminal, kill_after, watchdog, mut children } = self;
        tokio::pin!(lost);
        // Each renewal moves the deadline the watchdog kills by.
        let mut renewals = held.watch();
        Watchdog::held_until(&watchdog, held);
        // What the command left running in its group (a job it put in the background) is part of
        // it: the lease is kept, and the loss handled, until the group has ended too.
        let mut ended = None;
        let mut kill_at = None;
        let loss = loop {
            tokio::select! {
                code = exit_code(&mut child), if ended.is_none() => ended = Some(code),
                _ = tokio::time::sleep(REAP_EVERY), if ended.is_none() => reap_orphans(group),
                _ = tokio::time::sleep(GROUP_POLL), if ended.is_some() => {}
                Ok(()) = renewals.changed() => Watchdog::held_until(&watchdog, held),
                _ = async { children.as_mut().expect("enabled with it").recv().await }, if children.is_some() && ended.is_none() => {
                    if stopped(group) {
                        terminal.suspend();
                        // Stopped past the lease's local deadline, the command may no longer run:
                        // the key may be another's already. Judged before anything else, as the
                        // keeper's task may not have run since pg-fence was continued.
                        if !held.is_held() {
                            break None;
                        }
                        terminal.resume();
                    }
                }
                signal = forwarded.next() => {
                    signal_group(group, signal);
                    if signal == libc::SIGTERM && kill_at.is_none() {
                        kill_at = Some(tokio::time::Instant::now() + kill_after);
                    }
                }
                _ = tokio::time::sleep_until(kill_at.unwrap_or_else(tokio::time::Instant::now)), if kill_at.is_some() => {
                    crate::sayln!("pg-fence: the command still ran {kill_after:?} after SIGTERM: sending SIGKILL");
                    signal_group(group, libc::SIGKILL);
                    kill_at = None;
                }
                loss = &mut lost => break Some(loss),
            }
            if let Some(code) = ended.filter(|_| group_gone(group)) {
                Watchdog::ended(watchdog);
                return Ended::Exited(code);
            }
        };
        let Some(Loss { why, kill_after }) = loss else {
            signal_group(group, libc::SIGKILL);
            // The keeper says why once it has run.
            let why = match tokio::time::timeout(LOSS_TOLD, &mut lost).await {
                Ok(Loss { why, .. }) => why,
                Err(_) => "the local deadline of its lease passed".into(),
            };
            crate::sayln!(
                "pg-fence: {why}: sending SIGKILL to the command, stopped meanwhile, rather than continuing it"
            );
            exit_code(&mut child).await;
            while !group_gone(group) {
                tokio::time::sleep(GROUP_POLL).await;
            }
            Watchdog::ended(watchdog);
            return Ended::Stopped;
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
                Watchdog::ended(watchdog);
                return Ended::Stopped;
            }
        }
        crate::sayln!("pg-fence: the command still ran {:?} after SIGTERM: sending SIGKILL", kill_after);
        signal_group(group, libc::SIGKILL);
        exit_code(&mut child).await;
        Watchdog::ended(watchdog);
        Ended::Stopped
    }
}

/// The longest time pg-fence itself did not run (stopped by SIGSTOP or from a terminal, a suspended
/// virtual machine, starved of CPU) while the command ran: a lease it let lapse meanwhile was not
/// the server's doing, which the loss's message says.
pub struct Pauses {
    seen: std::sync::Arc<std::sync::Mutex<(std::time::Instant, Duration)>>,
    ticker: tokio::task::JoinHandle<()>,
}

/// How often the pause ticker looks at the clock.
const TICK: Duration = Duration::from_millis(200);

impl Pauses {
    pub fn start() -> Pauses {
        let seen = std::sync::Arc::new(std::sync::Mutex::new((std::time::Instant::now(), Duration::ZERO)));
        let ticking = seen.clone();
        let ticker = tokio::spawn(async move {
            loop {
                tokio::time::sleep(TICK).await;
                let now = std::time::Instant::now();
                let mut seen = ticking.lock().unwrap();
                seen.1 = seen.1.max(now.saturating_duration_since(seen.0).saturating_sub(TICK));
                seen.0 = now;
            }
        });
        Pauses { seen, ticker }
    }

    /// The longest pause so far, the present one included (the ticker may not have run since).
    pub fn longest(&self) -> Duration {
        let seen = self.seen.lock().unwrap();
        seen.1.max(seen.0.elapsed().saturating_sub(TICK))
    }
}

impl Drop for Pauses {
    fn drop(&mut self) {
        self.ticker.abort();
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A command given up on without being stopped (an unwind, an early return) runs on without a
    /// lease unless the watchdog stops it.
    #[tokio::test]
    async fn a_child_dropped_without_being_stopped_is_stopped_by_the_watchdog() {
        let command: Vec<String> =
            ["sh", "-c", "trap '' TERM; while :; do sleep 0.05; done"].map(String::from).into();
        let child = spawn(
            &command,
            &[],
            Forwarded::new(),
            Duration::from_millis(200),
            Instant::now() + Duration::from_secs(60),
        )
        .unwrap();
        let group = child.group;
        drop(child);
        let start = std::time::Instant::now();
        while !group_gone(group) && start.elapsed() < Duration::from_secs(60) {
            tokio::time::sleep(GROUP_POLL).await;
        }
        let gone = group_gone(group);
        signal_group(group, libc::SIGKILL);
        assert!(gone, "the command's group still ran 60 s after pg-fence gave it up");
    }
}
