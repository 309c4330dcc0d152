//! Child processes that die with the test: spawned from one long-lived
//! thread under a parent-death signal, in their own temporary directories,
//! on free loopback ports. [`RedisServer`](crate::RedisServer),
//! [`PostgresServer`](crate::PostgresServer) and [`TiedChild`] share them.

use std::ffi::OsStr;
use std::fs;
use std::io;
use std::net::{Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStderr, ChildStdout, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Sender, channel};
use std::sync::{Mutex, OnceLock};
use std::thread;
use std::time::{SystemTime, UNIX_EPOCH};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// Ports that belong to servers other people use (Redis, PostgreSQL);
/// never handed to a test.
const FORBIDDEN_PORTS: [u16; 2] = [6379, 5432];

static NEXT_ID: AtomicU64 = AtomicU64::new(0);

/// A command that runs `program` so that it gets `SIGKILL` when the test
/// process dies, even when that process is killed outright (a CI timeout,
/// `SIGKILL`) and no destructor runs.
///
/// With util-linux's `setpriv` installed this is `setpriv --pdeathsig KILL
/// -- program`; `setpriv` execs the program, so the child's pid is the
/// program's. Without it, it is `program` alone (killed on drop only).
/// Add arguments, environment and stdio as to any [`Command`], then start
/// it with [`TiedChild::spawn`] (which spawns it from the thread the signal
/// is tied to).
///
/// ```no_run
/// use breakwater_cache_testkit::{TiedChild, tied_command};
///
/// let mut cmd = tied_command("sleep");
/// cmd.arg("60");
/// let child = TiedChild::spawn(cmd).unwrap(); // killed on drop, or with the test
/// # drop(child);
/// ```
pub fn tied_command(program: impl AsRef<OsStr>) -> Command {
    tied_command_as(program, None)
}

/// [`tied_command`], run as OS user `user` when one is given (`setpriv
/// --reuid --regid --init-groups`, which needs root and `setpriv`). The
/// parent-death signal survives the change of user: `setpriv` sets it
/// after switching.
pub(crate) fn tied_command_as(program: impl AsRef<OsStr>, user: Option<&str>) -> Command {
    let setpriv = pdeathsig_wrapper().or(user.map(|_| Path::new("setpriv")));
    match setpriv {
        Some(setpriv) => {
            let mut cmd = Command::new(setpriv);
            if let Some(user) = user {
                cmd.arg(format!("--reuid={user}"))
                    .arg(format!("--regid={user}"))
                    .arg("--init-groups");
            }
            if pdeathsig_wrapper().is_some() {
                cmd.args(["--pdeathsig", "KILL"]);
            }
            cmd.arg("--").arg(program);
            cmd
        }
        None => Command::new(program),
    }
}

/// A child process started by [`TiedChild::spawn`] from a
/// [`tied_command`]: `SIGKILL`ed and reaped on drop, also while unwinding
/// from a panicking test, and killed by the kernel if the test process
/// dies first.
#[derive(Debug)]
pub struct TiedChild {
    child: Option<Child>,
}

impl TiedChild {
    /// Spawns `cmd` (best built with [`tied_command`]) from the one
    /// long-lived thread that every tied process is started from: a
    /// parent-death signal fires when the *thread* that spawned the child
    /// ends, and a process started from a short-lived test thread must not
    /// die with it.
    ///
    /// # Errors
    ///
    /// As [`Command::spawn`].
    pub fn spawn(cmd: Command) -> io::Result<TiedChild> {
        spawn(cmd).map(|child| TiedChild { child: Some(child) })
    }

    /// The child's pid (the program's own when `setpriv` wrapped it).
    pub fn id(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The child's stdout, if it was piped (`Stdio::piped()`) and not
    /// taken yet.
    pub fn take_stdout(&mut self) -> Option<ChildStdout> {
        self.child.as_mut().and_then(|c| c.stdout.take())
    }

    /// The child's stderr, if it was piped and not taken yet.
    pub fn take_stderr(&mut self) -> Option<ChildStderr> {
        self.child.as_mut().and_then(|c| c.stderr.take())
    }

    /// The exit status if the child has exited, `None` while it runs.
    ///
    /// # Errors
    ///
    /// As [`Child::try_wait`]; a child already killed is reported as
    /// exited with an error.
    pub fn try_wait(&mut self) -> io::Result<Option<ExitStatus>> {
        match self.child.as_mut() {
            Some(child) => child.try_wait(),
            None => Err(io::Error::other("the child was killed")),
        }
    }

    /// Sends `signal` to the child if it runs (e.g. `SIGTERM` for a
    /// graceful stop).
    pub fn signal(&self, signal: Signal) {
        if let Some(pid) = self.child.as_ref().and_then(pid_of) {
            let _ = kill(pid, signal);
        }
    }

    /// Kills the child with `SIGKILL` (resuming it first if stopped) and
    /// reaps it. Safe to call repeatedly.
    pub fn kill(&mut self) {
        if let Some(child) = self.child.take() {
            kill_and_reap(child);
        }
    }
}

impl Drop for TiedChild {
    fn drop(&mut self) {
        self.kill();
    }
}

/// `SIGCONT` then `SIGKILL` (a stopped process dies too), then `wait`.
pub(crate) fn kill_and_reap(mut child: Child) {
    if let Some(pid) = pid_of(&child) {
        let _ = kill(pid, Signal::SIGCONT);
        let _ = kill(pid, Signal::SIGKILL);
    } else {
        let _ = child.kill();
    }
    let _ = child.wait();
}

pub(crate) fn pid_of(child: &Child) -> Option<Pid> {
    i32::try_from(child.id()).ok().map(Pid::from_raw)
}

/// Spawns `cmd` from one thread that lives as long as the process: a
/// parent-death signal fires when the *thread* that spawned the child ends,
/// and a server started from a short-lived thread must not die with it.
pub(crate) fn spawn(cmd: Command) -> io::Result<Child> {
    type Request = (Command, Sender<io::Result<Child>>);
    static SPAWNER: OnceLock<Mutex<Sender<Request>>> = OnceLock::new();
    let spawner = SPAWNER.get_or_init(|| {
        let (tx, rx) = channel::<Request>();
        thread::Builder::new()
            .name("testkit-spawner".into())
            .spawn(move || {
                for (mut cmd, reply) in rx {
                    let _ = reply.send(cmd.spawn());
                }
            })
            .unwrap_or_else(|e| panic!("cannot start the testkit-spawner thread: {e}"));
        Mutex::new(tx)
    });
    let (reply, answer) = channel();
    spawner
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .send((cmd, reply))
        .map_err(|_| io::Error::other("the testkit-spawner thread is gone"))?;
    answer
        .recv()
        .map_err(|_| io::Error::other("the testkit-spawner thread is gone"))?
}

/// `setpriv` if it is installed and can set a parent-death signal.
pub(crate) fn pdeathsig_wrapper() -> Option<&'static Path> {
    static WRAPPER: OnceLock<Option<PathBuf>> = OnceLock::new();
    WRAPPER
        .get_or_init(|| {
            let ok = Command::new("setpriv")
                .args(["--pdeathsig", "KILL", "--", "true"])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            ok.then(|| PathBuf::from("setpriv"))
        })
        .as_deref()
}

/// A port that was free on 127.0.0.1 a moment ago (never 6379 or 5432),
/// and never one this process handed out before.
///
/// A port is not handed out twice: a test's processes outlive their use of
/// a port by a moment, and a sentinel (or a replica) of one test that found
/// its old master's port taken by another test's server would talk to that
/// server as if it were its own.
///
/// # Panics
///
/// If no loopback port can be bound.
pub fn free_port() -> u16 {
    static HANDED_OUT: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    loop {
        let port = bind_loopback().1;
        let mut handed_out = HANDED_OUT.lock().unwrap_or_else(|p| p.into_inner());
        if !handed_out.contains(&port) {
            handed_out.push(port);
            return port;
        }
    }
}

/// A listener on a free loopback port (never 6379 or 5432), and its port.
///
/// # Panics
///
/// If no loopback port can be bound.
pub(crate) fn bind_loopback() -> (TcpListener, u16) {
    loop {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .unwrap_or_else(|e| panic!("cannot bind a loopback port: {e}"));
        let port = listener
            .local_addr()
            .unwrap_or_else(|e| panic!("cannot read local address: {e}"))
            .port();
        if !FORBIDDEN_PORTS.contains(&port) {
            return (listener, port);
        }
    }
}

/// Creates a fresh directory `<temp>/<prefix>-<pid>-<n>-<nanos>`.
pub(crate) fn make_temp_dir(prefix: &str) -> PathBuf {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    loop {
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        let dir =
            std::env::temp_dir().join(format!("{prefix}-{}-{id}-{nanos}", std::process::id()));
        match fs::create_dir(&dir) {
            Ok(()) => return dir,
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => panic!("cannot create temp dir {}: {e}", dir.display()),
        }
    }
}
