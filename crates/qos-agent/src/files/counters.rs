//! [`FileCounters`]: each container's cumulative I/O counters, read from its cgroup stat file, with the
//! parent gate that keeps a round's cost proportional to the containers that did I/O rather than to all of them.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use qos_core::{ContainerId, IoCounters};
use tracing::debug;

use crate::backend::{BackendError, ContainerInfo, CounterSource};
use crate::cgroup::{CgroupDir, CgroupRoot, CounterReader};

/// How often (in rounds) the parent gate is ignored and every child read.
pub const FULL_READ_EVERY: u32 = 8;

/// A child whose counters did not move for this many rounds counts as idle: it is read only when its parent's
/// counters show I/O that the active children do not account for.
pub const ACTIVE_ROUNDS: u64 = 4;

/// Counters read from each container's cgroup stat file, kept open between rounds.
///
/// Reading a cgroup stat file costs the kernel a few microseconds (measured on kernel 6.18: 4.3 µs per file when
/// the round's 1,024 files are cache-cold), so at a thousand containers reading every file every round is
/// most of the agent's cost. With a cgroup root ([`FileCounters::with_root`]) each round uses the
/// *parent* cgroups' recursive counters (e.g. `docker/`, the sum over all Docker containers):
///
/// 1. each parent's counters are read first; a parent that did not move since the previous round means none of
///    its children did I/O, and none is read;
/// 2. a parent that moved has its *active* children read (those whose counters moved, or which joined, in the
///    last [`ACTIVE_ROUNDS`] rounds);
/// 3. the parent's bytes are then compared with the sum of its children's last-read bytes plus the offset taken
///    at the last full read (bytes of the parent's own processes, of removed and unmanaged children). Children
///    are read after the parent, so when only active children did I/O the parent cannot exceed that sum; when it
///    does, some idle child (or an unmanaged cgroup) did I/O and every child of that parent is read this round.
///
/// Every child of a parent is read, and the offset re-taken (parent read again after the children, so the offset
/// is an upper bound and never triggers step 3 by itself), when a member joins or leaves, when a read fails,
/// when the parent's counters go down (the kernel drops a removed child's bytes from its parent), and every
/// [`FULL_READ_EVERY`]th round. That last one bounds the delay should a parent's counters ever miss a child's I/O
/// (a kernel that does not aggregate, a fixture tree) or should an idle child's few bytes be masked by I/O the
/// active children did between the two reads of a full round. No I/O is lost either way: counters are
/// cumulative, so a child read late reports everything since its previous read.
#[derive(Debug, Default)]
pub struct FileCounters {
    root: Option<Arc<CgroupRoot>>,
    readers: HashMap<ContainerId, Member>,
    /// Parent gates by slot; a member holds its slot index (hashing a path per member per round cost more than
    /// the reads it saves). Parents are few; empty slots are reused.
    parents: Vec<Option<Parent>>,
    /// Members without a gate: read every round.
    ungated: usize,
    /// Rounds since the last full read, modulo [`FULL_READ_EVERY`] (0: this round reads every child).
    since_full_read: u32,
    /// Rounds since the start.
    round: u64,
}

#[derive(Debug)]
struct Member {
    reader: CounterReader,
    /// Slot in `parents`; `None` when ungated (no root, parent is the root, or its counters cannot be read).
    parent: Option<usize>,
    /// Read + write bytes at the last successful read.
    last: Option<u64>,
    /// The round in which a read last found `last` changed (or the member joined).
    moved: u64,
    /// The round of the last read attempt (a member is read at most once per round).
    round: u64,
}

impl Member {
    fn active(&self, round: u64) -> bool {
        self.last.is_none() || round.saturating_sub(self.moved) < ACTIVE_ROUNDS
    }

    /// Reads the counters in `round`; returns the change of the byte total, for the parent's sum.
    fn read(&mut self, round: u64) -> (Result<IoCounters, BackendError>, i128) {
        self.round = round;
        match self.reader.read() {
            Ok(c) => {
                let now = total(&c);
                let old = self.last.replace(now);
                if old != Some(now) {
                    self.moved = round;
                }
                (Ok(c), i128::from(now) - i128::from(old.unwrap_or(0)))
            }
            Err(e) => (Err(e.into()), 0),
        }
    }
}

#[derive(Debug)]
struct Parent {
    path: PathBuf,
    reader: CounterReader,
    /// Bytes at the first read of the previous round.
    last: Option<u64>,
    members: usize,
    /// Σ of the members' `last`.
    sum: i128,
    /// Parent bytes minus `sum` at the last full read (an upper bound of the true offset); `None` until taken.
    offset: Option<i128>,
    /// Read every member this round (membership changed or a read failed).
    dirty: bool,
    /// Decided during each round.
    mode: Mode,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// No child did I/O.
    Skip,
    /// Read the active children, then check the parent's bytes against their sum.
    Active,
    /// Read every child, then re-take the offset.
    All,
}

fn total(c: &IoCounters) -> u64 {
    c.read.saturating_add(c.write)
}

type Sample = (ContainerId, Result<IoCounters, BackendError>);

impl FileCounters {
    /// No container attached yet; every container is read every round.
    pub fn new() -> Self {
        Self::default()
    }

    /// Like [`FileCounters::new`], with the parent gate: a container is read only when its parent cgroup
    /// (under `root`) shows I/O that may be its own.
    pub fn with_root(root: Arc<CgroupRoot>) -> Self {
        Self { root: Some(root), ..Self::default() }
    }

    /// Attaches synchronously (the trait's `attach` is this, wrapped).
    pub fn attach_now(&mut self, info: &ContainerInfo) -> Result<(), BackendError> {
        let dir = info.cgroup.as_ref().ok_or_else(|| BackendError::NoCgroup(info.id.clone()))?;
        let reader = CounterReader::open(dir)?;
        debug!(container = %info.id.short(), file = %reader.source_file().display(), "sampling counters");
        // Attached again: leave the old gate first, so a gate whose only member this is is not dropped under it.
        if let Some(old) = self.readers.remove(&info.id) {
            self.leave(&old);
        }
        let parent = self.gate_for(dir);
        if parent.is_none() {
            self.ungated += 1;
        }
        let member = Member { reader, parent, last: None, moved: self.round, round: 0 };
        self.readers.insert(info.id.clone(), member);
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
        let gate = Parent {
            path: path.to_path_buf(),
            reader,
            last: None,
            members: 0,
            sum: 0,
            offset: None,
            dirty: true,
            mode: Mode::All,
        };
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

    fn leave(&mut self, member: &Member) {
        let Some(slot) = member.parent.and_then(|i| self.parents.get_mut(i)) else {
            self.ungated -= 1;
            return;
        };
        if let Some(p) = slot {
            p.members -= 1;
            p.sum -= i128::from(member.last.unwrap_or(0));
            p.dirty = true;
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

    /// One round, synchronously. Containers the gate skipped get no entry in `out`.
    pub fn sample_now(&mut self, out: &mut Vec<Sample>) {
        let full = self.since_full_read == 0;
        self.since_full_read = (self.since_full_read + 1) % FULL_READ_EVERY;
        self.round += 1;
        let mut any = self.ungated > 0;
        for p in self.parents.iter_mut().flatten() {
            let now = p.reader.read().ok().map(|c| total(&c));
            let went_down = matches!((now, p.last), (Some(n), Some(l)) if n < l);
            p.mode = if full || p.dirty || now.is_none() || p.offset.is_none() || went_down {
                Mode::All
            } else if now != p.last {
                Mode::Active
            } else {
                Mode::Skip
            };
            p.dirty = false;
            p.last = now;
            any |= p.mode != Mode::Skip;
        }
        if !any {
            return; // an idle host: nothing to read
        }
        // Ungated members, members of parents in `All`, and the active members of parents in `Active`.
        let round = self.round;
        self.read_members(out, |mode, m| match mode {
            None | Some(Mode::All) => true,
            Some(Mode::Active) => m.active(round),
            Some(Mode::Skip) => false,
        });
        let mut unexplained = false;
        for p in self.parents.iter_mut().flatten().filter(|p| p.mode == Mode::Active) {
            let (Some(now), Some(offset)) = (p.last, p.offset) else { continue };
            if i128::from(now) - p.sum - offset > 0 {
                p.mode = Mode::All;
                unexplained = true;
            }
        }
        if unexplained {
            // Parents whose active children did not account for their bytes: their other children now.
            self.read_members(out, |mode, _| mode == Some(Mode::All));
        }
        for p in self.parents.iter_mut().flatten().filter(|p| p.mode == Mode::All) {
            p.offset = p.reader.read().ok().map(|c| i128::from(total(&c)) - p.sum);
        }
    }

    /// Reads the members `pick` selects (given their parent's mode, `None` when ungated), once per round each.
    fn read_members(&mut self, out: &mut Vec<Sample>, pick: impl Fn(Option<Mode>, &Member) -> bool) {
        for (id, m) in &mut self.readers {
            let parent = m.parent.and_then(|i| self.parents[i].as_mut());
            if m.round == self.round || !pick(parent.as_ref().map(|p| p.mode), m) {
                continue;
            }
            let (result, delta) = m.read(self.round);
            if let Some(p) = parent {
                p.sum += delta;
                p.dirty |= result.is_err();
            }
            out.push((id.clone(), result));
        }
    }
}

impl CounterSource for FileCounters {
    async fn attach(&mut self, info: &ContainerInfo) -> Result<(), BackendError> {
        self.attach_now(info)
    }

    fn detach(&mut self, id: &ContainerId) {
        if let Some(m) = self.readers.remove(id) {
            self.leave(&m);
        }
    }

    async fn sample(&mut self, out: &mut Vec<Sample>) {
        self.sample_now(out)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::fs;
    use std::path::Path;

    use super::*;
    use crate::cgroup::CgroupVersion;

    const STAT: &str = "blkio.bfq.io_service_bytes_recursive";

    /// Writes both the v1 file and v2 `io.stat`, so one tree serves either version's reader.
    fn write_stat(dir: &Path, read: u64) {
        fs::write(dir.join(STAT), format!("7:0 Read {read}\n7:0 Write 0\n7:0 Total {read}\nTotal {read}\n")).unwrap();
        fs::write(dir.join("io.stat"), format!("7:0 rbytes={read} wbytes=0 rios=1 wios=0 dbytes=0 dios=0\n")).unwrap();
    }

    fn ids(out: &[Sample]) -> Vec<String> {
        let mut v: Vec<String> = out.iter().map(|(id, _)| id.to_string()).collect();
        v.sort();
        v
    }

    /// A fixture tree `pods/{names}` whose files the test writes; the parent's file plays the kernel's sum.
    struct Tree {
        _tmp: tempfile::TempDir,
        parent: PathBuf,
        counters: FileCounters,
        /// Each child's bytes, and the parent's own (processes in the parent, removed children).
        bytes: BTreeMap<String, u64>,
        own: u64,
    }

    impl Tree {
        fn new(names: &[&str]) -> Self {
            Self::with_version(CgroupVersion::V1, names)
        }

        fn with_version(version: CgroupVersion, names: &[&str]) -> Self {
            let tmp = tempfile::tempdir().unwrap();
            let parent = tmp.path().join("pods");
            fs::create_dir(&parent).unwrap();
            write_stat(&parent, 0);
            let root = Arc::new(CgroupRoot::from_dir(version, tmp.path()).unwrap());
            let mut t =
                Self { counters: FileCounters::with_root(root), parent, _tmp: tmp, bytes: BTreeMap::new(), own: 0 };
            for n in names {
                t.add(n);
            }
            t
        }

        fn add(&mut self, name: &str) {
            let d = self.parent.join(name);
            fs::create_dir(&d).unwrap();
            write_stat(&d, 0);
            self.bytes.insert(name.into(), 0);
            let root = self.counters.root.clone().unwrap();
            let info = ContainerInfo {
                id: ContainerId::new(name),
                name: name.into(),
                labels: BTreeMap::new(),
                cgroup: Some(root.resolve_relative(&format!("pods/{name}")).unwrap()),
            };
            self.counters.attach_now(&info).unwrap();
        }

        /// `name` does `n` bytes of I/O: its file and the parent's sum move, like the kernel's.
        fn io(&mut self, name: &str, n: u64) {
            let b = self.bytes.get_mut(name).unwrap();
            *b += n;
            write_stat(&self.parent.join(name), *b);
            self.sync_parent();
        }

        fn sync_parent(&self) {
            write_stat(&self.parent, self.bytes.values().sum::<u64>() + self.own);
        }

        fn round(&mut self) -> Vec<String> {
            let mut out = Vec::new();
            self.counters.sample_now(&mut out);
            for (id, r) in &out {
                assert_eq!(r.as_ref().unwrap().read, self.bytes[id.as_str()], "{id} read the current bytes");
            }
            ids(&out)
        }

        /// Rounds in which only `name` does I/O (`n` bytes each), until every other child counts as idle; the
        /// last of them is a full read, so the caller's next round is the first after it.
        fn settle_with_busy(&mut self, name: &str, n: u64) {
            for _ in 0..=ACTIVE_ROUNDS {
                self.quiet_until_full();
                self.io(name, n);
                self.round();
            }
        }

        /// Rounds until just before the next full read, each reading nothing (callers make sure nothing moved).
        fn quiet_until_full(&mut self) {
            while self.counters.since_full_read != 0 {
                assert!(self.round().is_empty(), "a quiet parent: no child read");
            }
        }
    }

    #[test]
    fn a_quiet_parent_reads_no_child_except_every_full_round() {
        let mut t = Tree::new(&["a", "b"]);
        assert_eq!(t.round(), ["a", "b"], "new members are read once for their baseline");
        t.quiet_until_full();
        assert_eq!(t.round(), ["a", "b"], "every {FULL_READ_EVERY}th round reads every child anyway");
        t.quiet_until_full();
        t.counters.detach(&ContainerId::new("a"));
        t.counters.detach(&ContainerId::new("b"));
        assert!(t.counters.parents.iter().all(Option::is_none), "gate dropped with its last member");
        for _ in 0..FULL_READ_EVERY {
            assert!(t.round().is_empty());
        }
    }

    #[test]
    fn io_explained_by_active_children_leaves_idle_ones_unread() {
        let names: Vec<String> = (0..10).map(|i| format!("c{i}")).collect();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        let mut t = Tree::new(&names);
        t.round();
        // c0 keeps reading; the others stay idle long enough to count as idle.
        t.settle_with_busy("c0", 4096);
        for i in 0..3 * FULL_READ_EVERY {
            t.io("c0", 1 << 20);
            let read = t.round();
            if t.counters.since_full_read == 1 {
                assert_eq!(read.len(), 10, "round {i} was a full read");
            } else {
                assert_eq!(read, ["c0"], "round {i}: the parent's bytes are c0's, nobody else is read");
            }
        }
    }

    #[test]
    fn io_of_an_idle_child_is_seen_in_the_same_round() {
        let mut t = Tree::new(&["busy", "idle1", "idle2"]);
        t.round();
        t.settle_with_busy("busy", 4096);
        t.io("busy", 4096);
        assert_eq!(t.round(), ["busy"]);
        t.io("busy", 4096);
        t.io("idle2", 512);
        assert_eq!(t.round(), ["busy", "idle1", "idle2"], "unexplained bytes: every child read");
        // idle2 is now active; the next round reads busy and idle2 only.
        t.io("busy", 4096);
        assert_eq!(t.round(), ["busy", "idle2"]);
        // Without any busy child: the parent moves, the only active child did nothing, idle1 is found.
        t.io("idle1", 1);
        assert_eq!(t.round(), ["busy", "idle1", "idle2"]);
    }

    #[test]
    fn unmanaged_io_under_the_parent_reads_every_child_then_settles() {
        let mut t = Tree::new(&["a", "b"]);
        t.round();
        t.settle_with_busy("a", 1);
        t.own += 100; // a process in the parent itself, or a child cgroup the agent does not manage
        t.sync_parent();
        assert_eq!(t.round(), ["a", "b"], "the parent moved and no active child explains it");
        t.io("a", 1);
        assert_eq!(t.round(), ["a"], "the offset now includes those bytes");
    }

    #[test]
    fn parent_going_down_or_membership_changing_reads_every_child() {
        let mut t = Tree::new(&["a", "b", "c"]);
        t.round();
        t.settle_with_busy("a", 10);
        t.io("a", 10);
        assert_eq!(t.round(), ["a"]);
        // The kernel drops a removed child's bytes from its parent: the parent's counters go down.
        t.counters.detach(&ContainerId::new("c"));
        t.bytes.remove("c");
        t.io("a", 10);
        assert_eq!(t.round(), ["a", "b"], "a member left: every child read, offset re-taken");
        t.io("a", 10);
        assert_eq!(t.round(), ["a"]);
        t.add("d");
        t.io("a", 10);
        assert_eq!(t.round(), ["a", "b", "d"], "a member joined: every child read (d's baseline)");
        t.own = 0;
        t.io("b", 0);
        write_stat(&t.parent, 1);
        assert_eq!(t.round(), ["a", "b", "d"], "parent went down: every child read");
    }

    #[test]
    fn a_failed_child_read_reads_every_child_next_round() {
        let mut t = Tree::new(&["a", "b"]);
        t.round();
        t.settle_with_busy("a", 1);
        fs::write(t.parent.join("a").join(STAT), "garbage\n").unwrap();
        write_stat(&t.parent, 999);
        let mut out = Vec::new();
        t.counters.sample_now(&mut out);
        let a = out.iter().find(|(id, _)| id.as_str() == "a").unwrap();
        assert!(a.1.is_err(), "malformed file reported");
        t.io("a", 1); // rewrites a's file correctly
        write_stat(&t.parent, t.bytes.values().sum::<u64>());
        assert_eq!(t.round(), ["a", "b"]);
    }

    #[test]
    fn the_gate_works_the_same_on_v2_io_stat() {
        let mut t = Tree::with_version(CgroupVersion::V2, &["busy", "idle"]);
        let reader = &t.counters.readers[&ContainerId::new("busy")].reader;
        assert_eq!(reader.kind(), crate::cgroup::CounterFileKind::V2IoStat);
        t.round();
        t.settle_with_busy("busy", 4096);
        t.io("busy", 4096);
        assert_eq!(t.round(), ["busy"]);
        t.io("idle", 1);
        assert_eq!(t.round(), ["busy", "idle"]);
        t.quiet_until_full();
        assert_eq!(t.round().len(), 2, "the periodic full read");
        assert!(t.round().is_empty(), "nothing moved");
    }

    #[test]
    fn without_a_root_every_child_is_read_every_round() {
        let tmp = tempfile::tempdir().unwrap();
        let root = CgroupRoot::from_dir(CgroupVersion::V1, tmp.path()).unwrap();
        fs::create_dir(tmp.path().join("x")).unwrap();
        write_stat(&tmp.path().join("x"), 1);
        let mut c = FileCounters::new();
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
