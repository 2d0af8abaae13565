//! The processes of a cgroup directory: list, signal, and the bench's own cgroups' creation and removal. (Counters
//! and weights are the agent's business: `qos_agent::cgroup`.)

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};
use nix::sys::signal::Signal;
use nix::unistd::Pid;

/// Pids in a cgroup (empty if it is gone).
pub fn pids(dir: &Path) -> Vec<Pid> {
    std::fs::read_to_string(dir.join("cgroup.procs"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse::<i32>().ok())
        .map(Pid::from_raw)
        .collect()
}

/// Sends `signal` to every process of the cgroup; returns how many got it.
pub fn signal_all(dir: &Path, signal: Signal) -> usize {
    pids(dir).into_iter().filter(|p| nix::sys::signal::kill(*p, signal).is_ok()).count()
}

/// Creates a cgroup directory (its parent must exist).
pub fn create(dir: &Path) -> Result<()> {
    std::fs::create_dir(dir).with_context(|| format!("cannot create cgroup {}", dir.display()))
}

/// cgroup v2: enables the io controller for the children of `dir` (`+io` in its `cgroup.subtree_control`).
pub fn enable_io(dir: &Path) -> Result<()> {
    crate::sys::write_existing(&dir.join("cgroup.subtree_control"), "+io")
}

/// Kills what is left in the cgroup and removes it (retrying while the kernel finishes the exits).
pub fn kill_and_remove(dir: &Path) -> Result<()> {
    if !dir.exists() {
        return Ok(());
    }
    for attempt in 0..100 {
        if !pids(dir).is_empty() {
            signal_all(dir, Signal::SIGCONT);
            signal_all(dir, Signal::SIGKILL);
        }
        match std::fs::remove_dir(dir) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) if attempt == 99 => {
                return Err(e).with_context(|| format!("cannot remove cgroup {}", dir.display()))
            }
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plain_directory_has_no_processes_and_is_removed() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("cg");
        create(&dir).unwrap();
        assert!(create(&dir).is_err(), "an existing cgroup is not created again");
        assert!(pids(&dir).is_empty());
        assert_eq!(signal_all(&dir, Signal::SIGCONT), 0);
        kill_and_remove(&dir).unwrap();
        assert!(!dir.exists());
        kill_and_remove(&dir).unwrap();
    }
}
