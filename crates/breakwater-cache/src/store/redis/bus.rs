//! The bus: one pub/sub connection per subscribed channel, kept
//! subscribed by a background task ([`run_subscription`]) and fanned out
//! to every local [`Subscription`]. Fill and invalidation notices ride on
//! it; a (re)connection is announced as [`Delivery::Missed`].

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use futures_util::StreamExt;
use rand::rngs::StdRng;
use tokio::sync::{broadcast, watch};
use tokio::task::AbortHandle;
use tokio::time::Instant;

use super::config::RedisStoreConfig;
use super::conn::{MasterAddr, store_error};
use super::latency::DeadlineKind;
use super::sentinel::{self, Sentinel};
use crate::background::{Duty, Supervised};
use crate::error::Error;
use crate::jitter::Backoff;
use crate::store::{Delivery, SUBSCRIPTION_BUFFER, Subscription};

/// The store's deadline in force for an operation, `None` once the store
/// is gone (see [`FeedDuty`]).
type Deadlines = Box<dyn Fn(DeadlineKind) -> Option<Duration> + Send + Sync>;

/// One subscribed channel: its deliveries, fanned out to every local
/// [`Subscription`], whether it is subscribed at the store, and the task
/// that keeps it so.
pub(super) struct ChannelFeed {
    messages: broadcast::Sender<Delivery>,
    ready: watch::Sender<bool>,
    /// The task that keeps the channel subscribed.
    task: Supervised,
}

impl ChannelFeed {
    /// A channel not subscribed yet; its task, dropped with its runtime,
    /// raises `lost`.
    pub(super) fn new(lost: &Arc<AtomicBool>) -> Self {
        ChannelFeed {
            messages: broadcast::channel(SUBSCRIPTION_BUFFER).0,
            ready: watch::Sender::new(false),
            task: Supervised::reporting_to(lost),
        }
    }

    /// A new local subscriber of the channel.
    pub(super) fn subscription(&self) -> Subscription {
        Subscription::new(self.messages.subscribe(), self.ready.subscribe())
    }

    /// Frees the task's slot whatever its task promised (it was found
    /// stranded), and tells the subscribers the bus is down until a new
    /// one has subscribed.
    pub(super) fn renew(&self) {
        self.task.reset();
        self.ready.send_replace(false);
        let _ = self.messages.send(Delivery::Missed);
    }

    /// Makes sure a task keeps `channel` subscribed through `source` (see
    /// [`run_subscription`]), with the store's deadlines in force from
    /// `deadlines`; the task, if one was started.
    pub(super) fn keep(
        &self,
        source: Feed,
        config: &RedisStoreConfig,
        channel: &[u8],
        deadlines: impl Fn(DeadlineKind) -> Option<Duration> + Send + Sync + 'static,
    ) -> Option<AbortHandle> {
        let (config, channel) = (config.clone(), channel.to_vec());
        let (messages, ready) = (self.messages.clone(), self.ready.clone());
        let grace = config.connect_timeout;
        self.task.ensure(grace, |duty| {
            run_subscription(
                source,
                config,
                channel,
                FeedDuty {
                    duty: Some(duty),
                    messages,
                    ready,
                    deadlines: Box::new(deadlines),
                },
            )
        })
    }
}

/// Where a subscription connects.
pub(super) enum Feed {
    /// The store's one server, or the cluster's seed nodes in turn.
    Nodes(Vec<redis::Client>),
    /// The master the sentinels name.
    Sentinel(Arc<Sentinel>),
}

impl Feed {
    /// A client for attempt `attempt`, and the master it goes to on a
    /// Sentinel store (found within `budget`); `None` if there is nowhere
    /// to connect.
    async fn client(
        &self,
        attempt: usize,
        config: &RedisStoreConfig,
        budget: Duration,
    ) -> Option<Result<(redis::Client, Option<MasterAddr>), Error>> {
        match self {
            Feed::Nodes(clients) => {
                let client = clients.get(attempt % clients.len().max(1))?;
                Some(Ok((client.clone(), None)))
            }
            Feed::Sentinel(sentinel) => Some(
                sentinel
                    .subscription_client(config, budget)
                    .await
                    .map(|(client, master)| (client, Some(master))),
            ),
        }
    }

    /// Resolves once the sentinels name another master than `master`;
    /// never for a subscription that is not on a Sentinel's master.
    async fn master_moved(&self, master: Option<&MasterAddr>) {
        match (self, master) {
            (Feed::Sentinel(sentinel), Some(master)) => sentinel.moved_from(master).await,
            _ => std::future::pending().await,
        }
    }
}

/// Keeps one channel subscribed on a dedicated pub/sub connection,
/// reconnecting with jittered backoff, and fans its messages out. An idle
/// connection is checked with `PING` every `subscription_ping`; one that does
/// not answer within the store's read deadline in force (a hung or
/// unreachable Redis) is dropped; connecting and subscribing get
/// `connect_timeout`, or twice the write deadline in force if that is
/// longer (deadlines follow the latency Redis has: see `latency`). Every (re)connection is announced as [`Delivery::Missed`], since
/// messages sent while it was down are lost. In a cluster each attempt tries
/// the next node: a `PUBLISH` on any node reaches every node's subscribers.
/// On a Sentinel store it subscribes on the master the sentinels name, and
/// drops the subscription as soon as they name another one (what is
/// published there would not reach it).
///
/// The task is supervised (see `crate::background`): dropped with its
/// runtime, it tells the subscribers the bus is down (`ready` false,
/// [`Delivery::Missed`]), and the store's next command starts it again.
async fn run_subscription(feed: Feed, config: RedisStoreConfig, channel: Vec<u8>, duty: FeedDuty) {
    let FeedDuty {
        ref messages,
        ref ready,
        ..
    } = duty;
    let backoff = Backoff::full_jitter(Duration::from_millis(50), Duration::from_secs(2));
    let mut rng: StdRng = rand::make_rng();
    let mut failures = 0u32;
    for attempt in 0usize.. {
        let budget = config
            .connect_timeout
            .max(duty.deadline(DeadlineKind::Write).saturating_mul(2));
        // Through sentinels, the lookup first (see `sentinel::lookup_time`).
        let within = match feed {
            Feed::Sentinel(_) => sentinel::lookup_time(budget) + budget,
            Feed::Nodes(_) => budget,
        };
        if !duty.due_by(Instant::now() + within) {
            return duty.done();
        }
        let connect = async {
            // In a cluster, each new attempt tries the next node.
            let Some(client) = feed.client(attempt, &config, budget).await else {
                return Ok(None);
            };
            let (client, master) = client?;
            let mut pubsub = client.get_async_pubsub().await.map_err(store_error)?;
            pubsub.subscribe(&channel).await.map_err(store_error)?;
            Ok::<_, Error>(Some((pubsub, master)))
        };
        match tokio::time::timeout(within, connect).await {
            Ok(Ok(None)) => return duty.done(),
            Ok(Ok(Some((pubsub, master)))) => {
                failures = 0;
                if !duty.due_by(
                    Instant::now() + config.subscription_ping + duty.deadline(DeadlineKind::Read),
                ) {
                    return duty.done();
                }
                ready.send_replace(true);
                let _ = messages.send(Delivery::Missed);
                let (mut sink, mut stream) = pubsub.split();
                let mut ping = tokio::time::interval(config.subscription_ping);
                ping.tick().await;
                loop {
                    tokio::select! {
                        msg = stream.next() => match msg {
                            Some(msg) => {
                                let payload = Arc::from(msg.get_payload_bytes());
                                let _ = messages.send(Delivery::Message(payload));
                            }
                            None => break,
                        },
                        _ = ping.tick() => {
                            let back_by = Instant::now() + config.subscription_ping + duty.deadline(DeadlineKind::Read);
                            if !duty.due_by(back_by) {
                                break;
                            }
                            let pong = tokio::time::timeout(
                                duty.deadline(DeadlineKind::Read),
                                sink.ping::<redis::Value>(),
                            )
                            .await;
                            if !matches!(pong, Ok(Ok(_))) {
                                break;
                            }
                        }
                        () = feed.master_moved(master.as_ref()) => {
                            tracing::warn!("the redis sentinels name a new master; subscribing there");
                            break;
                        }
                    }
                }
                if !duty.is_current() {
                    // Replaced (this runtime was idle): the new task
                    // speaks for the channel now.
                    return duty.done();
                }
                ready.send_replace(false);
                let _ = messages.send(Delivery::Missed);
                tracing::warn!("redis subscription dropped; reconnecting");
            }
            Ok(Err(err)) => tracing::debug!(error = %err, "redis subscription failed"),
            Err(_) => tracing::debug!("redis subscription timed out"),
        }
        failures = failures.saturating_add(1);
        let delay = backoff.delay(failures, None, &mut rng);
        if !duty.due_by(Instant::now() + delay) {
            return duty.done();
        }
        tokio::time::sleep(delay).await;
    }
}

/// A subscription task's hold on its channel (see `crate::background`):
/// dropped before it was done (its runtime went away), it tells the
/// channel's subscribers that the bus is down, since nobody listens for
/// them any more.
struct FeedDuty {
    duty: Option<Duty>,
    messages: broadcast::Sender<Delivery>,
    ready: watch::Sender<bool>,
    /// The store's deadline in force for an operation (its first failure
    /// domain's); `None` once the store is gone.
    deadlines: Deadlines,
}

impl FeedDuty {
    /// The store's deadline in force for `op` (its first failure
    /// domain's), or the configured floor once the store is gone.
    fn deadline(&self, op: DeadlineKind) -> Duration {
        (self.deadlines)(op).unwrap_or(Duration::from_millis(50))
    }

    /// Promises to be back by `due`; `false` if the task was replaced.
    fn due_by(&self, due: Instant) -> bool {
        self.duty.as_ref().is_some_and(|d| d.due_by(Some(due)))
    }

    fn is_current(&self) -> bool {
        self.duty.as_ref().is_some_and(Duty::is_current)
    }

    /// The task ends of its own accord.
    fn done(mut self) {
        if let Some(duty) = self.duty.take() {
            duty.done();
        }
    }
}

impl Drop for FeedDuty {
    fn drop(&mut self) {
        let Some(duty) = self.duty.take() else { return };
        if duty.is_current() && *self.ready.borrow() {
            self.ready.send_replace(false);
            let _ = self.messages.send(Delivery::Missed);
        }
        drop(duty);
    }
}
