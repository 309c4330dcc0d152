//! Keys, so that no two user keys share a record and every record of one
//! user key (its value, its lease) lands in one Redis Cluster slot: the
//! storage key `<key_prefix><namespace>:v:{<key>}` (or `{#<hash>}<key>`
//! for a key with braces of its own), its lease key (`:l:` for `:v:`), and
//! the way back from a storage key to the user's key (L1 is keyed by it).

use crate::store::fnv1a;

/// The user's key inside a storage key built by [`Cache::storage_key`](crate::Cache::storage_key)
/// whose namespace prefix is `prefix_len` bytes: `{<key>}` (such a key has
/// no braces of its own) or `{#<16 hex digits>}<key>` (one that has).
pub(crate) fn user_key(storage_key: &[u8], prefix_len: usize) -> &[u8] {
    let tagged = storage_key.get(prefix_len..).unwrap_or_default();
    // In the plain form a `}` can only be the last byte; here it is not.
    if tagged.len() > HASH_TAG_LEN && tagged.starts_with(b"{#") && tagged[HASH_TAG_LEN - 1] == b'}'
    {
        return &tagged[HASH_TAG_LEN..];
    }
    tagged
        .strip_prefix(b"{")
        .and_then(|t| t.strip_suffix(b"}"))
        .unwrap_or(tagged)
}

/// `<prefix>{<key>}`, or `<prefix>{#<16 hex digits>}<key>` when the key
/// has a brace of its own: the key in a Redis Cluster hash tag of its own
/// (a storage key, a tag's counter).
pub(crate) fn hash_tagged(prefix: &[u8], key: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(prefix.len() + key.len() + HASH_TAG_ROOM);
    hash_tagged_into(&mut out, prefix, key);
    out
}

/// [`hash_tagged`], appended to `out`.
pub(crate) fn hash_tagged_into(out: &mut Vec<u8>, prefix: &[u8], key: &[u8]) {
    out.extend_from_slice(prefix);
    if key.iter().any(|b| matches!(b, b'{' | b'}')) {
        out.extend_from_slice(format!("{{#{:016x}}}", fnv1a(key)).as_bytes());
        out.extend_from_slice(key);
    } else {
        out.push(b'{');
        out.extend_from_slice(key);
        out.push(b'}');
    }
}

/// The most [`hash_tagged`] adds to a prefix and a key.
pub(crate) const HASH_TAG_ROOM: usize = HASH_TAG_LEN + 1;

/// The lease key of storage key `key` under a value prefix of
/// `prefix_len` bytes: the record marker `v` (the prefix ends in `:v:`)
/// replaced by `l`, so both share one hash tag.
pub(super) fn lease_key(key: &[u8], prefix_len: usize) -> Vec<u8> {
    let mut lease = key.to_vec();
    if let Some(marker) = lease.get_mut(prefix_len - 2) {
        *marker = b'l';
    }
    lease
}

/// `{#` + 16 hex digits + `}`.
const HASH_TAG_LEN: usize = 19;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Cache;
    use crate::log_limit::show_key;
    use proptest::prelude::*;

    proptest! {
        /// L1 is keyed by the user's key and the bus carries storage keys:
        /// every storage key must give its user key back.
        #[test]
        fn user_key_inverts_storage_key(key in proptest::collection::vec(any::<u8>(), 1..64)) {
            let cache = Cache::<u8>::builder().namespace("ns").build().unwrap();
            let storage = cache.storage_key(&key).unwrap();
            prop_assert_eq!(user_key(&storage, cache.inner.value_prefix.len()), &key[..]);
        }
    }

    #[test]
    fn user_key_of_look_alike_keys() {
        let cache = Cache::<u8>::builder().namespace("ns").build().unwrap();
        let prefix = cache.inner.value_prefix.len();
        for key in [
            &b"#0123456789abcdef"[..],
            b"{#0123456789abcdef}x",
            b"}",
            b"{",
            b"#",
        ] {
            let storage = cache.storage_key(key).unwrap();
            assert_eq!(user_key(&storage, prefix), key, "{}", show_key(&storage));
        }
    }
}
