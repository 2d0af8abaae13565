use std::sync::atomic::AtomicI64;

use prometheus_client::metrics::gauge::Gauge;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::*;
use crate::blockdev::DeviceTable;
use crate::ops::CheckedDevice;

/// An answer as it came over the wire.
#[derive(Debug)]
struct Answer {
    status: u16,
    head: String,
    body: String,
}

impl Answer {
    /// A header's value (names compared without case).
    fn header(&self, name: &str) -> Option<&str> {
        self.head.lines().skip(1).find_map(|l| {
            let (n, v) = l.split_once(':')?;
            n.eq_ignore_ascii_case(name).then(|| v.trim())
        })
    }
}

/// Sends `raw` and reads until the server closes (it does after one answer).
async fn exchange(addr: SocketAddr, raw: &[u8]) -> Answer {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(raw).await.unwrap();
    let mut buf = Vec::new();
    tokio::time::timeout(Duration::from_secs(3), s.read_to_end(&mut buf)).await.expect("answer in time").unwrap();
    let text = String::from_utf8(buf).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or_else(|| panic!("no head end in {text:?}"));
    let status = head.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or_else(|| panic!("status of {head:?}"));
    Answer { status, head: head.to_string(), body: body.to_string() }
}

async fn request(addr: SocketAddr, method: &str, path: &str) -> Answer {
    exchange(addr, format!("{method} {path} HTTP/1.1\r\nHost: test\r\n\r\n").as_bytes()).await
}

/// The endpoint on 127.0.0.1, port chosen by the kernel, under `bounds` and `header_timeout`.
async fn start_with(readiness: Option<Arc<Readiness>>, bounds: Limits, header_timeout: Duration) -> SocketAddr {
    let listener = bind(SocketAddr::from(([127, 0, 0, 1], 0))).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let metrics = Arc::new(Metrics::new());
    metrics.containers.set(3);
    tokio::spawn(serve_within(listener, bounds, header_timeout, Endpoints { metrics, readiness }));
    addr
}

async fn start(readiness: Option<Arc<Readiness>>) -> SocketAddr {
    start_with(readiness, limits::METRICS, HEADER_READ_TIMEOUT).await
}

#[tokio::test]
async fn metrics_healthz_and_readyz_answer_get_and_head() {
    let addr = start(None).await;
    let m = request(addr, "GET", "/metrics").await;
    assert_eq!(m.status, 200, "{m:?}");
    assert_eq!(m.header("content-type"), Some(METRICS_CONTENT_TYPE));
    assert!(m.body.contains("\nddiskqos_containers 3\n"), "{}", m.body);
    assert!(m.body.ends_with("# EOF\n"), "{}", m.body);
    assert_eq!(m.header("content-length"), Some(m.body.len().to_string().as_str()));
    assert_eq!(m.header("connection"), Some("close"), "one request per connection: {m:?}");
    // A query string is ignored; HTTP/1.0 without Host (older scrapers, the tests' own) is served.
    assert_eq!(request(addr, "GET", "/metrics?x=1").await.status, 200);
    let old = exchange(addr, b"GET /metrics HTTP/1.0\r\n\r\n").await;
    assert_eq!((old.status, old.body.contains("ddiskqos_containers 3")), (200, true), "{old:?}");

    let h = request(addr, "GET", "/healthz").await;
    assert_eq!((h.status, h.body.as_str(), h.header("content-type")), (200, "ok\n", Some(TEXT)));
    // No readiness (Docker, systemd): ready, saying there is nothing to check.
    let r = request(addr, "GET", "/readyz").await;
    assert_eq!(r.status, 200, "{r:?}");
    assert!(r.body.starts_with("no readiness checks") && r.body.ends_with("ready\n"), "{r:?}");

    // HEAD: GET's status and headers, no body.
    let head = request(addr, "HEAD", "/metrics").await;
    assert_eq!((head.status, head.body.as_str()), (200, ""), "{head:?}");
    assert_eq!(head.header("content-type"), Some(METRICS_CONTENT_TYPE));
    assert_eq!(head.header("content-length"), Some(m.body.len().to_string().as_str()));
    for path in ["/healthz", "/readyz"] {
        let a = request(addr, "HEAD", path).await;
        assert_eq!((a.status, a.body.as_str()), (200, ""), "HEAD {path}: {a:?}");
    }
}

#[tokio::test]
async fn other_paths_are_404_and_other_methods_405_with_allow() {
    let addr = start(None).await;
    for path in ["/", "/metricsx", "/metrics/", "/readyz/x", "/status"] {
        let a = request(addr, "GET", path).await;
        assert_eq!(a.status, 404, "GET {path}: {a:?}");
        assert!(a.body.starts_with("not found"), "{a:?}");
    }
    // 404 before 405: an unknown path is unknown for every method.
    assert_eq!(request(addr, "POST", "/nope").await.status, 404);
    for (method, path) in [("POST", "/metrics"), ("PUT", "/readyz"), ("DELETE", "/healthz"), ("OPTIONS", "/metrics")] {
        let a = request(addr, method, path).await;
        assert_eq!(a.status, 405, "{method} {path}: {a:?}");
        assert_eq!(a.header("allow"), Some("GET, HEAD"), "{method} {path}: {a:?}");
    }
    // A POST with a body: answered 405 without the body being read.
    let a = exchange(addr, b"POST /metrics HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\n\r\nhello").await;
    assert_eq!(a.status, 405, "{a:?}");
}

/// A fake `/sys` with one disk `vdb` (254:16) on `scheduler` and a v2 root without io.cost; read afresh each probe.
fn device_table(tmp: &std::path::Path, scheduler: &str) -> DeviceTable {
    let block = tmp.join("sys/block/vdb");
    std::fs::create_dir_all(block.join("queue")).unwrap();
    std::fs::write(block.join("dev"), "254:16\n").unwrap();
    std::fs::write(block.join("queue/scheduler"), format!("{scheduler}\n")).unwrap();
    std::fs::create_dir_all(tmp.join("sys/dev/block")).unwrap();
    std::os::unix::fs::symlink(&block, tmp.join("sys/dev/block/254:16")).unwrap();
    std::fs::create_dir_all(tmp.join("cg")).unwrap();
    std::fs::write(tmp.join("cg/io.cost.qos"), "").unwrap();
    DeviceTable::with_sys(&tmp.join("sys"), &tmp.join("cg")).with_max_age(Duration::ZERO)
}

#[tokio::test]
async fn readyz_is_503_with_the_reasons_until_ready_then_200() {
    let tmp = tempfile::tempdir().unwrap();
    let table = device_table(tmp.path(), "[mq-deadline] none");
    let up = Gauge::<i64, AtomicI64>::default();
    let device = CheckedDevice { name: "vdb".into(), why: "[devices] check".into() };
    let addr = start(Some(Arc::new(Readiness::with_table(up.clone(), vec![device], table)))).await;

    let a = request(addr, "GET", "/readyz").await;
    assert_eq!((a.status, a.header("content-type")), (503, Some(TEXT)), "{a:?}");
    assert!(a.body.starts_with("runtime: UNREACHABLE"), "{}", a.body);
    assert!(a.body.contains("NO WEIGHT ACTS") && a.body.ends_with("not ready\n"), "{}", a.body);
    let head = request(addr, "HEAD", "/readyz").await;
    assert_eq!((head.status, head.body.as_str()), (503, ""), "{head:?}");
    // The runtime answers and the device is switched to BFQ: ready at the next probe.
    up.set(1);
    std::fs::write(tmp.path().join("sys/block/vdb/queue/scheduler"), "mq-deadline [bfq] none\n").unwrap();
    let a = request(addr, "GET", "/readyz").await;
    assert_eq!(a.status, 200, "{a:?}");
    assert!(
        a.body.contains("vdb 254:16 ([devices] check): bfq: weights act") && a.body.ends_with("\nready\n"),
        "{a:?}"
    );
    // Liveness does not follow readiness.
    assert_eq!(request(addr, "GET", "/healthz").await.status, 200);
}

#[tokio::test]
async fn a_request_head_too_large_is_431_and_a_slow_one_is_cut_at_the_header_timeout() {
    let generous = Limits { deadline: Duration::from_secs(10), ..limits::METRICS };
    let addr = start_with(None, generous, Duration::from_millis(300)).await;
    let big = format!("GET /metrics HTTP/1.1\r\nHost: t\r\nX-Big: {}\r\n\r\n", "a".repeat(MAX_HEAD_BYTES));
    let a = exchange(addr, big.as_bytes()).await;
    assert_eq!(a.status, 431, "{a:?}");
    let many: String = (0..MAX_HEADERS + 1).map(|i| format!("X-{i}: v\r\n")).collect();
    let a = exchange(addr, format!("GET /metrics HTTP/1.1\r\nHost: t\r\n{many}\r\n").as_bytes()).await;
    assert_eq!(a.status, 431, "{a:?}");
    // Not a request at all.
    assert_eq!(exchange(addr, b"\x16\x03\x01 hello\r\n\r\n").await.status, 400);

    // Half a head, then nothing: closed at the header timeout, long before the connection's deadline, unanswered
    // (hyper may say 408).
    let mut slow = TcpStream::connect(addr).await.unwrap();
    slow.write_all(b"GET /metrics HTTP/1.1\r\nHost: t\r\n").await.unwrap();
    let started = std::time::Instant::now();
    let mut buf = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(3), slow.read_to_end(&mut buf)).await;
    assert!(read.is_ok(), "not closed in 3 s");
    assert!(started.elapsed() < Duration::from_secs(2), "closed after {:?}", started.elapsed());
    let text = String::from_utf8_lossy(&buf);
    assert!(text.is_empty() || text.starts_with("HTTP/1.1 408"), "{text:?}");
}

#[tokio::test]
async fn an_idle_flood_does_not_lock_out_a_scrape() {
    // The real bounds: 64 connections. 100 clients connect and send nothing or half a request head; each beyond
    // the 64th pushes the oldest idle one out, and so does the scrape after them, which is answered at once.
    let addr = start(None).await;
    let mut idle = Vec::new();
    for i in 0..100 {
        let mut s = TcpStream::connect(addr).await.unwrap();
        if i % 2 == 1 {
            s.write_all(b"GET /metrics HTTP/1.1\r\n").await.unwrap();
        }
        idle.push(s);
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let started = std::time::Instant::now();
    let m = request(addr, "GET", "/metrics").await;
    assert_eq!(m.status, 200, "{m:?}");
    assert!(started.elapsed() < Duration::from_millis(1000), "scrape took {:?}", started.elapsed());
    // Exactly the 37 oldest were closed (36 for the later idle ones, one for the scrape); the 63 youngest still
    // hold their slots, within the bound.
    let mut closed = Vec::new();
    for (i, s) in idle.iter_mut().enumerate() {
        let mut b = [0u8; 1];
        if let Ok(Ok(0) | Err(_)) = tokio::time::timeout(Duration::from_millis(20), s.read(&mut b)).await {
            closed.push(i);
        }
    }
    assert_eq!(closed, (0..37).collect::<Vec<_>>());
}
