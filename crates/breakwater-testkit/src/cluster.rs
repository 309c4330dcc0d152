//! A private three-node Redis Cluster for one test.

use std::thread;
use std::time::{Duration, Instant};

use crate::server::{RedisServer, free_port};

/// Hash slots in a Redis Cluster.
const SLOTS: u16 = 16_384;
/// How long the nodes get to agree that the cluster is up.
const FORM_TIMEOUT: Duration = Duration::from_secs(30);

/// Three private `redis-server` processes in cluster mode on loopback, each
/// serving a third of the hash slots (no replicas), formed with
/// `CLUSTER ADDSLOTSRANGE` and `CLUSTER MEET`.
///
/// Each node is a [`RedisServer`] (own port, own directory, no persistence
/// except the node's `nodes.conf`), so a node can be killed, restarted (it
/// rejoins with its slots) or paused. Dropping the cluster stops every node.
///
/// ```no_run
/// use breakwater_testkit::RedisCluster;
///
/// let cluster = RedisCluster::start();
/// let urls = cluster.urls(); // one "redis://127.0.0.1:PORT/" per node
/// assert_eq!(urls.len(), 3);
/// ```
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
    /// Each node's cluster-bus port, as it was started.
    buses: Vec<u16>,
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
        let (nodes, buses) = (0..3).map(|_| start_node()).unzip();
        let cluster = RedisCluster { nodes, buses };
        cluster.form();
        cluster
    }

    /// The nodes, in slot order (node 0 serves the lowest slots).
    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }

    /// Mutable access to one node, e.g. to kill or pause it.
    ///
    /// # Panics
    ///
    /// If `index` is not 0, 1 or 2.
    pub fn node_mut(&mut self, index: usize) -> &mut RedisServer {
        &mut self.nodes[index]
    }

    /// Every node's URL: the seed list for a cluster client.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// The index of the node that serves `key`'s hash slot.
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

    fn form(&self) {
        for (node, (first, last)) in self.nodes.iter().zip(ranges()) {
            let (first, last) = (first.to_string(), last.to_string());
            expect_ok(node, &["CLUSTER", "ADDSLOTSRANGE", &first, &last]);
        }
        let seed = &self.nodes[0];
        for (other, bus) in self.nodes.iter().zip(&self.buses).skip(1) {
            let (port, bus) = (other.port().to_string(), bus.to_string());
            expect_ok(seed, &["CLUSTER", "MEET", "127.0.0.1", &port, &bus]);
        }
        let deadline = Instant::now() + FORM_TIMEOUT;
        loop {
            let healthy = self.nodes.iter().all(|node| {
                node.command(&["CLUSTER", "INFO"]).is_ok_and(|info| {
                    info.contains("cluster_state:ok")
                        && info.contains("cluster_slots_assigned:16384")
                        && info.contains("cluster_known_nodes:3")
                })
            });
            if healthy {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the cluster did not form within {FORM_TIMEOUT:?}: {:?}",
                self.nodes
                    .iter()
                    .map(|n| n.command(&["CLUSTER", "INFO"]))
                    .collect::<Vec<_>>()
            );
            thread::sleep(Duration::from_millis(20));
        }
    }
}

/// One node and its bus port: cluster mode, the bus on a port of its own
/// (the default, port + 10,000, can lie past 65,535 for a high ephemeral
/// port).
fn start_node() -> (RedisServer, u16) {
    let bus = free_port();
    let server = RedisServer::start_with(&[
        "--cluster-enabled",
        "yes",
        "--cluster-config-file",
        "nodes.conf",
        "--cluster-node-timeout",
        "5000",
        "--cluster-port",
        &bus.to_string(),
    ]);
    (server, bus)
}

/// The three nodes' slot ranges, inclusive.
fn ranges() -> [(u16, u16); 3] {
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
