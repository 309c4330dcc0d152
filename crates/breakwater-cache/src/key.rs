//! [`CacheKey`]: what a cache can be asked for.
//!
//! Strings, byte strings and integers are keys as they are, so an integer
//! id needs no `format!` at every call:
//!
//! ```
//! use breakwater_cache::Cache;
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), breakwater_cache::Error> {
//! let cache = Cache::<String>::builder().build()?;
//! let id: u64 = 42;
//! cache.set(id, &"espresso".to_owned()).await?;
//! // An integer is its decimal digits: 42u64, 42i32 and "42" are one key.
//! assert_eq!(cache.get("42").await?.as_deref(), Some("espresso"));
//! assert_eq!(cache.get(42i32).await?.as_deref(), Some("espresso"));
//! # Ok(()) }
//! ```
//!
//! An integer is written into a buffer on the stack: no allocation.
//!
//! # Your own key types
//!
//! Implement [`CacheKey::key_bytes`]: borrow the bytes when the type holds
//! them, delegate to a field, or build them.
//!
//! ```
//! use breakwater_cache::{Cache, CacheKey, KeyBytes};
//!
//! /// A product id, cached under its number.
//! struct ProductId(u64);
//!
//! impl CacheKey for ProductId {
//!     fn key_bytes(&self) -> KeyBytes<'_> {
//!         self.0.key_bytes()
//!     }
//! }
//!
//! /// A composite key, built on each call.
//! struct Price<'a> {
//!     shop: u32,
//!     sku: &'a str,
//! }
//!
//! impl CacheKey for Price<'_> {
//!     fn key_bytes(&self) -> KeyBytes<'_> {
//!         KeyBytes::from(format!("{}:{}", self.shop, self.sku))
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), breakwater_cache::Error> {
//! let cache = Cache::<u64>::builder().build()?;
//! cache.set(ProductId(7), &1).await?;
//! cache.set(Price { shop: 3, sku: "A-1" }, &250).await?;
//! assert_eq!(cache.get("7").await?, Some(1));
//! assert_eq!(cache.get("3:A-1").await?, Some(250));
//! # Ok(()) }
//! ```

use std::borrow::Cow;
use std::fmt;
use std::ops::Deref;
use std::rc::Rc;
use std::sync::Arc;

/// A key a cache can be asked for: anything that gives its bytes.
///
/// Implemented for `str`, `String`, byte slices and arrays, `Vec<u8>`,
/// boxed, shared and copy-on-write strings and bytes, references to any
/// key, and every integer type (`u8`..`u128`, `i8`..`i128`, `usize`,
/// `isize`), which is its decimal digits. See the [module docs](self) for
/// your own types.
///
/// Keys are binary-safe: any bytes, from 1 byte up to the cache's
/// `max_key_len`.
pub trait CacheKey {
    /// The key's bytes: borrowed, or built (on the stack for integers).
    fn key_bytes(&self) -> KeyBytes<'_>;
}

/// A key's bytes, borrowed or owned; see [`CacheKey`].
///
/// Dereferences to `[u8]`.
#[derive(Clone)]
pub struct KeyBytes<'a>(Repr<'a>);

#[derive(Clone)]
enum Repr<'a> {
    Borrowed(&'a [u8]),
    Owned(Vec<u8>),
    /// An integer's digits, at the end of the buffer from `start` on.
    Digits {
        buf: [u8; DIGITS],
        start: u8,
    },
}

/// The longest integer: `i128::MIN`, 39 digits and a sign.
const DIGITS: usize = 40;

impl<'a> KeyBytes<'a> {
    /// Bytes borrowed from the key.
    pub fn borrowed(bytes: &'a [u8]) -> Self {
        KeyBytes(Repr::Borrowed(bytes))
    }

    /// Bytes built for the key.
    pub fn owned(bytes: Vec<u8>) -> Self {
        KeyBytes(Repr::Owned(bytes))
    }

    /// The bytes.
    pub fn as_bytes(&self) -> &[u8] {
        match &self.0 {
            Repr::Borrowed(bytes) => bytes,
            Repr::Owned(bytes) => bytes,
            Repr::Digits { buf, start } => &buf[usize::from(*start)..],
        }
    }

    /// `n`'s decimal digits, with a `-` if `negative`.
    fn digits(mut n: u128, negative: bool) -> Self {
        let mut buf = [0u8; DIGITS];
        let mut start = DIGITS;
        // Most keys fit in 64 bits, whose division is far cheaper.
        while n > u128::from(u64::MAX) {
            start -= 1;
            buf[start] = b'0' + (n % 10) as u8;
            n /= 10;
        }
        let mut n = n as u64;
        loop {
            start -= 1;
            buf[start] = b'0' + (n % 10) as u8;
            n /= 10;
            if n == 0 {
                break;
            }
        }
        if negative {
            start -= 1;
            buf[start] = b'-';
        }
        // `start` is below DIGITS (40), so it fits a u8.
        KeyBytes(Repr::Digits {
            buf,
            start: start as u8,
        })
    }
}

impl Deref for KeyBytes<'_> {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        self.as_bytes()
    }
}

impl AsRef<[u8]> for KeyBytes<'_> {
    fn as_ref(&self) -> &[u8] {
        self.as_bytes()
    }
}

impl fmt::Debug for KeyBytes<'_> {
    /// The bytes as lossy UTF-8.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&String::from_utf8_lossy(self.as_bytes()), f)
    }
}

impl PartialEq for KeyBytes<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.as_bytes() == other.as_bytes()
    }
}

impl Eq for KeyBytes<'_> {}

impl<'a> From<&'a [u8]> for KeyBytes<'a> {
    fn from(bytes: &'a [u8]) -> Self {
        KeyBytes::borrowed(bytes)
    }
}

impl<'a> From<&'a str> for KeyBytes<'a> {
    fn from(s: &'a str) -> Self {
        KeyBytes::borrowed(s.as_bytes())
    }
}

impl From<Vec<u8>> for KeyBytes<'_> {
    fn from(bytes: Vec<u8>) -> Self {
        KeyBytes::owned(bytes)
    }
}

impl From<String> for KeyBytes<'_> {
    fn from(s: String) -> Self {
        KeyBytes::owned(s.into_bytes())
    }
}

impl<T: CacheKey + ?Sized> CacheKey for &T {
    fn key_bytes(&self) -> KeyBytes<'_> {
        (**self).key_bytes()
    }
}

impl<T: CacheKey + ?Sized> CacheKey for &mut T {
    fn key_bytes(&self) -> KeyBytes<'_> {
        (**self).key_bytes()
    }
}

/// Keys that are their bytes, borrowed.
macro_rules! borrowed {
    ($($ty:ty),* $(,)?) => {$(
        impl CacheKey for $ty {
            fn key_bytes(&self) -> KeyBytes<'_> {
                KeyBytes::borrowed(AsRef::<[u8]>::as_ref(self))
            }
        }
    )*};
}

borrowed!(str, String, [u8], Vec<u8>);

/// Keys behind a pointer: the key they point to.
macro_rules! pointers {
    ($($ty:ty),* $(,)?) => {$(
        impl CacheKey for $ty {
            fn key_bytes(&self) -> KeyBytes<'_> {
                (**self).key_bytes()
            }
        }
    )*};
}

pointers!(
    Box<str>,
    Box<[u8]>,
    Arc<str>,
    Arc<[u8]>,
    Rc<str>,
    Rc<[u8]>,
    Cow<'_, str>,
    Cow<'_, [u8]>,
);

impl<const N: usize> CacheKey for [u8; N] {
    fn key_bytes(&self) -> KeyBytes<'_> {
        KeyBytes::borrowed(self)
    }
}

/// Integers: their decimal digits, built on the stack.
macro_rules! integers {
    (unsigned: $($u:ty),*; signed: $($i:ty),*) => {
        $(
            impl CacheKey for $u {
                fn key_bytes(&self) -> KeyBytes<'_> {
                    KeyBytes::digits(*self as u128, false)
                }
            }
        )*
        $(
            impl CacheKey for $i {
                fn key_bytes(&self) -> KeyBytes<'_> {
                    KeyBytes::digits(self.unsigned_abs() as u128, *self < 0)
                }
            }
        )*
    };
}

integers!(unsigned: u8, u16, u32, u64, u128, usize; signed: i8, i16, i32, i64, i128, isize);

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn bytes(key: impl CacheKey) -> Vec<u8> {
        key.key_bytes().to_vec()
    }

    #[test]
    fn integers_are_their_decimal_digits() {
        assert_eq!(bytes(0u8), b"0");
        assert_eq!(bytes(42u64), b"42");
        assert_eq!(bytes(-7i32), b"-7");
        assert_eq!(bytes(u128::MAX), u128::MAX.to_string().as_bytes());
        assert_eq!(bytes(i128::MIN), i128::MIN.to_string().as_bytes());
        assert_eq!(bytes(i64::MIN), i64::MIN.to_string().as_bytes());
        assert_eq!(bytes(usize::MAX), usize::MAX.to_string().as_bytes());
        assert_eq!(bytes(isize::MIN), isize::MIN.to_string().as_bytes());
        assert_eq!(bytes(i8::MIN), b"-128");
        assert_eq!(bytes(u64::MAX as u128 + 1), b"18446744073709551616");
    }

    #[test]
    fn strings_and_bytes_are_borrowed_as_they_are() {
        let owned = String::from("product:1");
        assert_eq!(bytes("product:1"), b"product:1");
        assert_eq!(bytes(&owned), b"product:1");
        assert_eq!(bytes(owned.clone()), b"product:1");
        assert_eq!(bytes(b"raw\x00bytes"), b"raw\x00bytes");
        assert_eq!(bytes(&b"raw"[..]), b"raw");
        assert_eq!(bytes(vec![1u8, 2]), [1, 2]);
        assert_eq!(bytes(Arc::<str>::from("a")), b"a");
        assert_eq!(bytes(Cow::Borrowed("c")), b"c");
        assert!(matches!(owned.key_bytes().0, Repr::Borrowed(_)));
    }

    proptest! {
        #[test]
        fn every_integer_matches_to_string(n in any::<i128>(), u in any::<u128>(), s in any::<i64>()) {
            prop_assert_eq!(bytes(n), n.to_string().into_bytes());
            prop_assert_eq!(bytes(u), u.to_string().into_bytes());
            prop_assert_eq!(bytes(s), s.to_string().into_bytes());
        }
    }
}
