//! `PROTOCOL.md`'s test vectors, checked against this crate's own code:
//! every fenced block whose info string is `vector <kind>` is parsed and
//! checked here, so the spec cannot drift from what the code writes.
//!
//! - `entry`, `entry-invalid`: the envelope, encoded and decoded
//!   (`Entry`), the payload through its `Codec`.
//! - `key`, `tag-key`: a cache built with the block's prefix, namespace
//!   and version on a `MemoryStore`: its storage key, clear record key,
//!   the lease it holds during a load, the channel its invalidation goes
//!   to, the counter a tagged write makes. (`lease_index` is a Redis
//!   store's alone: `tests/protocol_keys.rs` checks it on a live Redis.)
//! - `message`: captured on the namespace channel while two caches run a
//!   scenario that sends every kind, the sender id (random per cache) and
//!   time-dependent tails put back as the block has them.
//! - `clear-record`, `tag-counter`: parsed, encoded, made by the rule the
//!   block names, and entries judged by them.
//!
//! A block that does not match prints what the code produces, ready to be
//! pasted (`cargo test -p breakwater-cache --all-features --lib
//! protocol_tests -- --nocapture`).

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;

use crate::codec::{Codec, Compression};
use crate::entry::{Entry, Extra, TagStamp};
use crate::store::namespace::{NamespaceState, Standing};
use crate::store::{
    Delivery, MemoryStore, Store, TagJudgment, TagState, parse_generation, parse_tag_state,
};
use crate::{Cache, ClearMode, Jitter, Loaded};

const PROTOCOL: &str = include_str!("../../../PROTOCOL.md");

/// One fenced `vector` block: its kind (the info string's second word),
/// the line it starts on, and its `name: value` fields in order (lines
/// that start with whitespace continue the field before; lines that start
/// with `#` are comments).
#[derive(Debug)]
struct Vector {
    kind: String,
    line: usize,
    fields: Vec<(String, String)>,
}

fn vectors() -> Vec<Vector> {
    let mut out = Vec::new();
    let mut lines = PROTOCOL.lines().enumerate();
    while let Some((n, line)) = lines.next() {
        let Some(kind) = line.trim_start().strip_prefix("```vector") else {
            continue;
        };
        let mut vector = Vector {
            kind: kind.trim().to_owned(),
            line: n + 1,
            fields: Vec::new(),
        };
        let mut closed = false;
        for (m, line) in lines.by_ref() {
            if line.trim_start().starts_with("```") {
                closed = true;
                break;
            }
            if line.trim().is_empty() || line.trim_start().starts_with('#') {
                continue;
            }
            if line.starts_with([' ', '\t']) {
                let Some((_, value)) = vector.fields.last_mut() else {
                    panic!(
                        "PROTOCOL.md:{}: a continuation line before any field",
                        m + 1
                    );
                };
                value.push(' ');
                value.push_str(line.trim());
                continue;
            }
            let Some((name, value)) = line.split_once(':') else {
                panic!("PROTOCOL.md:{}: not a `name: value` line: {line:?}", m + 1);
            };
            vector
                .fields
                .push((name.trim().to_owned(), value.trim().to_owned()));
        }
        assert!(closed, "{}: the block is not closed", vector.at());
        out.push(vector);
    }
    out
}

impl Vector {
    fn at(&self) -> String {
        format!("PROTOCOL.md:{} (vector {})", self.line, self.kind)
    }

    fn get(&self, name: &str) -> Option<&str> {
        self.fields
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    fn req(&self, name: &str) -> &str {
        self.get(name)
            .unwrap_or_else(|| panic!("{}: no `{name}` field", self.at()))
    }

    fn num(&self, name: &str) -> u64 {
        let text = self.req(name);
        text.parse()
            .unwrap_or_else(|_| panic!("{}: `{name}` is not a number: {text:?}", self.at()))
    }

    /// The field `name` as bytes: its text, or `<name>_hex` decoded.
    fn bytes(&self, name: &str) -> Option<Vec<u8>> {
        if let Some(text) = self.get(name) {
            return Some(text.as_bytes().to_vec());
        }
        self.get(&format!("{name}_hex")).map(|h| self.unhex(h))
    }

    fn req_bytes(&self, name: &str) -> Vec<u8> {
        self.bytes(name)
            .unwrap_or_else(|| panic!("{}: no `{name}` or `{name}_hex` field", self.at()))
    }

    fn unhex(&self, text: &str) -> Vec<u8> {
        unhex(text).unwrap_or_else(|| panic!("{}: not hex: {text:?}", self.at()))
    }
}

/// Hex digits, whitespace ignored.
fn unhex(text: &str) -> Option<Vec<u8>> {
    let digits: Vec<u8> = text.bytes().filter(|b| !b.is_ascii_whitespace()).collect();
    if !digits.len().is_multiple_of(2) {
        return None;
    }
    digits
        .chunks(2)
        .map(|pair| u8::from_str_radix(std::str::from_utf8(pair).ok()?, 16).ok())
        .collect()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

/// `bytes` as a `hex:` field ready to paste: `groups` (byte counts) first,
/// space-separated, then the rest 32 bytes a line.
fn pasteable(name: &str, bytes: &[u8], groups: &[usize]) -> String {
    let mut out = format!("{name}:");
    let mut at = 0;
    for &len in groups {
        if at + len > bytes.len() {
            break;
        }
        out.push(' ');
        out.push_str(&hex(&bytes[at..at + len]));
        at += len;
    }
    for (i, chunk) in bytes[at..].chunks(32).enumerate() {
        out.push_str(if i == 0 && at == 0 { " " } else { "\n  " });
        out.push_str(&hex(chunk));
    }
    out
}

/// `bytes` as a field: `name: text` when printable, else `name_hex: …`.
fn field(name: &str, bytes: &[u8]) -> String {
    match std::str::from_utf8(bytes) {
        Ok(text) if text.chars().all(|c| !c.is_control()) => format!("{name}: {text}"),
        _ => format!("{name}_hex: {}", hex(bytes)),
    }
}

/// The header's fields, for [`pasteable`].
const HEADER_GROUPS: [usize; 8] = [2, 1, 1, 1, 8, 8, 4, 8];

/// What did not match, with what the code says instead.
#[derive(Default)]
struct Report {
    failures: Vec<String>,
    checked: usize,
}

impl Report {
    fn check(&mut self, vector: &Vector, ok: bool, what: impl FnOnce() -> String) {
        self.checked += 1;
        if !ok {
            self.failures.push(format!("{}: {}", vector.at(), what()));
        }
    }

    fn finish(self, kind: &str) {
        assert!(self.checked > 0, "no `vector {kind}` block was checked");
        assert!(
            self.failures.is_empty(),
            "{} of {} checks of `vector {kind}` blocks failed:\n\n{}",
            self.failures.len(),
            self.checked,
            self.failures.join("\n\n")
        );
    }
}

fn of_kind(kind: &str) -> Vec<Vector> {
    vectors().into_iter().filter(|v| v.kind == kind).collect()
}

#[test]
fn every_vector_block_is_of_a_known_kind() {
    let known = [
        "entry",
        "entry-invalid",
        "key",
        "tag-key",
        "message",
        "clear-record",
        "tag-counter",
    ];
    let all = vectors();
    assert!(!all.is_empty(), "PROTOCOL.md has no vector blocks");
    for v in &all {
        assert!(known.contains(&v.kind.as_str()), "{}: unknown kind", v.at());
    }
    for kind in known {
        assert!(
            all.iter().any(|v| v.kind == kind),
            "PROTOCOL.md has no `vector {kind}` block"
        );
    }
}

// --- entries ---

fn codec_named(v: &Vector) -> Codec {
    match v.req("codec") {
        "msgpack" => Codec::msgpack(),
        "json" => Codec::json(),
        other => panic!("{}: unknown codec {other:?}", v.at()),
    }
}

/// `none`, `lz4` or `lz4 threshold=<bytes>`.
fn compression_named(v: &Vector) -> Compression {
    let text = v.get("compression").unwrap_or("none");
    let mut words = text.split_whitespace();
    let base = match words.next() {
        Some("none") => Compression::none(),
        Some("lz4") => Compression::lz4(),
        _ => panic!("{}: unknown compression {text:?}", v.at()),
    };
    match words.next() {
        None => base,
        Some(word) => {
            let threshold = word
                .strip_prefix("threshold=")
                .and_then(|n| n.parse().ok())
                .unwrap_or_else(|| panic!("{}: bad compression {text:?}", v.at()));
            base.threshold(threshold)
        }
    }
}

/// The entry a `vector entry` block describes.
fn entry_of(v: &Vector) -> Entry {
    let codec = codec_named(v);
    let negative = match v.get("negative").unwrap_or("false") {
        "true" => true,
        "false" => false,
        other => panic!("{}: negative is {other:?}", v.at()),
    };
    let payload = match v.get("value") {
        Some(json) => {
            let value: serde_json::Value = serde_json::from_str(json)
                .unwrap_or_else(|e| panic!("{}: value is not JSON: {e}", v.at()));
            codec.encode(&value).expect("a JSON value serializes")
        }
        None => Vec::new(),
    };
    // Tags and the transition stamp, in the block's order.
    let mut tags = Vec::new();
    for (name, value) in &v.fields {
        match name.as_str() {
            "tag" => {
                let (generation, tag) = value
                    .split_once(' ')
                    .unwrap_or_else(|| panic!("{}: `tag: <generation> <tag>`", v.at()));
                tags.push(TagStamp {
                    tag: tag.as_bytes().to_vec(),
                    generation: generation.parse().expect("a generation"),
                });
            }
            "stamp" => tags.push(TagStamp {
                tag: Vec::new(),
                generation: value.parse().expect("a stamp"),
            }),
            _ => {}
        }
    }
    let validator = v.bytes("validator").map(Vec::into_boxed_slice);
    let grace_ms = v.get("grace_ms").map(|_| v.num("grace_ms"));
    let namespace = v.get("namespace").map(|_| v.num("namespace"));
    Entry {
        codec,
        negative,
        fresh_until: v.num("fresh_until"),
        stale_until: v.num("stale_until"),
        load_ms: u32::try_from(v.num("load_ms")).expect("load_ms is a u32"),
        payload,
        tags: tags.into(),
        extra: Extra::new(validator, grace_ms).in_namespace(namespace),
    }
}

#[test]
fn entry_vectors_encode_and_decode_as_documented() {
    let mut report = Report::default();
    for v in of_kind("entry") {
        let entry = entry_of(&v);
        if let Some(documented) = v.get("payload_hex") {
            report.check(&v, v.unhex(documented) == entry.payload, || {
                format!(
                    "the codec writes\n{}",
                    pasteable("payload_hex", &entry.payload, &[])
                )
            });
        }
        let encoded = entry.encode(&compression_named(&v));
        let documented = v.unhex(v.req("hex"));
        report.check(&v, documented == encoded, || {
            format!(
                "the encoder writes\n{}",
                pasteable("hex", &encoded, &HEADER_GROUPS)
            )
        });
        match Entry::decode(documented, Compression::DEFAULT_MAX_DECOMPRESSED) {
            Ok(decoded) => {
                report.check(&v, decoded == entry, || {
                    format!("decodes as {decoded:?}, the block says {entry:?}")
                });
                if let Some(json) = v.get("value") {
                    let value: serde_json::Value = serde_json::from_str(json).expect("JSON");
                    let read = decoded.value::<serde_json::Value>();
                    report.check(&v, read.as_ref().ok() == Some(&value), || {
                        format!("its value reads as {read:?}")
                    });
                }
            }
            Err(err) => report.check(&v, false, || format!("does not decode: {err}")),
        }
    }
    report.finish("entry");
}

#[test]
fn invalid_entry_vectors_are_refused_as_documented() {
    let mut report = Report::default();
    for v in of_kind("entry-invalid") {
        let bytes = v.unhex(v.req("hex"));
        let error = v.req("error");
        match Entry::decode(bytes, Compression::DEFAULT_MAX_DECOMPRESSED) {
            Ok(entry) => report.check(&v, false, || format!("decodes, as {entry:?}")),
            Err(err) => report.check(&v, err.to_string().contains(error), || {
                format!("is refused with {:?}, not {error:?}", err.to_string())
            }),
        }
    }
    report.finish("entry-invalid");
}

// --- keys ---

/// A cache of `String`s on `store` with the block's prefix, namespace and
/// version.
fn cache_of(v: &Vector, store: &MemoryStore) -> Cache<String> {
    let version = u32::try_from(v.num("version")).expect("a u32 version");
    Cache::<String>::builder()
        .key_prefix(v.req("key_prefix"))
        .namespace(v.req("namespace"))
        .version(version)
        .store(store.clone())
        .ttl(Duration::from_secs(60))
        .jitter(Jitter::none())
        .build()
        .unwrap_or_else(|e| panic!("{}: {e}", v.at()))
}

/// Waits (at most 5 s) until `ready` resolves `true`.
async fn eventually<F, Fut>(mut ready: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while tokio::time::Instant::now() < deadline {
        if ready().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    false
}

/// The next message on `sub` that `wanted` accepts, within 2 s.
async fn next_message(
    sub: &mut crate::store::Subscription,
    wanted: impl Fn(&[u8]) -> bool,
) -> Option<Vec<u8>> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
    loop {
        let left = deadline.checked_duration_since(tokio::time::Instant::now())?;
        match tokio::time::timeout(left, sub.recv()).await {
            Ok(Some(Delivery::Message(m))) if wanted(&m) => return Some(m.to_vec()),
            Ok(Some(_)) => {}
            _ => return None,
        }
    }
}

#[tokio::test]
async fn key_vectors_are_the_keys_a_cache_uses() {
    let mut report = Report::default();
    for v in of_kind("key") {
        let store = MemoryStore::new();
        let cache = cache_of(&v, &store);
        let key = v.req_bytes("key");
        let storage = v.req_bytes("storage_key");
        let built = cache.storage_key(&key[..]).expect("a valid key");
        report.check(&v, built == storage, || {
            format!("the cache's key is\n{}", field("storage_key", &built))
        });
        let clear = v.req_bytes("clear_key");
        report.check(&v, cache.clear_record_key() == clear, || {
            format!(
                "clear_key is {:?}",
                String::from_utf8_lossy(cache.clear_record_key())
            )
        });
        // The lease a load holds.
        let lease = v.req_bytes("lease_key");
        let gate = Arc::new(Notify::new());
        let load = {
            let (cache, gate, key) = (cache.clone(), Arc::clone(&gate), key.clone());
            tokio::spawn(async move {
                cache
                    .get_or_load(key, move || async move {
                        gate.notified().await;
                        Ok::<_, std::io::Error>(Some("v".to_owned()))
                    })
                    .await
            })
        };
        let held = eventually(|| {
            let (store, lease) = (store.clone(), lease.clone());
            async move { store.lease_held(&lease).await.unwrap_or(false) }
        })
        .await;
        report.check(&v, held, || {
            // The lease key is the storage key with its record marker
            // (`v`, the byte before the last `:` of the value prefix) made
            // `l`: printed so, for a block whose storage_key is fixed first.
            let prefix = cache.storage_key(b"x").expect("a key").len() - 3;
            let mut lease = built.clone();
            lease[prefix - 2] = b'l';
            format!(
                "no lease is held under lease_key during a load; try\n{}",
                field("lease_key", &lease)
            )
        });
        gate.notify_one();
        load.await
            .expect("the load ran")
            .expect("the load succeeded");
        // The entry is under the storage key, the record under its key.
        let stored = store.get(&storage).await.expect("memory store");
        report.check(&v, stored.is_some(), || {
            "nothing stored under storage_key after a load".to_owned()
        });
        let record = store.get(&clear).await.expect("memory store");
        report.check(
            &v,
            record.as_deref().and_then(NamespaceState::parse).is_some(),
            || "no clear record under clear_key after a write".to_owned(),
        );
        // The channel an invalidation goes to.
        let mut sub = store.subscribe(v.req_bytes("channel").as_slice());
        assert!(sub.ready(Duration::from_secs(1)).await);
        cache.invalidate(&key[..]).await.expect("invalidated");
        let heard = next_message(&mut sub, |m| {
            m.first() == Some(&b'i') && m.get(9..) == Some(&storage[..])
        })
        .await;
        report.check(&v, heard.is_some(), || {
            "no `i` message naming storage_key on channel".to_owned()
        });
        // The lease index is a Redis store's: tests/protocol_keys.rs.
        let index = v.req_bytes("lease_index");
        report.check(&v, !index.is_empty(), || "an empty lease_index".to_owned());
    }
    report.finish("key");
}

#[tokio::test]
async fn tag_key_vectors_are_the_counters_a_tagged_write_makes() {
    let mut report = Report::default();
    for v in of_kind("tag-key") {
        let store = MemoryStore::new();
        let cache = cache_of(&v, &store);
        let tag = v.req_bytes("tag");
        let counter = v.req_bytes("counter_key");
        report.check(
            &v,
            store.get(&counter).await.expect("memory").is_none(),
            || "the counter exists before the write".to_owned(),
        );
        cache
            .entry(&v.req_bytes("key")[..])
            .tags([&tag[..]])
            .set(&"v".to_owned())
            .await
            .expect("written");
        let held = store.get(&counter).await.expect("memory");
        report.check(
            &v,
            held.as_deref().and_then(parse_tag_state).is_some(),
            || {
                // Tags are hash-tagged as keys are: a storage key of the
                // tag, its record marker `v` made `t`, without the version.
                let plain = Cache::<String>::builder()
                    .key_prefix(v.req("key_prefix"))
                    .namespace(v.req("namespace"))
                    .build()
                    .expect("valid");
                let mut guess = plain.storage_key(&tag[..]).expect("a valid tag");
                let marker = plain.storage_key(b"x").expect("a key").len() - 3 - 2;
                guess[marker] = b't';
                format!(
                    "counter_key holds {held:?} after a tagged write; try\n{}",
                    field("counter_key", &guess)
                )
            },
        );
    }
    report.finish("tag-key");
}

// --- bus messages ---

/// The sender id the blocks show (a cache draws its own at random).
fn documented_sender(v: &Vector) -> Vec<u8> {
    let sender = v.unhex(v.req("sender_hex"));
    assert_eq!(sender.len(), 8, "{}: a sender id is 8 bytes", v.at());
    sender
}

/// The message a `vector message` block describes, from its fields.
fn message_of(v: &Vector) -> Vec<u8> {
    let kind = v.req("kind").as_bytes();
    assert_eq!(kind.len(), 1, "{}: a kind is one byte", v.at());
    let mut m = kind.to_vec();
    m.extend_from_slice(&documented_sender(v));
    let keys: Vec<Vec<u8>> = v
        .fields
        .iter()
        .filter(|(n, _)| n == "key")
        .map(|(_, k)| k.as_bytes().to_vec())
        .collect();
    match kind[0] {
        b'I' => {
            for key in &keys {
                m.extend_from_slice(&u32::try_from(key.len()).unwrap().to_be_bytes());
                m.extend_from_slice(key);
            }
        }
        b'v' | b'p' | b'x' => {
            let key = &keys[0];
            m.extend_from_slice(&u32::try_from(key.len()).unwrap().to_be_bytes());
            m.extend_from_slice(key);
            match kind[0] {
                b'x' => m.extend_from_slice(v.req("code").as_bytes()),
                _ => m.extend_from_slice(&v.unhex(v.req("entry_hex"))),
            }
        }
        b'c' => m.extend_from_slice(v.req("record").as_bytes()),
        b'a' => m.extend_from_slice(v.req("generation").as_bytes()),
        _ => m.extend_from_slice(keys.first().map_or(&[][..], Vec::as_slice)),
    }
    m
}

/// Two caches of namespace `products` on one memory store send every kind
/// of message; what the channel carried, in order.
async fn scenario() -> Vec<Vec<u8>> {
    let store = MemoryStore::new();
    let mut sub = store.subscribe(b"bw:products:events");
    assert!(sub.ready(Duration::from_secs(1)).await);
    let build = || {
        Cache::<String>::builder()
            .namespace("products")
            .store(store.clone())
            .ttl(Duration::from_secs(60))
            .jitter(Jitter::none())
            .build()
            .expect("valid settings")
    };
    let (a, b) = (build(), build());
    let value = |v: &str| {
        let v = v.to_owned();
        move || async move { Ok::<_, std::io::Error>(Some(v)) }
    };
    // `c` (the first write's pin), `f`.
    a.get_or_load("sku:1", value("espresso")).await.unwrap();
    // `i`, `I`, `t`.
    a.invalidate("sku:1").await.unwrap();
    a.invalidate_many(["sku:1", "sku:2"]).await.unwrap();
    a.invalidate_tag("shop:7").await.unwrap();
    // `v`: B waits for A's load.
    let gate = Arc::new(Notify::new());
    let leader = {
        let (a, gate) = (a.clone(), Arc::clone(&gate));
        tokio::spawn(async move {
            a.get_or_load("sku:3", move || async move {
                gate.notified().await;
                Ok::<_, std::io::Error>(Some("latte".to_owned()))
            })
            .await
        })
    };
    assert!(
        eventually(|| {
            let store = store.clone();
            async move {
                store
                    .lease_held(b"bw:products:l:{sku:3}")
                    .await
                    .unwrap_or(false)
            }
        })
        .await
    );
    let waiter = {
        let b = b.clone();
        tokio::spawn(async move { b.get_or_load("sku:3", value("other")).await })
    };
    // B has found the lease held (and marked it waited on) by then.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    gate.notify_one();
    leader.await.unwrap().unwrap();
    waiter.await.unwrap().unwrap();
    // `x`: the loader fails.
    let failed = a
        .get_or_load("sku:4", || async {
            Err::<Option<String>, _>(std::io::Error::other("database down"))
        })
        .await;
    assert!(failed.is_err());
    // `p`: a value not to cache.
    a.get_or_load_with_context("sku:5", |_| async {
        Ok::<_, std::io::Error>(Loaded::value("mocha".to_owned()).do_not_cache())
    })
    .await
    .unwrap();
    // `r`: the loader chose a tag whose counter the load created, so its
    // value is not written and the lease is given back.
    a.get_or_load_with_context("sku:6", |_| async {
        Ok::<_, std::io::Error>(Loaded::value("chai".to_owned()).tags(["shop:9"]))
    })
    .await
    .unwrap();
    // `c`, `a`. (This test's own subscription never acknowledges: the
    // clear reports it, after waiting for it.)
    let _ = a.clear(ClearMode::Hard).await;
    let mut heard = Vec::new();
    while let Ok(Some(delivery)) =
        tokio::time::timeout(Duration::from_millis(300), sub.recv()).await
    {
        if let Delivery::Message(m) = delivery {
            heard.push(m.to_vec());
        }
    }
    heard
}

/// `live` as the block would show it: its sender replaced by the
/// block's, and a tail that depends on time or chance (an entry, a
/// record, a generation) replaced by the block's once it is checked to
/// be one. `None` if the tail is not what its kind carries.
fn normalized(v: &Vector, live: &[u8]) -> Option<Vec<u8>> {
    let documented = message_of(v);
    if live.len() < 9 || live[0] != documented[0] {
        return None;
    }
    let mut m = live.to_vec();
    m[1..9].copy_from_slice(&documented[1..9]);
    let kind = live[0];
    let head = |m: &[u8]| -> Option<usize> {
        match kind {
            b'v' | b'p' | b'x' => {
                let len = u32::from_be_bytes(m.get(9..13)?.try_into().ok()?) as usize;
                Some(13 + len)
            }
            _ => Some(9),
        }
    };
    let (at, at_doc) = (head(&m)?, head(&documented)?);
    let tail = m.get(at..)?.to_vec();
    let ok = match kind {
        b'v' | b'p' => Entry::decode(tail, Compression::DEFAULT_MAX_DECOMPRESSED).is_ok(),
        b'c' => NamespaceState::parse(&tail).is_some(),
        b'a' => parse_generation(&tail).is_some(),
        _ => return Some(m),
    };
    if !ok {
        return None;
    }
    m.truncate(at);
    m.extend_from_slice(documented.get(at_doc..)?);
    Some(m)
}

#[tokio::test]
async fn message_vectors_are_what_caches_send() {
    let heard = scenario().await;
    let mut report = Report::default();
    for v in of_kind("message") {
        let documented = message_of(&v);
        let hex_field = v.unhex(v.req("hex"));
        report.check(&v, hex_field == documented, || {
            format!(
                "its fields make\n{}",
                pasteable("hex", &documented, &[1, 8])
            )
        });
        let same_kind: Vec<&Vec<u8>> = heard.iter().filter(|m| m[0] == documented[0]).collect();
        // A tail that depends on time or chance must still be one of its
        // kind (the scenario's own are shown).
        let tail_ok = match documented[0] {
            b'v' | b'p' => Entry::decode(
                v.unhex(v.req("entry_hex")),
                Compression::DEFAULT_MAX_DECOMPRESSED,
            )
            .is_ok(),
            b'c' => NamespaceState::parse(v.req("record").as_bytes()).is_some(),
            // It acknowledges the clear a `c` block shows.
            b'a' => {
                let cleared: Vec<u64> = of_kind("message")
                    .iter()
                    .filter_map(|c| c.get("record"))
                    .filter_map(|r| NamespaceState::parse(r.as_bytes()))
                    .filter(|state| !state.is_pin())
                    .map(|state| state.generation)
                    .collect();
                parse_generation(v.req("generation").as_bytes())
                    .is_some_and(|g| cleared.contains(&g))
            }
            _ => true,
        };
        report.check(&v, tail_ok, || {
            let mut said = String::from("its tail is not one of its kind; the scenario sent");
            for m in &same_kind {
                let _ = write!(said, "\n{}", pasteable("hex", m, &[1, 8]));
            }
            said
        });
        let matched = same_kind
            .iter()
            .any(|m| normalized(&v, m).as_deref() == Some(&documented[..]));
        report.check(&v, matched, || {
            let mut said = String::from("the scenario sent no such message; of its kind:");
            for m in &same_kind {
                let shown = normalized(&v, m).unwrap_or_else(|| m.to_vec());
                let _ = write!(
                    said,
                    "\n{}\n(live: {})",
                    pasteable("hex", &shown, &[1, 8]),
                    pasteable("hex", m, &[1, 8])
                );
            }
            said
        });
    }
    report.finish("message");
}

// --- clear records ---

/// `name=value` words of `text`.
fn words(v: &Vector, text: &str) -> Vec<(String, String)> {
    text.split_whitespace()
        .skip(1)
        .map(|w| {
            let (name, value) = w
                .split_once('=')
                .unwrap_or_else(|| panic!("{}: `{w}` is not name=value", v.at()));
            (name.to_owned(), value.to_owned())
        })
        .collect()
}

fn word(v: &Vector, words: &[(String, String)], name: &str) -> u64 {
    words
        .iter()
        .find(|(n, _)| n == name)
        .and_then(|(_, value)| value.parse().ok())
        .unwrap_or_else(|| panic!("{}: no number `{name}=` in `op`", v.at()))
}

fn standing_text(standing: Standing) -> String {
    match standing {
        Standing::Current => "current".to_owned(),
        Standing::Cleared => "cleared".to_owned(),
        Standing::Soft { at, window, by } => match by {
            Some(by) => format!("soft at={at} window={window} by={by}"),
            None => format!("soft at={at} window={window}"),
        },
        Standing::Adopted { at } => format!("adopted at={at}"),
    }
}

/// The record `op` makes over the block's `over` (or over none).
fn record_made(v: &Vector, op: &str) -> NamespaceState {
    if let Some(over) = v.get("over") {
        assert!(
            of_kind("clear-record")
                .iter()
                .any(|o| o.get("record") == Some(over)),
            "{}: `over` is no other block's record",
            v.at()
        );
    }
    let held = v.get("over").map(|over| {
        NamespaceState::parse(over.as_bytes())
            .unwrap_or_else(|| panic!("{}: `over` is no record", v.at()))
    });
    let w = words(v, op);
    let (now, fresh) = (word(v, &w, "now"), word(v, &w, "fresh"));
    match op.split_whitespace().next() {
        Some("pin") => NamespaceState::pinned(held, None, now, fresh).0,
        Some("hard") => NamespaceState::cleared(held, true, 0, now, fresh),
        Some("soft") => NamespaceState::cleared(held, false, word(v, &w, "window"), now, fresh),
        _ => panic!("{}: unknown op {op:?}", v.at()),
    }
}

#[test]
fn clear_record_vectors_parse_encode_and_judge_as_documented() {
    let mut report = Report::default();
    for v in of_kind("clear-record") {
        let record = v.req("record");
        let parsed = NamespaceState::parse(record.as_bytes());
        if let Some(op) = v.get("op") {
            let made = record_made(&v, op);
            report.check(&v, Some(made) == parsed, || {
                format!(
                    "`{op}` makes\nrecord: {}\nN: {}\nH: {}\nT: {}\nW: {}\nL: {}\nS: {}\nE: {}",
                    String::from_utf8_lossy(&made.encode()),
                    made.generation,
                    made.floor,
                    made.soft_at,
                    made.window,
                    made.legacy,
                    made.stale_below,
                    made.stale_by
                )
            });
        }
        if v.get("parse") == Some("none") {
            report.check(&v, parsed.is_none(), || format!("parses as {parsed:?}"));
            continue;
        }
        let Some(state) = parsed else {
            report.check(&v, false, || "does not parse".to_owned());
            continue;
        };
        let fields = [
            ("N", state.generation),
            ("H", state.floor),
            ("T", state.soft_at),
            ("W", state.window),
            ("L", state.legacy),
            ("S", state.stale_below),
            ("E", state.stale_by),
        ];
        for (name, value) in fields {
            report.check(&v, v.num(name) == value, || {
                format!("{name} parses as {value}")
            });
        }
        // Records of seven parts are written back as they are.
        if record.split(':').count() == 7 {
            let encoded = state.encode();
            report.check(&v, encoded == record.as_bytes(), || {
                format!("encodes as {:?}", String::from_utf8_lossy(&encoded))
            });
        }
        report.check(&v, state.is_pin() == (v.get("pin") == Some("true")), || {
            format!("is_pin() is {}", state.is_pin())
        });
        for (name, judged) in &v.fields {
            if name != "judge" {
                continue;
            }
            let (recorded, said) = judged
                .split_once("->")
                .unwrap_or_else(|| panic!("{}: `judge: <g|none> -> <standing>`", v.at()));
            let recorded = match recorded.trim() {
                "none" => None,
                g => Some(g.parse().expect("a generation")),
            };
            let standing = standing_text(NamespaceState::standing(Some(&state), recorded));
            report.check(&v, standing == said.trim(), || {
                format!("an entry that recorded {recorded:?} stands {standing}")
            });
        }
    }
    report.finish("clear-record");
}

// --- tag counters ---

fn judgment_text(judgment: TagJudgment) -> String {
    match judgment {
        TagJudgment::Valid => "valid".to_owned(),
        TagJudgment::StaleFrom(at) => format!("stale from={at}"),
        TagJudgment::Miss => "miss".to_owned(),
    }
}

#[test]
fn tag_counter_vectors_parse_encode_and_judge_as_documented() {
    let mut report = Report::default();
    for v in of_kind("tag-counter") {
        let stored = v.req("stored");
        let parsed = parse_tag_state(stored.as_bytes());
        if v.get("parse") == Some("none") {
            report.check(&v, parsed.is_none(), || format!("parses as {parsed:?}"));
            continue;
        }
        let Some(state) = parsed else {
            report.check(&v, false, || "does not parse".to_owned());
            continue;
        };
        for (name, value) in [
            ("G", state.generation),
            ("H", state.floor),
            ("T", state.expired_at),
            ("F", state.hard_at),
        ] {
            report.check(&v, v.num(name) == value, || {
                format!("{name} parses as {value}")
            });
        }
        let encoded = state.encode();
        report.check(&v, encoded == stored.as_bytes(), || {
            format!("encodes as {:?}", String::from_utf8_lossy(&encoded))
        });
        if let Some(op) = v.get("op") {
            let over = v.get("over").and_then(|o| parse_tag_state(o.as_bytes()));
            if let Some(o) = v.get("over") {
                assert!(
                    of_kind("tag-counter")
                        .iter()
                        .any(|b| b.get("stored") == Some(o)),
                    "{}: `over` is no other block's counter",
                    v.at()
                );
            }
            let w = words(&v, op);
            let made = match (op.split_whitespace().next(), over) {
                (Some("bump"), Some(over)) => over.bumped(),
                (Some("expire"), Some(over)) => over.expired(word(&v, &w, "at")),
                (Some("date"), Some(over)) => over.dated(word(&v, &w, "now")),
                (Some("start"), None) => {
                    TagState::started(word(&v, &w, "fresh"), word(&v, &w, "now"))
                }
                _ => panic!("{}: unknown op {op:?} (over {over:?})", v.at()),
            };
            report.check(&v, made == state, || {
                format!(
                    "`{op}` makes\nstored: {}\nG: {}\nH: {}\nT: {}\nF: {}",
                    String::from_utf8_lossy(&made.encode()),
                    made.generation,
                    made.floor,
                    made.expired_at,
                    made.hard_at
                )
            });
        }
        for (name, judged) in &v.fields {
            if name != "judge" {
                continue;
            }
            let (recorded, said) = judged
                .split_once("->")
                .unwrap_or_else(|| panic!("{}: `judge: <g> -> <judgment>`", v.at()));
            let recorded: u64 = recorded.trim().parse().expect("a generation");
            let judgment = judgment_text(state.judge(recorded));
            report.check(&v, judgment == said.trim(), || {
                format!("an entry that recorded {recorded} is judged {judgment}")
            });
        }
    }
    report.finish("tag-counter");
}
