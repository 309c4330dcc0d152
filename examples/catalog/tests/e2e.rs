//! End to end: two `catalog` processes over one private PostgreSQL and one
//! private Redis, driven over HTTP.
//!
//! 1. 200 concurrent `GET`s of one product nobody has cached, spread over
//!    both processes, reach PostgreSQL as exactly one `SELECT` (counted in
//!    the server's statement log, and by the services' own counters). A
//!    `psql` session holds a lock on the table meanwhile, so that query is
//!    slow and every request arrives while it runs: a real stampede, not a
//!    queue of hits behind a 1 ms load. Then 200 more are all cache hits.
//! 2. A `PUT` through process A is seen by `GET`s through process B well
//!    within B's L1 TTL: the invalidation crossed processes.
//! 3. A missing product is a 404, remembered as a negative entry.
//! 4. With PostgreSQL stopped, cached products are still served, and after
//!    5 failed loads the breaker answers 503 with `Retry-After`; a product
//!    gone stale (written by a third process, C, whose products are fresh
//!    for 1 s) is served stale.
//! 5. A's `/metrics` then shows it all (requests by how they were served,
//!    stale included; the database breaker open; load and store latency
//!    histograms; notices sent), and its `/stats` agrees.
//!
//! Before all that, right after start-up, A's `/metrics` has a `# HELP` and
//! a `# TYPE` line for every breakwater metric, and every series at 0.
//!
//! It reports the requests made, the SQL queries that reached the database,
//! both bursts' latency percentiles, A's `breakwater_*` metrics and its
//! `stats()` (eprintln; `--nocapture` shows them).
//!
//! PostgreSQL comes from the Debian `postgresql` package (`./scripts/test`
//! installs it); see `breakwater_cache_testkit::PostgresServer`.

use std::io::Read;
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use breakwater_cache_testkit::{PostgresServer, RedisServer, TiedChild, free_port, tied_command};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::{Method, Request, StatusCode};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::{Value, json};

/// Concurrent requests for the cold product.
const BURST: usize = 200;
/// The cold product (seeded, never requested before the burst).
const HOT_ID: i64 = 4242;
/// The product updated through A and read through B.
const UPDATED_ID: i64 = 7;
/// An id that is not in the table.
const MISSING_ID: i64 = 99_999_999;
/// The services' L1 TTL (`api::product_cache`): without the invalidation
/// crossing processes, B would serve the old product this long.
const L1_TTL: Duration = Duration::from_secs(5);
/// How soon B must see the update: well inside the L1 TTL.
const PROPAGATION_BOUND: Duration = Duration::from_millis(2500);
/// An id only C (short TTL) reads before the outage, and A after it.
const STALE_ID: i64 = 8080;
/// C's `PRODUCT_TTL_SECS`: its products are fresh this long (±10 %).
const SHORT_TTL: Duration = Duration::from_secs(1);
/// How long a service may take to start (schema, 10,000 seeded rows).
const START_TIMEOUT: Duration = Duration::from_secs(60);
/// The deadline of one HTTP request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(20);

type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// One `catalog` process, its output collected for failure messages.
struct Service {
    name: &'static str,
    port: u16,
    output: Arc<Mutex<String>>,
    child: TiedChild,
}

impl Service {
    /// Starts the built binary against `pg` and `redis` on a free port.
    ///
    /// The Redis deadlines are patient (1 s / 2 s, not 50 / 250 ms): this
    /// test checks one load per key while Redis is healthy, and on a busy
    /// 2-core CI machine a debug build can miss a 50 ms read deadline from
    /// CPU starvation alone, which the cache rightly treats as Redis being
    /// unreachable (and loads directly).
    fn start(name: &'static str, pg: &PostgresServer, redis: &RedisServer) -> Service {
        Service::start_with(name, pg, redis, &[])
    }

    /// [`start`](Self::start), with more environment variables.
    fn start_with(
        name: &'static str,
        pg: &PostgresServer,
        redis: &RedisServer,
        env: &[(&str, &str)],
    ) -> Service {
        let port = free_port();
        let mut cmd = tied_command(env!("CARGO_BIN_EXE_catalog"));
        cmd.envs(env.iter().copied())
            .env("DATABASE_URL", pg.url())
            .env("REDIS_URL", redis.url())
            .env("BIND", format!("127.0.0.1:{port}"))
            .env("REDIS_READ_TIMEOUT_MS", "1000")
            .env("REDIS_WRITE_TIMEOUT_MS", "2000")
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = TiedChild::spawn(cmd).expect("the catalog binary runs");
        let output = Arc::new(Mutex::new(String::new()));
        for pipe in [
            child
                .take_stdout()
                .map(|p| Box::new(p) as Box<dyn Read + Send>),
            child
                .take_stderr()
                .map(|p| Box::new(p) as Box<dyn Read + Send>),
        ]
        .into_iter()
        .flatten()
        {
            let output = Arc::clone(&output);
            thread::spawn(move || collect(pipe, &output));
        }
        Service {
            name,
            port,
            output,
            child,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    fn output(&self) -> String {
        self.output.lock().unwrap().clone()
    }

    /// Waits until `/healthz` answers 200; panics with the service's output
    /// if it exits or the deadline passes.
    async fn wait_ready(&mut self, http: &HttpClient) {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!(
                    "service {} exited with {status} during start-up:\n{}",
                    self.name,
                    self.output()
                );
            }
            let probe = tokio::time::timeout(
                Duration::from_secs(1),
                send(http, Method::GET, &self.url("/healthz"), None),
            )
            .await;
            if let Ok(Ok(reply)) = probe
                && reply.status == StatusCode::OK
            {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "service {} did not answer /healthz within {START_TIMEOUT:?}:\n{}",
                self.name,
                self.output()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// `catalog_sql_queries_total{query="product_by_id"}` from `/metrics`.
    async fn product_queries(&self, http: &HttpClient) -> u64 {
        let reply = request(http, Method::GET, &self.url("/metrics"), None).await;
        assert_eq!(reply.status, StatusCode::OK);
        metric(
            &reply.text,
            "catalog_sql_queries_total{query=\"product_by_id\"}",
        )
    }
}

fn collect(mut pipe: Box<dyn Read + Send>, output: &Mutex<String>) {
    let mut buf = [0u8; 4096];
    while let Ok(n) = pipe.read(&mut buf) {
        if n == 0 {
            break;
        }
        output
            .lock()
            .unwrap()
            .push_str(&String::from_utf8_lossy(&buf[..n]));
    }
}

/// One HTTP exchange.
struct Reply {
    status: StatusCode,
    x_cache: Option<String>,
    retry_after: Option<String>,
    text: String,
    took: Duration,
}

impl Reply {
    fn json(&self) -> Value {
        serde_json::from_str(&self.text).unwrap_or_else(|e| panic!("{e}: {}", self.text))
    }
}

async fn send(
    http: &HttpClient,
    method: Method,
    url: &str,
    body: Option<Value>,
) -> Result<Reply, String> {
    let mut builder = Request::builder().method(method).uri(url);
    let body = match body {
        Some(body) => {
            builder = builder.header("content-type", "application/json");
            Full::new(Bytes::from(body.to_string()))
        }
        None => Full::new(Bytes::new()),
    };
    let request = builder.body(body).map_err(|e| e.to_string())?;
    let started = Instant::now();
    let response = http.request(request).await.map_err(|e| e.to_string())?;
    let status = response.status();
    let header = |name: &str| {
        response
            .headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let x_cache = header("x-cache");
    let retry_after = header("retry-after");
    let bytes = response
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    Ok(Reply {
        status,
        x_cache,
        retry_after,
        text: String::from_utf8_lossy(&bytes).into_owned(),
        took: started.elapsed(),
    })
}

/// [`send`] within [`REQUEST_TIMEOUT`], panicking on failure.
async fn request(http: &HttpClient, method: Method, url: &str, body: Option<Value>) -> Reply {
    match tokio::time::timeout(REQUEST_TIMEOUT, send(http, method.clone(), url, body)).await {
        Ok(Ok(reply)) => reply,
        Ok(Err(e)) => panic!("{method} {url}: {e}"),
        Err(_) => panic!("{method} {url}: no answer within {REQUEST_TIMEOUT:?}"),
    }
}

/// The value of the metric line starting with `series` (0 if absent).
fn metric(text: &str, series: &str) -> u64 {
    text.lines()
        .find_map(|line| line.strip_prefix(series))
        .map_or(0, |v| v.trim().parse::<f64>().unwrap_or(0.0) as u64)
}

/// The product `SELECT`s for `id` that reached PostgreSQL.
fn selects_of(pg: &PostgresServer, id: i64) -> usize {
    let parameters = format!("$1 = '{id}'");
    pg.statements()
        .iter()
        .filter(|s| {
            s.sql.starts_with("SELECT ")
                && s.sql.ends_with("FROM products WHERE id = $1")
                && s.parameters.as_deref() == Some(parameters.as_str())
        })
        .count()
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// `BURST` GETs of product `id`, alternating between the two services,
/// released together; `sent` counts those handed to the client.
fn fire(
    http: &HttpClient,
    bases: [String; 2],
    id: i64,
    sent: &Arc<AtomicUsize>,
) -> Vec<tokio::task::JoinHandle<Reply>> {
    let start = Arc::new(tokio::sync::Barrier::new(BURST));
    (0..BURST)
        .map(|i| {
            let http = http.clone();
            let start = Arc::clone(&start);
            let sent = Arc::clone(sent);
            let url = format!("{}/products/{id}", bases[i % 2]);
            tokio::spawn(async move {
                start.wait().await;
                sent.fetch_add(1, Ordering::SeqCst);
                request(&http, Method::GET, &url, None).await
            })
        })
        .collect()
}

async fn collect_burst(burst: Vec<tokio::task::JoinHandle<Reply>>) -> Vec<Reply> {
    tokio::time::timeout(
        Duration::from_secs(60),
        futures_util::future::join_all(burst),
    )
    .await
    .expect("the burst finished within 60 s")
    .into_iter()
    .map(|joined| joined.expect("a request task panicked"))
    .collect()
}

/// Checks every reply is `expected` and counts the `x-cache` values.
fn served_mix(replies: &[Reply], expected: &Value) -> Vec<(String, usize)> {
    let mut served: Vec<(String, usize)> = Vec::new();
    for reply in replies {
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
        assert_eq!(&reply.json(), expected, "every caller got the same product");
        let how = reply.x_cache.clone().expect("an x-cache header");
        match served.iter_mut().find(|(s, _)| *s == how) {
            Some((_, n)) => *n += 1,
            None => served.push((how, 1)),
        }
    }
    served
}

fn count_of(served: &[(String, usize)], how: &str) -> usize {
    served.iter().find(|(s, _)| s == how).map_or(0, |(_, n)| *n)
}

/// Polls `done` every 10 ms; panics naming `what` after `within`.
async fn wait_for(within: Duration, what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !done() {
        assert!(Instant::now() < deadline, "waited {within:?} for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// An `ACCESS EXCLUSIVE` lock on `products`, held by a `psql` session
/// until [`release`](Self::release): every read of the table waits, as
/// behind a slow query.
struct TableLock<'a> {
    pg: &'a PostgresServer,
    session: Option<Child>,
}

/// The locking session's `application_name`.
const LOCKER: &str = "e2e-lock";

impl<'a> TableLock<'a> {
    async fn take(pg: &'a PostgresServer) -> TableLock<'a> {
        let session = pg
            .psql_command()
            .arg("--command")
            .arg(format!(
                "SET application_name = '{LOCKER}'; BEGIN; \
                 LOCK TABLE products IN ACCESS EXCLUSIVE MODE; SELECT pg_sleep(120); COMMIT;"
            ))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("psql runs");
        let mut lock = TableLock {
            pg,
            session: Some(session),
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while lock.query(&format!(
            "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid) \
             WHERE a.application_name = '{LOCKER}' AND l.mode = 'AccessExclusiveLock' \
             AND l.granted AND l.relation = 'products'::regclass"
        )) != "1"
        {
            if let Some(Ok(Some(status))) = lock.session.as_mut().map(Child::try_wait) {
                panic!("the locking psql session ended early with {status}");
            }
            assert!(
                Instant::now() < deadline,
                "the table lock was not granted within 30 s"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        lock
    }

    /// Product queries waiting for the lock right now.
    fn blocked_product_queries(&self) -> usize {
        self.query(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' \
             AND query LIKE '%FROM products WHERE id = $1'",
        )
        .parse()
        .unwrap_or(0)
    }

    fn query(&self, sql: &str) -> String {
        tokio::task::block_in_place(|| self.pg.psql(sql)).unwrap_or_else(|e| panic!("{sql}: {e}"))
    }

    /// Cancels the locking session: its transaction rolls back, the lock
    /// goes, and the waiting query runs.
    async fn release(mut self) {
        let status = self.cancel().expect("the session ran");
        assert!(!status.success(), "the lock was held until cancelled");
    }

    fn cancel(&mut self) -> Option<std::process::ExitStatus> {
        let mut session = self.session.take()?;
        let _ = self.pg.psql(&format!(
            "SELECT pg_cancel_backend(pid) FROM pg_stat_activity \
             WHERE application_name = '{LOCKER}'"
        ));
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match session.try_wait() {
                Ok(Some(status)) => return Some(status),
                Ok(None) if Instant::now() < deadline => thread::sleep(Duration::from_millis(10)),
                _ => {
                    let _ = session.kill();
                    return session.wait().ok();
                }
            }
        }
    }
}

impl Drop for TableLock<'_> {
    fn drop(&mut self) {
        self.cancel();
    }
}

#[test]
fn two_services_share_one_query_and_see_each_others_writes() {
    let mut pg = PostgresServer::start();
    let redis = RedisServer::start();
    let mut a = Service::start("A", &pg, &redis);
    let mut b = Service::start("B", &pg, &redis);
    let short_ttl = SHORT_TTL.as_secs().to_string();
    let mut c = Service::start_with("C", &pg, &redis, &[("PRODUCT_TTL_SECS", &short_ttl)]);

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        runtime.block_on(scenario(&mut pg, &mut a, &mut b, &mut c));
    }));
    if let Err(panic) = outcome {
        eprintln!("--- service A output ---\n{}", a.output());
        eprintln!("--- service B output ---\n{}", b.output());
        eprintln!("--- service C output ---\n{}", c.output());
        std::panic::resume_unwind(panic);
    }
}

async fn scenario(pg: &mut PostgresServer, a: &mut Service, b: &mut Service, c: &mut Service) {
    let http: HttpClient = Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(30))
        .build_http();
    a.wait_ready(&http).await;
    b.wait_ready(&http).await;
    c.wait_ready(&http).await;
    let mut requests = 3; // the last /healthz of each

    // 0. Before any product request: every metric described, every series
    // a dashboard panel queries there, at 0.
    let fresh = request(&http, Method::GET, &a.url("/metrics"), None).await;
    requests += 1;
    described_and_zero(&fresh.text);

    // 1. A cold product, 200 requests at once over both processes, while
    // the table is locked: the query that fills the cache is slow, so every
    // request arrives while it runs (a stampede, not a queue of hits).
    assert_eq!(selects_of(pg, HOT_ID), 0, "nobody asked for it yet");
    let lock = TableLock::take(pg).await;
    let sent = Arc::new(AtomicUsize::new(0));
    let cold = fire(&http, [a.url(""), b.url("")], HOT_ID, &sent);
    wait_for(Duration::from_secs(30), "all requests sent", || {
        sent.load(Ordering::SeqCst) == BURST
    })
    .await;
    wait_for(
        Duration::from_secs(30),
        "the product query blocked on the lock",
        || lock.blocked_product_queries() >= 1,
    )
    .await;
    // Time for the last requests to reach the services (only the served
    // mix below depends on it, not the assertions).
    tokio::time::sleep(Duration::from_millis(300)).await;
    let blocked = lock.blocked_product_queries();
    lock.release().await;
    let replies = collect_burst(cold).await;
    requests += replies.len();

    let first = replies[0].json();
    assert_eq!(first["id"], HOT_ID);
    assert_eq!(first["name"], format!("Product {HOT_ID}"));
    let served = served_mix(&replies, &first);
    let hot_selects = selects_of(pg, HOT_ID);
    let counted = a.product_queries(&http).await + b.product_queries(&http).await;
    requests += 2;
    assert_eq!(
        blocked, 1,
        "one product query waited for the lock while {BURST} requests were in flight"
    );
    assert_eq!(
        hot_selects, 1,
        "{BURST} concurrent requests for one cold product reached PostgreSQL \
         {hot_selects} times (served: {served:?})"
    );
    assert_eq!(
        counted, 1,
        "the services counted {counted} product queries, the database log 1"
    );
    let loaded = count_of(&served, "loaded");
    assert_eq!(loaded, 1, "one caller ran the query: {served:?}");
    let mut cold_took: Vec<Duration> = replies.iter().map(|r| r.took).collect();
    cold_took.sort();

    // The same product, now cached: 200 requests at once are all hits.
    let warm = fire(
        &http,
        [a.url(""), b.url("")],
        HOT_ID,
        &Arc::new(AtomicUsize::new(0)),
    );
    let replies = collect_burst(warm).await;
    requests += replies.len();
    let warm_served = served_mix(&replies, &first);
    // From each instance's L1, or from Redis for a caller that read before
    // its instance kept the product.
    assert_eq!(
        count_of(&warm_served, "l1_hit") + count_of(&warm_served, "hit"),
        BURST,
        "{warm_served:?}"
    );
    assert_eq!(selects_of(pg, HOT_ID), 1, "hits do not query");
    let mut took: Vec<Duration> = replies.iter().map(|r| r.took).collect();
    took.sort();

    // 2. Write through A, read through B. A loads the product; B finds it
    // in Redis (`hit`), then in its own L1 (`l1_hit`).
    let mut how = Vec::new();
    for service in [&*a, &*b, &*b] {
        let reply = request(
            &http,
            Method::GET,
            &service.url(&format!("/products/{UPDATED_ID}")),
            None,
        )
        .await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
        how.push(reply.x_cache);
        requests += 1;
    }
    assert_eq!(
        how,
        [
            Some("loaded".to_owned()),
            Some("hit".to_owned()),
            Some("l1_hit".to_owned())
        ],
        "x-cache of A's read, then B's two"
    );
    let before = request(
        &http,
        Method::GET,
        &b.url(&format!("/products/{UPDATED_ID}")),
        None,
    )
    .await;
    requests += 1;
    assert_eq!(
        before.x_cache.as_deref(),
        Some("l1_hit"),
        "B holds the product in its L1"
    );
    let renamed = format!("Renamed product {UPDATED_ID}");
    let put = request(
        &http,
        Method::PUT,
        &a.url(&format!("/products/{UPDATED_ID}")),
        Some(json!({ "name": renamed, "price_cents": 4321 })),
    )
    .await;
    requests += 1;
    let written = Instant::now();
    assert_eq!(put.status, StatusCode::OK, "{}", put.text);
    assert_eq!(put.json()["name"], renamed.as_str());
    assert_eq!(put.json()["price_cents"], 4321);

    // In A, the next read already sees it (read your invalidation).
    let in_a = request(
        &http,
        Method::GET,
        &a.url(&format!("/products/{UPDATED_ID}")),
        None,
    )
    .await;
    requests += 1;
    assert_eq!(in_a.json(), put.json(), "A reads its own write");

    // In B, within the bound (the bus carries the invalidation to B's L1).
    let seen_after = loop {
        let in_b = request(
            &http,
            Method::GET,
            &b.url(&format!("/products/{UPDATED_ID}")),
            None,
        )
        .await;
        requests += 1;
        assert_eq!(in_b.status, StatusCode::OK, "{}", in_b.text);
        if in_b.json() == put.json() {
            break written.elapsed();
        }
        assert_eq!(
            in_b.json(),
            before.json(),
            "B serves the old or the new product, nothing else"
        );
        assert!(
            written.elapsed() < PROPAGATION_BOUND,
            "B still served the old product {PROPAGATION_BOUND:?} after the write (L1 TTL {L1_TTL:?})"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    };

    // 3. A missing product: 404, then remembered.
    let missing_url = b.url(&format!("/products/{MISSING_ID}"));
    let first_miss = request(&http, Method::GET, &missing_url, None).await;
    let second_miss = request(&http, Method::GET, &missing_url, None).await;
    let third_miss = request(
        &http,
        Method::GET,
        &a.url(&format!("/products/{MISSING_ID}")),
        None,
    )
    .await;
    requests += 3;
    assert_eq!(first_miss.status, StatusCode::NOT_FOUND);
    assert_eq!(
        first_miss.json()["error"],
        format!("no product with id {MISSING_ID}")
    );
    assert_eq!(second_miss.status, StatusCode::NOT_FOUND);
    assert_eq!(second_miss.x_cache.as_deref(), Some("negative"));
    assert_eq!(third_miss.status, StatusCode::NOT_FOUND);
    assert_eq!(
        third_miss.x_cache.as_deref(),
        Some("negative"),
        "A finds B's negative entry"
    );
    assert_eq!(selects_of(pg, MISSING_ID), 1);

    // Bad input is a clear client error.
    let bad = request(
        &http,
        Method::PUT,
        &a.url(&format!("/products/{UPDATED_ID}")),
        Some(json!({ "price_cents": -5 })),
    )
    .await;
    let not_a_number = request(&http, Method::GET, &a.url("/products/abc"), None).await;
    requests += 2;
    assert_eq!(bad.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(
        bad.json()["error"],
        "`price_cents` must not be negative, got -5"
    );
    assert_eq!(not_a_number.status, StatusCode::BAD_REQUEST);

    let statements = pg.statements();
    let product_selects = statements
        .iter()
        .filter(|s| s.sql.starts_with("SELECT ") && s.sql.ends_with("FROM products WHERE id = $1"))
        .count();

    // C caches a product fresh for SHORT_TTL only, just before the outage.
    let short = request(
        &http,
        Method::GET,
        &c.url(&format!("/products/{STALE_ID}")),
        None,
    )
    .await;
    requests += 1;
    let short_written = Instant::now();
    assert_eq!(short.status, StatusCode::OK, "{}", short.text);
    assert_eq!(short.x_cache.as_deref(), Some("loaded"));

    // 4. The database goes away: cached products are still served, and
    // after 5 failed loads A's breaker refuses loads with a Retry-After.
    tokio::task::block_in_place(|| pg.stop());
    let cached = request(
        &http,
        Method::GET,
        &a.url(&format!("/products/{HOT_ID}")),
        None,
    )
    .await;
    requests += 1;
    assert_eq!(cached.status, StatusCode::OK, "{}", cached.text);
    assert_eq!(cached.json(), first);
    let mut failures = 0;
    let refused = loop {
        let id = 500 + failures;
        let reply = request(&http, Method::GET, &a.url(&format!("/products/{id}")), None).await;
        requests += 1;
        assert_eq!(
            reply.status,
            StatusCode::SERVICE_UNAVAILABLE,
            "{}",
            reply.text
        );
        if reply.retry_after.is_some() {
            break reply;
        }
        assert_eq!(reply.json()["error"], "the database is unavailable");
        failures += 1;
        assert!(failures <= 5, "the breaker opens after 5 failures");
    };
    assert_eq!(failures, 5);
    assert_eq!(refused.retry_after.as_deref(), Some("5"));
    let health = request(&http, Method::GET, &a.url("/healthz"), None).await;
    requests += 1;
    assert_eq!(health.json()["database_breaker"], "open");

    // C's product, past its TTL (+10 % jitter) but within its grace: A
    // finds it stale in Redis and, the database being down, serves it.
    let fresh_for = SHORT_TTL + SHORT_TTL / 10 + Duration::from_millis(200);
    tokio::time::sleep(fresh_for.saturating_sub(short_written.elapsed())).await;
    let stale = request(
        &http,
        Method::GET,
        &a.url(&format!("/products/{STALE_ID}")),
        None,
    )
    .await;
    requests += 1;
    assert_eq!(stale.status, StatusCode::OK, "{}", stale.text);
    assert_eq!(stale.json(), short.json(), "the product C cached");
    let stale_served = stale.x_cache.clone().unwrap_or_default();
    assert!(
        stale_served.starts_with("stale_"),
        "a product past its TTL, the database down: served {stale_served}"
    );

    // 5. What A reports after all this: /metrics and /stats.
    let scraped = request(&http, Method::GET, &a.url("/metrics"), None).await;
    let stats = request(&http, Method::GET, &a.url("/stats"), None).await;
    requests += 2;
    assert_eq!(scraped.status, StatusCode::OK);
    assert_eq!(stats.status, StatusCode::OK);
    let samples = Samples::parse(&scraped.text);
    let requests_by =
        |served: &str| samples.sum("breakwater_requests_total", &[("served", served)]);
    assert!(requests_by("loaded") >= 1.0, "A loaded products");
    assert!(requests_by("negative") >= 1.0, "A found B's negative entry");
    assert_eq!(
        requests_by(&stale_served),
        1.0,
        "the stale read, by its reason"
    );
    assert!(
        requests_by("error") >= 6.0,
        "5 failed loads and a refusal are served=error"
    );
    assert_eq!(
        samples.sum("breakwater_errors_total", &[("kind", "loader")]),
        5.0
    );
    assert!(samples.sum("breakwater_errors_total", &[("kind", "circuit_open")]) >= 1.0);
    assert!(samples.sum("breakwater_loads_total", &[("outcome", "error")]) >= 5.0);
    assert_eq!(
        samples.sum(
            "breakwater_breaker_state",
            &[("breaker", "origin"), ("name", "postgres")]
        ),
        2.0,
        "the database breaker's gauge says open"
    );
    assert!(
        samples.sum(
            "breakwater_breaker_transitions_total",
            &[("breaker", "origin"), ("to", "open")]
        ) >= 1.0
    );
    assert!(
        samples.sum("breakwater_load_seconds_count", &[("origin", "postgres")]) >= 1.0,
        "load durations are recorded"
    );
    assert!(
        samples.sum(
            "breakwater_load_seconds_bucket",
            &[("origin", "postgres"), ("le", "+Inf")]
        ) >= 1.0,
        "as a histogram with buckets (the dashboard's queries read them)"
    );
    for op in ["get", "fenced_set"] {
        assert!(
            samples.sum("breakwater_store_seconds_count", &[("op", op)]) >= 1.0,
            "store latency of {op}"
        );
    }
    assert!(
        samples.sum("breakwater_notices_total", &[("event", "sent")]) >= 1.0,
        "A's writes and its invalidation were announced"
    );
    assert_eq!(
        samples.sum("breakwater_loads_in_flight", &[("origin", "postgres")]),
        0.0
    );
    assert!(
        stats.text.contains("breakers: origin open"),
        "/stats: {}",
        stats.text
    );
    let excerpt: Vec<&str> = scraped
        .text
        .lines()
        .filter(|l| {
            l.starts_with("breakwater_") && !l.starts_with("breakwater_store_seconds_bucket")
        })
        .collect();
    eprintln!(
        "e2e: {requests} HTTP requests; {product_selects} product SELECTs reached PostgreSQL \
         ({} statements in all, schema and seed included)",
        statements.len()
    );
    eprintln!(
        "e2e: {BURST} concurrent GETs of one cold product over 2 processes, its query held \
         up by a table lock: 1 SQL query; served {served:?}; latency p50 {:?}, p99 {:?}, \
         max {:?} (the lock's hold included)",
        percentile(&cold_took, 50.0),
        percentile(&cold_took, 99.0),
        cold_took[cold_took.len() - 1]
    );
    eprintln!(
        "e2e: {BURST} concurrent GETs of the cached product: 0 SQL queries; served \
         {warm_served:?}; latency p50 {:?}, p99 {:?}, max {:?}",
        percentile(&took, 50.0),
        percentile(&took, 99.0),
        took[took.len() - 1]
    );
    eprintln!(
        "e2e: a PUT through A was seen through B after {seen_after:?} (bound {PROPAGATION_BOUND:?}, L1 TTL {L1_TTL:?})"
    );
    eprintln!(
        "e2e: PostgreSQL stopped: cached product still served; {failures} failed loads, then 503 \
         with Retry-After: 5 (breaker open); a product past its TTL served {stale_served}"
    );
    eprintln!(
        "e2e: A's /metrics after the outage, breakwater_* lines ({} breakwater_store_seconds_bucket \
         lines left out):\n{}",
        scraped
            .text
            .lines()
            .filter(|l| l.starts_with("breakwater_store_seconds_bucket"))
            .count(),
        excerpt.join("\n")
    );
    eprintln!("e2e: A's /stats:\n{}", stats.text.trim_end());
}

/// The metric names of the table in the library's `metrics` module docs
/// (the dashboard queries only these: `tests/dashboard.rs`).
fn documented_metrics() -> Vec<String> {
    let file = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../crates/breakwater-cache/src/metrics.rs");
    let source =
        std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    let names: Vec<String> = source
        .lines()
        .filter_map(|line| line.strip_prefix("//! | `breakwater_"))
        .map(|row| format!("breakwater_{}", &row[..row.find('`').expect("a name")]))
        .collect();
    assert!(names.len() >= 19, "the metrics table was not found");
    names
}

/// A `/metrics` page of a service that served nothing yet: a `# HELP` and
/// a `# TYPE` line for every breakwater metric, at least one series of
/// each, every one at 0 (histograms: no sample yet), no empty label value.
fn described_and_zero(text: &str) {
    let samples = Samples::parse(text);
    for name in documented_metrics() {
        for line in ["# HELP", "# TYPE"] {
            assert!(
                text.lines()
                    .any(|l| l.starts_with(&format!("{line} {name} "))),
                "no `{line} {name}` line in /metrics at start-up:\n{text}"
            );
        }
        let series: Vec<&Sample> = samples
            .0
            .iter()
            .filter(|(n, ..)| {
                n == &name
                    || n.strip_prefix(name.as_str())
                        .is_some_and(|rest| ["_bucket", "_sum", "_count"].contains(&rest))
            })
            .collect();
        assert!(!series.is_empty(), "no {name} series at start-up:\n{text}");
        for (n, labels, value) in series {
            // The startup check (on by default) subscribes the bus, whose
            // listener reads the namespace's clear record: a store `get`
            // may have been timed already.
            let check_read = n.starts_with("breakwater_store_seconds")
                && labels.iter().any(|(k, v)| k == "op" && v == "get");
            if !n.ends_with("_bucket") && !check_read {
                assert_eq!(*value, 0.0, "{n}{labels:?} at start-up");
            }
            assert!(
                labels.iter().all(|(_, v)| !v.is_empty()),
                "{n}{labels:?}: an empty label value"
            );
        }
    }
    eprintln!(
        "e2e: A's /metrics at start-up: {} breakwater series, every one described and at 0",
        samples
            .0
            .iter()
            .filter(|(n, ..)| n.starts_with("breakwater_"))
            .count()
    );
}

/// One line of a Prometheus text exposition: name, labels, value.
type Sample = (String, Vec<(String, String)>, f64);

/// The samples of a Prometheus text exposition.
struct Samples(Vec<Sample>);

impl Samples {
    fn parse(text: &str) -> Samples {
        let samples = text
            .lines()
            .filter(|line| !line.starts_with('#') && !line.trim().is_empty())
            .map(|line| {
                let (series, value) = line.rsplit_once(' ').expect("a sample line");
                let value: f64 = value.parse().unwrap_or_else(|_| panic!("{line}"));
                let (name, labels) = match series.split_once('{') {
                    Some((name, labels)) => (name, labels.trim_end_matches('}')),
                    None => (series, ""),
                };
                let labels = labels
                    .split("\",")
                    .filter(|pair| !pair.is_empty())
                    .map(|pair| {
                        let (k, v) = pair.split_once("=\"").unwrap_or_else(|| panic!("{line}"));
                        (k.to_owned(), v.trim_end_matches('"').to_owned())
                    })
                    .collect();
                (name.to_owned(), labels, value)
            })
            .collect();
        Samples(samples)
    }

    /// The sum of `name`'s samples whose labels include `labels`; panics if
    /// there is none.
    fn sum(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        let matching: Vec<f64> = self
            .0
            .iter()
            .filter(|(n, have, _)| {
                n == name
                    && labels
                        .iter()
                        .all(|(k, v)| have.iter().any(|(hk, hv)| hk == k && hv == v))
            })
            .map(|(_, _, value)| *value)
            .collect();
        assert!(
            !matching.is_empty(),
            "no {name} with {labels:?} in /metrics"
        );
        matching.iter().sum()
    }
}
