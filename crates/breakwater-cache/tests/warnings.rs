//! The warnings a cache gives about itself: once at build for a default
//! that surprises in production (no store, no namespace), and once, with
//! its likely cause, for stored values of another type.

mod support;

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use breakwater_cache::testing::CountingStore;
use breakwater_cache::{Cache, Codec, Jitter, MemoryStore, Store};
use tracing::field::{Field, Visit};
use tracing::{Event, Level};
use tracing_subscriber::Registry;
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};

/// Every event's level and message.
#[derive(Clone, Default)]
struct Events(Arc<Mutex<Vec<(Level, String)>>>);

struct Message(String);

impl Visit for Message {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.0 = format!("{value:?}");
        }
    }
}

impl<S: tracing::Subscriber> Layer<S> for Events {
    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        let mut message = Message(String::new());
        event.record(&mut message);
        self.0
            .lock()
            .unwrap()
            .push((*event.metadata().level(), message.0));
    }
}

/// Runs `scenario` with a subscriber that keeps every event (debug too).
fn capture<F, Fut>(scenario: F) -> Vec<(Level, String)>
where
    F: FnOnce() -> Fut,
    Fut: Future<Output = ()>,
{
    let events = Events::default();
    let subscriber = Registry::default().with(events.clone());
    let runtime = support::paused_runtime();
    tracing::subscriber::with_default(subscriber, || {
        tracing::callsite::rebuild_interest_cache();
        runtime.block_on(scenario())
    });
    drop(runtime);
    events.0.lock().unwrap().clone()
}

fn warnings(events: &[(Level, String)]) -> Vec<&str> {
    events
        .iter()
        .filter(|(level, _)| *level == Level::WARN)
        .map(|(_, message)| message.as_str())
        .collect()
}

#[test]
fn a_cache_without_a_store_or_a_namespace_says_so_once_at_build() {
    let events = capture(|| async {
        let _bare: Cache<String> = Cache::builder().build().unwrap();
    });
    let warned = warnings(&events);
    assert_eq!(warned.len(), 2, "{events:#?}");
    assert!(
        warned[0].contains("without .store(..)") && warned[0].contains("in this process only"),
        "{warned:?}"
    );
    assert!(
        warned[1].contains("without .namespace(..)") && warned[1].contains("\"default\""),
        "{warned:?}"
    );

    let events = capture(|| async {
        let _named: Cache<String> = Cache::builder()
            .namespace("products")
            .store(MemoryStore::new())
            .build()
            .unwrap();
    });
    assert_eq!(warnings(&events), Vec::<&str>::new(), "{events:#?}");
}

#[test]
fn values_of_another_type_are_reported_once_with_their_likely_cause() {
    let events = capture(|| async {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
        let build = || {
            Cache::<String>::builder()
                .namespace("shared")
                .shared_store(Arc::clone(&store))
                .ttl(Duration::from_secs(60))
                .jitter(Jitter::none())
        };
        let names = build().build().unwrap();
        for i in 0..20 {
            names
                .get_or_load(format!("k{i}"), || async {
                    Ok::<_, std::io::Error>(Some("a name".to_owned()))
                })
                .await
                .unwrap();
        }
        // Another service's cache: same namespace, another value type.
        let counts: Cache<Vec<u64>> = Cache::builder()
            .namespace("shared")
            .shared_store(Arc::clone(&store))
            .build()
            .unwrap();
        for i in 0..20 {
            let got = counts
                .get_or_load(format!("k{i}"), || async {
                    Ok::<_, std::io::Error>(Some(vec![1, 2, 3]))
                })
                .await
                .unwrap();
            assert_eq!(got, Some(vec![1, 2, 3]), "a foreign value is a miss");
        }
        // Each one counted (by the read, and again by the fill's re-read
        // under the lease).
        assert!(counts.stats().unreadable >= 20, "{}", counts.stats());

        // And entries written with another codec.
        let json: Cache<String> = build().codec(Codec::json()).build().unwrap();
        for i in 20..30 {
            names
                .get_or_load(format!("k{i}"), || async {
                    Ok::<_, std::io::Error>(Some("a name".to_owned()))
                })
                .await
                .unwrap();
            json.get_or_load(format!("k{i}"), || async {
                Ok::<_, std::io::Error>(Some("json".to_owned()))
            })
            .await
            .unwrap();
        }
        assert!(json.stats().unreadable >= 10, "{}", json.stats());
    });
    let warned = warnings(&events);
    assert_eq!(warned.len(), 2, "{warned:#?}");
    assert!(
        warned[0].contains("does not decode as this cache's value type")
            && warned[0]
                .contains("another cache or service stores another type under the same namespace")
            && warned[0].contains("Reported once"),
        "{warned:?}"
    );
    assert!(
        warned[1].contains("another codec") && warned[1].contains("same namespace"),
        "{warned:?}"
    );
    let quiet = events
        .iter()
        .filter(|(level, message)| {
            *level == Level::DEBUG && message.contains("does not decode as this cache's value type")
        })
        .count();
    assert!(quiet >= 19, "the others at debug: {quiet}");
}

#[test]
fn an_outage_served_from_l1_is_logged_as_served_from_l1() {
    let loads = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = Arc::clone(&loads);
    let events = capture(|| async move {
        let store = Arc::new(CountingStore::new(MemoryStore::new()));
        let cache: Cache<String> = Cache::builder()
            .namespace("outage")
            .shared_store(store.clone())
            .ttl(Duration::from_secs(60))
            .jitter(Jitter::none())
            .l1(breakwater_cache::L1Config::new().ttl(Duration::from_secs(1)))
            .build()
            .unwrap();
        let load = |counted: Arc<std::sync::atomic::AtomicUsize>| {
            move || async move {
                counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                Ok::<_, std::io::Error>(Some("v".to_owned()))
            }
        };
        for key in ["a", "b", "c"] {
            cache.get_or_load(key, load(counted.clone())).await.unwrap();
        }
        // The L1 copies are past their L1 time, and the store fails.
        tokio::time::advance(Duration::from_secs(2)).await;
        store.fail_gets(true);
        for _ in 0..50 {
            for key in ["a", "b", "c"] {
                let got = cache
                    .get_or_load_with_meta(key, load(counted.clone()))
                    .await
                    .unwrap();
                assert_eq!(got.value.as_deref(), Some("v"));
            }
            // And the three at once.
            let many = cache
                .get_many(["a", "b", "c"], |_keys: Vec<&'static str>| async {
                    Ok::<Vec<(&'static str, String)>, std::io::Error>(Vec::new())
                })
                .await
                .unwrap();
            assert!(many.iter().all(Option::is_some));
            tokio::time::advance(Duration::from_millis(100)).await;
        }
    });
    assert_eq!(
        loads.load(std::sync::atomic::Ordering::SeqCst),
        3,
        "no load in the outage"
    );
    let warned = warnings(&events);
    let reads: Vec<&&str> = warned
        .iter()
        .filter(|line| line.contains("store read failed"))
        .collect();
    assert!(
        reads.iter().any(|line| line.contains("for a batch")),
        "{reads:#?}"
    );
    assert!(reads.len() >= 4, "one a second of each kind: {reads:#?}");
    for line in reads {
        assert!(
            line.contains("serving the stale L1 cop") && !line.contains("loading"),
            "the log says something else than what happened: {line:?}"
        );
    }
}

/// Runs `scenario` on a real-time runtime with a subscriber that keeps
/// every event; `scenario` gets the events seen so far.
fn capture_live<F, Fut>(scenario: F) -> Vec<(Level, String)>
where
    F: FnOnce(Events) -> Fut,
    Fut: Future<Output = ()>,
{
    let events = Events::default();
    let subscriber = Registry::default().with(events.clone());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    tracing::subscriber::with_default(subscriber, || {
        tracing::callsite::rebuild_interest_cache();
        runtime.block_on(scenario(events.clone()))
    });
    drop(runtime);
    events.0.lock().unwrap().clone()
}

/// A cache built on a runtime checks the Redis it is given by itself and
/// says what needs a look (here `noeviction`) in one warning; with
/// `startup_check(false)` it sends the Redis nothing until it is used.
#[test]
fn a_cache_checks_its_redis_at_startup_unless_told_not_to() {
    use breakwater_cache::RedisStore;
    use breakwater_cache_testkit::RedisServer;

    let server =
        RedisServer::start_with(&["--maxmemory", "64mb", "--maxmemory-policy", "noeviction"]);
    let noeviction = |events: &[(Level, String)]| {
        events
            .iter()
            .any(|(level, m)| *level == Level::WARN && m.starts_with("noeviction"))
    };
    let events = capture_live(|seen| async move {
        let store = RedisStore::connect(&server.url()).unwrap();
        let _cache: Cache<String> = Cache::builder()
            .namespace("auto")
            .store(store)
            .build()
            .unwrap();
        // The check runs in the background: a bounded wait for its line.
        for _ in 0..500 {
            if noeviction(&seen.0.lock().unwrap()) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let store = RedisStore::connect(&server.url()).unwrap();
        let configs = || {
            let stats = server.command(&["INFO", "commandstats"]).unwrap();
            stats
                .lines()
                .find(|l| l.starts_with("cmdstat_config:"))
                .map(str::to_owned)
        };
        let before = configs();
        let quiet: Cache<String> = Cache::builder()
            .namespace("quiet")
            .store(store)
            .startup_check(false)
            .build()
            .unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(configs(), before, "a cache without the check ran CONFIG");
        drop(quiet);
    });
    assert!(noeviction(&events), "no startup warning: {events:#?}");
}
