//! Which primary serves which hash slot, as a cluster's `CLUSTER SLOTS`
//! last said: what groups a cluster's bulk writes per node (see `plain`).
//!
//! Only a grouping: the commands are still routed by the cluster
//! connection's own map. A stale grouping costs a step redirected and
//! written again per slot, never a wrong write, so the map is asked for
//! again only when a step was refused, at most once per
//! [`REFRESH_EVERY`].

use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::Value;
use tokio::time::Instant;

/// Hash slots in a Redis Cluster.
pub(super) const SLOTS: u16 = 16_384;

/// The least time between two `CLUSTER SLOTS` asked by one store.
const REFRESH_EVERY: Duration = Duration::from_secs(1);

/// A slot no primary was named for.
pub(super) const UNKNOWN: u16 = u16::MAX;

/// For each hash slot, the number of the primary serving it (in the order
/// `CLUSTER SLOTS` named them), or [`UNKNOWN`].
pub(super) type Nodes = Arc<[u16]>;

/// The slot map of one store, and when it was last asked for.
#[derive(Debug, Default)]
pub(super) struct SlotMap {
    state: Mutex<State>,
    /// Held while `CLUSTER SLOTS` is asked: a caller that knows no map
    /// waits for the one asking (within that call's deadline) rather than
    /// writing per slot.
    pub(super) asking: tokio::sync::Mutex<()>,
}

#[derive(Debug, Default)]
struct State {
    nodes: Option<Nodes>,
    /// A step found the map wrong: ask again (once [`REFRESH_EVERY`] has
    /// passed since the last time).
    stale: bool,
    asked: Option<Instant>,
}

impl State {
    fn due(&self) -> bool {
        (self.nodes.is_none() || self.stale)
            && self
                .asked
                .is_none_or(|asked| asked.elapsed() >= REFRESH_EVERY)
    }
}

impl SlotMap {
    /// The map, and whether it should be asked for now: none known, or
    /// found stale, and none asked for within [`REFRESH_EVERY`].
    pub(super) fn current(&self) -> (Option<Nodes>, bool) {
        let state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        (state.nodes.clone(), state.due())
    }

    /// Whether the caller should ask for the map now; if so, it is noted
    /// as asked (others go on with what is known, or wait for it) once the
    /// returned ask is [`done`](Ask::done): an ask dropped before it was
    /// answered (its caller went away) leaves the map due.
    pub(super) fn begin_ask(&self) -> Option<Ask<'_>> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if !state.due() {
            return None;
        }
        let previous = state.asked.replace(Instant::now());
        Some(Ask {
            map: self,
            previous,
            done: false,
        })
    }

    /// A step was refused or redirected: the map may be stale.
    pub(super) fn suspect(&self) {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).stale = true;
    }

    /// Takes what `CLUSTER SLOTS` answered; a reply it cannot read leaves
    /// the map as it was. The map it holds then.
    pub(super) fn learn(&self, reply: &Value) -> Option<Nodes> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(nodes) = parse(reply) {
            state.nodes = Some(nodes);
            state.stale = false;
        }
        state.nodes.clone()
    }
}

/// `CLUSTER SLOTS` being asked; see [`SlotMap::begin_ask`].
pub(super) struct Ask<'a> {
    map: &'a SlotMap,
    previous: Option<Instant>,
    done: bool,
}

impl Ask<'_> {
    /// Answered (or failed): the next ask waits [`REFRESH_EVERY`].
    pub(super) fn done(mut self) {
        self.done = true;
    }
}

impl Drop for Ask<'_> {
    fn drop(&mut self) {
        if !self.done {
            let mut state = self.map.state.lock().unwrap_or_else(|p| p.into_inner());
            state.asked = self.previous;
        }
    }
}

/// A `CLUSTER SLOTS` reply as a map: each entry is `[start, end, [host,
/// port, id, …], replicas…]`; a primary is known by its node id (by its
/// host and port from a server that names none). A host may be nil (an
/// unknown endpoint): only the grouping is taken from here.
fn parse(reply: &Value) -> Option<Nodes> {
    let Value::Array(entries) = reply else {
        return None;
    };
    let mut nodes = vec![UNKNOWN; usize::from(SLOTS)];
    let mut primaries: Vec<Vec<u8>> = Vec::new();
    for entry in entries {
        let Value::Array(parts) = entry else {
            return None;
        };
        let [
            Value::Int(start),
            Value::Int(end),
            Value::Array(primary),
            ..,
        ] = parts.as_slice()
        else {
            return None;
        };
        let identity = match primary.as_slice() {
            [_, _, Value::BulkString(id), ..] if !id.is_empty() => id.clone(),
            [host, Value::Int(port), ..] => {
                let mut named = match host {
                    Value::BulkString(host) => host.clone(),
                    Value::SimpleString(host) => host.clone().into_bytes(),
                    Value::Nil => Vec::new(),
                    _ => return None,
                };
                named.extend_from_slice(format!(":{port}").as_bytes());
                named
            }
            _ => return None,
        };
        let number = match primaries.iter().position(|p| *p == identity) {
            Some(at) => at,
            None => {
                primaries.push(identity);
                primaries.len() - 1
            }
        };
        let number = u16::try_from(number).ok().filter(|&n| n != UNKNOWN)?;
        let (start, end) = (usize::try_from(*start).ok()?, usize::try_from(*end).ok()?);
        if start > end || end >= nodes.len() {
            return None;
        }
        nodes[start..=end].fill(number);
    }
    Some(nodes.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(start: i64, end: i64, port: i64) -> Value {
        Value::Array(vec![
            Value::Int(start),
            Value::Int(end),
            Value::Array(vec![
                Value::BulkString(b"127.0.0.1".to_vec()),
                Value::Int(port),
                Value::BulkString(format!("id-{port}").into_bytes()),
            ]),
            Value::Array(vec![
                Value::BulkString(b"127.0.0.1".to_vec()),
                Value::Int(port + 100),
            ]),
        ])
    }

    #[test]
    fn slots_map_to_their_primary() {
        let reply = Value::Array(vec![
            entry(0, 5460, 7000),
            entry(10923, 16383, 7002),
            entry(5461, 10922, 7001),
            entry(100, 100, 7002),
        ]);
        let nodes = parse(&reply).expect("parsed");
        assert_eq!(nodes[0], 0);
        assert_eq!(nodes[5460], 0);
        assert_eq!(nodes[100], 1);
        assert_eq!(nodes[5461], 2);
        assert_eq!(nodes[16383], 1);
    }

    #[test]
    fn primaries_are_told_apart_by_id_and_a_nil_host_is_taken() {
        let no_id = |start: i64, end: i64, host: Value, port: i64| {
            Value::Array(vec![
                Value::Int(start),
                Value::Int(end),
                Value::Array(vec![host, Value::Int(port)]),
            ])
        };
        let reply = Value::Array(vec![
            no_id(0, 9, Value::Nil, 7000),
            no_id(10, 19, Value::BulkString(b"10.0.0.2".to_vec()), 7000),
            no_id(20, 29, Value::Nil, 7000),
        ]);
        let nodes = parse(&reply).expect("parsed");
        assert_eq!((nodes[0], nodes[10], nodes[20]), (0, 1, 0));
        // Two primaries behind one address, told apart by their ids.
        let same_address = Value::Array(vec![entry(0, 9, 7000), entry(10, 19, 7000)]);
        let mut other = same_address.clone();
        if let Value::Array(entries) = &mut other
            && let Value::Array(parts) = &mut entries[1]
            && let Value::Array(primary) = &mut parts[2]
        {
            primary[2] = Value::BulkString(b"another".to_vec());
        }
        assert_eq!(parse(&same_address).expect("parsed")[10], 0);
        assert_eq!(parse(&other).expect("parsed")[10], 1);
    }

    #[test]
    fn an_uncovered_slot_is_unknown_and_a_foreign_reply_is_not_taken() {
        let nodes = parse(&Value::Array(vec![entry(0, 10, 7000)])).expect("parsed");
        assert_eq!(nodes[11], UNKNOWN);
        assert!(parse(&Value::Nil).is_none());
        assert!(parse(&Value::Array(vec![entry(0, 20000, 7000)])).is_none());
        assert!(parse(&Value::Array(vec![Value::Int(3)])).is_none());
        let map = SlotMap::default();
        assert!(map.learn(&Value::Nil).is_none());
        assert_eq!(map.current(), (None, true));
        map.begin_ask().expect("due").done();
        assert_eq!(map.current(), (None, false), "asked once a second");
        assert!(map.begin_ask().is_none());
    }

    #[test]
    fn an_ask_dropped_unanswered_leaves_the_map_due() {
        let map = SlotMap::default();
        let ask = map.begin_ask().expect("due");
        assert_eq!(map.current(), (None, false), "being asked");
        drop(ask);
        assert_eq!(map.current(), (None, true));
        assert!(map.begin_ask().is_some());
    }
}
