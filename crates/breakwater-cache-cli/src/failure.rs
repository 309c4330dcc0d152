//! How a subcommand fails: one exit-code convention for every subcommand
//! and one line on stderr that says what to fix.
//!
//! - exit code 2: a usage or configuration error (a bad option value, a URL
//!   that does not parse, a `--redis` whose server answers but is not a
//!   Redis); running again as typed cannot succeed;
//! - exit code 1: a failure at run time (Redis unreachable, a command
//!   failed); the same command may succeed later.

use std::fmt;
use std::process::ExitCode;
use std::time::Duration;

/// Why a subcommand stopped.
#[derive(Debug)]
pub(crate) enum Failure {
    /// The command line or configuration is wrong (exit code 2).
    Usage(String),
    /// Something failed while running (exit code 1).
    Runtime(String),
}

impl Failure {
    /// A usage or configuration error.
    pub(crate) fn usage(message: impl fmt::Display) -> Self {
        Failure::Usage(message.to_string())
    }

    /// A failure at run time.
    pub(crate) fn runtime(message: impl fmt::Display) -> Self {
        Failure::Runtime(message.to_string())
    }

    /// Prints the message as one line under `command`'s name and returns
    /// the exit code.
    pub(crate) fn exit(&self, command: &str) -> ExitCode {
        let one_line = self.to_string().replace('\n', " ");
        eprintln!("breakwater {command}: {one_line}");
        match self {
            Failure::Usage(_) => ExitCode::from(2),
            Failure::Runtime(_) => ExitCode::FAILURE,
        }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::Usage(message) | Failure::Runtime(message) => f.write_str(message),
        }
    }
}

impl From<breakwater_cache::Error> for Failure {
    /// The library's configuration and key errors are usage errors; the
    /// rest happened at run time.
    fn from(err: breakwater_cache::Error) -> Self {
        if err.is_config() || err.is_invalid_key() {
            Failure::usage(err)
        } else {
            Failure::runtime(err)
        }
    }
}

impl From<breakwater_cache::ConfigError> for Failure {
    fn from(err: breakwater_cache::ConfigError) -> Self {
        Failure::usage(err)
    }
}

/// Reports the result of a subcommand: exit code 0, or the failure's.
pub(crate) fn finish(command: &str, result: Result<(), Failure>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => failure.exit(command),
    }
}

/// `url` with its password, if any, replaced by `***`: URLs are printed in
/// reports and errors, secrets are not.
pub(crate) fn shown(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let (authority, path) = rest.split_at(authority_end);
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => {
            let user = userinfo.split_once(':').map_or("", |(user, _)| user);
            if userinfo.contains(':') {
                format!("{scheme}://{user}:***@{host}{path}")
            } else {
                format!("{scheme}://***@{host}{path}")
            }
        }
        None => url.to_owned(),
    }
}

/// A URL that does not parse: a usage error that names the option.
pub(crate) fn bad_url(url: &str, err: impl fmt::Display) -> Failure {
    // The parser's message may quote the URL, password and all.
    let err = err.to_string().replace(url, &shown(url));
    Failure::usage(format!(
        "--redis {:?} is not a Redis URL ({err}); expected e.g. redis://127.0.0.1:6379",
        shown(url)
    ))
}

/// A Redis that could not be reached or did not answer as one: what to
/// check.
///
/// When a node of `url` (one URL, or a cluster's comma-separated list)
/// answers a raw `PING` with something that is not RESP (an HTTP server,
/// PostgreSQL, SSH), that is the message, a configuration error: `--redis`
/// names the wrong port. Otherwise it is a runtime failure: the server is
/// down, unreachable, or refused the command.
pub(crate) async fn unreachable(url: &str, err: impl fmt::Display) -> Failure {
    for node in url.split(',') {
        if let Some(not_redis) = not_redis(node.trim()).await {
            return Failure::usage(not_redis);
        }
    }
    Failure::runtime(format!(
        "cannot reach Redis at {} ({err}); check --redis and that the server is running",
        shown(url)
    ))
}

/// How long the probe waits to connect, and then for a reply.
const PROBE_WAIT: Duration = Duration::from_secs(2);

/// The first bytes of every RESP2 and RESP3 reply.
const RESP_TYPES: &[u8] = b"+-:$*_,#!=(%~>|";

/// Why the server at `url` is not a Redis, if it answered and is not one:
/// it is sent `PING\r\n` (an inline command every Redis answers, with
/// `+PONG` or an error such as `-NOAUTH`) and its first byte is looked at.
/// `None` when it is one, when nothing answered in time, for a TLS URL (a
/// raw probe cannot speak TLS) and for a URL that does not parse.
async fn not_redis(url: &str) -> Option<String> {
    use redis::{ConnectionAddr, IntoConnectionInfo};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let info = url.into_connection_info().ok()?;
    let ConnectionAddr::Tcp(host, port) = info.addr() else {
        return None;
    };
    let at = if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    };
    let mut stream = tokio::time::timeout(
        PROBE_WAIT,
        tokio::net::TcpStream::connect((host.as_str(), *port)),
    )
    .await
    .ok()?
    .ok()?;
    stream.write_all(b"PING\r\n").await.ok()?;
    let mut reply = [0u8; 64];
    let read = tokio::time::timeout(PROBE_WAIT, stream.read(&mut reply))
        .await
        .ok()?;
    let advice = "is --redis pointing at the right port?";
    match read {
        Ok(0) | Err(_) => Some(format!(
            "{at} accepted the connection but closed it without a Redis reply (it does not \
             speak RESP): {advice}"
        )),
        Ok(n) if RESP_TYPES.contains(&reply[0]) => {
            let _ = n;
            None
        }
        // A TLS record (alert or handshake): a TLS port, or a TLS proxy.
        Ok(_) if matches!(reply[0], 0x15 | 0x16) => Some(format!(
            "{at} answered with TLS, not as a plain Redis server (it does not speak RESP \
             without TLS): use a rediss:// URL, or is --redis pointing at the right port?"
        )),
        Ok(n) => Some(format!(
            "{at} answered, but not as a Redis server (it does not speak RESP; it replied \
             {:?}): {advice}",
            printable(&reply[..n])
        )),
    }
}

/// The first line of `bytes`, printable ASCII only, at most 40 characters.
fn printable(bytes: &[u8]) -> String {
    bytes
        .iter()
        .take_while(|b| **b != b'\r' && **b != b'\n')
        .take(40)
        .map(|&b| {
            if b.is_ascii_graphic() || b == b' ' {
                char::from(b)
            } else {
                '?'
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_not_shown() {
        assert_eq!(
            shown("redis://127.0.0.1:6379/0"),
            "redis://127.0.0.1:6379/0"
        );
        assert_eq!(
            shown("redis://user:secret@host:6379/0"),
            "redis://user:***@host:6379/0"
        );
        assert_eq!(shown("rediss://:secret@host"), "rediss://:***@host");
        assert_eq!(shown("redis://secret@host"), "redis://***@host");
        assert_eq!(shown("not-a-url"), "not-a-url");
    }

    #[test]
    fn a_reply_is_shown_as_one_printable_line() {
        assert_eq!(
            printable(b"HTTP/1.1 400 Bad Request\r\n\r\n"),
            "HTTP/1.1 400 Bad Request"
        );
        assert_eq!(printable(b"N\x00\xff"), "N??");
    }

    #[test]
    fn usage_exits_2_and_runtime_1() {
        assert_eq!(Failure::usage("x").exit("t"), ExitCode::from(2));
        assert_eq!(Failure::runtime("x").exit("t"), ExitCode::FAILURE);
    }
}
