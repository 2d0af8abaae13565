//! Looking at a running agent from outside: its log without colours, its CPU time and memory from /proc, its
//! Prometheus endpoint, its status table through the control socket. Used by the fault, churn and scale tests
//! and by `examples/scale.rs`.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::time::Duration;

use qos_agent::daemon::Status;

/// Removes ANSI colour sequences (the agent's text log is coloured).
pub fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' && chars.peek() == Some(&'[') {
            chars.next();
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// The log file's lines, without colours.
pub fn log_lines(log: &Path) -> Vec<String> {
    strip_ansi(&std::fs::read_to_string(log).unwrap_or_default()).lines().map(str::to_string).collect()
}

/// Lines at `level` ("WARN", "ERROR", "INFO", "DEBUG") in the tracing text format.
pub fn lines_at<'a>(lines: &'a [String], level: &str) -> Vec<&'a String> {
    let tag = format!(" {level} ");
    lines.iter().filter(|l| l.contains(&tag)).collect()
}

/// CPU time the process used so far (user + system, all threads), precise to the nanosecond: the sum of
/// `/proc/PID/task/*/schedstat`. Threads that exited are not counted, so sample it on a long-running process.
pub fn cpu_ns(pid: u32) -> u64 {
    let mut total = 0;
    if let Ok(rd) = std::fs::read_dir(format!("/proc/{pid}/task")) {
        for task in rd.flatten() {
            if let Ok(text) = std::fs::read_to_string(task.path().join("schedstat")) {
                total += text.split_whitespace().next().and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
            }
        }
    }
    total
}

/// The fields of a `/proc/PID/stat` (or `/proc/PID/task/TID/stat`) text after the command name, which is in
/// parentheses and may hold spaces: index 0 is field 3 of proc(5), the state.
pub fn stat_fields(text: &str) -> Vec<&str> {
    text.rsplit_once(')').map_or(Vec::new(), |(_, rest)| rest.split_whitespace().collect())
}

/// The session process `pid` belongs to (`/proc/PID/stat`, field 6), while it exists.
pub fn session_of(pid: u32) -> Option<u32> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat_fields(&text).get(3)?.parse().ok()
}

/// utime + stime of the whole process from `/proc/PID/stat`, in seconds (clock ticks of 10 ms).
pub fn cpu_stat_secs(pid: u32) -> f64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let fields = stat_fields(&text);
    // utime is field 14, stime field 15 (1-based in proc(5)).
    let tick = |i: usize| fields.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    (tick(11) + tick(12)) as f64 / 100.0
}

/// Resident memory in KiB (`VmRSS` of `/proc/PID/status`).
pub fn vm_rss_kib(pid: u32) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    text.lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// A TCP port on 127.0.0.1 that was free a moment ago.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// `GET /metrics` on the agent's endpoint; the body, or `None` if it does not answer.
pub fn scrape(addr: SocketAddr) -> Option<String> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    text.split_once("\r\n\r\n").map(|(_, body)| body.to_string())
}

/// `GET <path>` on the agent's metrics listener: the status code and the body, or `None` if it does not answer.
pub fn http_get(addr: SocketAddr, path: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes()).ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let (head, body) = text.split_once("\r\n\r\n")?;
    let code = head.split(' ').nth(1)?.parse().ok()?;
    Some((code, body.to_string()))
}

/// The value of an unlabelled sample (`name value`) in Prometheus text.
pub fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

/// Number of series (sample lines) of a metric family with labels, e.g. `ddiskqos_container_weight`.
pub fn series(text: &str, family: &str) -> usize {
    let prefix = format!("{family}{{");
    text.lines().filter(|l| l.starts_with(&prefix)).count()
}

/// Every per-container series, of all families.
pub fn container_series(text: &str) -> usize {
    ["ddiskqos_container_level", "ddiskqos_container_weight", "ddiskqos_container_bytes"]
        .iter()
        .map(|f| series(text, f))
        .sum()
}

/// The agent's status table through its control socket.
pub fn status(socket: &Path) -> Option<Status> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().ok()?;
    rt.block_on(qos_agent::ops::control::fetch(socket)).ok()
}
