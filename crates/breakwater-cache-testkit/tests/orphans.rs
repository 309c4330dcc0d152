//! A test process killed outright (SIGKILL, as a CI timeout does) leaves no
//! `redis-server` behind: the server dies with the thread that started it.
//!
//! The test re-runs its own binary as the "test process" to be killed.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use breakwater_cache_testkit::RedisServer;
use nix::sys::signal::kill;
use nix::unistd::Pid;

const CHILD: &str = "BREAKWATER_TESTKIT_ORPHAN_CHILD";

/// In the child: start a server, print its pid, and wait to be killed.
#[test]
fn child_holds_a_server_until_killed() {
    if std::env::var_os(CHILD).is_none() {
        return; // only meaningful when run by the test below
    }
    let server = RedisServer::start();
    let info = server.command(&["INFO", "server"]).unwrap();
    let pid = info
        .lines()
        .find_map(|l| l.trim().strip_prefix("process_id:"))
        .unwrap();
    let dir = server.command(&["CONFIG", "GET", "dir"]).unwrap();
    println!("server-dir {}", dir.lines().nth(1).unwrap());
    println!("server-pid {pid}");
    thread::sleep(Duration::from_secs(60));
}

#[test]
fn a_killed_test_process_takes_its_server_with_it() {
    if std::env::var_os(CHILD).is_some() {
        return;
    }
    if Command::new("setpriv").arg("--help").output().is_err() {
        eprintln!("setpriv is not installed; nothing to check");
        return;
    }
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_holds_a_server_until_killed",
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
            "redis-server {pid} outlived its test process"
        );
        thread::sleep(Duration::from_millis(20));
    }
    // The killed process could not remove its server's directory.
    assert!(dir.contains("breakwater-redis-"), "{dir}");
    std::fs::remove_dir_all(&dir).unwrap();
}
