//! One lock for the real tests of a test process.
//!
//! Tests of one binary run in parallel threads of one process. Real tests measure latencies and CPU time, load
//! both cores of the test machine, or stop and start daemons, so two of them at once would make each other fail
//! (or pass for the wrong reason). Each holds [`exclusive`] for its whole run; tests without real resources run
//! beside them as usual. Separate test binaries already run one after another.

use std::sync::{Mutex, MutexGuard};

static MACHINE: Mutex<()> = Mutex::new(());

/// Waits until no other real test of this process runs; the returned guard lets the next one in when dropped.
/// A test that panicked while holding it does not block the others (the poison is ignored: the lock guards no
/// data).
pub fn exclusive() -> MutexGuard<'static, ()> {
    MACHINE.lock().unwrap_or_else(|e| e.into_inner())
}
