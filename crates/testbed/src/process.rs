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
