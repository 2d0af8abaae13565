//! The agent's CPU priority: its nice value (`nice` in the config, default [`DEFAULT_NICE`]).
//!
//! A new container's top weight must be in its cgroup file before the container's first I/O, so the agent's
//! reaction is a wake-up, a few file operations and a write: well under a millisecond of CPU. On a busy host that
//! wake-up waits for a CPU. Measured on the project's 2-core VM (`ddiskqos-bench --no-exp1 --exp2-reps 6
//! --cpu-hogs 3`: Experiment 2, three busy threads at nice 0 beside it, 60 readers per run; the bench's observer at
//! nice -20): at nice 0 the reaction was median 24.5 / 5.7 ms, p99 407 / 135 ms (two BFQ modes), and one reader read
//! its whole 1 MiB before its top weight arrived; at nice -10 median 25.1 / 0.5 ms, p99 237 / 157 ms, and no reader
//! read a byte before it. On an idle host it is about 0.5 ms, p99 a few ms. What else a busy host makes the
//! reaction wait for is not yet known (the README, "Reaction time on a busy host").
//! The agent's CPU use is small and bounded (`cpu_budget` spreads its sampling rounds out), so a higher priority
//! costs other processes next to nothing.
//!
//! Linux keeps the nice value per thread: [`apply`] sets the calling thread's, and every thread it starts from then
//! on inherits it. It is called first thing on the thread that runs the daemon (the binary's main thread; the
//! bench's agent thread), before the agent starts its watcher threads.

use thiserror::Error;

/// The nice value the agent runs at unless configured otherwise.
pub const DEFAULT_NICE: i8 = -10;

/// The nice value could not be set.
#[derive(Debug, Error)]
#[error("cannot set the agent's nice value to {nice} (setpriority): {source}; it keeps {current}")]
pub struct PriorityError {
    /// The value asked for.
    pub nice: i8,
    /// The thread's nice value, kept.
    pub current: String,
    #[source]
    source: std::io::Error,
}

/// Whether `nice` is a nice value Linux knows (-20..=19).
pub fn valid(nice: i8) -> bool {
    (-20..=19).contains(&nice)
}

/// Sets the calling thread's nice value (and so that of the threads it starts from now on). Lowering it needs
/// `CAP_SYS_NICE` (root has it; a container may not): without it this fails and nothing changes.
pub fn apply(nice: i8) -> Result<(), PriorityError> {
    rustix::process::setpriority_process(None, i32::from(nice)).map_err(|e| PriorityError {
        nice,
        current: current().map_or_else(|| "its current value".into(), |n| n.to_string()),
        source: e.into(),
    })
}

/// The calling thread's nice value, if it can be read.
pub fn current() -> Option<i32> {
    rustix::process::getpriority_process(None).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn linux_nice_range() {
        assert!(valid(-20) && valid(0) && valid(19) && valid(DEFAULT_NICE));
        assert!(!valid(-21) && !valid(20) && !valid(i8::MIN) && !valid(i8::MAX));
    }

    /// Raising the value (lowering the priority) needs no privilege: a thread of its own takes 5 more, and a
    /// thread it then starts inherits the new value while the test's own thread keeps its value.
    #[test]
    fn apply_sets_the_calling_thread_and_its_later_threads_only() {
        let before = current().expect("getpriority");
        let target = (before + 5).min(19) as i8;
        let (mine, child) = std::thread::spawn(move || {
            apply(target).expect("raising the nice value needs no privilege");
            let child = std::thread::spawn(current).join().unwrap();
            (current(), child)
        })
        .join()
        .unwrap();
        assert_eq!(mine, Some(i32::from(target)));
        assert_eq!(child, Some(i32::from(target)), "a thread started afterwards inherits it");
        assert_eq!(current(), Some(before), "other threads keep theirs");
    }
}
