//! Settings from the environment, checked once at start-up.
//!
//! | variable | required | default | meaning |
//! |---|---|---|---|
//! | `DATABASE_URL` | yes | | PostgreSQL, `postgres://user:password@host:5432/db` (or `host=... user=...`) |
//! | `REDIS_URL` | yes | | Redis, `redis://[:password@]host:6379/` |
//! | `BIND` | no | `127.0.0.1:8080` | the HTTP listener's address |
//! | `DATABASE_POOL_SIZE` | no | 16 | PostgreSQL connections; also the cap on concurrent cache loads |
//! | `REDIS_READ_TIMEOUT_MS` | no | 50 | the deadline of one Redis read |
//! | `REDIS_WRITE_TIMEOUT_MS` | no | 250 | the deadline of one Redis write or lease script |
//! | `PRODUCT_TTL_SECS` | no | 300 | how long a cached product is fresh (±10 %); then it is served stale for up to 60 s while one refresh runs (up to an hour while the database fails) |
//!
//! No password ever appears in a message: URLs are shown with `***` in its
//! place, and errors from parsing them never quote them.

use std::fmt;
use std::net::SocketAddr;
use std::time::Duration;

/// What the service needs to start.
pub(crate) struct Config {
    /// Where the products live.
    pub(crate) database: tokio_postgres::Config,
    /// Where the cache lives (may hold a password: never log it as is).
    pub(crate) redis_url: String,
    /// The HTTP listener's address.
    pub(crate) bind: SocketAddr,
    /// PostgreSQL connections in the pool.
    pub(crate) pool_size: usize,
    /// Deadline of one Redis read.
    pub(crate) redis_read_timeout: Duration,
    /// Deadline of one Redis write or lease script.
    pub(crate) redis_write_timeout: Duration,
    /// How long a cached product is fresh.
    pub(crate) product_ttl: Duration,
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Config")
            .field("database", &database_target(&self.database))
            .field("redis", &redact_url(&self.redis_url))
            .field("bind", &self.bind)
            .field("pool_size", &self.pool_size)
            .field("redis_read_timeout", &self.redis_read_timeout)
            .field("redis_write_timeout", &self.redis_write_timeout)
            .field("product_ttl", &self.product_ttl)
            .finish()
    }
}

/// A setting that is missing or cannot be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ConfigError {
    /// A required variable is not set (or empty).
    Missing {
        /// The variable.
        var: &'static str,
        /// What a value looks like.
        example: &'static str,
    },
    /// A variable is set to something unusable.
    Invalid {
        /// The variable.
        var: &'static str,
        /// Why, in words that never quote a password.
        reason: String,
    },
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::Missing { var, example } => {
                write!(f, "{var} is not set; set it, e.g. {var}={example}")
            }
            ConfigError::Invalid { var, reason } => write!(f, "{var} is invalid: {reason}"),
        }
    }
}

impl std::error::Error for ConfigError {}

impl Config {
    /// Reads the process environment.
    pub(crate) fn from_env() -> Result<Config, ConfigError> {
        Config::from_lookup(|name| std::env::var(name).ok())
    }

    /// Reads the settings through `lookup` (the environment, or a map in
    /// tests).
    pub(crate) fn from_lookup(
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Result<Config, ConfigError> {
        let get = |var: &str| lookup(var).filter(|v| !v.trim().is_empty());

        let database_url = get("DATABASE_URL").ok_or(ConfigError::Missing {
            var: "DATABASE_URL",
            example: "postgres://postgres:secret@127.0.0.1:5432/postgres",
        })?;
        let database = parse_database_url(&database_url)?;

        let redis_url = get("REDIS_URL").ok_or(ConfigError::Missing {
            var: "REDIS_URL",
            example: "redis://127.0.0.1:6379/",
        })?;
        if !["redis://", "rediss://", "redis+unix://", "unix://"]
            .iter()
            .any(|scheme| redis_url.starts_with(scheme))
        {
            return Err(ConfigError::Invalid {
                var: "REDIS_URL",
                reason: "expected a URL like redis://127.0.0.1:6379/".into(),
            });
        }

        let bind = match get("BIND") {
            None => SocketAddr::from(([127, 0, 0, 1], 8080)),
            Some(bind) => bind.trim().parse().map_err(|_| ConfigError::Invalid {
                var: "BIND",
                reason: format!("expected an address like 127.0.0.1:8080, got {bind:?}"),
            })?,
        };
        let pool_size = number(&get, "DATABASE_POOL_SIZE", 16, 1..=1000)?;
        let read = number(&get, "REDIS_READ_TIMEOUT_MS", 50, 1..=60_000)?;
        let write = number(&get, "REDIS_WRITE_TIMEOUT_MS", 250, 1..=60_000)?;
        let ttl = number(&get, "PRODUCT_TTL_SECS", 300, 1..=86_400)?;
        Ok(Config {
            database,
            redis_url,
            bind,
            pool_size,
            redis_read_timeout: Duration::from_millis(read as u64),
            redis_write_timeout: Duration::from_millis(write as u64),
            product_ttl: Duration::from_secs(ttl as u64),
        })
    }

    /// `user@host:port/db`, for logs.
    pub(crate) fn database_target(&self) -> String {
        database_target(&self.database)
    }

    /// The Redis URL with any password replaced by `***`, for logs.
    pub(crate) fn redis_target(&self) -> String {
        redact_url(&self.redis_url)
    }
}

/// An optional whole number in `range`, `default` when unset.
fn number(
    get: &impl Fn(&str) -> Option<String>,
    var: &'static str,
    default: usize,
    range: std::ops::RangeInclusive<usize>,
) -> Result<usize, ConfigError> {
    let Some(text) = get(var) else {
        return Ok(default);
    };
    match text.trim().parse::<usize>() {
        Ok(n) if range.contains(&n) => Ok(n),
        _ => Err(ConfigError::Invalid {
            var,
            reason: format!(
                "expected a whole number in {}..={}, got {text:?}",
                range.start(),
                range.end()
            ),
        }),
    }
}

/// Parses a PostgreSQL URL or key-value string. The parser's own message is
/// kept only in the forms that name an option, never a value (another one
/// quotes a character of the input, which could be the password's); the
/// input itself is never quoted.
fn parse_database_url(url: &str) -> Result<tokio_postgres::Config, ConfigError> {
    const EXAMPLE: &str = "expected e.g. postgres://user:password@host:5432/db";
    let config: tokio_postgres::Config = url.parse().map_err(|err: tokio_postgres::Error| {
        let detail = err.to_string();
        let names_no_value = [
            "invalid value for option",
            "unknown option",
            "unexpected EOF",
        ]
        .iter()
        .any(|form| detail.contains(form));
        ConfigError::Invalid {
            var: "DATABASE_URL",
            reason: if names_no_value {
                format!("{detail} ({EXAMPLE})")
            } else {
                format!("not a PostgreSQL connection string ({EXAMPLE})")
            },
        }
    })?;
    if config.get_hosts().is_empty() {
        return Err(ConfigError::Invalid {
            var: "DATABASE_URL",
            reason: format!("no host ({EXAMPLE})"),
        });
    }
    if config.get_user().is_none() {
        return Err(ConfigError::Invalid {
            var: "DATABASE_URL",
            reason: format!("no user ({EXAMPLE})"),
        });
    }
    Ok(config)
}

/// `url` with the password of its user info replaced by `***`.
pub(crate) fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return "(not a URL)".into();
    };
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => {
            let user = userinfo.split_once(':').map_or(userinfo, |(user, _)| user);
            let hidden = if userinfo.contains(':') { ":***" } else { "" };
            format!("{scheme}://{user}{hidden}@{host}{tail}")
        }
        None => url.to_owned(),
    }
}

/// `user@host:port/db` of a parsed PostgreSQL config.
fn database_target(config: &tokio_postgres::Config) -> String {
    let host = match config.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(host)) => host.clone(),
        Some(tokio_postgres::config::Host::Unix(path)) => path.display().to_string(),
        None => "?".into(),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let user = config.get_user().unwrap_or("?");
    let db = config.get_dbname().unwrap_or(user);
    format!("{user}@{host}:{port}/{db}")
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    const SECRET: &str = "hunter2";

    fn parse(vars: &[(&str, &str)]) -> Result<Config, ConfigError> {
        let vars: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        Config::from_lookup(|k| vars.get(k).cloned())
    }

    const OK: [(&str, &str); 2] = [
        (
            "DATABASE_URL",
            "postgres://app:hunter2@db.internal:6432/shop",
        ),
        ("REDIS_URL", "redis://:hunter2@cache.internal:6380/0"),
    ];

    #[test]
    fn defaults_fill_in_what_is_optional() {
        let config = parse(&OK).unwrap();
        assert_eq!(config.bind, "127.0.0.1:8080".parse().unwrap());
        assert_eq!(config.pool_size, 16);
        assert_eq!(config.redis_read_timeout, Duration::from_millis(50));
        assert_eq!(config.redis_write_timeout, Duration::from_millis(250));
        assert_eq!(config.product_ttl, Duration::from_secs(300));
        assert_eq!(config.database_target(), "app@db.internal:6432/shop");
        assert_eq!(config.redis_target(), "redis://:***@cache.internal:6380/0");
    }

    #[test]
    fn missing_variables_say_what_to_set() {
        let err = parse(&[]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "DATABASE_URL is not set; set it, e.g. \
             DATABASE_URL=postgres://postgres:secret@127.0.0.1:5432/postgres"
        );
        let err = parse(&OK[..1]).unwrap_err();
        assert_eq!(
            err,
            ConfigError::Missing {
                var: "REDIS_URL",
                example: "redis://127.0.0.1:6379/"
            }
        );
        let blank = [OK[0], ("REDIS_URL", "  ")];
        assert!(matches!(parse(&blank), Err(ConfigError::Missing { .. })));
    }

    #[test]
    fn bad_values_are_named_and_never_quote_a_password() {
        let cases: [&[(&str, &str)]; 7] = [
            &[
                ("DATABASE_URL", "postgres://app:hunter2@db:notaport/shop"),
                OK[1],
            ],
            &[("DATABASE_URL", "mysql://app:hunter2@db/shop"), OK[1]],
            &[("DATABASE_URL", "postgres://app:hunter2@/shop"), OK[1]],
            &[OK[0], ("REDIS_URL", "http://:hunter2@cache/")],
            &[OK[0], OK[1], ("BIND", "localhost")],
            &[OK[0], OK[1], ("DATABASE_POOL_SIZE", "0")],
            &[OK[0], OK[1], ("REDIS_READ_TIMEOUT_MS", "soon")],
        ];
        for vars in cases {
            let err = parse(vars).unwrap_err();
            let text = err.to_string();
            assert!(
                matches!(err, ConfigError::Invalid { .. }),
                "{vars:?}: {text}"
            );
            assert!(!text.contains(SECRET), "{vars:?}: {text}");
            assert!(text.contains(" is invalid: "), "{text}");
        }
        let err = parse(&[OK[0], OK[1], ("BIND", "localhost")]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "BIND is invalid: expected an address like 127.0.0.1:8080, got \"localhost\""
        );
    }

    #[test]
    fn debug_output_hides_passwords() {
        let config = parse(&OK).unwrap();
        let debug = format!("{config:?}");
        assert!(!debug.contains(SECRET), "{debug}");
        assert!(debug.contains("cache.internal"), "{debug}");
    }

    #[test]
    fn redaction_keeps_everything_but_the_password() {
        assert_eq!(
            redact_url("redis://127.0.0.1:6379/"),
            "redis://127.0.0.1:6379/"
        );
        assert_eq!(redact_url("redis://u:p@h:1/2"), "redis://u:***@h:1/2");
        assert_eq!(redact_url("redis://u@h:1/"), "redis://u@h:1/");
        assert_eq!(redact_url("redis://u:p:q@h/"), "redis://u:***@h/");
        assert_eq!(redact_url("nonsense"), "(not a URL)");
    }
}
