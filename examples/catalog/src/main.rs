//! `catalog`: a small product-catalog service, and a worked example of
//! breakwater in front of PostgreSQL.
//!
//! Products live in PostgreSQL; `GET /products/{id}` reads them through a
//! breakwater [`Cache`](breakwater_cache::Cache) in Redis (with an in-process L1,
//! grace, fail-safe and a breaker on the database), `PUT /products/{id}`
//! writes the row and invalidates the cached product, `GET /metrics` serves
//! Prometheus text (`dashboards/breakwater.json` charts it), `GET /stats`
//! the product cache's counts as text, `GET /healthz` says it is up. Start several instances
//! against one database and one Redis: a product nobody has cached is
//! queried once, however many requests for it arrive at once on however
//! many instances.
//!
//! ```sh
//! DATABASE_URL=postgres://postgres:secret@127.0.0.1:5432/postgres \
//! REDIS_URL=redis://127.0.0.1:6379/ \
//! cargo run -p breakwater-cache-example-catalog
//! ```
//!
//! Settings come from the environment (see `config.rs`); logs go to stderr,
//! filtered by `RUST_LOG` (default `info`). `docs/guide.md` walks through
//! the code.

mod api;
mod config;
mod db;

use std::fmt;
use std::io::IsTerminal;
use std::process::ExitCode;
use std::time::Duration;

use breakwater_cache::{RedisStore, RedisStoreConfig};
use metrics_exporter_prometheus::PrometheusBuilder;
use tracing_subscriber::EnvFilter;

use crate::api::AppState;
use crate::config::{Config, ConfigError};
use crate::db::{Db, DbError};

/// Histogram buckets for request and load durations, in seconds.
const BUCKETS: [f64; 12] = [
    0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
];

/// How often the metrics recorder drains its histograms.
const METRICS_UPKEEP: Duration = Duration::from_secs(5);

/// Why the service could not start.
#[derive(Debug)]
enum StartError {
    /// A setting is missing or wrong.
    Config(ConfigError),
    /// PostgreSQL could not be prepared.
    Database(DbError),
    /// A cache or origin setting was refused.
    Cache(breakwater_cache::ConfigError),
    /// The Prometheus recorder could not be installed.
    Metrics(String),
    /// The listener could not be opened, or serving failed.
    Serve(std::net::SocketAddr, std::io::Error),
}

impl fmt::Display for StartError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StartError::Config(e) => write!(f, "{e}"),
            StartError::Database(e) => write!(
                f,
                "{e} (is PostgreSQL running at DATABASE_URL, and may this user create tables?)"
            ),
            StartError::Cache(e) => write!(f, "cache settings: {e}"),
            StartError::Metrics(e) => write!(f, "metrics: {e}"),
            StartError::Serve(addr, e) => write!(f, "cannot serve on {addr}: {e}"),
        }
    }
}

impl std::error::Error for StartError {}

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    match run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            tracing::error!("cannot start: {err}");
            ExitCode::FAILURE
        }
    }
}

async fn run() -> Result<(), StartError> {
    let config = Config::from_env().map_err(StartError::Config)?;
    tracing::info!(
        database = %config.database_target(),
        redis = %config.redis_target(),
        bind = %config.bind,
        "starting"
    );

    // The recorder first: breakwater's metrics go wherever it is installed.
    let metrics = PrometheusBuilder::new()
        .set_buckets(&BUCKETS)
        .and_then(PrometheusBuilder::install_recorder)
        .map_err(|e| StartError::Metrics(e.to_string()))?;
    let upkeep = metrics.clone();
    tokio::spawn(async move {
        let mut every = tokio::time::interval(METRICS_UPKEEP);
        loop {
            every.tick().await;
            upkeep.run_upkeep();
        }
    });

    let db = Db::new(config.database.clone(), config.pool_size).map_err(StartError::Database)?;
    let seeded = db.prepare().await.map_err(StartError::Database)?;
    if seeded > 0 {
        tracing::info!(rows = seeded, "seeded an empty products table");
    }

    let store = RedisStore::connect_with(
        &config.redis_url,
        RedisStoreConfig::default()
            .response_timeout(config.redis_read_timeout)
            .write_timeout(config.redis_write_timeout),
    )
    .map_err(|e| {
        StartError::Config(ConfigError::Invalid {
            var: "REDIS_URL",
            reason: e.to_string(),
        })
    })?;
    // Redis being down is no reason not to start: the cache loads straight
    // from PostgreSQL (bounded by the origin's limits) until it is back.
    if let Err(err) = store.warm_up().await {
        tracing::warn!(error = %err, "Redis is not reachable yet; serving from PostgreSQL until it is");
    }
    let origin = api::origin(config.pool_size).map_err(StartError::Cache)?;
    let products =
        api::product_cache(store, origin.clone(), config.product_ttl).map_err(StartError::Cache)?;

    let app = api::router(AppState {
        db,
        products,
        metrics,
        origin,
    });
    let listener = tokio::net::TcpListener::bind(config.bind)
        .await
        .map_err(|e| StartError::Serve(config.bind, e))?;
    let local = listener.local_addr().unwrap_or(config.bind);
    tracing::info!(addr = %local, "listening");
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown())
        .await
        .map_err(|e| StartError::Serve(local, e))?;
    tracing::info!("stopped");
    Ok(())
}

/// Resolves on Ctrl-C or `SIGTERM`; in-flight requests then finish.
async fn shutdown() {
    let interrupt = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        () = interrupt => {},
        () = terminate => {},
    }
    tracing::info!("shutting down");
}
