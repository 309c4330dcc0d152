//! How a subcommand fails: one exit-code convention for every subcommand
//! and one line on stderr that says what to fix.
//!
//! - exit code 2: a usage or configuration error (a bad option value, a URL
//!   that does not parse); running again as typed cannot succeed;
//! - exit code 1: a failure at run time (Redis unreachable, a command
//!   failed); the same command may succeed later.

use std::fmt;
use std::process::ExitCode;

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

/// A Redis that cannot be reached: a runtime failure that says what to
/// check.
pub(crate) fn unreachable(url: &str, err: impl fmt::Display) -> Failure {
    Failure::runtime(format!(
        "cannot reach Redis at {} ({err}); check --redis and that the server is running",
        shown(url)
    ))
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
    fn usage_exits_2_and_runtime_1() {
        assert_eq!(Failure::usage("x").exit("t"), ExitCode::from(2));
        assert_eq!(Failure::runtime("x").exit("t"), ExitCode::FAILURE);
    }
}
