//! Tests that start real Redis Clusters.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use breakwater_cache_testkit::RedisCluster;

/// A node's process id and working directory, from the node itself.
fn pid_and_dir(cluster: &RedisCluster, index: usize) -> (i32, PathBuf) {
    let node = &cluster.nodes()[index];
    let info = node.command(&["INFO", "server"]).unwrap();
    let pid = info
        .lines()
        .find_map(|l| l.trim().strip_prefix("process_id:"))
        .unwrap()
        .parse()
        .unwrap();
    let dir = node.command(&["CONFIG", "GET", "dir"]).unwrap();
    (pid, PathBuf::from(dir.lines().nth(1).unwrap()))
}

#[test]
fn a_replica_takes_over_a_killed_primary_with_its_data() {
    let mut cluster = RedisCluster::start_with_replicas(1);
    assert_eq!(cluster.nodes().len(), 6);
    assert_eq!(cluster.urls().len(), 6);
    assert_eq!(cluster.replicas_of(0), vec![3]);
    assert_eq!(cluster.replicas_of(2), vec![5]);
    assert_eq!(cluster.shard_of_node(4), 1);
    for shard in 0..3 {
        assert_eq!(cluster.primary_of(shard), Some(shard));
        let replica = &cluster.nodes()[cluster.replicas_of(shard)[0]];
        let info = replica.command(&["INFO", "replication"]).unwrap();
        assert!(info.contains("role:slave"), "{info}");
        assert!(info.contains("master_link_status:up"), "{info}");
    }
    // A key on shard 0, written to its primary, reaches the replica.
    let key = (0..)
        .map(|i| format!("k{i}"))
        .find(|k| cluster.node_of(k) == 0)
        .unwrap();
    assert_eq!(
        cluster.nodes()[0].command(&["SET", &key, "v"]).unwrap(),
        "OK"
    );
    assert_eq!(
        cluster.nodes()[0].command(&["WAIT", "1", "5000"]).unwrap(),
        "1"
    );

    let started = Instant::now();
    assert_eq!(cluster.kill_primary(0), 0);
    let promoted = cluster.wait_for_promotion(0, Duration::from_secs(30));
    let took = started.elapsed();
    eprintln!("promotion took {took:?}");
    assert_eq!(promoted, 3);
    assert_eq!(cluster.primary_of(0), Some(3));
    assert_eq!(cluster.nodes()[3].command(&["GET", &key]).unwrap(), "v");
    // The other shards are untouched.
    assert_eq!(cluster.primary_of(1), Some(1));
    assert_eq!(cluster.primary_of(2), Some(2));

    // Dropping the cluster stops every process and deletes every directory.
    let nodes: Vec<(i32, PathBuf)> = (1..6).map(|i| pid_and_dir(&cluster, i)).collect();
    drop(cluster);
    for (pid, dir) in nodes {
        let alive = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_ok();
        assert!(!alive, "redis-server {pid} outlived its cluster");
        assert!(!dir.exists(), "{} outlived its cluster", dir.display());
    }
}
