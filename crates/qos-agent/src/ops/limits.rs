//! Bounded listeners for the metrics port and the control socket, so that no client (an unprivileged user
//! flooding the loopback metrics port, one that connects and never reads) can take the descriptors, the CPU or the
//! attention the agent needs for cgroup files and weights.
//!
//! - **A bounded number of connections** ([`Limits::max_connections`]: 64 metrics, 16 control): a permit is taken
//!   per connection. When every permit is taken, a new connection takes the place of the oldest *idle* one (one
//!   whose request has not yet arrived whole: see [`Conn::busy`]), which is closed; when none is idle, the new one
//!   is closed at once (the client sees the connection reset or closed without an answer). The flood can thus hold
//!   at most that many of the agent's descriptors; everything else stays for the cgroup files (counter files are
//!   kept open, one per container; a weight read or write opens one file at a time) and the runtime's API sockets.
//!   And connections held open without a request cannot lock out a client that sends one (a scrape, a probe): it
//!   pushes the oldest of them out.
//! - **A deadline per connection** ([`Limits::deadline`], 5 s): a client that sends nothing, or reads nothing, is
//!   dropped when it passes, whatever it does meanwhile.
//! - **Paced accepting** ([`Limits::accepts_per_second`]): beyond that many accepts in a second (served or refused)
//!   the listener stops accepting until the second is over; further clients wait in the kernel's listen backlog,
//!   which costs the agent nothing. This keeps the agent's CPU bounded under a connect flood.
//! - **Accept errors back off** ([`ACCEPT_ERROR_BACKOFF`]): `EMFILE` (or any error) is not retried in a busy loop.
//!
//! Each connection is handled in its own task: the daemon loop only hands over the data (e.g. the status table) and
//! goes on.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::{Notify, Semaphore};
use tokio::time::Instant;
use tracing::{debug, warn};

/// How much one listener may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Connections served at once; more are closed at once.
    pub max_connections: usize,
    /// A connection is dropped this long after it was accepted, done or not.
    pub deadline: Duration,
    /// Accepts (served or refused) per second; beyond it, accepting pauses until the second is over.
    pub accepts_per_second: u32,
}

/// The metrics port: Prometheus scrapes a few times a minute.
pub const METRICS: Limits = Limits { max_connections: 64, deadline: Duration::from_secs(5), accepts_per_second: 128 };

/// The control socket (root only): `status` clients.
pub const CONTROL: Limits = Limits { max_connections: 16, deadline: Duration::from_secs(5), accepts_per_second: 64 };

/// Pause after a failed accept (e.g. `EMFILE`), instead of retrying at once in a busy loop.
pub const ACCEPT_ERROR_BACKOFF: Duration = Duration::from_millis(100);

/// How long a new connection waits for the slot of the idle one closed for it (its task only has to notice).
const EVICTION_WAIT: Duration = Duration::from_millis(100);

/// A served connection's standing with its listener, handed to the handler with the stream. The connection is
/// *idle* (it may be closed to make room for a new one when every slot is taken, oldest first) until the handler
/// calls [`Conn::busy`]: once the client's request arrived whole, so that a request being answered is never cut
/// off for a newcomer.
#[derive(Debug)]
pub struct Conn {
    idle: Arc<IdleSet>,
    id: u64,
}

impl Conn {
    /// The client's request arrived: from now on only the deadline ends this connection.
    pub fn busy(&self) {
        self.idle.remove(self.id);
    }
}

/// The idle connections, oldest first (ids are handed out in accepting order), each with what closes it.
#[derive(Debug, Default)]
struct IdleSet(Mutex<BTreeMap<u64, Arc<Notify>>>);

impl IdleSet {
    fn insert(&self, id: u64) -> Arc<Notify> {
        let close = Arc::new(Notify::new());
        self.0.lock().unwrap_or_else(|e| e.into_inner()).insert(id, close.clone());
        close
    }

    fn remove(&self, id: u64) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).remove(&id);
    }

    /// Closes the oldest idle connection; false when none is idle.
    fn close_oldest(&self) -> bool {
        let oldest = self.0.lock().unwrap_or_else(|e| e.into_inner()).pop_first();
        // `notify_one` keeps the wake-up for a task that is not waiting yet.
        oldest.map(|(_, close)| close.notify_one()).is_some()
    }
}

/// Takes a connection out of the idle set when its task ends, however it ends.
struct Deregister(Arc<IdleSet>, u64);

impl Drop for Deregister {
    fn drop(&mut self) {
        self.0.remove(self.1);
    }
}

/// A listening socket whose connections [`serve`] can hand out.
pub trait Accept: Send + 'static {
    /// The connection.
    type Stream: AsyncRead + AsyncWrite + Unpin + Send + 'static;
    /// The next connection.
    fn accept_one(&self) -> impl Future<Output = std::io::Result<Self::Stream>> + Send;
}

impl Accept for TcpListener {
    type Stream = tokio::net::TcpStream;
    async fn accept_one(&self) -> std::io::Result<Self::Stream> {
        self.accept().await.map(|(s, _)| s)
    }
}

impl Accept for UnixListener {
    type Stream = tokio::net::UnixStream;
    async fn accept_one(&self) -> std::io::Result<Self::Stream> {
        self.accept().await.map(|(s, _)| s)
    }
}

/// Counts accepts per one-second window.
#[derive(Debug)]
struct Pacer {
    window: Instant,
    accepts: u32,
}

/// Accepts connections on `listener` forever under `limits`, handing each one that gets a permit to `handle` (with
/// its [`Conn`], idle until the handler says otherwise) and running what it returns in its own task, cut off at the
/// deadline or when the connection, still idle, is closed to make room. `what` names the listener in log lines.
/// Never returns: abort the task to stop it.
pub async fn serve<L, H, F>(listener: L, limits: Limits, what: &'static str, mut handle: H)
where
    L: Accept,
    H: FnMut(L::Stream, Conn) -> F,
    F: Future<Output = ()> + Send + 'static,
{
    let permits = Arc::new(Semaphore::new(limits.max_connections));
    let idle = Arc::new(IdleSet::default());
    let mut next_id = 0u64;
    let mut pacer = Pacer { window: Instant::now(), accepts: 0 };
    let (mut refused, mut evicted, mut crowded) = (0u64, 0u64, false);
    loop {
        let now = Instant::now();
        if now >= pacer.window + Duration::from_secs(1) {
            pacer = Pacer { window: now, accepts: 0 };
        } else if pacer.accepts >= limits.accepts_per_second {
            tokio::time::sleep_until(pacer.window + Duration::from_secs(1)).await;
            continue;
        }
        let stream = match listener.accept_one().await {
            Ok(s) => s,
            Err(e) => {
                debug!(listener = what, error = %e, "accept failed; pausing");
                tokio::time::sleep(ACCEPT_ERROR_BACKOFF).await;
                continue;
            }
        };
        pacer.accepts += 1;
        let permit = match permits.clone().try_acquire_owned() {
            Ok(permit) => Some(permit),
            // Full: the oldest idle connection makes room, if there is one.
            Err(_) if idle.close_oldest() => {
                evicted += 1;
                if !std::mem::replace(&mut crowded, true) {
                    warn!(
                        listener = what,
                        limit = limits.max_connections,
                        "too many connections: closing the oldest idle ones (no request yet) to make room"
                    );
                }
                tokio::time::timeout(EVICTION_WAIT, permits.clone().acquire_owned()).await.ok().and_then(Result::ok)
            }
            Err(_) => None,
        };
        let Some(permit) = permit else {
            drop(stream);
            refused += 1;
            if !std::mem::replace(&mut crowded, true) {
                warn!(
                    listener = what,
                    limit = limits.max_connections,
                    "too many connections, none idle: refusing new ones until some finish (each is dropped after {:?})",
                    limits.deadline
                );
            }
            continue;
        };
        if crowded && permits.available_permits() > limits.max_connections / 2 {
            crowded = false;
            debug!(listener = what, refused, evicted, "accepting connections again");
        }
        let id = next_id;
        next_id += 1;
        let close = idle.insert(id);
        let work = handle(stream, Conn { idle: idle.clone(), id });
        let registered = Deregister(idle.clone(), id);
        tokio::spawn(async move {
            let (_permit, _registered) = (permit, registered);
            tokio::select! {
                done = tokio::time::timeout(limits.deadline, work) => if done.is_err() {
                    debug!(listener = what, "client too slow: connection dropped at its deadline");
                },
                () = close.notified() => debug!(listener = what, "idle connection closed to make room for a new one"),
            }
        });
    }
}

/// Raises the soft limit on open descriptors to the hard limit (the unit's `LimitNOFILE`), as far as it goes, and
/// returns the soft limit now in force. The agent keeps one counter file open per container; the listeners above
/// take at most their bounds.
pub fn raise_nofile_limit() -> std::io::Result<u64> {
    let (soft, hard) = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)?;
    if soft < hard {
        nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE, hard, hard)?;
        return Ok(hard);
    }
    Ok(soft)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn tight() -> Limits {
        Limits { max_connections: 2, deadline: Duration::from_millis(300), accepts_per_second: 1000 }
    }

    /// Each connection waits for one byte (then it is busy), then for a second one, then answers "ok".
    async fn two_bytes_then_ok(mut s: tokio::net::TcpStream, conn: Conn) {
        let mut b = [0u8; 1];
        if s.read_exact(&mut b).await.is_err() {
            return;
        }
        conn.busy();
        if s.read_exact(&mut b).await.is_ok() {
            let _ = s.write_all(b"ok").await;
        }
    }

    /// Whether the server closed `s` (EOF or reset) within `within`.
    async fn closed_within(s: &mut tokio::net::TcpStream, within: Duration) -> bool {
        let mut buf = Vec::new();
        matches!(tokio::time::timeout(within, s.read_to_end(&mut buf)).await, Ok(Ok(0)) | Ok(Err(_)))
    }

    #[tokio::test]
    async fn excess_connections_are_closed_at_once_when_none_is_idle_and_slow_ones_at_their_deadline() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(serve(listener, tight(), "test", two_bytes_then_ok));
        // Two clients whose requests began (busy): they hold their permits until the deadline.
        let mut busy1 = tokio::net::TcpStream::connect(addr).await.unwrap();
        let mut busy2 = tokio::net::TcpStream::connect(addr).await.unwrap();
        busy1.write_all(b"x").await.unwrap();
        busy2.write_all(b"x").await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        // The third is refused at once: closed without an answer, long before the deadline.
        let started = std::time::Instant::now();
        let mut third = tokio::net::TcpStream::connect(addr).await.unwrap();
        let _ = third.write_all(b"xy").await;
        assert!(closed_within(&mut third, Duration::from_secs(2)).await, "refused");
        assert!(started.elapsed() < Duration::from_millis(250), "refused at once, not at the deadline");
        // The busy ones are dropped at their deadline; then a client is served again.
        assert!(closed_within(&mut busy1, Duration::from_millis(500)).await, "busy1 dropped at its deadline");
        assert!(closed_within(&mut busy2, Duration::from_millis(100)).await, "busy2 dropped at its deadline");
        let mut ok = tokio::net::TcpStream::connect(addr).await.unwrap();
        ok.write_all(b"xy").await.unwrap();
        let mut answer = Vec::new();
        ok.read_to_end(&mut answer).await.unwrap();
        assert_eq!(answer, b"ok");
    }

    #[tokio::test]
    async fn idle_connections_make_room_for_a_new_one_oldest_first() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(serve(listener, tight(), "test", two_bytes_then_ok));
        // Two clients that send nothing take both permits.
        let mut idle1 = tokio::net::TcpStream::connect(addr).await.unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
        let mut idle2 = tokio::net::TcpStream::connect(addr).await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        // A third client is served at once: the oldest idle one is closed for it, the other stays.
        let started = std::time::Instant::now();
        let mut third = tokio::net::TcpStream::connect(addr).await.unwrap();
        third.write_all(b"xy").await.unwrap();
        let mut answer = Vec::new();
        third.read_to_end(&mut answer).await.unwrap();
        assert_eq!(answer, b"ok");
        assert!(started.elapsed() < Duration::from_millis(250), "served at once: {:?}", started.elapsed());
        assert!(closed_within(&mut idle1, Duration::from_millis(100)).await, "the oldest idle one was closed");
        assert!(!closed_within(&mut idle2, Duration::from_millis(50)).await, "the younger idle one still open");
        // Once its request began, a connection is not closed for a newcomer: with `idle2` busy, an idle fourth
        // takes the permit the third left, and a fifth closes the fourth, not `idle2`.
        idle2.write_all(b"x").await.unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
        let mut fourth = tokio::net::TcpStream::connect(addr).await.unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
        let mut fifth = tokio::net::TcpStream::connect(addr).await.unwrap();
        fifth.write_all(b"xy").await.unwrap();
        let mut answer = Vec::new();
        fifth.read_to_end(&mut answer).await.unwrap();
        assert_eq!(answer, b"ok");
        assert!(closed_within(&mut fourth, Duration::from_millis(100)).await, "idle fourth closed for the fifth");
        idle2.write_all(b"y").await.unwrap();
        let mut answer = Vec::new();
        idle2.read_to_end(&mut answer).await.unwrap();
        assert_eq!(answer, b"ok", "the busy connection was answered");
    }

    #[tokio::test]
    async fn accepting_is_paced() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let served = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let counter = served.clone();
        let limits = Limits { max_connections: 100, deadline: Duration::from_secs(1), accepts_per_second: 5 };
        tokio::spawn(serve(listener, limits, "test", move |_s: tokio::net::TcpStream, _conn| {
            counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            async {}
        }));
        let mut held = Vec::new();
        for _ in 0..12 {
            held.push(tokio::net::TcpStream::connect(addr).await.unwrap()); // completes in the kernel's backlog
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(served.load(std::sync::atomic::Ordering::SeqCst), 5, "5 in the first second");
        tokio::time::sleep(Duration::from_millis(700)).await;
        assert_eq!(served.load(std::sync::atomic::Ordering::SeqCst), 10, "5 more in the next");
    }
}
