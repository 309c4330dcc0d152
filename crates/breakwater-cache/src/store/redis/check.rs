//! `RedisStore`'s startup check ([`Store::check`](crate::Store::check)):
//! what of the Redis it is given decides how the cache behaves there —
//! the eviction policy, the commands and keys its user may use, pub/sub,
//! a Cluster — one [`Finding`] each. Nothing here changes what the cache
//! does; it says what it will do, so an operator reads it once instead of
//! learning it from an incident.

use std::time::Duration;

use redis::Value;
use tokio::time::Instant;

use super::RedisStore;
use super::latency::DeadlineKind;
use super::scripts::CHECK_PERMISSIONS;
use crate::error::Error;
use crate::store::{Finding, Invalidate, Notice, Store};

/// How long the check waits for its subscription to come up.
const SUBSCRIBED_WITHIN: Duration = Duration::from_secs(2);

impl RedisStore {
    /// The findings of [`Store::check`]: `probe` is a key the store's
    /// user may write (under the cache's prefix and namespace; written,
    /// then deleted), `channel` the namespace's channel.
    pub(super) async fn findings(&self, probe: &[u8], channel: &[u8]) -> Vec<Finding> {
        let mut out = Vec::new();
        out.push(self.eviction(probe).await);
        out.push(self.permissions(probe, channel).await);
        out.push(self.subscription(channel).await);
        if self.failure_domains() > 1 {
            out.push(Finding::ok(
                "cluster",
                format!(
                    "a Redis Cluster ({} failure domains): each key's value and lease share its \
                     hash slot ({{key}}), tag counters spread over the cluster by tag, the clear \
                     record lives on one node (read once a second by every process)",
                    self.failure_domains()
                ),
            ));
        }
        out
    }

    /// `maxmemory-policy` (and `maxmemory`), and what breakwater does
    /// under it.
    async fn eviction(&self, probe: &[u8]) -> Finding {
        let config = |name: &'static str| {
            let mut cmd = redis::cmd("CONFIG");
            cmd.arg("GET").arg(name);
            async move {
                let reply: Result<Vec<String>, Error> =
                    self.inner.query(DeadlineKind::Read, probe, &cmd).await;
                reply.map(|pair| pair.get(1).cloned().unwrap_or_default())
            }
        };
        let (policy, limit) = match (config("maxmemory-policy").await, config("maxmemory").await) {
            (Ok(policy), Ok(limit)) => (policy, limit),
            (Err(err), _) | (_, Err(err)) => {
                return Finding::warn(
                    "maxmemory-policy",
                    format!(
                        "could not be read ({err}; a managed Redis or a narrow ACL user may refuse \
                         CONFIG GET): check it yourself; breakwater expects allkeys-lru or \
                         allkeys-lfu, or a volatile-* policy"
                    ),
                );
            }
        };
        let unlimited = limit.trim() == "0";
        let what = match policy.as_str() {
            _ if unlimited => {
                return Finding::ok(
                    "maxmemory-policy",
                    format!(
                        "{policy}, maxmemory 0: nothing is evicted; entries and tag counters go \
                         with their TTLs"
                    ),
                );
            }
            "allkeys-lru" | "allkeys-lfu" => Ok(
                "any key may be evicted: an evicted entry is a miss (one load), a lease a free \
                 lease, a tag counter makes its entries misses once; the clear record is read \
                 once a second by every process (kept warm) and put back if evicted",
            ),
            "volatile-lru" | "volatile-lfu" | "volatile-ttl" | "volatile-random" => Ok(
                "only keys with a TTL are evicted (entries, leases, tag counters, the lease \
                 index); the clear record has none and stays. If memory fills with keys \
                 without a TTL (other applications'), writes fail: loads are served, not cached",
            ),
            "allkeys-random" => Err(
                "eviction ignores use: the clear record and tag counters are evicted as often \
                 as cold entries (a lost record is put back, a lost counter reloads its \
                 entries); prefer allkeys-lru or allkeys-lfu",
            ),
            "noeviction" => Err(
                "when Redis is full every write fails: loads are served but not cached, leases \
                 cannot be taken (each process loads on its own) until memory frees; prefer \
                 allkeys-lru or allkeys-lfu for a cache",
            ),
            _ => Err("an eviction policy breakwater does not know"),
        };
        match what {
            Ok(text) => Finding::ok("maxmemory-policy", format!("{policy}: {text}")),
            Err(text) => Finding::warn("maxmemory-policy", format!("{policy}: {text}")),
        }
    }

    /// Whether the store's user may run what the store sends: its scripts
    /// (and every command inside them, on keys like `probe`), `MGET`,
    /// `MULTI`/`EXEC` (bulk writes) and `PUBLISH` on `channel`.
    async fn permissions(&self, probe: &[u8], channel: &[u8]) -> Finding {
        let set = [probe, b":s"].concat();
        let script = CHECK_PERMISSIONS.key(probe).key(&set).arg(channel);
        let mut refused: Vec<String> = match self.inner.eval::<Vec<String>>(script).await {
            Ok(refused) => refused,
            Err(err) => {
                return Finding::warn(
                    "permissions",
                    format!(
                        "the store's scripts could not run ({err}): the user needs +evalsha and \
                         +eval (and the commands inside them, on keys under the cache's prefix)"
                    ),
                );
            }
        };
        let mut mget = redis::cmd("MGET");
        mget.arg(probe);
        if let Err(err) = self
            .inner
            .query::<Value>(DeadlineKind::Read, probe, &mget)
            .await
        {
            refused.push(format!("MGET ({err})"));
        }
        let lease = [probe, b":l"].concat();
        let bulk = [Invalidate {
            key: probe,
            lease_key: &lease,
        }];
        let notice = Notice {
            channel,
            message: b"",
            batch_head: None,
        };
        if let Err(err) = self.invalidate_many(&bulk, notice).await {
            refused.push(format!("MULTI/EXEC ({err})"));
        }
        if refused.is_empty() {
            Finding::ok(
                "permissions",
                "every command the store sends is allowed on the cache's keys and channel",
            )
        } else {
            Finding::warn(
                "permissions",
                format!(
                    "refused: {} — grant them (see the README's ACL section); until then the \
                     calls that need them fail as store errors",
                    refused.join(", ")
                ),
            )
        }
    }

    /// Whether a subscription to `channel` comes up: without it L1 copies
    /// are never verified, and waiters poll.
    async fn subscription(&self, channel: &[u8]) -> Finding {
        let subscription = self.subscribe(channel);
        let until = Instant::now() + SUBSCRIBED_WITHIN;
        while !subscription.is_ready() && Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        if subscription.is_ready() {
            Finding::ok("pub/sub", "the namespace's channel can be subscribed")
        } else {
            Finding::warn(
                "pub/sub",
                format!(
                    "not subscribed to the namespace's channel within {SUBSCRIBED_WITHIN:?} \
                     (+subscribe and the channel pattern in the ACL?): invalidations from \
                     other processes do not reach L1 (its copies serve only as stale stand-ins) \
                     and waiters poll for their lease"
                ),
            )
        }
    }
}
