//! What a process knows of its namespace's clear record (see `clear`), so
//! that it judges entries by the latest clear without reading the record
//! on every read: the record as last read or heard, whether the bus has
//! stayed up since, and the acknowledgements of clears heard on the bus.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use rand::RngExt;

use super::notify::{self, CLEAR_ACKED, CLEARED, SENDER_LEN};
use crate::background::Supervised;
use crate::error::{Error, ErrorKind};
use crate::store::namespace::NamespaceState;
use crate::store::{FRESH_GENERATIONS, NamespaceClear, Notice, Store};

/// How long a process that cannot trust its bus uses a clear record it
/// read (counted from when the read was sent); `Cache::clear` returns no
/// sooner than this after the store recorded it, so such a process has
/// read it again by then.
pub(super) const RECHECK: Duration = Duration::from_millis(100);

/// How often (in listener beats, 250 ms each) a process reads the record
/// it trusts, to keep it warm in the store and put it back if it is gone.
const KEEP_WARM_BEATS: u64 = 4;

/// [`KEEP_WARM_BEATS`] as a duration: within this, every process whose
/// bus is up has read its record once.
pub(super) const KEEP_WARM: Duration = Duration::from_millis(1_000);

/// How long a keep-warm read may hold its slot without being polled
/// before another may start.
const KEEP_WARM_STRANDED: Duration = Duration::from_secs(10);

/// [`Clears::missing`]: the record known was trusted when a read found
/// the store without it.
const MISSING_TRUSTED: u8 = 1;
/// [`Clears::missing`]: it was not.
const MISSING_UNTRUSTED: u8 = 2;

/// How many clears' acknowledgements a process keeps count of.
const ACKS_KEPT: usize = 64;

/// What this process knows of its namespace's clear record.
#[derive(Default)]
pub(super) struct Clears {
    known: Mutex<Known>,
    /// The bus's state, as `Local::missed` reports it: a count of changes,
    /// times two, plus one while it is up.
    bus: AtomicU64,
    /// Acknowledgements heard, by the generation acknowledged.
    acks: Mutex<HashMap<u64, u64>>,
    acked: Notify,
    /// Where the record is read and acknowledgements go (set at build).
    link: OnceLock<Link>,
    /// One read of the record at a time: callers that find it untrusted
    /// while a read is in the air wait for that one, up to one read
    /// deadline ([`Clears::reading`]): a holder whose future is no longer
    /// polled (an idle runtime, a caller's `select!` busy elsewhere) holds
    /// up nobody for longer.
    reading: tokio::sync::Mutex<()>,
    /// When the holder of `reading` sent its store step (`None`: none
    /// sent since the lock was last free).
    step_sent: Mutex<Option<Instant>>,
    /// A read found the store without the record known here (evicted,
    /// deleted, or an empty restart): it is judged by as known, and put
    /// back ([`Clears::take_missing`]).
    missing: AtomicU8,
    /// When (store-clock ms) a read first found no record while none was
    /// known here, though entries recorded one (0: not so): they are
    /// judged as an adopting pin made then would judge them, until one is.
    lost_at: AtomicU64,
    /// The store was read (or a record heard) once: what it holds, record
    /// or none, was seen here.
    seen: AtomicBool,
    /// The task that puts a lost record back, or makes an adopting pin
    /// (one at a time; see `Cache::record_lost`).
    pub(super) restoring: Supervised,
    /// The task that keeps the record warm ([`Clears::keep_warm`]), and
    /// how many listener beats since it last ran.
    warming: Supervised,
    beats: AtomicU64,
}

/// The record as last read or heard, and the bus state it holds for.
#[derive(Default, Clone, Copy)]
struct Known {
    /// `None`: not read yet; `Some(None)`: no record.
    record: Option<Option<NamespaceState>>,
    bus: u64,
    /// When the read that gave it was sent (`None`: heard on the bus).
    read_at: Option<Instant>,
    /// For a read, when it was sent; for a pin, when it was answered (it
    /// landed before): a read sent before this saw no newer record, and
    /// does not replace it (reads that could not wait for the lock run
    /// beside others).
    landed: Option<Instant>,
}

/// Where a process reads its namespace's clear record and acknowledges a
/// clear: the record's key, its namespace channel, as its cache.
struct Link {
    store: Arc<dyn Store>,
    key: Vec<u8>,
    channel: Vec<u8>,
    sender: [u8; SENDER_LEN],
}

impl Known {
    /// Whether it is trusted at bus state `bus` (see [`Clears::trusted`]).
    fn trusted_at(&self, bus: u64) -> bool {
        if bus % 2 == 1 {
            self.bus == bus
        } else {
            self.read_at.is_some_and(|at| at.elapsed() < RECHECK)
        }
    }
}

impl Link {
    /// A clear (`pin`: a pin, putting back `restore` if given) of this
    /// namespace's record, `hard` or soft over `window_ms`, published with
    /// `message` on this namespace's channel; a new record starts at a
    /// value drawn at random.
    fn clear<'a>(
        &'a self,
        hard: bool,
        window_ms: u64,
        pin: bool,
        restore: Option<&'a [u8]>,
        message: &'a [u8],
    ) -> NamespaceClear<'a> {
        NamespaceClear {
            key: &self.key,
            hard,
            window_ms,
            fresh: rand::rng().random_range(FRESH_GENERATIONS),
            pin,
            restore,
            notice: Notice {
                channel: &self.channel,
                message,
                batch_head: None,
            },
        }
    }
}

impl Clears {
    /// The bus's state now (see [`Clears::bus_changed`]).
    pub(super) fn bus_state(&self) -> u64 {
        self.bus.load(Ordering::SeqCst)
    }

    /// Sets where the record is read (`key`) and acknowledgements go
    /// (once, at build).
    pub(super) fn link(
        &self,
        store: Arc<dyn Store>,
        key: Vec<u8>,
        channel: Vec<u8>,
        sender: [u8; SENDER_LEN],
    ) {
        let _ = self.link.set(Link {
            store,
            key,
            channel,
            sender,
        });
    }

    /// The record as it must be judged by now: the trusted one, else read
    /// from the store (one `GET`, shared by every caller that needs it
    /// meanwhile, the bus listener's included). `Err` if it could not be
    /// read.
    pub(super) async fn current(&self) -> Result<Option<NamespaceState>, Error> {
        if let Some(record) = self.trusted() {
            return Ok(record);
        }
        let reading = self.reading().await;
        if let Some(record) = self.trusted() {
            return Ok(record);
        }
        self.read(reading).await
    }

    /// The read lock, waited for until its holder's store step is one
    /// read deadline old (a holder that is polled has its answer or its
    /// error by then); `None` if the holder is later (the caller then
    /// reads beside it: a stranded holder costs others at most one read
    /// deadline, never a hang; see [`Known::landed`] for how the two
    /// reads' answers are ordered).
    async fn reading(&self) -> Option<tokio::sync::MutexGuard<'_, ()>> {
        let deadline = self
            .link
            .get()
            .map_or(Duration::from_secs(1), |link| link.store.read_deadline());
        let sent = *self.step_sent.lock().unwrap_or_else(|p| p.into_inner());
        let until = sent.unwrap_or_else(Instant::now) + deadline;
        match tokio::time::timeout_at(until, self.reading.lock()).await {
            Ok(reading) => Some(reading),
            Err(_) => {
                tracing::debug!(
                    ?until,
                    "the clear record's read lock is held past a read deadline; reading beside it"
                );
                None
            }
        }
    }

    /// The bus dropped (`up` false) or came back (`true`): a clear may
    /// have been missed, so the record is read again.
    pub(super) fn bus_changed(&self, up: bool) {
        let _ = self
            .bus
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |bus| {
                Some((bus | 1) + 1 + u64::from(up))
            });
    }

    /// The record, if known and still trusted: the bus is up and has
    /// stayed up since it was read or heard; or, while the bus is down, it
    /// was read less than [`RECHECK`] ago. (One read while the bus was
    /// down is not trusted once it is up: a clear may have come before the
    /// subscription, unheard.)
    pub(super) fn trusted(&self) -> Option<Option<NamespaceState>> {
        let bus = self.bus.load(Ordering::SeqCst);
        let known = *self.known.lock().unwrap_or_else(|p| p.into_inner());
        known.trusted_at(bus).then_some(known.record).flatten()
    }

    /// The record last known, trusted or not (`None` if none was ever
    /// known).
    pub(super) fn last(&self) -> Option<NamespaceState> {
        self.known
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .record
            .flatten()
    }

    /// Takes `record`, read with a read sent at `read_at` at bus state
    /// `bus` (`read_at` `None`: heard on the bus, or made here); the record
    /// now known. What is heard replaces what is known (messages come in
    /// order); so does what is read, unless a newer record was heard since
    /// the bus was last seen to change (the read was sent before it).
    pub(super) fn take(
        &self,
        record: Option<NamespaceState>,
        bus: u64,
        read_at: Option<Instant>,
    ) -> Option<NamespaceState> {
        self.take_landed(record, bus, read_at, read_at)
    }

    /// [`take`](Self::take), with when what was read `landed` (see
    /// [`Known::landed`]).
    fn take_landed(
        &self,
        record: Option<NamespaceState>,
        bus: u64,
        read_at: Option<Instant>,
        landed: Option<Instant>,
    ) -> Option<NamespaceState> {
        self.seen.store(true, Ordering::SeqCst);
        let mut known = self.known.lock().unwrap_or_else(|p| p.into_inner());
        // A read sent before a read or pin known here landed found that
        // record or an older one: what is known stays.
        if let (Some(sent), Some(after)) = (read_at, known.landed)
            && sent < after
            && known.bus == bus
            && known.record.is_some()
        {
            return known.record.flatten();
        }
        // A read sent before a clear heard since (the bus unchanged) is
        // older than what was heard: it finds an older record, or none.
        let newer = match (known.record.flatten(), record) {
            // A read that finds none where a record is known: the store
            // lost it (evicted, deleted, restarted empty). What is known
            // stands (a loss never turns the namespace into a miss), and
            // is put back: at once if it was trusted (nothing can have been
            // missed); else it stays untrusted (every read reads the
            // record again) until a process that trusts a record has had
            // the time to put its own back (see `Cache::record_lost`).
            (Some(held), None) if read_at.is_some() => {
                if !known.trusted_at(self.bus.load(Ordering::SeqCst)) {
                    self.missing.store(MISSING_UNTRUSTED, Ordering::SeqCst);
                    return Some(held);
                }
                self.missing.store(MISSING_TRUSTED, Ordering::SeqCst);
                Some(held)
            }
            (Some(held), new)
                if read_at.is_some()
                    && known.read_at.is_none()
                    && known.bus == bus
                    && new.is_some_and(|new| held.generation > new.generation) =>
            {
                Some(held)
            }
            (_, new) => new,
        };
        if newer.is_some() {
            self.lost_at.store(0, Ordering::SeqCst);
        }
        if bus == self.bus.load(Ordering::SeqCst) {
            *known = Known {
                record: Some(newer),
                bus,
                read_at,
                landed,
            };
        }
        newer
    }

    /// Whether a read found the store without the record known here since
    /// this was last asked (the caller puts it back): `Some(true)` if that
    /// record was trusted then, `Some(false)` if not (a clear may have
    /// been missed: it is put back only after a pause).
    pub(super) fn take_missing(&self) -> Option<bool> {
        match self.missing.swap(0, Ordering::SeqCst) {
            MISSING_TRUSTED => Some(true),
            MISSING_UNTRUSTED => Some(false),
            _ => None,
        }
    }

    /// When (store-clock ms) a read first found no record while none was
    /// known here, for entries that recorded one; noted now if not yet.
    pub(super) fn lost_at(&self) -> u64 {
        let now = self.link.get().map_or(1, |link| link.store.now_ms().max(1));
        match self
            .lost_at
            .compare_exchange(0, now, Ordering::SeqCst, Ordering::SeqCst)
        {
            Ok(_) => now,
            Err(at) => at,
        }
    }

    /// Whether the store's record (or its absence) was ever read or heard
    /// here: `false` while every read of it failed.
    pub(super) fn ever_seen(&self) -> bool {
        self.seen.load(Ordering::SeqCst)
    }

    /// Reads the record from the store now, whatever is trusted, and takes
    /// it.
    pub(super) async fn read_again(&self) -> Result<Option<NamespaceState>, Error> {
        let reading = self.reading().await;
        self.read(reading).await
    }

    /// One read of the record (the caller holds `reading`, or waited one
    /// read deadline for it), taken.
    async fn read(
        &self,
        reading: Option<tokio::sync::MutexGuard<'_, ()>>,
    ) -> Result<Option<NamespaceState>, Error> {
        let Some(link) = self.link.get() else {
            return Ok(None);
        };
        let (bus, sent) = (self.bus_state(), self.step_sent(&reading));
        let stored = link.store.get(&link.key).await?;
        let record = stored.as_deref().and_then(NamespaceState::parse);
        Ok(self.take(record, bus, Some(sent)))
    }

    /// Now, noted as when the holder of `reading` (if the caller holds
    /// it) sent its store step.
    fn step_sent(&self, reading: &Option<tokio::sync::MutexGuard<'_, ()>>) -> Instant {
        let now = Instant::now();
        if reading.is_some() {
            *self.step_sent.lock().unwrap_or_else(|p| p.into_inner()) = Some(now);
        }
        now
    }

    /// Pins the namespace's clear record (see `store::namespace`): puts
    /// `restore` back (a record known here that the store lost), or, with
    /// none, makes an adopting pin, if the store holds no record: the
    /// record the store now holds, made by it or found, taken as a read of
    /// it is.
    pub(super) async fn pin(
        &self,
        restore: Option<NamespaceState>,
    ) -> Result<NamespaceState, Error> {
        let Some(link) = self.link.get() else {
            return Err(Error::new(
                ErrorKind::Store,
                "the namespace's clear record is not linked",
            ));
        };
        let message = notify::message(CLEARED, &link.sender, b"");
        let restore = restore.map(|state| state.encode());
        let reading = self.reading().await;
        let (bus, sent) = (self.bus_state(), self.step_sent(&reading));
        let made = link
            .store
            .clear_namespace(link.clear(false, 0, true, restore.as_deref(), &message))
            .await?;
        let Some(state) = NamespaceState::parse(&made.record) else {
            return Err(Error::new(
                ErrorKind::Store,
                "the store answered a pin of the namespace's clear record with something that \
                 is not a clear record",
            ));
        };
        self.take_landed(Some(state), bus, Some(sent), Some(Instant::now()));
        Ok(state)
    }

    /// Puts back the record known here, which a read found the store
    /// without (see [`Clears::take_missing`]); one a process made
    /// meanwhile is taken instead. Logged, not returned, if it fails (the
    /// next read that finds it missing tries again).
    pub(super) async fn put_back(&self) {
        let Some(known) = self.last() else { return };
        tracing::info!(record = %String::from_utf8_lossy(&known.encode()), "the namespace's clear record is gone from the store (evicted under maxmemory, deleted, or an empty restart); putting back the one this process knows");
        if let Err(err) = self.pin(Some(known)).await {
            tracing::debug!(error = %err, "the namespace's clear record could not be put back");
        }
    }

    /// Called on every listener beat: every [`KEEP_WARM_BEATS`], while
    /// this process trusts a record it knows, reads it from the store (in
    /// the background, one read at a time; [`Store::keep_warm`]). The read
    /// keeps the key warm under an LRU or LFU eviction policy (steady
    /// traffic on entries never touches it otherwise), and finds a record
    /// that was deleted or evicted all the same: it is put back at once,
    /// as it was, before a process that never knew it has to adopt its
    /// entries. A record other than the one trusted (a clear this process
    /// missed: two faults) is read again by the next caller.
    pub(super) fn keep_warm(this: &Arc<Self>) {
        if this.beats.fetch_add(1, Ordering::Relaxed) % KEEP_WARM_BEATS != KEEP_WARM_BEATS - 1 {
            return;
        }
        let Some(Some(trusted)) = this.trusted() else {
            return;
        };
        let clears = Arc::clone(this);
        this.warming.ensure(KEEP_WARM_STRANDED, |duty| async move {
            let Some(link) = clears.link.get() else {
                return duty.done();
            };
            let bus = clears.bus_state();
            match link.store.keep_warm(&link.key).await {
                Ok(None) if clears.bus_state() == bus => clears.put_back().await,
                Ok(Some(stored))
                    if NamespaceState::parse(&stored).is_none_or(|held| held != trusted) =>
                {
                    // Not taken here (a clear heard has its own steps):
                    // untrusted, so the next caller reads it.
                    clears.bus.fetch_add(2, Ordering::SeqCst);
                }
                _ => {}
            }
            duty.done();
        });
    }

    /// A clear heard on the bus: its record taken, and returned (`None`
    /// for a message that holds no record).
    pub(super) fn heard(&self, record: &[u8]) -> Option<NamespaceState> {
        let state = NamespaceState::parse(record)?;
        let bus = self.bus.load(Ordering::SeqCst);
        self.take(Some(state), bus, None);
        Some(state)
    }

    /// Clears this namespace, `hard` or soft over `window_ms`, as the
    /// previous version's processes cleared theirs (a version transition);
    /// logged, not returned, if it fails.
    pub(super) async fn mirror(&self, hard: bool, window_ms: u64) {
        let Some(link) = self.link.get() else {
            return;
        };
        let message = notify::message(CLEARED, &link.sender, b"");
        let clear = link.clear(hard, window_ms, false, None, &message);
        if let Err(err) = link.store.clear_namespace(clear).await {
            tracing::warn!(error = %err, "the previous version's clear could not be made in this version's namespace");
        }
    }

    /// Acknowledges the clear of `generation` on the bus.
    pub(super) async fn acknowledge(&self, generation: u64) {
        if let Some(link) = self.link.get() {
            self.acknowledge_on(&link.channel, generation).await;
        }
    }

    /// Acknowledges the clear of `generation` on `channel` (this
    /// namespace's, or the previous version's).
    pub(super) async fn acknowledge_on(&self, channel: &[u8], generation: u64) {
        let Some(link) = self.link.get() else {
            return;
        };
        let message = notify::message(CLEAR_ACKED, &link.sender, generation.to_string().as_bytes());
        if let Err(err) = link.store.publish(channel, &message).await {
            tracing::debug!(error = %err, "a clear's acknowledgement was not published");
        }
    }

    /// An acknowledgement of the clear of `generation` heard on the bus.
    pub(super) fn acked(&self, generation: &[u8]) {
        let Some(generation) = std::str::from_utf8(generation)
            .ok()
            .and_then(|g| g.parse::<u64>().ok())
        else {
            return;
        };
        let mut acks = self.acks.lock().unwrap_or_else(|p| p.into_inner());
        *acks.entry(generation).or_default() += 1;
        // Every process hears every clear's acknowledgements; only the
        // clearing one forgets its own: the oldest go past a few dozen.
        while acks.len() > ACKS_KEPT {
            let Some(&oldest) = acks.keys().min() else {
                break;
            };
            acks.remove(&oldest);
        }
        drop(acks);
        self.acked.notify_waiters();
    }

    /// Waits until `receivers` acknowledgements of `generation` were
    /// heard, or `deadline`; how many were.
    pub(super) async fn acks_of(&self, generation: u64, receivers: u64, deadline: Instant) -> u64 {
        loop {
            let heard = self.acked.notified();
            let count = self
                .acks
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(&generation)
                .copied()
                .unwrap_or(0);
            if count >= receivers {
                return count;
            }
            if tokio::time::timeout_at(deadline, heard).await.is_err() {
                return count;
            }
        }
    }

    /// Forgets the acknowledgements of `generation`.
    pub(super) fn forget(&self, generation: u64) {
        self.acks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&generation);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(generation: u64) -> NamespaceState {
        NamespaceState {
            generation,
            floor: generation,
            soft_at: 0,
            window: 0,
            legacy: generation - 1,
            stale_below: generation,
            stale_by: 0,
        }
    }

    /// A record read while the bus is down is trusted for RECHECK, and
    /// not once the bus is up (a clear may have come before the
    /// subscription); one read or heard while it is up, until it changes.
    #[tokio::test(start_paused = true)]
    async fn a_record_is_trusted_only_while_nothing_can_have_been_missed() {
        let clears = Clears::default();
        assert_eq!(clears.trusted(), None, "never read");
        clears.take(Some(state(5)), clears.bus_state(), Some(Instant::now()));
        assert_eq!(clears.trusted(), Some(Some(state(5))), "read while down");
        tokio::time::advance(RECHECK).await;
        assert_eq!(clears.trusted(), None, "down, read too long ago");
        clears.take(Some(state(5)), clears.bus_state(), Some(Instant::now()));
        clears.bus_changed(true);
        assert_eq!(clears.trusted(), None, "read before the subscription");
        clears.take(Some(state(5)), clears.bus_state(), Some(Instant::now()));
        tokio::time::advance(RECHECK * 10).await;
        assert_eq!(clears.trusted(), Some(Some(state(5))), "read while up");
        // Heard: newer; a read sent before it does not take it back.
        let sent = Instant::now();
        clears.heard(&state(6).encode());
        clears.take(Some(state(5)), clears.bus_state(), Some(sent));
        assert_eq!(clears.trusted(), Some(Some(state(6))));
        // (Still trusted for RECHECK from that read if the bus drops: no
        // clear made since can have returned.)
        tokio::time::advance(RECHECK).await;
        clears.bus_changed(false);
        assert_eq!(clears.trusted(), None, "the bus dropped");
        assert_eq!(clears.last(), Some(state(6)));
    }

    /// Reads that ran beside each other (one could not wait for the lock):
    /// one sent earlier and answered later does not take back what a later
    /// read or a pin found.
    #[tokio::test(start_paused = true)]
    async fn an_earlier_read_answered_later_takes_nothing_back() {
        let clears = Clears::default();
        clears.bus_changed(true);
        let bus = clears.bus_state();
        let early = Instant::now();
        tokio::time::advance(Duration::from_millis(5)).await;
        clears.take(Some(state(7)), bus, Some(Instant::now()));
        assert_eq!(
            clears.take(Some(state(6)), bus, Some(early)),
            Some(state(7))
        );
        assert_eq!(clears.take(None, bus, Some(early)), Some(state(7)));
        assert_eq!(clears.trusted(), Some(Some(state(7))));
        // A pin counts from its answer: a read sent while it was in the
        // air may have missed it.
        let pin_sent = Instant::now();
        tokio::time::advance(Duration::from_millis(5)).await;
        let during = Instant::now();
        tokio::time::advance(Duration::from_millis(5)).await;
        clears.take_landed(Some(state(8)), bus, Some(pin_sent), Some(Instant::now()));
        assert_eq!(
            clears.take(Some(state(7)), bus, Some(during)),
            Some(state(8))
        );
        // A read sent after it is taken as ever.
        tokio::time::advance(Duration::from_millis(1)).await;
        assert_eq!(
            clears.take(Some(state(9)), bus, Some(Instant::now())),
            Some(state(9))
        );
    }
}
