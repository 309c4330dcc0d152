//! [`Cache::check`]: the store this cache is given, checked once — its
//! eviction policy, the permissions of its user, pub/sub, a Cluster (see
//! [`Store::check`](crate::Store::check)) — and what this cache's own
//! settings make of it (L1 without a working bus), one log line per
//! finding. Call it once at startup; `breakwater inspect --check` runs it
//! for operators.

use std::time::Duration;

use super::handle::Cache;
use super::value::Value;
use crate::store::{Finding, Store};

/// How long the check waits for the cache's bus to come up.
const BUS_WITHIN: Duration = Duration::from_secs(2);

/// How long the startup check may take before it is given up (a stalled
/// store must not keep the cache alive).
const STARTUP_CHECK_WITHIN: Duration = Duration::from_secs(10);

impl<V: Value> Cache<V> {
    /// [`check`](Self::check) in the background, on the runtime the cache
    /// is built on ([`CacheBuilder::startup_check`](crate::CacheBuilder::startup_check));
    /// outside a runtime, one line saying it did not run.
    pub(super) fn check_at_startup(&self) {
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                let cache = self.clone();
                runtime.spawn(async move {
                    let _ = tokio::time::timeout(STARTUP_CHECK_WITHIN, cache.check()).await;
                });
            }
            Err(_) => tracing::info!(
                namespace = %self.inner.settings.namespace,
                "breakwater: the startup check did not run (the cache was built outside a tokio \
                 runtime); call Cache::check from one, or set startup_check(false)"
            ),
        }
    }

    /// Checks the store this cache is given and logs each finding (a
    /// `warn` line for one that is not as expected, `info` otherwise).
    /// On Redis: `maxmemory-policy` and what breakwater does under it; the
    /// commands and keys its user may use (a probe key under the cache's
    /// prefix is written, then deleted); a Cluster. Then whether this
    /// cache's bus is subscribed, and with L1 on, what that means for it. Meant for startup: it
    /// takes a few round trips, and up to 2 s when pub/sub does not come
    /// up.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), breakwater_cache::Error> {
    /// let cache = breakwater_cache::Cache::<String>::builder().build()?;
    /// for finding in cache.check().await {
    ///     println!("{finding}");
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn check(&self) -> Vec<Finding> {
        let inner = &self.inner;
        let probe = [&inner.clear_key[..], b"heck:{probe}"].concat();
        let channel = inner.waiters.channel();
        let mut findings = match inner.store.check(&probe, channel).await {
            Ok(findings) => findings,
            Err(err) => vec![Finding::warn(
                "store",
                format!("the check could not run: {err}"),
            )],
        };
        // Its own bus: without it, waiters poll and L1 is never verified.
        inner
            .waiters
            .subscribed_within(&*inner.store, BUS_WITHIN)
            .await;
        let up = inner.waiters.is_up();
        findings.push(if up {
            Finding::ok("pub/sub", "the namespace's channel is subscribed")
        } else {
            Finding::warn(
                "pub/sub",
                format!(
                    "not subscribed to the namespace's channel within {BUS_WITHIN:?} (+subscribe \
                     and the channel pattern in the ACL?): waiters poll for their lease, and \
                     other processes' changes reach no L1"
                ),
            )
        });
        if self.local.l1.is_some() {
            findings.push(if up {
                Finding::ok(
                    "l1",
                    "L1 is on and the bus is up: other processes' changes reach it",
                )
            } else {
                Finding::warn(
                    "l1",
                    "L1 is on but the bus is down: its copies are never verified (served only \
                     as stale stand-ins) until it is up",
                )
            });
        }
        for finding in &findings {
            if finding.ok {
                tracing::info!(topic = finding.topic, "{}", finding.detail);
            } else {
                tracing::warn!(topic = finding.topic, "{}", finding.detail);
            }
        }
        findings
    }
}
