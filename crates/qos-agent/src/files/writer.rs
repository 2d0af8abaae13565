//! [`FileWriter`]: writes a container's cgroup weight file(s) and reads them back.
//!
//! On cgroup v2 each device has its own governor (see [`crate::blockdev::DeviceTable`]): `io.bfq.weight` acts on
//! BFQ devices, `io.weight` on devices with io.cost enabled, nothing on the others. On cgroup v1 with BFQ (Linux 5.4
//! on) `blkio.bfq.weight_device` acts on BFQ devices: the same format as `io.bfq.weight` (`default N` and `MAJ:MIN
//! N` overrides, which Docker's `--blkio-weight-device` writes there), its default being what `blkio.bfq.weight`
//! reads. A per-device override wins over the default, so a write and its check go through the per-device file, as
//! on v2. The rule, the lines to write and the checks are [`WeightPlan`]'s (pure). A write therefore:
//! 1. lists the devices that matter: the `MAJ:MIN` lines of the container's `io.stat` (v1:
//!    `blkio.bfq.io_service_bytes_recursive`, what the agent's v1 counters read; read at write time, writes are
//!    rare) and the devices of `[devices] check`;
//! 2. writes `default W` into every file that governs one of them (v2: both files when none is governed yet, so a
//!    device the container uses later already has it), plus `MAJ:MIN W` for a governed device whose existing
//!    override would otherwise win; in BFQ's files the default line removes every override, so the overrides of
//!    other devices are written back;
//! 3. reads each file back and checks the *effective* value (override, else default) of every governed device:
//!    any other value fails the write, naming file, device and values. A disagreement first re-reads the
//!    disagreeing devices' facts and, if their governor changed, plans the write once more.
//!
//! [`FileWriter::read_weight`] (the daemon's `read`, taken before the first change) keeps a snapshot of the files
//! (v2: both), overrides included; [`FileWriter::restore_weight`] (the daemon's `restore`, its own operation) puts
//! the files back exactly as snapshotted: default values, overrides, and the removal of overrides the agent added
//! (by writing `MAJ:MIN default`, which removes an override in every one of these files, checked on Linux 6.18). A
//! write is always a write, even of the weight `read` returned: a pinned weight equal to the original must be in
//! force on every governed device, which the snapshot's overrides need not be.
//!
//! The agent's writer keeps the snapshots in a [`RestoreRecords`] file beside the state file
//! ([`FileWriter::with_records_file`]), so an agent restarted after a crash puts the files back exactly too: an
//! `io.weight` above 1000 (the engine's scale ends there) and per-device overrides included.
//!
//! On v1 without the per-device file (CFQ's `blkio.weight` before Linux 5.0, BFQ before 5.4) one file acts, holds
//! no override, and is written, checked and restored as a plain number, as before.
//!
//! Beside the weight, the writer holds a container's throughput under a cap in its throttle files
//! ([`FileWriter::write_cap`], in `writer/cap.rs`).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use qos_core::{ContainerId, Weight};
use serde::{Deserialize, Serialize};

use crate::backend::{AppliedVia, BackendError, CapApplied, ContainerInfo, WeightWriter};
use crate::blockdev::DeviceTable;
use crate::cgroup::{
    CgroupDir, CgroupError, CgroupVersion, WeightFile, WeightFileKind, WeightLines, V1_BFQ_BYTES, V2_IO_STAT,
};
use crate::files::restore_records::RestoreRecords;
use crate::files::weight_plan::{V1_FILES, V2_FILES};
use crate::files::{check_restored, restore_lines, FileDevices, Line, Mismatch, WeightPlan};
use crate::kernel::DevNum;
use crate::ops::metrics::DeviceWeightEffective;

mod cap;

pub use cap::LeftoverCap;

/// Where the v2 hierarchy is mounted unless told otherwise (its root holds `io.cost.qos`).
const DEFAULT_V2_ROOT: &str = "/sys/fs/cgroup";

/// Writes the cgroup weight file(s) that act on the container's devices and reads them back.
#[derive(Debug)]
pub struct FileWriter {
    /// The devices, shared with the daemon (its [`crate::backend::DeviceMonitor`]) and no other writer: the
    /// agent's other ways of applying weights verify through this writer ([`crate::writer::AgentWriter`]).
    devices: FileDevices,
    /// The planned files (v2's, v1's `blkio.bfq.weight_device`) as the first `read` found them, per container: what
    /// a restore puts back.
    snapshots: RestoreRecords<Snapshot>,
    /// The throttle files' limits before the first cap, per container: what a lift puts back (`writer/cap.rs`).
    caps: RestoreRecords<cap::CapSnapshot>,
    /// The root [`FileWriter::restore_leftover_caps`] put a previous agent's caps back under, and the containers
    /// whose caps it could not put back yet ([`FileWriter::retry_leftover_caps`]).
    leftover_root: Option<crate::cgroup::CgroupRoot>,
    leftovers: BTreeSet<ContainerId>,
}

/// A container's planned weight files before the agent changed them.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Snapshot {
    /// What `read` returned: a restore to another weight (an original from the state file) cannot use the files.
    weight: Weight,
    /// The cgroup directory: the snapshot is dropped once it is gone.
    dir: PathBuf,
    files: Vec<(WeightFileKind, WeightLines)>,
}

impl Default for FileWriter {
    fn default() -> Self {
        Self::new(Path::new(DEFAULT_V2_ROOT))
    }
}

impl FileWriter {
    /// A writer whose v2 device facts come from `/sys` and `v2_root/io.cost.qos` (`v2_root`: the cgroup root,
    /// unused on v1).
    pub fn new(v2_root: &Path) -> Self {
        Self::with_table(DeviceTable::new(v2_root))
    }

    /// A writer over a given device table (fixtures).
    pub fn with_table(table: DeviceTable) -> Self {
        Self {
            devices: FileDevices::new(table),
            snapshots: RestoreRecords::in_memory(),
            caps: RestoreRecords::in_memory(),
            leftover_root: None,
            leftovers: BTreeSet::new(),
        }
    }

    /// Devices (names in /sys/block) written and checked on v2 whatever the container's `io.stat` says:
    /// `[devices] check`.
    pub fn with_devices(self, names: Vec<String>) -> Self {
        self.devices.set_configured(names);
        self
    }

    /// Keeps the v2 snapshots in `path` too (see [`RestoreRecords`]): an agent restarted after a crash loads them
    /// and restores the files exactly. Snapshots already taken are kept in memory only.
    pub fn with_records_file(mut self, path: PathBuf) -> Self {
        self.snapshots = RestoreRecords::load(path);
        self
    }

    /// Exports `ddiskqos_device_weight_effective` per device.
    pub fn with_metric(self, metric: DeviceWeightEffective) -> Self {
        self.devices.set_metric(metric);
        self
    }

    /// The devices this writer plans with: give the daemon this handle
    /// ([`crate::daemon::Daemon::with_device_monitor`]) so it ticks them and shows them in status.
    pub fn devices(&self) -> FileDevices {
        self.devices.clone()
    }

    /// Looks at the configured devices now (see [`FileDevices::check_configured`]).
    pub fn check_configured(&mut self) {
        self.devices.check_configured();
    }

    /// Fills in the effective values of the container's devices from the weight files as just read back.
    fn record_effective(&mut self, id: &ContainerId, files: &[(WeightFileKind, WeightLines)]) {
        self.devices.record_effective(id, files);
    }

    /// The container's weight now: the effective weight on the devices that have a governor (the lowest, if they
    /// differ), else the default of BFQ's file (v2: else `io.weight`'s); v1 without the per-device file, that
    /// file's value. The first read of a container also snapshots the planned files for the restore.
    pub fn read_weight(&mut self, info: &ContainerInfo) -> Result<Weight, BackendError> {
        let dir = cgroup_of(info)?;
        let Some(plan) = self.plan(info, dir)? else {
            return Ok(WeightFile::open(dir)?.read()?);
        };
        let mut files = Vec::new();
        // BFQ's file first: its default is the weight when no device is governed.
        for kind in plan.kinds().iter().rev().copied() {
            if let Some(file) = WeightFile::open_kind(dir, kind)? {
                files.push((kind, file.read_lines()?, file));
            }
        }
        let mut lowest: Option<Weight> = None;
        for (kind, lines, file) in &files {
            for (_, _, value) in plan.in_force(&[(*kind, lines.clone())]) {
                let w = weight_of(file, *kind, value)?;
                lowest = Some(lowest.map_or(w, |l| l.min(w)));
            }
        }
        let weight = match (lowest, files.first()) {
            (Some(w), _) => w,
            (None, Some((kind, lines, file))) => weight_of(file, *kind, lines.default)?,
            (None, None) => {
                return Err(CgroupError::MissingFile {
                    dir: dir.path().to_owned(),
                    candidates: &[crate::cgroup::V2_BFQ_WEIGHT, crate::cgroup::V2_IO_WEIGHT],
                }
                .into())
            }
        };
        let files: Vec<(WeightFileKind, WeightLines)> = files.into_iter().map(|(k, l, _)| (k, l)).collect();
        self.record_effective(&info.id, &files);
        // The first read only: later reads (the daemon re-verifies weights it wrote) find the agent's own weights,
        // and a snapshot a crashed agent left on disk must survive them until the restore.
        if !self.snapshots.contains(&info.id) {
            self.snapshots.prune_gone(|s| &s.dir);
            self.snapshots.insert(&info.id, Snapshot { weight, dir: dir.path().to_owned(), files });
        }
        Ok(weight)
    }

    /// Writes `weight` into the file(s) that act and verifies the effective value of every governed device.
    pub fn write_weight(&mut self, info: &ContainerInfo, weight: Weight) -> Result<AppliedVia, BackendError> {
        let dir = cgroup_of(info)?;
        let Some(plan) = self.plan(info, dir)? else {
            WeightFile::open(dir)?.write_verified(weight)?;
            return Ok(AppliedVia::CgroupFile);
        };
        let err = match write_plan(dir, &plan, weight) {
            Ok(back) => {
                self.record_effective(&info.id, &back);
                return Ok(AppliedVia::CgroupFile);
            }
            Err(e) => e,
        };
        // A read-back that disagrees may mean a device changed hands (scheduler switched, io.cost toggled).
        if self.recheck(&err) {
            let plan = self.replan(info, dir)?;
            let back = write_plan(dir, &plan, weight)?;
            self.record_effective(&info.id, &back);
            return Ok(AppliedVia::CgroupFile);
        }
        Err(err.into())
    }

    /// Puts the container's original weight back: the planned files as the first read found them when that read
    /// gave `original` (overrides included), else (an original from the state file, the files holding a crashed
    /// agent's weight; v1 without the per-device file) writes `original` like any weight.
    pub fn restore_weight(&mut self, info: &ContainerInfo, original: Weight) -> Result<AppliedVia, BackendError> {
        let dir = cgroup_of(info)?;
        let found = self.snapshots.get(&info.id).filter(|s| s.weight == original && s.dir == dir.path()).cloned();
        match found {
            Some(snapshot) => {
                self.plan(info, dir)?;
                let back = restore(dir, &snapshot)?;
                self.record_effective(&info.id, &back);
                // Put back: the state file forgets the original now, and so do the records.
                self.snapshots.remove(&info.id);
                Ok(AppliedVia::CgroupFile)
            }
            None => self.write_weight(info, original),
        }
    }

    /// Whether a planned write to `info`'s cgroup would govern some device (one of its counters' or `[devices]
    /// check` under BFQ or io.cost). When none is, [`Self::verify_weight`] wants the weight in the files' defaults
    /// (v2: both). False on v1 without the per-device file.
    pub fn governs_a_device(&mut self, info: &ContainerInfo) -> Result<bool, BackendError> {
        let dir = cgroup_of(info)?;
        let Some(plan) = self.plan(info, dir)? else { return Ok(false) };
        Ok(plan.files().iter().any(|k| plan.governed_by(*k).next().is_some()))
    }

    /// Checks, without writing, that `weight` is in force: the effective value of every governed device in the file
    /// that governs it (what `docker update --blkio-weight` must have achieved); v1 without the per-device file,
    /// that file's value.
    pub fn verify_weight(&mut self, info: &ContainerInfo, weight: Weight) -> Result<(), BackendError> {
        let dir = cgroup_of(info)?;
        let Some(plan) = self.plan(info, dir)? else {
            return Ok(WeightFile::open(dir)?.verify(weight)?);
        };
        let back = match verify_plan(dir, &plan, weight) {
            Err(e) if self.recheck(&e) => {
                let plan = self.replan(info, dir)?;
                verify_plan(dir, &plan, weight)?
            }
            other => other?,
        };
        self.record_effective(&info.id, &back);
        Ok(())
    }

    /// The plan of a write: the devices of `dir`'s counters (v2 `io.stat`, v1 BFQ's) and the configured ones, and
    /// what governs each. `None` on v1 without `blkio.bfq.weight_device`, where the plain file is all there is.
    fn plan(&mut self, info: &ContainerInfo, dir: &CgroupDir) -> Result<Option<WeightPlan>, CgroupError> {
        let (kinds, counters) = match dir.version() {
            CgroupVersion::V2 => (&V2_FILES[..], V2_IO_STAT),
            CgroupVersion::V1 => {
                if WeightFile::open_kind(dir, WeightFileKind::V1BfqDevice)?.is_none() {
                    return Ok(None);
                }
                (&V1_FILES[..], V1_BFQ_BYTES)
            }
        };
        let devices = counter_devices(dir, counters)?;
        Ok(Some(self.devices.plan(&info.id, dir.path(), kinds, devices)))
    }

    /// The plan once more after a device's governor changed (a plan was made before, so there is one).
    fn replan(&mut self, info: &ContainerInfo, dir: &CgroupDir) -> Result<WeightPlan, CgroupError> {
        let plan = self.plan(info, dir)?;
        plan.ok_or_else(|| CgroupError::MissingFile {
            dir: dir.path().to_owned(),
            candidates: &[crate::cgroup::V1_BFQ_WEIGHT_DEVICE],
        })
    }

    /// Re-reads the facts of the device a failed check names; true if its governor changed.
    fn recheck(&mut self, err: &CgroupError) -> bool {
        self.devices.recheck(err)
    }
}

fn cgroup_of(info: &ContainerInfo) -> Result<&CgroupDir, BackendError> {
    info.cgroup.as_ref().ok_or_else(|| BackendError::NoCgroup(info.id.clone()))
}

fn weight_of(file: &WeightFile, kind: WeightFileKind, value: u32) -> Result<Weight, CgroupError> {
    kind.weight_of(value.into()).map_err(|source| CgroupError::WeightRange {
        path: file.path().to_owned(),
        value: value.into(),
        source,
    })
}

/// The devices in a cgroup's counter file `name` (first field of each line): v2 `io.stat`, v1
/// `blkio.bfq.io_service_bytes_recursive` (whose `Total` line names none).
fn counter_devices(dir: &CgroupDir, name: &str) -> Result<BTreeSet<DevNum>, CgroupError> {
    let path = dir.path().join(name);
    let bytes = std::fs::read(&path).map_err(|e| CgroupError::on_cgroup_file("read", &path, dir.path(), e))?;
    let mut devices = BTreeSet::new();
    for (index, line) in bytes.split(|b| *b == b'\n').enumerate() {
        let Some(first) = line.split(u8::is_ascii_whitespace).find(|f| !f.is_empty()) else { continue };
        if first == b"Total" {
            continue;
        }
        let dev = std::str::from_utf8(first)
            .ok()
            .and_then(|f| f.parse::<DevNum>().ok())
            .ok_or_else(|| CgroupError::parse(&path, index + 1, line, "expected MAJ:MIN"))?;
        devices.insert(dev);
    }
    Ok(devices)
}

/// Writes `weight` per the plan (see the module doc), then verifies it; returns the files as read back.
fn write_plan(
    dir: &CgroupDir,
    plan: &WeightPlan,
    weight: Weight,
) -> Result<Vec<(WeightFileKind, WeightLines)>, CgroupError> {
    for kind in plan.files() {
        let file = open_required(dir, kind)?;
        let before = file.read_lines()?;
        write_lines(&file, &plan.write_lines(kind, weight, &before))?;
    }
    verify_plan(dir, plan, weight)
}

/// Checks every governed device's effective value in the file that governs it; with no governed device, the
/// defaults of the files a write would touch. Returns the files as read.
fn verify_plan(
    dir: &CgroupDir,
    plan: &WeightPlan,
    weight: Weight,
) -> Result<Vec<(WeightFileKind, WeightLines)>, CgroupError> {
    let mut read_back = Vec::new();
    for kind in plan.files() {
        let file = open_required(dir, kind)?;
        let lines = file.read_lines()?;
        plan.check(kind, weight, &lines).map_err(|m| mismatch_error(&file, m))?;
        read_back.push((kind, lines));
    }
    Ok(read_back)
}

fn write_lines(file: &WeightFile, lines: &[Line]) -> Result<(), CgroupError> {
    for line in lines {
        match *line {
            Line::Default(v) => file.write_default_value(v)?,
            Line::Device(dev, v) => file.write_device(dev, v)?,
        }
    }
    Ok(())
}

/// The error naming the file, and the device when the plan names one.
fn mismatch_error(file: &WeightFile, m: Mismatch) -> CgroupError {
    let path = file.path().to_owned();
    match m.dev {
        Some(dev) => {
            CgroupError::DeviceMismatch { path, device: dev.to_string(), wrote: m.wrote, read: m.read, what: m.what() }
        }
        None => CgroupError::Mismatch { path, wrote: m.wrote, read: m.read },
    }
}

fn open_required(dir: &CgroupDir, kind: WeightFileKind) -> Result<WeightFile, CgroupError> {
    WeightFile::open_kind(dir, kind)?.ok_or_else(|| CgroupError::MissingFile {
        dir: dir.path().to_owned(),
        candidates: match kind {
            WeightFileKind::V2Io => &[crate::cgroup::V2_IO_WEIGHT],
            WeightFileKind::V1BfqDevice => &[crate::cgroup::V1_BFQ_WEIGHT_DEVICE],
            _ => &[crate::cgroup::V2_BFQ_WEIGHT],
        },
    })
}

/// Puts the planned files back as snapshotted and checks they read back so; returns them as read back.
fn restore(dir: &CgroupDir, snapshot: &Snapshot) -> Result<Vec<(WeightFileKind, WeightLines)>, CgroupError> {
    let mut read_back = Vec::new();
    for (kind, want) in &snapshot.files {
        let Some(file) = WeightFile::open_kind(dir, *kind)? else { continue };
        let now = file.read_lines()?;
        write_lines(&file, &restore_lines(*kind, want, &now))?;
        let back = file.read_lines()?;
        check_restored(want, &back).map_err(|m| mismatch_error(&file, m))?;
        read_back.push((*kind, back));
    }
    Ok(read_back)
}

impl WeightWriter for FileWriter {
    async fn read(&mut self, info: &ContainerInfo) -> Result<Weight, BackendError> {
        self.read_weight(info)
    }

    async fn write(&mut self, info: &ContainerInfo, weight: Weight) -> Result<AppliedVia, BackendError> {
        self.write_weight(info, weight)
    }

    async fn restore(&mut self, info: &ContainerInfo, original: Weight) -> Result<AppliedVia, BackendError> {
        self.restore_weight(info, original)
    }

    /// See [`FileWriter::write_cap`].
    async fn cap(&mut self, info: &ContainerInfo, cap: Option<qos_core::Cap>) -> Result<CapApplied, BackendError> {
        Ok(CapApplied::Files(self.write_cap(info, cap)?))
    }

    /// See [`FileWriter::retry_leftover_caps`].
    async fn retry_leftovers(&mut self) {
        for leftover in self.retry_leftover_caps() {
            leftover.log(true);
        }
    }

    /// Drops the weight snapshot, and the cap snapshot if the cgroup is gone (a cap in force on a cgroup that
    /// still exists is put back at the next [`FileWriter::retry_leftover_caps`]).
    fn forget(&mut self, id: &ContainerId) {
        self.snapshots.remove(id);
        self.forget_cap(id);
    }
}

#[cfg(test)]
mod tests {
    use std::fs;
    use std::os::unix::fs::symlink;

    use std::time::{Duration, Instant};

    use super::*;
    use crate::backend::DeviceMonitor;
    use crate::blockdev::vrate;
    use crate::cgroup::CgroupRoot;

    /// A fake /sys with loop3 (7:3, BFQ), loop4 (7:4, scheduler none, io.cost on) and vda (254:0, mq-deadline,
    /// nothing acts), and a v2 root with container `docker/c1` that did I/O on all three.
    struct Fixture {
        tmp: tempfile::TempDir,
        metric: DeviceWeightEffective,
        writer: FileWriter,
        info: ContainerInfo,
    }

    fn fixture(bfq: &str, io: &str) -> Fixture {
        let tmp = tempfile::tempdir().unwrap();
        let sys = tmp.path().join("sys");
        for (name, num, sched) in [
            ("loop3", "7:3", "none [bfq]\n"),
            ("loop4", "7:4", "[none] bfq\n"),
            ("vda", "254:0", "[mq-deadline] bfq none\n"),
        ] {
            let dev = sys.join("devices/virtual/block").join(name);
            fs::create_dir_all(dev.join("queue")).unwrap();
            fs::write(dev.join("queue/scheduler"), sched).unwrap();
            fs::write(dev.join("dev"), format!("{num}\n")).unwrap();
            fs::create_dir_all(sys.join("block")).unwrap();
            fs::create_dir_all(sys.join("dev/block")).unwrap();
            symlink(format!("../devices/virtual/block/{name}"), sys.join("block").join(name)).unwrap();
            symlink(format!("../../devices/virtual/block/{name}"), sys.join("dev/block").join(num)).unwrap();
        }
        let cg = tmp.path().join("cg");
        let c1 = cg.join("docker/c1");
        fs::create_dir_all(&c1).unwrap();
        fs::write(cg.join("io.cost.qos"), "7:4 enable=1 ctrl=auto rpct=0.00\n254:0 enable=0 ctrl=auto\n").unwrap();
        fs::write(
            c1.join("io.stat"),
            "7:3 rbytes=4096 wbytes=0 rios=1 wios=0 dbytes=0 dios=0\n\
             254:0 rbytes=8192 wbytes=0 rios=2 wios=0 dbytes=0 dios=0\n",
        )
        .unwrap();
        fs::write(c1.join("io.bfq.weight"), bfq).unwrap();
        fs::write(c1.join("io.weight"), io).unwrap();
        let root = CgroupRoot::from_dir(CgroupVersion::V2, &cg).unwrap();
        let info = ContainerInfo {
            id: ContainerId::new("c1"),
            name: "c1".into(),
            labels: Default::default(),
            cgroup: Some(root.resolve_relative("docker/c1").unwrap()),
        };
        let metric = DeviceWeightEffective::default();
        // loop4 is not in io.stat: it comes from [devices] check, as in the real test.
        let writer = FileWriter::with_table(DeviceTable::with_sys(&sys, &cg))
            .with_devices(vec!["loop4".into()])
            .with_metric(metric.clone());
        Fixture { tmp, metric, writer, info }
    }

    impl Fixture {
        fn file(&self, name: &str) -> String {
            fs::read_to_string(self.tmp.path().join("cg/docker/c1").join(name)).unwrap()
        }
        fn put(&self, name: &str, text: &str) {
            fs::write(self.tmp.path().join("cg/docker/c1").join(name), text).unwrap();
        }
    }

    fn w(v: u64) -> Weight {
        Weight::new(v).unwrap()
    }

    #[test]
    fn each_device_gets_the_file_that_governs_it() {
        let mut f = fixture("default 100\n", "default 100\n");
        assert_eq!(f.writer.read_weight(&f.info).unwrap(), w(100));
        assert_eq!(f.writer.write_weight(&f.info, w(10)).unwrap(), AppliedVia::CgroupFile);
        assert_eq!(f.file("io.bfq.weight"), "default 10\n");
        assert_eq!(f.file("io.weight"), "default 10\n");
        assert_eq!(f.writer.read_weight(&f.info).unwrap(), w(10));

        let table: Vec<(String, &str)> =
            f.writer.devices().device_table().iter().map(|d| (d.dev.to_string(), d.governor.as_str())).collect();
        assert_eq!(table, [("7:3".into(), "bfq"), ("7:4".into(), "io-cost"), ("254:0".into(), "none")]);
        assert_eq!(f.metric.get("7:3"), Some(("bfq".into(), 1)));
        assert_eq!(f.metric.get("7:4"), Some(("io-cost".into(), 1)));
        assert_eq!(f.metric.get("254:0"), Some(("none".into(), 0)));
        assert_eq!(devices_of(&f), ["7:3=bfq io.bfq.weight:10", "7:4=io-cost io.weight:10", "254:0=none"]);

        // Restoring the weight `read` returned puts both files back.
        f.writer.restore_weight(&f.info, w(100)).unwrap();
        assert_eq!((f.file("io.bfq.weight"), f.file("io.weight")), ("default 100\n".into(), "default 100\n".into()));
        assert_eq!(devices_of(&f), ["7:3=bfq io.bfq.weight:100", "7:4=io-cost io.weight:100", "254:0=none"]);
    }

    /// `DEV=GOVERNOR FILE:EFFECTIVE...` for each device of the fixture's container, as status shows them.
    fn devices_of(f: &Fixture) -> Vec<String> {
        f.writer
            .devices()
            .container_devices(&f.info.id)
            .iter()
            .map(|d| {
                let mut s = format!("{}={}", d.dev, d.governor);
                for (kind, v) in &d.effective {
                    s.push_str(&format!(" {}:{v}", kind.file_name()));
                }
                s
            })
            .collect()
    }

    /// Log lines written while `f` runs, as the agent's formatter prints them (no colours).
    fn logs_of(f: impl FnOnce()) -> String {
        #[derive(Clone, Default)]
        struct Buf(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);
        impl std::io::Write for Buf {
            fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(data);
                Ok(data.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let buf = Buf::default();
        let sink = buf.clone();
        let subscriber = tracing_subscriber::fmt().with_ansi(false).with_writer(move || sink.clone()).finish();
        tracing::subscriber::with_default(subscriber, f);
        let bytes = buf.0.lock().unwrap().clone();
        String::from_utf8(bytes).unwrap()
    }

    #[test]
    fn a_device_no_weight_acts_on_is_warned_about_once_from_start_up_on() {
        let mut f = fixture("default 100\n", "default 100\n");
        f.writer.devices().set_configured(vec!["vda".into(), "loop4".into()]);
        let logs = logs_of(|| {
            f.writer.check_configured();
            // Known at start, before any container: the metric and the device table.
            assert_eq!(f.metric.get("254:0"), Some(("none".into(), 0)));
            assert_eq!(f.metric.get("7:4"), Some(("io-cost".into(), 1)));
            assert_eq!(f.writer.devices().device_table().len(), 2);
            // The container's writes see vda again (configured and in its io.stat), and loop3 for the first time.
            f.writer.read_weight(&f.info).unwrap();
            f.writer.write_weight(&f.info, w(10)).unwrap();
            f.writer.write_weight(&f.info, w(40)).unwrap();
            f.writer.check_configured();
        });
        assert_eq!(logs.matches("HAVE NO EFFECT ON DEVICE 254:0 (vda)").count(), 1, "{logs}");
        assert_eq!(logs.matches("NO EFFECT").count(), 1, "only vda: {logs}");
        assert!(logs.contains("ddiskqos-agent iocost /dev/vda --apply"), "the fix names the set-up command: {logs}");
        assert!(logs.contains("echo bfq > /sys/block/vda/queue/scheduler"), "{logs}");
        // Another device that becomes ineffective is warned about on its own, once; facts re-read at every write
        // (a table whose facts are always stale) do not warn again about vda.
        fs::write(f.tmp.path().join("cg/io.cost.qos"), "7:4 enable=0\n").unwrap();
        let (sys, cg) = (f.tmp.path().join("sys"), f.tmp.path().join("cg"));
        f.writer.devices().set_table(DeviceTable::with_sys(&sys, &cg).with_max_age(std::time::Duration::ZERO));
        let logs = logs_of(|| {
            f.writer.write_weight(&f.info, w(200)).unwrap();
            f.writer.write_weight(&f.info, w(10)).unwrap();
        });
        assert_eq!(logs.matches("NO EFFECT").count(), 1, "{logs}");
        assert!(logs.contains("HAVE NO EFFECT ON DEVICE 7:4 (loop4)"), "{logs}");
        assert_eq!(devices_of(&f), ["7:3=bfq io.bfq.weight:10", "7:4=none", "254:0=none"]);
    }

    #[test]
    fn the_io_cost_watch_runs_on_the_clock_it_is_ticked_with() {
        let mut f = fixture("default 100\n", "default 100\n");
        let cg = f.tmp.path().join("cg");
        fs::write(cg.join("io.cost.qos"), "7:4 enable=1 ctrl=user rpct=95.00 rlat=5000 min=10.00 max=100.00\n")
            .unwrap();
        fs::write(cg.join("io.stat"), "7:4 rbytes=0 wbytes=0 rios=0 wios=0 cost.vrate=10.00 cost.usage=0\n").unwrap();
        // loop4 (under io.cost, at its minimum rate) enters the table with the first write.
        f.writer.write_weight(&f.info, w(10)).unwrap();
        let mut devices = f.writer.devices();
        let t0 = Instant::now();
        let before_hold = logs_of(|| {
            devices.tick(t0);
            devices.tick(t0 + vrate::HOLD - Duration::from_secs(1));
        });
        assert!(!before_hold.contains("MINIMUM RATE"), "not held long enough yet: {before_hold}");
        // Only the ticks' time counts: no real time passes here.
        let held = logs_of(|| devices.tick(t0 + vrate::HOLD + vrate::CHECK_EVERY));
        assert_eq!(held.matches("io.cost RUNS AT ITS MINIMUM RATE on device 7:4").count(), 1, "{held}");
    }

    #[test]
    fn only_the_governing_file_is_written() {
        let mut f = fixture("default 100\n", "default 100\n");
        // io.cost off for loop4: only BFQ (loop3) is governed, so io.weight is left alone.
        fs::write(f.tmp.path().join("cg/io.cost.qos"), "7:4 enable=0\n").unwrap();
        f.writer.write_weight(&f.info, w(40)).unwrap();
        assert_eq!(f.file("io.bfq.weight"), "default 40\n");
        assert_eq!(f.file("io.weight"), "default 100\n");
        assert_eq!(f.metric.get("7:4"), Some(("none".into(), 0)));
    }

    #[test]
    fn a_device_not_reading_back_the_weight_fails_naming_file_device_and_values() {
        // What Docker 20.10 does on v2: `default 10` in io.bfq.weight only.
        let mut f = fixture("default 100\n", "default 100\n");
        f.writer.read_weight(&f.info).unwrap();
        f.put("io.bfq.weight", "default 10\n");
        let err = f.writer.verify_weight(&f.info, w(10)).unwrap_err();
        match &err {
            BackendError::Cgroup(CgroupError::DeviceMismatch { path, device, wrote, read, what }) => {
                assert!(path.ends_with("docker/c1/io.weight"), "{}", path.display());
                assert_eq!((device.as_str(), *wrote, *read, *what), ("7:4", 10, 100, "the default"));
            }
            other => panic!("{other}"),
        }
        let text = err.to_string();
        assert!(text.contains("io.weight") && text.contains("device 7:4") && text.contains("100"), "{text}");
        // An override is named as such.
        f.put("io.weight", "default 10\n7:4 300\n");
        let err = f.writer.verify_weight(&f.info, w(10)).unwrap_err().to_string();
        assert!(err.contains("reads back 300") && err.contains("override"), "{err}");
    }

    #[test]
    fn a_disagreeing_read_back_rechecks_the_device() {
        let mut f = fixture("default 100\n", "default 100\n");
        f.writer.read_weight(&f.info).unwrap();
        // loop4 moves from io.cost to BFQ while its facts are still cached: the check first fails on io.weight,
        // the device is re-read, and io.bfq.weight (which holds 10) is what governs it now.
        fs::write(f.tmp.path().join("cg/io.cost.qos"), "7:4 enable=0\n").unwrap();
        fs::write(f.tmp.path().join("sys/block/loop4/queue/scheduler"), "none [bfq]\n").unwrap();
        f.put("io.bfq.weight", "default 10\n");
        f.writer.verify_weight(&f.info, w(10)).unwrap();
        assert_eq!(f.metric.get("7:4"), Some(("bfq".into(), 1)));
        // Without a change of governor a disagreement stays an error.
        f.put("io.bfq.weight", "default 40\n");
        assert!(f.writer.verify_weight(&f.info, w(10)).is_err());
    }

    #[test]
    fn nothing_governed_writes_both_defaults() {
        let mut f = fixture("default 100\n", "default 100\n");
        f.writer.devices().set_configured(vec![]);
        f.put("io.stat", "254:0 rbytes=1 wbytes=0 rios=1 wios=0 dbytes=0 dios=0\n");
        f.writer.write_weight(&f.info, w(200)).unwrap();
        assert_eq!((f.file("io.bfq.weight"), f.file("io.weight")), ("default 200\n".into(), "default 200\n".into()));
        assert_eq!(f.writer.read_weight(&f.info).unwrap(), w(200));
        assert_eq!(f.metric.get("254:0"), Some(("none".into(), 0)));
    }

    #[test]
    fn bad_io_stat_and_missing_files_are_named() {
        let mut f = fixture("default 100\n", "default 100\n");
        f.put("io.stat", "7:3 rbytes=1\nnonsense\n");
        let err = f.writer.write_weight(&f.info, w(10)).unwrap_err().to_string();
        assert!(err.contains("io.stat:2") && err.contains("MAJ:MIN"), "{err}");
        f.put("io.stat", "7:3 rbytes=1\n");
        fs::remove_file(f.tmp.path().join("cg/docker/c1/io.bfq.weight")).unwrap();
        let err = f.writer.write_weight(&f.info, w(10)).unwrap_err().to_string();
        assert!(err.contains("io.bfq.weight") && err.contains("docker/c1"), "{err}");
    }

    #[test]
    fn v1_writes_the_plain_number_as_before() {
        let tmp = tempfile::tempdir().unwrap();
        fs::create_dir(tmp.path().join("c")).unwrap();
        fs::write(tmp.path().join("c/blkio.bfq.weight"), "100\n").unwrap();
        let root = CgroupRoot::from_dir(CgroupVersion::V1, tmp.path()).unwrap();
        let info = ContainerInfo {
            id: ContainerId::new("c"),
            name: "c".into(),
            labels: Default::default(),
            cgroup: Some(root.resolve_relative("c").unwrap()),
        };
        let mut writer = FileWriter::default();
        assert_eq!(writer.read_weight(&info).unwrap(), w(100));
        writer.write_weight(&info, w(40)).unwrap();
        assert_eq!(fs::read_to_string(tmp.path().join("c/blkio.bfq.weight")).unwrap(), "40\n");
        assert!(writer.devices().device_table().is_empty(), "v1 never looks at devices");
    }
}
