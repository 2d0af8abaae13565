//! The agent's HTTP endpoint (`[metrics] listen`), served with hyper (HTTP/1.1 and 1.0, one request per
//! connection):
//!
//! | request | answer |
//! | --- | --- |
//! | `GET /metrics` | 200, the Prometheus registry in the OpenMetrics text format ([`Metrics::render`]) |
//! | `GET /readyz` | 200 ready / 503 not, one line per reason ([`Readiness`]: the CRI runtime and the checked devices); 200 when the runtime has no readiness (Docker, systemd) |
//! | `GET /healthz` | 200 `ok` while the agent's process and runtime answer; it says nothing about the decision loop (see below) |
//! | `HEAD` of those | the same status and headers, no body |
//! | another method on those paths | 405, `Allow: GET, HEAD` |
//! | any other path | 404 |
//!
//! **Liveness.** The daemon keeps no in-process notion of its loop being stalled: the loop tells systemd
//! (`WATCHDOG=1` each round, the unit's `WatchdogSec`), and the DaemonSet's liveness probe asks the loop itself
//! through the status socket (`ddiskqos-agent status`), which a stuck loop cannot answer. This listener runs on its
//! own tasks, so `/healthz` answering shows only that the process and its async runtime are alive.
//!
//! **Bounds.** On top of the listener's [`crate::ops::limits::METRICS`] (64 connections, each dropped 5 s after it
//! was accepted, accepts paced, idle connections closed oldest first to make room for a new one) a request head
//! must arrive whole within [`HEADER_READ_TIMEOUT`] and fit in [`MAX_HEAD_BYTES`] (else 431); a request body is
//! never read, and the connection is closed after the answer.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::header::{HeaderValue, ALLOW, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tracing::debug;

use crate::ops::limits::{self, Conn, Limits};
use crate::ops::metrics::Metrics;
use crate::ops::Readiness;

/// A request head (request line and headers) must arrive whole within this long after the connection was accepted.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(2);

/// The largest request head accepted; a larger one is answered 431. (hyper's own buffer floor is 8 KiB.)
pub const MAX_HEAD_BYTES: usize = 8 * 1024;

/// Headers accepted in one request; more are answered 431.
const MAX_HEADERS: usize = 32;

/// The Content-Type of `/metrics`: prometheus-client writes the OpenMetrics text format.
pub const METRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

const TEXT: &str = "text/plain; charset=utf-8";

/// Binds the endpoint's listener on `addr` (loopback unless the config names another).
pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}

/// Serves the endpoint (see the module doc) on `listener` until the task is dropped: the metrics, and `/readyz`
/// from `readiness` when the runtime has one.
pub async fn serve(listener: TcpListener, metrics: Arc<Metrics>, readiness: Option<Arc<Readiness>>) {
    serve_within(listener, limits::METRICS, HEADER_READ_TIMEOUT, Endpoints { metrics, readiness }).await
}

/// What the routes answer from.
#[derive(Debug, Clone)]
struct Endpoints {
    metrics: Arc<Metrics>,
    readiness: Option<Arc<Readiness>>,
}

async fn serve_within(listener: TcpListener, bounds: Limits, header_timeout: Duration, endpoints: Endpoints) {
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(header_timeout)
        .max_header_size(MAX_HEAD_BYTES)
        .max_buf_size(MAX_HEAD_BYTES)
        .max_headers(MAX_HEADERS)
        .keep_alive(false);
    limits::serve(listener, bounds, "metrics", move |stream, conn: Conn| {
        let endpoints = endpoints.clone();
        let conn = Arc::new(conn);
        let service = hyper::service::service_fn(move |request: Request<Incoming>| {
            // The head arrived whole: this connection is answered, not closed to make room for another.
            conn.busy();
            let response = answer(request.method(), request.uri().path(), &endpoints);
            async move { Ok::<_, Infallible>(response) }
        });
        let connection = http.serve_connection(TokioIo::new(stream), service);
        async move {
            if let Err(e) = connection.await {
                debug!(listener = "metrics", failure = failure(&e), error = %e, "HTTP connection ended in error");
            }
        }
    })
    .await
}

/// The paths served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Route {
    Metrics,
    Readyz,
    Healthz,
}

impl Route {
    fn of(path: &str) -> Option<Self> {
        match path {
            "/metrics" => Some(Self::Metrics),
            "/readyz" => Some(Self::Readyz),
            "/healthz" => Some(Self::Healthz),
            _ => None,
        }
    }
}

/// The answer to `method path`. HEAD gets GET's status and headers; hyper sends no body with it.
fn answer(method: &Method, path: &str, endpoints: &Endpoints) -> Response<Full<Bytes>> {
    let Some(route) = Route::of(path) else {
        return text(StatusCode::NOT_FOUND, format!("not found: {path} (served: /metrics, /readyz, /healthz)\n"));
    };
    if method != Method::GET && method != Method::HEAD {
        let mut response = text(StatusCode::METHOD_NOT_ALLOWED, format!("method {method} not allowed on {path}\n"));
        response.headers_mut().insert(ALLOW, HeaderValue::from_static("GET, HEAD"));
        return response;
    }
    match route {
        Route::Metrics => with_type(StatusCode::OK, METRICS_CONTENT_TYPE, endpoints.metrics.render()),
        Route::Readyz => match &endpoints.readiness {
            Some(readiness) => {
                let report = readiness.check();
                let status = if report.ready { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
                text(status, report.lines.join("\n") + "\n")
            }
            None => text(
                StatusCode::OK,
                "no readiness checks with this runtime (only runtime = \"cri\" has them)\nready\n".into(),
            ),
        },
        Route::Healthz => text(StatusCode::OK, "ok\n".into()),
    }
}

fn text(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    with_type(status, TEXT, body)
}

fn with_type(status: StatusCode, content_type: &'static str, body: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

/// A connection failure in a word, for the log line.
fn failure(e: &hyper::Error) -> &'static str {
    if e.is_timeout() {
        "request head not received in time"
    } else if e.is_parse_too_large() {
        "request head too large"
    } else if e.is_parse() {
        "malformed request"
    } else if e.is_incomplete_message() {
        "client closed before the request was complete"
    } else {
        "connection error"
    }
}

#[cfg(test)]
mod tests;
