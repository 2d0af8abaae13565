//! Bounded listeners for the metrics port and the control socket, so that no client (an unprivileged user
//! flooding the loopback metrics port, one that connects and never reads) can take the descriptors, the CPU or the
//! attention the agent needs for cgroup files and weights.
//!
//! - **A bounded number of connections** ([`Limits::max_connections`]: 64 metrics, 16 control): a permit is taken
//!   per connection; one accepted beyond the bound is closed at once (the client sees the connection reset or closed
//!   without an answer). The flood can thus hold at most that many of the agent's descriptors; everything else
//!   stays for the cgroup files (counter files are kept open, one per container; a weight read or write opens one
//!   file at a time) and the runtime's API sockets.
//! - **A deadline per connection** ([`Limits::deadline`], 5 s): a client that sends nothing, or reads nothing, is
//!   dropped when it passes, whatever it does meanwhile.
//! - **Paced accepting** ([`Limits::accepts_per_second`]): beyond that many accepts in a second (served or refused)
//!   the listener stops accepting until the second is over; further clients wait in the kernel's listen backlog,
//!   which costs the agent nothing. This keeps the agent's CPU bounded under a connect flood.
//! - **Accept errors back off** ([`ACCEPT_ERROR_BACKOFF`]): `EMFILE` (or any error) is not retried in a busy loop.
//!
//! Each connection is handled in its own task: the daemon loop only hands over the data (e.g. the status table) and
//! goes on.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::Semaphore;
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

/// Accepts connections on `listener` forever under `limits`, handing each one that gets a permit to `handle` and
/// running what it returns in its own task, cut off at the deadline. `what` names the listener in log lines. Never
/// returns: abort the task to stop it.
pub async fn serve<L, H, F>(listener: L, limits: Limits, what: &'static str, mut handle: H)
where
    L: Accept,
    H: FnMut(L::Stream) -> F,
    F: Future<Output = ()> + Send + 'static,
{
    let permits = Arc::new(Semaphore::new(limits.max_connections));
    let mut pacer = Pacer { window: Instant::now(), accepts: 0 };
    let (mut refused, mut refusing) = (0u64, false);
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
        match permits.clone().try_acquire_owned() {
            Ok(permit) => {
                if refusing && permits.available_permits() > limits.max_connections / 2 {
                    refusing = false;
                    debug!(listener = what, refused, "accepting connections again");
                }
                let work = handle(stream);
                tokio::spawn(async move {
                    let _permit = permit;
                    if tokio::time::timeout(limits.deadline, work).await.is_err() {
                        debug!(listener = what, "client too slow: connection dropped at its deadline");
                    }
                });
            }
            Err(_) => {
                drop(stream);
                refused += 1;
                if !std::mem::replace(&mut refusing, true) {
                    warn!(
                        listener = what,
                        limit = limits.max_connections,
                        "too many connections: refusing new ones until some finish (each is dropped after {:?})",
                        limits.deadline
                    );
                }
            }
        }
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

    #[tokio::test]
    async fn excess_connections_are_closed_at_once_and_slow_ones_at_their_deadline() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        // Each connection waits for one byte, then answers "ok": a client that sends nothing holds its permit.
        tokio::spawn(serve(listener, tight(), "test", |mut s: tokio::net::TcpStream| async move {
            let mut b = [0u8; 1];
            if s.read_exact(&mut b).await.is_ok() {
                let _ = s.write_all(b"ok").await;
            }
        }));
        let idle1 = tokio::net::TcpStream::connect(addr).await.unwrap();
        let idle2 = tokio::net::TcpStream::connect(addr).await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        // The third is refused at once: closed without an answer, long before the deadline.
        let started = std::time::Instant::now();
        let mut third = tokio::net::TcpStream::connect(addr).await.unwrap();
        let mut buf = Vec::new();
        let _ = third.write_all(b"x").await;
        let n = tokio::time::timeout(Duration::from_secs(2), third.read_to_end(&mut buf)).await;
        assert!(matches!(n, Ok(Ok(0)) | Ok(Err(_))), "refused: {n:?} {buf:?}");
        assert!(started.elapsed() < Duration::from_millis(250), "refused at once, not at the deadline");
        // The idle ones are dropped at their deadline; then a client is served again.
        tokio::time::sleep(Duration::from_millis(400)).await;
        let mut ok = tokio::net::TcpStream::connect(addr).await.unwrap();
        ok.write_all(b"x").await.unwrap();
        let mut answer = Vec::new();
        ok.read_to_end(&mut answer).await.unwrap();
        assert_eq!(answer, b"ok");
        drop((idle1, idle2));
    }

    #[tokio::test]
    async fn accepting_is_paced() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let served = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let counter = served.clone();
        let limits = Limits { max_connections: 100, deadline: Duration::from_secs(1), accepts_per_second: 5 };
        tokio::spawn(serve(listener, limits, "test", move |_s: tokio::net::TcpStream| {
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
