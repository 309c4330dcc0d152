//! How cached values become bytes: the serialization [`Codec`] and the
//! payload [`Compression`] policy.
//!
//! Both are small `Copy` values picked with named constructors. Every stored
//! entry records the codec that wrote it. A cache reads only entries of its
//! own codec: one written with another (during a switch from JSON to
//! MessagePack, say) is treated as a miss, logged, and replaced by the next
//! load, never decoded with the wrong format. Compressed entries are always
//! readable, even when the cache itself no longer compresses
//! ([`Compression::none`]).

use serde::Deserialize;
use serde::Serialize;
use serde::de::{DeserializeOwned, IgnoredAny};

use crate::error::{ConfigError, Error, ErrorKind};

/// Nesting limit for msgpack values, as serde_json's. rmp-serde's own
/// default (1024) can overflow a 2 MiB thread stack on hostile input.
const MSGPACK_MAX_DEPTH: usize = 128;

/// The serialization formats a [`Codec`] can use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Format {
    MsgPack,
    Json,
}

/// How values are serialized, using [serde](https://serde.rs).
///
/// - [`Codec::msgpack`] (the default): compact MessagePack with named struct
///   fields, so adding a field marked `#[serde(default)]` to a cached type
///   still reads entries written before the change.
/// - [`Codec::json`]: JSON, larger and slower but readable with any Redis
///   client.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Codec {
    format: Format,
}

/// The capacity a value's encoding starts with (bytes).
const ENCODE_START: usize = 128;

impl Codec {
    const MSGPACK_ID: u8 = 1;
    const JSON_ID: u8 = 2;

    /// MessagePack with named struct fields. This is the default.
    pub fn msgpack() -> Codec {
        Codec {
            format: Format::MsgPack,
        }
    }

    /// JSON.
    pub fn json() -> Codec {
        Codec {
            format: Format::Json,
        }
    }

    /// The codec's name: `"msgpack"` or `"json"`.
    pub fn name(&self) -> &'static str {
        match self.format {
            Format::MsgPack => "msgpack",
            Format::Json => "json",
        }
    }

    /// The id recorded in stored entries. Stable across releases.
    pub(crate) fn id(&self) -> u8 {
        match self.format {
            Format::MsgPack => Self::MSGPACK_ID,
            Format::Json => Self::JSON_ID,
        }
    }

    /// The codec with this stored id, if this build knows it.
    pub(crate) fn from_id(id: u8) -> Option<Codec> {
        match id {
            Self::MSGPACK_ID => Some(Codec::msgpack()),
            Self::JSON_ID => Some(Codec::json()),
            _ => None,
        }
    }

    /// Serializes `value`. Fails with [`ErrorKind::Codec`], carrying the
    /// serializer's error as its source.
    #[cfg(test)]
    pub(crate) fn encode<V: Serialize + ?Sized>(&self, value: &V) -> Result<Vec<u8>, Error> {
        self.encode_within(value, usize::MAX).map_err(|e| match e {
            Encode::Failed(e) => e,
            Encode::TooLarge { .. } => unreachable!("no limit"),
        })
    }

    /// Serializes `value` into at most `limit` bytes. Serialization stops
    /// at the first write past `limit` ([`Encode::TooLarge`]), so a value far
    /// above the limit costs what serializing `limit` bytes costs, not its
    /// whole size (a 64 MiB string is refused without copying it).
    pub(crate) fn encode_within<V: Serialize + ?Sized>(
        &self,
        value: &V,
        limit: usize,
    ) -> Result<Vec<u8>, Encode> {
        let mut out = Bounded {
            // Room for a small value from the start: growing from nothing
            // took three or four reallocations per write.
            buf: Vec::with_capacity(ENCODE_START.min(limit)),
            limit,
            refused: None,
        };
        let result = match self.format {
            Format::MsgPack => {
                rmp_serde::encode::write_named(&mut out, value).map_err(|e| self.error("encode", e))
            }
            Format::Json => {
                serde_json::to_writer(&mut out, value).map_err(|e| self.error("encode", e))
            }
        };
        match (result, out.refused) {
            (_, Some(at_least)) => Err(Encode::TooLarge { at_least }),
            (Err(e), None) => Err(Encode::Failed(e)),
            (Ok(()), None) => Ok(out.buf),
        }
    }

    /// Deserializes a whole value from `bytes`. Fails with
    /// [`ErrorKind::Codec`] if the bytes are not exactly one value of type `V`
    /// (bytes left over after the value are an error for both formats).
    pub(crate) fn decode<V: DeserializeOwned>(&self, bytes: &[u8]) -> Result<V, Error> {
        match self.format {
            Format::MsgPack => {
                // Read in place: a reader over the bytes would allocate a
                // buffer on every decode.
                let mut de = rmp_serde::Deserializer::from_read_ref(bytes);
                de.set_max_depth(MSGPACK_MAX_DEPTH);
                let value = V::deserialize(&mut de).map_err(|e| self.error("decode", e))?;
                // Nothing may follow the value: reading past it must find
                // the end of the bytes (a borrowed reader does not say how
                // much it has left).
                match IgnoredAny::deserialize(&mut de) {
                    Err(rmp_serde::decode::Error::InvalidMarkerRead(e))
                        if e.kind() == std::io::ErrorKind::UnexpectedEof =>
                    {
                        Ok(value)
                    }
                    _ => Err(Error::new(
                        ErrorKind::Codec,
                        "could not decode msgpack: trailing bytes after the value",
                    )),
                }
            }
            Format::Json => serde_json::from_slice(bytes).map_err(|e| self.error("decode", e)),
        }
    }

    fn error(
        &self,
        action: &str,
        source: impl Into<Box<dyn std::error::Error + Send + Sync + 'static>>,
    ) -> Error {
        Error::new(
            ErrorKind::Codec,
            format!("could not {action} {}", self.name()),
        )
        .with_source(source)
    }
}

impl Default for Codec {
    /// [`Codec::msgpack`].
    fn default() -> Self {
        Codec::msgpack()
    }
}

/// Payload compression: LZ4 (block format) for payloads larger than a
/// threshold, with a cap on how large a stored entry may claim to decompress
/// to.
///
/// A payload is only stored compressed when compression actually makes it
/// smaller. Entries that declare a decompressed size above the cap are
/// rejected before any memory is allocated for them, so a corrupt or hostile
/// entry cannot make the process allocate gigabytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Compression {
    enabled: bool,
    threshold: usize,
    max_decompressed: usize,
}

impl Compression {
    /// Payloads strictly larger than this many bytes are compressed by
    /// [`Compression::lz4`]: 1 KiB.
    pub const DEFAULT_THRESHOLD: usize = 1024;

    /// The default cap on a stored entry's decompressed size: 64 MiB.
    pub const DEFAULT_MAX_DECOMPRESSED: usize = 64 * 1024 * 1024;

    /// LZ4 for payloads above 1 KiB, reading at most 64 MiB per entry.
    /// This is the default.
    pub fn lz4() -> Compression {
        Compression {
            enabled: true,
            threshold: Self::DEFAULT_THRESHOLD,
            max_decompressed: Self::DEFAULT_MAX_DECOMPRESSED,
        }
    }

    /// Never compress. Compressed entries already in the store are still
    /// read, with the default 64 MiB cap (change it with
    /// [`Compression::max_decompressed`]).
    pub fn none() -> Compression {
        Compression {
            enabled: false,
            ..Compression::lz4()
        }
    }

    /// Compresses payloads strictly larger than `bytes` (`0` compresses every
    /// non-empty payload that shrinks). Has no effect on
    /// [`Compression::none`].
    pub fn threshold(self, bytes: usize) -> Compression {
        Compression {
            threshold: bytes,
            ..self
        }
    }

    /// The largest decompressed size a stored entry may declare; larger
    /// entries are treated as corrupt (a cache miss). Must be greater than
    /// zero.
    pub fn max_decompressed(self, bytes: usize) -> Compression {
        Compression {
            max_decompressed: bytes,
            ..self
        }
    }

    /// The largest decompressed-size cap accepted: 1 GiB.
    pub const MAX_MAX_DECOMPRESSED: usize = 1024 * 1024 * 1024;

    /// Checks the settings: the decompressed-size cap must be greater than
    /// zero and at most 1 GiB.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.max_decompressed == 0 {
            return Err(
                ConfigError::new("max decompressed size must be greater than zero")
                    .for_key("max_decompressed"),
            );
        }
        if self.max_decompressed > Self::MAX_MAX_DECOMPRESSED {
            return Err(ConfigError::new(format!(
                "max decompressed size must be at most {} bytes (1 GiB), got {}; \
                 use the default (64 MiB) or the largest value you cache",
                Self::MAX_MAX_DECOMPRESSED,
                self.max_decompressed
            ))
            .for_key("max_decompressed"));
        }
        Ok(())
    }

    /// Whether a payload of `len` bytes should be compressed.
    pub(crate) fn should_compress(&self, len: usize) -> bool {
        self.enabled && len > self.threshold
    }

    /// The cap on a stored entry's decompressed size.
    pub(crate) fn max_decompressed_len(&self) -> usize {
        self.max_decompressed
    }
}

/// Why [`Codec::encode_within`] produced no bytes.
#[derive(Debug)]
pub(crate) enum Encode {
    /// The serializer failed ([`ErrorKind::Codec`]).
    Failed(Error),
    /// The value serializes to more than the limit: at least this many
    /// bytes (the size written so far plus the write that crossed it; the
    /// exact size for a string or byte value, which is one write).
    TooLarge { at_least: usize },
}

/// A `Vec` writer that refuses the first write past its limit.
struct Bounded {
    buf: Vec<u8>,
    limit: usize,
    /// The size the refused write would have reached.
    refused: Option<usize>,
}

impl std::io::Write for Bounded {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        let total = self.buf.len().saturating_add(data.len());
        if total > self.limit {
            self.refused = Some(total);
            return Err(std::io::Error::other("value larger than max_value_size"));
        }
        self.buf.extend_from_slice(data);
        Ok(data.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Default for Compression {
    /// [`Compression::lz4`].
    fn default() -> Self {
        Compression::lz4()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    struct Product {
        id: u64,
        name: String,
        price_cents: i64,
        tags: Vec<String>,
    }

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    struct ProductV2 {
        id: u64,
        name: String,
        price_cents: i64,
        tags: Vec<String>,
        #[serde(default)]
        stock: Option<u32>,
    }

    fn product() -> Product {
        Product {
            id: 42,
            name: "Widget \u{2603}".to_owned(),
            price_cents: -1999,
            tags: vec!["a".to_owned(), "b".to_owned()],
        }
    }

    #[test]
    fn product_round_trips_through_both_codecs() {
        for codec in [Codec::msgpack(), Codec::json()] {
            let bytes = codec.encode(&product()).unwrap();
            let back: Product = codec.decode(&bytes).unwrap();
            assert_eq!(back, product(), "{}", codec.name());
        }
    }

    #[test]
    fn msgpack_uses_named_fields() {
        let bytes = Codec::msgpack().encode(&product()).unwrap();
        assert!(bytes.windows(11).any(|w| w == b"price_cents"));
        let v2: ProductV2 = Codec::msgpack().decode(&bytes).unwrap();
        assert_eq!(v2.id, 42);
        assert_eq!(v2.price_cents, -1999);
        assert_eq!(v2.stock, None);
        // And the other way round: old readers ignore the new field.
        let new = ProductV2 {
            stock: Some(3),
            ..v2
        };
        let bytes = Codec::msgpack().encode(&new).unwrap();
        let old: Product = Codec::msgpack().decode(&bytes).unwrap();
        assert_eq!(old, product());
    }

    #[test]
    fn json_bytes_do_not_decode_as_msgpack() {
        let bytes = Codec::json().encode(&product()).unwrap();
        let err = Codec::msgpack().decode::<Product>(&bytes).unwrap_err();
        assert!(err.is_codec());
        let bytes = Codec::msgpack().encode(&product()).unwrap();
        let err = Codec::json().decode::<Product>(&bytes).unwrap_err();
        assert!(err.is_codec());
    }

    #[test]
    fn wrong_type_is_an_error_with_a_source() {
        for codec in [Codec::msgpack(), Codec::json()] {
            let bytes = codec.encode(&"just a string").unwrap();
            let err = codec.decode::<Product>(&bytes).unwrap_err();
            assert!(err.is_codec());
            assert!(std::error::Error::source(&err).is_some());
            let bytes = codec.encode(&product()).unwrap();
            assert!(codec.decode::<u64>(&bytes).is_err());
            assert!(codec.decode::<Vec<String>>(&bytes).is_err());
        }
    }

    #[test]
    fn trailing_bytes_are_an_error() {
        for codec in [Codec::msgpack(), Codec::json()] {
            let mut bytes = codec.encode(&product()).unwrap();
            bytes.push(b'1');
            let err = codec.decode::<Product>(&bytes).unwrap_err();
            assert!(err.is_codec(), "{}", codec.name());
        }
        // Whatever follows a msgpack value: a whole value, a reserved
        // marker, a value cut short.
        let codec = Codec::msgpack();
        for tail in [
            &[0x01][..],
            &[0xc1],
            &[0xd9],
            &[0xd9, 0x05, b'a'],
            &[0xc0, 0xc0],
        ] {
            let mut bytes = codec.encode(&product()).unwrap();
            bytes.extend_from_slice(tail);
            let err = codec.decode::<Product>(&bytes).unwrap_err();
            assert!(err.is_codec(), "{tail:?}");
        }
        let bytes = codec.encode(&product()).unwrap();
        assert_eq!(codec.decode::<Product>(&bytes).unwrap(), product());
    }

    #[test]
    fn empty_and_garbage_input_are_errors() {
        for codec in [Codec::msgpack(), Codec::json()] {
            assert!(codec.decode::<Product>(b"").is_err());
            assert!(codec.decode::<u8>(b"").is_err());
            assert!(codec.decode::<Product>(b"\xff\xfe\x00garbage").is_err());
            // A msgpack array header declaring 4 billion elements.
            assert!(codec.decode::<Vec<u64>>(b"\xdd\xff\xff\xff\xff").is_err());
            // A msgpack bin header declaring 4 GiB.
            assert!(codec.decode::<Vec<u8>>(b"\xc6\xff\xff\xff\xff").is_err());
            // Deep nesting.
            let deep = vec![b'['; 100_000];
            assert!(codec.decode::<serde_json::Value>(&deep).is_err());
            let deep = vec![0x91u8; 100_000];
            assert!(codec.decode::<serde_json::Value>(&deep).is_err());
        }
    }

    #[test]
    fn ids_round_trip() {
        for codec in [Codec::msgpack(), Codec::json()] {
            assert_eq!(Codec::from_id(codec.id()), Some(codec));
        }
        assert_eq!(Codec::msgpack().id(), 1);
        assert_eq!(Codec::json().id(), 2);
        for id in [0u8, 3, 255] {
            assert_eq!(Codec::from_id(id), None);
        }
        assert_eq!(Codec::default(), Codec::msgpack());
        assert_eq!(Codec::msgpack().name(), "msgpack");
        assert_eq!(Codec::json().name(), "json");
    }

    #[test]
    fn compression_settings() {
        let c = Compression::default();
        assert_eq!(c, Compression::lz4());
        assert!(!c.should_compress(1024));
        assert!(c.should_compress(1025));
        assert_eq!(c.max_decompressed_len(), 64 * 1024 * 1024);
        assert!(c.validate().is_ok());

        let none = Compression::none();
        assert!(!none.should_compress(usize::MAX));
        assert!(!none.threshold(0).should_compress(10));
        assert_eq!(
            none.max_decompressed_len(),
            Compression::DEFAULT_MAX_DECOMPRESSED
        );

        let zero = Compression::lz4().threshold(0);
        assert!(!zero.should_compress(0));
        assert!(zero.should_compress(1));

        let err = Compression::lz4()
            .max_decompressed(0)
            .validate()
            .unwrap_err();
        assert_eq!(
            err.message(),
            "max decompressed size must be greater than zero"
        );
        assert_eq!(
            Compression::lz4()
                .max_decompressed(5)
                .max_decompressed_len(),
            5
        );
    }

    mod props {
        use super::*;
        use proptest::prelude::*;

        proptest! {
            #[test]
            fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
                for codec in [Codec::msgpack(), Codec::json()] {
                    let _ = codec.decode::<Product>(&bytes);
                    let _ = codec.decode::<serde_json::Value>(&bytes);
                    let _ = codec.decode::<String>(&bytes);
                }
            }

            #[test]
            fn products_round_trip(
                id in any::<u64>(),
                name in ".*",
                price_cents in any::<i64>(),
                tags in proptest::collection::vec(".*", 0..4),
            ) {
                let p = Product { id, name, price_cents, tags };
                for codec in [Codec::msgpack(), Codec::json()] {
                    let bytes = codec.encode(&p).unwrap();
                    prop_assert_eq!(codec.decode::<Product>(&bytes).unwrap(), p.clone());
                }
            }
        }
    }
}
