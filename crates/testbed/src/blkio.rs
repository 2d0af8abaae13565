//! Real cgroup v1 blkio cgroups made by tests: created under the hierarchy's root with a unique name, removed
//! (children first) on drop; a command run inside one; the BFQ weight of one, once or as it changes.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The v1 blkio hierarchy on the test machine.
pub const BLKIO: &str = "/sys/fs/cgroup/blkio";

/// A unique-enough suffix for names on the shared machine: pid and clock nanoseconds.
pub fn unique_suffix() -> String {
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(0);
    format!("{}-{nanos:09}", std::process::id())
}

/// A v1 blkio cgroup created for a test, removed (children first) on drop.
#[derive(Debug)]
pub struct CgroupGuard {
    /// Absolute path.
    pub path: PathBuf,
    /// Path relative to the blkio root.
    pub rel: String,
}

impl CgroupGuard {
    /// Creates `BLKIO/<prefix>-<unique>`.
    pub fn new(prefix: &str) -> Self {
        let rel = format!("{prefix}-{}", unique_suffix());
        let path = Path::new(BLKIO).join(&rel);
        fs::create_dir(&path).unwrap_or_else(|e| panic!("mkdir {}: {e}", path.display()));
        Self { path, rel }
    }

    /// Creates the child `name` (removed with the parent).
    pub fn child(&self, name: &str) -> PathBuf {
        let path = self.path.join(name);
        fs::create_dir(&path).unwrap_or_else(|e| panic!("mkdir {}: {e}", path.display()));
        path
    }
}

impl Drop for CgroupGuard {
    fn drop(&mut self) {
        remove_cgroup_tree(&self.path);
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
