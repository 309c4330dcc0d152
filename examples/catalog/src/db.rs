//! The products table in PostgreSQL: schema, seed data, and the two
//! queries the service makes.
//!
//! Every query that reaches the database is counted in
//! `catalog_sql_queries_total{query}`, so `/metrics` shows what the cache
//! saved next to `breakwater_requests_total`.

use std::fmt;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use serde::{Deserialize, Serialize};
use tokio_postgres::NoTls;

/// Rows written into an empty table at start-up.
pub(crate) const SEED_ROWS: i64 = 10_000;

/// How long a request waits for a pooled connection, and a new connection
/// may take to open.
const POOL_WAIT: Duration = Duration::from_secs(2);

/// Serializes start-up schema work between instances starting together
/// (`CREATE TABLE IF NOT EXISTS` alone races on the catalog).
const SCHEMA_LOCK: i64 = 0x0063_6174_616c_6f67; // "catalog" in ASCII

const CREATE_TABLE: &str = "CREATE TABLE IF NOT EXISTS products (\
     id bigint PRIMARY KEY, \
     name text NOT NULL, \
     price_cents bigint NOT NULL, \
     updated_at timestamptz NOT NULL DEFAULT now())";

const SEED: &str = "INSERT INTO products (id, name, price_cents, updated_at) \
     SELECT g, 'Product ' || g, 100 + (g * 7919) % 100000, now() \
     FROM generate_series(1, $1::bigint) AS g";

/// The columns of a product, `updated_at` as RFC 3339 in UTC.
macro_rules! columns {
    () => {
        "id, name, price_cents, \
         to_char(updated_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"')"
    };
}

/// One product by id: the query the cache saves.
pub(crate) const PRODUCT_BY_ID: &str =
    concat!("SELECT ", columns!(), " FROM products WHERE id = $1");

const UPDATE_PRODUCT: &str = concat!(
    "UPDATE products SET name = coalesce($2, name), ",
    "price_cents = coalesce($3, price_cents), updated_at = now() ",
    "WHERE id = $1 RETURNING ",
    columns!()
);

/// A product as the API returns it and the cache stores it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Product {
    /// The primary key.
    pub(crate) id: i64,
    /// What it is called.
    pub(crate) name: String,
    /// Its price in cents.
    pub(crate) price_cents: i64,
    /// When it last changed, RFC 3339 in UTC.
    pub(crate) updated_at: String,
}

/// A change to a product: the fields given are set, the others kept.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ProductChange {
    /// The new name.
    pub(crate) name: Option<String>,
    /// The new price in cents.
    pub(crate) price_cents: Option<i64>,
}

/// A database operation that failed: what was being done, and why.
#[derive(Debug)]
pub(crate) struct DbError {
    doing: &'static str,
    source: Box<dyn std::error::Error + Send + Sync>,
}

impl DbError {
    fn new(
        doing: &'static str,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        DbError {
            doing,
            source: source.into(),
        }
    }
}

impl fmt::Display for DbError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PostgreSQL: {}: {}", self.doing, self.source)
    }
}

impl std::error::Error for DbError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.source)
    }
}

/// The connection pool; cheap to clone.
#[derive(Clone)]
pub(crate) struct Db {
    pool: Pool,
}

impl Db {
    /// A pool of at most `size` connections to `config` (opened on demand).
    pub(crate) fn new(config: tokio_postgres::Config, size: usize) -> Result<Db, DbError> {
        let manager = Manager::from_config(
            config,
            NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(size)
            .runtime(Runtime::Tokio1)
            .wait_timeout(Some(POOL_WAIT))
            .create_timeout(Some(POOL_WAIT))
            .recycle_timeout(Some(POOL_WAIT))
            .build()
            .map_err(|e| DbError::new("building the connection pool", e))?;
        Ok(Db { pool })
    }

    /// Creates the table if it is missing and seeds [`SEED_ROWS`] products
    /// into an empty one; returns how many rows were seeded. Safe when
    /// several instances start at once (one takes a lock, the others wait
    /// and find the work done).
    pub(crate) async fn prepare(&self) -> Result<u64, DbError> {
        let mut client = self.client("connecting").await?;
        let tx = client
            .transaction()
            .await
            .map_err(|e| DbError::new("starting the schema transaction", e))?;
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&SCHEMA_LOCK])
            .await
            .map_err(|e| DbError::new("taking the schema lock", e))?;
        tx.batch_execute(CREATE_TABLE)
            .await
            .map_err(|e| DbError::new("creating table products", e))?;
        let empty = tx
            .query_opt("SELECT 1 FROM products LIMIT 1", &[])
            .await
            .map_err(|e| DbError::new("looking for products", e))?
            .is_none();
        let seeded = if empty {
            tx.execute(SEED, &[&SEED_ROWS])
                .await
                .map_err(|e| DbError::new("seeding products", e))?
        } else {
            0
        };
        tx.commit()
            .await
            .map_err(|e| DbError::new("committing the schema", e))?;
        Ok(seeded)
    }

    /// The product with `id`, or `None`.
    pub(crate) async fn product(&self, id: i64) -> Result<Option<Product>, DbError> {
        let client = self.client("loading a product").await?;
        let statement = client
            .prepare_cached(PRODUCT_BY_ID)
            .await
            .map_err(|e| DbError::new("preparing the product query", e))?;
        metrics::counter!("catalog_sql_queries_total", "query" => "product_by_id").increment(1);
        let row = client
            .query_opt(&statement, &[&id])
            .await
            .map_err(|e| DbError::new("loading a product", e))?;
        Ok(row.map(|row| product(&row)))
    }

    /// Applies `change` to the product with `id` and returns the new row,
    /// or `None` if there is no such product.
    pub(crate) async fn update(
        &self,
        id: i64,
        change: &ProductChange,
    ) -> Result<Option<Product>, DbError> {
        let client = self.client("updating a product").await?;
        let statement = client
            .prepare_cached(UPDATE_PRODUCT)
            .await
            .map_err(|e| DbError::new("preparing the update", e))?;
        metrics::counter!("catalog_sql_queries_total", "query" => "update_product").increment(1);
        let row = client
            .query_opt(&statement, &[&id, &change.name, &change.price_cents])
            .await
            .map_err(|e| DbError::new("updating a product", e))?;
        Ok(row.map(|row| product(&row)))
    }

    async fn client(&self, doing: &'static str) -> Result<deadpool_postgres::Client, DbError> {
        self.pool.get().await.map_err(|e| DbError::new(doing, e))
    }
}

fn product(row: &tokio_postgres::Row) -> Product {
    Product {
        id: row.get(0),
        name: row.get(1),
        price_cents: row.get(2),
        updated_at: row.get(3),
    }
}
