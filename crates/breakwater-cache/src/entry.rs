//! The envelope stored in Redis under a cache key, so that corrupt, foreign
//! or future bytes are recognized as such and never decoded into a wrong
//! value.
//!
//! An entry is a small, versioned binary header followed by the payload (the
//! value serialized by its [`Codec`], possibly LZ4-compressed). Decoding never
//! panics and never guesses: unknown versions, codecs or flags, inconsistent
//! headers and corrupt or foreign bytes are all an [`EntryError`], which the
//! cache treats as a miss plus a warning.
//!
//! # Format version 1
//!
//! All integers are big-endian. Times are milliseconds on the store's clock
//! (Unix milliseconds as the store sees them).
//!
//! | Bytes    | Field          | Meaning                                                                 |
//! |----------|----------------|-------------------------------------------------------------------------|
//! | `0..2`   | magic          | `b"BW"`                                                                 |
//! | `2`      | version        | `1`                                                                     |
//! | `3`      | codec          | the codec id (`1` msgpack, `2` json)                                    |
//! | `4`      | flags          | bit 0 `NEGATIVE` (no value), bit 1 `COMPRESSED` (LZ4); others must be 0 |
//! | `5..13`  | `fresh_until`  | `u64`, fresh until this time                                            |
//! | `13..21` | `stale_until`  | `u64`, may be served stale until this time; `>= fresh_until`            |
//! | `21..25` | `load_ms`      | `u32`, how long the load that produced the entry took (for XFetch)      |
//! | `25..33` | `payload_len`  | `u64`, length of the *uncompressed* payload                             |
//! | `33..`   | body           | the raw payload, or its LZ4 block if `COMPRESSED`                       |
//!
//! Rules checked on decode:
//!
//! - a raw body must be exactly `payload_len` bytes, so a truncated entry is
//!   never read as a shorter payload;
//! - a compressed body must decompress to exactly `payload_len` bytes;
//!   `payload_len` is checked against the caller's cap (and against what the
//!   body could possibly expand to) before any memory is allocated;
//! - a `NEGATIVE` entry has `payload_len == 0`, no body and no `COMPRESSED`
//!   flag.
//!
//! There is no checksum: a byte flipped inside the payload is not detected
//! here (the codec usually rejects it when the value is read).
//!
//! # Format version 2: tagged entries
//!
//! An entry written with tags (see `Cache::invalidate_tag`) is version 2:
//! the version 1 header (with `2` in its version byte), then a tags block,
//! then the body. An entry without tags is always written as version 1, byte
//! for byte as before, so untagged entries cost nothing more to read.
//!
//! | Bytes           | Field          | Meaning                                                     |
//! |-----------------|----------------|-------------------------------------------------------------|
//! | `0..33`         | header         | as in version 1, version byte `2`                            |
//! | `33`            | `tag_count`    | `u8`, `1..=`[`MAX_TAGS`]                                      |
//! | then, per tag:  | `tag_len`      | `u16`, `0..=`[`MAX_TAG_LEN`] (0 bytes: the transition stamp) |
//! |                 | `tag`          | `tag_len` bytes, the tag as the application named it         |
//! |                 | `generation`   | `u64`, the tag's generation read before the value was loaded |
//! | after the tags  | body           | as in version 1                                               |
//!
//! Rules checked on decode, besides version 1's: `tag_count` is at least 1
//! (an entry without tags is version 1), every tag is within its bounds and
//! present in full, and no two tags are the same.
//!
//! # Extensions: flag bit 2
//!
//! An entry whose flags have bit 2 (`EXTENDED`) set carries an extension
//! block after the header (and after the tags block, in version 2), before
//! the body: `ext_count` (`u8`, at least 1), then per item `kind` (`u8`),
//! `len` (`u8`) and `len` bytes. Kinds (each at most once):
//!
//! | kind | item          | bytes                                                                 |
//! |------|---------------|-----------------------------------------------------------------------|
//! | `1`  | validator     | 1 to 255 bytes the loader gave ([`MAX_VALIDATOR_LEN`]): an ETag, a version, an `updated_at` |
//! | `2`  | grace         | 8 bytes, `u64` BE: the grace window (ms) the loader chose for this value, which readers use instead of their own |
//! | `3`  | namespace generation | 8 bytes, `u64` BE: the namespace's clear generation the value's load began under (see `store::namespace`); written by every write that found or pinned the namespace's clear record |
//!
//! An unknown kind is an error (an item this build cannot honour is never
//! skipped). An entry without extensions never sets the flag and is
//! written byte for byte as before; a build that predates the flag reads an
//! extended entry as a miss plus a warning (unknown flags).
//!
//! A tag of 0 bytes is no application tag (those are 1 to [`MAX_TAG_LEN`]
//! bytes) but the *transition stamp* of an entry written during a version
//! transition: its `generation` is the FNV-1a hash of the previous
//! version's entry the value was loaded beside (see `cache::transition`).
//! An entry has at most one, beside up to [`MAX_TAGS`] tags.

use std::fmt;
use std::num::NonZeroU64;

use serde::de::DeserializeOwned;

use crate::codec::{Codec, Compression};
use crate::error::{Error, ErrorKind};

const MAGIC: [u8; 2] = *b"BW";
const VERSION: u8 = 1;
/// The format version of an entry with tags.
const VERSION_TAGGED: u8 = 2;
/// The most tags one entry carries.
pub(crate) const MAX_TAGS: usize = 16;
/// The longest tag, in bytes.
pub(crate) const MAX_TAG_LEN: usize = 256;
const FLAG_NEGATIVE: u8 = 0b001;
const FLAG_COMPRESSED: u8 = 0b010;
/// An extension block follows the header (and the tags).
const FLAG_EXTENDED: u8 = 0b100;
const KNOWN_FLAGS: u8 = FLAG_NEGATIVE | FLAG_COMPRESSED | FLAG_EXTENDED;
/// The extension item holding a validator.
const EXT_VALIDATOR: u8 = 1;
/// The extension item holding the value's own grace window.
const EXT_GRACE: u8 = 2;
/// The extension item holding the namespace generation the value was
/// loaded under.
const EXT_NAMESPACE: u8 = 3;
/// The longest validator, in bytes.
pub(crate) const MAX_VALIDATOR_LEN: usize = 255;
/// No LZ4 block expands by more than this factor (a match-length extension
/// byte yields at most 255 output bytes), so a body of `n` bytes declaring
/// more than `n * 255` bytes is corrupt.
const LZ4_MAX_RATIO: usize = 255;

/// One cached value (or the cached absence of one) with its timing metadata.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Entry {
    /// The codec that serialized `payload`.
    pub(crate) codec: Codec,
    /// `true` if this entry records that the value does not exist.
    pub(crate) negative: bool,
    /// Store-clock milliseconds until which the entry is fresh.
    pub(crate) fresh_until: u64,
    /// Store-clock milliseconds until which the entry may be served stale.
    pub(crate) stale_until: u64,
    /// How long the load that produced the entry took, in milliseconds.
    pub(crate) load_ms: u32,
    /// The serialized value, never compressed; empty when `negative`.
    pub(crate) payload: Vec<u8>,
    /// The tags the entry was written with, each with the generation read
    /// before its value was loaded; empty for an untagged entry (format
    /// version 1).
    pub(crate) tags: Tags,
    /// What the extension block holds; nothing for most entries.
    pub(crate) extra: Extra,
}

/// An entry's extension items: the namespace generation, inline (every
/// entry written since pins records one, and a hit should not allocate for
/// it), and the rest boxed: none (a null pointer, as for [`Tags`]), or a
/// boxed set of them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Extra {
    boxed: Option<Box<Extras>>,
    /// The namespace's clear generation the value's load began under
    /// (never 0: generations start at `2^40`).
    namespace: Option<NonZeroU64>,
}

/// The boxed extension items of one entry.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Extras {
    /// The loader's validator (1 to [`MAX_VALIDATOR_LEN`] bytes).
    pub(crate) validator: Option<Box<[u8]>>,
    /// The grace window the loader chose for this value, in milliseconds.
    pub(crate) grace_ms: Option<u64>,
}

impl Extra {
    /// Extensions holding `validator` and the value's own grace window
    /// (`grace_ms`), if any.
    pub(crate) fn new(validator: Option<Box<[u8]>>, grace_ms: Option<u64>) -> Extra {
        let boxed = (validator.is_some() || grace_ms.is_some()).then(|| {
            Box::new(Extras {
                validator,
                grace_ms,
            })
        });
        Extra {
            boxed,
            namespace: None,
        }
    }

    /// These extensions, recording the namespace's clear generation
    /// `generation` (`None`, or 0, which no record has: nothing is
    /// recorded).
    pub(crate) fn in_namespace(mut self, generation: Option<u64>) -> Extra {
        if let Some(generation) = generation.and_then(NonZeroU64::new) {
            self.namespace = Some(generation);
        }
        self
    }

    /// Forgets the namespace's clear generation recorded (the entry is then
    /// judged as one that records none).
    pub(crate) fn forget_namespace(&mut self) {
        self.namespace = None;
    }

    /// The namespace's clear generation the value was loaded under, if
    /// one was recorded.
    pub(crate) fn namespace(&self) -> Option<u64> {
        self.namespace.map(NonZeroU64::get)
    }

    /// The validator, if the entry has one.
    pub(crate) fn validator(&self) -> Option<&[u8]> {
        self.boxed.as_ref()?.validator.as_deref()
    }

    /// The grace window the loader chose for the value, in milliseconds,
    /// if it chose one.
    pub(crate) fn grace_ms(&self) -> Option<u64> {
        self.boxed.as_ref()?.grace_ms
    }

    /// The encoded extension block: empty when there is nothing to say.
    fn encode(&self, out: &mut Vec<u8>) {
        let (validator, grace_ms) = match &self.boxed {
            Some(extras) => (extras.validator.as_deref(), extras.grace_ms),
            None => (None, None),
        };
        let namespace = self.namespace();
        let count = u8::from(validator.is_some())
            + u8::from(grace_ms.is_some())
            + u8::from(namespace.is_some());
        if count == 0 {
            return;
        }
        out.push(count);
        if let Some(validator) = validator {
            debug_assert!(!validator.is_empty() && validator.len() <= MAX_VALIDATOR_LEN);
            out.push(EXT_VALIDATOR);
            out.push(validator.len() as u8);
            out.extend_from_slice(validator);
        }
        for (kind, item) in [(EXT_GRACE, grace_ms), (EXT_NAMESPACE, namespace)] {
            if let Some(item) = item {
                out.push(kind);
                out.push(8);
                out.extend_from_slice(&item.to_be_bytes());
            }
        }
    }

    fn is_empty(&self) -> bool {
        self.namespace.is_none()
            && self
                .boxed
                .as_ref()
                .is_none_or(|e| e.validator.is_none() && e.grace_ms.is_none())
    }
}

/// An entry's tags: none (a null pointer, so an untagged entry, and every
/// future that holds one, grows little), or a boxed list.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Tags(Option<Box<[TagStamp]>>);

impl From<Vec<TagStamp>> for Tags {
    fn from(tags: Vec<TagStamp>) -> Self {
        Tags((!tags.is_empty()).then(|| tags.into_boxed_slice()))
    }
}

impl std::ops::Deref for Tags {
    type Target = [TagStamp];

    fn deref(&self) -> &[TagStamp] {
        self.0.as_deref().unwrap_or_default()
    }
}

/// One tag of an entry and the tag's generation when the value was loaded:
/// the entry is valid only while the tag's generation is still this one.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct TagStamp {
    /// The tag, as the application named it.
    pub(crate) tag: Vec<u8>,
    /// Its generation, read before the load.
    pub(crate) generation: u64,
}

impl Entry {
    /// Where its stale window ends, as every read judges it: a negative
    /// entry ("not found") is never servable stale, so its window ends
    /// with its fresh one, also once `expire`, `expire_tag` or a soft
    /// clear moved that earlier than it was sealed with.
    pub(crate) fn servable_until(&self) -> u64 {
        if self.negative {
            self.stale_until.min(self.fresh_until)
        } else {
            self.stale_until
        }
    }

    /// Length of the fixed header that precedes the body.
    pub(crate) const HEADER_LEN: usize = 33;

    /// Where the windows (`fresh_until`, `stale_until`) begin in the
    /// header.
    pub(crate) const WINDOWS_AT: usize = 5;

    /// The header's bytes from [`WINDOWS_AT`](Self::WINDOWS_AT) to its end
    /// (the windows, `load_ms`, `payload_len`), as [`encode`](Self::encode)
    /// writes them: what a renewal expects to find stored.
    pub(crate) fn header_tail(&self) -> [u8; Self::HEADER_LEN - Self::WINDOWS_AT] {
        let payload_len = if self.negative { 0 } else { self.payload.len() } as u64;
        let mut out = [0; Self::HEADER_LEN - Self::WINDOWS_AT];
        out[..8].copy_from_slice(&self.fresh_until.to_be_bytes());
        out[8..16].copy_from_slice(&self.stale_until.max(self.fresh_until).to_be_bytes());
        out[16..20].copy_from_slice(&self.load_ms.to_be_bytes());
        out[20..].copy_from_slice(&payload_len.to_be_bytes());
        out
    }

    /// The windows as the header holds them, written at
    /// [`WINDOWS_AT`](Self::WINDOWS_AT) by a renewal.
    pub(crate) fn windows_patch(fresh_until: u64, stale_until: u64) -> [u8; 16] {
        let mut out = [0; 16];
        out[..8].copy_from_slice(&fresh_until.to_be_bytes());
        out[8..].copy_from_slice(&stale_until.max(fresh_until).to_be_bytes());
        out
    }

    /// Encodes the entry for storage.
    ///
    /// The payload is compressed if `compression` asks for it at this size,
    /// the payload is not larger than the decompression cap (a compressed
    /// entry above the cap could never be read back), and compressing
    /// actually makes it smaller; otherwise it is stored raw.
    ///
    /// Encoding always produces bytes that [`Entry::decode`] accepts: a
    /// negative entry is written without a payload, and `stale_until` is
    /// raised to `fresh_until` if it is earlier.
    pub(crate) fn encode(&self, compression: &Compression) -> Vec<u8> {
        let payload: &[u8] = if self.negative { &[] } else { &self.payload };
        let compressed = if compression.should_compress(payload.len())
            && payload.len() <= compression.max_decompressed_len()
        {
            let block = lz4_flex::block::compress(payload);
            (block.len() < payload.len()).then_some(block)
        } else {
            None
        };

        let mut flags = 0;
        if self.negative {
            flags |= FLAG_NEGATIVE;
        }
        if compressed.is_some() {
            flags |= FLAG_COMPRESSED;
        }
        if !self.extra.is_empty() {
            flags |= FLAG_EXTENDED;
        }
        let body = compressed.as_deref().unwrap_or(payload);

        let tags_len: usize = self.tags.iter().map(|t| 2 + t.tag.len() + 8).sum();
        let tags_len = if self.tags.is_empty() {
            0
        } else {
            1 + tags_len
        };
        let mut out = Vec::with_capacity(Self::HEADER_LEN + tags_len + body.len());
        out.extend_from_slice(&MAGIC);
        out.push(if self.tags.is_empty() {
            VERSION
        } else {
            VERSION_TAGGED
        });
        out.push(self.codec.id());
        out.push(flags);
        out.extend_from_slice(&self.fresh_until.to_be_bytes());
        out.extend_from_slice(&self.stale_until.max(self.fresh_until).to_be_bytes());
        out.extend_from_slice(&self.load_ms.to_be_bytes());
        out.extend_from_slice(&(payload.len() as u64).to_be_bytes());
        if !self.tags.is_empty() {
            // Bounded by the cache (at most MAX_TAGS tags of at most
            // MAX_TAG_LEN bytes, checked when the call names them).
            debug_assert!(self.tags.len() <= MAX_TAGS + 1);
            out.push(self.tags.len() as u8);
            for stamp in self.tags.iter() {
                debug_assert!(stamp.tag.len() <= MAX_TAG_LEN);
                out.extend_from_slice(&(stamp.tag.len() as u16).to_be_bytes());
                out.extend_from_slice(&stamp.tag);
                out.extend_from_slice(&stamp.generation.to_be_bytes());
            }
        }
        self.extra.encode(&mut out);
        out.extend_from_slice(body);
        out
    }

    /// Decodes stored bytes. A compressed entry may not declare more than
    /// `max_decompressed` bytes of payload. A raw payload keeps the read's
    /// buffer (the header is cut off the front) instead of being copied.
    pub(crate) fn decode(bytes: Vec<u8>, max_decompressed: usize) -> Result<Entry, EntryError> {
        let len = bytes.len();
        let truncated = EntryError::Truncated { len };

        // Foreign bytes first: anything that does not start like an entry.
        let magic_len = len.min(MAGIC.len());
        if bytes.get(..magic_len) != MAGIC.get(..magic_len) {
            return Err(EntryError::BadMagic);
        }
        let mut rest = &bytes[..];
        let _magic: [u8; 2] = take(&mut rest).ok_or(truncated.clone())?;
        // The version before the length: another version may have another
        // header size.
        let [version] = take(&mut rest).ok_or(truncated.clone())?;
        if version != VERSION && version != VERSION_TAGGED {
            return Err(EntryError::UnsupportedVersion(version));
        }
        if len < Self::HEADER_LEN {
            return Err(truncated);
        }

        let [codec_id] = take(&mut rest).ok_or(truncated.clone())?;
        let codec = Codec::from_id(codec_id).ok_or(EntryError::UnknownCodec(codec_id))?;
        let [flags] = take(&mut rest).ok_or(truncated.clone())?;
        if flags & !KNOWN_FLAGS != 0 {
            return Err(EntryError::UnknownFlags(flags));
        }
        let fresh_until = u64::from_be_bytes(take(&mut rest).ok_or(truncated.clone())?);
        let stale_until = u64::from_be_bytes(take(&mut rest).ok_or(truncated.clone())?);
        let load_ms = u32::from_be_bytes(take(&mut rest).ok_or(truncated.clone())?);
        let payload_len = u64::from_be_bytes(take(&mut rest).ok_or(truncated)?);
        let tags = if version == VERSION_TAGGED {
            Tags::from(decode_tags(&mut rest)?)
        } else {
            Tags::default()
        };
        let extra = if flags & FLAG_EXTENDED != 0 {
            decode_extra(&mut rest)?
        } else {
            Extra::default()
        };
        let body_start = len - rest.len();
        let body_len = rest.len();

        if stale_until < fresh_until {
            return Err(EntryError::InvalidTimes {
                fresh_until,
                stale_until,
            });
        }
        let negative = flags & FLAG_NEGATIVE != 0;
        let compressed = flags & FLAG_COMPRESSED != 0;
        if negative && (compressed || payload_len != 0 || body_len != 0) {
            return Err(EntryError::NegativeWithPayload);
        }

        let payload = if compressed {
            decompress(&bytes[body_start..], payload_len, max_decompressed)?
        } else {
            if u64::try_from(body_len).ok() != Some(payload_len) {
                return Err(EntryError::PayloadLength {
                    declared: payload_len,
                    actual: body_len,
                });
            }
            let mut payload = bytes;
            payload.drain(..body_start);
            payload
        };

        Ok(Entry {
            codec,
            negative,
            fresh_until,
            stale_until,
            load_ms,
            payload,
            tags,
            extra,
        })
    }

    /// Deserializes the payload with the entry's codec.
    pub(crate) fn value<V: DeserializeOwned>(&self) -> Result<V, Error> {
        self.codec.decode(&self.payload)
    }
}

/// A version 2 entry's tags block, split off the front of `rest`.
fn decode_tags(rest: &mut &[u8]) -> Result<Vec<TagStamp>, EntryError> {
    let cut = || EntryError::BadTags("the tags block is cut short".to_owned());
    let [count] = take(rest).ok_or_else(cut)?;
    let count = usize::from(count);
    // Up to MAX_TAGS tags, and the transition stamp beside them.
    if count == 0 || count > MAX_TAGS + 1 {
        return Err(EntryError::BadTags(format!(
            "{count} tags, a tagged entry has 1 to {MAX_TAGS}"
        )));
    }
    let mut tags: Vec<TagStamp> = Vec::with_capacity(count);
    for _ in 0..count {
        let tag_len = usize::from(u16::from_be_bytes(take(rest).ok_or_else(cut)?));
        // A tag of 0 bytes is the transition stamp (see `cache::transition`).
        if tag_len > MAX_TAG_LEN {
            return Err(EntryError::BadTags(format!(
                "a tag of {tag_len} bytes, tags have 1 to {MAX_TAG_LEN}"
            )));
        }
        let (tag, after) = rest.split_at_checked(tag_len).ok_or_else(cut)?;
        *rest = after;
        let generation = u64::from_be_bytes(take(rest).ok_or_else(cut)?);
        if tags.iter().any(|t| t.tag == tag) {
            return Err(EntryError::BadTags("a tag appears twice".to_owned()));
        }
        tags.push(TagStamp {
            tag: tag.to_vec(),
            generation,
        });
    }
    if tags.iter().filter(|t| !t.tag.is_empty()).count() > MAX_TAGS {
        return Err(EntryError::BadTags(format!(
            "{count} tags, a tagged entry has 1 to {MAX_TAGS}"
        )));
    }
    Ok(tags)
}

/// An extended entry's extension block, split off the front of `rest`.
fn decode_extra(rest: &mut &[u8]) -> Result<Extra, EntryError> {
    let cut = || EntryError::BadExtension("the extension block is cut short".to_owned());
    let [count] = take(rest).ok_or_else(cut)?;
    if count == 0 {
        return Err(EntryError::BadExtension(
            "the extension flag is set with no item".to_owned(),
        ));
    }
    let mut extras = Extras::default();
    let mut namespace = None;
    for _ in 0..count {
        let [kind, len] = take(rest).ok_or_else(cut)?;
        let (item, after) = rest.split_at_checked(usize::from(len)).ok_or_else(cut)?;
        *rest = after;
        match kind {
            EXT_VALIDATOR if extras.validator.is_some() => {
                return Err(EntryError::BadExtension(
                    "a validator appears twice".to_owned(),
                ));
            }
            EXT_VALIDATOR if item.is_empty() => {
                return Err(EntryError::BadExtension("an empty validator".to_owned()));
            }
            EXT_VALIDATOR => extras.validator = Some(item.into()),
            EXT_GRACE | EXT_NAMESPACE => {
                let (name, slot) = match kind {
                    EXT_GRACE => ("a grace", &mut extras.grace_ms),
                    _ => ("a namespace generation", &mut namespace),
                };
                if slot.is_some() {
                    return Err(EntryError::BadExtension(format!("{name} appears twice")));
                }
                let bytes: [u8; 8] = item.try_into().map_err(|_| {
                    EntryError::BadExtension(format!("{name} of {} bytes, not 8", item.len()))
                })?;
                *slot = Some(u64::from_be_bytes(bytes));
            }
            other => {
                return Err(EntryError::BadExtension(format!(
                    "extension kind {other} is not known to this build"
                )));
            }
        }
    }
    if namespace == Some(0) {
        return Err(EntryError::BadExtension(
            "a namespace generation of 0, which no record has".to_owned(),
        ));
    }
    Ok(Extra::new(extras.validator, extras.grace_ms).in_namespace(namespace))
}

/// Splits `N` bytes off the front of `input`.
fn take<const N: usize>(input: &mut &[u8]) -> Option<[u8; N]> {
    let (head, rest) = input.split_first_chunk::<N>()?;
    *input = rest;
    Some(*head)
}

/// Decompresses an LZ4 block that must expand to exactly `declared` bytes,
/// checking `declared` before allocating.
fn decompress(body: &[u8], declared: u64, max: usize) -> Result<Vec<u8>, EntryError> {
    let declared = usize::try_from(declared).unwrap_or(usize::MAX);
    if declared > max {
        return Err(EntryError::TooLarge { declared, max });
    }
    if declared > body.len().saturating_mul(LZ4_MAX_RATIO) {
        return Err(EntryError::Decompress(format!(
            "{} compressed bytes cannot expand to the declared {declared} bytes",
            body.len()
        )));
    }
    let mut out = vec![0; declared];
    let written = lz4_flex::block::decompress_into(body, &mut out)
        .map_err(|e| EntryError::Decompress(e.to_string()))?;
    if written != declared {
        return Err(EntryError::Decompress(format!(
            "decompressed to {written} bytes, the header declares {declared}"
        )));
    }
    Ok(out)
}

/// Why stored bytes are not a readable entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum EntryError {
    /// Shorter than the fixed header.
    Truncated {
        /// The number of bytes there were.
        len: usize,
    },
    /// Does not start with the entry magic: not written by breakwater.
    BadMagic,
    /// A format version this build cannot read.
    UnsupportedVersion(u8),
    /// A codec id this build does not know.
    UnknownCodec(u8),
    /// Flag bits that format version 1 does not define.
    UnknownFlags(u8),
    /// `stale_until` is before `fresh_until`.
    InvalidTimes {
        /// The stored fresh-until time.
        fresh_until: u64,
        /// The stored stale-until time.
        stale_until: u64,
    },
    /// A negative entry with a payload (or the compressed flag).
    NegativeWithPayload,
    /// A raw payload whose length differs from the header's.
    PayloadLength {
        /// The length the header declares.
        declared: u64,
        /// The number of payload bytes present.
        actual: usize,
    },
    /// A compressed entry declares a decompressed size above the cap.
    TooLarge {
        /// The declared decompressed size.
        declared: usize,
        /// The cap.
        max: usize,
    },
    /// The LZ4 body is corrupt or does not expand to the declared size.
    Decompress(String),
    /// A version 2 entry's tags block breaks a rule (the message says which).
    BadTags(String),
    /// The extension block breaks a rule (the message says which).
    BadExtension(String),
}

impl fmt::Display for EntryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EntryError::Truncated { len } => write!(
                f,
                "entry is truncated: {len} bytes, shorter than the {}-byte header",
                Entry::HEADER_LEN
            ),
            EntryError::BadMagic => f.write_str("bytes are not a breakwater entry (bad magic)"),
            EntryError::UnsupportedVersion(v) => write!(
                f,
                "entry format version {v} is not supported (this build reads versions {VERSION} and {VERSION_TAGGED})"
            ),
            EntryError::UnknownCodec(id) => {
                write!(f, "entry codec id {id} is not known to this build")
            }
            EntryError::UnknownFlags(flags) => write!(
                f,
                "entry flags {flags:#010b} set bits that format version {VERSION} does not define"
            ),
            EntryError::InvalidTimes {
                fresh_until,
                stale_until,
            } => write!(
                f,
                "entry stale-until time {stale_until} is before its fresh-until time {fresh_until}"
            ),
            EntryError::NegativeWithPayload => f.write_str("negative entry carries a payload"),
            EntryError::PayloadLength { declared, actual } => write!(
                f,
                "entry payload is {actual} bytes but its header declares {declared}"
            ),
            EntryError::TooLarge { declared, max } => write!(
                f,
                "entry declares a decompressed size of {declared} bytes, above the limit of {max}"
            ),
            EntryError::Decompress(msg) => {
                write!(f, "entry payload could not be decompressed: {msg}")
            }
            EntryError::BadTags(msg) => write!(f, "entry tags are invalid: {msg}"),
            EntryError::BadExtension(msg) => write!(f, "entry extensions are invalid: {msg}"),
        }
    }
}

impl std::error::Error for EntryError {}

impl From<EntryError> for Error {
    fn from(err: EntryError) -> Self {
        Error::new(ErrorKind::Codec, err.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const CAP: usize = Compression::DEFAULT_MAX_DECOMPRESSED;

    fn entry(payload: &[u8]) -> Entry {
        Entry {
            codec: Codec::json(),
            negative: false,
            fresh_until: 1_700_000_000_000,
            stale_until: 1_700_000_060_000,
            load_ms: 12,
            payload: payload.to_vec(),
            tags: Tags::default(),
            extra: Extra::default(),
        }
    }

    fn stamp(tag: &[u8], generation: u64) -> TagStamp {
        TagStamp {
            tag: tag.to_vec(),
            generation,
        }
    }

    /// A hand-built header followed by `body`.
    fn raw(
        version: u8,
        codec: u8,
        flags: u8,
        fresh: u64,
        stale: u64,
        payload_len: u64,
        body: &[u8],
    ) -> Vec<u8> {
        let mut out = b"BW".to_vec();
        out.extend_from_slice(&[version, codec, flags]);
        out.extend_from_slice(&fresh.to_be_bytes());
        out.extend_from_slice(&stale.to_be_bytes());
        out.extend_from_slice(&7u32.to_be_bytes());
        out.extend_from_slice(&payload_len.to_be_bytes());
        out.extend_from_slice(body);
        out
    }

    fn decode(bytes: &[u8]) -> Result<Entry, EntryError> {
        Entry::decode(bytes.to_vec(), CAP)
    }

    #[test]
    fn layout_is_as_documented() {
        let e = Entry {
            codec: Codec::msgpack(),
            negative: false,
            fresh_until: 0x0102_0304_0506_0708,
            stale_until: 0x1112_1314_1516_1718,
            load_ms: 7,
            payload: b"xyz".to_vec(),
            tags: Tags::default(),
            extra: Extra::default(),
        };
        let bytes = e.encode(&Compression::lz4());
        assert_eq!(
            bytes,
            raw(
                1,
                1,
                0,
                0x0102_0304_0506_0708,
                0x1112_1314_1516_1718,
                3,
                b"xyz"
            )
        );
        assert_eq!(bytes.get(21..25), Some(&[0, 0, 0, 7][..]));
        assert_eq!(bytes.len(), Entry::HEADER_LEN + 3);
        assert_eq!(decode(&bytes), Ok(e));
    }

    #[test]
    fn foreign_and_short_bytes() {
        assert_eq!(decode(b""), Err(EntryError::Truncated { len: 0 }));
        assert_eq!(decode(b"B"), Err(EntryError::Truncated { len: 1 }));
        assert_eq!(decode(b"BW"), Err(EntryError::Truncated { len: 2 }));
        assert_eq!(decode(b"BW\x01"), Err(EntryError::Truncated { len: 3 }));
        assert_eq!(decode(b"hello"), Err(EntryError::BadMagic));
        assert_eq!(decode(b"h"), Err(EntryError::BadMagic));
        assert_eq!(decode(br#"{"a":1}"#), Err(EntryError::BadMagic));
        assert_eq!(decode(b"+OK\r\n"), Err(EntryError::BadMagic));
        assert_eq!(
            decode(b"user:1234:session:abcdefabcdefabcdefabcdef"),
            Err(EntryError::BadMagic)
        );
        assert_eq!(decode(&[0u8; 64]), Err(EntryError::BadMagic));
    }

    #[test]
    fn tagged_layout_is_as_documented() {
        let e = Entry {
            tags: vec![stamp(b"user:7", 0x0a0b), stamp(b"c", 9)].into(),
            ..entry(b"xyz")
        };
        let bytes = e.encode(&Compression::none());
        let mut expected = raw(2, 2, 0, e.fresh_until, e.stale_until, 3, b"");
        expected[21..25].copy_from_slice(&12u32.to_be_bytes());
        expected.push(2);
        expected.extend_from_slice(&[0, 6]);
        expected.extend_from_slice(b"user:7");
        expected.extend_from_slice(&0x0a0bu64.to_be_bytes());
        expected.extend_from_slice(&[0, 1, b'c']);
        expected.extend_from_slice(&9u64.to_be_bytes());
        expected.extend_from_slice(b"xyz");
        assert_eq!(bytes, expected);
        assert_eq!(decode(&bytes), Ok(e.clone()));
        // Compressed bodies come after the tags too.
        let big = Entry {
            payload: vec![b'a'; 4096],
            ..e
        };
        let bytes = big.encode(&Compression::lz4());
        assert_eq!(bytes.get(4), Some(&FLAG_COMPRESSED));
        assert_eq!(decode(&bytes), Ok(big));
    }

    #[test]
    fn untagged_entries_stay_version_1() {
        let bytes = entry(b"abc").encode(&Compression::none());
        assert_eq!(bytes[2], 1);
        assert_eq!(bytes.len(), Entry::HEADER_LEN + 3);
    }

    /// A hand-built version 2 entry: `tags_block` between header and body.
    fn raw_tagged(tags_block: &[u8], body: &[u8]) -> Vec<u8> {
        let mut out = raw(2, 1, 0, 1, 2, body.len() as u64, b"");
        out.extend_from_slice(tags_block);
        out.extend_from_slice(body);
        out
    }

    #[test]
    fn bad_tag_blocks_are_refused() {
        let generation = 5u64.to_be_bytes();
        let one = |tag: &[u8]| {
            let mut b = vec![1];
            b.extend_from_slice(&(tag.len() as u16).to_be_bytes());
            b.extend_from_slice(tag);
            b.extend_from_slice(&generation);
            b
        };
        let good = raw_tagged(&one(b"t"), b"x");
        assert_eq!(*decode(&good).unwrap().tags, [stamp(b"t", 5)]);

        let bad_tags = |bytes: &[u8]| matches!(decode(bytes), Err(EntryError::BadTags(_)));
        // No tags: a tagged entry has at least one.
        assert!(bad_tags(&raw_tagged(&[0], b"x")));
        // Too many.
        assert!(bad_tags(&raw_tagged(&[MAX_TAGS as u8 + 1], b"x")));
        // An empty tag, an over-long one.
        assert!(bad_tags(&raw_tagged(&[1, 0, 0], b"x")));
        let long = vec![b'a'; MAX_TAG_LEN + 1];
        assert!(bad_tags(&raw_tagged(&one(&long), b"x")));
        let longest = vec![b'a'; MAX_TAG_LEN];
        assert!(decode(&raw_tagged(&one(&longest), b"x")).is_ok());
        // The same tag twice.
        let mut twice = one(b"t");
        twice[0] = 2;
        twice.extend_from_slice(&one(b"t")[1..]);
        assert!(bad_tags(&raw_tagged(&twice, b"x")));
        // Cut inside the block (no body at all).
        for cut in 0..one(b"t").len() {
            let bytes = raw_tagged(&one(b"t")[..cut], b"");
            assert!(bad_tags(&bytes), "cut at {cut}");
        }
        // A tag longer than what is left is not read past the end.
        assert!(bad_tags(&raw_tagged(&[1, 0, 200, b'a'], b"")));
        assert!(
            EntryError::BadTags("x".into())
                .to_string()
                .starts_with("entry tags are invalid")
        );
    }

    #[test]
    fn unsupported_version() {
        let bytes = raw(3, 1, 0, 1, 2, 0, b"");
        let err = decode(&bytes).unwrap_err();
        assert_eq!(err, EntryError::UnsupportedVersion(3));
        assert_eq!(
            err.to_string(),
            "entry format version 3 is not supported (this build reads versions 1 and 2)"
        );
        // Reported even when the rest is shorter than a v1 header.
        assert_eq!(decode(b"BW\x07"), Err(EntryError::UnsupportedVersion(7)));
        assert_eq!(decode(b"BW\x00abc"), Err(EntryError::UnsupportedVersion(0)));
    }

    #[test]
    fn unknown_codec_and_flags() {
        assert_eq!(
            decode(&raw(1, 9, 0, 1, 2, 0, b"")),
            Err(EntryError::UnknownCodec(9))
        );
        assert_eq!(
            decode(&raw(1, 0, 0, 1, 2, 0, b"")),
            Err(EntryError::UnknownCodec(0))
        );
        for flags in [0b1000u8, 0b1000_0000, 0b1011, 0xff] {
            assert_eq!(
                decode(&raw(1, 1, flags, 1, 2, 0, b"")),
                Err(EntryError::UnknownFlags(flags))
            );
        }
    }

    #[test]
    fn stale_before_fresh_is_corrupt() {
        assert_eq!(
            decode(&raw(1, 1, 0, 10, 9, 0, b"")),
            Err(EntryError::InvalidTimes {
                fresh_until: 10,
                stale_until: 9
            })
        );
        // Equal is fine.
        assert!(decode(&raw(1, 1, 0, 10, 10, 0, b"")).is_ok());
    }

    #[test]
    fn negative_entries() {
        let neg = raw(1, 1, FLAG_NEGATIVE, 1, 2, 0, b"");
        let e = decode(&neg).unwrap();
        assert!(e.negative);
        assert!(e.payload.is_empty());

        for bytes in [
            raw(1, 1, FLAG_NEGATIVE, 1, 2, 1, b"x"),
            raw(1, 1, FLAG_NEGATIVE, 1, 2, 0, b"x"),
            raw(1, 1, FLAG_NEGATIVE, 1, 2, 5, b""),
            raw(1, 1, FLAG_NEGATIVE | FLAG_COMPRESSED, 1, 2, 0, b""),
        ] {
            assert_eq!(decode(&bytes), Err(EntryError::NegativeWithPayload));
        }

        // Encoding a negative entry drops any payload, so it always decodes.
        let mut e = entry(b"ignored");
        e.negative = true;
        let back = decode(&e.encode(&Compression::lz4())).unwrap();
        assert!(back.negative);
        assert!(back.payload.is_empty());
    }

    #[test]
    fn raw_payload_length_must_match() {
        assert_eq!(
            decode(&raw(1, 1, 0, 1, 2, 4, b"abc")),
            Err(EntryError::PayloadLength {
                declared: 4,
                actual: 3
            })
        );
        assert_eq!(
            decode(&raw(1, 1, 0, 1, 2, 2, b"abc")),
            Err(EntryError::PayloadLength {
                declared: 2,
                actual: 3
            })
        );
        assert_eq!(
            decode(&raw(1, 1, 0, 1, 2, u64::MAX, b"abc")),
            Err(EntryError::PayloadLength {
                declared: u64::MAX,
                actual: 3
            })
        );
    }

    #[test]
    fn declared_size_above_cap_is_rejected_before_allocating() {
        let block = lz4_flex::block::compress(&[b'a'; 100]);
        let bytes = raw(1, 1, FLAG_COMPRESSED, 1, 2, u64::from(u32::MAX), &block);
        assert_eq!(
            decode(&bytes),
            Err(EntryError::TooLarge {
                declared: u32::MAX as usize,
                max: CAP
            })
        );
        let bytes = raw(1, 1, FLAG_COMPRESSED, 1, 2, u64::MAX, &block);
        assert!(matches!(
            decode(&bytes),
            Err(EntryError::TooLarge { max: CAP, .. })
        ));
        // Even with no cap at all, an impossible size is refused without
        // allocating it.
        let err = Entry::decode(bytes.clone(), usize::MAX).unwrap_err();
        assert!(matches!(err, EntryError::Decompress(_)), "{err:?}");
        let bytes = raw(1, 1, FLAG_COMPRESSED, 1, 2, u64::from(u32::MAX), &block);
        let err = Entry::decode(bytes.clone(), usize::MAX).unwrap_err();
        assert!(matches!(err, EntryError::Decompress(_)), "{err:?}");
        // The cap is inclusive.
        let bytes = raw(1, 1, FLAG_COMPRESSED, 1, 2, 100, &block);
        assert_eq!(
            Entry::decode(bytes.clone(), 100).unwrap().payload,
            vec![b'a'; 100]
        );
        assert_eq!(
            Entry::decode(bytes.clone(), 99),
            Err(EntryError::TooLarge {
                declared: 100,
                max: 99
            })
        );
    }

    #[test]
    fn corrupt_lz4_is_a_decompress_error() {
        let garbage = [0xffu8; 40];
        let bytes = raw(1, 1, FLAG_COMPRESSED, 1, 2, 1000, &garbage);
        assert!(matches!(decode(&bytes), Err(EntryError::Decompress(_))));

        let bytes = raw(1, 1, FLAG_COMPRESSED, 1, 2, 10, b"");
        assert!(matches!(decode(&bytes), Err(EntryError::Decompress(_))));

        // A valid block that is shorter or longer than declared.
        let block = lz4_flex::block::compress(&[b'z'; 500]);
        for declared in [499u64, 501, 1000] {
            let bytes = raw(1, 1, FLAG_COMPRESSED, 1, 2, declared, &block);
            assert!(
                matches!(decode(&bytes), Err(EntryError::Decompress(_))),
                "{declared}"
            );
        }
        // A match offset pointing before the start of the output.
        let bytes = raw(
            1,
            1,
            FLAG_COMPRESSED,
            1,
            2,
            100,
            &[0x1f, b'a', 0xff, 0x00, 0x40],
        );
        assert!(matches!(decode(&bytes), Err(EntryError::Decompress(_))));
    }

    #[test]
    fn large_compressible_payload_is_stored_smaller() {
        let row = br#"{"id":12345,"name":"Widget","price_cents":1999,"tags":["a","b"]},"#;
        let payload: Vec<u8> = row.iter().copied().cycle().take(100 * 1024).collect();
        let e = entry(&payload);
        let bytes = e.encode(&Compression::lz4());
        assert!(bytes.len() < payload.len() / 10, "{}", bytes.len());
        assert_eq!(bytes.get(4), Some(&FLAG_COMPRESSED));
        assert_eq!(decode(&bytes), Ok(e.clone()));

        // `none` stores it raw, and a raw entry can be read with any cap.
        let bytes = e.encode(&Compression::none());
        assert_eq!(bytes.len(), Entry::HEADER_LEN + payload.len());
        assert_eq!(Entry::decode(bytes.clone(), 1), Ok(e.clone()));

        // A payload above the cap is stored raw rather than unreadable.
        let small_cap = Compression::lz4().max_decompressed(1024);
        let bytes = e.encode(&small_cap);
        assert_eq!(bytes.get(4), Some(&0));
        assert_eq!(Entry::decode(bytes.clone(), 1024), Ok(e));
    }

    #[test]
    fn tiny_payloads_round_trip_with_threshold_zero() {
        let c = Compression::lz4().threshold(0);
        for payload in [&b""[..], b"x", b"0123456789", b"aaaaaaaaaa"] {
            let e = entry(payload);
            assert_eq!(decode(&e.encode(&c)), Ok(e));
        }
        // Incompressible bytes stay raw.
        let bytes = entry(b"0123456789").encode(&c);
        assert_eq!(bytes.get(4), Some(&0));
    }

    #[test]
    fn very_compressible_payload_stays_within_the_ratio_bound() {
        let payload = vec![0u8; 16 * 1024 * 1024];
        let e = entry(&payload);
        let bytes = e.encode(&Compression::lz4());
        assert_eq!(bytes.get(4), Some(&FLAG_COMPRESSED));
        assert_eq!(decode(&bytes), Ok(e));
    }

    #[test]
    fn extended_layout_is_as_documented() {
        let plain = entry(b"xyz");
        let e = Entry {
            extra: Extra::new(Some(b"W/\"7\"".to_vec().into_boxed_slice()), None),
            ..plain.clone()
        };
        let bytes = e.encode(&Compression::none());
        let before = plain.encode(&Compression::none());
        // The flag, then the block between the header and the body.
        assert_eq!(bytes[4], FLAG_EXTENDED);
        assert_eq!(bytes[..4], before[..4]);
        assert_eq!(bytes[5..Entry::HEADER_LEN], before[5..Entry::HEADER_LEN]);
        let block = &bytes[Entry::HEADER_LEN..bytes.len() - 3];
        assert_eq!(block, [&[1, EXT_VALIDATOR, 5][..], b"W/\"7\""].concat());
        assert_eq!(&bytes[bytes.len() - 3..], b"xyz");
        let back = decode(&bytes).unwrap();
        assert_eq!(back.extra.validator(), Some(&b"W/\"7\""[..]));
        assert_eq!(back, e);
        // With tags: the tags block first, then the extensions.
        let tagged = Entry {
            tags: vec![stamp(b"t", 1)].into(),
            ..e.clone()
        };
        assert_eq!(decode(&tagged.encode(&Compression::none())), Ok(tagged));
    }

    #[test]
    fn a_grace_is_an_eight_byte_item() {
        let e = Entry {
            extra: Extra::new(Some(b"v".to_vec().into_boxed_slice()), Some(1_500)),
            ..entry(b"xyz")
        };
        let bytes = e.encode(&Compression::none());
        let block = &bytes[Entry::HEADER_LEN..bytes.len() - 3];
        let grace = 1_500u64.to_be_bytes();
        assert_eq!(
            block,
            [&[2, EXT_VALIDATOR, 1, b'v', EXT_GRACE, 8][..], &grace].concat()
        );
        let back = decode(&bytes).unwrap();
        assert_eq!(back.extra.grace_ms(), Some(1_500));
        assert_eq!(back, e);
        // With a namespace generation after it.
        let cleared = Entry {
            extra: Extra::new(None, Some(1_500)).in_namespace(Some(1 << 41)),
            ..entry(b"xyz")
        };
        let bytes = cleared.encode(&Compression::none());
        let block = &bytes[Entry::HEADER_LEN..bytes.len() - 3];
        let generation = (1u64 << 41).to_be_bytes();
        assert_eq!(
            block,
            [
                &[2, EXT_GRACE, 8][..],
                &grace,
                &[EXT_NAMESPACE, 8],
                &generation
            ]
            .concat()
        );
        assert_eq!(decode(&bytes).unwrap().extra.namespace(), Some(1 << 41));
        // Alone, and of the wrong size.
        let alone = Entry {
            extra: Extra::new(None, Some(0)),
            ..entry(b"xyz")
        };
        assert_eq!(
            decode(&alone.encode(&Compression::none())),
            Ok(alone.clone())
        );
        let mut short = alone.encode(&Compression::none());
        short[Entry::HEADER_LEN + 2] = 4;
        assert!(matches!(decode(&short), Err(EntryError::BadExtension(_))));
    }

    #[test]
    fn a_renewal_patches_the_windows_in_place() {
        for e in [
            entry(b"xyz"),
            Entry {
                negative: true,
                payload: Vec::new(),
                tags: vec![stamp(b"t", 3)].into(),
                ..entry(b"")
            },
            Entry {
                extra: Extra::new(Some(b"v".to_vec().into_boxed_slice()), None),
                ..entry(&[7; 5000])
            },
        ] {
            let mut bytes = e.encode(&Compression::lz4());
            let at = Entry::WINDOWS_AT;
            assert_eq!(bytes[at..Entry::HEADER_LEN], e.header_tail());
            let patch = Entry::windows_patch(e.fresh_until + 500, e.stale_until + 700);
            bytes[at..at + patch.len()].copy_from_slice(&patch);
            let renewed = decode(&bytes).unwrap();
            assert_eq!(renewed.fresh_until, e.fresh_until + 500);
            assert_eq!(renewed.stale_until, e.stale_until + 700);
            assert_eq!(
                Entry {
                    fresh_until: e.fresh_until,
                    stale_until: e.stale_until,
                    ..renewed
                },
                e
            );
        }
    }

    #[test]
    fn a_bad_extension_block_is_rejected() {
        let e = Entry {
            extra: Extra::new(Some(b"v1".to_vec().into_boxed_slice()), None),
            ..entry(b"xyz")
        };
        let good = e.encode(&Compression::none());
        let at = Entry::HEADER_LEN;
        let mut cases = Vec::new();
        // No item under the flag.
        let mut none = good.clone();
        none[at] = 0;
        cases.push(none);
        // An unknown kind.
        let mut unknown = good.clone();
        unknown[at + 1] = 9;
        cases.push(unknown);
        // An empty validator (and the body read as the next item).
        let mut empty = good.clone();
        empty[at + 2] = 0;
        cases.push(empty);
        // Twice.
        let mut twice = good[..at].to_vec();
        twice.extend_from_slice(&[2, EXT_VALIDATOR, 1, b'a', EXT_VALIDATOR, 1, b'b']);
        twice.extend_from_slice(b"xyz");
        cases.push(twice);
        // Cut short.
        cases.push(good[..at + 3].to_vec());
        for bytes in cases {
            let err = decode(&bytes).unwrap_err();
            assert!(
                matches!(err, EntryError::BadExtension(_)),
                "{bytes:?}: {err}"
            );
        }
    }

    #[test]
    fn value_uses_the_entry_codec() {
        for codec in [Codec::msgpack(), Codec::json()] {
            let payload = codec.encode(&vec![1u32, 2, 3]).unwrap();
            let e = Entry {
                codec,
                ..entry(&payload)
            };
            let back = decode(&e.encode(&Compression::lz4())).unwrap();
            assert_eq!(back.value::<Vec<u32>>().unwrap(), vec![1, 2, 3]);
            assert!(back.value::<String>().unwrap_err().is_codec());
        }
    }

    #[test]
    fn entry_errors_become_codec_errors() {
        let err: Error = EntryError::UnsupportedVersion(7).into();
        assert!(err.is_codec());
        assert_eq!(
            err.to_string(),
            "codec failed: entry format version 7 is not supported (this build reads versions 1 and 2)"
        );
        let all = [
            EntryError::Truncated { len: 3 },
            EntryError::BadMagic,
            EntryError::UnknownCodec(9),
            EntryError::UnknownFlags(4),
            EntryError::InvalidTimes {
                fresh_until: 2,
                stale_until: 1,
            },
            EntryError::NegativeWithPayload,
            EntryError::PayloadLength {
                declared: 1,
                actual: 2,
            },
            EntryError::TooLarge {
                declared: 2,
                max: 1,
            },
            EntryError::Decompress("x".to_owned()),
            EntryError::BadTags("x".to_owned()),
        ];
        for e in all {
            assert!(!e.to_string().is_empty());
        }
    }

    fn payload(max: usize) -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            proptest::collection::vec(any::<u8>(), 0..max),
            (any::<u8>(), 0..max).prop_map(|(b, n)| vec![b; n]),
            (proptest::collection::vec(any::<u8>(), 1..16), 0..max).prop_map(|(pat, n)| pat
                .iter()
                .copied()
                .cycle()
                .take(n)
                .collect()),
        ]
    }

    fn arb_entry(max_payload: usize) -> impl Strategy<Value = Entry> {
        (
            prop_oneof![Just(Codec::msgpack()), Just(Codec::json())],
            prop::bool::weighted(0.2),
            any::<u64>(),
            any::<u64>(),
            any::<u32>(),
            payload(max_payload),
            prop_oneof![Just(Vec::new()), arb_tags()],
            (
                prop::option::weighted(
                    0.3,
                    proptest::collection::vec(any::<u8>(), 1..=MAX_VALIDATOR_LEN),
                ),
                prop::option::weighted(0.2, any::<u64>()),
                prop::option::weighted(0.2, any::<u64>()),
            ),
        )
            .prop_map(
                |(codec, negative, a, b, load_ms, payload, tags, (validator, grace, namespace))| {
                    Entry {
                        codec,
                        negative,
                        fresh_until: a.min(b),
                        stale_until: a.max(b),
                        load_ms,
                        payload: if negative { Vec::new() } else { payload },
                        tags: tags.into(),
                        extra: Extra::new(validator.map(Vec::into_boxed_slice), grace)
                            .in_namespace(namespace),
                    }
                },
            )
    }

    /// 1 to `MAX_TAGS` distinct tags of 1 to `MAX_TAG_LEN` bytes.
    fn arb_tags() -> impl Strategy<Value = Vec<TagStamp>> {
        proptest::collection::btree_map(
            proptest::collection::vec(any::<u8>(), 1..=MAX_TAG_LEN),
            any::<u64>(),
            1..=MAX_TAGS,
        )
        .prop_map(|tags| {
            tags.into_iter()
                .map(|(tag, generation)| TagStamp { tag, generation })
                .collect()
        })
    }

    fn compressions() -> [Compression; 3] {
        [
            Compression::lz4(),
            Compression::none(),
            Compression::lz4().threshold(0),
        ]
    }

    proptest! {
        #[test]
        fn round_trips(e in arb_entry(8 * 1024)) {
            for c in compressions() {
                let bytes = e.encode(&c);
                let tags_len: usize = e.tags.iter().map(|t| 2 + t.tag.len() + 8).sum::<usize>()
                    + usize::from(!e.tags.is_empty());
                let items = usize::from(e.extra.validator().is_some())
                    + usize::from(e.extra.grace_ms().is_some())
                    + usize::from(e.extra.namespace().is_some());
                let extra_len = usize::from(items > 0)
                    + e.extra.validator().map_or(0, |v| 2 + v.len())
                    + e.extra.grace_ms().map_or(0, |_| 2 + 8)
                    + e.extra.namespace().map_or(0, |_| 2 + 8);
                prop_assert!(
                    bytes.len() <= Entry::HEADER_LEN + tags_len + extra_len + e.payload.len()
                );
                prop_assert_eq!(decode(&bytes), Ok(e.clone()));
            }
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = decode(&bytes);
            let _ = Entry::decode(bytes.clone(), usize::MAX);
        }

        #[test]
        fn arbitrary_bodies_never_panic(
            codec in 0u8..4,
            flags in 0u8..4,
            fresh in any::<u64>(),
            stale in any::<u64>(),
            payload_len in prop_oneof![0u64..4096, any::<u64>()],
            body in proptest::collection::vec(any::<u8>(), 0..512),
        ) {
            let bytes = raw(1, codec, flags, fresh.min(stale), fresh.max(stale), payload_len, &body);
            if let Ok(e) = decode(&bytes) {
                prop_assert_eq!(u64::try_from(e.payload.len()).ok(), Some(payload_len));
            }
            let _ = Entry::decode(bytes.clone(), usize::MAX);
        }

        #[test]
        fn arbitrary_tag_blocks_never_panic(
            block in proptest::collection::vec(any::<u8>(), 0..600),
            body in proptest::collection::vec(any::<u8>(), 0..16),
        ) {
            let bytes = raw_tagged(&block, &body);
            if let Ok(e) = decode(&bytes) {
                prop_assert!(!e.tags.is_empty() && e.tags.len() <= MAX_TAGS);
                prop_assert!(e.tags.iter().all(|t| !t.tag.is_empty() && t.tag.len() <= MAX_TAG_LEN));
                prop_assert_eq!(e.payload, body);
            }
        }

        #[test]
        fn every_truncation_is_an_error(e in arb_entry(600)) {
            for c in compressions() {
                let bytes = e.encode(&c);
                for cut in 0..bytes.len() {
                    prop_assert!(decode(&bytes[..cut]).is_err(), "prefix of {} bytes decoded", cut);
                }
            }
        }

        #[test]
        fn single_byte_mutations(
            e in arb_entry(2048),
            which in any::<prop::sample::Index>(),
            header_only in any::<bool>(),
            xor in 1u8..=255,
            c in prop_oneof![Just(Compression::lz4().threshold(0)), Just(Compression::none())],
        ) {
            let mut bytes = e.encode(&c);
            let i = if header_only { which.index(Entry::HEADER_LEN) } else { which.index(bytes.len()) };
            bytes[i] ^= xor;
            let result = decode(&bytes);
            let _ = Entry::decode(bytes.clone(), usize::MAX);
            match i {
                // magic, version
                0..=2 => prop_assert!(result.is_err()),
                // flags: undefined bits
                4 if bytes[4] & !KNOWN_FLAGS != 0 => {
                    prop_assert_eq!(result, Err(EntryError::UnknownFlags(bytes[4])))
                }
                // times and load duration: never change the payload
                5..25 => {
                    if let Ok(d) = result {
                        prop_assert_eq!(d.payload, e.payload);
                        prop_assert_eq!(d.codec, e.codec);
                        prop_assert_eq!(d.negative, e.negative);
                    }
                }
                // payload length
                25..33 => prop_assert!(result.is_err()),
                _ => {}
            }
        }
    }
}
