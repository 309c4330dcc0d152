//! A private Redis Cluster for one test: three primaries, optionally with
//! replicas that take over when a primary dies.

use std::thread;
use std::time::{Duration, Instant};

use crate::process::free_port;
use crate::server::RedisServer;
use crate::tls::TestCerts;

/// Hash slots in a Redis Cluster.
const SLOTS: u16 = 16_384;
/// Primaries (shards) in every cluster.
const SHARDS: usize = 3;
/// How long the nodes get to agree that the cluster is up.
const FORM_TIMEOUT: Duration = Duration::from_secs(30);
/// `cluster-node-timeout` of a cluster without replicas.
const NODE_TIMEOUT_MS: u32 = 5000;
/// `cluster-node-timeout` of a cluster with replicas: short, so a replica
/// takes over a dead primary within a few seconds, yet long enough that a
/// busy machine does not make the nodes suspect each other.
const FAILOVER_NODE_TIMEOUT_MS: u32 = 1500;

/// Private `redis-server` processes in cluster mode on loopback: three
/// primaries, each serving a third of the hash slots, formed with
/// `CLUSTER ADDSLOTSRANGE` and `CLUSTER MEET`; with
/// [`start_with_replicas`](RedisCluster::start_with_replicas), also replicas
/// of each primary (`CLUSTER REPLICATE`), ready to take over.
///
/// Each node is a [`RedisServer`] (own port, own directory, no persistence
/// except the node's `nodes.conf`), so a node can be killed, restarted (it
/// rejoins with its slots) or paused. Dropping the cluster stops every node.
///
/// Nodes are numbered primaries first: node `i < 3` is the primary that
/// served shard `i` (the `i`-th third of the slots) when the cluster was
/// formed, and the replicas follow, shard by shard
/// ([`replicas_of`](RedisCluster::replicas_of)).
///
/// ```no_run
/// use breakwater_cache_testkit::RedisCluster;
///
/// let cluster = RedisCluster::start();
/// let urls = cluster.urls(); // one "redis://127.0.0.1:PORT/" per node
/// assert_eq!(urls.len(), 3);
/// ```
///
/// A failover, the automatic way (no `CLUSTER FAILOVER`):
///
/// ```no_run
/// use std::time::Duration;
/// use breakwater_cache_testkit::RedisCluster;
///
/// let mut cluster = RedisCluster::start_with_replicas(1);
/// assert_eq!(cluster.urls().len(), 6);
/// let dead = cluster.kill_primary(0);
/// let promoted = cluster.wait_for_promotion(0, Duration::from_secs(30));
/// assert_ne!(dead, promoted);
/// assert_eq!(cluster.primary_of(0), Some(promoted));
/// ```
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
    /// Each node's cluster-bus port, as it was started.
    buses: Vec<u16>,
    /// Replicas per primary.
    replicas: usize,
}

impl RedisCluster {
    /// Starts three nodes and waits until every one of them reports
    /// `cluster_state:ok` with all 16,384 slots assigned.
    ///
    /// # Panics
    ///
    /// As [`RedisServer::start`] for each node; also if the nodes do not
    /// agree on a healthy cluster within 30 seconds.
    pub fn start() -> RedisCluster {
        Self::start_nodes(0, NODE_TIMEOUT_MS, None)
    }

    /// Like [`start`](RedisCluster::start), every node listening for TLS
    /// only ([`RedisServer::start_tls`]) with `certs`, the cluster bus over
    /// TLS too (`tls-cluster yes`): [`urls`](RedisCluster::urls) are
    /// `rediss://…`, and a client connected over TLS is told the nodes' TLS
    /// ports.
    ///
    /// # Panics
    ///
    /// As [`start`](RedisCluster::start).
    pub fn start_tls(certs: &TestCerts) -> RedisCluster {
        Self::start_nodes(0, NODE_TIMEOUT_MS, Some(certs))
    }

    /// Starts three primaries and `replicas_per_primary` replicas of each,
    /// and waits until every node reports `cluster_state:ok` with all
    /// 16,384 slots assigned and every replica reports its link to its
    /// primary up (`master_link_status:up`).
    ///
    /// The nodes run with a `cluster-node-timeout` of 1.5 s, so when a
    /// primary dies one of its replicas is promoted automatically within a
    /// few seconds ([`kill_primary`](RedisCluster::kill_primary),
    /// [`wait_for_promotion`](RedisCluster::wait_for_promotion)), and
    /// replicate without a disk and without delay.
    ///
    /// # Panics
    ///
    /// As [`RedisServer::start`] for each node; also if the cluster does
    /// not form, or a replica does not sync, within 30 seconds.
    pub fn start_with_replicas(replicas_per_primary: usize) -> RedisCluster {
        Self::start_nodes(replicas_per_primary, FAILOVER_NODE_TIMEOUT_MS, None)
    }

    fn start_nodes(
        replicas: usize,
        node_timeout_ms: u32,
        certs: Option<&TestCerts>,
    ) -> RedisCluster {
        let count = SHARDS * (1 + replicas);
        let (nodes, buses) = (0..count)
            .map(|_| start_node(node_timeout_ms, certs))
            .unzip();
        let cluster = RedisCluster {
            nodes,
            buses,
            replicas,
        };
        cluster.form();
        cluster
    }

    /// Every node: the three primaries as formed, then the replicas.
    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }

    /// Mutable access to one node, e.g. to kill or pause it.
    ///
    /// # Panics
    ///
    /// If there is no node `index` (0, 1 or 2 without replicas).
    pub fn node_mut(&mut self, index: usize) -> &mut RedisServer {
        &mut self.nodes[index]
    }

    /// Every node's URL (replicas' too): the seed list for a cluster client.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// The indexes (into [`nodes`](RedisCluster::nodes)) of the nodes
    /// started as replicas of shard `shard`'s primary; empty without
    /// replicas.
    ///
    /// # Panics
    ///
    /// If `shard` is not 0, 1 or 2.
    pub fn replicas_of(&self, shard: usize) -> Vec<usize> {
        assert!(
            shard < SHARDS,
            "a cluster has shards 0, 1 and 2, not {shard}"
        );
        let first = SHARDS + shard * self.replicas;
        (first..first + self.replicas).collect()
    }

    /// The shard (0, 1 or 2) that node `index` was started in.
    ///
    /// # Panics
    ///
    /// If there is no node `index`.
    pub fn shard_of_node(&self, index: usize) -> usize {
        assert!(index < self.nodes.len(), "no node {index}");
        if index < SHARDS {
            index
        } else {
            (index - SHARDS) / self.replicas
        }
    }

    /// The node of shard `shard` that is running and reports `role:master`
    /// now (the original primary, or a promoted replica), if any.
    ///
    /// # Panics
    ///
    /// If `shard` is not 0, 1 or 2.
    pub fn primary_of(&mut self, shard: usize) -> Option<usize> {
        let members = std::iter::once(shard).chain(self.replicas_of(shard));
        members.into_iter().find(|&index| {
            let node = &mut self.nodes[index];
            node.is_running()
                && node
                    .command(&["INFO", "replication"])
                    .is_ok_and(|info| info.lines().any(|l| l.trim() == "role:master"))
        })
    }

    /// Kills (`SIGKILL`) the current primary of shard `shard` and returns
    /// its index. Its replicas notice after the node timeout and one of
    /// them is promoted: see
    /// [`wait_for_promotion`](RedisCluster::wait_for_promotion).
    ///
    /// # Panics
    ///
    /// If the shard has no running primary.
    pub fn kill_primary(&mut self, shard: usize) -> usize {
        let index = self
            .primary_of(shard)
            .unwrap_or_else(|| panic!("shard {shard} has no running primary"));
        self.nodes[index].kill();
        index
    }

    /// Waits until a running replica of shard `shard` reports `role:master`,
    /// owns the shard's slots, and every running node reports
    /// `cluster_state:ok`; returns the promoted node's index.
    ///
    /// # Panics
    ///
    /// If that does not happen within `timeout` (the message shows each
    /// running node's `CLUSTER INFO`).
    pub fn wait_for_promotion(&mut self, shard: usize, timeout: Duration) -> usize {
        let deadline = Instant::now() + timeout;
        let (first, _) = ranges()[shard];
        loop {
            let promoted = self.replicas_of(shard).into_iter().find(|&index| {
                let node = &mut self.nodes[index];
                node.is_running()
                    && node
                        .command(&["INFO", "replication"])
                        .is_ok_and(|info| info.lines().any(|l| l.trim() == "role:master"))
                    && owns_slot(node, first)
            });
            if let Some(index) = promoted
                && self.running_nodes_agree_cluster_is_ok()
            {
                return index;
            }
            assert!(
                Instant::now() < deadline,
                "no replica of shard {shard} was promoted within {timeout:?}: {:?}",
                self.nodes
                    .iter()
                    .map(|n| (n.port(), n.command(&["CLUSTER", "INFO"])))
                    .collect::<Vec<_>>()
            );
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// Whether every running node reports `cluster_state:ok`.
    fn running_nodes_agree_cluster_is_ok(&mut self) -> bool {
        self.nodes.iter_mut().all(|node| {
            !node.is_running()
                || node
                    .command(&["CLUSTER", "INFO"])
                    .is_ok_and(|info| info.contains("cluster_state:ok"))
        })
    }

    /// The index of the primary that served `key`'s hash slot when the
    /// cluster was formed (its shard's number).
    ///
    /// # Panics
    ///
    /// If no node answers `CLUSTER KEYSLOT`.
    pub fn node_of(&self, key: &str) -> usize {
        let reply = self
            .nodes
            .iter()
            .find_map(|node| node.command(&["CLUSTER", "KEYSLOT", key]).ok())
            .unwrap_or_else(|| panic!("no node answered CLUSTER KEYSLOT {key:?}"));
        let slot: u16 = reply
            .parse()
            .unwrap_or_else(|e| panic!("CLUSTER KEYSLOT replied {reply:?}: {e}"));
        let (index, _) = ranges()
            .into_iter()
            .enumerate()
            .find(|(_, (first, last))| (*first..=*last).contains(&slot))
            .unwrap_or_else(|| panic!("slot {slot} out of range"));
        index
    }

    /// Hands the empty hash slot `slot` to the primary of shard `to`, as a
    /// resharding does (`CLUSTER SETSLOT … NODE` on every primary, the new
    /// owner first, its config epoch bumped), and waits until every node
    /// names the new owner for it. For a cluster whose nodes all run and
    /// whose primaries are still the ones it was formed with;
    /// [`node_of`](Self::node_of) still answers with the formed layout.
    ///
    /// # Panics
    ///
    /// If the slot holds keys, a node refuses, or the nodes do not agree
    /// within the formation timeout.
    pub fn hand_slot(&self, slot: u16, to: usize) {
        let slot_arg = slot.to_string();
        let target = &self.nodes[to];
        let id = target
            .command(&["CLUSTER", "MYID"])
            .unwrap_or_else(|e| panic!("CLUSTER MYID on port {}: {e}", target.port()));
        // The new owner's claim must win over gossip that the old owner
        // sends before it is told: a config epoch above every other.
        if let Err(e) = target.command(&["CLUSTER", "BUMPEPOCH"]) {
            panic!("CLUSTER BUMPEPOCH on port {}: {e}", target.port());
        }
        let primaries = &self.nodes[..SHARDS];
        let order = std::iter::once(to).chain((0..SHARDS).filter(|&s| s != to));
        for shard in order {
            expect_ok(
                &primaries[shard],
                &["CLUSTER", "SETSLOT", &slot_arg, "NODE", &id],
            );
        }
        // Handed over once every node names the new owner for it (a
        // `CLUSTER SLOTS` asked of any node then tells the new layout).
        let deadline = Instant::now() + FORM_TIMEOUT;
        while !self
            .nodes
            .iter()
            .all(|node| slot_owner(node, slot).is_some_and(|(owner, _)| owner == id))
        {
            assert!(Instant::now() < deadline, "slot {slot} was not handed over");
            thread::sleep(Duration::from_millis(20));
        }
    }

    fn form(&self) {
        let primaries = &self.nodes[..SHARDS];
        for (node, (first, last)) in primaries.iter().zip(ranges()) {
            let (first, last) = (first.to_string(), last.to_string());
            expect_ok(node, &["CLUSTER", "ADDSLOTSRANGE", &first, &last]);
        }
        let seed = &self.nodes[0];
        for (other, bus) in self.nodes.iter().zip(&self.buses).skip(1) {
            let (port, bus) = (other.port().to_string(), bus.to_string());
            expect_ok(seed, &["CLUSTER", "MEET", "127.0.0.1", &port, &bus]);
        }
        let deadline = Instant::now() + FORM_TIMEOUT;
        let known = format!("cluster_known_nodes:{}", self.nodes.len());
        for shard in 0..SHARDS {
            let primary = &self.nodes[shard];
            let id = primary
                .command(&["CLUSTER", "MYID"])
                .unwrap_or_else(|e| panic!("CLUSTER MYID on port {}: {e}", primary.port()));
            for index in self.replicas_of(shard) {
                // A replica can follow a primary only once gossip has told
                // it about that node: retry until it knows it.
                let replica = &self.nodes[index];
                loop {
                    match replica.command(&["CLUSTER", "REPLICATE", &id]) {
                        Ok(reply) if reply == "OK" => break,
                        other => assert!(
                            Instant::now() < deadline,
                            "CLUSTER REPLICATE {id} on port {}: {other:?}",
                            replica.port()
                        ),
                    }
                    thread::sleep(Duration::from_millis(20));
                }
            }
        }
        loop {
            let healthy = self.nodes.iter().all(|node| {
                node.command(&["CLUSTER", "INFO"]).is_ok_and(|info| {
                    info.contains("cluster_state:ok")
                        && info.contains("cluster_slots_assigned:16384")
                        && info.contains(&known)
                })
            });
            let synced = self.nodes[SHARDS..].iter().all(|replica| {
                replica
                    .command(&["INFO", "replication"])
                    .is_ok_and(|info| info.lines().any(|l| l.trim() == "master_link_status:up"))
            });
            if healthy && synced {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the cluster did not form within {FORM_TIMEOUT:?}: {:?}",
                self.nodes
                    .iter()
                    .map(|n| (
                        n.command(&["CLUSTER", "INFO"]),
                        n.command(&["INFO", "replication"])
                    ))
                    .collect::<Vec<_>>()
            );
            thread::sleep(Duration::from_millis(20));
        }
    }
}

/// One node and its bus port: cluster mode, the bus on a port of its own
/// (the default, port + 10,000, can lie past 65,535 for a high ephemeral
/// port). A replica syncs over the socket at once (no RDB file, no 5 s
/// wait for other replicas), and may take over however long its primary
/// has been gone (validity factor 0). With `certs`, the node listens for
/// TLS only, and its bus and replication links use TLS too.
fn start_node(node_timeout_ms: u32, certs: Option<&TestCerts>) -> (RedisServer, u16) {
    let bus = free_port();
    let (node_timeout, bus_port) = (node_timeout_ms.to_string(), bus.to_string());
    let args = [
        "--cluster-enabled",
        "yes",
        "--cluster-config-file",
        "nodes.conf",
        "--cluster-node-timeout",
        &node_timeout,
        "--cluster-port",
        &bus_port,
        "--cluster-replica-validity-factor",
        "0",
        "--repl-diskless-sync",
        "yes",
        "--repl-diskless-sync-delay",
        "0",
    ];
    let server = match certs {
        None => RedisServer::start_with(&args),
        Some(certs) => {
            let tls = ["--tls-cluster", "yes", "--tls-replication", "yes"];
            RedisServer::start_tls_with(certs, &[&args[..], &tls[..]].concat())
        }
    };
    (server, bus)
}

/// Whether `node` says it is a primary serving `slot`.
fn owns_slot(node: &RedisServer, slot: u16) -> bool {
    slot_owner(node, slot)
        .is_some_and(|(_, flags)| flags.contains("myself") && flags.contains("master"))
}

/// The node that `node` says serves `slot`, as its id and flags, from its
/// `CLUSTER NODES` ("<id> <addr> <flags> <primary> <ping> <pong> <epoch>
/// <link> <slot ranges>...").
fn slot_owner(node: &RedisServer, slot: u16) -> Option<(String, String)> {
    let nodes = node.command(&["CLUSTER", "NODES"]).ok()?;
    nodes.lines().find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let serves = fields.iter().skip(8).any(|range| {
            let (a, b) = range.split_once('-').unwrap_or((range, range));
            match (a.parse::<u16>(), b.parse::<u16>()) {
                (Ok(a), Ok(b)) => (a..=b).contains(&slot),
                _ => false,
            }
        });
        match (serves, fields.first(), fields.get(2)) {
            (true, Some(id), Some(flags)) => Some(((*id).to_owned(), (*flags).to_owned())),
            _ => None,
        }
    })
}

/// The three shards' slot ranges, inclusive.
fn ranges() -> [(u16, u16); SHARDS] {
    let third = SLOTS / 3;
    [
        (0, third - 1),
        (third, 2 * third - 1),
        (2 * third, SLOTS - 1),
    ]
}

fn expect_ok(node: &RedisServer, args: &[&str]) {
    match node.command(args) {
        Ok(reply) if reply == "OK" => {}
        other => panic!("{args:?} on port {}: {other:?}", node.port()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_cover_every_slot_once() {
        let r = ranges();
        assert_eq!(r[0].0, 0);
        assert_eq!(r[2].1, SLOTS - 1);
        assert_eq!(r[0].1 + 1, r[1].0);
        assert_eq!(r[1].1 + 1, r[2].0);
    }
}
