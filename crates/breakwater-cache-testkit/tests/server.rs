//! Tests that start real `redis-server` processes.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::thread;
use std::time::Duration;

use breakwater_cache_testkit::{RedisServer, TestCerts};

/// Whether something still accepts connections and answers PING on `server`'s address.
fn answers(addr: std::net::SocketAddr) -> bool {
    let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_millis(200)) else {
        return false;
    };
    s.set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    if s.write_all(b"*1\r\n$4\r\nPING\r\n").is_err() {
        return false;
    }
    let mut buf = [0u8; 7];
    s.read_exact(&mut buf).is_ok() && &buf == b"+PONG\r\n"
}

#[test]
fn start_answers_ping() {
    let server = RedisServer::start();
    assert_ne!(server.port(), 6379);
    assert_eq!(server.command(&["PING"]).unwrap(), "PONG");
    assert_eq!(
        server.url(),
        format!("redis://127.0.0.1:{}/", server.port())
    );
    assert_eq!(server.addr().port(), server.port());
    assert!(server.addr().ip().is_loopback());
}

/// A TLS server speaks TLS only: the kit's commands go over TLS (with the
/// client certificate), a plain connection gets no answer, and a restart
/// keeps it so.
#[test]
fn a_tls_server_listens_for_tls_only() {
    let certs = TestCerts::generate();
    let mut server = RedisServer::start_tls(&certs);
    assert!(server.is_tls());
    assert_eq!(
        server.url(),
        format!("rediss://127.0.0.1:{}/", server.port())
    );
    assert_eq!(server.command(&["SET", "k", "v"]).unwrap(), "OK");
    assert_eq!(server.command(&["GET", "k"]).unwrap(), "v");
    assert_eq!(
        server.command(&["CONFIG", "GET", "port"]).unwrap(),
        "port\n0"
    );
    assert!(!answers(server.addr()), "a plain-text PING was answered");
    server.restart();
    assert_eq!(server.command(&["PING"]).unwrap(), "PONG");
    assert!(!answers(server.addr()));
    assert!(!format!("{certs:?}").contains("PRIVATE KEY"));
}

#[test]
fn command_renders_replies() {
    let server = RedisServer::start();
    assert_eq!(server.command(&["SET", "k", "v w"]).unwrap(), "OK");
    assert_eq!(server.command(&["GET", "k"]).unwrap(), "v w");
    assert_eq!(server.command(&["GET", "missing"]).unwrap(), "(nil)");
    assert_eq!(server.command(&["DBSIZE"]).unwrap(), "1");
    assert_eq!(server.command(&["PTTL", "k"]).unwrap(), "-1");
    assert_eq!(server.command(&["RPUSH", "l", "a", "b"]).unwrap(), "2");
    assert_eq!(server.command(&["LRANGE", "l", "0", "-1"]).unwrap(), "a\nb");
    let err = server.command(&["NOSUCHCOMMAND"]).unwrap();
    assert!(err.starts_with("-ERR"), "{err}");
    assert_eq!(server.command(&["FLUSHALL"]).unwrap(), "OK");
    assert_eq!(server.command(&["DBSIZE"]).unwrap(), "0");
    // No persistence configured.
    assert_eq!(
        server.command(&["CONFIG", "GET", "save"]).unwrap(),
        "save\n"
    );
    assert_eq!(
        server.command(&["CONFIG", "GET", "appendonly"]).unwrap(),
        "appendonly\nno"
    );
}

#[test]
fn start_with_passes_config() {
    let server = RedisServer::start_with(&["--maxmemory", "10mb"]);
    assert_eq!(
        server.command(&["CONFIG", "GET", "maxmemory"]).unwrap(),
        "maxmemory\n10485760"
    );
}

#[test]
fn commandstats_after_resetstat() {
    let server = RedisServer::start();
    server.command(&["SET", "a", "1"]).unwrap();
    assert_eq!(server.command(&["CONFIG", "RESETSTAT"]).unwrap(), "OK");
    server.command(&["GET", "a"]).unwrap();
    let stats = server.command(&["INFO", "commandstats"]).unwrap();
    assert!(stats.contains("# Commandstats"), "{stats}");
    assert!(stats.contains("cmdstat_get:calls=1"), "{stats}");
    assert!(!stats.contains("cmdstat_set:"), "{stats}");
}

#[test]
fn parallel_servers_get_distinct_ports() {
    let handles: Vec<_> = (0..4).map(|_| thread::spawn(RedisServer::start)).collect();
    let servers: Vec<RedisServer> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let mut ports: Vec<u16> = servers.iter().map(RedisServer::port).collect();
    ports.sort_unstable();
    ports.dedup();
    assert_eq!(ports.len(), servers.len());
    for (i, s) in servers.iter().enumerate() {
        let key = format!("k{i}");
        s.command(&["SET", &key, "x"]).unwrap();
    }
    for s in &servers {
        assert_eq!(s.command(&["DBSIZE"]).unwrap(), "1");
    }
}

#[test]
fn restart_keeps_port_and_loses_data() {
    let mut server = RedisServer::start_with(&["--maxmemory", "10mb"]);
    let port = server.port();
    server.command(&["SET", "k", "v"]).unwrap();
    server.restart();
    assert!(server.is_running());
    assert_eq!(server.port(), port);
    assert_eq!(server.command(&["PING"]).unwrap(), "PONG");
    assert_eq!(server.command(&["GET", "k"]).unwrap(), "(nil)");
    // Extra args survive a restart.
    assert_eq!(
        server.command(&["CONFIG", "GET", "maxmemory"]).unwrap(),
        "maxmemory\n10485760"
    );
}

#[test]
fn restart_after_kill() {
    let mut server = RedisServer::start();
    let port = server.port();
    server.kill();
    server.restart();
    assert_eq!(server.port(), port);
    assert_eq!(server.command(&["PING"]).unwrap(), "PONG");
}

#[test]
fn kill_stops_server_and_is_idempotent() {
    let mut server = RedisServer::start();
    assert!(server.is_running());
    let addr = server.addr();
    server.kill();
    assert!(!server.is_running());
    assert!(TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err());
    assert!(server.command(&["PING"]).is_err());
    server.kill();
    server.pause(); // no-ops on a dead server
    server.resume();
    drop(server);
}

#[test]
fn pause_and_resume() {
    let mut server = RedisServer::start();
    server.pause();
    assert!(server.is_running());

    let mut s = TcpStream::connect_timeout(&server.addr(), Duration::from_secs(1)).unwrap();
    s.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    s.write_all(b"*1\r\n$4\r\nPING\r\n").unwrap();
    let mut buf = [0u8; 16];
    let err = s.read(&mut buf).unwrap_err();
    assert!(
        matches!(err.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut),
        "{err:?}"
    );
    let _ = s.shutdown(Shutdown::Both);

    server.resume();
    assert_eq!(server.command(&["PING"]).unwrap(), "PONG");
}

#[test]
fn drop_of_paused_server_kills_it() {
    let server = RedisServer::start();
    let addr = server.addr();
    server.pause();
    drop(server);
    assert!(!answers(addr));
}

#[test]
fn port_is_closed_after_drop() {
    let server = RedisServer::start();
    let addr = server.addr();
    assert!(answers(addr));
    drop(server);
    assert!(!answers(addr));
    assert!(TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err());
}

#[test]
fn drop_removes_temp_dir() {
    let before = temp_dirs();
    let server = RedisServer::start();
    let during = temp_dirs();
    let created: Vec<_> = during.difference(&before).cloned().collect();
    assert!(!created.is_empty());
    drop(server);
    // Other tests run in parallel and may have created dirs in between, but
    // this server's dir is among `created` and must be gone now.
    assert!(created.iter().any(|d| !d.exists()));
}

#[test]
#[should_panic(expected = "exited")]
fn bad_config_panics_with_output() {
    let _server = RedisServer::start_with(&["--no-such-option", "1"]);
}

fn temp_dirs() -> std::collections::BTreeSet<std::path::PathBuf> {
    let prefix = format!("breakwater-redis-{}-", std::process::id());
    std::fs::read_dir(std::env::temp_dir())
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        .map(|e| e.path())
        .collect()
}

#[test]
fn restart_waits_for_busy_port() {
    let mut server = RedisServer::start();
    let port = server.port();
    server.kill();
    let squatter = std::net::TcpListener::bind(("127.0.0.1", port)).unwrap();
    let releaser = thread::spawn(move || {
        thread::sleep(Duration::from_millis(400));
        drop(squatter);
    });
    server.restart();
    releaser.join().unwrap();
    assert_eq!(server.port(), port);
    assert_eq!(server.command(&["PING"]).unwrap(), "PONG");
}
