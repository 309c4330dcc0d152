//! Environment variables as a tree of keys that serde can read.
//!
//! `BREAKWATER_CACHE_L1__ENTRIES=10000` becomes `l1 = { entries = "10000" }`:
//! the prefix is cut, `__` separates a table from its key, names are
//! lower-cased. Every value is text; [`Node`] parses it into whatever the
//! key's type asks for (a number, a flag, a name), so `10000` is a number
//! for `l1.entries` and `"10000"` would still be a string for `namespace`.

use std::collections::BTreeMap;

use serde::de::value::{Error, MapDeserializer, StringDeserializer};
use serde::de::{self, IntoDeserializer, Unexpected, Visitor};

use crate::error::ConfigError;

/// The variables that start with the prefix, read into a tree.
pub(super) struct Vars {
    tree: Node,
    /// Each variable's name and its key path (`l1.entries`).
    given: Vec<(String, String)>,
}

/// A key's value: a variable's text, or a table of keys.
#[derive(Clone, Debug)]
pub(super) enum Node {
    Text(String),
    Table(BTreeMap<String, Node>),
}

impl Vars {
    /// The variables of `vars` whose names start with `prefix`.
    pub(super) fn new<I, K, V>(prefix: &str, vars: I) -> Result<Self, ConfigError>
    where
        I: IntoIterator<Item = (K, V)>,
        K: AsRef<str>,
        V: AsRef<str>,
    {
        let mut root = BTreeMap::new();
        let mut given = Vec::new();
        for (name, value) in vars {
            let name = name.as_ref();
            let Some(rest) = name.strip_prefix(prefix) else {
                continue;
            };
            let path: Vec<String> = rest.split("__").map(str::to_ascii_lowercase).collect();
            if path.iter().any(String::is_empty) {
                return Err(ConfigError::new(format!(
                    "{name}: no key after {prefix}, or an empty one between `__`s"
                )));
            }
            insert(&mut root, &path, value.as_ref()).map_err(|clash| {
                ConfigError::new(format!(
                    "{name}: `{clash}` is given both as a value and as a table"
                ))
                .for_key(&clash)
            })?;
            given.push((name.to_owned(), path.join(".")));
        }
        Ok(Vars {
            tree: Node::Table(root),
            given,
        })
    }

    /// The tree, for serde.
    pub(super) fn tree(&self) -> Node {
        self.tree.clone()
    }

    /// `err` with the variable that set its key in front:
    /// `BREAKWATER_CACHE_L1__TTL (l1.ttl): ...`.
    pub(super) fn name(&self, err: ConfigError) -> ConfigError {
        let Some(key) = err.key().map(str::to_owned) else {
            return err;
        };
        let nested = format!("{key}.");
        let mut named = self
            .given
            .iter()
            .filter(|(_, path)| *path == key || path.starts_with(&nested));
        let (Some((var, _)), None) = (named.next(), named.next()) else {
            return err;
        };
        let message = err.message();
        let message = message.strip_prefix(&format!("{key}: ")).unwrap_or(message);
        ConfigError::new(format!("{var} ({key}): {message}")).for_key(&key)
    }
}

/// Puts `value` at `path` in `table`; `Err` with the clashing key path if a
/// value and a table meet there.
fn insert(table: &mut BTreeMap<String, Node>, path: &[String], value: &str) -> Result<(), String> {
    let (first, rest) = path.split_first().ok_or_else(String::new)?;
    if rest.is_empty() {
        return match table.insert(first.clone(), Node::Text(value.to_owned())) {
            Some(Node::Table(_)) => Err(first.clone()),
            _ => Ok(()),
        };
    }
    let node = table
        .entry(first.clone())
        .or_insert_with(|| Node::Table(BTreeMap::new()));
    match node {
        Node::Table(inner) => insert(inner, rest, value).map_err(|key| format!("{first}.{key}")),
        Node::Text(_) => Err(first.clone()),
    }
}

/// Numbers and flags: the text parsed as the type asks.
macro_rules! parsed {
    ($($method:ident => $visit:ident: $ty:ty, $what:literal;)*) => {$(
        fn $method<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
            match self {
                Node::Text(text) => match text.parse::<$ty>() {
                    Ok(value) => visitor.$visit(value),
                    Err(_) => Err(de::Error::invalid_value(Unexpected::Str(&text), &$what)),
                },
                table => table.deserialize_any(visitor),
            }
        }
    )*};
}

impl<'de> de::Deserializer<'de> for Node {
    type Error = Error;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        match self {
            Node::Text(text) => visitor.visit_string(text),
            Node::Table(table) => {
                let mut map = MapDeserializer::new(table.into_iter());
                let value = visitor.visit_map(&mut map)?;
                map.end()?;
                Ok(value)
            }
        }
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        visitor.visit_some(self)
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, Error> {
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Error> {
        match self {
            Node::Text(text) => {
                let name: StringDeserializer<Error> = text.into_deserializer();
                visitor.visit_enum(name)
            }
            table => table.deserialize_any(visitor),
        }
    }

    parsed! {
        deserialize_bool => visit_bool: bool, "true or false";
        deserialize_u8 => visit_u8: u8, "a whole number";
        deserialize_u16 => visit_u16: u16, "a whole number";
        deserialize_u32 => visit_u32: u32, "a whole number";
        deserialize_u64 => visit_u64: u64, "a whole number";
        deserialize_i8 => visit_i8: i8, "a whole number";
        deserialize_i16 => visit_i16: i16, "a whole number";
        deserialize_i32 => visit_i32: i32, "a whole number";
        deserialize_i64 => visit_i64: i64, "a whole number";
        deserialize_f32 => visit_f32: f32, "a number";
        deserialize_f64 => visit_f64: f64, "a number";
    }

    serde::forward_to_deserialize_any! {
        i128 u128 char str string bytes byte_buf unit unit_struct seq tuple
        tuple_struct map struct identifier ignored_any
    }
}

impl IntoDeserializer<'_, Error> for Node {
    type Deserializer = Node;

    fn into_deserializer(self) -> Node {
        self
    }
}
