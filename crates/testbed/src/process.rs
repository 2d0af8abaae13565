//! Child processes that cannot outlive a failing test, and polling until something holds.

use std::process::Child;
use std::time::{Duration, Instant};

/// A child process killed and reaped on drop.
#[derive(Debug)]
pub struct ChildGuard(pub Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Calls `f` every `every` until it returns `Some` (that value) or `limit` has passed (`None`; `f` is called at
/// least once).
pub fn wait_for<T>(limit: Duration, every: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let t = Instant::now();
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if t.elapsed() > limit {
            return None;
        }
        std::thread::sleep(every);
    }
}

/// How many times longer than on the host things take where the test runs: `DDISKQOS_TIME_SCALE` (the systemd
/// guest, `scripts/guest.sh`, runs under qemu's software emulation and sets 10), else 1. A bad value is a panic
/// naming it, not a silent 1.
pub fn time_scale() -> u32 {
    match std::env::var("DDISKQOS_TIME_SCALE") {
        Err(_) => 1,
        Ok(v) => match v.parse::<u32>() {
            Ok(n) if (1..=100).contains(&n) => n,
            _ => panic!("DDISKQOS_TIME_SCALE={v:?}: expected a whole number from 1 to 100"),
        },
    }
}

/// `limit` stretched by [`time_scale`]: for safety caps on waits (how long to wait before giving up), never for
/// the figure a test asserts on. Under emulation a test asserts on what it can count instead (the agent's rounds).
pub fn patience(limit: Duration) -> Duration {
    limit * time_scale()
}
