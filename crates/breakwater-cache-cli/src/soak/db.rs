//! The soak's database: rows whose value is the number of their last
//! write, served to the worker processes over loopback TCP, one line per
//! request, so that every worker reads and writes the same rows and the
//! parent's checker sees every write.
//!
//! Requests and answers:
//!
//! - `g <row>` → `<seq> <0|1>`: the row's last write and whether the row
//!   exists (a loader's query);
//! - `w <row>` → `<seq>`: the row is written (created or updated);
//! - `d <row>` → `<seq>`: the row is deleted;
//! - `t <group>` → `<seq>`: every row of a group is written again (what a
//!   tag invalidation announces);
//! - `c` → `<seq>`: every row is written again (what a clear announces);
//! - any of them → `down` while the database is down (a nemesis action),
//!   `bad` for a request it does not know.
//!
//! Hand-rolled: a dozen lines of text over a socket; a real database
//! would add a server to start and nothing the soak checks.

use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;

use super::check::{Checker, Scope};

/// The rows, the write sequence, and whether the database is down.
#[derive(Debug)]
pub(crate) struct Rows {
    /// Each row's last write and whether it exists.
    rows: Vec<(u64, bool)>,
    groups: u32,
    seq: u64,
    down_until: Option<Instant>,
    /// Writes so far.
    pub(crate) writes: u64,
    /// Queries so far.
    pub(crate) queries: u64,
}

impl Rows {
    /// `rows` rows in `groups` groups, written as seq 1; every fifth row
    /// does not exist (so "not found" is cached too).
    pub(crate) fn new(rows: u32, groups: u32) -> Self {
        Rows {
            rows: (0..rows).map(|k| (1, k % 5 != 0)).collect(),
            groups: groups.max(1),
            seq: 1,
            down_until: None,
            writes: 0,
            queries: 0,
        }
    }

    /// The database fails every request until `until`.
    pub(crate) fn down(&mut self, until: Instant) {
        self.down_until = Some(until);
    }

    /// The answer to one request line; writes are told to `checker`.
    fn answer(&mut self, line: &str, checker: &Mutex<Checker>) -> String {
        if self.down_until.is_some_and(|until| Instant::now() < until) {
            return "down".to_owned();
        }
        let mut words = line.split_ascii_whitespace();
        let op = words.next().unwrap_or("");
        let arg = words.next().and_then(|w| w.parse::<u32>().ok());
        let rows = self.rows.len() as u32;
        let scope = match (op, arg) {
            ("g", Some(k)) if k < rows => {
                self.queries += 1;
                let (seq, exists) = self.rows[k as usize];
                return format!("{seq} {}", u8::from(exists));
            }
            ("w" | "d", Some(k)) if k < rows => Scope::Key(k),
            ("t", Some(g)) if g < self.groups => Scope::Group(g),
            ("c", None) => Scope::All,
            _ => return "bad".to_owned(),
        };
        self.seq += 1;
        self.writes += 1;
        let seq = self.seq;
        let groups = self.groups as usize;
        for (k, row) in self.rows.iter_mut().enumerate() {
            let touched = match scope {
                Scope::Key(key) => k == key as usize,
                Scope::Group(g) => k % groups == g as usize,
                Scope::All => true,
            };
            if touched {
                row.0 = seq;
                if let Scope::Key(_) = scope {
                    row.1 = op == "w";
                }
            }
        }
        let rows = &self.rows;
        lock(checker).wrote(seq, scope, |k| rows[k as usize].1);
        seq.to_string()
    }
}

/// Serves `rows` on a loopback port until the runtime ends; returns the
/// address. Each query (`g`) takes `latency`, as a database query would.
pub(crate) async fn serve(
    rows: Arc<Mutex<Rows>>,
    checker: Arc<Mutex<Checker>>,
    latency: Duration,
) -> io::Result<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let (rows, checker) = (Arc::clone(&rows), Arc::clone(&checker));
            tokio::spawn(async move {
                let _ = connection(stream, &rows, &checker, latency).await;
            });
        }
    });
    Ok(addr)
}

async fn connection(
    stream: TcpStream,
    rows: &Mutex<Rows>,
    checker: &Mutex<Checker>,
    latency: Duration,
) -> io::Result<()> {
    stream.set_nodelay(true)?;
    let (read, mut write) = stream.into_split();
    let mut lines = BufReader::new(read).lines();
    while let Some(line) = lines.next_line().await? {
        if line.starts_with('g') && !latency.is_zero() {
            tokio::time::sleep(latency).await;
        }
        let mut answer = lock(rows).answer(&line, checker);
        answer.push('\n');
        write.write_all(answer.as_bytes()).await?;
    }
    Ok(())
}

/// The workers' side: a pool of connections to the soak's database.
#[derive(Debug, Clone)]
pub(crate) struct Client {
    addr: SocketAddr,
    idle: Arc<Mutex<Vec<Conn>>>,
}

type Conn = (
    tokio::io::Lines<BufReader<tokio::net::tcp::OwnedReadHalf>>,
    tokio::net::tcp::OwnedWriteHalf,
);

/// What a request to the database failed with.
pub(crate) type DbError = io::Error;

/// How long one request may take before it fails.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

impl Client {
    /// A client of the database at `addr` (connections are made as needed).
    pub(crate) fn new(addr: SocketAddr) -> Self {
        Client {
            addr,
            idle: Arc::default(),
        }
    }

    /// Row `key`: its last write, or `None` if it does not exist.
    pub(crate) async fn query(&self, key: u32) -> Result<Option<u64>, DbError> {
        let answer = self.request(&format!("g {key}")).await?;
        match answer.split_once(' ') {
            Some((seq, "1")) => Ok(Some(parse(seq)?)),
            Some((_, "0")) => Ok(None),
            _ => Err(io::Error::other(format!(
                "the database answered {answer:?}"
            ))),
        }
    }

    /// A write (`w`, `d`, `t`, `c` with its argument); its seq.
    pub(crate) async fn write(&self, request: &str) -> Result<u64, DbError> {
        parse(&self.request(request).await?)
    }

    async fn request(&self, line: &str) -> Result<String, DbError> {
        let pooled = lock(&self.idle).pop();
        let mut conn = match pooled {
            Some(conn) => conn,
            None => {
                let stream = TcpStream::connect(self.addr).await?;
                stream.set_nodelay(true)?;
                let (read, write) = stream.into_split();
                (BufReader::new(read).lines(), write)
            }
        };
        let exchange = async {
            conn.1.write_all(format!("{line}\n").as_bytes()).await?;
            conn.0
                .next_line()
                .await?
                .ok_or_else(|| io::Error::other("the database closed the connection"))
        };
        // A connection whose request timed out or failed is dropped, not
        // put back: its answer may still be on the way.
        let answer = tokio::time::timeout(REQUEST_TIMEOUT, exchange)
            .await
            .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "the database timed out"))??;
        lock(&self.idle).push(conn);
        Ok(answer)
    }
}

fn parse(answer: &str) -> Result<u64, DbError> {
    answer.parse().map_err(|_| {
        if answer == "down" {
            io::Error::other("the database is down")
        } else {
            io::Error::other(format!("the database answered {answer:?}"))
        }
    })
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_number_rows_and_tell_the_checker() {
        let checker = Mutex::new(Checker::new(10, 2, 0, 0));
        let mut rows = Rows::new(10, 2);
        assert_eq!(rows.answer("g 0", &checker), "1 0");
        assert_eq!(rows.answer("g 1", &checker), "1 1");
        assert_eq!(rows.answer("w 0", &checker), "2");
        assert_eq!(rows.answer("g 0", &checker), "2 1");
        assert_eq!(rows.answer("t 1", &checker), "3");
        assert_eq!(rows.answer("g 3", &checker), "3 1");
        assert_eq!(rows.answer("g 2", &checker), "1 1");
        assert_eq!(rows.answer("d 3", &checker), "4");
        assert_eq!(rows.answer("c", &checker), "5");
        assert_eq!(rows.answer("g 3", &checker), "5 0");
        assert_eq!(rows.answer("g 10", &checker), "bad");
        assert_eq!(rows.answer("x", &checker), "bad");
        rows.down(Instant::now() + Duration::from_secs(60));
        assert_eq!(rows.answer("g 1", &checker), "down");
        assert_eq!(rows.writes, 4);
        let mut c = lock(&checker);
        assert!(c.acked(1, 4, 10, super::super::check::Mode::Hard));
        assert!(!c.acked(1, 6, 10, super::super::check::Mode::Hard));
    }
}
