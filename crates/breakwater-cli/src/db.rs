//! The database stand-in of `warm` and `simulate`: every query takes a fixed
//! latency; it records when each query started and the most that ran at
//! once.

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::time::Instant;

/// A database whose every query takes `latency` (on tokio's clock).
#[derive(Debug)]
pub(crate) struct Database {
    latency: Duration,
    /// Query start times are milliseconds after this.
    began: Instant,
    running: AtomicUsize,
    peak: AtomicUsize,
    started_ms: Mutex<Vec<u64>>,
}

impl Database {
    /// A database that starts counting now.
    pub(crate) fn new(latency: Duration) -> Self {
        Database {
            latency,
            began: Instant::now(),
            running: AtomicUsize::new(0),
            peak: AtomicUsize::new(0),
            started_ms: Mutex::default(),
        }
    }

    /// One query: takes the latency.
    pub(crate) async fn query(&self) {
        let running = self.running.fetch_add(1, Ordering::SeqCst) + 1;
        self.peak.fetch_max(running, Ordering::SeqCst);
        let at = u64::try_from(self.began.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.started().push(at);
        tokio::time::sleep(self.latency).await;
        self.running.fetch_sub(1, Ordering::SeqCst);
    }

    /// The most queries that ran at once.
    pub(crate) fn peak(&self) -> usize {
        self.peak.load(Ordering::SeqCst)
    }

    /// When each query started, in ms after [`new`](Self::new).
    pub(crate) fn started_ms(&self) -> Vec<u64> {
        self.started().clone()
    }

    fn started(&self) -> std::sync::MutexGuard<'_, Vec<u64>> {
        self.started_ms.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn counts_queries_and_the_most_at_once() {
        let db = Database::new(Duration::from_millis(10));
        tokio::join!(db.query(), db.query(), db.query());
        tokio::time::sleep(Duration::from_millis(5)).await;
        db.query().await;
        assert_eq!(db.peak(), 3);
        assert_eq!(db.started_ms(), vec![0, 0, 0, 15]);
    }
}
