//! Backends that work on cgroup files directly: [`CgroupfsCounters`] (one open file per container, one read per
//! round) and [`CgroupfsWriter`] (write the weight file, read it back).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use qos_core::{ContainerId, IoCounters, Weight};
use tracing::debug;

use crate::backend::{AppliedVia, BackendError, ContainerInfo, CounterSource, WeightWriter};
use crate::cgroup::{CgroupDir, CgroupRoot, CounterReader, WeightFile};

/// Counters read from each container's cgroup stat file, kept open between rounds.
///
/// With a cgroup root ([`CgroupfsCounters::with_root`]) a round first reads each *parent* cgroup's recursive
/// counters (e.g. `docker/` for all Docker containers): when they did not move since the previous round, none of
/// the children did I/O and their files are not read at all. On an idle host a round then costs one read per
/// parent instead of one per container; with I/O somewhere under a parent, every child of it is read as usual.
/// Every [`FULL_READ_EVERY`]th round reads every child regardless, which bounds the delay should a parent's
/// counters ever miss a child's I/O (a kernel that does not aggregate, a cgroup moved, a fixture tree).
#[derive(Debug, Default)]
pub struct CgroupfsCounters {
    root: Option<Arc<CgroupRoot>>,
    readers: HashMap<ContainerId, Member>,
    /// Parent gates by slot; a member holds its slot index (hashing a path per member per round cost more than
    /// the reads it saves). Parents are few; empty slots are reused.
    parents: Vec<Option<Parent>>,
    /// Members without a gate: read every round.
    ungated: usize,
    /// Rounds since the last full read.
    rounds: u32,
}

/// How often (in rounds) the parent gate is ignored and every child read.
pub const FULL_READ_EVERY: u32 = 8;

#[derive(Debug)]
struct Member {
    reader: CounterReader,
    /// Slot in `parents`; `None` when ungated (no root, parent is the root, or its counters cannot be read).
    parent: Option<usize>,
}

#[derive(Debug)]
struct Parent {
    path: PathBuf,
    reader: CounterReader,
    last: Option<IoCounters>,
    members: usize,
    /// A member joined: read every member once, whatever the parent says (the new one needs its baseline).
    dirty: bool,
    /// Decided at the start of each round.
    changed: bool,
}

impl CgroupfsCounters {
    /// No container attached yet; every container is read every round.
    pub fn new() -> Self {
        Self::default()
    }

    /// Like [`CgroupfsCounters::new`], with the parent gate: containers whose parent cgroup (under `root`) did no
    /// I/O since the previous round are not read.
    pub fn with_root(root: Arc<CgroupRoot>) -> Self {
        Self { root: Some(root), ..Self::default() }
    }

    /// Attaches synchronously (the trait's `attach` is this, wrapped).
    pub fn attach_now(&mut self, info: &ContainerInfo) -> Result<(), BackendError> {
        let dir = info.cgroup.as_ref().ok_or_else(|| BackendError::NoCgroup(info.id.clone()))?;
        let reader = CounterReader::open(dir)?;
        debug!(container = %info.id.short(), file = %reader.source_file().display(), "sampling counters");
        let parent = self.gate_for(dir);
        if parent.is_none() {
            self.ungated += 1;
        }
        if let Some(old) = self.readers.insert(info.id.clone(), Member { reader, parent }) {
            self.leave(old.parent);
        }
        if let Some(Some(p)) = parent.map(|i| &mut self.parents[i]) {
            p.members += 1;
            p.dirty = true;
        }
        Ok(())
    }

    /// The parent gate for a container's cgroup, opened on first use; `None` if it cannot have one.
    fn gate_for(&mut self, dir: &CgroupDir) -> Option<usize> {
        let root = self.root.as_ref()?;
        let rel = dir.path().strip_prefix(root.path()).ok()?.parent()?;
        let path = dir.path().parent()?;
        if rel.as_os_str().is_empty() {
            return None; // the parent is the whole hierarchy: its counters move with every I/O on the host
        }
        if let Some(i) = self.parents.iter().position(|p| p.as_ref().is_some_and(|p| p.path == path)) {
            return Some(i);
        }
        let parent = root.resolve_relative(rel.to_str()?).ok()?;
        let reader = CounterReader::open(&parent).ok()?;
        let gate = Parent { path: path.to_path_buf(), reader, last: None, members: 0, dirty: true, changed: true };
        match self.parents.iter().position(Option::is_none) {
            Some(i) => {
                self.parents[i] = Some(gate);
                Some(i)
            }
            None => {
                self.parents.push(Some(gate));
                Some(self.parents.len() - 1)
            }
        }
    }

    fn leave(&mut self, parent: Option<usize>) {
        let Some(slot) = parent.and_then(|i| self.parents.get_mut(i)) else {
            self.ungated -= 1;
            return;
        };
        if let Some(p) = slot {
            p.members -= 1;
            if p.members == 0 {
                *slot = None;
            }
        }
    }

    /// Whether the container is attached.
    pub fn contains(&self, id: &ContainerId) -> bool {
        self.readers.contains_key(id)
    }

    /// Number of attached containers.
    pub fn len(&self) -> usize {
        self.readers.len()
    }

    /// Whether none is attached.
    pub fn is_empty(&self) -> bool {
        self.readers.is_empty()
    }

    /// One round, synchronously. Containers skipped by the parent gate get no entry in `out`.
    pub fn sample_now(&mut self, out: &mut Vec<(ContainerId, Result<IoCounters, BackendError>)>) {
        let full = self.rounds == 0;
        self.rounds = (self.rounds + 1) % FULL_READ_EVERY;
        let mut any_changed = false;
        for p in self.parents.iter_mut().flatten() {
            let now = p.reader.read().ok();
            p.changed = full || p.dirty || now.is_none() || now != p.last;
            p.dirty = false;
            p.last = now;
            any_changed |= p.changed;
        }
        if !any_changed && self.ungated == 0 {
            return; // an idle host: nothing to read
        }
        out.reserve(self.readers.len());
        for (id, m) in &mut self.readers {
            if m.parent.and_then(|i| self.parents[i].as_ref()).is_some_and(|p| !p.changed) {
                continue;
            }
            out.push((id.clone(), m.reader.read().map_err(BackendError::from)));
        }
    }
}

impl CounterSource for CgroupfsCounters {
    async fn attach(&mut self, info: &ContainerInfo) -> Result<(), BackendError> {
        self.attach_now(info)
    }

    fn detach(&mut self, id: &ContainerId) {
        if let Some(m) = self.readers.remove(id) {
            self.leave(m.parent);
        }
    }

    async fn sample(&mut self, out: &mut Vec<(ContainerId, Result<IoCounters, BackendError>)>) {
        self.sample_now(out)
    }
}

/// Writes the cgroup weight file (`blkio.bfq.weight`, `blkio.weight`, `io.bfq.weight` or `io.weight`, whichever
/// the cgroup has) and reads it back.
#[derive(Debug, Default, Clone, Copy)]
pub struct CgroupfsWriter;

impl CgroupfsWriter {
    /// Reads the current weight synchronously.
    pub fn read_now(info: &ContainerInfo) -> Result<Weight, BackendError> {
        let dir = info.cgroup.as_ref().ok_or_else(|| BackendError::NoCgroup(info.id.clone()))?;
        Ok(WeightFile::open(dir)?.read()?)
    }

    /// Writes and verifies synchronously.
    pub fn write_now(info: &ContainerInfo, weight: Weight) -> Result<AppliedVia, BackendError> {
        let dir = info.cgroup.as_ref().ok_or_else(|| BackendError::NoCgroup(info.id.clone()))?;
        WeightFile::open(dir)?.write_verified(weight)?;
        Ok(AppliedVia::CgroupFile)
    }
}

impl WeightWriter for CgroupfsWriter {
    async fn read(&mut self, info: &ContainerInfo) -> Result<Weight, BackendError> {
        Self::read_now(info)
    }

    async fn write(&mut self, info: &ContainerInfo, weight: Weight) -> Result<AppliedVia, BackendError> {
        Self::write_now(info, weight)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::fs;

    use super::*;
    use crate::cgroup::CgroupVersion;

    const STAT: &str = "blkio.bfq.io_service_bytes_recursive";

    fn write_stat(dir: &std::path::Path, read: u64) {
        fs::write(dir.join(STAT), format!("7:0 Read {read}\n7:0 Write 0\n7:0 Total {read}\nTotal {read}\n")).unwrap();
    }

    fn ids(out: &[(ContainerId, Result<IoCounters, BackendError>)]) -> Vec<String> {
        let mut v: Vec<String> = out.iter().map(|(id, _)| id.to_string()).collect();
        v.sort();
        v
    }

    #[test]
    fn parent_gate_skips_children_of_a_quiet_parent() {
        let tmp = tempfile::tempdir().unwrap();
        let parent = tmp.path().join("pods");
        fs::create_dir(&parent).unwrap();
        write_stat(&parent, 0);
        let root = Arc::new(CgroupRoot::from_dir(CgroupVersion::V1, tmp.path()).unwrap());
        let mut c = CgroupfsCounters::with_root(root.clone());
        for name in ["a", "b"] {
            let d = parent.join(name);
            fs::create_dir(&d).unwrap();
            write_stat(&d, 0);
            let info = ContainerInfo {
                id: ContainerId::new(name),
                name: name.into(),
                labels: BTreeMap::new(),
                cgroup: Some(root.resolve_relative(&format!("pods/{name}")).unwrap()),
            };
            c.attach_now(&info).unwrap();
        }
        let mut out = Vec::new();
        c.sample_now(&mut out);
        assert_eq!(ids(&out), ["a", "b"], "new members are read once for their baseline");
        for _ in 1..FULL_READ_EVERY {
            out.clear();
            c.sample_now(&mut out);
            assert!(out.is_empty(), "quiet parent: no child read");
        }
        c.sample_now(&mut out);
        assert_eq!(ids(&out), ["a", "b"], "every {FULL_READ_EVERY}th round reads every child anyway");
        out.clear();
        c.sample_now(&mut out);
        assert!(out.is_empty());
        write_stat(&parent.join("a"), 4096);
        write_stat(&parent, 4096);
        c.sample_now(&mut out);
        assert_eq!(ids(&out), ["a", "b"], "parent moved: every child read");
        let a = out.iter().find(|(id, _)| id.as_str() == "a").unwrap();
        assert_eq!(a.1.as_ref().unwrap().read, 4096);
        out.clear();
        c.detach(&ContainerId::new("a"));
        c.detach(&ContainerId::new("b"));
        assert!(c.parents.iter().all(Option::is_none), "gate dropped with its last member");
        for _ in 0..FULL_READ_EVERY {
            c.sample_now(&mut out);
            assert!(out.is_empty());
        }
    }

    #[test]
    fn without_a_root_every_child_is_read_every_round() {
        let tmp = tempfile::tempdir().unwrap();
        let root = CgroupRoot::from_dir(CgroupVersion::V1, tmp.path()).unwrap();
        fs::create_dir(tmp.path().join("x")).unwrap();
        write_stat(&tmp.path().join("x"), 1);
        let mut c = CgroupfsCounters::new();
        let info = ContainerInfo {
            id: ContainerId::new("x"),
            name: "x".into(),
            labels: BTreeMap::new(),
            cgroup: Some(root.resolve_relative("x").unwrap()),
        };
        c.attach_now(&info).unwrap();
        for _ in 0..3 {
            let mut out = Vec::new();
            c.sample_now(&mut out);
            assert_eq!(ids(&out), ["x"]);
        }
    }
}
