//! The HTTP API: routes, the product cache, and how its outcomes become
//! responses.
//!
//! | route | what |
//! |---|---|
//! | `GET /products/{id}` | the product, through the cache; `x-cache` says how it was served |
//! | `PUT /products/{id}` | changes `name` and/or `price_cents`, then invalidates the cached product |
//! | `GET /metrics` | Prometheus text: breakwater's metrics, SQL queries, HTTP requests |
//! | `GET /stats` | the product cache's [`Cache::stats`](breakwater_cache::Cache::stats) in this process, as text: hits by tier, stale by reason, loads, errors, breakers |
//! | `GET /healthz` | `ok`, with the database and Redis breakers' states |

use std::time::Duration;

use axum::extract::{MatchedPath, Path, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use breakwater_cache::{
    BreakerConfig, Cache, ConfigError, Error, Fetched, Jitter, L1Config, LimitConfig, Origin,
    RedisStore, Served,
};
use metrics_exporter_prometheus::PrometheusHandle;
use serde_json::json;
use tokio::time::Instant;

use crate::db::{Db, Product, ProductChange};

/// How long the database breaker stays open once tripped; also the
/// `Retry-After` of a refused request.
pub(crate) const BREAKER_COOL_DOWN: Duration = Duration::from_secs(5);

/// The longest product name accepted, in characters.
const MAX_NAME: usize = 200;

/// What every handler shares; cheap to clone.
#[derive(Clone)]
pub(crate) struct AppState {
    /// The products' home.
    pub(crate) db: Db,
    /// Products by id, in Redis (and a small in-process L1).
    pub(crate) products: Cache<Product>,
    /// Renders `/metrics`.
    pub(crate) metrics: PrometheusHandle,
    /// PostgreSQL's breaker and load cap, shared by every cache over it.
    pub(crate) origin: Origin,
}

/// The database as an origin: its breaker opens after 5 failed loads in a
/// row and refuses loads for [`BREAKER_COOL_DOWN`]; at most `pool_size`
/// loads run at once (one per connection), later ones wait up to 1 s.
pub(crate) fn origin(pool_size: usize) -> Result<Origin, ConfigError> {
    Origin::builder("postgres")
        .breaker(
            BreakerConfig::new()
                .consecutive_failures(5)
                .cool_down(BREAKER_COOL_DOWN),
        )
        .limit(
            LimitConfig::new()
                .max_concurrent(u32::try_from(pool_size).unwrap_or(u32::MAX))
                .queue_wait(Duration::from_secs(1)),
        )
        .build()
}

/// The product cache: fresh for `ttl` ±10 % (5 min by default,
/// `PRODUCT_TTL_SECS`), a missing id remembered for 30 s, a stale product
/// served for up to 60 s while one refresh runs (grace), and for up to an
/// hour while the database is failing (fail-safe), a 5 s in-process L1 kept
/// in step across instances by Redis pub/sub.
pub(crate) fn product_cache(
    store: RedisStore,
    origin: Origin,
    ttl: Duration,
) -> Result<Cache<Product>, ConfigError> {
    Cache::builder()
        .namespace("catalog:products:v1")
        .store(store)
        .ttl(ttl)
        .jitter(Jitter::ratio(0.1))
        .negative_ttl(Duration::from_secs(30))
        .grace(Duration::from_secs(60))
        .max_stale(Duration::from_secs(3600))
        .l1(L1Config::new().entries(10_000).ttl(Duration::from_secs(5)))
        .load_timeout(Duration::from_secs(5))
        .origin(origin)
        .build()
}

/// The cache key of a product.
fn product_key(id: i64) -> String {
    format!("product:{id}")
}

/// The service's routes, with request metrics.
pub(crate) fn router(state: AppState) -> Router {
    Router::new()
        .route("/products/{id}", get(get_product).put(put_product))
        .route("/metrics", get(metrics))
        .route("/stats", get(stats))
        .route("/healthz", get(healthz))
        .route_layer(middleware::from_fn(track))
        .with_state(state)
}

/// `GET /products/{id}`: one `get_or_load`. Concurrent requests for a
/// product that is not cached share one query, across instances too.
async fn get_product(State(state): State<AppState>, Path(id): Path<i64>) -> Response {
    let db = state.db.clone();
    let loader = move || {
        let db = db.clone();
        async move { db.product(id).await }
    };
    match state
        .products
        .get_or_load_with_meta(product_key(id), loader)
        .await
    {
        Ok(Fetched {
            value: Some(product),
            served,
        }) => with_cache_header(Json(product).into_response(), served),
        Ok(Fetched {
            value: None,
            served,
        }) => with_cache_header(not_found(id), served),
        Err(err) => load_failed(&err),
    }
}

/// `PUT /products/{id}`: update the row, then invalidate the cached
/// product, so that no instance serves the old one from the cache (other
/// instances' L1 copies are dropped when the invalidation reaches them).
async fn put_product(
    State(state): State<AppState>,
    Path(id): Path<i64>,
    Json(change): Json<ProductChange>,
) -> Response {
    if let Err(problem) = validate(&change) {
        return error(StatusCode::UNPROCESSABLE_ENTITY, &problem);
    }
    let product = match state.db.update(id, &change).await {
        Ok(Some(product)) => product,
        Ok(None) => return not_found(id),
        Err(err) => {
            tracing::warn!(id, error = %err, "update failed");
            return error(
                StatusCode::SERVICE_UNAVAILABLE,
                "the database is unavailable; retry later",
            );
        }
    };
    if let Err(err) = state.products.invalidate(product_key(id)).await {
        // The row changed but the cache did not hear of it: say so, so the
        // client retries (a PUT is idempotent) instead of trusting reads.
        tracing::error!(id, error = %err, "updated, but the cache invalidation was not delivered");
        return error(
            StatusCode::SERVICE_UNAVAILABLE,
            "the product was updated, but the cache could not be invalidated, so reads may \
             return the old product until it expires (5 minutes by default); retry the PUT",
        );
    }
    tracing::info!(id, "product updated and invalidated");
    Json(product).into_response()
}

/// `GET /metrics`: the Prometheus text format.
async fn metrics(State(state): State<AppState>) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        state.metrics.render(),
    )
        .into_response()
}

/// `GET /stats`: the product cache's counts in this process since it
/// started, as `Stats` prints them (for a look without a metrics stack).
async fn stats(State(state): State<AppState>) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        format!("{}\n", state.products.stats()),
    )
        .into_response()
}

/// `GET /healthz`: the process serves; the breakers say how its
/// dependencies are doing (`closed` is healthy). Touches neither.
async fn healthz(State(state): State<AppState>) -> Response {
    Json(json!({
        "status": "ok",
        "database_breaker": state.origin.breaker_state().to_string(),
        "redis_breaker": state.products.store_breaker_state().to_string(),
    }))
    .into_response()
}

/// Counts every request by route, method and status, and times it.
async fn track(request: Request, next: Next) -> Response {
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_owned(), |p| p.as_str().to_owned());
    let method = request.method().to_string();
    let started = Instant::now();
    let response = next.run(request).await;
    let status = response.status().as_u16().to_string();
    metrics::histogram!("catalog_http_request_duration_seconds", "route" => route.clone())
        .record(started.elapsed().as_secs_f64());
    metrics::counter!(
        "catalog_http_requests_total",
        "route" => route,
        "method" => method,
        "status" => status,
    )
    .increment(1);
    response
}

fn validate(change: &ProductChange) -> Result<(), String> {
    if change.name.is_none() && change.price_cents.is_none() {
        return Err("nothing to change: give `name` and/or `price_cents`".into());
    }
    if let Some(name) = &change.name {
        let chars = name.chars().count();
        if name.trim().is_empty() || chars > MAX_NAME {
            return Err(format!(
                "`name` must have 1..={MAX_NAME} characters and not be blank, got {chars}"
            ));
        }
    }
    if let Some(price) = change.price_cents
        && price < 0
    {
        return Err(format!("`price_cents` must not be negative, got {price}"));
    }
    Ok(())
}

/// A load that failed with nothing (stale or fallback) to stand in.
fn load_failed(err: &Error) -> Response {
    if err.is_circuit_open() {
        let mut response = error(
            StatusCode::SERVICE_UNAVAILABLE,
            "the database is failing; requests are refused for a few seconds",
        );
        response.headers_mut().insert(
            header::RETRY_AFTER,
            HeaderValue::from(BREAKER_COOL_DOWN.as_secs()),
        );
        return response;
    }
    if err.is_overloaded() {
        let mut response = error(StatusCode::SERVICE_UNAVAILABLE, "too many loads at once");
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        return response;
    }
    tracing::warn!(error = %err, "product load failed");
    if err.is_timeout() || err.is_lock_timeout() {
        return error(
            StatusCode::GATEWAY_TIMEOUT,
            "the database did not answer in time",
        );
    }
    if err.is_loader() {
        return error(
            StatusCode::SERVICE_UNAVAILABLE,
            "the database is unavailable",
        );
    }
    error(StatusCode::INTERNAL_SERVER_ERROR, "internal error")
}

fn not_found(id: i64) -> Response {
    error(StatusCode::NOT_FOUND, &format!("no product with id {id}"))
}

fn error(status: StatusCode, message: &str) -> Response {
    (status, Json(json!({ "error": message }))).into_response()
}

fn with_cache_header(mut response: Response, served: Served) -> Response {
    // The same words as breakwater's `served` metric label.
    response
        .headers_mut()
        .insert("x-cache", HeaderValue::from_static(served.as_str()));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn changes_are_validated_with_exact_messages() {
        let change = |name: Option<&str>, price: Option<i64>| ProductChange {
            name: name.map(str::to_owned),
            price_cents: price,
        };
        assert_eq!(
            validate(&change(None, None)).unwrap_err(),
            "nothing to change: give `name` and/or `price_cents`"
        );
        assert_eq!(
            validate(&change(Some("  "), None)).unwrap_err(),
            "`name` must have 1..=200 characters and not be blank, got 2"
        );
        assert!(validate(&change(Some(&"x".repeat(201)), None)).is_err());
        assert_eq!(
            validate(&change(None, Some(-1))).unwrap_err(),
            "`price_cents` must not be negative, got -1"
        );
        assert!(validate(&change(Some("Espresso"), Some(0))).is_ok());
    }

    #[test]
    fn cache_and_origin_settings_build() {
        let origin = origin(16).unwrap();
        let store = RedisStore::connect("redis://127.0.0.1:1/").unwrap();
        assert!(product_cache(store.clone(), origin.clone(), Duration::from_secs(300)).is_ok());
        // The shortest PRODUCT_TTL_SECS (the end-to-end test's third process).
        assert!(product_cache(store, origin, Duration::from_secs(1)).is_ok());
    }
}
