//! The process fleet of `bench stampede` and `bench many`: worker
//! processes of this binary (a hidden subcommand each), released together,
//! each reporting on its stdout.
//!
//! # The line protocol
//!
//! 1. A worker sets up (connects to Redis), then says `ready`.
//! 2. Once every worker is ready, the parent sends each one `go`: they are
//!    released together.
//! 3. Optionally (`bench stampede`) a worker says `finished` once its
//!    calls have returned, and waits for one more line (`report`) before it
//!    reports: no worker formats and writes its report while another is
//!    still measuring.
//! 4. A worker writes its report lines, then a [`Done`] line,
//!    `done ok=<n> err=<n> first_error=<message or none>`, and exits.
//!
//! [`say`] and [`read_line`] are the worker's side; [`Fleet`] the
//! parent's. A fleet kills every worker still running when it is dropped,
//! so an error, an early return or a panic in the parent leaves no process
//! behind; a worker that exits, stalls or says something unexpected is an
//! error that names the step it missed and the last line it wrote on
//! stderr.

use std::fmt;
use std::io::{self, BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// What a worker's report handler may fail with.
pub(crate) type BoxError = Box<dyn std::error::Error>;

/// How long the parent waits for a worker's stderr to end once it has
/// exited, to quote its last line.
const STDERR_SETTLE: Duration = Duration::from_secs(1);

/// Worker processes of one role, started together; each is killed if it is
/// still running when the fleet is dropped.
pub(crate) struct Fleet {
    /// The hidden subcommand the workers run, e.g. `stampede-worker`.
    role: &'static str,
    workers: Vec<Worker>,
}

/// One worker process: its stdout as lines, the last line of its stderr.
struct Worker {
    child: Child,
    lines: mpsc::Receiver<String>,
    last_stderr: Arc<Mutex<String>>,
    stderr_reader: Option<JoinHandle<()>>,
}

impl Fleet {
    /// Starts one `<exe> <role> <args>` process per item of `each`, every
    /// stream piped.
    ///
    /// # Errors
    ///
    /// A process could not be started (those already started are killed).
    pub(crate) fn spawn(
        exe: &Path,
        role: &'static str,
        each: impl IntoIterator<Item = Vec<String>>,
    ) -> io::Result<Self> {
        let mut fleet = Fleet {
            role,
            workers: Vec::new(),
        };
        for args in each {
            fleet.workers.push(Worker::spawn(exe, role, &args)?);
        }
        Ok(fleet)
    }

    /// Waits for every worker to say `ready`, each within `wait`.
    ///
    /// # Errors
    ///
    /// A worker that said something else, exited or stalled.
    pub(crate) fn ready(&mut self, wait: Duration) -> Result<(), String> {
        self.expect("ready", "get ready", wait)
    }

    /// Releases every worker at once: `go` to each.
    ///
    /// # Errors
    ///
    /// A worker that can no longer read (it exited).
    pub(crate) fn release(&mut self) -> Result<(), String> {
        self.send("go")
    }

    /// Waits for every worker's next line to be `line`, each within `wait`;
    /// `step` says what that line means ("get ready", "finish").
    ///
    /// # Errors
    ///
    /// A worker that said something else, exited or stalled.
    pub(crate) fn expect(&mut self, line: &str, step: &str, wait: Duration) -> Result<(), String> {
        let role = self.role;
        for worker in &mut self.workers {
            match worker.lines.recv_timeout(wait) {
                Ok(said) if said == line => {}
                other => return Err(worker.failed(role, step, other)),
            }
        }
        Ok(())
    }

    /// Sends `line` to every worker.
    ///
    /// # Errors
    ///
    /// A worker that can no longer read (it exited).
    pub(crate) fn send(&mut self, line: &str) -> Result<(), String> {
        let role = self.role;
        for worker in &mut self.workers {
            if worker.send(line).is_err() {
                let step = format!("read {line:?}");
                return Err(worker.failed(role, &step, Err(RecvTimeoutError::Disconnected)));
            }
        }
        Ok(())
    }

    /// Reads every worker's report, one worker after the other: each line
    /// up to its [`Done`] line goes to `on_line`, each line within `wait`;
    /// then waits for the worker to exit. Returns the workers' `done`
    /// lines, in order.
    ///
    /// # Errors
    ///
    /// A worker that exited or stalled before its `done` line, or what
    /// `on_line` failed with.
    pub(crate) fn reports(
        &mut self,
        wait: Duration,
        mut on_line: impl FnMut(&str) -> Result<(), BoxError>,
    ) -> Result<Vec<Done>, BoxError> {
        let role = self.role;
        let mut done = Vec::with_capacity(self.workers.len());
        for worker in &mut self.workers {
            loop {
                let line = match worker.lines.recv_timeout(wait) {
                    Ok(line) => line,
                    other => return Err(worker.failed(role, "finish", other).into()),
                };
                if let Some(last) = Done::parse(&line) {
                    done.push(last);
                    break;
                }
                on_line(&line)?;
            }
            worker.child.wait()?;
        }
        Ok(done)
    }
}

impl Worker {
    /// Starts `<exe> <role> <args>`; from the moment it runs, dropping the
    /// worker kills it.
    fn spawn(exe: &Path, role: &str, args: &[String]) -> io::Result<Self> {
        let mut child = Command::new(exe)
            .arg(role)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?;
        let (stdout, stderr) = (child.stdout.take(), child.stderr.take());
        let (tx, lines) = mpsc::channel();
        let mut worker = Worker {
            child,
            lines,
            last_stderr: Arc::default(),
            stderr_reader: None,
        };
        let (Some(stdout), Some(stderr)) = (stdout, stderr) else {
            return Err(io::Error::other("a worker process has no stdout or stderr"));
        };
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let last = Arc::clone(&worker.last_stderr);
        worker.stderr_reader = Some(std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if !line.trim().is_empty() {
                    *lock(&last) = line;
                }
            }
        }));
        Ok(worker)
    }

    /// Writes one line to the worker's stdin.
    fn send(&mut self, line: &str) -> io::Result<()> {
        let stdin = self
            .child
            .stdin
            .as_mut()
            .ok_or_else(|| io::Error::other("worker has no stdin"))?;
        stdin.write_all(line.as_bytes())?;
        stdin.write_all(b"\n")?;
        stdin.flush()
    }

    /// Why the worker did not `step`, from what it said instead, with the
    /// last line it wrote on stderr.
    fn failed(&mut self, role: &str, step: &str, got: Result<String, RecvTimeoutError>) -> String {
        let said = match got {
            Ok(line) => format!("it said {line:?}"),
            Err(RecvTimeoutError::Timeout) => "it timed out".to_owned(),
            Err(RecvTimeoutError::Disconnected) => {
                // Its stdout has closed: it has exited, or is about to.
                let _ = self.child.wait();
                self.settle_stderr();
                "it exited".to_owned()
            }
        };
        let last = lock(&self.last_stderr).clone();
        if last.is_empty() {
            format!("a {role} process did not {step} ({said})")
        } else {
            format!("a {role} process did not {step} ({said}: {last})")
        }
    }

    /// Gives the stderr reader a moment to read the rest, once the worker
    /// has exited.
    fn settle_stderr(&mut self) {
        let Some(reader) = self.stderr_reader.take() else {
            return;
        };
        let deadline = Instant::now() + STDERR_SETTLE;
        while !reader.is_finished() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        if reader.is_finished() {
            let _ = reader.join();
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A worker's last line: `done ok=<n> err=<n> first_error=<message or
/// none>`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Done {
    /// Calls that got what they should.
    pub(crate) ok: usize,
    /// Calls that failed.
    pub(crate) err: usize,
    /// The first failure's message (on one line).
    pub(crate) first_error: Option<String>,
}

impl Done {
    /// The `done` line `line`, or `None` if it is another line.
    pub(crate) fn parse(line: &str) -> Option<Self> {
        let rest = line.strip_prefix("done ")?;
        let number = |key: &str| {
            rest.split(' ')
                .find_map(|kv| kv.strip_prefix(key))
                .and_then(|n| n.parse::<usize>().ok())
                .unwrap_or(0)
        };
        let first_error = rest
            .split_once("first_error=")
            .map(|(_, e)| e.to_owned())
            .filter(|e| e != "none");
        Some(Done {
            ok: number("ok="),
            err: number("err="),
            first_error,
        })
    }
}

impl fmt::Display for Done {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let first_error = self
            .first_error
            .as_deref()
            .map_or_else(|| "none".to_owned(), |e| e.replace('\n', " "));
        write!(
            f,
            "done ok={} err={} first_error={first_error}",
            self.ok, self.err
        )
    }
}

/// The worker's side: writes one line to the parent at once.
pub(crate) fn say(line: &str) -> io::Result<()> {
    let mut stdout = io::stdout().lock();
    writeln!(stdout, "{line}")?;
    stdout.flush()
}

/// The worker's side: one line of stdin; empty at its end.
pub(crate) fn read_line() -> io::Result<String> {
    let mut line = String::new();
    io::stdin().lock().read_line(&mut line).map(|_| line)
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn done_lines_read_back_as_written() {
        let done = Done {
            ok: 3,
            err: 1,
            first_error: Some("lock timeout\nafter 1s".to_owned()),
        };
        let line = done.to_string();
        assert_eq!(line, "done ok=3 err=1 first_error=lock timeout after 1s");
        let back = Done::parse(&line).unwrap();
        assert_eq!((back.ok, back.err), (3, 1));
        assert_eq!(back.first_error.as_deref(), Some("lock timeout after 1s"));
        assert_eq!(
            Done::parse("done ok=5 err=0 first_error=none"),
            Some(Done {
                ok: 5,
                err: 0,
                first_error: None
            })
        );
        assert_eq!(Done::parse("sample 1 2"), None);
    }

    #[test]
    fn a_dropped_fleet_kills_its_workers() {
        // `sleep` stands in for a worker that never says `ready`.
        let Ok(mut fleet) = Fleet::spawn(Path::new("sleep"), "30", [Vec::new()]) else {
            return;
        };
        let err = fleet.ready(Duration::from_millis(50)).unwrap_err();
        assert_eq!(err, "a 30 process did not get ready (it timed out)");
        let pid = fleet.workers[0].child.id();
        drop(fleet);
        let proc = format!("/proc/{pid}");
        assert!(
            !Path::new(&proc).exists()
                || std::fs::read_to_string(format!("{proc}/stat"))
                    .is_ok_and(|s| s.contains(") Z ")),
            "worker {pid} still running"
        );
    }

    #[test]
    fn a_worker_that_exits_is_quoted_from_its_stderr() {
        let Ok(mut fleet) = Fleet::spawn(
            Path::new("sh"),
            "-c",
            [vec![
                "echo connecting >&2; echo 'cannot reach Redis' >&2; exit 1".to_owned(),
            ]],
        ) else {
            return;
        };
        let err = fleet.ready(Duration::from_secs(10)).unwrap_err();
        assert_eq!(
            err,
            "a -c process did not get ready (it exited: cannot reach Redis)"
        );
    }
}
