//! The database stand-in of `demo`, `simulate` and `warm`, on tokio's clock.
//!
//! A query takes a base latency while at most `capacity` queries run at
//! once; past that the database slows down in proportion (twice the
//! capacity running, twice the latency), as a real one does when its
//! connections and CPU are shared by too many queries. During an outage
//! every query fails at once. It records when each query started, how many
//! failed and the most that ran at once.
//!
//! Its data has an epoch: [`change`](Database::change) moves it on (the
//! data changed, say a migration), and a query answers the epoch it began
//! in. [`settle`](Database::settle) marks an epoch every answer must be at
//! least from then on (the cache was cleared), so a request can tell it
//! was served a value from before.

use std::fmt;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::time::Instant;

/// A database whose queries take `latency` (on tokio's clock), longer when
/// over capacity, and which can be down for a while.
#[derive(Debug)]
pub(crate) struct Database {
    latency: Duration,
    /// Queries served at `latency`; `None`: unlimited.
    capacity: Option<usize>,
    /// Down in `[start, end)` after `began`.
    outage: Option<(Duration, Duration)>,
    /// Query start times are milliseconds after this.
    began: Instant,
    running: AtomicUsize,
    peak: AtomicUsize,
    failed: AtomicUsize,
    started_ms: Mutex<Vec<u64>>,
    /// The data's epoch.
    epoch: AtomicU64,
    /// Answers older than this are outdated.
    floor: AtomicU64,
}

/// A query made while the database was down.
#[derive(Debug)]
pub(crate) struct Down;

impl fmt::Display for Down {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the database is down")
    }
}

impl std::error::Error for Down {}

impl Database {
    /// A database with no capacity limit and no outage that starts counting
    /// now.
    pub(crate) fn new(latency: Duration) -> Self {
        Database {
            latency,
            capacity: None,
            outage: None,
            began: Instant::now(),
            running: AtomicUsize::new(0),
            peak: AtomicUsize::new(0),
            failed: AtomicUsize::new(0),
            started_ms: Mutex::default(),
            epoch: AtomicU64::new(0),
            floor: AtomicU64::new(0),
        }
    }

    /// Serves `capacity` queries at once at the base latency; each query
    /// started with `n` running takes `latency × n / capacity` when `n` is
    /// above it.
    pub(crate) fn with_capacity(mut self, capacity: usize) -> Self {
        self.capacity = Some(capacity.max(1));
        self
    }

    /// Down from `start` for `length` after [`new`](Self::new): every query
    /// fails at once.
    pub(crate) fn with_outage(mut self, start: Duration, length: Duration) -> Self {
        self.outage = Some((start, start + length));
        self
    }

    /// One query: takes the latency (longer over capacity) and answers the
    /// data's epoch when it began, or fails at once during an outage.
    pub(crate) async fn query(&self) -> Result<u64, Down> {
        let epoch = self.epoch.load(Ordering::SeqCst);
        let elapsed = self.began.elapsed();
        let at = u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX);
        self.started().push(at);
        if self
            .outage
            .is_some_and(|(start, end)| (start..end).contains(&elapsed))
        {
            self.failed.fetch_add(1, Ordering::SeqCst);
            return Err(Down);
        }
        let running = self.running.fetch_add(1, Ordering::SeqCst) + 1;
        self.peak.fetch_max(running, Ordering::SeqCst);
        tokio::time::sleep(self.latency_at(running)).await;
        self.running.fetch_sub(1, Ordering::SeqCst);
        Ok(epoch)
    }

    /// The data changes: queries from now on answer the next epoch, which
    /// this returns.
    pub(crate) fn change(&self) -> u64 {
        self.epoch.fetch_add(1, Ordering::SeqCst) + 1
    }

    /// From now on, a value from an epoch before `epoch` is outdated.
    pub(crate) fn settle(&self, epoch: u64) {
        self.floor.fetch_max(epoch, Ordering::SeqCst);
    }

    /// The oldest epoch a value served now may be from.
    pub(crate) fn floor(&self) -> u64 {
        self.floor.load(Ordering::SeqCst)
    }

    /// How long a query started with `running` queries running takes.
    fn latency_at(&self, running: usize) -> Duration {
        match self.capacity {
            Some(capacity) if running > capacity => {
                self.latency.mul_f64(running as f64 / capacity as f64)
            }
            _ => self.latency,
        }
    }

    /// The most queries that ran at once.
    pub(crate) fn peak(&self) -> usize {
        self.peak.load(Ordering::SeqCst)
    }

    /// Queries that failed because the database was down.
    pub(crate) fn failed(&self) -> usize {
        self.failed.load(Ordering::SeqCst)
    }

    /// When each query started (failed ones too), in ms after
    /// [`new`](Self::new).
    pub(crate) fn started_ms(&self) -> Vec<u64> {
        self.started().clone()
    }

    fn started(&self) -> std::sync::MutexGuard<'_, Vec<u64>> {
        self.started_ms.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// `started_ms` as queries started in each whole second `0..seconds`
/// (later ones are left out).
pub(crate) fn per_second(started_ms: &[u64], seconds: usize) -> Vec<usize> {
    let mut counts = vec![0; seconds];
    for &ms in started_ms {
        if let Some(slot) = usize::try_from(ms / 1000)
            .ok()
            .and_then(|s| counts.get_mut(s))
        {
            *slot += 1;
        }
    }
    counts
}

/// `started_ms` grouped into bursts (a refresh each, for one key): runs of
/// queries with no gap of more than a second between them.
pub(crate) fn bursts(started_ms: &[u64]) -> usize {
    let mut sorted = started_ms.to_vec();
    sorted.sort_unstable();
    let gaps = sorted.windows(2).filter(|w| w[1] - w[0] > 1_000).count();
    if sorted.is_empty() { 0 } else { gaps + 1 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn counts_queries_and_the_most_at_once() {
        let db = Database::new(Duration::from_millis(10));
        let (a, b, c) = tokio::join!(db.query(), db.query(), db.query());
        assert!(a.is_ok() && b.is_ok() && c.is_ok());
        tokio::time::sleep(Duration::from_millis(5)).await;
        db.query().await.unwrap();
        assert_eq!(db.peak(), 3);
        assert_eq!(db.started_ms(), vec![0, 0, 0, 15]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_query_answers_the_epoch_it_began_in() {
        let db = Database::new(Duration::from_millis(10));
        let (before, changed) = tokio::join!(db.query(), async { db.change() });
        assert_eq!((before.unwrap(), changed), (0, 1));
        assert_eq!(db.query().await.unwrap(), 1);
        assert_eq!(db.floor(), 0);
        db.settle(1);
        db.settle(0);
        assert_eq!(db.floor(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn over_capacity_a_query_takes_longer() {
        let db = Database::new(Duration::from_millis(100)).with_capacity(2);
        let start = Instant::now();
        let queries: Vec<_> = (0..4).map(|_| db.query()).collect();
        futures_join(queries).await;
        // The 3rd ran with 3 at once (150 ms), the 4th with 4 (200 ms).
        assert_eq!(start.elapsed(), Duration::from_millis(200));
        assert_eq!(db.peak(), 4);
    }

    #[tokio::test(start_paused = true)]
    async fn fails_at_once_during_an_outage() {
        let db = Database::new(Duration::from_millis(10))
            .with_outage(Duration::from_secs(1), Duration::from_secs(2));
        db.query().await.unwrap();
        tokio::time::sleep(Duration::from_secs(1)).await;
        let start = Instant::now();
        assert!(db.query().await.is_err());
        assert_eq!(start.elapsed(), Duration::ZERO);
        tokio::time::sleep(Duration::from_secs(2)).await;
        db.query().await.unwrap();
        assert_eq!(db.failed(), 1);
        assert_eq!(db.started_ms().len(), 3);
    }

    #[test]
    fn per_second_buckets() {
        assert_eq!(per_second(&[0, 999, 1000, 2500, 9000], 3), vec![2, 1, 1]);
    }

    #[test]
    fn bursts_are_split_by_a_quiet_second() {
        assert_eq!(bursts(&[]), 0);
        assert_eq!(bursts(&[10_000, 0, 500, 1_400, 10_900]), 2);
    }

    /// Runs the futures concurrently on this task.
    async fn futures_join<F: std::future::Future>(futures: Vec<F>) {
        let mut pinned: Vec<_> = futures.into_iter().map(Box::pin).collect();
        std::future::poll_fn(|cx| {
            pinned.retain_mut(|f| f.as_mut().poll(cx).is_pending());
            if pinned.is_empty() {
                std::task::Poll::Ready(())
            } else {
                std::task::Poll::Pending
            }
        })
        .await;
    }
}
