//! Real cgroups made by tests: created with a unique name under the v1 blkio hierarchy's root (or, in the cgroup-v2
//! test bed, under the v2 root with the io controller), removed (children first) on drop; a command run inside
//! one; the BFQ weight of a v1 cgroup, once or as it changes.
//!
//! Creating and removing go through `cgroups-rs` (the `fs` API: a hierarchy found from mountinfo for v1 blkio, the
//! v2 root `/sys/fs/cgroup`, the io controller enabled on the way; removal children first, retried as runc does).
//! What stays here, and why:
//! - [`run_in_cgroup`]: the shell moves *itself* into the cgroup (`echo $$ > cgroup.procs`) and then `exec`s the
//!   command, so its very first I/O is accounted there. `cgroups-rs` moves a process by pid, i.e. after it was
//!   spawned (its first reads would land in the parent's cgroup), and doing it between fork and exec takes a
//!   `pre_exec` hook, which is `unsafe` (denied in this workspace).
//! - [`bfq_weight`]: `cgroups-rs` reads and writes `blkio.weight` on v1, which BFQ kernels do not have (BFQ's is
//!   `blkio.bfq.weight`), and on v2 only `io.bfq.weight`, never `io.weight`.
//! - [`remove_cgroup_tree`]: a cgroup directory in *any* hierarchy by absolute path (the pod cgroups containerd
//!   made in every v1 hierarchy); `cgroups-rs` addresses cgroups by hierarchy and relative path, and would also
//!   touch hierarchies (memory, ...) the tests never created anything in. It is the fallback when `cgroups-rs`'s
//!   five tries (150 ms) are not enough.
//! - Fixture trees in temp directories (`crate::fixture`): `cgroups-rs` knows only the system's mount points.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use cgroups_rs::hierarchies::{V1, V2};
use cgroups_rs::Cgroup;

/// The v1 blkio hierarchy on the test machine.
pub const BLKIO: &str = "/sys/fs/cgroup/blkio";
/// The v2 root inside the cgroup-v2 test bed (`scripts/cgroup-v2.sh`), where `cgroups-rs` also looks for it.
pub const V2_ROOT: &str = cgroups_rs::hierarchies::UNIFIED_MOUNTPOINT;

/// A unique-enough suffix for names on the shared machine: pid and clock nanoseconds.
pub fn unique_suffix() -> String {
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(0);
    format!("{}-{nanos:09}", std::process::id())
}

/// A real cgroup created for a test (v1 blkio, or v2 with the io controller), removed with its children on drop.
#[derive(Debug)]
pub struct CgroupGuard {
    /// Absolute path.
    pub path: PathBuf,
    /// Path relative to the hierarchy's root.
    pub rel: String,
    v2: bool,
}

impl CgroupGuard {
    /// Creates `BLKIO/<prefix>-<unique>` in the v1 blkio hierarchy (no other hierarchy is touched).
    pub fn new(prefix: &str) -> Self {
        Self::create(format!("{prefix}-{}", unique_suffix()), false)
    }

    /// Creates `/sys/fs/cgroup/<prefix>-<unique>` on cgroup v2 with the io controller (it gets `io.stat`,
    /// `io.weight`, `io.bfq.weight`): inside the cgroup-v2 test bed.
    pub fn new_v2(prefix: &str) -> Self {
        Self::create(format!("{prefix}-{}", unique_suffix()), true)
    }

    fn create(rel: String, v2: bool) -> Self {
        let (root, cgroup) = if v2 { (V2_ROOT, handle(&rel, true)) } else { (BLKIO, handle(&rel, false)) };
        cgroup.create().unwrap_or_else(|e| panic!("creating cgroup {rel} under {root}: {e}"));
        let path = Path::new(root).join(&rel);
        assert!(path.join("cgroup.procs").is_file(), "cgroups-rs made no cgroup at {}", path.display());
        Self { path, rel, v2 }
    }

    /// Creates the child `name` (removed with the parent).
    pub fn child(&self, name: &str) -> PathBuf {
        let rel = format!("{}/{name}", self.rel);
        handle(&rel, self.v2).create().unwrap_or_else(|e| panic!("creating cgroup {rel}: {e}"));
        let path = self.path.join(name);
        assert!(path.join("cgroup.procs").is_file(), "cgroups-rs made no cgroup at {}", path.display());
        path
    }
}

/// A `cgroups-rs` handle on `rel` in the blkio (v1) or io (v2) controller only.
fn handle(rel: &str, v2: bool) -> Cgroup {
    if v2 {
        Cgroup::load_with_specified_controllers(Box::new(V2::new()), rel, vec!["io".to_string()])
    } else {
        Cgroup::load_with_specified_controllers(Box::new(V1::new()), rel, vec!["blkio".to_string()])
    }
}

impl Drop for CgroupGuard {
    fn drop(&mut self) {
        // The controller's delete removes children first and retries (runc's schedule); `Cgroup::delete` would do
        // neither on v2.
        let cgroup = handle(&self.rel, self.v2);
        let removed =
            cgroup.subsystems().iter().map(|s| s.to_controller().delete()).collect::<Result<Vec<()>, _>>().is_ok();
        if !removed || self.path.exists() {
            remove_cgroup_tree(&self.path);
        }
    }
}

/// Removes a cgroup directory and its child cgroups (rmdir only: cgroup files cannot be unlinked). Retries
/// briefly, since a cgroup whose last task just exited can be busy for a moment.
pub fn remove_cgroup_tree(path: &Path) {
    if let Ok(entries) = fs::read_dir(path) {
        for entry in entries.flatten() {
            if entry.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                remove_cgroup_tree(&entry.path());
            }
        }
    }
    for attempt in 0..50 {
        match fs::remove_dir(path) {
            Ok(()) => return,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
            Err(e) if attempt == 49 => eprintln!("warning: could not remove cgroup {}: {e}", path.display()),
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// Kills every process in `cgroup` (SIGKILL, again until `cgroup.procs` reads empty, for at most 5 s): a killed
/// `sh` leaves the command it was waiting for running, in the same cgroup.
pub fn kill_cgroup_procs(cgroup: &Path) {
    let procs = cgroup.join("cgroup.procs");
    for _ in 0..250 {
        let pids: Vec<i32> =
            fs::read_to_string(&procs).unwrap_or_default().lines().filter_map(|l| l.trim().parse().ok()).collect();
        if pids.is_empty() {
            return;
        }
        for pid in pids {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("processes still in {} after 5 s of SIGKILL", procs.display());
}

/// Runs `script` under `sh -c` after the shell has moved itself into `cgroup` (so everything it `exec`s is
/// accounted there from its first I/O), and waits for it; panics if it fails.
pub fn run_in_cgroup(cgroup: &Path, script: &str) {
    let procs = cgroup.join("cgroup.procs");
    let status = Command::new("sh")
        .arg("-c")
        .arg(format!("echo $$ > '{}' && exec {script}", procs.display()))
        .stdin(Stdio::null())
        .status()
        .expect("sh");
    assert!(status.success(), "`{script}` in {} failed: {status}", cgroup.display());
}

/// The BFQ weight of a v1 blkio cgroup directory (`blkio.bfq.weight`, plain or `default N`), if readable.
pub fn bfq_weight(dir: &Path) -> Option<u32> {
    let text = fs::read_to_string(dir.join("blkio.bfq.weight")).ok()?;
    let t = text.trim();
    t.strip_prefix("default ").unwrap_or(t).split_whitespace().next()?.parse().ok()
}

/// Records the distinct successive values of a cgroup's BFQ weight for `for_how_long`, polling `every`, with the
/// time each was first seen.
pub fn record_weights(dir: &Path, for_how_long: Duration, every: Duration) -> Vec<(Duration, u32)> {
    let t = Instant::now();
    let mut seen: Vec<(Duration, u32)> = Vec::new();
    while t.elapsed() < for_how_long {
        if let Some(w) = bfq_weight(dir) {
            if seen.last().map(|(_, l)| *l) != Some(w) {
                seen.push((t.elapsed(), w));
            }
        }
        std::thread::sleep(every);
    }
    seen
}
