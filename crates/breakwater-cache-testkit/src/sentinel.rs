//! A private Redis Sentinel setup for one test: a master, one replica, and
//! one or more sentinels watching them.

use std::thread;
use std::time::{Duration, Instant};

use crate::server::RedisServer;

/// The name the sentinels monitor the master under.
const MASTER_NAME: &str = "breakwater";
/// `down-after-milliseconds`: short, so a killed master is failed over
/// within a few seconds, yet long enough that a busy machine does not make
/// the sentinels suspect a live one.
const DOWN_AFTER_MS: u32 = 1000;
/// `failover-timeout`: also the pause (twice this) before the sentinels
/// try to fail the same master over again.
const FAILOVER_TIMEOUT_MS: u32 = 3000;
/// How long the setup gets to come up (replica synced, sentinels aware of
/// the replica and of each other).
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// How to start a [`RedisSentinel`].
///
/// The default: one sentinel, no passwords.
#[derive(Debug, Clone)]
pub struct SentinelSetup {
    /// How many sentinels watch the master (at least one); the quorum is a
    /// majority of them.
    pub sentinels: usize,
    /// The password of the master and the replica (`requirepass`, and
    /// `masterauth` so the replica and a demoted master can sync); the
    /// sentinels are told it with `sentinel auth-pass`.
    pub password: Option<String>,
    /// The sentinels' own password (`requirepass` on each sentinel, and
    /// `sentinel sentinel-pass` so they can talk to each other).
    pub sentinel_password: Option<String>,
}

impl Default for SentinelSetup {
    fn default() -> Self {
        SentinelSetup {
            sentinels: 1,
            password: None,
            sentinel_password: None,
        }
    }
}

/// A private Redis Sentinel setup on loopback: node 0 started as the
/// master, node 1 as its replica (`--replicaof`), and sentinels that
/// monitor node 0 under [`master_name`](RedisSentinel::master_name) with a
/// 1 s `down-after-milliseconds`, so a killed master is replaced within a
/// few seconds.
///
/// Every process is a [`RedisServer`] (own port, own directory, no
/// persistence; a sentinel's configuration file lives in its directory),
/// killed when the value is dropped, also while a panicking test unwinds,
/// and with the test process itself when that is killed.
///
/// ```no_run
/// use std::time::Duration;
/// use breakwater_cache_testkit::RedisSentinel;
///
/// let mut setup = RedisSentinel::start();
/// let sentinels = setup.sentinel_urls(); // "redis://127.0.0.1:PORT/"
/// assert_eq!(setup.named_master(), Some(0));
/// setup.failover(); // SENTINEL FAILOVER: node 1 is promoted
/// setup.wait_for_master(1, Duration::from_secs(20));
/// # let _ = sentinels;
/// ```
#[derive(Debug)]
pub struct RedisSentinel {
    nodes: Vec<RedisServer>,
    sentinels: Vec<RedisServer>,
    setup: SentinelSetup,
}

impl RedisSentinel {
    /// Starts a master, a replica and one sentinel, and waits until the
    /// replica has synced and the sentinel knows it (ready to fail over).
    ///
    /// # Panics
    ///
    /// As [`RedisServer::start`] for each process; also if the setup is not
    /// ready within 30 seconds.
    pub fn start() -> RedisSentinel {
        RedisSentinel::start_with(SentinelSetup::default())
    }

    /// Like [`start`](RedisSentinel::start), as `setup` says; with several
    /// sentinels, also waits until each knows the others.
    ///
    /// # Panics
    ///
    /// As [`start`](RedisSentinel::start); also if `setup.sentinels` is 0.
    pub fn start_with(setup: SentinelSetup) -> RedisSentinel {
        assert!(setup.sentinels > 0, "a sentinel setup needs a sentinel");
        let master = start_node(&setup, None);
        let replica = start_node(&setup, Some(master.port()));
        let quorum = setup.sentinels / 2 + 1;
        let mut config = format!(
            "sentinel monitor {MASTER_NAME} 127.0.0.1 {} {quorum}\n\
             sentinel down-after-milliseconds {MASTER_NAME} {DOWN_AFTER_MS}\n\
             sentinel failover-timeout {MASTER_NAME} {FAILOVER_TIMEOUT_MS}\n",
            master.port()
        );
        if let Some(password) = &setup.password {
            config.push_str(&format!("sentinel auth-pass {MASTER_NAME} {password}\n"));
        }
        let mut args = vec!["--sentinel"];
        if let Some(password) = &setup.sentinel_password {
            config.push_str(&format!("sentinel sentinel-pass {password}\n"));
            args.extend(["--requirepass", password]);
        }
        let sentinels = (0..setup.sentinels)
            .map(|_| RedisServer::start_with_config(&config, &args))
            .collect();
        let setup = RedisSentinel {
            nodes: vec![master, replica],
            sentinels,
            setup,
        };
        setup.wait_ready();
        setup
    }

    /// The name the sentinels know the master by.
    pub fn master_name(&self) -> &str {
        MASTER_NAME
    }

    /// Every sentinel's URL, `redis://127.0.0.1:PORT/` (with the sentinels'
    /// password, if they have one).
    pub fn sentinel_urls(&self) -> Vec<String> {
        self.sentinels
            .iter()
            .map(|s| match &self.setup.sentinel_password {
                Some(password) => format!("redis://:{password}@127.0.0.1:{}/", s.port()),
                None => s.url(),
            })
            .collect()
    }

    /// The two data nodes: 0 started as the master, 1 as its replica.
    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }

    /// Mutable access to data node `index`, e.g. to kill or pause it.
    ///
    /// # Panics
    ///
    /// If `index` is not 0 or 1.
    pub fn node_mut(&mut self, index: usize) -> &mut RedisServer {
        &mut self.nodes[index]
    }

    /// The sentinel processes.
    pub fn sentinels(&self) -> &[RedisServer] {
        &self.sentinels
    }

    /// Mutable access to sentinel `index`, e.g. to kill it.
    ///
    /// # Panics
    ///
    /// If there is no sentinel `index`.
    pub fn sentinel_mut(&mut self, index: usize) -> &mut RedisServer {
        &mut self.sentinels[index]
    }

    /// The data node that the first answering sentinel names as the master
    /// (`SENTINEL GET-MASTER-ADDR-BY-NAME`), if any.
    pub fn named_master(&self) -> Option<usize> {
        self.sentinels.iter().find_map(|s| self.named_by(s))
    }

    /// Starts a failover with `SENTINEL FAILOVER` (no agreement needed): the
    /// replica is promoted while the master is still up; the sentinels
    /// demote the old master (`REPLICAOF`, and its clients are
    /// disconnected) only once they see it again, some seconds later.
    ///
    /// # Panics
    ///
    /// If the first sentinel refuses (e.g. a failover is in progress).
    pub fn failover(&self) {
        let reply = self.sentinels[0]
            .command(&["SENTINEL", "FAILOVER", MASTER_NAME])
            .unwrap_or_else(|e| panic!("SENTINEL FAILOVER: {e}"));
        assert_eq!(reply, "OK", "SENTINEL FAILOVER");
    }

    /// Kills (`SIGKILL`) the data node the sentinels name as the master and
    /// returns its index; the sentinels promote the other one after
    /// `down-after-milliseconds` (1 s) and an election.
    ///
    /// # Panics
    ///
    /// If no sentinel names a master.
    pub fn kill_master(&mut self) -> usize {
        let index = self.named_master().expect("no sentinel names a master");
        self.nodes[index].kill();
        index
    }

    /// Waits until every running sentinel names data node `index` as the
    /// master and that node reports `role:master`.
    ///
    /// # Panics
    ///
    /// If that does not happen within `timeout` (the message shows what
    /// each sentinel and node says).
    pub fn wait_for_master(&mut self, index: usize, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            let port = self.nodes[index].port();
            let mut named = true;
            for at in 0..self.sentinels.len() {
                if self.sentinels[at].is_running() {
                    named &= self.named_by_port(&self.sentinels[at]) == Some(port);
                }
            }
            if named && self.nodes[index].is_running() && role(&self.nodes[index]) == "master" {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "node {index} did not become the named master within {timeout:?}: {}",
                self.describe()
            );
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits until data node `index` is a replica whose link to the master
    /// the sentinels name is up (`master_link_status:up`).
    ///
    /// # Panics
    ///
    /// If that does not happen within `timeout`.
    pub fn wait_for_replica(&mut self, index: usize, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            let master = self.named_master().map(|m| self.nodes[m].port());
            let info = self.nodes[index]
                .command(&["INFO", "replication"])
                .unwrap_or_default();
            let line = |l: &str| info.lines().any(|x| x.trim() == l);
            if let Some(port) = master
                && line("role:slave")
                && line(&format!("master_port:{port}"))
                && line("master_link_status:up")
            {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "node {index} did not become a synced replica within {timeout:?}: {}",
                self.describe()
            );
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// The node a sentinel names as the master.
    fn named_by(&self, sentinel: &RedisServer) -> Option<usize> {
        let port = self.named_by_port(sentinel)?;
        self.nodes.iter().position(|n| n.port() == port)
    }

    /// The port a sentinel names for the master.
    fn named_by_port(&self, sentinel: &RedisServer) -> Option<u16> {
        let reply = sentinel
            .command(&["SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER_NAME])
            .ok()?;
        reply.lines().nth(1)?.parse().ok()
    }

    /// Waits until the replica has synced and every sentinel knows the
    /// master, its replica (in a good state to be promoted) and the other
    /// sentinels.
    fn wait_ready(&self) {
        let deadline = Instant::now() + READY_TIMEOUT;
        let others = (self.sentinels.len() - 1).to_string();
        loop {
            let synced = self.nodes[1]
                .command(&["INFO", "replication"])
                .is_ok_and(|info| info.lines().any(|l| l.trim() == "master_link_status:up"));
            let aware = self.sentinels.iter().all(|s| {
                let master = fields(s, &["SENTINEL", "MASTER", MASTER_NAME]);
                let replica = fields(s, &["SENTINEL", "REPLICAS", MASTER_NAME]);
                field(&master, "flags") == Some("master")
                    && field(&master, "num-slaves") == Some("1")
                    && field(&master, "num-other-sentinels") == Some(&others)
                    && field(&replica, "flags") == Some("slave")
                    && field(&replica, "master-link-status") == Some("ok")
            });
            if synced && aware {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the sentinel setup was not ready within {READY_TIMEOUT:?}: {}",
                self.describe()
            );
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// What each sentinel and data node says, for panic messages.
    fn describe(&self) -> String {
        let sentinels: Vec<_> = self
            .sentinels
            .iter()
            .map(|s| {
                (
                    s.port(),
                    s.command(&["SENTINEL", "MASTER", MASTER_NAME])
                        .map(|r| r.replace('\n', " ")),
                )
            })
            .collect();
        let nodes: Vec<_> = self
            .nodes
            .iter()
            .map(|n| (n.port(), n.command(&["ROLE"]).map(|r| r.replace('\n', " "))))
            .collect();
        format!("sentinels {sentinels:?}; nodes {nodes:?}")
    }
}

/// A data node: no delay and no disk for a replica's sync, so a replica
/// (or a demoted master) catches up at once.
fn start_node(setup: &SentinelSetup, replica_of: Option<u16>) -> RedisServer {
    let mut args = vec![
        "--repl-diskless-sync".to_owned(),
        "yes".to_owned(),
        "--repl-diskless-sync-delay".to_owned(),
        "0".to_owned(),
    ];
    if let Some(password) = &setup.password {
        args.extend(["--requirepass", password, "--masterauth", password].map(str::to_owned));
    }
    if let Some(port) = replica_of {
        args.extend([
            "--replicaof".to_owned(),
            "127.0.0.1".to_owned(),
            port.to_string(),
        ]);
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    RedisServer::start_with(&args)
}

/// `role` from a node's `ROLE` reply (its first line), or `""`.
fn role(node: &RedisServer) -> String {
    node.command(&["ROLE"])
        .ok()
        .and_then(|r| r.lines().next().map(str::to_owned))
        .unwrap_or_default()
}

/// A reply of alternating field names and values, one per line (a nested
/// reply is flattened the same way).
fn fields(server: &RedisServer, args: &[&str]) -> Vec<String> {
    server
        .command(args)
        .map(|r| r.lines().map(str::to_owned).collect())
        .unwrap_or_default()
}

/// The value after the first line equal to `name`.
fn field<'a>(lines: &'a [String], name: &str) -> Option<&'a str> {
    let at = lines.iter().position(|l| l == name)?;
    lines.get(at + 1).map(String::as_str)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_are_read_by_name() {
        let lines: Vec<String> = ["name", "breakwater", "flags", "master", "num-slaves", "1"]
            .map(str::to_owned)
            .to_vec();
        assert_eq!(field(&lines, "flags"), Some("master"));
        assert_eq!(field(&lines, "num-slaves"), Some("1"));
        assert_eq!(field(&lines, "missing"), None);
    }
}
