//! The agent's CPU priority: its nice value (`nice` in the config, default [`DEFAULT_NICE`]).
//!
//! A new container's top weight must be in its cgroup file before the container's first I/O, so the agent's
//! reaction is a wake-up, a few file operations and a write: well under a millisecond of CPU. On a busy host that
//! wake-up waits for a CPU, and how long depends on the agent's priority *and on its session's* (below). Measured on
//! the project's 2-core VM (`ddiskqos-bench --no-exp1 --exp2-reps 6`, Experiment 2, 30 dDiskQoS readers per BFQ
//! mode, strict without low latency / default): quiet, about 0.5 ms median, p99 a few ms; beside three busy
//! processes of other sessions (`--cpu-hogs 3`), with the agent and its session's group at -10, median 0.47 /
//! 0.59 ms, p99 4.1 / 3.9 ms; with the thread alone at -10 and its session's group at 0, p99 48 ms and the agent
//! runnable for up to 106 ms without a CPU. The agent's CPU use is small and bounded (`cpu_budget` spreads its
//! sampling rounds out), so a higher priority costs other processes next to nothing.
//!
//! Linux keeps the nice value per thread: [`apply`] sets the calling thread's, and every thread it starts from then
//! on inherits it. It is called first thing on the thread that runs the daemon (the binary's main thread; the
//! bench's agent thread), before the agent starts its watcher threads.
//!
//! **Autogroups.** A kernel with `CONFIG_SCHED_AUTOGROUP` and `kernel.sched_autogroup_enabled = 1` (upstream's
//! default, and this project's test host; Debian 12's kernel has it but turns it off, `autogroup=1` on its command
//! line turns it on) schedules the processes of each session as one group: a thread's nice value then
//! weighs only against the other threads of its session, and the session's group against other sessions (and
//! cgroups) at the group's own nice value, 0 unless set. A thread at nice -10 in a session at 0 waited for a CPU as
//! long as one at nice 0 (measured with `bpftrace` on the scheduler's tracepoints: the agent runnable for up to
//! 106 ms while three busy processes of other sessions ran, reaction p99 48 ms; with its session's group at -10,
//! 27 ms and 8.9 ms). So [`apply_autogroup`] sets the
//! session's group to the same value, through `/proc/self/autogroup`, where the agent has its session to itself:
//! it is the session leader, as every systemd service is. Run by hand from a shell, the session is the shell's, and
//! raising it would raise everything started from that shell: it is left alone, and the agent says so. (The group
//! only counts for processes in the root CPU cgroup; in a CPU cgroup of its own, such as a pod's, the cgroup's
//! CPU weight counts instead, and the write is harmless.) A process in the session of init (PID 1) or of a
//! kernel thread, which never made a session of its own, is in the kernel's root group: its threads compete with
//! the other sessions' groups directly, so the agent's nice value already weighs host-wide, and there is no group
//! value to set (`/proc/self/autogroup` reads empty; the kernel refuses a write). CI runners started by a PID 1
//! that does not call setsid(2) run their tests there.

use thiserror::Error;
use tracing::{debug, info, warn};

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

/// Where the kernel says whether sessions are scheduled as groups.
const AUTOGROUP_SYSCTL: &str = "/proc/sys/kernel/sched_autogroup_enabled";
/// The calling process's session group and its nice value (`/autogroup-N nice V`); written: the nice value.
const AUTOGROUP_SELF: &str = "/proc/self/autogroup";

/// The session group (autogroup) the calling process is scheduled in, as `/proc/self/autogroup` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionGroup {
    /// The kernel does not group sessions (no autogroup support, or `sched_autogroup_enabled` is 0).
    Off,
    /// The kernel's root group: the process is in the session of init (PID 1), or of a kernel thread, which never
    /// made a session of its own; the file reads empty. Its threads are scheduled beside the other sessions'
    /// groups, so their own nice value weighs host-wide, and the root group has no nice value to set (the kernel
    /// refuses the write).
    Root,
    /// A session's own group, at this nice value.
    Nice(i32),
}

/// What [`apply_autogroup`] found and did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Autogroup {
    /// The kernel does not group sessions (no autogroup support, or `sched_autogroup_enabled` is 0).
    Off,
    /// The agent runs in the kernel's root group ([`SessionGroup::Root`]): its nice value already weighs host-wide.
    Root,
    /// The session's group was at `from` and is now at the agent's value.
    Set {
        /// Its nice value before.
        from: i32,
    },
    /// The session's group was already at the agent's value.
    Unchanged,
    /// The process is not its session's leader (run by hand from a shell): the group, at `nice`, is shared with
    /// the rest of the session and left alone.
    Shared {
        /// The group's nice value, kept.
        nice: i32,
    },
}

/// The autogroup could not be read or set.
#[derive(Debug, Error)]
pub enum AutogroupError {
    /// A file of the autogroup interface could not be read or written.
    #[error("cannot {what} {path}: {source}")]
    Io {
        /// "read" or "write -10 to".
        what: String,
        /// The file.
        path: &'static str,
        #[source]
        source: std::io::Error,
    },
    /// `/proc/self/autogroup` said something else than `/autogroup-N nice V` or nothing.
    #[error("{path} reads {text:?}, neither \"/autogroup-<n> nice <value>\" nor empty (the root group)")]
    Format {
        /// The file.
        path: &'static str,
        /// What it said.
        text: String,
    },
}

/// The nice value in the text of `/proc/<pid>/autogroup` (`/autogroup-12 nice -10`).
fn parse_autogroup(text: &str) -> Option<i32> {
    let mut words = text.split_whitespace();
    let (group, key, value) = (words.next()?, words.next()?, words.next()?);
    if !group.starts_with("/autogroup-") || key != "nice" || words.next().is_some() {
        return None;
    }
    value.parse().ok().filter(|n| (-20..=19).contains(n))
}

/// What `/proc/self/autogroup` (or `/proc/<pid>/autogroup`) says: the kernel's root group when empty (see
/// [`SessionGroup::Root`]), else a session group's nice value; `None` for anything else.
pub fn parse_session_group(text: &str) -> Option<SessionGroup> {
    if text.trim().is_empty() {
        return Some(SessionGroup::Root);
    }
    parse_autogroup(text).map(SessionGroup::Nice)
}

/// The session group the calling process is scheduled in.
pub fn session_group() -> Result<SessionGroup, AutogroupError> {
    match std::fs::read_to_string(AUTOGROUP_SYSCTL) {
        Ok(on) if on.trim() == "0" => return Ok(SessionGroup::Off),
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(SessionGroup::Off),
        Err(source) => return Err(AutogroupError::Io { what: "read".into(), path: AUTOGROUP_SYSCTL, source }),
    }
    let text = match std::fs::read_to_string(AUTOGROUP_SELF) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(SessionGroup::Off),
        Err(source) => return Err(AutogroupError::Io { what: "read".into(), path: AUTOGROUP_SELF, source }),
    };
    parse_session_group(&text).ok_or(AutogroupError::Format { path: AUTOGROUP_SELF, text })
}

/// Sets the calling process's session group to `nice` (lowering it needs `CAP_SYS_NICE`), whoever shares the
/// session; the group as it was before. Only a session's own group is written: the kernel's root group has no
/// value to set, and is reported as found. [`apply_autogroup`] is the agent's careful use of it; the bench calls
/// this for its own session, where the agent it embeds runs, and puts the old value back at its end.
pub fn set_autogroup_nice(nice: i8) -> Result<SessionGroup, AutogroupError> {
    let before = session_group()?;
    if matches!(before, SessionGroup::Nice(n) if n != i32::from(nice)) {
        write_autogroup(nice)?;
    }
    Ok(before)
}

fn write_autogroup(nice: i8) -> Result<(), AutogroupError> {
    std::fs::write(AUTOGROUP_SELF, nice.to_string()).map_err(|source| AutogroupError::Io {
        what: format!("write {nice} to"),
        path: AUTOGROUP_SELF,
        source,
    })
}

/// Whether the calling process leads its session (so has the session's group to itself). The session may be 0,
/// the kernel's own (a PID 1 that never called setsid(2), and what it starts): nix takes that as a value, where
/// rustix's `Pid` would assert it non-zero.
fn leads_its_session() -> bool {
    nix::unistd::getsid(None).ok() == Some(nix::unistd::getpid())
}

/// Gives the agent's session group the agent's nice value where the session is the agent's own (see the module
/// doc): a session leader's group is set, any other's left alone and reported.
pub fn apply_autogroup(nice: i8) -> Result<Autogroup, AutogroupError> {
    let now = match session_group()? {
        SessionGroup::Off => return Ok(Autogroup::Off),
        SessionGroup::Root => return Ok(Autogroup::Root),
        SessionGroup::Nice(n) => n,
    };
    if now == i32::from(nice) {
        return Ok(Autogroup::Unchanged);
    }
    if !leads_its_session() {
        return Ok(Autogroup::Shared { nice: now });
    }
    write_autogroup(nice)?;
    Ok(Autogroup::Set { from: now })
}

/// Sets the calling thread's nice value to `nice` (this module) and, where the agent leads its session, its
/// session's scheduling group (autogroup) too, logging the outcome: an agent that cannot (no `CAP_SYS_NICE`) runs on
/// at the priority it has, with a warning. The binary and the bench's embedded agent call this on the thread that
/// runs the daemon, first.
pub fn apply_logged(nice: i8) {
    match apply(nice) {
        Ok(()) => debug!(nice, "nice value set"),
        Err(e) => warn!(error = %e, "new containers' weights may wait for a CPU on a busy host"),
    }
    match apply_autogroup(nice) {
        Ok(Autogroup::Set { from }) => {
            info!(nice, from, "the agent's session group (autogroup) set to the agent's nice value")
        }
        Ok(Autogroup::Shared { nice: group }) => info!(
            nice,
            group,
            "the agent shares its session (started from a shell?): the kernel schedules the session as one group at \
             nice {group}, so the agent's nice value weighs only inside it; as a service (systemd gives it a session \
             of its own) or under setsid(1) the agent sets its group too"
        ),
        Ok(Autogroup::Root) => info!(
            nice,
            "the agent runs in the kernel's root scheduling group (the session of init, which has no group of its \
             own): its nice value weighs host-wide, no session group to set"
        ),
        Ok(Autogroup::Off | Autogroup::Unchanged) => debug!(nice, "session group (autogroup): nothing to set"),
        Err(e) => warn!(error = %e, "cannot give the agent's session group (autogroup) its nice value; on a busy \
                                     host new containers' weights may wait for a CPU"),
    }
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

    #[test]
    fn autogroup_text() {
        assert_eq!(parse_autogroup("/autogroup-966 nice -10\n"), Some(-10));
        assert_eq!(parse_autogroup("/autogroup-1 nice 0"), Some(0));
        assert_eq!(parse_autogroup("/autogroup-1 nice 19\n"), Some(19));
        for bad in [
            "",
            "/autogroup-1 nice",
            "/autogroup-1 nice x",
            "/autogroup-1 nice -21",
            "/x nice 0",
            "/autogroup-1 prio 0",
            "/autogroup-1 nice 0 extra",
        ] {
            assert_eq!(parse_autogroup(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn session_group_text() {
        assert_eq!(parse_session_group(""), Some(SessionGroup::Root), "the root group prints nothing");
        assert_eq!(parse_session_group("\n"), Some(SessionGroup::Root));
        assert_eq!(parse_session_group("/autogroup-966 nice -10\n"), Some(SessionGroup::Nice(-10)));
        assert_eq!(parse_session_group("/autogroup-1 nice"), None);
        assert_eq!(parse_session_group("nice 0"), None);
    }

    /// This machine's kernel: whether it groups sessions is read, and where it does, the group read is the one
    /// the kernel shows for this process. The test binary's group depends on who started it: a shell's session
    /// (shared with the shell: left alone; raising it needs no privilege and is undone if it was set), or the
    /// kernel's root group where the caller never made a session (CI's runner: nothing to set).
    #[test]
    fn the_session_group_is_read_and_a_shared_session_is_left_alone() {
        if !testbed::require(
            "priority::tests::the_session_group_is_read_and_a_shared_session_is_left_alone",
            &[testbed::Need::Autogroup],
        ) {
            return;
        }
        let now = session_group().expect("the autogroup interface reads");
        let text = std::fs::read_to_string(AUTOGROUP_SELF).unwrap();
        assert_eq!(parse_session_group(&text), Some(now));
        let leader = leads_its_session();
        match now {
            SessionGroup::Off => panic!("this kernel groups sessions, yet the group reads off"),
            SessionGroup::Root => {
                assert!(!leader, "a session leader has a group of its own");
                assert_eq!(apply_autogroup(-5).unwrap(), Autogroup::Root);
                assert_eq!(set_autogroup_nice(-5).unwrap(), SessionGroup::Root, "the root group is not written");
            }
            SessionGroup::Nice(n) => {
                let other = if n == 19 { 18 } else { n + 1 } as i8;
                match apply_autogroup(other).unwrap() {
                    Autogroup::Shared { nice } => {
                        assert!(!leader && nice == n, "a test binary does not lead its session")
                    }
                    Autogroup::Set { from } => {
                        assert!(leader && from == n);
                        set_autogroup_nice(n as i8).unwrap();
                    }
                    other => panic!("{other:?}"),
                }
            }
        }
        assert_eq!(session_group().unwrap(), now, "left as it was");
    }
}
