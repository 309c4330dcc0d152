//! `RedisStore`'s startup check ([`Store::check`](crate::Store::check)):
//! what of the Redis it is given decides how the cache behaves there —
//! the eviction policy, the commands and keys its user may use, a Cluster
//! — one [`Finding`] each (pub/sub is the cache's own check: its bus). Nothing here changes what the cache
//! does; it says what it will do, so an operator reads it once instead of
//! learning it from an incident.

use std::sync::Arc;

use redis::Value;

use super::connection::{RedisCore, hash_slot};
use super::latency::DeadlineKind;
use super::scripts::CHECK_PERMISSIONS;
use crate::error::Error;
use crate::store::Finding;

impl RedisCore {
    /// The findings of [`Store::check`](crate::Store::check): `probe` is
    /// a key the store's user may write (under the cache's prefix and
    /// namespace; written, then deleted), `channel` the namespace's
    /// channel (a message nobody hears is published on `channel:check`).
    pub(super) async fn findings(self: &Arc<Self>, probe: &[u8], channel: &[u8]) -> Vec<Finding> {
        let channel = [channel, b":check"].concat();
        let mut out = vec![
            self.eviction(probe).await,
            self.permissions(probe, &channel).await,
        ];
        if self.target.failure_domains() > 1 {
            out.push(Finding::ok(
                "cluster",
                format!(
                    "a Redis Cluster ({} failure domains): each key's value and lease share its \
                     hash slot ({{key}}), tag counters spread over the cluster by tag, the clear \
                     record lives on one node (read once a second by every process)",
                    self.target.failure_domains()
                ),
            ));
        }
        out
    }

    /// `maxmemory-policy` (and `maxmemory`), and what breakwater does
    /// under it.
    async fn eviction(self: &Arc<Self>, probe: &[u8]) -> Finding {
        let config = |name: &'static str| {
            let mut cmd = redis::cmd("CONFIG");
            cmd.arg("GET").arg(name);
            async move {
                let reply: Result<Vec<String>, Error> =
                    self.query(DeadlineKind::Read, probe, &cmd).await;
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
    /// (and every command inside them, on keys like `probe`), `MGET`, and
    /// `MULTI`/`EXEC` (bulk writes), with `PUBLISH` on `channel`.
    async fn permissions(self: &Arc<Self>, probe: &[u8], channel: &[u8]) -> Finding {
        let set = [probe, b":s"].concat();
        let script = CHECK_PERMISSIONS.key(probe).key(&set).arg(channel);
        let mut refused: Vec<String> = match self.eval::<Vec<String>>(script).await {
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
        if let Err(err) = self.query::<Value>(DeadlineKind::Read, probe, &mget).await {
            refused.push(format!("MGET ({err})"));
        }
        // (`transaction` adds the `MULTI` and `EXEC`.)
        let mut tx = redis::pipe();
        tx.atomic()
            .cmd("DEL")
            .arg(probe)
            .cmd("PUBLISH")
            .arg(channel)
            .arg("");
        let slot = hash_slot(probe);
        let multi = self
            .call(DeadlineKind::Write, self.domain(probe), |mut conn| {
                let tx = &tx;
                async move { conn.transaction(tx, slot).await }
            })
            .await;
        if let Err(err) = multi {
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
                    "refused: {} — grant them (see `CacheBuilder::key_prefix` for the narrowest \
                     user); until then the calls that need them fail as store errors",
                    refused.join(", ")
                ),
            )
        }
    }
}
