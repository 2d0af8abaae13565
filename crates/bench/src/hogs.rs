//! `--cpu-hogs N`: busy processes that keep the CPUs busy through a run, at nice 0, so the run shows what a busy
//! host does to the readers and to the agent's reaction time.
//!
//! Each is a process of its own session (`setsid ddiskqos-bench spin`), as the busy programs of a real host are
//! other services and sessions. Threads of the bench's own process would share its session's scheduling group
//! (autogroup) with the agent the bench embeds: they took that group's CPU share, and on the agent's CPU the group
//! weighed next to nothing (measured: the agent runnable and not run for up to 308 ms), which no host running the
//! agent as a service has.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

/// The spinning processes; they are killed when this is dropped (and stop by themselves if the bench dies).
#[derive(Debug)]
pub struct CpuHogs {
    children: Vec<Child>,
}

impl CpuHogs {
    /// Starts `n` busy processes (`ddiskqos-bench spin`), each in a session of its own (none for 0).
    pub fn start(n: u16) -> Result<Self> {
        if n == 0 {
            return Ok(Self { children: Vec::new() });
        }
        let exe = std::env::current_exe().context("the bench's own executable")?;
        let parent = std::process::id().to_string();
        Self::start_program(&exe, &["spin", "--parent", &parent], n)
    }

    /// Starts `n` copies of `program args`, each in a session of its own.
    fn start_program(program: &Path, args: &[&str], n: u16) -> Result<Self> {
        let mut hogs = Self { children: Vec::new() };
        for _ in 0..n {
            // setsid(1) execs in place (a child is not a process-group leader): the pid is the program's.
            let child = Command::new("setsid")
                .arg(program)
                .args(args)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .spawn()
                .with_context(|| {
                    format!("cannot start a busy process (setsid {} {})", program.display(), args.join(" "))
                })?;
            // An error drops `hogs`, which kills the ones already started.
            hogs.children.push(child);
        }
        Ok(hogs)
    }

    /// The busy processes' pids.
    #[cfg(test)]
    pub fn pids(&self) -> Vec<u32> {
        self.children.iter().map(Child::id).collect()
    }
}

impl Drop for CpuHogs {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
        }
        for c in &mut self.children {
            let _ = c.wait();
        }
    }
}

/// `ddiskqos-bench spin`: spins until its parent (`parent`) is gone.
pub fn spin(parent: u32) -> Result<()> {
    let mut turns = 0u64;
    let mut checked = Instant::now();
    loop {
        // Counted, so the loop is work the compiler keeps.
        turns = std::hint::black_box(turns.wrapping_add(1));
        if turns % (1 << 20) == 0 && checked.elapsed() > Duration::from_millis(100) {
            checked = Instant::now();
            if std::os::unix::process::parent_id() != parent {
                return Ok(());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use testbed::probe::session_of;

    /// Each is its own session's leader (so its own autogroup), and killed once dropped.
    #[test]
    fn hogs_lead_sessions_of_their_own_and_are_gone_once_dropped() {
        let hogs = CpuHogs::start_program(Path::new("sleep"), &["60"], 2).unwrap();
        let pids = hogs.pids();
        assert_eq!(pids.len(), 2);
        let deadline = Instant::now() + Duration::from_secs(10);
        // setsid(1) runs before it execs the program: wait until the process is `sleep`.
        while pids
            .iter()
            .any(|p| std::fs::read_to_string(format!("/proc/{p}/comm")).unwrap_or_default().trim() != "sleep")
        {
            assert!(Instant::now() < deadline, "the busy processes did not start");
            std::thread::sleep(Duration::from_millis(10));
        }
        for &p in &pids {
            assert_eq!(session_of(p), Some(p), "process {p} leads a session of its own");
        }
        assert_ne!(session_of(std::process::id()), Some(pids[0]));
        drop(hogs);
        for p in pids {
            assert!(session_of(p).is_none(), "process {p} still there after the drop");
        }
        assert!(CpuHogs::start(0).unwrap().pids().is_empty());
    }

    #[test]
    fn a_spinner_whose_parent_is_gone_stops() {
        // A parent it does not have: it notices within its first check (~100 ms).
        let start = Instant::now();
        spin(u32::MAX).unwrap();
        assert!(start.elapsed() < Duration::from_secs(30));
    }
}
