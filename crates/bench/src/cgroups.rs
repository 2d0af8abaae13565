//! The bench's narrow view of cgroups: read a cgroup's I/O byte counters, write its BFQ weight and read it back,
//! list, signal and remove its processes.
//!
//! [`CgroupBackend`] is the seam: [`AgentCgroups`] goes through the agent's library (`qos_agent::cgroup`:
//! `CounterReader`, `WeightFile::write_verified`), which the bench uses whenever it detects the v1 blkio
//! hierarchy; [`V1Bfq`] is a small private reader of the same two files, kept as a fallback and for tests.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use nix::sys::signal::Signal;
use nix::unistd::Pid;
use qos_agent::cgroup::{parse_blkio_stat, CgroupDir, CgroupRoot, CgroupVersion, CounterReader, WeightFile};
use qos_core::{IoCounters, Weight};

use crate::sys;

/// The v1 blkio hierarchy.
pub const V1_BLKIO: &str = "/sys/fs/cgroup/blkio";
/// Per-cgroup bytes served by BFQ (the only v1 counter that counts I/O to a BFQ device without a throttle rule),
/// and per-cgroup BFQ weight (1..=1000, default 100): the agent's names for the two files.
pub use qos_agent::cgroup::{V1_BFQ_BYTES, V1_BFQ_WEIGHT};

/// Reads counters and writes weights of cgroup directories.
pub trait CgroupBackend: Send + Sync + std::fmt::Debug {
    /// Cumulative bytes read and written by the cgroup (all devices).
    fn read_counters(&self, dir: &Path) -> Result<IoCounters>;
    /// The cgroup's weight as the kernel reports it.
    fn read_weight(&self, dir: &Path) -> Result<u64>;
    /// Writes the weight and reads it back; a mismatch is an error.
    fn write_weight_verified(&self, dir: &Path, weight: Weight) -> Result<()> {
        self.write_weight(dir, weight)?;
        let back = self.read_weight(dir)?;
        if back != u64::from(weight.to_bfq()) {
            bail!("{}: wrote weight {} but it reads {back}", dir.display(), weight.to_bfq());
        }
        Ok(())
    }
    /// Writes the weight without checking.
    fn write_weight(&self, dir: &Path, weight: Weight) -> Result<()>;
    /// The cgroup is done (removed, or no longer read): drops whatever the backend keeps open for it.
    fn forget(&self, _dir: &Path) {}
}

/// cgroup v1 `blkio` with BFQ: `blkio.bfq.io_service_bytes_recursive` and `blkio.bfq.weight`.
#[derive(Debug, Default, Clone, Copy)]
pub struct V1Bfq;

impl CgroupBackend for V1Bfq {
    fn read_counters(&self, dir: &Path) -> Result<IoCounters> {
        let path = dir.join(V1_BFQ_BYTES);
        let text = std::fs::read_to_string(&path).with_context(|| format!("cannot read {}", path.display()))?;
        parse_v1_rwstat(&text).with_context(|| format!("cannot parse {}", path.display()))
    }

    fn read_weight(&self, dir: &Path) -> Result<u64> {
        let path = dir.join(V1_BFQ_WEIGHT);
        parse_weight(&sys::read_trim(&path)?).with_context(|| format!("cannot parse {}", path.display()))
    }

    fn write_weight(&self, dir: &Path, weight: Weight) -> Result<()> {
        sys::write_existing(&dir.join(V1_BFQ_WEIGHT), &weight.to_bfq().to_string())
    }
}

/// Counters and weights through the agent's library (`qos_agent::cgroup`): the same files, parsers, confined path
/// resolution and verified writes the agent uses. Counter files stay open between samples (one `pread` each).
#[derive(Debug)]
pub struct AgentCgroups {
    root: CgroupRoot,
    readers: Mutex<HashMap<PathBuf, CounterReader>>,
}

impl AgentCgroups {
    /// Detects the block-I/O hierarchy the way the agent does; it must be the v1 blkio tree the bench drives.
    pub fn detect() -> Result<Self> {
        let root = CgroupRoot::detect().context("qos_agent::cgroup::CgroupRoot::detect")?;
        if root.version() != CgroupVersion::V1 || root.path() != Path::new(V1_BLKIO) {
            bail!(
                "the agent's hierarchy is {:?} at {}, not v1 blkio at {V1_BLKIO}",
                root.version(),
                root.path().display()
            );
        }
        Ok(Self::with_root(root))
    }

    /// On a given root (tests use fixture directories).
    pub fn with_root(root: CgroupRoot) -> Self {
        Self { root, readers: Mutex::new(HashMap::new()) }
    }

    fn dir(&self, path: &Path) -> Result<CgroupDir> {
        let rel = path
            .strip_prefix(self.root.path())
            .with_context(|| format!("{} is not below {}", path.display(), self.root.path().display()))?;
        Ok(self.root.resolve_relative(&rel.to_string_lossy())?)
    }
}

impl CgroupBackend for AgentCgroups {
    fn read_counters(&self, dir: &Path) -> Result<IoCounters> {
        let mut readers = self.readers.lock().unwrap_or_else(|p| p.into_inner());
        if !readers.contains_key(dir) {
            let reader = CounterReader::open(&self.dir(dir)?)?;
            readers.insert(dir.to_path_buf(), reader);
        }
        let reader = readers.get_mut(dir).expect("inserted above");
        match reader.read() {
            Ok(c) => Ok(c),
            Err(e) => {
                // Gone or broken: reopen next time (a recreated cgroup gets a fresh file).
                readers.remove(dir);
                Err(e.into())
            }
        }
    }

    fn read_weight(&self, dir: &Path) -> Result<u64> {
        Ok(u64::from(WeightFile::open(&self.dir(dir)?)?.read()?.to_bfq()))
    }

    fn write_weight(&self, dir: &Path, weight: Weight) -> Result<()> {
        Ok(WeightFile::open(&self.dir(dir)?)?.write(weight)?)
    }

    fn write_weight_verified(&self, dir: &Path, weight: Weight) -> Result<()> {
        Ok(WeightFile::open(&self.dir(dir)?)?.write_verified(weight)?)
    }

    fn forget(&self, dir: &Path) {
        self.readers.lock().unwrap_or_else(|p| p.into_inner()).remove(dir);
    }
}

/// The backend the bench uses: the agent's library when it detects the v1 blkio hierarchy, else the private
/// v1 reader above. Returns the backend and its name for the report.
pub fn default_backend() -> (Arc<dyn CgroupBackend>, &'static str) {
    match AgentCgroups::detect() {
        Ok(agent) => (Arc::new(agent), "qos_agent::cgroup"),
        Err(e) => {
            tracing::warn!("using the bench's own cgroup v1 reader: {e:#}");
            (Arc::new(V1Bfq), "bench V1Bfq")
        }
    }
}

/// Sums the `Read` and `Write` lines of every device in a v1 rwstat file (`7:0 Read 123`), with the agent's parser
/// (`qos_agent::cgroup::parse_blkio_stat`).
pub fn parse_v1_rwstat(text: &str) -> Result<IoCounters> {
    Ok(parse_blkio_stat(Path::new(V1_BFQ_BYTES), text.as_bytes())?)
}

/// Parses a weight file: `100` (v1) or `default 100` (v2 `io.bfq.weight`).
pub fn parse_weight(text: &str) -> Result<u64> {
    let first = text.lines().next().unwrap_or("").trim();
    let value = first.strip_prefix("default").map(str::trim).unwrap_or(first);
    value.parse().with_context(|| format!("bad weight {first:?}"))
}

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

/// Whether the v1 blkio hierarchy with BFQ files is usable here.
pub fn v1_blkio_with_bfq() -> Result<PathBuf> {
    let root = PathBuf::from(V1_BLKIO);
    if !root.join("cgroup.procs").exists() {
        bail!("no cgroup v1 blkio hierarchy at {V1_BLKIO} (the cgroup runtime needs it)");
    }
    if !root.join(V1_BFQ_BYTES).exists() {
        bail!("{V1_BLKIO} has no {V1_BFQ_BYTES}: BFQ is not active on any device");
    }
    Ok(root)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "7:0 Read 1048576\n7:0 Write 4096\n7:0 Sync 1052672\n7:0 Async 0\n7:0 Discard 0\n\
                          7:0 Total 1052672\n254:0 Read 10\n254:0 Write 0\nTotal 1052682\n";

    #[test]
    fn rwstat_sums_devices() {
        let c = parse_v1_rwstat(SAMPLE).unwrap();
        assert_eq!(c, IoCounters::new(1_048_586, 4096));
        assert_eq!(parse_v1_rwstat("Total 0\n").unwrap(), IoCounters::default());
        assert!(parse_v1_rwstat("7:0 Read lots\n").is_err());
    }

    #[test]
    fn weight_formats() {
        assert_eq!(parse_weight("100\n").unwrap(), 100);
        assert_eq!(parse_weight("default 250\n8:0 500\n").unwrap(), 250);
        assert!(parse_weight("").is_err());
    }

    /// A fake cgroup directory: the backend's verified write must catch a file that does not keep the value.
    #[test]
    fn verified_write_on_fixture() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(V1_BFQ_WEIGHT), "100\n").unwrap();
        std::fs::write(dir.path().join(V1_BFQ_BYTES), SAMPLE).unwrap();
        let b = V1Bfq;
        b.write_weight_verified(dir.path(), Weight::new(1000).unwrap()).unwrap();
        assert_eq!(b.read_weight(dir.path()).unwrap(), 1000);
        assert_eq!(b.read_counters(dir.path()).unwrap().read, 1_048_586);
        // A missing file is an error, never created.
        let empty = tempfile::tempdir().unwrap();
        assert!(b.write_weight(empty.path(), Weight::new(10).unwrap()).is_err());
        assert!(!empty.path().join(V1_BFQ_WEIGHT).exists());
    }

    /// The agent's library on a fixture v1 tree: same counters and verified writes as the private reader.
    #[test]
    fn agent_backend_on_fixture() {
        let root_dir = tempfile::tempdir().unwrap();
        let cg = root_dir.path().join("fg-1");
        std::fs::create_dir(&cg).unwrap();
        std::fs::write(cg.join(V1_BFQ_WEIGHT), "100\n").unwrap();
        std::fs::write(cg.join(V1_BFQ_BYTES), SAMPLE).unwrap();
        let root = CgroupRoot::from_dir(CgroupVersion::V1, root_dir.path()).unwrap();
        let cg = root.path().join("fg-1");
        let agent = AgentCgroups::with_root(root);
        assert_eq!(agent.read_counters(&cg).unwrap(), V1Bfq.read_counters(&cg).unwrap());
        agent.write_weight_verified(&cg, Weight::new(1000).unwrap()).unwrap();
        assert_eq!(V1Bfq.read_weight(&cg).unwrap(), 1000);
        assert_eq!(agent.read_weight(&cg).unwrap(), 1000);
        assert!(agent.read_counters(Path::new("/elsewhere")).is_err(), "paths outside the root are refused");
    }

    /// `forget` closes the counter file kept open for a cgroup; the next read reopens it.
    #[test]
    fn agent_backend_forgets_readers() {
        let root_dir = tempfile::tempdir().unwrap();
        let cg = root_dir.path().join("fg-1");
        std::fs::create_dir(&cg).unwrap();
        std::fs::write(cg.join(V1_BFQ_BYTES), SAMPLE).unwrap();
        let root = CgroupRoot::from_dir(CgroupVersion::V1, root_dir.path()).unwrap();
        let cg = root.path().join("fg-1");
        let agent = AgentCgroups::with_root(root);
        agent.read_counters(&cg).unwrap();
        assert_eq!(agent.readers.lock().unwrap().len(), 1);
        agent.forget(&cg);
        assert!(agent.readers.lock().unwrap().is_empty());
        assert_eq!(agent.read_counters(&cg).unwrap().read, 1_048_586);
    }

    #[derive(Debug)]
    struct Liar;
    impl CgroupBackend for Liar {
        fn read_counters(&self, _: &Path) -> Result<IoCounters> {
            Ok(IoCounters::default())
        }
        fn read_weight(&self, _: &Path) -> Result<u64> {
            Ok(0) // like Docker 20.10 on this kernel: the write is discarded
        }
        fn write_weight(&self, _: &Path, _: Weight) -> Result<()> {
            Ok(())
        }
    }

    #[test]
    fn verification_catches_discarded_writes() {
        let err = Liar.write_weight_verified(Path::new("/x"), Weight::new(500).unwrap()).unwrap_err();
        assert!(err.to_string().contains("reads 0"), "{err}");
    }
}
