//! A deterministic, seeded fault-schedule simulation of a fleet of caches
//! over one store, checking the coherence contract (DESIGN.md, "Coherence").
//!
//! # The world
//!
//! One [`MemoryStore`] plays the shared Redis. Each simulated process has its
//! own [`ChaosStore`] in front of it (the library's, from
//! `breakwater_cache::testing`, the `test-util` feature; this file draws its
//! faults and traces what it reports) and its own [`Cache`] (some with an L1
//! near cache, some with grace), so the processes share entries, leases and the
//! bus exactly as over Redis, while every store call of one process can be
//! delayed before it runs, delayed after it ran (replies are reordered),
//! answered with a timeout after it ran, refused before it ran ("connection
//! dropped"), or, during a stop window, hang for a response timeout and fail.
//! Each process's subscription is fed by its own forwarding task that loses
//! messages and sometimes drops the "connection" (`ready` false, `Missed`,
//! later `ready` true and `Missed` again). A shared table plays the database
//! (`key -> version`); every loader sleeps a seeded delay (mostly short,
//! sometimes longer than `lock_wait`), then reads the current version. The
//! workload bumps the version before every `invalidate` and `set` (writes to
//! one key are serialised, as an application writing under a row lock would),
//! so "newer" is simply "higher version".
//!
//! Everything runs on a current-thread tokio runtime with paused time, and
//! every random choice (workload, faults, loader delays, the caches' own
//! `rng_seed`) derives from one `u64` seed, so a seed replays exactly; see
//! `one_seed_replays_exactly`. Run one seed with `BREAKWATER_SIM_SEED=<s>
//! cargo test -p breakwater-cache --features test-util --test simulation`, a
//! soak with `BREAKWATER_SIM_SEEDS=<n>` (from `BREAKWATER_SIM_SEED`, or 1000);
//! `BREAKWATER_SIM_DUMP=<dir>` writes each seed's violations and whole trace
//! (every call, every store write, read and lease call with when it ran and
//! what it replied, bus drops, fault phases) to `<dir>/seed-<s>.txt`.
//!
//! Each check was seen to fail with the bug it is for put back (the
//! CHANGELOG and the closing note of issue 11 list the seeds).
//!
//! # The checks (one per contract line)
//!
//! **no-resurrection** (Coherence 1–3). When `invalidate(k)` or `set(k, ..)`
//! returns `Ok` in process P after the database reached version `v`, every
//! `get_or_load(k)` that *starts after it returned* (by a global sequence
//! number, not by time) must return a version `>= v`: in P always (any
//! `Served`; no fallback is configured); in another process without L1 if it
//! starts later than one store reply can take (`MAX_REPLY`: a reply already
//! on the wire when the invalidation returned may still land, but nothing the
//! store answers to a request sent afterwards may be older); in another
//! process with L1 if it starts later than its L1 TTL plus `MAX_REPLY` (the
//! documented bound when bus messages are lost), except for an answer
//! `Stale { reason: StoreUnavailable }`: another process's L1 standing in for
//! an unreachable store is the outage shield DESIGN.md describes ("still
//! servable as stale while the store is unreachable"), and it may not have
//! heard of the invalidation; the time check still bounds its age. A `set`
//! whose caller went away before the store ran it is a pending operation:
//! if the store runs it after all (a queued batch already sent is not called
//! back for one of its callers), its version may land after a later writer's
//! returned, and is not held to that writer's fence.
//!
//! **one-load-slow-loader** (Coherence 4). A healthy fleet (no faults, the
//! cache's default lease and lock settings) fires 50 concurrent callers per
//! process at a fresh key whose loader takes 8 s, longer than the default
//! `lock_wait`: exactly one loader call, no errors, every caller gets it.
//!
//! **one-load-holder-death** (Coherence 4). The same, with a 3 s loader, and
//! the process whose loader starts first is partitioned from the store at
//! that moment (every call hangs for the response timeout, then fails, for
//! good): exactly two loader calls in all (the partitioned one and one
//! takeover), and every caller in the other processes gets the value.
//!
//! **one-load-slow-store** (Coherence 4, issue 27). A healthy fleet over a
//! store that answers every call 40–49 ms late, then (a new key) 51–70 ms
//! late, with deadlines that follow the latency as `RedisStore`'s do (a
//! read's starts at 50 ms, a write's at 250 ms; a timeout triples its
//! kind's): 50 concurrent callers per process, a 200 ms loader: exactly
//! one loader call and no errors. Just above the read deadline each
//! process's first read times out: that must not skip the fleet's lease.
//!
//! **batch-holder-death** (Coherence 4, for batches). A healthy fleet, each
//! process asking `get_many` for its window of overlapping keys (a seeded
//! 40 to 150 keys, windows a seeded step apart, released within 20 ms),
//! 500 ms batch loader; the process whose batch loader starts first is
//! partitioned at that moment (it dies mid-batch). Every survivor gets
//! every value, takes the dead holder's keys over in at most 2 loader calls
//! (one batch), and is done within the lease TTL plus two loads of the
//! death; no key is loaded more than twice.
//!
//! **liveness** (Coherence 5). Every call is wrapped in a timeout of the
//! bound `Cache`'s docs state, for the default settings and this store's
//! longest reply (`BOUND`, 72.25 s); running into it is a failure.
//!
//! **time** (Coherence 6). A `Hit` must not be older than the longest fresh
//! window (`ttl * (1 + jitter ratio)`), and a `Stale` value not older than
//! that plus the calling process's `max_stale` (its grace: a process with
//! grace 0 has opted out of stale values), measured on tokio's clock (the
//! memory store's) at the call's start (the earliest moment it can have
//! been judged), from the most recent moment that version was produced
//! before the call returned (a loader's database read, which is the end of
//! the loader, just before the entry is sealed; or the start of the `set`
//! that wrote it), with 5 ms of tolerance for whole-millisecond store
//! timestamps.
//!
//! **early-refresh-l1** (XFetch under L1). A healthy process with L1, grace
//! 0 and the default early refresh reads one key every 10 ms for ten TTLs
//! with a 100 ms loader. After the first load no caller may be served
//! `Loaded` (one caller of every foreground load is: an entry reached its
//! expiry with no refresh in flight), and at most 10 callers (one load's
//! worth) may be `Coalesced`. Early expiration is probabilistic: with
//! XFetch(1.0), a 100 ms load and reads every 10 ms, the first refresh of an
//! expiry starts inside its last 100 ms about 2 % of the time, and callers
//! from then on join it; with "no `Coalesced` at all", a correct cache
//! (the same round without L1) fails 3 of 20 seeds, so that is tolerated.

//! `get_many` is checked the same way: in the chaos phase a tenth of the
//! calls are `get_many` of 2 to 5 random keys, each key's result checked as
//! a `get_or_load` of it that started with the batch; in the one-load
//! rounds every fifth caller asks through `get_many`.
//!
//! Tags get a chaos round of their own (a new fleet, keys `t00`..): every
//! key carries its group's tag (`g0`..`g2`); reads are tagged
//! `get_or_load`s (a tenth of them tagged `get_many`s of keys of one
//! group), a third of them with the tag chosen by the loader after the
//! load instead (`Loaded::tags`; and half of those `get_many`s, of keys
//! of any group, each tagged by its loader), `set`s are tagged, and a tenth of the calls are
//! `invalidate_tag` of a group (half of them `expire_tag`, a tenth
//! `invalidate_tags` of the group and the next), which bumps
//! every key of the group in the database (rows locked in order) before it;
//! once it returned `Ok`, each of those keys is fenced at its new version,
//! so no-resurrection, liveness and time are checked for tag invalidation
//! exactly as for `invalidate` (and for `expire_tag` as for `expire`: the
//! fence is soft, binding what is served fresh).
//! The store forgets tag counters in that round: every 0.3 to 3 s one
//! group's counter is dropped (as `maxmemory` eviction or a `DEL` would),
//! and no-resurrection must still hold (a lost counter validates nothing).
//!
//! Callers go away in every chaos round: 15% of the `invalidate`s and
//! `set`s are dropped 0 to 700 ms in (a cancelled request). One dropped
//! after the store ran it counts as returned at the drop: its local step
//! must have run (issue 27: it was skipped, and the process ignores its own
//! message on the bus, so its L1 served the old value until its TTL).
//!
//! Runtimes go away in every chaos round: now and then (1% per process
//! per scheduler tick) a process's subscription feeds end without a word,
//! as when the runtime that ran them is dropped. Its cache must notice
//! (L1 unverified at once, a new listener on its next call): before issue
//! 27 the listener ended quietly and L1 trusted a bus nobody listened to.
//!
//! The store forgets in every chaos round too: every 0.2 to 2 s a random
//! key's value or lease is dropped (memory pressure): a lost value is a
//! miss, a lost lease a free lease, and every check must still hold.
//! Every 1 to 6 s every lease of one process's version goes at once, as
//! when Redis loses the index of live leases (`RedisStore`'s leases hold
//! only while it names them): every load in flight is refused its write.
//!
//! **clears** (the plain round): now and then a process writes every row
//! and clears the namespace: hard (every process fenced at once), soft
//! with no window (fenced softly at once) or soft over up to 3 s (fenced
//! softly from the window's end: a later soft clear must never make an
//! entry fresher than an earlier one left it). Every 1 to 6 s the
//! namespace's clear record is lost (evicted, deleted): a lost record
//! validates nothing, and the hard clear that makes it again must bring
//! nothing back.
//!
//! **bus-heard** (Coherence 3, over a healthy bus). A healthy fleet:
//! process 0 serves a key from L1, process 1 revokes it (`invalidate`,
//! `set`, `invalidate_many`, `set_many`); 50 ms after the call returned,
//! process 0 must not serve the old copy (its L1 TTL is 30 s). The chaos
//! rounds lose messages, so there only L1's TTL bounds another process's
//! copy, and a notice nobody acted on would pass unseen.
//!
//! **batch writes** (the plain round): half of its `set`s are `set_many`s
//! and half of its `invalidate`s `invalidate_many`s, of the key and one to
//! three others (rows locked in order, each key fenced at its new version
//! once the call returned, or once the store ran it before its caller went
//! away), one store step under one fault plan and one bus message naming
//! every key: no-resurrection, liveness and time are checked for each key
//! exactly as for `set` and `invalidate`. One in ten of those `set_many`s
//! is side-by-side `set`s instead, of the same keys and the key's next
//! four: more than a cache lets into the air at once, so the rest meet in
//! its write queue and go out as one batch (12 to 16 such `set`s a seed
//! in seeds 1 to 3, each checked as a `set`).
//!
//! A rolling version bump gets a chaos round of its own (keys `v00`..):
//! processes 0 and 1 run version 1 without a transition (the code deployed
//! before), 2 and 3 version 2 inside its transition, over one database;
//! an invalidation or `set` by either version fences the key for all four
//! processes, so no-resurrection holds across versions (issue 26: version
//! 2 never heard version 1).
//!
//! **revoked-load round**: a process that hears nothing on the bus loads a
//! key with a loader that reads the database first and answers 0.8 to 2.5 s
//! later; another process invalidates the key meanwhile; calls in the deaf
//! process that start more than one reply after the invalidation returned
//! join the load still in the air, and no-resurrection holds them to the
//! new version (a revoked load answers only callers that started before).
//!
//! **adaptive round**: a chaos round (keys `a00`..) whose reads use
//! context loaders (`get_or_load_with_context`): each value's TTL chosen
//! by its loader (1 to 3 s), the version stored as its validator and
//! "not modified" answered when it matches, every fifth version not
//! cached; 8% of the calls are forced refreshes (`refresh_with_context`),
//! checked as reads; a tenth of the calls `expire` (after a database write), which
//! fences the key softly: every later call the fence binds may get an older
//! version only as `Stale`.
//!
//! **renew-revoked**: a refresh that answers "not modified" after a
//! slow, read-first load while another process changes the row and
//! `expire`s the key: the renewal is refused, and no later call is served
//! the old version as fresh.
//!
//! **expire-reaches-l1**: two healthy processes with L1 and grace; one
//! changes and `expire`s keys the other holds in L1; the other's calls
//! from one reply later are never served an older version as fresh (the
//! expiry must reach its L1 over the bus).
//!
//! **fail-safe-l1** (the empty-restart round): two processes with L1 and a
//! minute of `max_stale` hold six keys; the store then loses every entry
//! and lease of them and the database goes down; for 20 s, every call on
//! those keys, past their fresh time and inside `max_stale`, must be
//! answered (from L1), never fail.
//!
//! Besides: **wrong-key** (a value came back under another key) and
//! **errors-in-healthy-round**.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use breakwater_cache::testing::{BusChange, ChaosEvent, ChaosStore, Faults};
use breakwater_cache::{
    Cache, ClearMode, Error, Fetched, Jitter, L1Config, LoadContext, Loaded, MemoryStore, Served,
    StaleReason, Store,
};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use serde::{Deserialize, Serialize};
use tokio::time::{Instant, sleep, timeout};

// ---------------------------------------------------------------- settings

/// How long a call to a stopped (or partitioned) store hangs before failing,
/// and how long a "timed out after it ran" call takes.
const RESPONSE_TIMEOUT: Duration = Faults::RESPONSE_TIMEOUT;
/// The longest chaos delay before or after one store call.
const MAX_DELAY_MS: u64 = Faults::MAX_DELAY.as_millis() as u64;
/// The longest one store reply can take under the faults: a delay before,
/// then a response timeout.
const MAX_REPLY: Duration =
    Duration::from_millis(MAX_DELAY_MS + RESPONSE_TIMEOUT.as_millis() as u64);
/// The entries' TTL in the chaos phase, and its jitter ratio.
const TTL: Duration = Duration::from_secs(3);
const JITTER: f64 = 0.1;
/// The grace the adaptive round's loader gives every third version, and
/// how its trace says so.
const OWN_GRACE: Duration = Duration::from_millis(300);
const OWN_GRACE_SAYS: &str = "own grace";
/// The L1 TTL of the processes that have an L1.
const L1_TTL: Duration = Duration::from_secs(2);
/// Every call's bound: the one `Cache`'s docs state (coherence line 5),
/// for the default settings (`load_timeout` 30 s, the bulkhead's
/// `queue_wait` 1 s, `lease_ttl` 3 s, so `lock_wait` 37 s) and a store
/// deadline S of `MAX_REPLY`: S + lock_wait + 4S (the lease asked twice) +
/// 250 ms + queue_wait + load_timeout, i.e. 68.25 s + 5 × 0.8 s = 72.25 s.
const BOUND: Duration = Duration::from_millis(
    37_000 + 30_000 + 1_000 + 250 + 5 * (MAX_DELAY_MS + RESPONSE_TIMEOUT.as_millis() as u64),
);
/// Whole-millisecond store timestamps.
const TOLERANCE: Duration = Duration::from_millis(5);
/// The chaos phase's length, and its workload.
const CHAOS_FOR: Duration = Duration::from_secs(120);
const WORKERS: usize = 16;
/// The chance, per process and scheduler tick (every 0.2 to 0.8 s), that
/// its subscriptions' tasks die (as with the runtime that ran them).
const FEED_DEATHS: f64 = 0.01;
/// The share of `invalidate`s and `set`s whose caller goes away before
/// they return (the future dropped 0 to 700 ms in).
const DROPPED_WRITES: f64 = 0.15;
const KEYS: usize = 12;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// An independent, reproducible stream for one purpose.
fn stream(seed: u64, purpose: u64) -> StdRng {
    StdRng::seed_from_u64(stream_seed(seed, purpose))
}

/// The seed of [`stream`]`(seed, purpose)`, for a [`ChaosStore`].
fn stream_seed(seed: u64, purpose: u64) -> u64 {
    seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ purpose
}

// ---------------------------------------------------------------- the store

/// One process's faults in a chaotic phase, drawn from the scheduler's
/// stream.
fn chaotic_faults(rng: &mut StdRng) -> Faults {
    Faults::HEALTHY
        .delay_before(rng.random_range(0.0..0.5))
        .delay_after(rng.random_range(0.0..0.5))
        .timeout_after(rng.random_range(0.0..0.08))
        .fail_before(rng.random_range(0.0..0.08))
        .message_loss(rng.random_range(0.0..0.5))
        .disconnect(rng.random_range(0.0..0.03))
}

/// Process `proc`'s view of the shared store, with seeded faults
/// (`breakwater_cache::testing::ChaosStore`), its store writes, lease
/// calls and bus changes traced, and its revoking writes counted.
fn chaos_store(inner: MemoryStore, seed: u64, world: &Arc<World>, proc: usize) -> ChaosStore {
    let world = Arc::clone(world);
    ChaosStore::new(inner, seed).observe(move |event| match event {
        // A revoking write (`replace`, `invalidate`) of a key, counted once
        // it ran in the store, whether or not its caller hears of it.
        ChaosEvent::Ran {
            method:
                method
                @ ("replace" | "replace_many" | "invalidate" | "invalidate_many" | "expire_entry"),
            key,
            result: Ok(_),
            ..
        } => {
            let user = user_key(key);
            let mut h = lock(&world.history);
            *h.revocations.entry(user.clone()).or_default() += 1;
            // Only a queued batch (one `replace_many` for several `set`s)
            // runs once one of its callers is gone: a call of its own is
            // its caller's future, and is dropped with it.
            let late = match method {
                "replace_many" => h.unsent.remove(&(proc, user.clone())),
                _ => None,
            };
            if let Some(version) = late {
                h.late.insert((user.clone(), version));
                drop(h);
                let outcome = format!("v{version}, its set's caller gone");
                world.trace(proc, "late-write", &user, Instant::now(), outcome);
            }
        }
        ChaosEvent::Replied {
            method,
            key,
            start,
            ran,
            reply,
            ..
        } => {
            let Some(name) = traced(method) else { return };
            let ran = match ran {
                Some((at, outcome)) => format!("ran at {} ms: {}", world.ms(at), show(outcome)),
                None => "not run".to_owned(),
            };
            let outcome = format!("{ran}; replied {}", show(reply));
            world.trace(proc, name, &user_key(key), start, outcome);
        }
        ChaosEvent::Bus(change) => {
            let what = match change {
                BusChange::StoreStopped => "down (store stopped)",
                BusChange::ConnectionDropped => "down (connection dropped)",
                BusChange::Up => "up",
                _ => "changed",
            };
            world.trace(proc, "bus", "-", Instant::now(), what.to_owned());
        }
        _ => {}
    })
}

/// A store method's name in the trace; `None` for those not traced.
fn traced(method: &str) -> Option<&'static str> {
    Some(match method {
        "get" => "s.get",
        "get_many" => "s.get_many",
        "set" => "s.set",
        "delete" => "s.delete",
        "acquire_lease" => "s.lease",
        "extend_lease" => "s.extend",
        "release_lease" => "s.release",
        "fenced_set" => "s.fenced",
        "pin" => "s.pin",
        "replace" => "s.replace",
        "replace_many" => "s.replace_many",
        "invalidate_many" => "s.invalid_many",
        "invalidate" => "s.invalid",
        "bump_generation" => "s.bump",
        "bump_generations" => "s.bumps",
        "tag_generations" => "s.tag_gens",
        "expire_entry" => "s.expire",
        "expire_generation" => "s.expire_tag",
        "fenced_renew" => "s.renew",
        _ => return None,
    })
}

fn show(result: Result<&str, &Error>) -> String {
    match result {
        Ok(v) => v.to_owned(),
        Err(e) => format!("error ({e})"),
    }
}

/// The user key inside a storage or lease key (between the braces).
fn user_key(key: &[u8]) -> String {
    let text = String::from_utf8_lossy(key);
    match (text.find('{'), text.rfind('}')) {
        (Some(a), Some(b)) if a < b => text[a + 1..b].to_owned(),
        _ => "-".to_owned(),
    }
}

// ---------------------------------------------------------------- the world

/// The cached value: which key, and which database version.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Val {
    key: String,
    version: u64,
}

/// One line of the trace.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Event {
    start_ms: u64,
    end_ms: u64,
    proc: usize,
    op: &'static str,
    key: String,
    outcome: String,
}

impl std::fmt::Display for Event {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:>7}..{:>7} ms  P{} {:<10} {:<12} {}",
            self.start_ms, self.end_ms, self.proc, self.op, self.key, self.outcome
        )
    }
}

/// A contract line that did not hold.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Violation {
    check: &'static str,
    message: String,
    /// The key it is about, and the trace's length when it was found.
    key: String,
    at: usize,
}

/// An `invalidate`, `set` or `expire` that returned `Ok`.
#[derive(Debug, Clone, Copy)]
struct Fence {
    proc: usize,
    /// Sequence number when it returned.
    seq: u64,
    at: Instant,
    version: u64,
    /// An `expire`: binds what is served fresh; an older value may still
    /// be served `Stale`.
    soft: bool,
    /// A hard `clear` that every process acknowledged: binds every
    /// process at once (L1 copies included), but an L1 copy standing in
    /// for an unreachable store, which cannot have heard.
    fleet: bool,
}

/// What a simulated process is, for the checker.
#[derive(Debug, Clone, Copy)]
struct Profile {
    l1_ttl: Option<Duration>,
    max_stale: Duration,
}

#[derive(Default)]
struct History {
    seq: u64,
    trace: Vec<Event>,
    fences: BTreeMap<String, Vec<Fence>>,
    /// When each (key, version) was produced (loader's read, or `set`).
    produced: BTreeMap<(String, u64), Vec<Instant>>,
    /// The (key, version)s a loader gave a grace of its own
    /// ([`OWN_GRACE`]), which widens the call's `max_stale` to it.
    own_grace: BTreeSet<(String, u64)>,
    /// Loader calls started, per key.
    load_calls: BTreeMap<String, Vec<usize>>,
    /// Revoking writes (`replace`, `invalidate`) that ran in the store, per
    /// user key (of any version).
    revocations: BTreeMap<String, u64>,
    /// The version of a `set` whose caller went away before the store ran
    /// it, by process and key, until that process's next queued batch
    /// (`replace_many`) of the key runs in the store.
    unsent: BTreeMap<(usize, String), u64>,
    /// (key, version)s written by a `set` whose caller had gone away: a
    /// write already sent is not called back (a queued batch in the air
    /// answers several callers), and may land after a later writer's
    /// returned, as any pending operation may.
    late: BTreeSet<(String, u64)>,
    /// Batch loader calls started: by which process, when, how many keys.
    batch_calls: Vec<(usize, Instant, usize)>,
    violations: Vec<Violation>,
}

/// The database, the history and the checker, shared by every task of one
/// run.
struct World {
    seed: u64,
    start: Instant,
    db: Mutex<BTreeMap<String, u64>>,
    history: Mutex<History>,
    /// Called with the process whose loader starts (holder-death round).
    on_load: Mutex<Option<LoadHook>>,
}

/// Told which process's loader starts, for which key.
type LoadHook = Box<dyn FnMut(usize, &str) + Send>;

/// What a simulated loader returns.
type LoadFuture =
    std::pin::Pin<Box<dyn Future<Output = Result<Option<Val>, std::convert::Infallible>> + Send>>;

/// What a simulated context loader returns.
type ContextFuture =
    std::pin::Pin<Box<dyn Future<Output = Result<Loaded<Val>, std::convert::Infallible>> + Send>>;

type BatchContextFuture = std::pin::Pin<
    Box<dyn Future<Output = Result<Vec<(String, Loaded<Val>)>, std::convert::Infallible>> + Send>,
>;

type BatchLoadFuture = std::pin::Pin<
    Box<dyn Future<Output = Result<Vec<(String, Val)>, std::convert::Infallible>> + Send>,
>;

impl World {
    fn new(seed: u64) -> Arc<World> {
        Arc::new(World {
            seed,
            start: Instant::now(),
            db: Mutex::default(),
            history: Mutex::default(),
            on_load: Mutex::new(None),
        })
    }

    /// Notes a loader's answer `how` for `key` at `version`: one with a
    /// grace of its own may be served stale that long whatever the call's
    /// `max_stale` (a loader's grace widens it, as documented).
    fn chose_grace(&self, key: &str, version: u64, how: &str) {
        if how == OWN_GRACE_SAYS {
            lock(&self.history)
                .own_grace
                .insert((key.to_owned(), version));
        }
    }

    fn ms(&self, t: Instant) -> u64 {
        u64::try_from((t - self.start).as_millis()).unwrap_or(u64::MAX)
    }

    fn next_seq(&self) -> u64 {
        let mut h = lock(&self.history);
        h.seq += 1;
        h.seq
    }

    fn version(&self, key: &str) -> u64 {
        lock(&self.db).get(key).copied().unwrap_or(0)
    }

    /// A write to the database: the next version of `key`.
    fn bump(&self, key: &str) -> u64 {
        let mut db = lock(&self.db);
        let v = db.entry(key.to_owned()).or_insert(0);
        *v += 1;
        *v
    }

    fn produced(&self, key: &str, version: u64, at: Instant) {
        lock(&self.history)
            .produced
            .entry((key.to_owned(), version))
            .or_default()
            .push(at);
    }

    fn trace(&self, proc: usize, op: &'static str, key: &str, start: Instant, outcome: String) {
        let event = Event {
            start_ms: self.ms(start),
            end_ms: self.ms(Instant::now()),
            proc,
            op,
            key: key.to_owned(),
            outcome,
        };
        lock(&self.history).trace.push(event);
    }

    /// Records a violation about `key`, with where the trace stood.
    fn violate(&self, check: &'static str, key: &str, message: String) {
        let message = format!("[seed {}] {message}", self.seed);
        let mut h = lock(&self.history);
        let at = h.trace.len();
        let key = key.to_owned();
        h.violations.push(Violation {
            check,
            message,
            key,
            at,
        });
    }

    fn load_calls(&self, key: &str) -> Vec<usize> {
        lock(&self.history)
            .load_calls
            .get(key)
            .cloned()
            .unwrap_or_default()
    }

    /// The loader of one call in process `proc`: sleeps `delay`, then reads
    /// the database.
    fn loader(
        self: &Arc<Self>,
        proc: usize,
        key: &str,
        delay: Duration,
    ) -> impl Fn() -> LoadFuture + Clone + Send + Sync + 'static {
        self.loader_of(proc, key, delay, false)
    }

    /// A loader whose query runs first and whose answer then takes `delay`
    /// to arrive (a slow network, a large row): the value it returns may
    /// be older than a write made while it was on its way.
    fn loader_reading_first(
        self: &Arc<Self>,
        proc: usize,
        key: &str,
        delay: Duration,
    ) -> impl Fn() -> LoadFuture + Clone + Send + Sync + 'static {
        self.loader_of(proc, key, delay, true)
    }

    /// [`loader`](Self::loader), reading the database before its delay if
    /// `read_first`.
    fn loader_of(
        self: &Arc<Self>,
        proc: usize,
        key: &str,
        delay: Duration,
        read_first: bool,
    ) -> impl Fn() -> LoadFuture + Clone + Send + Sync + 'static {
        let (world, key) = (Arc::clone(self), key.to_owned());
        move || {
            let (world, key) = (Arc::clone(&world), key.clone());
            Box::pin(async move {
                let start = Instant::now();
                lock(&world.history)
                    .load_calls
                    .entry(key.clone())
                    .or_default()
                    .push(proc);
                if let Some(hook) = lock(&world.on_load).as_mut() {
                    hook(proc, &key);
                }
                let read = || {
                    let version = world.version(&key);
                    world.produced(&key, version, Instant::now());
                    version
                };
                let version = if read_first {
                    let version = read();
                    sleep(delay).await;
                    version
                } else {
                    sleep(delay).await;
                    read()
                };
                let how = if read_first { " (read first)" } else { "" };
                world.trace(proc, "load", &key, start, format!("v{version}{how}"));
                Ok(Some(Val { key, version }))
            })
        }
    }

    /// The context loader of one call in the adaptive round (see
    /// [`get_adaptive`]): sleeps `delay`, then reads the database.
    fn context_loader(
        self: &Arc<Self>,
        proc: usize,
        key: &str,
        delay: Duration,
    ) -> impl FnOnce(LoadContext<Val>) -> ContextFuture + Clone + Send + Sync + 'static {
        self.context_loader_of(proc, key, delay, false)
    }

    /// [`context_loader`](Self::context_loader), reading the database
    /// before its delay if `read_first`.
    fn context_loader_of(
        self: &Arc<Self>,
        proc: usize,
        key: &str,
        delay: Duration,
        read_first: bool,
    ) -> impl FnOnce(LoadContext<Val>) -> ContextFuture + Clone + Send + Sync + 'static {
        let (world, key) = (Arc::clone(self), key.to_owned());
        move |ctx| {
            Box::pin(async move {
                let start = Instant::now();
                lock(&world.history)
                    .load_calls
                    .entry(key.clone())
                    .or_default()
                    .push(proc);
                let read = || {
                    let version = world.version(&key);
                    world.produced(&key, version, Instant::now());
                    version
                };
                let version = if read_first {
                    let version = read();
                    sleep(delay).await;
                    version
                } else {
                    sleep(delay).await;
                    read()
                };
                let (answer, how) = adaptive_answer(&key, version, &ctx);
                world.chose_grace(&key, version, how);
                world.trace(proc, "load", &key, start, format!("v{version} {how}"));
                Ok(answer)
            })
        }
    }

    /// The batch context loader of one `get_many_with_context` in the
    /// adaptive round: records a load of every key, sleeps `delay`, reads
    /// the database, and answers each key as [`context_loader`](Self::context_loader)
    /// would.
    fn batch_context_loader(
        self: &Arc<Self>,
        proc: usize,
        delay: Duration,
    ) -> impl Fn(Vec<(String, LoadContext<Val>)>) -> BatchContextFuture + Send + Sync + 'static
    {
        let world = Arc::clone(self);
        move |keys: Vec<(String, LoadContext<Val>)>| {
            let world = Arc::clone(&world);
            Box::pin(async move {
                let start = Instant::now();
                lock(&world.history)
                    .batch_calls
                    .push((proc, start, keys.len()));
                for (key, _) in &keys {
                    lock(&world.history)
                        .load_calls
                        .entry(key.clone())
                        .or_default()
                        .push(proc);
                }
                sleep(delay).await;
                let mut answers = Vec::with_capacity(keys.len());
                for (key, ctx) in keys {
                    let version = world.version(&key);
                    world.produced(&key, version, Instant::now());
                    let (answer, how) = adaptive_answer(&key, version, &ctx);
                    world.chose_grace(&key, version, how);
                    world.trace(proc, "load-many", &key, start, format!("v{version} {how}"));
                    answers.push((key, answer));
                }
                Ok(answers)
            })
        }
    }

    /// The batch loader of one `get_many` in process `proc`: records a load
    /// of every key, sleeps `delay`, then reads the database.
    fn batch_loader(
        self: &Arc<Self>,
        proc: usize,
        delay: Duration,
    ) -> impl Fn(Vec<String>) -> BatchLoadFuture + Send + Sync + 'static {
        let world = Arc::clone(self);
        move |keys: Vec<String>| {
            let world = Arc::clone(&world);
            Box::pin(async move {
                let start = Instant::now();
                lock(&world.history)
                    .batch_calls
                    .push((proc, start, keys.len()));
                for key in &keys {
                    lock(&world.history)
                        .load_calls
                        .entry(key.clone())
                        .or_default()
                        .push(proc);
                    if let Some(hook) = lock(&world.on_load).as_mut() {
                        hook(proc, key);
                    }
                }
                sleep(delay).await;
                let mut found = Vec::with_capacity(keys.len());
                for key in keys {
                    let version = world.version(&key);
                    world.produced(&key, version, Instant::now());
                    world.trace(proc, "load-many", &key, start, format!("v{version}"));
                    found.push((key.clone(), Val { key, version }));
                }
                Ok(found)
            })
        }
    }

    /// Checks one `get_or_load` result against every contract line, and
    /// traces it.
    #[allow(clippy::too_many_arguments)]
    fn check_get(
        &self,
        proc: usize,
        profile: Profile,
        key: &str,
        seq: u64,
        start: Instant,
        result: Result<Result<Fetched<Val>, Error>, tokio::time::error::Elapsed>,
        bound: Duration,
    ) -> Option<Val> {
        let fetched = match result {
            Err(_) => {
                self.violate("liveness", key,
                    format!(
                        "P{proc} get_or_load({key}) started at {} ms did not return within {bound:?}",
                        self.ms(start)
                    ),
                );
                self.trace(proc, "get", key, start, "HUNG".into());
                return None;
            }
            Ok(Err(err)) => {
                self.trace(proc, "get", key, start, format!("error {:?}", err.kind()));
                return None;
            }
            Ok(Ok(fetched)) => fetched,
        };
        let served = fetched.served;
        let Some(val) = fetched.value else {
            self.trace(proc, "get", key, start, format!("None {served:?}"));
            self.violate(
                "wrong-key",
                key,
                format!("P{proc} get_or_load({key}) returned None; the loader never does"),
            );
            return None;
        };
        self.trace(
            proc,
            "get",
            key,
            start,
            format!("v{} {served:?}", val.version),
        );
        if val.key != key {
            self.violate(
                "wrong-key",
                key,
                format!("P{proc} get_or_load({key}) returned a value of {}", val.key),
            );
            return Some(val);
        }
        let h = lock(&self.history);
        // no-resurrection: the newest fence this call must respect.
        let fences = h.fences.get(key).map(Vec::as_slice).unwrap_or_default();
        // Another process's L1 standing in for an unreachable store may not
        // have heard of the invalidation (DESIGN: "L1 is a shield during a
        // Redis outage"); the time check still bounds its age.
        let shield = served
            == Served::Stale {
                reason: StaleReason::StoreUnavailable,
            };
        let stale = matches!(served, Served::Stale { .. });
        let binding = fences
            .iter()
            .filter(|f| f.seq < seq)
            .filter(|f| !(f.soft && stale))
            .filter(|f| {
                f.proc == proc
                    || (f.fleet && !shield)
                    || match profile.l1_ttl {
                        None => start >= f.at + MAX_REPLY,
                        Some(_) if shield => false,
                        Some(l1) => start >= f.at + l1 + MAX_REPLY,
                    }
            })
            .max_by_key(|f| f.version);
        // Looked up only for an older version: a late write's (see
        // `History::late`).
        let late = || h.late.contains(&(key.to_owned(), val.version));
        if let Some(f) = binding.filter(|f| val.version < f.version && !late()) {
            let kind = if f.proc == proc {
                "the invalidating process"
            } else if profile.l1_ttl.is_some() {
                "a process with L1, past its L1 TTL + MAX_REPLY"
            } else {
                "a process without L1, past MAX_REPLY"
            };
            let message = format!(
                "P{proc} get_or_load({key}) started at {} ms returned v{} ({served:?}), but P{} \
                 had invalidated/set it at v{} and returned at {} ms ({kind})",
                self.ms(start),
                val.version,
                f.proc,
                f.version,
                self.ms(f.at)
            );
            drop(h);
            self.violate("no-resurrection", key, message);
            return Some(val);
        }
        // time: how old the value is, from when its version was produced.
        let limit = match served {
            Served::Hit => Some(fresh_max(TTL)),
            Served::Stale { .. } => {
                let own = h.own_grace.contains(&(key.to_owned(), val.version));
                let max_stale = match own {
                    true => profile.max_stale.max(OWN_GRACE),
                    false => profile.max_stale,
                };
                Some(fresh_max(TTL) + max_stale)
            }
            _ => None,
        };
        if let Some(limit) = limit {
            // Judged somewhere between the call's start and now, and not
            // before the version existed: only `start - born` is certain.
            let now = Instant::now();
            let born = h
                .produced
                .get(&(key.to_owned(), val.version))
                .and_then(|times| times.iter().filter(|&&t| t <= now).max().copied());
            let message = match born {
                None => Some(format!(
                    "P{proc} get_or_load({key}) at {} ms served v{} ({served:?}) that was never produced before",
                    self.ms(start),
                    val.version
                )),
                Some(born) if start.saturating_duration_since(born) > limit + TOLERANCE => {
                    Some(format!(
                        "P{proc} get_or_load({key}) at {} ms served v{} ({served:?}) produced at {} ms: \
                     {} ms old, the limit is {} ms",
                        self.ms(start),
                        val.version,
                        self.ms(born),
                        (start - born).as_millis(),
                        limit.as_millis()
                    ))
                }
                Some(_) => None,
            };
            drop(h);
            if let Some(message) = message {
                self.violate("time", key, message);
            }
        }
        Some(val)
    }

    /// The revoking writes of `key` that ran in the store so far.
    fn revocations(&self, key: &str) -> u64 {
        lock(&self.history)
            .revocations
            .get(key)
            .copied()
            .unwrap_or_default()
    }

    /// A write of `key` at `version` by `proc` whose caller went away
    /// before the store ran it: if the store runs it after all (see
    /// [`History::late`]), its version may be read past later fences.
    fn unsent(&self, proc: usize, key: &str, version: u64) {
        lock(&self.history)
            .unsent
            .insert((proc, key.to_owned()), version);
    }

    fn fence(&self, proc: usize, key: &str, version: u64) {
        self.fence_of(proc, key, version, false);
    }

    /// A fence; `soft` for an `expire`.
    fn fence_of(&self, proc: usize, key: &str, version: u64, soft: bool) {
        self.fence_with(proc, key, version, soft, false);
    }

    /// A fence; `soft` for an `expire`, `fleet` for a hard `clear` (see
    /// [`Fence::fleet`]).
    fn fence_with(&self, proc: usize, key: &str, version: u64, soft: bool, fleet: bool) {
        let mut h = lock(&self.history);
        h.seq += 1;
        let fence = Fence {
            proc,
            seq: h.seq,
            at: Instant::now(),
            version,
            soft,
            fleet,
        };
        h.fences.entry(key.to_owned()).or_default().push(fence);
    }
}

/// The longest fresh window of an entry with `ttl` and the jitter.
fn fresh_max(ttl: Duration) -> Duration {
    Jitter::ratio(JITTER).bounds(ttl).1
}

// ---------------------------------------------------------------- the fleet

/// One simulated process.
#[derive(Clone)]
struct Proc {
    id: usize,
    cache: Cache<Val>,
    store: ChaosStore,
    profile: Profile,
}

/// `grace` and `l1` of each process of a chaos fleet.
/// The lease key of storage key `key` (`…:v:{k}` → `…:l:{k}`).
fn lease_of(key: &[u8]) -> Vec<u8> {
    let brace = key
        .iter()
        .position(|&b| b == b'{')
        .expect("a hash-tagged key");
    let mut lease = key.to_vec();
    assert_eq!(&lease[brace - 3..brace], b":v:", "{}", user_key(key));
    lease[brace - 2] = b'l';
    lease
}

/// Which chaos round: plain keys, tagged keys, or a rolling version bump.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Round {
    Plain,
    Tagged,
    /// Processes 0 and 1 at version 1 (no transition: the code deployed
    /// before), 2 and 3 at version 2 in its transition.
    Versions,
    /// Context loaders (per-value TTLs, validators, "not modified", "do
    /// not cache") and `expire` beside `invalidate` and `set`.
    Adaptive,
}

/// The versions of the version round's processes.
const VERSION_FLEET: [u32; 4] = [1, 1, 2, 2];

const CHAOS_FLEET: [(Duration, bool); 4] = [
    (Duration::from_secs(1), true),
    (Duration::ZERO, false),
    (Duration::ZERO, true),
    (Duration::from_secs(1), false),
];

/// A fleet over one fresh shared store. `short`: the chaos phase's short
/// TTLs; otherwise the cache's defaults except the TTL.
fn fleet(world: &Arc<World>, round: u64, shape: &[(Duration, bool)], short: bool) -> Vec<Proc> {
    fleet_of(world, round, shape, short, &[])
}

/// [`fleet`], process `i` at cache version `versions[i]` (0 where not
/// given); a process at a version above the lowest is in its version
/// transition for longer than any round.
fn fleet_of(
    world: &Arc<World>,
    round: u64,
    shape: &[(Duration, bool)],
    short: bool,
    versions: &[u32],
) -> Vec<Proc> {
    let shared = MemoryStore::new();
    let lowest = versions.iter().copied().min().unwrap_or(0);
    let seed = world.seed;
    shape
        .iter()
        .enumerate()
        .map(|(id, &(grace, l1))| {
            let salt = round * 100 + id as u64;
            let store = chaos_store(shared.clone(), stream_seed(seed, 1_000 + salt), world, id);
            let mut builder = Cache::<Val>::builder()
                .namespace("sim")
                .shared_store(Arc::new(store.clone()))
                .ttl(TTL)
                .jitter(Jitter::ratio(JITTER))
                .grace(grace)
                .rng_seed(seed.wrapping_mul(31).wrapping_add(salt));
            // Half the fleet splits its queued `set`s from 2 on: the
            // few keys here seldom queue the 16 that split a batch in
            // production, and the split must keep every caller's reply.
            if id % 2 == 0 {
                builder = builder.write_split_from(2);
            }
            let version = versions.get(id).copied().unwrap_or(0);
            builder = builder.version(version);
            if version > lowest {
                builder = builder.version_transition(Duration::from_secs(3_600));
            }
            if l1 {
                builder = builder.l1(L1Config::new().ttl(if short {
                    L1_TTL
                } else {
                    Duration::from_secs(30)
                }));
            }
            Proc {
                id,
                cache: builder.build().expect("valid settings"),
                store,
                profile: Profile {
                    l1_ttl: l1.then_some(if short {
                        L1_TTL
                    } else {
                        Duration::from_secs(30)
                    }),
                    max_stale: grace,
                },
            }
        })
        .collect()
}

/// One `get_or_load` through the checker; `tagged`: with its key's group
/// as its tag (the tag round).
async fn get(
    world: &Arc<World>,
    p: &Proc,
    key: &str,
    delay: Duration,
    tagged: bool,
) -> Option<Val> {
    let seq = world.next_seq();
    let start = Instant::now();
    let loader = world.loader(p.id, key, delay);
    let call = async {
        if tagged {
            let entry = p.cache.entry(key).tags([group(key)]);
            entry.get_or_load_with_meta(loader).await
        } else {
            p.cache.get_or_load_with_meta(key, loader).await
        }
    };
    let result = timeout(BOUND, call).await;
    world.check_get(p.id, p.profile, key, seq, start, result, BOUND)
}

/// A context loader's answer in the adaptive round, for `key` read at
/// `version`: "not modified" when the stale value's validator is that
/// version; every fifth version not cached; otherwise the value with a TTL
/// of its own (1 to 3 s by key), jitter and its version as validator, and
/// every third version with a grace of its own (shorter than the call's).
fn adaptive_answer(key: &str, version: u64, ctx: &LoadContext<Val>) -> (Loaded<Val>, &'static str) {
    let n: u64 = key[1..].parse().expect("keys are a letter and a number");
    let ttl = Duration::from_secs(1 + n % 3);
    let validator = version.to_be_bytes();
    let seen = ctx.stale().and_then(|s| s.validator());
    let val = || Val {
        key: key.to_owned(),
        version,
    };
    if seen == Some(&validator[..]) {
        (Loaded::not_modified().ttl(ttl), "not modified")
    } else if version % 5 == 4 {
        (Loaded::value(val()).do_not_cache(), "not cached")
    } else if version % 3 == 2 {
        let answer = Loaded::value(val())
            .ttl(ttl)
            .jitter(Jitter::ratio(JITTER))
            .grace(OWN_GRACE)
            .validator(validator);
        (answer, OWN_GRACE_SAYS)
    } else {
        let answer = Loaded::value(val())
            .ttl(ttl)
            .jitter(Jitter::ratio(JITTER))
            .validator(validator);
        (answer, "")
    }
}

/// One `get_or_load_with_context` through the checker (the adaptive
/// round): the loader chooses its value's TTL (1 to 3 s by key, with the
/// round's jitter: never longer than the others', so the time check
/// holds), stores the version as its validator and answers "not modified"
/// when the stale value's validator is the database's version; every
/// fifth version is not cached.
async fn get_adaptive(world: &Arc<World>, p: &Proc, key: &str, delay: Duration) -> Option<Val> {
    let seq = world.next_seq();
    let start = Instant::now();
    let loader = world.context_loader(p.id, key, delay);
    let call = p.cache.get_or_load_with_context_meta(key, loader);
    let result = timeout(BOUND, call).await;
    world.check_get(p.id, p.profile, key, seq, start, result, BOUND)
}

/// One `refresh_with_context` through the checker (the adaptive round),
/// with [`get_adaptive`]'s loader: a forced refresh is checked as a read.
async fn refresh_adaptive(world: &Arc<World>, p: &Proc, key: &str, delay: Duration) -> Option<Val> {
    let seq = world.next_seq();
    let start = Instant::now();
    let loader = world.context_loader(p.id, key, delay);
    let call = p.cache.refresh_with_context(key, loader);
    let result = timeout(BOUND, call).await;
    world.check_get(p.id, p.profile, key, seq, start, result, BOUND)
}

/// A key's tag in the tag round: its group (of three).
fn group(key: &str) -> String {
    let n: usize = key[1..].parse().expect("keys are a letter and a number");
    format!("g{}", n % 3)
}

/// How [`write_many`] writes its batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BatchOp {
    /// One `set_many`.
    SetMany,
    /// A `set` of each key, side by side: past the cache's few writes in
    /// the air, they meet in its write queue and go out as one batch.
    Sets,
    /// One `invalidate_many`.
    InvalidateMany,
}

/// A `set_many`, side-by-side `set`s or an `invalidate_many` of `batch`
/// (its keys made distinct): each key's row locked (in order), its version
/// bumped (and, for a write of values, produced), and each fenced once its
/// call returned (or the store ran it before its caller went away, after
/// `dropped`).
async fn write_many(
    world: &Arc<World>,
    p: &Proc,
    mut batch: Vec<String>,
    writes: &BTreeMap<String, Arc<tokio::sync::Mutex<()>>>,
    dropped: Option<Duration>,
    how: BatchOp,
) {
    batch.sort();
    batch.dedup();
    let mut rows = Vec::with_capacity(batch.len());
    for key in &batch {
        rows.push(writes[key].lock().await);
    }
    let versions: Vec<u64> = batch.iter().map(|key| world.bump(key)).collect();
    let start = Instant::now();
    if how != BatchOp::InvalidateMany {
        for (key, &version) in batch.iter().zip(&versions) {
            world.produced(key, version, start);
        }
    }
    let ran_before: Vec<u64> = batch.iter().map(|key| world.revocations(key)).collect();
    let within = dropped.unwrap_or(BOUND);
    let vals = batch.iter().zip(&versions).map(|(key, &version)| {
        let val = Val {
            key: key.clone(),
            version,
        };
        (key.clone(), val)
    });
    // One result for the whole batch, or one per key.
    let (op, results) = match how {
        BatchOp::SetMany => (
            "set_many",
            vec![timeout(within, p.cache.set_many(vals)).await],
        ),
        BatchOp::Sets => {
            let sets =
                vals.map(|(key, val)| async move { timeout(within, p.cache.set(key, &val)).await });
            ("set", futures_util::future::join_all(sets).await)
        }
        BatchOp::InvalidateMany => {
            let call = p.cache.invalidate_many(&batch);
            ("invalidate_many", vec![timeout(within, call).await])
        }
    };
    for (i, ((key, &version), ran_before)) in
        batch.iter().zip(&versions).zip(ran_before).enumerate()
    {
        let result = &results[i.min(results.len() - 1)];
        let write = Write {
            op,
            key,
            version,
            soft: false,
            start,
            dropped: dropped.is_some(),
            ran_before,
        };
        let outcome = write.outcome(world, p, result);
        world.trace(p.id, op, key, start, outcome);
    }
}

/// A revoking write of one key (or its share of a batch): `op` of `key`
/// at `version`, started at `start`; `dropped`: its caller went away (the
/// timeout was its drop); `ran_before`: the key's revocations counted
/// before it.
struct Write<'a> {
    op: &'static str,
    key: &'a str,
    version: u64,
    soft: bool,
    start: Instant,
    dropped: bool,
    ran_before: u64,
}

impl Write<'_> {
    /// What the write came to, as traced; the key fenced at its version
    /// where it took effect (it returned `Ok`, or the store ran it before
    /// its caller went away), a liveness violation if it hung.
    fn outcome(
        &self,
        world: &World,
        p: &Proc,
        result: &Result<Result<(), Error>, tokio::time::error::Elapsed>,
    ) -> String {
        let (key, version) = (self.key, self.version);
        match result {
            Ok(Ok(())) => {
                world.fence_of(p.id, key, version, self.soft);
                format!("ok v{version}")
            }
            Ok(Err(err)) => format!("error {:?} v{version}", err.kind()),
            // Dropped once the store ran it: as if it returned now (its
            // local step ran on the drop; the others hear the bus).
            Err(_) if self.dropped => {
                if world.revocations(key) > self.ran_before {
                    world.fence_of(p.id, key, version, self.soft);
                    format!("dropped after the store ran it v{version}")
                } else {
                    world.unsent(p.id, key, version);
                    format!("dropped before the store ran it v{version}")
                }
            }
            Err(_) => {
                world.violate(
                    "liveness",
                    key,
                    format!(
                        "P{} {}({key}) started at {} ms did not return within {BOUND:?}",
                        p.id,
                        self.op,
                        world.ms(self.start)
                    ),
                );
                "HUNG".into()
            }
        }
    }
}

/// `clear`: a database write to every key (their rows locked, in order),
/// then a clear of the namespace, hard or soft over `window` (zero: every
/// entry stale at once). Once it returned `Ok` (every process
/// acknowledged it), each key is fenced at its new version: for every
/// process at once after a hard clear, softly (as `expire`) after a soft
/// one, from the end of its window.
async fn clear(
    world: &Arc<World>,
    p: &Proc,
    hard: bool,
    window: Duration,
    keys: &[String],
    writes: &BTreeMap<String, Arc<tokio::sync::Mutex<()>>>,
) {
    let mut rows = Vec::with_capacity(keys.len());
    for key in keys {
        rows.push(writes[key].lock().await);
    }
    let versions: Vec<u64> = keys.iter().map(|key| world.bump(key)).collect();
    let start = Instant::now();
    let mode = if hard {
        ClearMode::Hard
    } else {
        ClearMode::Soft { window }
    };
    let outcome = match timeout(BOUND, p.cache.clear(mode)).await {
        // Every entry from before is stale by the window's end: the soft
        // fences stand from then on.
        Ok(Ok(())) if !window.is_zero() => {
            let (world, keys, id) = (Arc::clone(world), keys.to_vec(), p.id);
            tokio::spawn(async move {
                sleep(window).await;
                for (key, version) in keys.iter().zip(&versions) {
                    world.fence_with(id, key, *version, true, false);
                }
            });
            format!("ok, fenced in {} ms", window.as_millis())
        }
        Ok(Ok(())) => {
            for (key, version) in keys.iter().zip(&versions) {
                world.fence_with(p.id, key, *version, !hard, hard);
            }
            "ok".to_owned()
        }
        Ok(Err(err)) => format!("error {:?}", err.kind()),
        Err(_) => {
            world.violate(
                "liveness",
                "-",
                format!(
                    "P{} clear({mode:?}) started at {} ms did not return within {BOUND:?}",
                    p.id,
                    world.ms(start)
                ),
            );
            "HUNG".into()
        }
    };
    world.trace(
        p.id,
        if hard { "clear-hard" } else { "clear-soft" },
        "-",
        start,
        outcome,
    );
    drop(rows);
}

/// `invalidate_tag(tag)` (or, `soft`, `expire_tag(tag)`; or, with more
/// than one tag, `invalidate_tags(tags)`): a database write to every key
/// of the tags' groups (their rows locked, in order), then the
/// invalidation; once it returned `Ok`, each of those keys is fenced at its
/// new version (softly for `expire_tag`, as for `expire`: what is served
/// fresh is bound, an older value may still be `Stale`).
async fn invalidate_tag(
    world: &Arc<World>,
    p: &Proc,
    tags: &[String],
    keys: &[String],
    writes: &BTreeMap<String, Arc<tokio::sync::Mutex<()>>>,
    soft: bool,
) {
    let tag = tags.join(",");
    let tag = tag.as_str();
    let tagged: Vec<&String> = keys.iter().filter(|k| tags.contains(&group(k))).collect();
    let mut rows = Vec::with_capacity(tagged.len());
    for key in &tagged {
        rows.push(writes[*key].lock().await);
    }
    let versions: Vec<u64> = tagged.iter().map(|key| world.bump(key)).collect();
    let start = Instant::now();
    let op = match (soft, tags) {
        (true, _) => "expire_tag",
        (false, [_]) => "invalidate_tag",
        (false, _) => "invalidate_tags",
    };
    let call = async {
        match (soft, tags) {
            (true, _) => p.cache.expire_tag(tag).await,
            (false, [_]) => p.cache.invalidate_tag(tag).await,
            (false, _) => p.cache.invalidate_tags(tags).await,
        }
    };
    let outcome = match timeout(BOUND, call).await {
        Ok(Ok(())) => {
            for (key, version) in tagged.iter().zip(&versions) {
                world.fence_of(p.id, key, *version, soft);
            }
            format!("ok {versions:?}")
        }
        Ok(Err(err)) => format!("error {:?}", err.kind()),
        Err(_) => {
            world.violate(
                "liveness",
                tag,
                format!(
                    "P{} {op}({tag}) started at {} ms did not return within {BOUND:?}",
                    p.id,
                    world.ms(start)
                ),
            );
            "HUNG".into()
        }
    };
    world.trace(p.id, op, tag, start, outcome);
    drop(rows);
}

/// One `get_many` through the checker: every key's result is checked as a
/// `get_or_load` of it started when the batch did.
async fn get_many(
    world: &Arc<World>,
    p: &Proc,
    keys: &[String],
    delay: Duration,
) -> Vec<Option<Val>> {
    get_many_tagged(world, p, keys, delay, None).await
}

/// One `get_many_with_context` through the checker (the adaptive round):
/// every key's result is checked as a `get_or_load` of it started when the
/// batch did.
async fn get_many_adaptive(world: &Arc<World>, p: &Proc, keys: &[String], delay: Duration) {
    let seq = world.next_seq();
    let start = Instant::now();
    let loader = world.batch_context_loader(p.id, delay);
    let call = p.cache.get_many_with_context_meta(keys.to_vec(), loader);
    match timeout(BOUND, call).await {
        Ok(results) => {
            for (key, result) in keys.iter().zip(results) {
                world.check_get(p.id, p.profile, key, seq, start, Ok(result), BOUND);
            }
        }
        Err(_) => world.violate(
            "liveness",
            &keys[0],
            format!(
                "P{} get_many_with_context({keys:?}) started at {} ms did not return within {BOUND:?}",
                p.id,
                world.ms(start)
            ),
        ),
    }
}

/// One `get_or_load_with_context` through the checker (the tag round):
/// the loader tags the value with its key's group after the load, the
/// call names no tag.
async fn get_chosen(world: &Arc<World>, p: &Proc, key: &str, delay: Duration) -> Option<Val> {
    let seq = world.next_seq();
    let start = Instant::now();
    let plain = world.loader(p.id, key, delay);
    let tag = group(key);
    let loader = move |_ctx: LoadContext<Val>| {
        let (load, tag) = (plain(), tag.clone());
        async move { load.await.map(|value| Loaded::from(value).tags([tag])) }
    };
    let call = p.cache.get_or_load_with_context_meta(key, loader);
    let result = timeout(BOUND, call).await;
    world.check_get(p.id, p.profile, key, seq, start, result, BOUND)
}

/// A `get_many_with_context` through the checker (the tag round): the
/// loader tags each value with its key's group after the load.
async fn get_many_chosen(
    world: &Arc<World>,
    p: &Proc,
    keys: &[String],
    delay: Duration,
) -> Vec<Option<Val>> {
    let seq = world.next_seq();
    let start = Instant::now();
    let plain = world.batch_loader(p.id, delay);
    let loader = move |keys: Vec<(String, LoadContext<Val>)>| {
        let load = plain(keys.into_iter().map(|(key, _)| key).collect());
        async move {
            load.await.map(|rows| {
                rows.into_iter()
                    .map(|(key, value)| {
                        let tag = group(&key);
                        (key, Loaded::value(value).tags([tag]))
                    })
                    .collect::<Vec<_>>()
            })
        }
    };
    match timeout(
        BOUND,
        p.cache.get_many_with_context_meta(keys.to_vec(), loader),
    )
    .await
    {
        Ok(results) => keys
            .iter()
            .zip(results)
            .map(|(key, result)| {
                world.check_get(p.id, p.profile, key, seq, start, Ok(result), BOUND)
            })
            .collect(),
        Err(_) => {
            for key in keys {
                world.violate(
                    "liveness",
                    key,
                    format!(
                        "P{} get_many_with_context({keys:?}) started at {} ms did not return within {BOUND:?}",
                        p.id,
                        world.ms(start)
                    ),
                );
            }
            vec![None; keys.len()]
        }
    }
}

/// [`get_many`], with `tag` on every key (the tag round: keys of one
/// group).
async fn get_many_tagged(
    world: &Arc<World>,
    p: &Proc,
    keys: &[String],
    delay: Duration,
    tag: Option<&str>,
) -> Vec<Option<Val>> {
    let seq = world.next_seq();
    let start = Instant::now();
    let loader = world.batch_loader(p.id, delay);
    let call = async {
        match tag {
            Some(tag) => p
                .cache
                .entries()
                .tags([tag])
                .get_many_with_meta(keys.to_vec(), loader)
                .await
                .expect("valid settings and tags"),
            None => p.cache.get_many_with_meta(keys.to_vec(), loader).await,
        }
    };
    match timeout(BOUND, call).await {
        Ok(results) => keys
            .iter()
            .zip(results)
            .map(|(key, result)| {
                world.check_get(p.id, p.profile, key, seq, start, Ok(result), BOUND)
            })
            .collect(),
        Err(_) => {
            for key in keys {
                world.violate(
                    "liveness",
                    key,
                    format!(
                        "P{} get_many({keys:?}) started at {} ms did not return within {BOUND:?}",
                        p.id,
                        world.ms(start)
                    ),
                );
                world.trace(p.id, "get-many", key, start, "HUNG".into());
            }
            vec![None; keys.len()]
        }
    }
}

/// A loader delay: mostly short, sometimes longer than `lock_wait`.
fn loader_delay(rng: &mut StdRng) -> Duration {
    match rng.random_range(0..100) {
        0..93 => ms(rng.random_range(1..200)),
        93..98 => ms(rng.random_range(200..2_000)),
        _ => ms(rng.random_range(5_500..9_000)),
    }
}

// ---------------------------------------------------------------- rounds

/// The chaos phase: workers over the keys while the scheduler toggles
/// faults. Checks no-resurrection, liveness and time on every result.
async fn chaos_round(world: &Arc<World>, kind: Round) {
    let seed = world.seed;
    let tagged = kind == Round::Tagged;
    // The tag round and the version round: each its own fleet, keys and
    // random streams.
    let (round, prefix, salt) = match kind {
        Round::Plain => (0, "k", 0),
        Round::Tagged => (4, "t", 100),
        Round::Versions => (6, "v", 200),
        Round::Adaptive => (13, "a", 300),
    };
    let adaptive = kind == Round::Adaptive;
    let plain = kind == Round::Plain;
    let versioned = kind == Round::Versions;
    let versions: &[u32] = match kind {
        Round::Versions => &VERSION_FLEET,
        _ => &[],
    };
    let procs = fleet_of(world, round, &CHAOS_FLEET, true, versions);
    let keys: Vec<String> = (0..KEYS).map(|k| format!("{prefix}{k:02}")).collect();
    let writes: BTreeMap<String, Arc<tokio::sync::Mutex<()>>> =
        keys.iter().map(|k| (k.clone(), Arc::default())).collect();
    let end = Instant::now() + CHAOS_FOR;

    let scheduler = {
        let procs = procs.clone();
        let world = Arc::clone(world);
        tokio::spawn(async move {
            let mut rng = stream(seed, 2 + salt);
            let mut phase_until = Instant::now();
            let mut chaotic = false;
            let mut stopped_until: Vec<Option<Instant>> = vec![None; procs.len()];
            while Instant::now() < end {
                let now = Instant::now();
                if now >= phase_until {
                    chaotic = !chaotic;
                    let length = if chaotic { 5_000..15_000 } else { 2_000..8_000 };
                    phase_until = now + ms(rng.random_range(length));
                    for p in &procs {
                        let faults = if chaotic {
                            chaotic_faults(&mut rng)
                        } else {
                            Faults::HEALTHY
                        };
                        p.store.set_faults(faults);
                    }
                    let label = if chaotic { "chaotic" } else { "healthy" };
                    world.trace(0, "phase", "-", now, label.into());
                }
                // Now and then a process's bus tasks die with the runtime
                // that ran them.
                for p in &procs {
                    if rng.random_bool(FEED_DEATHS) {
                        let killed = p.store.kill_feeds();
                        world.trace(p.id, "bus-gone", "-", now, format!("{killed} feed(s)"));
                    }
                }
                for (p, until) in procs.iter().zip(stopped_until.iter_mut()) {
                    match *until {
                        Some(t) if now >= t => {
                            p.store.set_up(true);
                            *until = None;
                            world.trace(p.id, "store-up", "-", now, String::new());
                        }
                        None if chaotic && rng.random_bool(0.03) => {
                            p.store.set_up(false);
                            *until = Some(now + ms(rng.random_range(500..3_000)));
                            world.trace(p.id, "store-down", "-", now, String::new());
                        }
                        _ => {}
                    }
                }
                sleep(ms(rng.random_range(200..800))).await;
            }
            for p in &procs {
                p.store.set_up(true);
                p.store.set_faults(Faults::HEALTHY);
            }
        })
    };

    // The tag round's Redis forgets: now and then one group's tag counter
    // is dropped from the shared store (evicted under `maxmemory`, or
    // deleted). A lost counter must validate nothing.
    let evictor = tagged.then(|| {
        let store = procs[0].store.inner().clone();
        let world = Arc::clone(world);
        tokio::spawn(async move {
            let mut rng = stream(seed, 50 + salt);
            while Instant::now() < end {
                sleep(ms(rng.random_range(300..3_000))).await;
                let tag = format!("g{}", rng.random_range(0..3));
                let counter = format!("bw:sim:t:{{{tag}}}");
                let now = Instant::now();
                let dropped = store.delete(counter.as_bytes()).await.unwrap_or(false);
                world.trace(0, "evict-counter", &tag, now, dropped.to_string());
            }
        })
    });
    // The plain round's Redis loses the namespace's clear record now and
    // then (evicted under an `allkeys-*` policy, or deleted): a lost record
    // must validate nothing, and entries from before a clear must not come
    // back once it is made again.
    let record_evictor = plain.then(|| {
        let store = procs[0].store.inner().clone();
        let world = Arc::clone(world);
        tokio::spawn(async move {
            let mut rng = stream(seed, 70 + salt);
            while Instant::now() < end {
                sleep(ms(rng.random_range(1_000..6_000))).await;
                let now = Instant::now();
                let dropped = store.delete(b"bw:sim:c").await.unwrap_or(false);
                world.trace(0, "evict-record", "-", now, dropped.to_string());
            }
        })
    });
    // Every round's Redis evicts under memory pressure: now and then a
    // key's value or lease (of any process's version), the clear record or
    // a tag counter is dropped. A lost value is a miss; a lost lease a free
    // lease, never a licence to write past the fence; a lost record or
    // counter validates nothing.
    let pressure = {
        let store = procs[0].store.inner().clone();
        let (world, keys) = (Arc::clone(world), keys.clone());
        let caches: Vec<Cache<Val>> = procs.iter().map(|p| p.cache.clone()).collect();
        tokio::spawn(async move {
            let mut rng = stream(seed, 60 + salt);
            while Instant::now() < end {
                sleep(ms(rng.random_range(200..2_000))).await;
                let key = &keys[rng.random_range(0..keys.len())];
                let cache = &caches[rng.random_range(0..caches.len())];
                let stored = cache.storage_key(key).expect("valid key");
                // Any kind of key the fleet keeps (PROTOCOL.md's
                // inventory; the lease index is Redis's own, dropped by
                // `index_loss` below as the leases it names): mostly
                // values and leases, now and then the namespace's clear
                // record or a group's tag counter, in every round.
                let (stored, what) = match rng.random_range(0..20) {
                    0 => (cache.clear_record_key().to_vec(), "record"),
                    1 => {
                        let tag = group(key);
                        (format!("bw:sim:t:{{{tag}}}").into_bytes(), "counter")
                    }
                    2..11 => (stored, "value"),
                    _ => (lease_of(&stored), "lease"),
                };
                let now = Instant::now();
                let dropped = store.delete(&stored).await.unwrap_or(false);
                world.trace(0, "evict", key, now, format!("{what} {dropped}"));
            }
        })
    };

    // Every round's Redis loses its lease index now and then (evicted, or
    // expired): every lease of one process's version is dropped at once. A
    // lost index names no lease, so every load in flight under it is
    // refused its write, and the leases are free to take.
    let index_loss = {
        let store = procs[0].store.inner().clone();
        let (world, keys) = (Arc::clone(world), keys.clone());
        let caches: Vec<Cache<Val>> = procs.iter().map(|p| p.cache.clone()).collect();
        tokio::spawn(async move {
            let mut rng = stream(seed, 95 + salt);
            while Instant::now() < end {
                sleep(ms(rng.random_range(1_000..6_000))).await;
                let cache = &caches[rng.random_range(0..caches.len())];
                let now = Instant::now();
                let mut dropped = 0;
                for key in keys.iter() {
                    let lease = lease_of(&cache.storage_key(key).expect("valid key"));
                    dropped += usize::from(store.delete(&lease).await.unwrap_or(false));
                }
                world.trace(0, "evict-index", "-", now, dropped.to_string());
            }
        })
    };

    let workers: Vec<_> = (0..WORKERS)
        .map(|w| {
            let (procs, keys, writes) = (procs.clone(), keys.clone(), writes.clone());
            let world = Arc::clone(world);
            tokio::spawn(async move {
                let mut rng = stream(seed, 10 + salt + w as u64);
                while Instant::now() < end {
                    let p = &procs[rng.random_range(0..procs.len())];
                    let key = &keys[rng.random_range(0..keys.len())];
                    match rng.random_range(0..100) {
                        0..8 if adaptive => {
                            let delay = loader_delay(&mut rng);
                            refresh_adaptive(&world, p, key, delay).await;
                        }
                        8..60 if adaptive => {
                            let delay = loader_delay(&mut rng);
                            get_adaptive(&world, p, key, delay).await;
                        }
                        60..70 if adaptive => {
                            // A `get_many` whose loader decides per key.
                            let delay = loader_delay(&mut rng);
                            let n = rng.random_range(2..=4);
                            let batch: Vec<String> = (0..n)
                                .map(|_| keys[rng.random_range(0..keys.len())].clone())
                                .chain([key.clone()])
                                .collect();
                            get_many_adaptive(&world, p, &batch, delay).await;
                        }
                        // Context loaders inside a version transition.
                        30..50 if versioned => {
                            let delay = loader_delay(&mut rng);
                            get_adaptive(&world, p, key, delay).await;
                        }
                        roll @ 60..70 if tagged => {
                            // A tagged `get_many` of keys of one group; half
                            // of them with the tag chosen by the loader, for
                            // keys of any group.
                            let delay = loader_delay(&mut rng);
                            let tag = group(key);
                            let n = rng.random_range(2..=4);
                            let chosen = roll >= 65;
                            let batch: Vec<String> = (0..n)
                                .map(|_| keys[rng.random_range(0..keys.len())].clone())
                                .filter(|k| chosen || group(k) == tag)
                                .chain([key.clone()])
                                .collect();
                            if chosen {
                                get_many_chosen(&world, p, &batch, delay).await;
                            } else {
                                get_many_tagged(&world, p, &batch, delay, Some(&tag)).await;
                            }
                        }
                        0..25 if tagged => {
                            // The key's tag chosen by its loader, after
                            // the load (the call names none).
                            let delay = loader_delay(&mut rng);
                            get_chosen(&world, p, key, delay).await;
                        }
                        0..70 => {
                            let delay = loader_delay(&mut rng);
                            get(&world, p, key, delay, tagged).await;
                        }
                        // Half of them soft: `expire_tag`.
                        // One in ten of them `invalidate_tags` of the
                        // key's group and the next.
                        roll @ 70..80 if tagged => {
                            let soft = roll < 75;
                            let mut tags = vec![group(key)];
                            if roll == 79 {
                                let n: usize = key[1..].parse().expect("a letter and a number");
                                tags.push(format!("g{}", (n + 1) % 3));
                            }
                            invalidate_tag(&world, p, &tags, &keys, &writes, soft).await;
                        }
                        80 if plain && rng.random_bool(0.3) => {
                            let hard = rng.random_bool(0.5);
                            // Half of the soft ones spread over a window.
                            let window = if !hard && rng.random_bool(0.5) {
                                ms(rng.random_range(1..3_000))
                            } else {
                                Duration::ZERO
                            };
                            clear(&world, p, hard, window, &keys, &writes).await;
                            // Half of those followed by another inside
                            // their window: the later one must not make
                            // an entry fresher than the earlier left it.
                            if !window.is_zero() && rng.random_bool(0.5) {
                                sleep(ms(rng.random_range(0..window.as_millis() as u64))).await;
                                let again = ms(rng.random_range(1..6_000));
                                clear(&world, p, false, again, &keys, &writes).await;
                            }
                        }
                        70..80 => {
                            let delay = loader_delay(&mut rng);
                            let n = rng.random_range(2..=5);
                            let batch: Vec<String> = (0..n)
                                .map(|_| keys[rng.random_range(0..keys.len())].clone())
                                .collect();
                            get_many(&world, p, &batch, delay).await;
                        }
                        // Half of a plain round's invalidations and sets:
                        // an `invalidate_many` or a `set_many` of the key
                        // and a few others.
                        roll @ 81..100 if plain && roll % 2 == 1 => {
                            let dropped = rng
                                .random_bool(DROPPED_WRITES)
                                .then(|| ms(rng.random_range(0..=700)));
                            let n = rng.random_range(1..=3);
                            let mut batch: Vec<String> = (0..n)
                                .map(|_| keys[rng.random_range(0..keys.len())].clone())
                                .chain([key.clone()])
                                .collect();
                            let how = match roll {
                                ..90 => BatchOp::InvalidateMany,
                                // Side-by-side `set`s of the key, its
                                // next eight and the others: more than
                                // the cache has in the air, so they meet
                                // in its write queue, and split there
                                // (no draw of its own: the schedule of
                                // every other arm stays).
                                97 | 99 => {
                                    let at = keys.iter().position(|k| k == key).unwrap_or(0);
                                    batch.extend(
                                        (1..=8).map(|i| keys[(at + i) % keys.len()].clone()),
                                    );
                                    BatchOp::Sets
                                }
                                _ => BatchOp::SetMany,
                            };
                            write_many(&world, p, batch, &writes, dropped, how).await;
                        }
                        roll => {
                            let _row = writes[key].lock().await;
                            let version = world.bump(key);
                            let start = Instant::now();
                            // Now and then the caller goes away (a request
                            // cancelled), before or after the store ran it.
                            let dropped = rng
                                .random_bool(DROPPED_WRITES)
                                .then(|| ms(rng.random_range(0..=700)));
                            let within = dropped.unwrap_or(BOUND);
                            let ran_before = world.revocations(key);
                            let soft = (adaptive || versioned) && roll < 87;
                            let (op, result) = if soft {
                                ("expire", timeout(within, p.cache.expire(key)).await)
                            } else if roll < 90 {
                                ("invalidate", timeout(within, p.cache.invalidate(key)).await)
                            } else {
                                world.produced(key, version, start);
                                let val = Val {
                                    key: key.clone(),
                                    version,
                                };
                                let set = async {
                                    if tagged {
                                        p.cache.entry(key).tags([group(key)]).set(&val).await
                                    } else {
                                        p.cache.set(key, &val).await
                                    }
                                };
                                ("set", timeout(within, set).await)
                            };
                            let write = Write {
                                op,
                                key,
                                version,
                                soft,
                                start,
                                dropped: dropped.is_some(),
                                ran_before,
                            };
                            let outcome = write.outcome(&world, p, &result);
                            world.trace(p.id, op, key, start, outcome);
                        }
                    }
                    sleep(ms(rng.random_range(0..400))).await;
                }
            })
        })
        .collect();
    for worker in workers {
        worker.await.expect("worker panicked");
    }
    scheduler.await.expect("scheduler panicked");
    pressure.await.expect("the eviction task panicked");
    index_loss.await.expect("the index loss task panicked");
    if let Some(evictor) = record_evictor {
        evictor.await.expect("the record evictor panicked");
    }
    if let Some(evictor) = evictor {
        evictor.await.expect("evictor panicked");
    }
}

/// A healthy fleet, 50 callers per process at a fresh key whose loader is
/// slower than `lock_wait`: exactly one loader call.
async fn slow_loader_round(world: &Arc<World>) {
    let seed = world.seed;
    let procs = fleet(world, 1, &CHAOS_FLEET, false);
    let key = "slow";
    let mut rng = stream(seed, 3);
    let callers = spawn_callers(world, &procs, key, ms(8_000), &mut rng);
    let mut errors = 0;
    for (_, caller) in callers {
        if caller.await.expect("caller panicked").is_none() {
            errors += 1;
        }
    }
    let calls = world.load_calls(key);
    if calls.len() != 1 || errors != 0 {
        world.violate("one-load-slow-loader", key,
            format!(
                "healthy fleet, 4x50 callers, 8 s loader: {} loader calls (by processes {calls:?}), \
                 expected 1; {errors} callers got no value, expected 0",
                calls.len()
            ),
        );
    }
}

/// A healthy fleet (no faults, no message lost): each way of revoking a
/// key from another process (`invalidate`, `set`, `invalidate_many`,
/// `set_many`) reaches process 0's L1 over the bus. A copy it served from
/// L1 before is not served once the call returned and the notice had
/// 50 ms to arrive (its L1 TTL is 30 s). The chaos rounds lose messages,
/// so there another process's L1 is bound only by its TTL, and a notice
/// nobody acts on would go unseen.
async fn bus_heard_round(world: &Arc<World>) {
    let procs = fleet(world, 16, &CHAOS_FLEET, false);
    let (reader, writer) = (&procs[0], &procs[1]);
    for (n, op) in ["invalidate", "set", "invalidate_many", "set_many"]
        .into_iter()
        .enumerate()
    {
        let (key, other) = (format!("heard-{n}"), format!("heard-{n}-b"));
        let read = || async {
            let loader = world.loader(reader.id, &key, ms(10));
            let call = reader.cache.get_or_load_with_meta(key.as_str(), loader);
            match timeout(BOUND, call).await {
                Ok(Ok(Fetched {
                    value: Some(val),
                    served,
                    ..
                })) => Some((val.version, served)),
                _ => None,
            }
        };
        read().await;
        // The listener subscribes; the next read is L1's.
        sleep(ms(100)).await;
        let start = Instant::now();
        let Some((old, Served::L1Hit)) = read().await else {
            world.violate(
                "bus-heard",
                &key,
                format!("P0 did not serve {key} from L1 before {op}"),
            );
            continue;
        };
        let new = world.bump(&key);
        let other_new = world.bump(&other);
        let val = |key: &str, version| Val {
            key: key.to_owned(),
            version,
        };
        let done = match op {
            "invalidate" => writer.cache.invalidate(key.as_str()).await,
            "set" => writer.cache.set(key.as_str(), &val(&key, new)).await,
            "invalidate_many" => writer.cache.invalidate_many([&key, &other]).await,
            _ => {
                let items = [
                    (key.clone(), val(&key, new)),
                    (other.clone(), val(&other, other_new)),
                ];
                writer.cache.set_many(items).await
            }
        };
        if let Err(err) = done {
            world.violate(
                "bus-heard",
                &key,
                format!("P1 {op}({key}) failed on a healthy store: {err}"),
            );
            continue;
        }
        sleep(ms(50)).await;
        let after = read().await;
        world.trace(
            reader.id,
            "get",
            &key,
            start,
            format!("{op} v{old} -> v{new}: {after:?}"),
        );
        if after.is_none_or(|(version, _)| version < new) {
            world.violate(
                "bus-heard",
                &key,
                format!("P0 served {key} as {after:?} 50 ms after P1's {op} (v{new}) returned"),
            );
        }
    }
}

/// A healthy fleet whose first loader's process is partitioned as it
/// starts: exactly one takeover.
async fn holder_death_round(world: &Arc<World>) {
    let seed = world.seed;
    let procs = fleet(world, 2, &CHAOS_FLEET, false);
    let key = "orphan";
    let partitioned: Arc<Mutex<Option<usize>>> = Arc::default();
    {
        let stores: Vec<ChaosStore> = procs.iter().map(|p| p.store.clone()).collect();
        let partitioned = Arc::clone(&partitioned);
        let world2 = Arc::clone(world);
        *lock(&world.on_load) = Some(Box::new(move |proc, k| {
            let mut partitioned = lock(&partitioned);
            if k == key && partitioned.is_none() {
                stores[proc].set_up(false);
                *partitioned = Some(proc);
                world2.trace(proc, "partition", k, Instant::now(), String::new());
            }
        }));
    }
    let mut rng = stream(seed, 4);
    let callers = spawn_callers(world, &procs, key, ms(3_000), &mut rng);
    let mut missing = BTreeMap::<usize, usize>::new();
    let mut results = Vec::new();
    for (proc, caller) in callers {
        results.push((proc, caller.await.expect("caller panicked")));
    }
    let dead = *lock(&partitioned);
    for (proc, got) in results {
        if Some(proc) != dead && got.is_none() {
            *missing.entry(proc).or_default() += 1;
        }
    }
    *lock(&world.on_load) = None;
    let calls = world.load_calls(key);
    if calls.len() != 2 || !missing.is_empty() {
        world.violate(
            "one-load-holder-death",
            key,
            format!(
                "healthy fleet, 4x50 callers, 3 s loader, {} partitioned as its loader \
                 started: {} loader calls (by processes {calls:?}), expected 2; callers without a \
                 value per surviving process: {missing:?}, expected none",
                dead.map_or_else(|| "nobody".to_owned(), |p| format!("P{p}")),
                calls.len()
            ),
        );
    }
}

/// A healthy fleet over a store that answers every call slowly
/// (**one-load-slow-store**): just below the read deadline (40–49 ms,
/// every call answers), and just above it (51–70 ms: the first reads of
/// each process time out and grow its read deadline, writes and leases
/// answer). 4 × 50 callers at a fresh key with a 200 ms loader, as in the
/// one-load rounds: exactly one loader call and no errors. A read that
/// timed out must not skip the lease.
async fn slow_store_round(world: &Arc<World>) {
    let seed = world.seed;
    let mut rng = stream(seed, 8);
    for (round, key, latency) in [
        (8, "lag-below", ms(40)..=ms(49)),
        (9, "lag-above", ms(51)..=ms(70)),
    ] {
        let procs = fleet(world, round, &CHAOS_FLEET, false);
        for p in &procs {
            p.store.set_slow(latency.clone());
        }
        let callers = spawn_callers(world, &procs, key, ms(200), &mut rng);
        let mut errors = 0;
        for (_, caller) in callers {
            if caller.await.expect("caller panicked").is_none() {
                errors += 1;
            }
        }
        let calls = world.load_calls(key);
        if calls.len() != 1 || errors != 0 {
            world.violate(
                "one-load-slow-store",
                key,
                format!(
                    "healthy fleet, every reply {}-{} ms late (read deadline 50 ms, growing), \
                     4x50 callers, 200 ms loader: {} loader calls (by processes {calls:?}), \
                     expected 1; {errors} callers got no value, expected 0",
                    latency.start().as_millis(),
                    latency.end().as_millis(),
                    calls.len()
                ),
            );
        }
    }
}

/// A healthy fleet, each process asking `get_many` for its window of
/// overlapping keys (seeded sizes, released within 20 ms of each other),
/// 500 ms batch loader; the process whose batch loader starts first is
/// partitioned from the store at that moment (it dies mid-batch: its
/// leases are no longer extended, nothing of it is written). Each
/// survivor gets every value, takes the dead holder's keys over in at most
/// 2 loader calls (one batch per process), and is done within the lease
/// TTL plus two loads of the death; no key is loaded more than twice (the
/// dead holder's load and one takeover).
async fn batch_holder_death_round(world: &Arc<World>) {
    let seed = world.seed;
    let procs = fleet(world, 10, &CHAOS_FLEET, false);
    let mut rng = stream(seed, 70);
    let window = rng.random_range(40..=150usize);
    let step = rng.random_range(5..=window / 2);
    let keys: Vec<String> = (0..window + 3 * step).map(|k| format!("b{k:03}")).collect();
    let partitioned: Arc<Mutex<Option<(usize, Instant)>>> = Arc::default();
    {
        let stores: Vec<ChaosStore> = procs.iter().map(|p| p.store.clone()).collect();
        let partitioned = Arc::clone(&partitioned);
        let world2 = Arc::clone(world);
        *lock(&world.on_load) = Some(Box::new(move |proc, k| {
            let mut partitioned = lock(&partitioned);
            if k.starts_with('b') && partitioned.is_none() {
                stores[proc].set_up(false);
                *partitioned = Some((proc, Instant::now()));
                world2.trace(proc, "partition", k, Instant::now(), String::new());
            }
        }));
    }
    let delay = ms(500);
    let calls: Vec<_> = procs
        .iter()
        .map(|p| {
            let (world, p) = (Arc::clone(world), p.clone());
            let mine = keys[p.id * step..p.id * step + window].to_vec();
            let stagger = ms(rng.random_range(0..20));
            tokio::spawn(async move {
                sleep(stagger).await;
                let got = get_many(&world, &p, &mine, delay).await;
                (p.id, got, Instant::now())
            })
        })
        .collect();
    let mut results = Vec::new();
    for call in calls {
        results.push(call.await.expect("caller panicked"));
    }
    *lock(&world.on_load) = None;
    let Some((dead, died)) = *lock(&partitioned) else {
        world.violate(
            "batch-holder-death",
            "b",
            "no batch loader ever started".into(),
        );
        return;
    };
    let lease_ttl = Duration::from_secs(3);
    let mut problems = Vec::new();
    for (proc, got, done) in &results {
        if *proc == dead {
            continue;
        }
        let missing = got.iter().filter(|v| v.is_none()).count();
        if missing > 0 {
            problems.push(format!(
                "P{proc}: {missing} of {window} keys without a value"
            ));
        }
        let after = done.saturating_duration_since(died);
        if after > lease_ttl + 2 * delay {
            problems.push(format!(
                "P{proc}: done {} ms after the death, more than the lease TTL + 2 loads",
                after.as_millis()
            ));
        }
        // Its own first batch starts with the others'; a takeover only
        // once the dead holder's leases ran out, seconds later.
        let takeovers: Vec<usize> = lock(&world.history)
            .batch_calls
            .iter()
            .filter(|(p, at, _)| p == proc && *at >= died + Duration::from_secs(1))
            .map(|(_, _, n)| *n)
            .collect();
        if takeovers.len() > 2 {
            problems.push(format!(
                "P{proc}: {} loader calls taking over (sizes {:?}), expected at most 2",
                takeovers.len(),
                &takeovers[..takeovers.len().min(10)]
            ));
        }
    }
    let twice: Vec<&String> = keys
        .iter()
        .filter(|k| world.load_calls(k).len() > 2)
        .collect();
    if !twice.is_empty() {
        problems.push(format!(
            "{} keys loaded more than twice (the dead holder's load and one takeover), e.g. {}",
            twice.len(),
            twice[0]
        ));
    }
    if !problems.is_empty() {
        world.violate(
            "batch-holder-death",
            "b",
            format!(
                "healthy fleet, 4 get_many of {window} keys (step {step}), 500 ms batch loader, \
                 P{dead} partitioned as its batch loader started: {}",
                problems.join("; ")
            ),
        );
    }
}

/// Spawns 50 callers per process at `key`, staggered over 100 ms.
fn spawn_callers(
    world: &Arc<World>,
    procs: &[Proc],
    key: &'static str,
    delay: Duration,
    rng: &mut StdRng,
) -> Vec<(usize, tokio::task::JoinHandle<Option<Val>>)> {
    let mut callers = Vec::new();
    for p in procs {
        for i in 0..50 {
            let (world, p) = (Arc::clone(world), p.clone());
            let stagger = ms(rng.random_range(0..100));
            // Every fifth caller asks through `get_many`: one load per key
            // holds for batches too.
            callers.push((
                p.id,
                tokio::spawn(async move {
                    sleep(stagger).await;
                    if i % 5 == 4 {
                        get_many(&world, &p, &[key.to_owned()], delay)
                            .await
                            .pop()
                            .flatten()
                    } else {
                        get(&world, &p, key, delay, false).await
                    }
                }),
            ));
        }
    }
    callers
}

/// One healthy process with L1, grace 0, default early refresh: a hot key
/// read every 10 ms for ten TTLs must never make a caller wait for a load
/// after the first.
async fn hot_key_round(world: &Arc<World>) {
    let procs = fleet(world, 3, &[(Duration::ZERO, true)], false);
    let key = "hot";
    let p = &procs[0];
    let first = get(world, p, key, ms(100), false).await;
    if first.is_none() {
        world.violate("early-refresh-l1", key, "the first load failed".into());
        return;
    }
    let end = Instant::now() + TTL * 10;
    let mut readers = Vec::new();
    while Instant::now() < end {
        let (world, p) = (Arc::clone(world), p.clone());
        readers.push(tokio::spawn(async move {
            let seq = world.next_seq();
            let start = Instant::now();
            let loader = world.loader(p.id, key, ms(100));
            let result = timeout(BOUND, p.cache.get_or_load_with_meta(key, loader)).await;
            let served = match &result {
                Ok(Ok(fetched)) => Some(fetched.served),
                _ => None,
            };
            world.check_get(p.id, p.profile, key, seq, start, result, BOUND);
            (world.ms(start), served)
        }));
        sleep(ms(10)).await;
    }
    let total = readers.len();
    let (mut loaded, mut coalesced) = (Vec::new(), Vec::new());
    for reader in readers {
        match reader.await.expect("reader panicked") {
            (at, Some(Served::Loaded)) => loaded.push(at),
            (at, Some(Served::Coalesced)) => coalesced.push(at),
            _ => {}
        }
    }
    if !loaded.is_empty() || coalesced.len() > HOT_COALESCED_ALLOWED {
        world.violate(
            "early-refresh-l1",
            key,
            format!(
                "L1 on, grace 0, xfetch(1.0), 100 ms loader, {total} reads every 10 ms after \
                 warm-up: {} callers ran a load themselves (Loaded: the entry expired with no \
                 refresh in flight), expected 0, at ms {:?}; {} joined a load (Coalesced), at \
                 most {HOT_COALESCED_ALLOWED} allowed",
                loaded.len(),
                &loaded[..loaded.len().min(10)],
                coalesced.len(),
            ),
        );
    }
}

/// A caller that polls `get_or_load` once and then holds its future
/// unpolled (a `select!` whose other arm is busy, a slowly consumed
/// stream) delays nobody else past one read deadline. A healthy fleet
/// whose store answers every call 10 to 20 ms late (read deadline 50 ms);
/// in each process, for a cold key and for a warm one of its own, one
/// caller polls once and holds its future 1.5 to 2.5 s, and 20 callers of
/// the key arrive within the next 100 ms: each is answered within
/// [`HELD_FOLLOWER_BOUND`], the cold key is loaded once (the warm one not
/// at all) while the caller is held, and the held caller, polled again,
/// gets a right value too.
async fn held_leader_round(world: &Arc<World>) {
    let mut rng = stream(world.seed, 90);
    let procs = fleet(
        world,
        12,
        &[(Duration::ZERO, false), (Duration::ZERO, true)],
        false,
    );
    for p in &procs {
        p.store.set_slow(ms(10)..=ms(20));
    }
    for p in &procs {
        for warm in [false, true] {
            let key: &'static str = match (p.id, warm) {
                (0, false) => "held-cold-0",
                (0, true) => "held-warm-0",
                (_, false) => "held-cold-1",
                (_, true) => "held-warm-1",
            };
            if warm && get(world, p, key, ms(100), false).await.is_none() {
                world.violate("held-leader", key, "warming the key failed".into());
                continue;
            }
            let loaded_before = world.load_calls(key).len();
            let hold = ms(rng.random_range(1_500..2_500));
            let seq = world.next_seq();
            let start = Instant::now();
            let loader = world.loader(p.id, key, ms(100));
            let mut held = Box::pin(p.cache.get_or_load_with_meta(key, loader));
            // One poll: its read is in the air, and nobody polls it.
            let early = timeout(Duration::ZERO, held.as_mut()).await;
            let followers: Vec<_> = (0..20)
                .map(|_| {
                    let (world, p) = (Arc::clone(world), p.clone());
                    let stagger = ms(rng.random_range(0..100));
                    tokio::spawn(async move {
                        sleep(stagger).await;
                        let seq = world.next_seq();
                        let start = Instant::now();
                        let loader = world.loader(p.id, key, ms(100));
                        let call = p.cache.get_or_load_with_meta(key, loader);
                        let result = timeout(HELD_FOLLOWER_BOUND, call).await;
                        world.check_get(
                            p.id,
                            p.profile,
                            key,
                            seq,
                            start,
                            result,
                            HELD_FOLLOWER_BOUND,
                        )
                    })
                })
                .collect();
            sleep(hold).await;
            // While the caller was held (the entries are younger than their
            // fresh time: no early refresh either).
            let loaded = world.load_calls(key).len() - loaded_before;
            let expected = usize::from(!warm);
            if loaded != expected {
                world.violate(
                    "held-leader",
                    key,
                    format!(
                        "P{} held a get_or_load future unpolled for {hold:?} while 20 callers \
                         asked for the {} key: {loaded} loader calls meanwhile, expected {expected}",
                        p.id,
                        if warm { "warm" } else { "cold" },
                    ),
                );
            }
            let result = match early {
                Ok(done) => Ok(done),
                Err(_) => timeout(BOUND, held).await,
            };
            world.check_get(p.id, p.profile, key, seq, start, result, hold + BOUND);
            for follower in followers {
                follower.await.expect("follower panicked");
            }
        }
    }
}

/// How long a caller of the held-leader round may take: one read deadline
/// (50 ms) waiting for the held caller's read, its own read, then a load
/// (lease, 100 ms loader, write), every store call up to 20 ms late; with
/// room to spare, yet well below the 1.5 s the caller is held at least.
const HELD_FOLLOWER_BOUND: Duration = Duration::from_millis(800);

/// Callers of the hot-key round that may join a refresh XFetch started
/// late (inside the last load time before expiry): one load's worth.
const HOT_COALESCED_ALLOWED: usize = 10;

/// Redis restarts empty while the database is down: two processes with L1
/// and a minute of `max_stale` hold every key in L1, then the store loses
/// every entry and lease (a restart without persistence, a failover to an
/// empty replica, a `FLUSHDB`) and every load fails. Calls on those keys,
/// past their fresh time but inside `max_stale`, must all be answered from
/// L1 (**fail-safe-l1**), and pass the other checks too.
async fn empty_restart_round(world: &Arc<World>) {
    let seed = world.seed;
    let minute = Duration::from_secs(60);
    let procs = fleet(world, 7, &[(minute, true), (minute, true)], false);
    let keys: Vec<String> = (0..6).map(|k| format!("e{k}")).collect();
    let mut rng = stream(seed, 7);
    // Most seeds soft-clear the namespace first: its clear record must not
    // turn the restart into errors (issue 55: the first load pinned a hard
    // record, which emptied L1 in every process).
    if rng.random_bool(0.75) {
        let window = ms(rng.random_range(0..120_000));
        let start = Instant::now();
        let outcome = timeout(BOUND, procs[0].cache.clear(ClearMode::Soft { window })).await;
        world.trace(
            0,
            "clear",
            "-",
            start,
            format!("soft {window:?}: {outcome:?}"),
        );
    }
    for p in &procs {
        for key in &keys {
            get(world, p, key, ms(5), false).await;
        }
    }
    // Nobody changes the rows from here on. Redis restarts empty: every
    // key gone (the clear record too), every bus dropped.
    let store = procs[0].store.inner().clone();
    for key in &keys {
        let value = procs[0].cache.storage_key(key).expect("valid key");
        let lease = lease_of(&value);
        for gone in [value, lease] {
            let _ = store.delete(&gone).await;
        }
    }
    let _ = store.delete(procs[0].cache.clear_record_key()).await;
    for p in &procs {
        p.store.kill_feeds();
    }
    world.trace(0, "flush", "-", Instant::now(), "database down".into());
    // Past the fresh time (TTL, with its jitter), inside max_stale.
    sleep(fresh_max(TTL) + ms(100)).await;
    let until = Instant::now() + Duration::from_secs(20);
    while Instant::now() < until {
        let p = &procs[rng.random_range(0..procs.len())];
        let key = &keys[rng.random_range(0..keys.len())];
        let seq = world.next_seq();
        let start = Instant::now();
        let down = || async { Err::<Option<Val>, _>(std::io::Error::other("database down")) };
        let result = timeout(BOUND, p.cache.get_or_load_with_meta(key, down)).await;
        if let Ok(Err(err)) = &result {
            world.violate(
                "fail-safe-l1",
                key,
                format!(
                    "P{} get_or_load({key}) at {} ms failed ({err}) though its L1 held the key \
                     inside max_stale",
                    p.id,
                    world.ms(start)
                ),
            );
        }
        world.check_get(p.id, p.profile, key, seq, start, result, BOUND);
        sleep(ms(rng.random_range(10..300))).await;
    }
}

/// **bus-death**: two healthy processes with L1 (30 s TTL, no message
/// loss) hold four keys; the bus tasks of process 0 die (as with the
/// runtime that ran them: the subscription just ends); process 1 then
/// changes and invalidates every key. Process 0's calls that start more
/// than one store reply later must return the new versions: its cache
/// noticed that nobody listens (L1 unverified, a new listener on its next
/// call). Before issue 27 its L1 served the old values for its whole TTL.
async fn bus_death_round(world: &Arc<World>) {
    let seed = world.seed;
    let procs = fleet(world, 11, &[(Duration::ZERO, true); 2], false);
    let (deaf, other) = (&procs[0], &procs[1]);
    let keys: Vec<String> = (0..4).map(|k| format!("b{k}")).collect();
    for p in &procs {
        for key in &keys {
            get(world, p, key, ms(5), false).await;
        }
    }
    let mut rng = stream(seed, 80);
    sleep(ms(rng.random_range(10..500))).await;
    let killed = deaf.store.kill_feeds();
    world.trace(
        deaf.id,
        "bus-gone",
        "-",
        Instant::now(),
        format!("{killed} feed(s)"),
    );
    sleep(ms(rng.random_range(0..500))).await;
    let mut fences = Vec::new();
    for key in &keys {
        let version = world.bump(key);
        let start = Instant::now();
        match timeout(BOUND, other.cache.invalidate(key)).await {
            Ok(Ok(())) => {
                world.fence(other.id, key, version);
                fences.push((key.clone(), version, Instant::now()));
            }
            outcome => world.violate(
                "errors-in-healthy-round",
                key,
                format!("P1 invalidate({key}) in the bus-death round: {outcome:?}"),
            ),
        }
        world.trace(other.id, "invalidate", key, start, format!("v{version}"));
    }
    let until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < until {
        let (key, version, at) = &fences[rng.random_range(0..fences.len())];
        let (seq, start) = (world.next_seq(), Instant::now());
        let loader = world.loader(deaf.id, key, ms(5));
        let result = timeout(BOUND, deaf.cache.get_or_load_with_meta(key, loader)).await;
        let got = world.check_get(deaf.id, deaf.profile, key, seq, start, result, BOUND);
        if start >= *at + MAX_REPLY
            && let Some(val) = got.filter(|val| val.version < *version)
        {
            world.violate(
                "bus-death",
                key,
                format!(
                    "P0 get_or_load({key}) at {} ms returned v{} after P1 invalidated it at v{version} \
                     ({} ms), its bus tasks gone",
                    world.ms(start),
                    val.version,
                    world.ms(*at)
                ),
            );
        }
        sleep(ms(rng.random_range(10..100))).await;
    }
}

/// **expire-reaches-l1**: two healthy processes with L1 (30 s TTL, no
/// message loss) and 10 s of grace hold four keys; process 1 changes and
/// expires every key. Process 0's calls that start more than one store
/// reply later must not be served an older version as fresh (its L1 copy
/// dropped by the bus, the store's entry stale): `Stale` within grace, or
/// the new version.
async fn expire_round(world: &Arc<World>) {
    let grace = Duration::from_secs(10);
    let procs = fleet(world, 14, &[(grace, true); 2], false);
    let (reader, expirer) = (&procs[0], &procs[1]);
    let keys: Vec<String> = (0..4).map(|k| format!("e{k}")).collect();
    for p in &procs {
        for key in &keys {
            get(world, p, key, ms(5), false).await;
        }
    }
    let mut rng = stream(world.seed, 95);
    sleep(ms(rng.random_range(10..500))).await;
    let mut fences = Vec::new();
    for key in &keys {
        let version = world.bump(key);
        let start = Instant::now();
        match timeout(BOUND, expirer.cache.expire(key)).await {
            Ok(Ok(())) => {
                world.fence_of(expirer.id, key, version, true);
                fences.push((key.clone(), version, Instant::now()));
            }
            outcome => world.violate(
                "errors-in-healthy-round",
                key,
                format!("P1 expire({key}) in the expire round: {outcome:?}"),
            ),
        }
        world.trace(expirer.id, "expire", key, start, format!("v{version}"));
    }
    let until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < until {
        let (key, version, at) = &fences[rng.random_range(0..fences.len())];
        let (seq, start) = (world.next_seq(), Instant::now());
        let loader = world.loader(reader.id, key, ms(5));
        let result = timeout(BOUND, reader.cache.get_or_load_with_meta(key, loader)).await;
        let served = match &result {
            Ok(Ok(fetched)) => Some(fetched.served),
            _ => None,
        };
        let got = world.check_get(reader.id, reader.profile, key, seq, start, result, BOUND);
        let fresh = !matches!(served, Some(Served::Stale { .. }));
        if start >= *at + MAX_REPLY
            && fresh
            && let Some(val) = got.filter(|val| val.version < *version)
        {
            world.violate(
                "expire-reaches-l1",
                key,
                format!(
                    "P0 get_or_load({key}) at {} ms was served v{} as {served:?} after P1 \
                     expired it at v{version} ({} ms)",
                    world.ms(start),
                    val.version,
                    world.ms(*at)
                ),
            );
        }
        sleep(ms(rng.random_range(10..100))).await;
    }
}

/// **negative-after-expire**: two healthy processes with 10 s of grace
/// (one with L1) cache "not found" for four keys; then the rows are
/// created, and process 1 makes each entry stale with `expire` or
/// `expire_tag` (seeded). No call that starts after that returned (in
/// process 1 at once, in process 0 one store reply later) is answered
/// "not found": a negative entry is never servable stale.
async fn negative_expire_round(world: &Arc<World>) {
    let grace = Duration::from_secs(10);
    let procs = fleet(world, 16, &[(grace, true), (grace, false)], false);
    let keys: Vec<String> = (0..4).map(|k| format!("n{k}")).collect();
    let exists = Arc::new(AtomicBool::new(false));
    let loader = |key: &str| {
        let (exists, key) = (Arc::clone(&exists), key.to_string());
        move || async move {
            sleep(ms(5)).await;
            let found = exists.load(Ordering::SeqCst);
            Ok::<_, std::io::Error>(found.then_some(Val { key, version: 1 }))
        }
    };
    for p in &procs {
        for key in &keys {
            let start = Instant::now();
            let got = timeout(
                BOUND,
                p.cache.entry(key).tags(["neg"]).get_or_load(loader(key)),
            )
            .await;
            world.trace(p.id, "get", key, start, format!("{got:?}"));
        }
    }
    let mut rng = stream(world.seed, 97);
    sleep(ms(rng.random_range(10..500))).await;
    exists.store(true, Ordering::SeqCst);
    let (expirer, start) = (&procs[1], Instant::now());
    // 0: expire of each key, 1: expire_tag, 2: a soft clear (window 0).
    let mode = rng.random_range(0..3);
    let outcome = match mode {
        1 => timeout(BOUND, expirer.cache.expire_tag("neg"))
            .await
            .map_err(drop)
            .and_then(|r| r.map_err(drop)),
        2 => timeout(
            BOUND,
            expirer.cache.clear(ClearMode::Soft {
                window: Duration::ZERO,
            }),
        )
        .await
        .map_err(drop)
        .and_then(|r| r.map_err(drop)),
        _ => {
            let mut all = Ok(());
            for key in &keys {
                all = all.and(
                    timeout(BOUND, expirer.cache.expire(key))
                        .await
                        .map_err(drop)
                        .and_then(|r| r.map_err(drop)),
                );
            }
            all
        }
    };
    let how = ["expire", "expire_tag", "soft clear"][mode];
    world.trace(
        expirer.id,
        "expire",
        "-",
        start,
        format!("{how}: {outcome:?}"),
    );
    if outcome.is_err() {
        world.violate(
            "errors-in-healthy-round",
            "-",
            format!("P1 {how} in the negative round: {outcome:?}"),
        );
        return;
    }
    let at = Instant::now();
    sleep(ms(rng.random_range(0..3_000))).await;
    let until = Instant::now() + Duration::from_secs(2);
    while Instant::now() < until {
        let p = &procs[rng.random_range(0..procs.len())];
        let key = &keys[rng.random_range(0..keys.len())];
        let start = Instant::now();
        let got = timeout(
            BOUND,
            p.cache
                .entry(key)
                .tags(["neg"])
                .get_or_load_with_meta(loader(key)),
        )
        .await;
        world.trace(p.id, "get", key, start, format!("{got:?}"));
        let late_enough = p.id == expirer.id || start >= at + MAX_REPLY;
        match got {
            Ok(Ok(fetched)) if late_enough && fetched.value.is_none() => world.violate(
                "negative-after-expire",
                key,
                format!(
                    "P{} get_or_load({key}) at {} ms said not found ({:?}) after P1's {how} at {} ms, \
                     the row created before it",
                    p.id,
                    world.ms(start),
                    fetched.served,
                    world.ms(at)
                ),
            ),
            Ok(Ok(_)) => {}
            other => world.violate(
                "errors-in-healthy-round",
                key,
                format!("P{} get_or_load({key}) in the negative round: {other:?}", p.id),
            ),
        }
        sleep(ms(rng.random_range(10..100))).await;
    }
}

/// **renew-revoked**: a process refreshes a stale key (grace) with a
/// context loader that reads the database first and answers "not
/// modified" 0.8 to 2.5 s later; meanwhile another process changes the row
/// and `expire`s the key, and nobody reads it until the answer is in. The
/// renewal must be refused (the lease was revoked; the header it expects
/// changed too): the calls that follow, in either process, are never
/// served the old version as fresh (the soft fence, checked on every
/// result).
async fn renew_revoked_round(world: &Arc<World>) {
    let grace = Duration::from_secs(10);
    let procs = fleet(world, 15, &[(grace, false); 2], false);
    let (renewer, writer) = (&procs[0], &procs[1]);
    let mut rng = stream(world.seed, 96);
    for k in 0..3 {
        // Keys `n0`, `n3`, `n6`: a loader-chosen TTL of 1 s.
        let key = format!("n{}", 3 * k);
        get_adaptive(world, renewer, &key, ms(5)).await;
        sleep(ms(rng.random_range(1_200..1_600))).await;
        let (seq, start) = (world.next_seq(), Instant::now());
        let delay = ms(rng.random_range(800..2_500));
        let loader = world.context_loader_of(renewer.id, &key, delay, true);
        let call = renewer.cache.get_or_load_with_context_meta(&key, loader);
        let result = timeout(BOUND, call).await;
        world.check_get(renewer.id, renewer.profile, &key, seq, start, result, BOUND);
        sleep(ms(rng.random_range(50..500))).await;
        let version = world.bump(&key);
        let start = Instant::now();
        match timeout(BOUND, writer.cache.expire(&key)).await {
            Ok(Ok(())) => world.fence_of(writer.id, &key, version, true),
            outcome => world.violate(
                "errors-in-healthy-round",
                &key,
                format!("P1 expire({key}) in the renew-revoked round: {outcome:?}"),
            ),
        }
        world.trace(writer.id, "expire", &key, start, format!("v{version}"));
        // Nobody reads until the renewal would have landed (a read would
        // refresh the key first).
        sleep(ms(2_600)).await;
        let until = Instant::now() + Duration::from_secs(2);
        while Instant::now() < until {
            let p = &procs[rng.random_range(0..procs.len())];
            get_adaptive(world, p, &key, ms(5)).await;
            sleep(ms(rng.random_range(10..200))).await;
        }
    }
}

/// A process that hears nothing (every bus message to it lost, the
/// connection up, so nothing tells it so) loads a key slowly; another
/// process invalidates the key during the load; calls in the deaf process
/// that start later than one reply after the invalidation returned join
/// the load still in the air. Its fenced write is refused, and
/// no-resurrection holds them to the new version: a revoked load answers
/// only callers that started before it was revoked.
async fn revoked_load_round(world: &Arc<World>) {
    let seed = world.seed;
    let procs = fleet(world, 5, &[(Duration::ZERO, false); 2], false);
    let (deaf, other) = (&procs[0], &procs[1]);
    deaf.store.set_faults(Faults::HEALTHY.message_loss(1.0));
    let mut rng = stream(seed, 5);
    for round in 0..8 {
        let key = format!("r{round}");
        let slow = ms(rng.random_range(800..2_500));
        let first = {
            let (world, cache, profile, id) =
                (Arc::clone(world), deaf.cache.clone(), deaf.profile, deaf.id);
            let key = key.clone();
            tokio::spawn(async move {
                let seq = world.next_seq();
                let start = Instant::now();
                let loader = world.loader_reading_first(id, &key, slow);
                let result = timeout(BOUND, cache.get_or_load_with_meta(&key, loader)).await;
                world.check_get(id, profile, &key, seq, start, result, BOUND)
            })
        };
        sleep(ms(rng.random_range(50..400))).await;
        let version = world.bump(&key);
        let start = Instant::now();
        let outcome = match timeout(BOUND, other.cache.invalidate(&key)).await {
            Ok(Ok(())) => {
                world.fence(other.id, &key, version);
                format!("ok v{version}")
            }
            Ok(Err(err)) => format!("error {:?} v{version}", err.kind()),
            Err(_) => "HUNG".into(),
        };
        world.trace(other.id, "invalidate", &key, start, outcome);
        sleep(MAX_REPLY).await;
        let mut later = Vec::new();
        for _ in 0..4 {
            let at = ms(rng.random_range(0..slow.as_millis() as u64));
            let (world, key) = (Arc::clone(world), key.clone());
            let (cache, profile, id) = (deaf.cache.clone(), deaf.profile, deaf.id);
            later.push(tokio::spawn(async move {
                sleep(at).await;
                let seq = world.next_seq();
                let start = Instant::now();
                let loader = world.loader(id, &key, ms(10));
                let result = timeout(BOUND, cache.get_or_load_with_meta(&key, loader)).await;
                world.check_get(id, profile, &key, seq, start, result, BOUND)
            }));
        }
        first.await.expect("caller panicked");
        for caller in later {
            caller.await.expect("caller panicked");
        }
    }
}

// ---------------------------------------------------------------- running

/// What one seed produced.
struct Outcome {
    seed: u64,
    trace: Vec<Event>,
    violations: Vec<Violation>,
}

fn run_seed(seed: u64) -> Outcome {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .expect("runtime");
    let world = runtime.block_on(async {
        let world = World::new(seed);
        chaos_round(&world, Round::Plain).await;
        chaos_round(&world, Round::Tagged).await;
        chaos_round(&world, Round::Versions).await;
        chaos_round(&world, Round::Adaptive).await;
        slow_loader_round(&world).await;
        holder_death_round(&world).await;
        batch_holder_death_round(&world).await;
        hot_key_round(&world).await;
        revoked_load_round(&world).await;
        empty_restart_round(&world).await;
        slow_store_round(&world).await;
        bus_death_round(&world).await;
        expire_round(&world).await;
        negative_expire_round(&world).await;
        renew_revoked_round(&world).await;
        held_leader_round(&world).await;
        bus_heard_round(&world).await;
        world
    });
    // Background tasks (listeners, forwarders, refreshes) end with the
    // runtime.
    drop(runtime);
    let history = std::mem::take(&mut *lock(&world.history));
    Outcome {
        seed,
        trace: history.trace,
        violations: history.violations,
    }
}

impl Outcome {
    /// Writes every violation and the whole trace to `<dir>/seed-<s>.txt`.
    fn dump(&self, dir: &str) {
        let mut out = String::new();
        for v in &self.violations {
            let _ = writeln!(out, "{}: {}", v.check, v.message);
        }
        for e in &self.trace {
            let _ = writeln!(out, "{e}");
        }
        let path = std::path::Path::new(dir).join(format!("seed-{}.txt", self.seed));
        std::fs::write(&path, out).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
    }

    /// A report naming the seed, how to re-run it, each failed check with
    /// its first few violations, and the trace's tail.
    fn report(&self) -> String {
        let mut out = String::new();
        let mut by_check = BTreeMap::<&str, Vec<&Violation>>::new();
        for v in &self.violations {
            by_check.entry(v.check).or_default().push(v);
        }
        let _ = writeln!(
            out,
            "seed {} failed {} check(s); re-run with: BREAKWATER_SIM_SEED={} cargo test -p breakwater-cache --features test-util --test simulation",
            self.seed,
            by_check.len(),
            self.seed
        );
        for (check, vs) in &by_check {
            let _ = writeln!(out, "  {check}: {} violation(s)", vs.len());
            for v in vs.iter().take(3) {
                let _ = writeln!(out, "    {}", v.message);
            }
        }
        if let Some(first) = self.violations.first() {
            let _ = writeln!(
                out,
                "  trace tail at the first violation ({}), key {} and faults:",
                first.check, first.key
            );
            let related: Vec<&Event> = self.trace[..first.at.min(self.trace.len())]
                .iter()
                .filter(|e| e.key == first.key || e.key == "-")
                .collect();
            for e in &related[related.len().saturating_sub(30)..] {
                let _ = writeln!(out, "    {e}");
            }
        }
        out
    }
}

/// The seeds to run: `BREAKWATER_SIM_SEED` alone, `BREAKWATER_SIM_SEEDS`
/// from it (or from 1000), or the fixed CI set ([`FIXED_SEEDS`]).
fn seeds() -> Vec<u64> {
    let var = |name: &str| {
        std::env::var(name).ok().map(|v| {
            v.parse::<u64>()
                .unwrap_or_else(|_| panic!("{name} must be a number, got {v:?}"))
        })
    };
    match (var("BREAKWATER_SIM_SEED"), var("BREAKWATER_SIM_SEEDS")) {
        (Some(seed), None) => vec![seed],
        (start, Some(n)) => {
            let start = start.unwrap_or(1_000);
            (start..start + n).collect()
        }
        (None, None) => FIXED_SEEDS.to_vec(),
    }
}

/// The CI set: 1–8, plus 13 and 19, which catch an unfenced direct load
/// put back (a direct load's plain `SET` landing after an invalidation; of
/// seeds 1–60, 13, 14, 19, 20, 28, 37 and 50 catch it), and 1095, which
/// catches an L1 copy kept for its whole fresh window after a slow fenced
/// write (of seeds 1000–1299, 1095, 1096 and 1284 catch it); and 1005,
/// which catches a soft clear that moves an earlier soft clear's moments
/// later (of seeds 1000–1059, 1005, 1019, 1027 and 1051); and 1160, which
/// catches a follower taking a shared read sent long before it came (the
/// read kept in the air by two clear-record reads that timed out); and
/// 1180, 1201 and 1227, which catch a value's fresh window counted from
/// its write instead of its load's end (a store reply in between: the read
/// of the tags its loader chose, for one key or a batch, a declined
/// renewal); and 1267 and 1284, which catch entries that recorded no clear
/// generation turning fresh again, or coming back, under a record made
/// over a lost one (no pin made by the first write);
/// 1074 and 1131, which catch an L1 copy kept with windows counted from a
/// store reply after its value was had (an unwritten load past its chosen
/// tags' read; a batch's double-check kept past its pins and tags); and
/// 1093, which catches a caller that joins a waiter's flight long after
/// the waiter's read (kept in the air by clear-record reads that timed
/// out) taking the value that read found; and 1016 and 1017, which caught
/// a `set_many` whose values' windows start after its clear-record read
/// until the clear record came to be known locally (they, and 1065, no
/// longer do), and 1320, which catches it now (of seeds 1300–1499, 1320
/// and 1362 catch it); and 5, which
/// catches a split batch of queued `set`s answering each half's callers
/// with the other half's result (of seeds 1–40, 5 and 36 catch it).
const FIXED_SEEDS: [u64; 24] = [
    1, 2, 3, 4, 5, 6, 7, 8, 13, 19, 1005, 1016, 1017, 1074, 1093, 1095, 1131, 1160, 1180, 1201,
    1227, 1267, 1284, 1320,
];

#[test]
fn simulation_fixed_seeds() {
    let mut failed = Vec::new();
    let mut summary = BTreeMap::<&str, Vec<u64>>::new();
    for seed in seeds() {
        let outcome = run_seed(seed);
        if let Ok(dir) = std::env::var("BREAKWATER_SIM_DUMP") {
            outcome.dump(&dir);
        }
        if outcome.violations.is_empty() {
            continue;
        }
        for v in &outcome.violations {
            let seeds = summary.entry(v.check).or_default();
            if seeds.last() != Some(&seed) {
                seeds.push(seed);
            }
        }
        failed.push(outcome);
    }
    if failed.is_empty() {
        return;
    }
    let mut message =
        String::from("the coherence contract does not hold; failing seeds by check:\n");
    for (check, seeds) in &summary {
        let _ = writeln!(message, "  {check}: seeds {seeds:?}");
    }
    for outcome in failed.iter().take(3) {
        message.push('\n');
        message.push_str(&outcome.report());
    }
    panic!("{message}");
}

/// Seed 37 caught tokio's randomised wake-up order of a `watch` channel's
/// receivers (see `cache/notify.rs`); seed 7 is a plain one.
#[test]
fn one_seed_replays_exactly() {
    for seed in [7, 37] {
        let first = run_seed(seed);
        let second = run_seed(seed);
        assert!(
            first.trace.len() > 1_000,
            "too little happened: {} events",
            first.trace.len()
        );
        if let Some(i) = (0..first.trace.len().max(second.trace.len()))
            .find(|&i| first.trace.get(i) != second.trace.get(i))
        {
            let show = |t: &[Event]| {
                t[i.saturating_sub(5).min(t.len())..(i + 5).min(t.len())]
                    .iter()
                    .map(|e| format!("    {e}\n"))
                    .collect::<String>()
            };
            panic!(
                "seed {seed} did not replay: the traces differ at event {i} of {}/{}\n\
                 first run:\n{}second run:\n{}",
                first.trace.len(),
                second.trace.len(),
                show(&first.trace),
                show(&second.trace)
            );
        }
        assert_eq!(first.violations, second.violations, "seed {seed}");
    }
}
