//! A private `redis-server` process for one test.

use std::fs::{self, File};
use std::io::{self, BufReader, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, ExitStatus, Stdio};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};

use crate::process::{free_port, kill_and_reap, make_temp_dir, pid_of, spawn, tied_command};
use crate::resp;
use crate::tls::{self, ServerFiles, TestCerts};

/// Environment variable naming the `redis-server` binary to run.
const BINARY_ENV: &str = "BREAKWATER_REDIS_SERVER";
/// How long a server gets to answer `PING` after being spawned.
const READY_TIMEOUT: Duration = Duration::from_secs(10);
/// Fresh-port attempts in [`RedisServer::start_with`].
const START_ATTEMPTS: usize = 20;
/// Same-port attempts in [`RedisServer::restart`].
const RESTART_ATTEMPTS: usize = 50;
/// Timeout for connecting to, writing to and reading from the server in
/// [`RedisServer::command`].
const COMMAND_TIMEOUT: Duration = Duration::from_secs(5);

/// A private `redis-server` child process listening on `127.0.0.1` for the
/// duration of one test.
///
/// The server runs without persistence (`--save ""`, `--appendonly no`) in
/// its own temporary directory, logging to `redis.log` there instead of the
/// test output. Dropping the value kills the process (even if it is paused)
/// and deletes the directory; this also happens while unwinding from a
/// panicking test.
///
/// A TLS server ([`RedisServer::start_tls`]) listens for TLS only
/// (`--port 0 --tls-port PORT`); its [`url`](RedisServer::url) is
/// `rediss://…` and the kit's own [`command`](RedisServer::command)s go over
/// TLS too.
#[derive(Debug)]
pub struct RedisServer {
    child: Option<Child>,
    port: u16,
    dir: PathBuf,
    extra_args: Vec<String>,
    /// A configuration file's text, written to the server's directory and
    /// given as its first argument (a sentinel needs one it can rewrite).
    config: Option<String>,
    tls: Option<Tls>,
}

/// A TLS server's files, and the client the kit talks to it with.
#[derive(Debug)]
struct Tls {
    files: ServerFiles,
    client: Arc<rustls::ClientConfig>,
}

/// Why one spawn attempt did not produce a ready server.
enum StartError {
    /// The process exited; the payload is its exit status.
    Exited(ExitStatus),
    /// The process did not answer `PING` within [`READY_TIMEOUT`].
    TimedOut,
}

impl RedisServer {
    /// Spawns `redis-server` on a free loopback port and waits until it
    /// answers `PING`.
    ///
    /// The binary is taken from the `BREAKWATER_REDIS_SERVER` environment
    /// variable, else `redis-server` on `PATH`.
    ///
    /// # Panics
    ///
    /// If `redis-server` cannot be found or run, if it exits for a reason
    /// other than its port being taken, or if it does not come up within
    /// about 10 seconds.
    pub fn start() -> RedisServer {
        RedisServer::start_with(&[])
    }

    /// Like [`RedisServer::start`], with extra `redis-server` command-line
    /// configuration appended, e.g. `&["--maxmemory", "10mb"]`.
    ///
    /// The extra arguments are reused by [`RedisServer::restart`].
    ///
    /// # Panics
    ///
    /// As [`RedisServer::start`]; also if the extra arguments make
    /// `redis-server` exit (the panic message includes its output).
    pub fn start_with(args: &[&str]) -> RedisServer {
        RedisServer::start_inner(None, args, None)
    }

    /// Like [`RedisServer::start_with`], with a configuration file: `config`
    /// is written to `redis.conf` in the server's directory (again before
    /// each restart) and passed as the first argument, e.g. a sentinel's
    /// `sentinel monitor ...` lines with `&["--sentinel"]`.
    pub(crate) fn start_with_config(config: &str, args: &[&str]) -> RedisServer {
        RedisServer::start_inner(Some(config.to_owned()), args, None)
    }

    /// Like [`RedisServer::start`], listening for TLS only (`--port 0
    /// --tls-port PORT`) with `certs`' server certificate, and requiring
    /// client certificates signed by `certs`' authority (redis-server's
    /// default, `tls-auth-clients yes`; pass `--tls-auth-clients optional`
    /// to [`start_tls_with`](RedisServer::start_tls_with) to allow clients
    /// without one). Its [`url`](RedisServer::url) is
    /// `rediss://127.0.0.1:PORT/`.
    ///
    /// # Panics
    ///
    /// As [`RedisServer::start`]; also if `redis-server` was built without
    /// TLS (it then exits at startup, and the panic shows why).
    pub fn start_tls(certs: &TestCerts) -> RedisServer {
        RedisServer::start_tls_with(certs, &[])
    }

    /// [`start_tls`](RedisServer::start_tls) with extra `redis-server`
    /// command-line configuration, as [`start_with`](RedisServer::start_with).
    ///
    /// # Panics
    ///
    /// As [`RedisServer::start_tls`].
    pub fn start_tls_with(certs: &TestCerts, args: &[&str]) -> RedisServer {
        RedisServer::start_inner(None, args, Some(certs))
    }

    fn start_inner(
        config: Option<String>,
        args: &[&str],
        certs: Option<&TestCerts>,
    ) -> RedisServer {
        let dir = make_temp_dir("breakwater-redis");
        let tls = certs.map(|certs| Tls {
            files: certs.write_server_files(&dir),
            client: certs.client_config(),
        });
        let mut server = RedisServer {
            child: None,
            port: 0,
            dir,
            extra_args: args.iter().map(|&a| a.to_owned()).collect(),
            config,
            tls,
        };
        for _ in 0..START_ATTEMPTS {
            server.port = free_port();
            match server.spawn_and_wait() {
                Ok(()) => return server,
                Err(StartError::Exited(_)) if server.port_was_busy() => {}
                Err(StartError::Exited(status)) => {
                    let tail = server.output_tail();
                    let hint = if tail.contains("failed to execute") {
                        "\nredis-server could not be run: install the Debian package \
                         `redis-server` (`./scripts/test` installs it), put it on PATH, or set \
                         BREAKWATER_REDIS_SERVER to its path."
                    } else {
                        ""
                    };
                    panic!(
                        "redis-server exited with {status} during startup on port {}.\n{tail}{hint}",
                        server.port,
                    );
                }
                Err(StartError::TimedOut) => {
                    let port = server.port;
                    let tail = server.output_tail();
                    server.kill();
                    panic!(
                        "redis-server on port {port} did not answer PING within {READY_TIMEOUT:?}.\n{tail}"
                    );
                }
            }
        }
        panic!(
            "redis-server could not bind a free loopback port after {START_ATTEMPTS} attempts.\n{}",
            server.output_tail()
        );
    }

    /// The TCP port the server listens on (never 6379).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The connection URL, `redis://127.0.0.1:PORT/`, or
    /// `rediss://127.0.0.1:PORT/` for a TLS server.
    pub fn url(&self) -> String {
        let scheme = if self.is_tls() { "rediss" } else { "redis" };
        format!("{scheme}://127.0.0.1:{}/", self.port)
    }

    /// Whether the server listens for TLS ([`RedisServer::start_tls`]).
    pub fn is_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// The socket address, `127.0.0.1:PORT`.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, self.port))
    }

    /// Kills the server with `SIGKILL` (resuming it first if paused) and
    /// reaps it. Does nothing if it is not running; safe to call repeatedly.
    pub fn kill(&mut self) {
        if let Some(child) = self.child.take() {
            kill_and_reap(child);
        }
    }

    /// Kills the server if it is running, then starts a fresh one on the
    /// **same** port with the same extra arguments and waits until it
    /// answers `PING`. Data is not persisted, so the new server is empty.
    ///
    /// If the port is briefly busy, this retries for a few seconds.
    ///
    /// # Panics
    ///
    /// If the server cannot be brought back up on the same port.
    pub fn restart(&mut self) {
        self.kill();
        for _ in 0..RESTART_ATTEMPTS {
            match self.spawn_and_wait() {
                Ok(()) => return,
                Err(StartError::Exited(_)) if self.port_was_busy() => {
                    thread::sleep(Duration::from_millis(100));
                }
                Err(StartError::Exited(status)) => {
                    panic!(
                        "restarted redis-server exited with {status} on port {}.\n{}",
                        self.port,
                        self.output_tail()
                    );
                }
                Err(StartError::TimedOut) => {
                    let tail = self.output_tail();
                    self.kill();
                    panic!(
                        "restarted redis-server on port {} did not answer PING within {READY_TIMEOUT:?}.\n{tail}",
                        self.port
                    );
                }
            }
        }
        panic!(
            "could not restart redis-server on port {}: port stayed busy.\n{}",
            self.port,
            self.output_tail()
        );
    }

    /// Freezes the server with `SIGSTOP`: connections are still accepted by
    /// the kernel but nothing is answered until [`RedisServer::resume`].
    /// Does nothing if the server is not running.
    pub fn pause(&self) {
        self.signal(Signal::SIGSTOP);
    }

    /// Resumes a server frozen by [`RedisServer::pause`] with `SIGCONT`.
    /// Does nothing if the server is not running.
    pub fn resume(&self) {
        self.signal(Signal::SIGCONT);
    }

    /// Whether the server process is alive (a paused server counts as
    /// running).
    pub fn is_running(&mut self) -> bool {
        match self.child.as_mut().map(Child::try_wait) {
            Some(Ok(None)) => true,
            Some(Ok(Some(_)) | Err(_)) | None => false,
        }
    }

    /// Sends one command over a fresh TCP connection and returns the reply
    /// rendered as text, e.g. `command(&["INFO", "commandstats"])`.
    ///
    /// Rendering: simple strings and integers as their text (`"PONG"`,
    /// `"42"`); bulk strings as their contents, a null bulk string as
    /// `"(nil)"`; arrays as their rendered items joined by `'\n'`.
    ///
    /// **Redis error replies are returned as `Ok`**, with the leading `-`
    /// kept (e.g. `Ok("-ERR unknown command ...")`), so tests can assert on
    /// them. `Err` means an I/O or protocol problem: the connection failed,
    /// timed out (5 s for connect, write and read), or the reply was
    /// malformed.
    pub fn command(&self, args: &[&str]) -> io::Result<String> {
        command_at(
            self.addr(),
            self.password(),
            args,
            COMMAND_TIMEOUT,
            self.tls.as_ref().map(|tls| &tls.client),
        )
    }

    /// The password the server was started with (`--requirepass`), which
    /// [`command`](RedisServer::command) sends with `AUTH` first.
    fn password(&self) -> Option<&str> {
        let at = self.extra_args.iter().position(|a| a == "--requirepass")?;
        self.extra_args.get(at + 1).map(String::as_str)
    }

    fn signal(&self, signal: Signal) {
        if let Some(pid) = self.child.as_ref().and_then(pid_of) {
            let _ = kill(pid, signal);
        }
    }

    fn log_path(&self) -> PathBuf {
        self.dir.join("redis.log")
    }

    fn output_path(&self) -> PathBuf {
        self.dir.join("output.log")
    }

    fn config_path(&self) -> PathBuf {
        self.dir.join("redis.conf")
    }

    /// Spawns the process on `self.port` and waits for it to be ready.
    /// On failure the process has been reaped and `self.child` is `None`.
    fn spawn_and_wait(&mut self) -> Result<(), StartError> {
        debug_assert!(self.child.is_none());
        // Start each attempt with fresh logs so `port_was_busy` only sees
        // this attempt's output.
        let _ = fs::remove_file(self.log_path());
        let output = File::create(self.output_path())
            .unwrap_or_else(|e| panic!("cannot create {}: {e}", self.output_path().display()));
        let output_err = output
            .try_clone()
            .unwrap_or_else(|e| panic!("cannot clone output file handle: {e}"));

        if let Some(config) = &self.config {
            fs::write(self.config_path(), config)
                .unwrap_or_else(|e| panic!("cannot write {}: {e}", self.config_path().display()));
        }
        let binary = std::env::var_os(BINARY_ENV).unwrap_or_else(|| "redis-server".into());
        // The server gets SIGKILL when the test process dies, even killed
        // outright (a CI timeout, SIGKILL): see `tied_command`.
        let mut cmd = tied_command(&binary);
        // A configuration file must come first.
        if self.config.is_some() {
            cmd.arg(self.config_path());
        }
        match &self.tls {
            None => cmd.arg("--port").arg(self.port.to_string()),
            Some(Tls { files, .. }) => cmd
                .args(["--port", "0", "--tls-port"])
                .arg(self.port.to_string())
                .arg("--tls-cert-file")
                .arg(&files.cert)
                .arg("--tls-key-file")
                .arg(&files.key)
                .arg("--tls-ca-cert-file")
                .arg(&files.ca),
        };
        cmd.args(["--bind", "127.0.0.1"])
            .args(["--save", ""])
            .args(["--appendonly", "no"])
            .args(["--daemonize", "no"])
            .args(["--protected-mode", "yes"])
            .arg("--dir")
            .arg(&self.dir)
            .arg("--logfile")
            .arg(self.log_path())
            .args(&self.extra_args)
            .stdin(Stdio::null())
            .stdout(output)
            .stderr(output_err);
        let child = match spawn(cmd) {
            Ok(child) => child,
            Err(e) if e.kind() == io::ErrorKind::NotFound => panic!(
                "cannot run redis-server ({}): not found. Install the Debian package \
                 `redis-server` (`./scripts/test` installs it), put `redis-server` on PATH, \
                 or set {BINARY_ENV} to its path.",
                Path::new(&binary).display()
            ),
            Err(e) => panic!(
                "cannot run redis-server ({}): {e}. Set {BINARY_ENV} to a working binary \
                 or install the Debian package `redis-server` (`./scripts/test` installs it).",
                Path::new(&binary).display()
            ),
        };
        self.child = Some(child);

        match self.wait_ready() {
            Ok(()) => Ok(()),
            Err(e) => {
                if let StartError::TimedOut = e {
                    self.kill();
                } else {
                    self.child = None;
                }
                Err(e)
            }
        }
    }

    /// Polls until the child answers `PING` and proves (via `INFO server`)
    /// that it is the process listening on the port, not some other server
    /// that happened to grab it.
    fn wait_ready(&mut self) -> Result<(), StartError> {
        let deadline = Instant::now() + READY_TIMEOUT;
        let poll_timeout = Duration::from_millis(500);
        let addr = SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, self.port));
        let password = self.password().map(str::to_owned);
        let password = password.as_deref();
        let tls = self.tls.as_ref().map(|tls| Arc::clone(&tls.client));
        let tls = tls.as_ref();
        let Some(child) = self.child.as_mut() else {
            return Err(StartError::TimedOut);
        };
        let expected_pid = format!("process_id:{}", child.id());
        loop {
            match child.try_wait() {
                Ok(Some(status)) => return Err(StartError::Exited(status)),
                Ok(None) => {}
                Err(e) => panic!("cannot poll redis-server process: {e}"),
            }
            if command_at(addr, password, &["PING"], poll_timeout, tls).is_ok_and(|r| r == "PONG")
                && command_at(addr, password, &["INFO", "server"], poll_timeout, tls)
                    .is_ok_and(|info| info.lines().any(|l| l.trim() == expected_pid))
            {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(StartError::TimedOut);
            }
            thread::sleep(Duration::from_millis(10));
        }
    }

    /// Whether the last attempt's output says the port was already in use.
    fn port_was_busy(&self) -> bool {
        let text = self.read_output();
        text.contains("Address already in use")
            || text.contains("Could not create server TCP listening socket")
    }

    fn read_output(&self) -> String {
        let mut text = fs::read_to_string(self.output_path()).unwrap_or_default();
        text.push_str(&fs::read_to_string(self.log_path()).unwrap_or_default());
        text
    }

    /// The last lines of the server's output and log, for panic messages.
    fn output_tail(&self) -> String {
        let text = self.read_output();
        let lines: Vec<&str> = text.lines().collect();
        let tail = lines[lines.len().saturating_sub(30)..].join("\n");
        format!(
            "--- redis-server output (last lines, dir {}) ---\n{tail}",
            self.dir.display()
        )
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// Sends one command to `addr` over a fresh connection (TLS with `tls`;
/// after `AUTH password`, if given) and reads one reply.
fn command_at(
    addr: SocketAddr,
    password: Option<&str>,
    args: &[&str],
    timeout: Duration,
    tls: Option<&Arc<rustls::ClientConfig>>,
) -> io::Result<String> {
    let stream = TcpStream::connect_timeout(&addr, timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    stream.set_nodelay(true)?;
    match tls {
        None => exchange(BufReader::new(stream), password, args),
        Some(config) => exchange(
            BufReader::new(tls::connect(config, stream)?),
            password,
            args,
        ),
    }
}

/// `AUTH password` (if given), then one command on `conn`, reading one
/// reply to each.
fn exchange<S: Read + Write>(
    mut conn: BufReader<S>,
    password: Option<&str>,
    args: &[&str],
) -> io::Result<String> {
    if let Some(password) = password {
        resp::write_command(conn.get_mut(), &["AUTH", password])?;
        let auth = resp::read_reply(&mut conn)?;
        if auth != "OK" {
            return Err(io::Error::other(format!("AUTH was refused: {auth}")));
        }
    }
    resp::write_command(conn.get_mut(), args)?;
    resp::read_reply(&mut conn)
}
