//! `breakwater soak`, the short run CI makes: a fleet of worker processes
//! on a private `redis-server` the soak starts itself, with every nemesis
//! action on, and not one read that contradicts an acknowledged
//! announcement.

use std::process::Command;

use breakwater_cache_testkit::tied_command;

fn soak(args: &[&str]) -> (bool, String, String) {
    let mut cmd: Command = tied_command(env!("CARGO_BIN_EXE_breakwater"));
    let out = cmd
        .arg("soak")
        .args(args)
        .output()
        .expect("run breakwater soak");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_short_soak_with_every_nemesis_action_finds_no_violation() {
    let (ok, stdout, stderr) = soak(&["--duration", "75s", "--seed", "55", "--processes", "3"]);
    assert!(ok, "soak failed:\n{stdout}\n{stderr}");
    assert!(stdout.contains("violations: 0 "), "{stdout}");
    let nemesis = stdout
        .lines()
        .rev()
        .find(|l| l.starts_with("nemesis: "))
        .expect("a nemesis line");
    for action in [
        "kill", "stall", "restart", "evict", "delete", "pubsub", "db-down",
    ] {
        assert!(
            nemesis.contains(&format!("{action} ")),
            "{action} never ran: {nemesis}"
        );
    }
    let checked: u64 = stdout
        .lines()
        .find_map(|l| l.strip_prefix("reads checked: "))
        .and_then(|l| l.split(' ').next())
        .and_then(|n| n.parse().ok())
        .expect("a count of reads checked");
    assert!(checked > 10_000, "only {checked} reads checked:\n{stdout}");
}

#[test]
fn a_redis_given_by_url_must_be_declared_disposable() {
    let (ok, _, stderr) = soak(&["--redis", "redis://127.0.0.1:1", "--duration", "1s"]);
    assert!(!ok);
    assert!(stderr.contains("--disposable"), "{stderr}");
}
