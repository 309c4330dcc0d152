//! A private PostgreSQL server for one test.

use std::fs::{self, File};
use std::io;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpStream};
use std::os::unix::fs::chown;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::{User, geteuid};

use crate::process::{free_port, kill_and_reap, make_temp_dir, pid_of, spawn, tied_command_as};

/// Environment variable naming the directory holding `initdb` and
/// `postgres`.
const BIN_ENV: &str = "BREAKWATER_POSTGRES_BIN";
/// Where Debian's `postgresql-NN` packages put the server binaries.
const DEBIAN_ROOT: &str = "/usr/lib/postgresql";
/// The OS user that runs the server when the tests run as root (`initdb`
/// and `postgres` refuse to run as root); Debian's package creates it.
const OS_USER: &str = "postgres";
/// The database superuser (trust authentication on loopback only).
const SUPERUSER: &str = "postgres";
/// How long `initdb` may take.
const INITDB_TIMEOUT: Duration = Duration::from_secs(120);
/// How long a server gets to accept connections after being spawned.
const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a fast shutdown (`SIGINT`) may take before `SIGKILL`.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);
/// Fresh-port attempts in [`PostgresServer::start`].
const START_ATTEMPTS: usize = 20;
/// The log line that says the server is up.
const READY_LINE: &str = "database system is ready to accept connections";
/// What each log line starts with: the time and the backend's pid, which
/// [`PostgresServer::statements`] relies on.
const LOG_LINE_PREFIX: &str = "%m [%p] ";

/// A private PostgreSQL server (`initdb` + `postgres`) listening on
/// `127.0.0.1` on a free port (never 5432) for the duration of one test.
///
/// The cluster lives in its own temporary directory (data, Unix socket,
/// `postgres.log`) and runs with `fsync` off, trust authentication for the
/// superuser `postgres`, and `log_statement = all`, so a test can count the
/// statements that really reached the database
/// ([`statements`](Self::statements)). When the tests run as root, `initdb`
/// and `postgres` run as the OS user `postgres` (they refuse root).
///
/// Dropping the value stops the server (fast shutdown, then `SIGKILL`) and
/// deletes the directory, also while unwinding from a panicking test; a test
/// process killed outright takes the server with it (see
/// [`tied_command`](crate::tied_command)).
///
/// The binaries are taken from `BREAKWATER_POSTGRES_BIN` (a directory), else
/// the newest `/usr/lib/postgresql/*/bin` (Debian's `postgresql` package,
/// which `./scripts/test` installs), else `initdb` on `PATH`.
///
/// ```no_run
/// use breakwater_cache_testkit::PostgresServer;
///
/// let pg = PostgresServer::start();
/// let url = pg.url(); // "postgres://postgres@127.0.0.1:PORT/postgres"
/// // ... run the code under test against `url` ...
/// let selects = pg
///     .statements()
///     .into_iter()
///     .filter(|s| s.sql.starts_with("SELECT"))
///     .count();
/// # let _ = (url, selects);
/// ```
#[derive(Debug)]
pub struct PostgresServer {
    child: Option<Child>,
    port: u16,
    dir: PathBuf,
    bin: PathBuf,
}

/// One statement that reached the server, as `log_statement = all` logged
/// it: a simple query, or the execution of a prepared one with its
/// parameters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Statement {
    /// The backend (connection) that ran it.
    pub pid: u32,
    /// The statement's text, `$1`-style placeholders included.
    pub sql: String,
    /// The parameters of a prepared statement as logged, e.g.
    /// `$1 = '42', $2 = 'x'`; `None` for a statement without any.
    pub parameters: Option<String>,
}

impl PostgresServer {
    /// Runs `initdb` in a fresh temporary directory, starts `postgres` on a
    /// free loopback port and waits until it accepts connections.
    ///
    /// # Panics
    ///
    /// If the binaries cannot be found or run, if `initdb` fails, if the
    /// server exits for a reason other than its port being taken, or if it
    /// does not come up within 60 seconds. The message says what to install
    /// or set.
    pub fn start() -> PostgresServer {
        PostgresServer::start_with(&[])
    }

    /// Like [`start`](Self::start), with extra server settings passed as
    /// `-c name=value`, e.g. `&[("max_connections", "20")]`.
    ///
    /// # Panics
    ///
    /// As [`start`](Self::start).
    pub fn start_with(settings: &[(&str, &str)]) -> PostgresServer {
        let bin = bin_dir().unwrap_or_else(|e| panic!("{e}"));
        let mut server = PostgresServer {
            child: None,
            port: 0,
            dir: make_temp_dir("breakwater-postgres"),
            bin,
        };
        let bin = server.bin.clone();
        let user = server.run_as();
        server.initdb(&bin, user);
        for _ in 0..START_ATTEMPTS {
            server.port = free_port();
            match server.spawn_and_wait(&bin, user, settings) {
                Ok(()) => return server,
                Err(Some(_)) if server.port_was_busy() => {}
                Err(Some(status)) => panic!(
                    "postgres exited with {status} during startup on port {}.\n{}",
                    server.port,
                    server.log_tail()
                ),
                Err(None) => {
                    let tail = server.log_tail();
                    server.kill();
                    panic!(
                        "postgres on port {} did not accept connections within {READY_TIMEOUT:?}.\n{tail}",
                        server.port
                    );
                }
            }
        }
        panic!(
            "postgres could not bind a free loopback port after {START_ATTEMPTS} attempts.\n{}",
            server.log_tail()
        );
    }

    /// The TCP port the server listens on (never 5432).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The socket address, `127.0.0.1:PORT`.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, self.port))
    }

    /// The connection URL of database `postgres` as superuser `postgres`
    /// (no password: trust authentication on loopback),
    /// `postgres://postgres@127.0.0.1:PORT/postgres`.
    pub fn url(&self) -> String {
        format!("postgres://{SUPERUSER}@127.0.0.1:{}/postgres", self.port)
    }

    /// The server's log file.
    pub fn log_path(&self) -> PathBuf {
        self.dir.join("postgres.log")
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// Every statement logged so far, in log order: simple queries
    /// (`statement: ...`) and executions of prepared statements
    /// (`execute <name>: ...`, with the `parameters: ...` detail that
    /// follows). A statement appears once per execution; parse and bind
    /// steps are not logged.
    pub fn statements(&self) -> Vec<Statement> {
        parse_statements(&self.log())
    }

    /// A `psql` command (from the same installation) connected as the
    /// superuser, printing rows unaligned without headers (columns
    /// separated by `|`) and stopping at the first error; add
    /// `--command SQL` (or a script on stdin) and run it. For a session
    /// that must outlive one call, e.g. one holding a lock.
    pub fn psql_command(&self) -> Command {
        let mut cmd = Command::new(self.bin.join("psql"));
        cmd.args(["--no-psqlrc", "--no-align", "--tuples-only", "--quiet"])
            .args(["--set", "ON_ERROR_STOP=1"])
            .args([
                "--host",
                "127.0.0.1",
                "--username",
                SUPERUSER,
                "--dbname",
                "postgres",
            ])
            .arg("--port")
            .arg(self.port.to_string());
        cmd
    }

    /// Runs `sql` with [`psql_command`](Self::psql_command) and returns its
    /// output: one line per row, columns separated by `|`.
    ///
    /// # Errors
    ///
    /// If `psql` cannot be run, or fails (the error carries its output).
    pub fn psql(&self, sql: &str) -> io::Result<String> {
        let output = self
            .psql_command()
            .arg("--command")
            .arg(sql)
            .stdin(Stdio::null())
            .output()?;
        if output.status.success() {
            Ok(String::from_utf8_lossy(&output.stdout)
                .trim_end()
                .to_owned())
        } else {
            Err(io::Error::other(format!(
                "psql exited with {}: {}",
                output.status,
                String::from_utf8_lossy(&output.stderr).trim_end()
            )))
        }
    }

    /// Stops the server: a fast shutdown (`SIGINT`: connections are closed,
    /// nothing is left behind), `SIGKILL` if it takes longer than 10
    /// seconds. Does nothing if it is not running; safe to call repeatedly.
    pub fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        if let Some(pid) = pid_of(&child) {
            let _ = kill(pid, Signal::SIGINT);
            let deadline = Instant::now() + STOP_TIMEOUT;
            while Instant::now() < deadline {
                if !matches!(child.try_wait(), Ok(None)) {
                    return;
                }
                thread::sleep(Duration::from_millis(20));
            }
        }
        kill_and_reap(child);
    }

    /// Kills the server with `SIGKILL` at once (a crash, as far as the
    /// server's clients can tell). Safe to call repeatedly.
    pub fn kill(&mut self) {
        if let Some(child) = self.child.take() {
            kill_and_reap(child);
        }
    }

    /// The OS user to run `initdb` and `postgres` as (`postgres` when the
    /// tests run as root), after handing it the directory.
    fn run_as(&self) -> Option<&'static str> {
        if !geteuid().is_root() {
            return None;
        }
        let user = match User::from_name(OS_USER) {
            Ok(Some(user)) => user,
            Ok(None) | Err(_) => panic!(
                "the tests run as root, and PostgreSQL refuses to run as root, but there is no \
                 OS user `{OS_USER}` to run it as. Install the Debian package `postgresql` \
                 (`./scripts/test` installs it), which creates that user."
            ),
        };
        chown(&self.dir, Some(user.uid.as_raw()), Some(user.gid.as_raw())).unwrap_or_else(|e| {
            panic!(
                "cannot hand {} to the OS user `{OS_USER}`: {e}",
                self.dir.display()
            )
        });
        Some(OS_USER)
    }

    fn data_dir(&self) -> PathBuf {
        self.dir.join("data")
    }

    /// Creates the cluster with `initdb`, waiting at most
    /// [`INITDB_TIMEOUT`].
    fn initdb(&self, bin: &Path, user: Option<&str>) {
        let log_path = self.dir.join("initdb.log");
        let log = File::create(&log_path)
            .unwrap_or_else(|e| panic!("cannot create {}: {e}", log_path.display()));
        let log_err = log
            .try_clone()
            .unwrap_or_else(|e| panic!("cannot clone a file handle: {e}"));
        let initdb = bin.join("initdb");
        let mut cmd = tied_command_as(&initdb, user);
        cmd.arg("--pgdata")
            .arg(self.data_dir())
            .args(["--username", SUPERUSER])
            .args(["--auth", "trust"])
            .args(["--encoding", "UTF8"])
            .args(["--no-locale", "--no-sync"])
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err);
        let mut child = spawn(cmd)
            .unwrap_or_else(|e| panic!("cannot run {}: {e}. {}", initdb.display(), install_hint()));
        let deadline = Instant::now() + INITDB_TIMEOUT;
        let status = loop {
            match child.try_wait() {
                Ok(Some(status)) => break status,
                Ok(None) if Instant::now() < deadline => thread::sleep(Duration::from_millis(20)),
                Ok(None) => {
                    kill_and_reap(child);
                    panic!(
                        "initdb did not finish within {INITDB_TIMEOUT:?}.\n{}",
                        tail_of(&log_path)
                    );
                }
                Err(e) => panic!("cannot poll initdb: {e}"),
            }
        };
        assert!(
            status.success(),
            "initdb exited with {status}.\n{}",
            tail_of(&log_path)
        );
    }

    /// Spawns the server on `self.port` and waits until it accepts
    /// connections. `Err(Some(status))`: it exited; `Err(None)`: it did not
    /// come up in time. On failure `self.child` is `None` or still running
    /// (timed out: the caller kills it).
    fn spawn_and_wait(
        &mut self,
        bin: &Path,
        user: Option<&str>,
        settings: &[(&str, &str)],
    ) -> Result<(), Option<ExitStatus>> {
        // A fresh log per attempt, so `port_was_busy` reads this one's.
        let log = File::create(self.log_path())
            .unwrap_or_else(|e| panic!("cannot create {}: {e}", self.log_path().display()));
        let log_err = log
            .try_clone()
            .unwrap_or_else(|e| panic!("cannot clone a file handle: {e}"));
        let postgres = bin.join("postgres");
        let mut cmd = tied_command_as(&postgres, user);
        cmd.arg("-D")
            .arg(self.data_dir())
            .arg("-p")
            .arg(self.port.to_string())
            .arg("-k")
            .arg(&self.dir);
        let fixed = [
            ("listen_addresses", "127.0.0.1"),
            ("log_statement", "all"),
            ("log_line_prefix", LOG_LINE_PREFIX),
            ("logging_collector", "off"),
            ("fsync", "off"),
            ("synchronous_commit", "off"),
            ("full_page_writes", "off"),
        ];
        for (name, value) in fixed.iter().chain(settings) {
            cmd.arg("-c").arg(format!("{name}={value}"));
        }
        cmd.current_dir(&self.dir)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err);
        let child = spawn(cmd).unwrap_or_else(|e| {
            panic!("cannot run {}: {e}. {}", postgres.display(), install_hint())
        });
        self.child = Some(child);
        self.wait_ready()
    }

    fn wait_ready(&mut self) -> Result<(), Option<ExitStatus>> {
        let deadline = Instant::now() + READY_TIMEOUT;
        let addr = self.addr();
        loop {
            let Some(child) = self.child.as_mut() else {
                return Err(None);
            };
            match child.try_wait() {
                Ok(Some(status)) => {
                    self.child = None;
                    return Err(Some(status));
                }
                Ok(None) => {}
                Err(e) => panic!("cannot poll the postgres process: {e}"),
            }
            if self.log().contains(READY_LINE)
                && TcpStream::connect_timeout(&addr, Duration::from_millis(500)).is_ok()
            {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(None);
            }
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// Whether the last attempt's log says the port was already in use.
    fn port_was_busy(&self) -> bool {
        self.log().contains("Address already in use")
    }

    fn log_tail(&self) -> String {
        tail_of(&self.log_path())
    }
}

impl Drop for PostgresServer {
    fn drop(&mut self) {
        self.stop();
        let _ = fs::remove_dir_all(&self.dir);
    }
}

fn install_hint() -> String {
    format!(
        "Install the Debian package `postgresql` (`./scripts/test` installs it), or set \
         {BIN_ENV} to the directory holding `initdb` and `postgres`."
    )
}

/// The last 30 lines of a log, for panic messages.
fn tail_of(path: &Path) -> String {
    let text = fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    format!(
        "--- {} (last lines) ---\n{}",
        path.display(),
        lines[lines.len().saturating_sub(30)..].join("\n")
    )
}

/// The directory holding `initdb` and `postgres`: `BREAKWATER_POSTGRES_BIN`,
/// else the newest `/usr/lib/postgresql/<version>/bin`, else the directory
/// of `initdb` on `PATH` (symlinks followed, as Debian links them).
fn bin_dir() -> Result<PathBuf, String> {
    let complete = |dir: &Path| dir.join("initdb").is_file() && dir.join("postgres").is_file();
    if let Some(dir) = std::env::var_os(BIN_ENV) {
        let dir = PathBuf::from(dir);
        return if complete(&dir) {
            Ok(dir)
        } else {
            Err(format!(
                "{BIN_ENV}={} holds no `initdb` and `postgres`. {}",
                dir.display(),
                install_hint()
            ))
        };
    }
    let newest = fs::read_dir(DEBIAN_ROOT)
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .filter_map(|e| {
            let version: u32 = e.file_name().to_str()?.parse().ok()?;
            let bin = e.path().join("bin");
            complete(&bin).then_some((version, bin))
        })
        .max_by_key(|(version, _)| *version);
    if let Some((_, bin)) = newest {
        return Ok(bin);
    }
    let on_path = std::env::var_os("PATH")
        .map(|path| std::env::split_paths(&path).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .filter_map(|dir| fs::canonicalize(dir.join("initdb")).ok())
        .filter_map(|initdb| initdb.parent().map(Path::to_path_buf))
        .find(|dir| complete(dir));
    on_path.ok_or_else(|| {
        format!(
            "PostgreSQL's `initdb` and `postgres` were not found (not in {DEBIAN_ROOT}/*/bin, \
             nor on PATH). {}",
            install_hint()
        )
    })
}

/// Which part of which statement a continuation line (one starting with
/// a tab) extends.
#[derive(Clone, Copy)]
enum Part {
    Sql(usize),
    Parameters(usize),
    Other,
}

/// The statements in a log written with [`LOG_LINE_PREFIX`].
fn parse_statements(log: &str) -> Vec<Statement> {
    let mut statements: Vec<Statement> = Vec::new();
    let mut last = Part::Other;
    for line in log.lines() {
        if let Some(more) = line.strip_prefix('\t') {
            let field = match last {
                Part::Sql(i) => statements.get_mut(i).map(|s| &mut s.sql),
                Part::Parameters(i) => statements.get_mut(i).and_then(|s| s.parameters.as_mut()),
                Part::Other => None,
            };
            if let Some(field) = field {
                field.push('\n');
                field.push_str(more);
            }
            continue;
        }
        last = Part::Other;
        let Some((pid, message)) = split_prefix(line) else {
            continue;
        };
        if let Some(text) = message.strip_prefix("LOG:  ") {
            let sql = text.strip_prefix("statement: ").or_else(|| {
                text.strip_prefix("execute ")
                    .and_then(|named| named.split_once(": "))
                    .map(|(_, sql)| sql)
            });
            if let Some(sql) = sql {
                statements.push(Statement {
                    pid,
                    sql: sql.to_owned(),
                    parameters: None,
                });
                last = Part::Sql(statements.len() - 1);
            }
        } else if let Some(parameters) = message.strip_prefix("DETAIL:  parameters: ") {
            // The detail belongs to the last statement of the same backend
            // (other backends' lines may come in between).
            if let Some(i) = statements.iter().rposition(|s| s.pid == pid) {
                statements[i].parameters = Some(parameters.to_owned());
                last = Part::Parameters(i);
            }
        }
    }
    statements
}

/// `(pid, message)` of a line `<time> [<pid>] <message>`.
fn split_prefix(line: &str) -> Option<(u32, &str)> {
    let open = line.find(" [")?;
    let rest = &line[open + 2..];
    let close = rest.find("] ")?;
    let pid = rest[..close].parse().ok()?;
    Some((pid, &rest[close + 2..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOG: &str = "\
2026-11-30 18:30:04.139 UTC [29109] LOG:  database system is ready to accept connections
2026-11-30 18:30:06.186 UTC [29415] LOG:  statement: select 1
2026-11-30 18:30:06.190 UTC [29416] LOG:  execute s0: SELECT id FROM products WHERE id = $1
2026-11-30 18:30:06.191 UTC [29417] LOG:  execute <unnamed>: UPDATE products SET name = $2 WHERE id = $1
2026-11-30 18:30:06.191 UTC [29416] DETAIL:  parameters: $1 = '42'
2026-11-30 18:30:06.192 UTC [29417] DETAIL:  parameters: $1 = '7', $2 = 'a
\tb'
2026-11-30 18:30:06.193 UTC [29415] LOG:  statement: SELECT 1,
\t2
2026-11-30 18:30:06.194 UTC [29415] ERROR:  relation \"nope\" does not exist
";

    #[test]
    fn statements_are_parsed_with_their_parameters() {
        let statements = parse_statements(LOG);
        assert_eq!(
            statements,
            [
                Statement {
                    pid: 29415,
                    sql: "select 1".into(),
                    parameters: None
                },
                Statement {
                    pid: 29416,
                    sql: "SELECT id FROM products WHERE id = $1".into(),
                    parameters: Some("$1 = '42'".into())
                },
                Statement {
                    pid: 29417,
                    sql: "UPDATE products SET name = $2 WHERE id = $1".into(),
                    parameters: Some("$1 = '7', $2 = 'a\nb'".into())
                },
                Statement {
                    pid: 29415,
                    sql: "SELECT 1,\n2".into(),
                    parameters: None
                },
            ]
        );
    }

    #[test]
    fn lines_without_a_prefix_are_skipped() {
        assert!(parse_statements("garbage\n[x] LOG:  statement: no\n").is_empty());
    }
}
