//! The soak's checker: the coherence properties, judged on every read the
//! workers report against every write the database made and every
//! announcement (invalidation, tag invalidation, hard clear, expire) a
//! worker saw acknowledged.
//!
//! # What counts as a violation
//!
//! Every write of the soak's database gets the next number of one
//! sequence (`seq`), and a row's value *is* the `seq` of its last write,
//! so a read's value says which write it comes from. A worker announces a
//! write to the cache after the database took it, and reports the moment
//! the cache acknowledged the announcement (`a`). A read (`r`) reports
//! when it began and what it got. Then, for a read of key `k` that began
//! after an acknowledgement covering `k` (by the same process: strictly
//! after; by another process: more than [`Checker::allowance`] after,
//! the documented bound of another process's L1 and bus):
//!
//! - **hard** (`invalidate`, `invalidate_tag`, a hard `clear`): the read
//!   must not return anything older than that write. If the write left the
//!   row existing, "not found" is older, unless a later write deleted it.
//! - **soft** (`expire` after the row was created): the read must not say
//!   "not found" (a cached "not found" is never served stale), unless a
//!   later write deleted the row. Stale values are allowed: that is what
//!   `expire` is for.
//!
//! Reads are judged once [`Checker::settle`] has passed since they began,
//! so every acknowledgement that could precede them has arrived (each
//! worker writes its lines as they happen).

use std::collections::{HashMap, VecDeque};
use std::fmt;

/// Which keys one database write touched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scope {
    /// One row.
    Key(u32),
    /// Every row of a group (the rows a tag names).
    Group(u32),
    /// Every row.
    All,
}

/// How an acknowledged write was announced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Invalidated: nothing older may be served after it.
    Hard,
    /// Expired: stale values may be served, "not found" may not.
    Soft,
}

/// One read a worker reported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Read {
    /// The worker process (its incarnation: a restarted worker is another).
    pub(crate) worker: u32,
    /// The row.
    pub(crate) key: u32,
    /// When the call began, µs since the Unix epoch.
    pub(crate) began_us: u64,
    /// What it got: the `seq` of the value, or `None` for "not found".
    pub(crate) value: Option<u64>,
    /// How it was served (the cache's label).
    pub(crate) served: String,
}

/// An acknowledgement of one write's announcement.
#[derive(Debug, Clone, Copy)]
struct Ack {
    worker: u32,
    at_us: u64,
    seq: u64,
    /// Whether the row existed after that write.
    exists: bool,
    mode: Mode,
}

/// One violation, with what was read and what had been acknowledged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Violation {
    /// The read.
    pub(crate) read: Read,
    /// The acknowledged write it contradicts: its `seq`.
    pub(crate) seq: u64,
    /// Who acknowledged it, and when (µs since the Unix epoch).
    pub(crate) acked_by: u32,
    /// When it was acknowledged.
    pub(crate) acked_us: u64,
    /// How it was announced.
    pub(crate) mode: Mode,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let got = self
            .read
            .value
            .map_or_else(|| "not found".to_owned(), |v| format!("seq {v}"));
        let how = match self.mode {
            Mode::Hard => "invalidation",
            Mode::Soft => "expire of a created row",
        };
        write!(
            f,
            "key {} read by worker {} {} ms after the {how} of seq {} (acknowledged by worker {}) got {got} ({})",
            self.read.key,
            self.read.worker,
            self.read.began_us.saturating_sub(self.acked_us) / 1000,
            self.seq,
            self.acked_by,
            self.read.served,
        )
    }
}

/// Every row's writes, as (seq, exists after), in seq order.
#[derive(Debug, Default)]
struct Row {
    writes: Vec<(u64, bool)>,
    acks: Vec<Ack>,
}

impl Row {
    /// Whether the row existed right after write `seq`.
    fn exists_at(&self, seq: u64) -> Option<bool> {
        let at = self.writes.partition_point(|&(s, _)| s < seq);
        self.writes.get(at).filter(|w| w.0 == seq).map(|w| w.1)
    }

    /// Whether a write after `seq` deleted the row.
    fn deleted_after(&self, seq: u64) -> bool {
        self.writes.iter().any(|&(s, exists)| s > seq && !exists)
    }
}

/// The checker: the database's writes, the acknowledgements, the reads
/// waiting to be judged, and the violations found.
#[derive(Debug)]
pub(crate) struct Checker {
    rows: Vec<Row>,
    groups: u32,
    scopes: HashMap<u64, Scope>,
    pending: VecDeque<Read>,
    allowance_us: u64,
    settle_us: u64,
    checked: u64,
    violations: Vec<Violation>,
}

impl Checker {
    /// A checker for `rows` rows in `groups` groups (row `k` is in group
    /// `k % groups`), with the allowance another process gets and the time
    /// a read waits to be judged, in µs.
    pub(crate) fn new(rows: u32, groups: u32, allowance_us: u64, settle_us: u64) -> Self {
        Checker {
            rows: (0..rows).map(|_| Row::default()).collect(),
            groups: groups.max(1),
            scopes: HashMap::new(),
            pending: VecDeque::new(),
            allowance_us,
            settle_us,
            checked: 0,
            violations: Vec::new(),
        }
    }

    /// The database wrote `seq` over `scope`; `exists(k)` says whether
    /// row `k` exists after it.
    pub(crate) fn wrote(&mut self, seq: u64, scope: Scope, exists: impl Fn(u32) -> bool) {
        self.scopes.insert(seq, scope);
        for key in self.keys_of(scope) {
            if let Some(row) = self.rows.get_mut(key as usize) {
                row.writes.push((seq, exists(key)));
            }
        }
    }

    /// Worker `worker` saw the announcement of write `seq` acknowledged at
    /// `at_us`. An unknown `seq` (a worker's line garbled, or from before
    /// this run) is ignored and reported as `false`.
    pub(crate) fn acked(&mut self, worker: u32, seq: u64, at_us: u64, mode: Mode) -> bool {
        let Some(&scope) = self.scopes.get(&seq) else {
            return false;
        };
        for key in self.keys_of(scope) {
            let Some(row) = self.rows.get_mut(key as usize) else {
                continue;
            };
            let Some(exists) = row.exists_at(seq) else {
                continue;
            };
            row.acks.push(Ack {
                worker,
                at_us,
                seq,
                exists,
                mode,
            });
        }
        true
    }

    /// A read to judge once it has settled.
    pub(crate) fn read(&mut self, read: Read) {
        self.pending.push_back(read);
    }

    /// Judges every read that began `settle` or longer before `now_us`
    /// (all of them with `now_us = u64::MAX`).
    pub(crate) fn judge(&mut self, now_us: u64) {
        while let Some(read) = self.pending.front() {
            if read.began_us.saturating_add(self.settle_us) > now_us {
                break;
            }
            let Some(read) = self.pending.pop_front() else {
                break;
            };
            self.checked += 1;
            if let Some(violation) = self.judge_one(read) {
                self.violations.push(violation);
            }
        }
    }

    fn judge_one(&self, read: Read) -> Option<Violation> {
        let row = self.rows.get(read.key as usize)?;
        let mut hard: Option<&Ack> = None;
        let mut soft: Option<&Ack> = None;
        for ack in &row.acks {
            let allowance = if ack.worker == read.worker {
                0
            } else {
                self.allowance_us
            };
            if ack.at_us.saturating_add(allowance) >= read.began_us {
                continue;
            }
            let best = match ack.mode {
                Mode::Hard => &mut hard,
                Mode::Soft => &mut soft,
            };
            if best.is_none_or(|b| b.seq < ack.seq) {
                *best = Some(ack);
            }
        }
        let wrong = |ack: &Ack| match (ack.mode, read.value) {
            (Mode::Hard, Some(v)) => v < ack.seq,
            (_, None) => ack.exists && !row.deleted_after(ack.seq),
            (Mode::Soft, Some(_)) => false,
        };
        [hard, soft]
            .into_iter()
            .flatten()
            .find(|ack| wrong(ack))
            .map(|ack| Violation {
                seq: ack.seq,
                acked_by: ack.worker,
                acked_us: ack.at_us,
                mode: ack.mode,
                read: read.clone(),
            })
    }

    /// Reads judged so far.
    pub(crate) fn checked(&self) -> u64 {
        self.checked
    }

    /// The violations found so far.
    pub(crate) fn violations(&self) -> &[Violation] {
        &self.violations
    }

    fn keys_of(&self, scope: Scope) -> Vec<u32> {
        let rows = self.rows.len() as u32;
        match scope {
            Scope::Key(k) => vec![k],
            Scope::Group(g) => (g..rows).step_by(self.groups as usize).collect(),
            Scope::All => (0..rows).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(worker: u32, key: u32, began_us: u64, value: Option<u64>) -> Read {
        Read {
            worker,
            key,
            began_us,
            value,
            served: "hit".to_owned(),
        }
    }

    /// Rows 0..4 in 2 groups; row 0 written as seq 1 (exists).
    fn checker() -> Checker {
        let mut c = Checker::new(4, 2, 1_000, 10);
        c.wrote(1, Scope::Key(0), |_| true);
        c
    }

    fn judged(mut c: Checker, reads: Vec<Read>) -> Vec<Violation> {
        for r in reads {
            c.read(r);
        }
        c.judge(u64::MAX);
        c.violations().to_vec()
    }

    #[test]
    fn an_older_value_after_an_acknowledged_invalidation_is_a_violation() {
        let mut c = checker();
        c.wrote(2, Scope::Key(0), |_| true);
        assert!(c.acked(7, 2, 100, Mode::Hard));
        let found = judged(
            c,
            vec![
                read(7, 0, 99, Some(1)),    // began before: fine
                read(7, 0, 101, Some(2)),   // new value: fine
                read(7, 0, 101, Some(1)),   // same process, after: violation
                read(8, 0, 500, Some(1)),   // another process, within allowance
                read(8, 0, 1_101, Some(1)), // another process, past it
            ],
        );
        assert_eq!(found.len(), 2, "{found:?}");
        assert_eq!((found[0].read.worker, found[0].seq), (7, 2));
        assert_eq!(found[1].read.worker, 8);
    }

    #[test]
    fn not_found_after_a_create_is_a_violation_unless_deleted_later() {
        let mut c = checker();
        c.wrote(2, Scope::Key(1), |_| true);
        c.acked(7, 2, 100, Mode::Soft);
        c.wrote(3, Scope::Key(2), |_| true);
        c.acked(7, 3, 100, Mode::Soft);
        c.wrote(4, Scope::Key(2), |_| false);
        let found = judged(
            c,
            vec![
                read(7, 1, 200, None),    // created and expired: violation
                read(7, 1, 200, Some(1)), // a stale value: fine after expire
                read(7, 2, 200, None),    // deleted since: fine
            ],
        );
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!((found[0].read.key, found[0].mode), (1, Mode::Soft));
    }

    #[test]
    fn tags_and_clears_cover_their_rows_and_deletes_allow_not_found() {
        let mut c = checker();
        c.wrote(2, Scope::Group(1), |k| k != 3); // rows 1, 3
        c.acked(5, 2, 100, Mode::Hard);
        c.wrote(3, Scope::All, |k| k != 2);
        c.acked(5, 3, 200, Mode::Hard);
        let found = judged(
            c,
            vec![
                read(5, 1, 150, Some(1)), // older than the tag's write
                read(5, 3, 150, None),    // row 3 does not exist: fine
                read(5, 0, 150, Some(1)), // group 0, before the clear: fine
                read(5, 0, 250, Some(1)), // after the clear: violation
                read(5, 2, 250, None),    // absent after the clear: fine
                read(5, 2, 250, Some(3)), // its value: fine
            ],
        );
        let keys: Vec<u32> = found.iter().map(|v| v.read.key).collect();
        assert_eq!(keys, [1, 0], "{found:?}");
    }

    #[test]
    fn reads_wait_to_settle_and_unknown_writes_are_ignored() {
        let mut c = checker();
        assert!(!c.acked(1, 99, 5, Mode::Hard));
        c.read(read(1, 0, 100, Some(1)));
        c.judge(105);
        assert_eq!(c.checked(), 0);
        c.judge(110);
        assert_eq!(c.checked(), 1);
        assert!(c.violations().is_empty());
    }
}
