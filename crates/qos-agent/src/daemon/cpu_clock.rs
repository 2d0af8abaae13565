//! [`CpuClock`]: the CPU time a sampling round is charged with, for the pacer.

use std::sync::Arc;
use std::time::Duration;

/// The CPU time a round is charged with, read before and after it (default: the daemon thread's CPU time; the
/// daemon runs on a current-thread runtime, so that is all the work of the round).
#[derive(Clone)]
pub struct CpuClock(Arc<dyn Fn() -> Duration + Send + Sync>);

impl CpuClock {
    /// A clock from a function (an embedder's, see [`super::Daemon::with_cpu_clock`]; tests: a fake one).
    pub fn new(f: impl Fn() -> Duration + Send + Sync + 'static) -> Self {
        Self(Arc::new(f))
    }

    /// `CLOCK_THREAD_CPUTIME_ID` of the calling thread.
    pub fn thread() -> Self {
        Self::new(|| {
            nix::time::clock_gettime(nix::time::ClockId::CLOCK_THREAD_CPUTIME_ID)
                .map(Duration::from)
                .unwrap_or_default()
        })
    }

    pub(super) fn now(&self) -> Duration {
        (self.0)()
    }
}

impl std::fmt::Debug for CpuClock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CpuClock")
    }
}
