//! Redis URLs: parsed with `TCP_NODELAY` on, and shown (in errors, logs
//! and `Debug`) with their passwords masked.

use redis::IntoConnectionInfo;

use crate::error::{Error, ErrorKind};

/// A URL redis-rs refused, named with its password masked.
pub(super) fn invalid_url(url: &str, err: &redis::RedisError) -> Error {
    let reason = mask_secrets(&err.to_string(), url);
    Error::new(
        ErrorKind::Config,
        format!("invalid redis url {:?}: {reason}", redact_url(url)),
    )
}

/// `url` with its password masked, for errors, logs and `Debug`:
/// `redis://user:hunter2@host/0` → `redis://user:***@host/0`, a bare
/// `redis://secret@host` → `redis://***@host`, and a `pass=`/`password=`
/// query parameter (`redis+unix:` URLs) → `pass=***`. It works on the text
/// alone, so a URL that does not parse is masked too; everything up to the
/// last `@` counts as credentials (more is masked, never less).
pub(crate) fn redact_url(url: &str) -> String {
    let (scheme, rest) = match url.find("://") {
        Some(i) => url.split_at(i + 3),
        None => ("", url),
    };
    let rest = match rest.rfind('@') {
        Some(at) => {
            let (userinfo, host) = rest.split_at(at);
            match userinfo.find(':') {
                Some(colon) => format!("{}:***{host}", &userinfo[..colon]),
                None => format!("***{host}"),
            }
        }
        None => rest.to_owned(),
    };
    let mut out = String::with_capacity(scheme.len() + rest.len());
    out.push_str(scheme);
    let mut rest = rest.as_str();
    // Query parameters that carry a password.
    while let Some(i) = find_password_param(rest) {
        let (head, tail) = rest.split_at(i);
        out.push_str(head);
        let eq = tail.find('=').map_or(tail.len(), |e| e + 1);
        out.push_str(&tail[..eq]);
        out.push_str("***");
        let end = tail[eq..].find('&').map_or(tail.len(), |e| eq + e);
        rest = &tail[end..];
    }
    out.push_str(rest);
    out
}

/// Where a `pass=` or `password=` query parameter starts in `s`.
fn find_password_param(s: &str) -> Option<usize> {
    ["?pass=", "&pass=", "?password=", "&password="]
        .iter()
        .filter_map(|p| s.find(p).map(|i| i + 1))
        .min()
}

/// `text` with every copy of `url`, and of the password in it, masked.
pub(super) fn mask_secrets(text: &str, url: &str) -> String {
    let mut text = text.replace(url, &redact_url(url));
    let secrets = url.find("://").map_or(url, |i| &url[i + 3..]);
    if let Some(at) = secrets.rfind('@') {
        let userinfo = &secrets[..at];
        let password = userinfo.find(':').map_or(userinfo, |c| &userinfo[c + 1..]);
        if !password.is_empty() {
            text = text.replace(password, "***");
        }
    }
    text
}

/// The URL parsed, with `TCP_NODELAY` on: redis-rs leaves Nagle's algorithm
/// on, and a small command written while an earlier one is unacknowledged
/// then waits for the peer's delayed ACK (up to 40 ms on Linux) — measured
/// here as waiters woken 3 to 40 ms after a fill instead of well under 1 ms.
pub(super) fn connection_info(url: &str) -> redis::RedisResult<redis::ConnectionInfo> {
    let info = url.into_connection_info()?;
    let tcp = info.tcp_settings().clone().set_nodelay(true);
    Ok(info.set_tcp_settings(tcp))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_redacted() {
        for (url, redacted) in [
            ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
            (
                "redis://user:hunter2@host:notaport/0",
                "redis://user:***@host:notaport/0",
            ),
            ("redis://:hunter2@host", "redis://:***@host"),
            ("redis://hunter2@host", "redis://***@host"),
            ("rediss://u:p@ss:w/rd@host/0", "rediss://u:***@host/0"),
            ("user:hunter2@host", "user:***@host"),
            (
                "redis+unix:///tmp/r.sock?db=1&pass=hunter2&x=1",
                "redis+unix:///tmp/r.sock?db=1&pass=***&x=1",
            ),
            (
                "redis+unix:///tmp/r.sock?password=hunter2",
                "redis+unix:///tmp/r.sock?password=***",
            ),
            ("", ""),
        ] {
            assert_eq!(redact_url(url), redacted, "{url}");
        }
        assert_eq!(
            mask_secrets("bad redis://u:hunter2@h and hunter2", "redis://u:hunter2@h"),
            "bad redis://u:***@h and ***"
        );
    }

    #[test]
    fn connections_turn_nagle_off() {
        let info = connection_info("redis://127.0.0.1:6390/2").unwrap();
        assert!(info.tcp_settings().nodelay());
        assert_eq!(info.redis_settings().db(), 2);
    }
}
