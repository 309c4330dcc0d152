//! The lease index: a Redis set of the live leases' keys, one per
//! namespace (on a cluster, one per namespace and hash slot), beside the
//! lease keys themselves.
//!
//! A lease holds only while its key holds the holder's token **and** the
//! index names it. So a load in flight is revoked either way: by deleting
//! its lease key (the single-key writes, `invalidate`, `expire_entry`) or
//! by taking it off the index. A bulk write revokes its keys' leases with
//! one `SREM` of the index per batch: the index is small (the loads in
//! flight), where a `DEL` of a lease key per written key looked each one
//! up in the whole keyspace, a third of the server's time for a
//! `set_many` (measured: 1.65 against 1.25 µs of `redis-server` CPU per
//! key for the bare `SET PX`s; with the `SREM`, 1.33).
//!
//! The index forgets safely: an index that is evicted, expired or
//! overwritten with another Redis type names no lease, so every load in
//! flight under it is refused its write (its holder releases the lease and
//! tells its waiters, who take over): a lost index never validates a write.
//! Taking a lease adds it to the index and makes the index live at least
//! as long as the lease (`PEXPIRE`; extending a lease does the same); a
//! lease the index does not name is free to take (it was revoked, or its
//! index was lost), so a revoked holder's lease does not hold others up.
//! Members whose lease key is gone (a holder that died, a lease deleted by
//! a single-key write) are swept a few at a time by the lease scripts, and
//! all of them go with the index's TTL once no loads run.
//!
//! Earlier builds know no index: during a rolling deploy from one, this
//! build takes over their leases (a second load of such a key) and its
//! bulk writes do not revoke their loads in flight (such a load may land
//! after a `set_many` of its key; the single-key writes still revoke it).
//!
//! The key: a lease key in the cache's shape (`<prefix><namespace>:l:{…}`,
//! the prefix and namespace free of braces) has its index at
//! `<prefix><namespace>:i:` on one server, `<prefix><namespace>:i:{<tag>}`
//! on a cluster, where `<tag>` is a short string whose hash slot is the
//! lease's ([`SLOT_TAGS`]). Any other lease key (the `Store` API takes any)
//! has an index of its own on one server (`<lease>:i`), or its slot's
//! `{<tag>}:i` on a cluster.

use std::sync::LazyLock;

use super::connection::hash_slot;
use super::slots::SLOTS;

/// For each hash slot, the shortest decimal number (as digits) whose CRC16
/// lands in it: a hash tag that puts a key in that slot. Found by counting
/// up until every slot has one (about 170,000 numbers, a few ms, once).
static SLOT_TAGS: LazyLock<Vec<Box<[u8]>>> = LazyLock::new(|| {
    let mut tags: Vec<Option<Box<[u8]>>> = vec![None; usize::from(SLOTS)];
    let mut left = tags.len();
    let mut n: u64 = 0;
    while left > 0 {
        let digits = n.to_string().into_bytes();
        let slot = usize::from(hash_slot(&digits));
        if tags[slot].is_none() {
            tags[slot] = Some(digits.into_boxed_slice());
            left -= 1;
        }
        n += 1;
    }
    tags.into_iter().flatten().collect()
});

/// Writes the index key of `lease` into `out` (cleared first); `cluster`:
/// the store is a Redis Cluster (one index per hash slot).
pub(super) fn index_key_into(out: &mut Vec<u8>, lease: &[u8], cluster: bool) {
    out.clear();
    let shaped = lease
        .iter()
        .position(|&b| b == b'{')
        .filter(|&open| open >= 2 && &lease[open - 2..open] == b"l:");
    match (shaped, cluster) {
        (Some(open), false) => {
            out.extend_from_slice(&lease[..open - 2]);
            out.extend_from_slice(b"i:");
        }
        (Some(open), true) => {
            out.extend_from_slice(&lease[..open - 2]);
            out.extend_from_slice(b"i:{");
            out.extend_from_slice(&SLOT_TAGS[usize::from(hash_slot(lease))]);
            out.push(b'}');
        }
        (None, false) => {
            out.extend_from_slice(lease);
            out.extend_from_slice(b":i");
        }
        (None, true) => {
            out.push(b'{');
            out.extend_from_slice(&SLOT_TAGS[usize::from(hash_slot(lease))]);
            out.extend_from_slice(b"}:i");
        }
    }
}

/// [`index_key_into`], as a new key.
pub(super) fn index_key(lease: &[u8], cluster: bool) -> Vec<u8> {
    let mut out = Vec::with_capacity(lease.len() + 8);
    index_key_into(&mut out, lease, cluster);
    out
}

/// The positions `group` of the lease keys `lease(i)` in runs of one
/// index each, in order, with that index: one run unless the leases come
/// from several namespaces (or, on a cluster, several slots).
pub(super) fn runs_by_index<'a>(
    lease: impl Fn(usize) -> &'a [u8],
    group: &[usize],
    cluster: bool,
) -> Vec<(Vec<u8>, Vec<usize>)> {
    let mut runs: Vec<(Vec<u8>, Vec<usize>)> = Vec::new();
    let mut index = Vec::new();
    for &i in group {
        index_key_into(&mut index, lease(i), cluster);
        match runs.last_mut() {
            Some((last, run)) if *last == index => run.push(i),
            _ => runs.push((index.clone(), vec![i])),
        }
    }
    runs
}

/// Adds to `tx` what takes the leases `lease(i)` at the positions `group`
/// off their index: one [`srem`] per index (see [`runs_by_index`]).
pub(super) fn unlist<'a>(
    tx: &mut redis::Pipeline,
    lease: impl Fn(usize) -> &'a [u8],
    group: &[usize],
    cluster: bool,
) {
    for (index, run) in runs_by_index(&lease, group, cluster) {
        tx.add_command(srem(&index, run.iter().map(|&i| lease(i))))
            .ignore();
    }
}

/// `SREM index lease…`: `leases` taken off `index`, the command sized up
/// front (grown argument by argument, it took a reallocation or two per
/// key).
pub(super) fn srem<'a>(index: &[u8], leases: impl Iterator<Item = &'a [u8]> + Clone) -> redis::Cmd {
    let (count, bytes) = leases
        .clone()
        .fold((0, 0), |(n, b), lease| (n + 1, b + lease.len()));
    let mut srem = redis::Cmd::with_capacity(count + 2, 4 + index.len() + bytes);
    srem.arg("SREM").arg(index);
    for lease in leases {
        srem.arg(lease);
    }
    srem
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_slot_has_a_tag_that_lands_in_it() {
        for (slot, tag) in SLOT_TAGS.iter().enumerate() {
            assert_eq!(usize::from(hash_slot(tag)), slot);
            assert!(tag.len() <= 7, "tag {tag:?} is long");
        }
    }

    #[test]
    fn a_cache_lease_shares_its_index_with_its_namespace() {
        assert_eq!(index_key(b"bw:ns:l:{a}", false), b"bw:ns:i:");
        assert_eq!(
            index_key(b"bw:ns@2:l:{#0011223344556677}{x}", false),
            b"bw:ns@2:i:"
        );
        for lease in [&b"bw:ns:l:{user:1}"[..], b"bw:ns:l:{#0011223344556677}a{b}"] {
            let index = index_key(lease, true);
            assert!(index.starts_with(b"bw:ns:i:{"));
            assert_eq!(hash_slot(&index), hash_slot(lease));
        }
    }

    #[test]
    fn any_other_lease_key_gets_an_index_in_its_slot() {
        for lease in [&b"lease"[..], b"a}b", b"{}x", b"x{y", b"{t}l:{u}", b"l:{"] {
            assert_eq!(hash_slot(&index_key(lease, true)), hash_slot(lease));
            assert_ne!(index_key(lease, false), lease);
        }
    }
}
