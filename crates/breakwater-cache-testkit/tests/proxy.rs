//! Tests for `FaultProxy` in front of a real `redis-server`.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

use breakwater_cache_testkit::{Fault, FaultProxy, RedisServer};

const PING: &[u8] = b"*1\r\n$4\r\nPING\r\n";
const PONG: &[u8] = b"+PONG\r\n";
/// Generous bound for anything that should happen "now".
const PATIENCE: Duration = Duration::from_secs(5);

/// Connects with read/write timeouts set so no test can hang.
fn connect(addr: SocketAddr, read_timeout: Duration) -> TcpStream {
    let s = TcpStream::connect_timeout(&addr, PATIENCE).expect("connect to proxy");
    s.set_read_timeout(Some(read_timeout)).unwrap();
    s.set_write_timeout(Some(PATIENCE)).unwrap();
    s
}

/// Sends PING and expects PONG.
fn ping(s: &mut TcpStream) {
    s.write_all(PING).unwrap();
    let mut buf = [0u8; PONG.len()];
    s.read_exact(&mut buf).expect("PONG");
    assert_eq!(&buf, PONG);
}

/// Polls `cond` until it holds or `PATIENCE` runs out.
fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + PATIENCE;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        thread::sleep(Duration::from_millis(5));
    }
}

/// Whether `kind` is what a read timeout returns.
fn is_timeout(kind: ErrorKind) -> bool {
    matches!(kind, ErrorKind::WouldBlock | ErrorKind::TimedOut)
}

/// Asserts that the next read on `s` sees EOF or a connection error, not
/// data and not a timeout.
fn assert_closed(s: &mut TcpStream) {
    let mut buf = [0u8; 64];
    match s.read(&mut buf) {
        Ok(0) => {}
        Ok(n) => panic!("expected a closed connection, read {:?}", &buf[..n]),
        Err(e) => assert!(!is_timeout(e.kind()), "expected a closed connection: {e}"),
    }
}

#[test]
fn pass_forwards_and_counts_connections() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr());
    assert_eq!(proxy.fault(), Fault::Pass);
    assert_ne!(proxy.addr().port(), 6379);
    assert_ne!(proxy.addr().port(), server.port());
    assert!(proxy.addr().ip().is_loopback());
    assert_eq!(proxy.upstream(), server.addr());
    assert_eq!(
        proxy.url(),
        format!("redis://127.0.0.1:{}/", proxy.addr().port())
    );
    assert_eq!(proxy.connections(), 0);

    let mut a = connect(proxy.addr(), PATIENCE);
    ping(&mut a);
    assert_eq!(proxy.connections(), 1);
    let mut b = connect(proxy.addr(), PATIENCE);
    ping(&mut b);
    ping(&mut a);
    assert_eq!(proxy.connections(), 2);

    // A larger exchange survives intact.
    let value = "x".repeat(200_000);
    let set = format!(
        "*3\r\n$3\r\nSET\r\n$1\r\nk\r\n${}\r\n{value}\r\n",
        value.len()
    );
    a.write_all(set.as_bytes()).unwrap();
    let mut ok = [0u8; 5];
    a.read_exact(&mut ok).unwrap();
    assert_eq!(&ok, b"+OK\r\n");
    assert_eq!(server.command(&["STRLEN", "k"]).unwrap(), "200000");
    b.write_all(b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n").unwrap();
    let expected = format!("${}\r\n{value}\r\n", value.len());
    let mut got = vec![0u8; expected.len()];
    b.read_exact(&mut got).unwrap();
    assert!(got == expected.as_bytes(), "GET through the proxy differs");

    drop(a);
    eventually("connection count to drop to 1", || proxy.connections() == 1);
    drop(b);
    eventually("connection count to drop to 0", || proxy.connections() == 0);
}

#[test]
fn delay_holds_replies() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr());
    let delay = Duration::from_millis(200);
    proxy.set(Fault::Delay(delay));
    assert_eq!(proxy.fault(), Fault::Delay(delay));

    let mut s = connect(proxy.addr(), PATIENCE);
    let started = Instant::now();
    ping(&mut s);
    let elapsed = started.elapsed();
    assert!(
        elapsed >= delay,
        "PING answered after {elapsed:?}, before {delay:?}"
    );

    // Switching an existing connection back to Pass works.
    proxy.set(Fault::Pass);
    ping(&mut s);
}

#[test]
fn blackhole_swallows_requests() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr());
    let mut old = connect(proxy.addr(), Duration::from_millis(300));
    ping(&mut old);

    proxy.set(Fault::Blackhole);
    assert_eq!(proxy.fault(), Fault::Blackhole);
    // Existing connections go silent...
    old.write_all(PING).unwrap();
    let mut buf = [0u8; 16];
    let err = old.read(&mut buf).expect_err("no reply while black-holed");
    assert!(is_timeout(err.kind()), "{err}");
    // ...and new ones are accepted but never answered.
    let mut new = connect(proxy.addr(), Duration::from_millis(300));
    new.write_all(PING).unwrap();
    let err = new.read(&mut buf).expect_err("no reply while black-holed");
    assert!(is_timeout(err.kind()), "{err}");
    assert_eq!(proxy.connections(), 2);

    proxy.set(Fault::Pass);
    let mut fresh = connect(proxy.addr(), PATIENCE);
    ping(&mut fresh);
}

#[test]
fn reset_closes_open_and_new_connections() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr());
    let mut old = connect(proxy.addr(), PATIENCE);
    ping(&mut old);
    assert_eq!(proxy.connections(), 1);

    proxy.set(Fault::Reset);
    assert_eq!(proxy.connections(), 0);
    assert_closed(&mut old);

    // New connections are accepted by the kernel, then closed by the proxy.
    let mut new = connect(proxy.addr(), PATIENCE);
    let _ = new.write_all(PING); // may already fail
    assert_closed(&mut new);
    assert_eq!(proxy.connections(), 0);

    proxy.set(Fault::Pass);
    let mut fresh = connect(proxy.addr(), PATIENCE);
    ping(&mut fresh);
}

#[test]
fn refuse_closes_the_port_and_pass_reopens_it() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr());
    let addr = proxy.addr();
    let mut old = connect(addr, PATIENCE);
    ping(&mut old);

    proxy.set(Fault::Refuse);
    assert_eq!(proxy.fault(), Fault::Refuse);
    let err = TcpStream::connect_timeout(&addr, PATIENCE).expect_err("refused");
    assert_eq!(err.kind(), ErrorKind::ConnectionRefused, "{err}");
    assert_closed(&mut old);
    assert_eq!(proxy.connections(), 0);

    proxy.set(Fault::Pass);
    assert_eq!(proxy.addr(), addr);
    let mut fresh = connect(addr, PATIENCE);
    ping(&mut fresh);

    // Refuse -> Blackhole also re-opens the port (accepting, not answering).
    proxy.set(Fault::Refuse);
    proxy.set(Fault::Blackhole);
    let mut silent = connect(addr, Duration::from_millis(100));
    silent.write_all(PING).unwrap();
    let mut buf = [0u8; 16];
    let err = silent
        .read(&mut buf)
        .expect_err("no reply while black-holed");
    assert!(is_timeout(err.kind()), "{err}");
}

#[test]
fn upstream_down_closes_client() {
    let mut server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr());
    server.kill();
    let mut s = connect(proxy.addr(), PATIENCE);
    let _ = s.write_all(PING);
    assert_closed(&mut s);
    eventually("connection count to drop to 0", || proxy.connections() == 0);
}

#[test]
fn drop_closes_everything() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr());
    let addr = proxy.addr();
    let mut passing = connect(addr, PATIENCE);
    ping(&mut passing);
    proxy.set(Fault::Delay(Duration::from_secs(60)));
    let mut delayed = connect(addr, PATIENCE);
    delayed.write_all(PING).unwrap();
    thread::sleep(Duration::from_millis(50)); // let the proxy read and hold it

    let started = Instant::now();
    drop(proxy);
    let took = started.elapsed();
    // Not a timing assertion on the proxy's speed: only that Drop does not
    // wait for the 60 s delay.
    assert!(took < Duration::from_secs(30), "drop took {took:?}");

    assert_closed(&mut passing);
    assert_closed(&mut delayed);
    assert!(
        TcpStream::connect_timeout(&addr, PATIENCE).is_err(),
        "connect succeeded after drop"
    );
}
