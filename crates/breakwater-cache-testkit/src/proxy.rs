//! A fault-injecting TCP proxy between a client and an upstream server.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::io::{self, ErrorKind, Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr, SocketAddrV4, TcpListener, TcpStream};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use crate::process::bind_loopback;

/// How often the acceptor polls its non-blocking listener.
const ACCEPT_POLL: Duration = Duration::from_millis(5);
/// Read timeout of the pump loops: how quickly they notice a fault change
/// or shutdown.
const PUMP_POLL: Duration = Duration::from_millis(10);
/// Timeout for connecting to the upstream.
const UPSTREAM_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// How long [`FaultProxy::set`] keeps retrying to re-bind the port after
/// [`Fault::Refuse`].
const REBIND_TIMEOUT: Duration = Duration::from_secs(5);
/// Size of one forwarded chunk.
const CHUNK: usize = 16 * 1024;

/// What a [`FaultProxy`] does with its connections; switch it with
/// [`FaultProxy::set`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Forward bytes both ways.
    Pass,
    /// Forward, but hold every chunk for this long before sending it on
    /// (both directions, order kept). A request/reply round trip is
    /// therefore delayed by at least twice this.
    Delay(Duration),
    /// Accept connections and read what the client sends, but never forward
    /// or answer anything; existing connections go silent too. Bytes read
    /// in either direction while black-holed are discarded, so a connection
    /// that lived through a black hole is usually out of protocol sync:
    /// use a new one afterwards.
    Blackhole,
    /// Close every open connection (both the client and the upstream side),
    /// and close new ones right after accepting them.
    ///
    /// The close is a plain `shutdown` + `close`, so the client normally
    /// sees a FIN (EOF on read), not a true RST: std cannot set
    /// `SO_LINGER` to zero on stable Rust. The kernel still sends an RST
    /// when the proxy closes a socket with unread data, e.g. a new
    /// connection that already sent a request.
    Reset,
    /// Stop listening: new connections are refused (the listener is
    /// closed) and existing connections are closed as with
    /// [`Fault::Reset`]. Switching to any other fault re-binds the **same**
    /// port.
    Refuse,
}

/// A TCP proxy on `127.0.0.1` between a client (the cache) and an upstream
/// (e.g. a [`RedisServer`](crate::RedisServer)), whose behaviour tests can
/// switch at any time with [`FaultProxy::set`].
///
/// It starts in [`Fault::Pass`]. Each client connection gets its own
/// upstream connection. Everything runs on plain threads; dropping the
/// proxy closes every socket and joins every thread (also while unwinding
/// from a panicking test).
///
/// ```no_run
/// use breakwater_cache_testkit::{Fault, FaultProxy, RedisServer};
/// use std::time::Duration;
///
/// let server = RedisServer::start();
/// let proxy = FaultProxy::start(server.addr());
/// let url = proxy.url(); // point the cache here instead of server.url()
/// proxy.set(Fault::Delay(Duration::from_millis(50)));
/// proxy.set(Fault::Blackhole);
/// proxy.set(Fault::Pass);
/// # let _ = url;
/// ```
pub struct FaultProxy {
    shared: Arc<Shared>,
    addr: SocketAddr,
    acceptor: Option<JoinHandle<()>>,
}

struct Shared {
    upstream: SocketAddr,
    state: Mutex<State>,
}

struct State {
    fault: Fault,
    /// `None` while refusing (and after drop).
    listener: Option<TcpListener>,
    /// Open connections, by id. Removing an entry tells its pumps to stop.
    conns: HashMap<u64, Conn>,
    next_id: u64,
    stopping: bool,
    /// One per connection; finished ones are pruned on accept.
    workers: Vec<JoinHandle<()>>,
}

/// Handles (clones) of one connection's sockets, used to shut them down
/// from outside the pump threads.
struct Conn {
    client: TcpStream,
    upstream: Option<TcpStream>,
}

impl Conn {
    fn shutdown(&self) {
        let _ = self.client.shutdown(Shutdown::Both);
        if let Some(upstream) = &self.upstream {
            let _ = upstream.shutdown(Shutdown::Both);
        }
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The current fault, or `None` if connection `id` has been closed by
    /// the proxy (reset, refuse or drop).
    fn conn_fault(&self, id: u64) -> Option<Fault> {
        let state = self.lock();
        (!state.stopping && state.conns.contains_key(&id)).then_some(state.fault)
    }
}

impl FaultProxy {
    /// Binds `127.0.0.1` on a free port (never 6379) and starts forwarding
    /// connections to `upstream`, in [`Fault::Pass`] mode.
    ///
    /// # Panics
    ///
    /// If no loopback port can be bound or the acceptor thread cannot be
    /// spawned.
    pub fn start(upstream: SocketAddr) -> FaultProxy {
        let (listener, port) = bind_loopback();
        listener
            .set_nonblocking(true)
            .unwrap_or_else(|e| panic!("fault proxy: cannot make listener non-blocking: {e}"));
        let shared = Arc::new(Shared {
            upstream,
            state: Mutex::new(State {
                fault: Fault::Pass,
                listener: Some(listener),
                conns: HashMap::new(),
                next_id: 0,
                stopping: false,
                workers: Vec::new(),
            }),
        });
        let acceptor = {
            let shared = Arc::clone(&shared);
            thread::Builder::new()
                .name(format!("fault-proxy-{port}"))
                .spawn(move || accept_loop(&shared))
                .unwrap_or_else(|e| panic!("fault proxy: cannot spawn acceptor thread: {e}"))
        };
        FaultProxy {
            shared,
            addr: SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, port)),
            acceptor: Some(acceptor),
        }
    }

    /// The proxy's listening address, `127.0.0.1:PORT`. It stays the same
    /// across [`Fault::Refuse`].
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The connection URL, `redis://127.0.0.1:PORT/`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.addr.port())
    }

    /// The upstream address connections are forwarded to.
    pub fn upstream(&self) -> SocketAddr {
        self.shared.upstream
    }

    /// Switches the proxy's behaviour, for existing and new connections.
    ///
    /// Closing connections ([`Fault::Reset`], [`Fault::Refuse`]) and
    /// closing or re-opening the listener happen before this returns; the
    /// pump threads pick up the other faults within about 10 ms (and every
    /// chunk read after `set` returns is handled under the new fault).
    ///
    /// # Panics
    ///
    /// When leaving [`Fault::Refuse`], if the same port cannot be bound
    /// again within about 5 seconds (something else took it).
    pub fn set(&self, fault: Fault) {
        let mut state = self.shared.lock();
        state.fault = fault;
        if matches!(fault, Fault::Reset | Fault::Refuse) {
            for (_, conn) in state.conns.drain() {
                conn.shutdown();
            }
        }
        if fault == Fault::Refuse {
            state.listener = None;
        } else if state.listener.is_none() && !state.stopping {
            state.listener = Some(rebind(self.addr));
        }
    }

    /// The current fault.
    pub fn fault(&self) -> Fault {
        self.shared.lock().fault
    }

    /// The number of currently open client connections (accepted and not
    /// yet closed by either side or by the proxy).
    pub fn connections(&self) -> usize {
        self.shared.lock().conns.len()
    }
}

impl fmt::Debug for FaultProxy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.shared.lock();
        f.debug_struct("FaultProxy")
            .field("addr", &self.addr)
            .field("upstream", &self.shared.upstream)
            .field("fault", &state.fault)
            .field("connections", &state.conns.len())
            .finish_non_exhaustive()
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        {
            let mut state = self.shared.lock();
            state.stopping = true;
            state.listener = None;
            for (_, conn) in state.conns.drain() {
                conn.shutdown();
            }
        }
        if let Some(acceptor) = self.acceptor.take() {
            let _ = acceptor.join();
        }
        // The acceptor has stopped, so no new workers can appear.
        let workers = std::mem::take(&mut self.shared.lock().workers);
        for worker in workers {
            let _ = worker.join();
        }
    }
}

/// Binds `addr` again after [`Fault::Refuse`], retrying while it is busy.
fn rebind(addr: SocketAddr) -> TcpListener {
    let deadline = Instant::now() + REBIND_TIMEOUT;
    loop {
        let result = TcpListener::bind(addr).and_then(|l| l.set_nonblocking(true).map(|()| l));
        match result {
            Ok(listener) => return listener,
            Err(e) if Instant::now() >= deadline => {
                panic!("fault proxy: cannot re-bind {addr} after Fault::Refuse: {e}")
            }
            Err(_) => thread::sleep(Duration::from_millis(10)),
        }
    }
}

fn accept_loop(shared: &Arc<Shared>) {
    loop {
        let accepted = {
            let mut state = shared.lock();
            if state.stopping {
                return;
            }
            match state.listener.as_ref().map(TcpListener::accept) {
                Some(Ok((client, _))) => {
                    register(shared, &mut state, client);
                    true
                }
                // WouldBlock, or e.g. out of file descriptors: retry later.
                Some(Err(_)) | None => false,
            }
        };
        if !accepted {
            thread::sleep(ACCEPT_POLL);
        }
    }
}

/// Starts serving a freshly accepted client, or closes it right away.
fn register(shared: &Arc<Shared>, state: &mut State, client: TcpStream) {
    if matches!(state.fault, Fault::Reset | Fault::Refuse) {
        return; // dropping `client` closes it
    }
    if client.set_nonblocking(false).is_err() {
        return;
    }
    let _ = client.set_nodelay(true);
    let Ok(handle) = client.try_clone() else {
        return;
    };
    let id = state.next_id;
    state.next_id += 1;
    state.conns.insert(
        id,
        Conn {
            client: handle,
            upstream: None,
        },
    );
    state.workers.retain(|w| !w.is_finished());
    let worker = {
        let shared = Arc::clone(shared);
        thread::Builder::new()
            .name(format!("fault-proxy-conn-{id}"))
            .spawn(move || serve(&shared, id, client))
    };
    match worker {
        Ok(worker) => state.workers.push(worker),
        Err(_) => {
            if let Some(conn) = state.conns.remove(&id) {
                conn.shutdown();
            }
        }
    }
}

/// Removes a connection from the registry when its worker ends.
struct Deregister<'a> {
    shared: &'a Shared,
    id: u64,
}

impl Drop for Deregister<'_> {
    fn drop(&mut self) {
        self.shared.lock().conns.remove(&self.id);
    }
}

/// One connection's worker: connects upstream, then pumps both ways until
/// both directions are done or the proxy closes the connection.
fn serve(shared: &Shared, id: u64, client: TcpStream) {
    let _deregister = Deregister { shared, id };
    let Ok(upstream) = TcpStream::connect_timeout(&shared.upstream, UPSTREAM_CONNECT_TIMEOUT)
    else {
        let _ = client.shutdown(Shutdown::Both);
        return;
    };
    let _ = upstream.set_nodelay(true);
    {
        let mut state = shared.lock();
        let handle = upstream.try_clone().ok();
        let conn = if state.stopping {
            None
        } else {
            state.conns.get_mut(&id)
        };
        match (conn, handle) {
            (Some(conn), Some(handle)) => conn.upstream = Some(handle),
            _ => {
                // Closed by the proxy while connecting (or cannot clone).
                let _ = client.shutdown(Shutdown::Both);
                let _ = upstream.shutdown(Shutdown::Both);
                return;
            }
        }
    }
    thread::scope(|s| {
        s.spawn(|| pump(shared, id, &upstream, &client));
        pump(shared, id, &client, &upstream);
    });
}

/// Forwards `src` to `dst` under the current fault until `src` is done (its
/// EOF is passed on as a write shutdown of `dst`), an I/O error occurs
/// (both sockets are shut down), or the proxy closes the connection.
fn pump(shared: &Shared, id: u64, src: &TcpStream, dst: &TcpStream) {
    let abort = || {
        let _ = src.shutdown(Shutdown::Both);
        let _ = dst.shutdown(Shutdown::Both);
    };
    let mut buf = vec![0u8; CHUNK];
    // Chunks read but not yet forwarded, with the time they were read.
    let mut queue: VecDeque<(Instant, Vec<u8>)> = VecDeque::new();
    let mut src_open = true;
    loop {
        let Some(fault) = shared.conn_fault(id) else {
            return;
        };
        let now = Instant::now();
        let mut next_due = None;
        match fault {
            Fault::Reset | Fault::Refuse => return,
            Fault::Blackhole => queue.clear(),
            Fault::Pass | Fault::Delay(_) => {
                let delay = match fault {
                    Fault::Delay(delay) => delay,
                    _ => Duration::ZERO,
                };
                while let Some((read_at, _)) = queue.front() {
                    let due = *read_at + delay;
                    if due > now {
                        next_due = Some(due);
                        break;
                    }
                    if let Some((_, chunk)) = queue.pop_front()
                        && write(dst, &chunk).is_err()
                    {
                        abort();
                        return;
                    }
                }
            }
        }
        let wait = next_due.map_or(PUMP_POLL, |due| {
            due.saturating_duration_since(now)
                .clamp(Duration::from_millis(1), PUMP_POLL)
        });
        if !src_open {
            if queue.is_empty() && fault != Fault::Blackhole {
                // Pass the EOF on (held back while black-holed).
                let _ = dst.shutdown(Shutdown::Write);
                return;
            }
            thread::sleep(wait);
            continue;
        }
        if src.set_read_timeout(Some(wait)).is_err() {
            abort();
            return;
        }
        match (&*src).read(&mut buf) {
            Ok(0) => src_open = false,
            Ok(n) => match shared.conn_fault(id) {
                None | Some(Fault::Reset | Fault::Refuse) => return,
                Some(Fault::Blackhole) => {}
                Some(Fault::Pass) if queue.is_empty() => {
                    if write(dst, &buf[..n]).is_err() {
                        abort();
                        return;
                    }
                }
                Some(Fault::Pass | Fault::Delay(_)) => {
                    queue.push_back((Instant::now(), buf[..n].to_vec()));
                }
            },
            Err(e)
                if matches!(
                    e.kind(),
                    ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
                ) => {}
            Err(_) => {
                abort();
                return;
            }
        }
    }
}

fn write(mut dst: &TcpStream, bytes: &[u8]) -> io::Result<()> {
    dst.write_all(bytes)?;
    dst.flush()
}
