//! `breakwater inspect` and `breakwater warm` against a private
//! `redis-server` and a private three-node cluster.

use std::io::Read;
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use breakwater::{Cache, Jitter, RedisStore, Store};
use breakwater_testkit::{RedisCluster, RedisServer};

/// Runs `breakwater` with `args`; (exit code, stdout, stderr). The process
/// gets 60 s.
fn breakwater(args: &[&str]) -> (i32, String, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_breakwater"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn breakwater");
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("breakwater {args:?} did not exit within 60 s");
        }
        thread::sleep(Duration::from_millis(20));
    };
    let (mut out, mut err) = (String::new(), String::new());
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    (status.code().unwrap_or(-1), out, err)
}

/// `breakwater inspect` with `args`.
fn inspect(args: &[&str]) -> (i32, String, String) {
    let mut all = vec!["inspect"];
    all.extend_from_slice(args);
    breakwater(&all)
}

#[tokio::test]
async fn reports_fresh_negative_unreadable_and_missing_keys() {
    let server = RedisServer::start();
    let store = RedisStore::connect(&server.url()).unwrap();
    let cache: Cache<String> = Cache::builder()
        .namespace("shop")
        .store(store.clone())
        .ttl(Duration::from_secs(600))
        .jitter(Jitter::none())
        .build()
        .unwrap();
    cache
        .set("product:1", &"espresso".to_owned())
        .await
        .unwrap();
    cache
        .get_or_load("product:404", || async { Ok::<_, std::io::Error>(None) })
        .await
        .unwrap();
    let garbage = cache.storage_key(b"product:2").unwrap();
    store
        .set(&garbage, b"hello", Duration::from_secs(60))
        .await
        .unwrap();

    let url = server.url();
    let (code, out, err) = inspect(&[
        "--redis",
        &url,
        "--namespace",
        "shop",
        "product:1",
        "product:404",
        "product:2",
        "product:3",
    ]);
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    let sections: Vec<&str> = out.split("\nproduct:").collect();
    assert_eq!(sections.len(), 4, "{out}");
    assert!(sections[0].starts_with("product:1\n"), "{out}");
    assert!(
        sections[0].contains("stored as  bw:shop:v:{product:1}"),
        "{out}"
    );
    assert!(
        sections[0].contains("entry      value, fresh for 10m 00s, no stale window")
            || sections[0].contains("entry      value, fresh for 9m 59s, no stale window"),
        "{out}"
    );
    assert!(sections[0].contains("(served now)"), "{out}");
    assert!(sections[0].contains("lease      free"), "{out}");
    assert!(
        sections[1].contains("entry      negative (the value does not exist)"),
        "{out}"
    );
    assert!(
        sections[2].contains("entry      unreadable (5 bytes)"),
        "{out}"
    );
    assert!(sections[3].contains("entry      none"), "{out}");

    let (code, _, err) = inspect(&["--redis", &url, "--namespace", "shop", ""]);
    assert_eq!(code, 2, "an empty key is a usage error: {err}");
    assert!(err.contains("key must not be empty"), "{err}");
}

#[tokio::test]
async fn inspects_keys_on_a_cluster() {
    let cluster = RedisCluster::start();
    let store = RedisStore::connect_cluster(cluster.urls()).unwrap();
    let cache: Cache<String> = Cache::builder()
        .namespace("shop")
        .store(store)
        .build()
        .unwrap();
    let keys: Vec<String> = (0..6).map(|i| format!("product:{i}")).collect();
    for key in &keys {
        cache.set(key, &"v".to_owned()).await.unwrap();
    }
    // The keys live on more than one node.
    let nodes: std::collections::HashSet<usize> = keys
        .iter()
        .map(|k| {
            cluster.node_of(&String::from_utf8(cache.storage_key(k.as_bytes()).unwrap()).unwrap())
        })
        .collect();
    assert!(nodes.len() > 1, "{nodes:?}");

    let urls = cluster.urls().join(",");
    let mut args = vec!["--redis", &urls, "--namespace", "shop"];
    args.extend(keys.iter().map(String::as_str));
    let (code, out, err) = inspect(&args);
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    assert_eq!(
        out.matches("entry      value, fresh for").count(),
        6,
        "{out}"
    );
}

#[tokio::test]
async fn warm_fills_a_cluster_named_by_its_node_urls() {
    let cluster = RedisCluster::start();
    let urls = cluster.urls().join(",");
    let (code, out, err) = breakwater(&[
        "warm",
        "--redis",
        &urls,
        "--namespace",
        "warm-cluster",
        "--keys",
        "60",
        "--rate",
        "10000",
        "--loader-ms",
        "1",
    ]);
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    assert!(
        out.contains("cold cache: loaded 60, already cached 0, failed 0"),
        "{out}"
    );
    assert!(
        out.contains("warm cache: loaded 0, already cached 60, failed 0"),
        "{out}"
    );
    // The entries are on more than one node.
    let holding = cluster
        .nodes()
        .iter()
        .filter(|node| node.command(&["DBSIZE"]).unwrap() != "0")
        .count();
    assert!(holding > 1, "{holding}");
}
