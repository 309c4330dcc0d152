//! A tiny hand-written RESP2 encoder and single-reply reader.

use std::io::{self, BufRead, Write};

/// Encodes `args` as a RESP array of bulk strings and writes it to `w`.
pub(crate) fn write_command<W: Write>(w: &mut W, args: &[&str]) -> io::Result<()> {
    let mut buf = Vec::with_capacity(16 + args.iter().map(|a| a.len() + 16).sum::<usize>());
    buf.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
    for arg in args {
        buf.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
        buf.extend_from_slice(arg.as_bytes());
        buf.extend_from_slice(b"\r\n");
    }
    w.write_all(&buf)?;
    w.flush()
}

fn invalid(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.into())
}

/// Reads one line terminated by `\r\n`, returning it without the terminator.
fn read_line<R: BufRead>(r: &mut R) -> io::Result<String> {
    let mut line = Vec::new();
    r.read_until(b'\n', &mut line)?;
    if line.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "connection closed before a full RESP reply was read",
        ));
    }
    if !line.ends_with(b"\r\n") {
        return Err(invalid("RESP line not terminated by CRLF"));
    }
    line.truncate(line.len() - 2);
    String::from_utf8(line).map_err(|_| invalid("RESP line is not UTF-8"))
}

fn parse_len(s: &str) -> io::Result<i64> {
    s.parse::<i64>()
        .map_err(|_| invalid(format!("bad RESP length {s:?}")))
}

/// Reads exactly one RESP reply and renders it as text:
///
/// * simple string `+OK` → `OK`
/// * error `-ERR x` → `-ERR x` (the leading `-` is kept so errors are visible)
/// * integer `:5` → `5`
/// * bulk string → its contents (lossy UTF-8); null bulk `$-1` → `(nil)`
/// * array → items rendered recursively and joined by `\n`; null array → `(nil)`
pub(crate) fn read_reply<R: BufRead>(r: &mut R) -> io::Result<String> {
    let line = read_line(r)?;
    let Some(kind) = line.chars().next() else {
        return Err(invalid("empty RESP line"));
    };
    let rest = &line[kind.len_utf8()..];
    match kind {
        '+' | ':' => Ok(rest.to_owned()),
        '-' => Ok(line),
        '$' => {
            let len = parse_len(rest)?;
            if len < 0 {
                return Ok("(nil)".to_owned());
            }
            let len = usize::try_from(len).map_err(|_| invalid("bulk length overflow"))?;
            let mut data = vec![0u8; len + 2];
            r.read_exact(&mut data)?;
            if !data.ends_with(b"\r\n") {
                return Err(invalid("bulk string not terminated by CRLF"));
            }
            data.truncate(len);
            Ok(String::from_utf8_lossy(&data).into_owned())
        }
        '*' => {
            let len = parse_len(rest)?;
            if len < 0 {
                return Ok("(nil)".to_owned());
            }
            let mut items = Vec::new();
            for _ in 0..len {
                items.push(read_reply(r)?);
            }
            Ok(items.join("\n"))
        }
        other => Err(invalid(format!("unsupported RESP type byte {other:?}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> io::Result<String> {
        read_reply(&mut s.as_bytes())
    }

    #[test]
    fn encodes_bulk_array() {
        let mut out = Vec::new();
        write_command(&mut out, &["SET", "k", ""]).unwrap();
        assert_eq!(out, b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$0\r\n\r\n");
    }

    #[test]
    fn parses_reply_kinds() {
        assert_eq!(parse("+PONG\r\n").unwrap(), "PONG");
        assert_eq!(parse("-ERR nope\r\n").unwrap(), "-ERR nope");
        assert_eq!(parse(":-3\r\n").unwrap(), "-3");
        assert_eq!(parse("$5\r\na\r\nbc\r\n").unwrap(), "a\r\nbc");
        assert_eq!(parse("$-1\r\n").unwrap(), "(nil)");
        assert_eq!(parse("*-1\r\n").unwrap(), "(nil)");
        assert_eq!(
            parse("*3\r\n$1\r\na\r\n:2\r\n$-1\r\n").unwrap(),
            "a\n2\n(nil)"
        );
        assert_eq!(parse("*0\r\n").unwrap(), "");
    }

    #[test]
    fn rejects_garbage() {
        assert!(parse("").is_err());
        assert!(parse("+PONG").is_err());
        assert!(parse("?x\r\n").is_err());
        assert!(parse("$5\r\nab\r\n").is_err());
    }
}
