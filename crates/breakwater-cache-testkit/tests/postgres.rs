//! Tests that start real PostgreSQL servers.

use std::io::{BufRead, BufReader};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use breakwater_cache_testkit::{PostgresServer, Statement, TiedChild, tied_command};
use nix::sys::signal::kill;
use nix::unistd::Pid;

const CHILD: &str = "BREAKWATER_TESTKIT_POSTGRES_ORPHAN_CHILD";

#[test]
fn start_serves_queries_and_logs_them() {
    let pg = PostgresServer::start();
    assert_ne!(pg.port(), 5432);
    assert!(pg.addr().ip().is_loopback());
    assert_eq!(
        pg.url(),
        format!("postgres://postgres@127.0.0.1:{}/postgres", pg.port())
    );
    assert_eq!(pg.psql("SELECT 40 + 2").unwrap(), "42");
    pg.psql("CREATE TABLE t (id int primary key, v text)")
        .unwrap();
    pg.psql("INSERT INTO t VALUES (1, 'a'), (2, 'b')").unwrap();
    assert_eq!(pg.psql("SELECT v FROM t ORDER BY id").unwrap(), "a\nb");

    let logged: Vec<Statement> = pg.statements();
    let texts: Vec<&str> = logged.iter().map(|s| s.sql.as_str()).collect();
    assert!(texts.contains(&"SELECT 40 + 2"), "{texts:?}");
    assert!(texts.contains(&"SELECT v FROM t ORDER BY id"), "{texts:?}");
    assert!(logged.iter().all(|s| s.pid > 0 && s.parameters.is_none()));

    let err = pg.psql("SELECT * FROM missing").unwrap_err();
    assert!(err.to_string().contains("does not exist"), "{err}");
}

#[test]
fn stop_ends_the_server_and_drop_removes_its_directory() {
    let mut pg = PostgresServer::start();
    let addr = pg.addr();
    let log = pg.log_path();
    let dir = log.parent().unwrap().to_path_buf();
    assert!(TcpStream::connect(addr).is_ok());
    pg.stop();
    assert!(
        pg.log().contains("database system is shut down"),
        "{}",
        pg.log()
    );
    assert!(
        TcpStream::connect(addr).is_err(),
        "nothing listens any more"
    );
    pg.stop(); // again: nothing to do
    drop(pg);
    assert!(!dir.exists(), "{} was removed", dir.display());
}

#[test]
fn two_servers_run_side_by_side() {
    let a = PostgresServer::start();
    let b = PostgresServer::start();
    assert_ne!(a.port(), b.port());
    a.psql("CREATE TABLE only_in_a (x int)").unwrap();
    assert!(b.psql("SELECT * FROM only_in_a").is_err());
}

#[test]
fn a_tied_child_is_killed_on_drop() {
    let mut cmd = tied_command("sleep");
    cmd.arg("60");
    let mut child = TiedChild::spawn(cmd).unwrap();
    let pid = Pid::from_raw(i32::try_from(child.id().unwrap()).unwrap());
    assert!(child.try_wait().unwrap().is_none());
    drop(child);
    assert!(kill(pid, None).is_err(), "sleep {pid} outlived its handle");
}

/// In the child: start a server, print its pid and directory, and wait to
/// be killed.
#[test]
fn child_holds_a_postgres_until_killed() {
    if std::env::var_os(CHILD).is_none() {
        return; // only meaningful when run by the test below
    }
    let pg = PostgresServer::start();
    let data = pg.psql("SHOW data_directory").unwrap();
    let postmaster = std::fs::read_to_string(Path::new(&data).join("postmaster.pid")).unwrap();
    println!("server-dir {}", pg.log_path().parent().unwrap().display());
    println!("server-pid {}", postmaster.lines().next().unwrap());
    thread::sleep(Duration::from_secs(60));
}

#[test]
fn a_killed_test_process_takes_its_postgres_with_it() {
    if std::env::var_os(CHILD).is_some() {
        return;
    }
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_holds_a_postgres_until_killed",
            "--nocapture",
        ])
        .env(CHILD, "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap())
        .lines()
        .map_while(Result::ok);
    let dir = lines
        .find_map(|l| l.strip_prefix("server-dir ").map(str::to_owned))
        .expect("the child printed its server's directory");
    let pid: i32 = lines
        .find_map(|l| {
            l.strip_prefix("server-pid ")
                .map(|p| p.trim().parse().unwrap())
        })
        .expect("the child printed its server's pid");
    let server = Pid::from_raw(pid);
    assert!(kill(server, None).is_ok(), "the server runs");

    child.kill().unwrap(); // SIGKILL: no destructor runs
    child.wait().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while kill(server, None).is_ok() {
        assert!(
            Instant::now() < deadline,
            "postgres {pid} outlived its test process"
        );
        thread::sleep(Duration::from_millis(20));
    }
    // The killed process could not remove its server's directory.
    assert!(dir.contains("breakwater-postgres-"), "{dir}");
    std::fs::remove_dir_all(&dir).unwrap();
}
