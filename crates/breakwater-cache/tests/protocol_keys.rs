//! `PROTOCOL.md`'s key inventory against a real Redis: a full workload
//! (loads, `set`, `set_many`, invalidations, tags, `expire`, clears, a
//! batch load, a warm-up, a version transition) runs on a private Redis,
//! every key it leaves there (and every key present while loads hold
//! their leases) is classified by the patterns of the inventory table,
//! and a key no documented pattern matches fails the test, as does a row
//! whose pattern cannot be parsed or that no key matched. The `vector
//! key` blocks' lease indexes, which only a Redis store has, are checked
//! here too.

mod support;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use breakwater_cache::{Cache, ClearMode, Jitter, Loaded, RedisStore, Warm};
use breakwater_cache_testkit::RedisServer;
use tokio::sync::Notify;

const PROTOCOL: &str = include_str!("../../../PROTOCOL.md");

// --- the inventory table ---

/// A placeholder of a pattern (see PROTOCOL.md §2).
#[derive(Debug, Clone, Copy, PartialEq)]
enum Hole {
    Prefix,
    Ns,
    Version,
    Key,
    Tag,
    Hash,
    SlotTag,
}

#[derive(Debug, Clone)]
enum Token {
    Lit(u8),
    Hole(Hole),
    /// `{<name>}`: the hash-tag form of PROTOCOL.md §1.2.
    Tagged(Hole),
    /// `[...]`: present or not.
    Optional(Vec<Token>),
}

/// One row of the inventory: its kind, its patterns (every backticked
/// text of its second column), and its Redis type (the third).
#[derive(Debug)]
struct Row {
    kind: String,
    patterns: Vec<(String, Vec<Token>)>,
    redis_type: String,
}

fn hole(name: &str) -> Result<Hole, String> {
    Ok(match name {
        "prefix" => Hole::Prefix,
        "ns" => Hole::Ns,
        "version" => Hole::Version,
        "key" => Hole::Key,
        "tag" => Hole::Tag,
        "hash" => Hole::Hash,
        "slot-tag" => Hole::SlotTag,
        other => return Err(format!("unknown placeholder <{other}>")),
    })
}

/// Parses a pattern; `Err` says why it cannot be.
fn parse_pattern(text: &str) -> Result<Vec<Token>, String> {
    fn tokens(text: &[u8], at: &mut usize, nested: bool) -> Result<Vec<Token>, String> {
        let mut out = Vec::new();
        while *at < text.len() {
            match text[*at] {
                b'<' => {
                    let end = text[*at..]
                        .iter()
                        .position(|&b| b == b'>')
                        .ok_or("an unclosed <")?;
                    let name = std::str::from_utf8(&text[*at + 1..*at + end])
                        .map_err(|e| e.to_string())?;
                    out.push(Token::Hole(hole(name)?));
                    *at += end + 1;
                }
                b'{' => {
                    let end = text[*at..]
                        .iter()
                        .position(|&b| b == b'}')
                        .ok_or("an unclosed {")?;
                    let inner = &text[*at + 1..*at + end];
                    let name = inner
                        .strip_prefix(b"<")
                        .and_then(|i| i.strip_suffix(b">"))
                        .ok_or("braces hold anything but one <placeholder>")?;
                    let name = std::str::from_utf8(name).map_err(|e| e.to_string())?;
                    let tagged = hole(name)?;
                    if matches!(tagged, Hole::Prefix | Hole::Ns | Hole::Version | Hole::Hash) {
                        return Err(format!("<{name}> is never hash-tagged"));
                    }
                    out.push(Token::Tagged(tagged));
                    *at += end + 1;
                }
                b'[' => {
                    *at += 1;
                    let group = tokens(text, at, true)?;
                    if group.is_empty() {
                        return Err("an empty [ ]".into());
                    }
                    out.push(Token::Optional(group));
                }
                b']' if nested => {
                    *at += 1;
                    return Ok(out);
                }
                b @ (b']' | b'>' | b'}' | b'`' | b' ') => {
                    return Err(format!("a stray {:?}", b as char));
                }
                b => {
                    out.push(Token::Lit(b));
                    *at += 1;
                }
            }
        }
        if nested {
            return Err("an unclosed [".into());
        }
        Ok(out)
    }
    let mut at = 0;
    let out = tokens(text.as_bytes(), &mut at, false)?;
    if out.is_empty() {
        return Err("an empty pattern".into());
    }
    Ok(out)
}

/// The rows of the inventory table: the table whose header starts
/// `| kind | pattern |`. Panics naming every row that cannot be parsed.
fn inventory() -> Vec<Row> {
    let mut lines = PROTOCOL.lines().enumerate();
    let Some((header_at, _)) = lines
        .by_ref()
        .find(|(_, l)| l.replace(' ', "").starts_with("|kind|pattern|"))
    else {
        panic!("PROTOCOL.md has no table whose header starts `| kind | pattern |`");
    };
    let (_, separator) = lines.next().expect("a separator line");
    assert!(
        separator.starts_with("|--") || separator.starts_with("| --"),
        "PROTOCOL.md:{}: no separator under the inventory header",
        header_at + 2
    );
    let mut rows = Vec::new();
    let mut bad = Vec::new();
    for (n, line) in lines {
        if !line.starts_with('|') {
            break;
        }
        let cells: Vec<&str> = line
            .trim()
            .trim_matches('|')
            .split('|')
            .map(str::trim)
            .collect();
        let at = format!("PROTOCOL.md:{}", n + 1);
        if cells.len() < 3 {
            bad.push(format!("{at}: fewer than three cells"));
            continue;
        }
        let kind = cells[0].to_owned();
        let texts: Vec<&str> = cells[1].split('`').skip(1).step_by(2).collect();
        if texts.is_empty() {
            bad.push(format!("{at}: row {kind:?} has no backticked pattern"));
            continue;
        }
        let mut patterns = Vec::new();
        for text in texts {
            match parse_pattern(text) {
                Ok(tokens) => patterns.push((text.to_owned(), tokens)),
                Err(why) => bad.push(format!(
                    "{at}: row {kind:?}: pattern `{text}` cannot be parsed: {why}"
                )),
            }
        }
        let redis_type = cells[2].trim_matches('`').to_owned();
        if !matches!(
            redis_type.as_str(),
            "string" | "set" | "hash" | "list" | "zset"
        ) {
            bad.push(format!(
                "{at}: row {kind:?}: type {redis_type:?} is no Redis type"
            ));
        }
        rows.push(Row {
            kind,
            patterns,
            redis_type,
        });
    }
    assert!(
        bad.is_empty(),
        "the inventory table has rows that cannot be read:\n{}",
        bad.join("\n")
    );
    assert!(!rows.is_empty(), "the inventory table has no rows");
    rows
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Whether `bytes` may fill `hole` (PROTOCOL.md §1.1 and §2).
fn fits(hole: Hole, bytes: &[u8]) -> bool {
    let plain =
        |b: &u8| !b.is_ascii_whitespace() && !b.is_ascii_control() && !matches!(b, b'{' | b'}');
    match hole {
        Hole::Prefix => {
            (1..=64).contains(&bytes.len())
                && bytes.ends_with(b":")
                && !bytes[..bytes.len() - 1].contains(&b':')
                && bytes
                    .iter()
                    .all(|b| plain(b) && !matches!(b, b'*' | b'?' | b'[' | b']' | b'\\'))
        }
        Hole::Ns => {
            (1..=128).contains(&bytes.len()) && bytes.iter().all(|b| plain(b) && *b != b'@')
        }
        Hole::Version => {
            !bytes.is_empty()
                && bytes[0] != b'0'
                && bytes.iter().all(u8::is_ascii_digit)
                && std::str::from_utf8(bytes)
                    .ok()
                    .and_then(|s| s.parse::<u32>().ok())
                    .is_some()
        }
        Hole::Key | Hole::Tag => !bytes.is_empty(),
        Hole::Hash => {
            bytes.len() == 16 && bytes.iter().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
        }
        Hole::SlotTag => (1..=7).contains(&bytes.len()) && bytes.iter().all(u8::is_ascii_digit),
    }
}

/// Whether `key[at..]` matches `tokens` (backtracking over the holes'
/// lengths).
fn matches_from(tokens: &[Token], key: &[u8], at: usize) -> bool {
    let Some((first, rest)) = tokens.split_first() else {
        return at == key.len();
    };
    match first {
        Token::Lit(b) => key.get(at) == Some(b) && matches_from(rest, key, at + 1),
        Token::Optional(group) => {
            let mut with: Vec<Token> = group.clone();
            with.extend_from_slice(rest);
            matches_from(&with, key, at) || matches_from(rest, key, at)
        }
        Token::Hole(hole) => (at + 1..=key.len())
            .any(|end| fits(*hole, &key[at..end]) && matches_from(rest, key, end)),
        Token::Tagged(hole) => {
            let tail = &key[at..];
            // `{#<hash>}<bytes>`, the bytes holding a brace and hashing so.
            if tail.len() > 19 && tail.starts_with(b"{#") && tail[18] == b'}' {
                let hash = &tail[2..18];
                return (at + 20..=key.len()).any(|end| {
                    let bytes = &key[at + 19..end];
                    fits(Hole::Hash, hash)
                        && bytes.iter().any(|b| matches!(b, b'{' | b'}'))
                        && format!("{:016x}", fnv1a(bytes)).as_bytes() == hash
                        && fits(*hole, bytes)
                        && matches_from(rest, key, end)
                });
            }
            // `{<bytes>}`, the bytes without braces.
            if tail.first() != Some(&b'{') {
                return false;
            }
            (at + 2..key.len()).any(|close| {
                let bytes = &key[at + 1..close];
                key[close] == b'}'
                    && !bytes.iter().any(|b| matches!(b, b'{' | b'}'))
                    && fits(*hole, bytes)
                    && matches_from(rest, key, close + 1)
            })
        }
    }
}

fn matches(tokens: &[Token], key: &[u8]) -> bool {
    matches_from(tokens, key, 0)
}

#[test]
fn the_pattern_language_reads_as_documented() {
    let value = parse_pattern("<prefix><ns>[@<version>]:v:{<key>}").unwrap();
    assert!(matches(&value, b"bw:products:v:{sku:1}"));
    assert!(matches(&value, b"bw:products@3:v:{sku:1}"));
    assert!(matches(
        &value,
        b"myapp:cache:catalog:v:{#4bca13841ba939f8}a{b}"
    ));
    assert!(
        !matches(&value, b"myapp:cache:catalog:v:{#0000000000000000}a{b}"),
        "a wrong hash"
    );
    assert!(
        !matches(&value, b"bw:products:v:{a{b}"),
        "a brace in the plain form"
    );
    assert!(!matches(&value, b"bw:products@03:v:{k}"), "a leading zero");
    assert!(!matches(&value, b"bw:products:l:{k}"));
    let index = parse_pattern("<prefix><ns>[@<version>]:i:[{<slot-tag>}]").unwrap();
    assert!(matches(&index, b"bw:products:i:"));
    assert!(matches(&index, b"bw:products@2:i:{1234}"));
    assert!(!matches(&index, b"bw:products:i:{x}"));
    for bad in [
        "",
        "<nope>",
        "a[b",
        "a]b",
        "{x}",
        "{<prefix>}",
        "<prefix",
        "a b",
    ] {
        assert!(parse_pattern(bad).is_err(), "{bad:?}");
    }
}

#[test]
fn the_inventory_table_parses() {
    let rows = inventory();
    for kind in [
        "value entry",
        "lease",
        "lease index",
        "tag counter",
        "clear record",
    ] {
        assert!(rows.iter().any(|r| r.kind == kind), "no row {kind:?}");
    }
}

// --- vector blocks (`vector key`) ---

/// The `vector key` blocks' fields.
fn key_vectors() -> Vec<HashMap<String, Vec<u8>>> {
    let mut out = Vec::new();
    let mut lines = PROTOCOL.lines();
    while let Some(line) = lines.next() {
        if line.trim() != "```vector key" {
            continue;
        }
        let mut fields = HashMap::new();
        for line in lines.by_ref() {
            if line.starts_with("```") {
                break;
            }
            let Some((name, value)) = line.split_once(':') else {
                continue;
            };
            let (name, value) = (name.trim(), value.trim());
            match name.strip_suffix("_hex") {
                Some(name) => {
                    let digits: Vec<u8> =
                        value.bytes().filter(|b| !b.is_ascii_whitespace()).collect();
                    let bytes = digits
                        .chunks(2)
                        .map(|p| u8::from_str_radix(std::str::from_utf8(p).unwrap(), 16).unwrap())
                        .collect();
                    fields.insert(name.to_owned(), bytes);
                }
                None => {
                    fields.insert(name.to_owned(), value.as_bytes().to_vec());
                }
            }
        }
        out.push(fields);
    }
    out
}

// --- Redis ---

async fn connection(server: &RedisServer) -> redis::aio::MultiplexedConnection {
    redis::Client::open(server.url())
        .expect("a valid url")
        .get_multiplexed_async_connection()
        .await
        .expect("private redis is reachable")
}

/// Every key in Redis (`SCAN`).
async fn scan(conn: &mut redis::aio::MultiplexedConnection) -> BTreeSet<Vec<u8>> {
    let mut keys = BTreeSet::new();
    let mut cursor: u64 = 0;
    loop {
        let (next, batch): (u64, Vec<Vec<u8>>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("COUNT")
            .arg(1000)
            .query_async(conn)
            .await
            .expect("SCAN");
        keys.extend(batch);
        if next == 0 {
            return keys;
        }
        cursor = next;
    }
}

async fn exists(conn: &mut redis::aio::MultiplexedConnection, key: &[u8]) -> bool {
    let n: u64 = redis::cmd("EXISTS")
        .arg(key)
        .query_async(conn)
        .await
        .expect("EXISTS");
    n == 1
}

fn show(key: &[u8]) -> String {
    key.iter()
        .flat_map(|&b| std::ascii::escape_default(b))
        .map(char::from)
        .collect()
}

/// A load of `key` through `cache` that holds its lease until the
/// returned gate is opened; `lease` is awaited to exist in Redis first.
async fn held_load(
    cache: &Cache<String>,
    key: Vec<u8>,
    lease: &[u8],
    conn: &mut redis::aio::MultiplexedConnection,
) -> (
    Arc<Notify>,
    tokio::task::JoinHandle<Result<Option<String>, breakwater_cache::Error>>,
) {
    let gate = Arc::new(Notify::new());
    let task = {
        let (cache, gate) = (cache.clone(), Arc::clone(&gate));
        tokio::spawn(async move {
            cache
                .get_or_load(key, move || async move {
                    gate.notified().await;
                    Ok::<_, std::io::Error>(Some("slow".to_owned()))
                })
                .await
        })
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !exists(conn, lease).await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the lease {} never appeared",
            show(lease)
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // A lease is its holder's 16-byte token and a status byte.
    let held: Vec<u8> = redis::cmd("GET")
        .arg(lease)
        .query_async(conn)
        .await
        .expect("GET");
    assert!(
        held.len() == 17 && matches!(held[16], b'-' | b'w'),
        "the lease {} holds {}",
        show(lease),
        show(&held)
    );
    (gate, task)
}

fn builder(store: &RedisStore, namespace: &str) -> breakwater_cache::CacheBuilder<String> {
    Cache::<String>::builder()
        .namespace(namespace)
        .store(store.clone())
        .ttl(Duration::from_secs(60))
        .jitter(Jitter::ratio(0.1))
        .grace(Duration::from_secs(10))
        .max_stale(Duration::from_secs(30))
}

fn value(
    v: &str,
) -> impl FnOnce() -> std::future::Ready<Result<Option<String>, std::io::Error>>
+ Clone
+ Send
+ Sync
+ 'static {
    let v = v.to_owned();
    move || std::future::ready(Ok(Some(v)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_key_a_workload_leaves_in_redis_is_documented() {
    let rows = inventory();
    let server = RedisServer::start();
    let mut conn = connection(&server).await;
    let (store_a, store_b) = (
        support::connect(&server).await,
        support::connect(&server).await,
    );
    let mut seen: BTreeSet<Vec<u8>> = BTreeSet::new();

    // Two processes of version 0.
    let a = builder(&store_a, "proto").build().unwrap();
    let b = builder(&store_b, "proto").build().unwrap();

    // Loads: values, "not found", keys with braces and binary keys.
    for k in ["k1", "k2", "k3", "k4", "k5"] {
        a.get_or_load(k, value(k)).await.unwrap();
    }
    b.get_or_load("missing", || {
        std::future::ready(Ok::<Option<String>, std::io::Error>(None))
    })
    .await
    .unwrap();
    a.get_or_load("a{b}", value("braced")).await.unwrap();
    a.get_or_load(vec![0u8, 0xff, b'{'], value("binary"))
        .await
        .unwrap();
    // A load whose loader fails (nothing written).
    let _ = a
        .get_or_load("broken", || {
            std::future::ready(Err::<Option<String>, _>(std::io::Error::other("down")))
        })
        .await;

    // Writes.
    a.set("s1", &"set".to_owned()).await.unwrap();
    b.set_many([("m1", "one".to_owned()), ("m2", "two".to_owned())])
        .await
        .unwrap();

    // Invalidations.
    a.invalidate("k1").await.unwrap();
    b.invalidate_many(["k2", "k3"]).await.unwrap();
    a.expire("k4").await.unwrap();

    // Tags: named by the call, chosen by the loader, invalidated, expired.
    a.entry("t1")
        .tags(["shop:1", "user:2"])
        .get_or_load(value("t1"))
        .await
        .unwrap();
    b.entry("t2")
        .tags(["shop:1", "x{y}"])
        .set(&"t2".to_owned())
        .await
        .unwrap();
    for _ in 0..2 {
        // The chosen tag's first load is not written; the second is.
        a.get_or_load_with_context("t3", |_| async {
            Ok::<_, std::io::Error>(Loaded::value("t3".to_owned()).tags(["shop:9"]))
        })
        .await
        .unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    a.get_or_load_with_context("t4", |_| async {
        Ok::<_, std::io::Error>(
            Loaded::value("t4".to_owned())
                .validator("etag-1")
                .grace(Duration::from_secs(5)),
        )
    })
    .await
    .unwrap();
    a.invalidate_tag("shop:1").await.unwrap();
    b.expire_tag("user:2").await.unwrap();
    a.invalidate_tags(["x{y}", "never-used"]).await.unwrap();

    // A batch load: g3 is not found.
    let got = b
        .get_many(["g1", "g2", "g3"], |keys: Vec<&'static str>| async move {
            Ok::<_, std::io::Error>(
                keys.into_iter()
                    .filter(|k| *k != "g3")
                    .map(|k| (k, format!("v{k}")))
                    .collect::<Vec<_>>(),
            )
        })
        .await
        .unwrap();
    assert_eq!(got, [Some("vg1".to_owned()), Some("vg2".to_owned()), None]);

    // A warm-up.
    let report = a
        .warm(
            ["w1", "w2"],
            |k: &'static str| async move { Ok::<_, std::io::Error>(Some(format!("w{k}"))) },
            Warm::new(),
        )
        .await
        .unwrap();
    assert_eq!(report.loaded, 2);

    // Clears, soft then hard (then entries again under the new record).
    a.clear(ClearMode::Soft {
        window: Duration::from_secs(60),
    })
    .await
    .unwrap();
    b.clear(ClearMode::Hard).await.unwrap();
    a.get_or_load("k5", value("k5 again")).await.unwrap();

    // A load in flight: its lease, and the lease index naming it.
    let (gate, task) = held_load(&a, b"slow".to_vec(), b"bw:proto:l:{slow}", &mut conn).await;
    seen.extend(scan(&mut conn).await);
    let listed: bool = redis::cmd("SISMEMBER")
        .arg("bw:proto:i:")
        .arg("bw:proto:l:{slow}")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(
        listed,
        "the lease index bw:proto:i: does not name the lease in flight"
    );
    gate.notify_one();
    task.await.unwrap().unwrap();

    // Version 1, in its transition from version 0.
    let v1 = builder(&store_a, "proto")
        .version(1)
        .version_transition(Duration::from_secs(600))
        .build()
        .unwrap();
    // An entry of version 0 stands in while version 1 loads it.
    v1.get_or_load("k5", value("k5 v1")).await.unwrap();
    // No entry of version 0: a placeholder is pinned there.
    v1.get_or_load("fresh1", value("fresh1 v1")).await.unwrap();
    v1.set("s2", &"s2 v1".to_owned()).await.unwrap();
    v1.entry("vt")
        .tags(["shop:1"])
        .set(&"vt".to_owned())
        .await
        .unwrap();
    v1.invalidate("m1").await.unwrap();
    v1.invalidate_many(["m2", "g1"]).await.unwrap();
    let (gate, task) = held_load(&v1, b"slow1".to_vec(), b"bw:proto@1:l:{slow1}", &mut conn).await;
    seen.extend(scan(&mut conn).await);
    gate.notify_one();
    task.await.unwrap().unwrap();
    // Wait for the background loads of version 1 (served stale meanwhile).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !exists(&mut conn, b"bw:proto@1:v:{k5}").await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "version 1 never loaded k5"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    v1.clear(ClearMode::Hard).await.unwrap();

    // The `vector key` blocks, each its own cache: the lease a load holds
    // is named by the documented lease index, and the entry and the clear
    // record land under their documented keys.
    let vectors = key_vectors();
    assert!(!vectors.is_empty(), "PROTOCOL.md has no `vector key` block");
    for fields in &vectors {
        let field = |name: &str| {
            fields
                .get(name)
                .unwrap_or_else(|| panic!("a `vector key` block without {name}"))
        };
        let text = |name: &str| String::from_utf8(field(name).clone()).unwrap();
        let cache = Cache::<String>::builder()
            .key_prefix(text("key_prefix"))
            .namespace(text("namespace"))
            .version(text("version").parse().unwrap())
            .store(store_b.clone())
            .build()
            .unwrap();
        let (lease, index) = (field("lease_key"), field("lease_index"));
        let (gate, task) = held_load(&cache, field("key").clone(), lease, &mut conn).await;
        seen.extend(scan(&mut conn).await);
        let listed: bool = redis::cmd("SISMEMBER")
            .arg(index)
            .arg(lease)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert!(
            listed,
            "the lease index {} does not name the lease {}",
            show(index),
            show(lease)
        );
        gate.notify_one();
        task.await.unwrap().unwrap();
        for name in ["storage_key", "clear_key"] {
            assert!(
                exists(&mut conn, field(name)).await,
                "{name} {} is not in Redis after a load",
                show(field(name))
            );
        }
    }

    seen.extend(scan(&mut conn).await);

    // Every key is of a documented kind, of its documented type.
    let mut kinds: BTreeMap<&str, usize> = rows.iter().map(|r| (r.kind.as_str(), 0)).collect();
    let mut undocumented = Vec::new();
    for key in &seen {
        let matched: Vec<&Row> = rows
            .iter()
            .filter(|r| r.patterns.iter().any(|(_, p)| matches(p, key)))
            .collect();
        if matched.is_empty() {
            undocumented.push(show(key));
            continue;
        }
        let redis_type: String = redis::cmd("TYPE")
            .arg(key)
            .query_async(&mut conn)
            .await
            .unwrap();
        if redis_type != "none" {
            assert!(
                matched.iter().any(|r| r.redis_type == redis_type),
                "{} is a {redis_type}, not what its kinds say ({:?})",
                show(key),
                matched
                    .iter()
                    .map(|r| (&r.kind, &r.redis_type))
                    .collect::<Vec<_>>()
            );
        }
        for row in matched {
            *kinds.get_mut(row.kind.as_str()).unwrap() += 1;
        }
    }
    assert!(
        undocumented.is_empty(),
        "{} of {} keys in Redis match no pattern of PROTOCOL.md's inventory:\n{}",
        undocumented.len(),
        seen.len(),
        undocumented.join("\n")
    );
    let unseen: Vec<&&str> = kinds
        .iter()
        .filter(|(_, n)| **n == 0)
        .map(|(k, _)| k)
        .collect();
    assert!(
        unseen.is_empty(),
        "documented kinds the workload never left in Redis: {unseen:?}"
    );

    // What the rows say of some keys, checked.
    let pttl = |key: &'static str| {
        let mut conn = conn.clone();
        async move {
            let ms: i64 = redis::cmd("PTTL")
                .arg(key)
                .query_async(&mut conn)
                .await
                .unwrap();
            ms
        }
    };
    // Clear records have no TTL.
    for key in ["bw:proto:c", "bw:proto@1:c"] {
        assert_eq!(pttl(key).await, -1, "{key} has a TTL");
    }
    // Tag counters, and the placeholders a transition pins, live at least an hour.
    for key in [
        "bw:proto:t:{shop:1}",
        "bw:proto:t:{user:2}",
        "bw:proto:v:{fresh1}",
    ] {
        assert!(pttl(key).await > 3_500_000, "{key} lives less than an hour");
    }
    // The placeholder is a negative entry whose windows ended before 2004.
    let placeholder: Vec<u8> = redis::cmd("GET")
        .arg("bw:proto:v:{fresh1}")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(&placeholder[..3], b"BW\x01");
    assert_eq!(placeholder[4] & 1, 1, "not negative");
    let fresh_until = u64::from_be_bytes(placeholder[5..13].try_into().unwrap());
    assert!(fresh_until < 1 << 40, "its windows end at {fresh_until}");
    assert_eq!(placeholder.len(), 33, "a placeholder is a bare header");
    eprintln!("{} keys, by kind: {kinds:?}", seen.len());
}
