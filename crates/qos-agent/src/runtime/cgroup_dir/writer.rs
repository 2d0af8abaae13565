//! [`CgroupDirWriter`]: writes a container's cgroup weight file(s) and reads them back.
//!
//! On cgroup v1 one file acts (`blkio.bfq.weight`, or the CFQ `blkio.weight` on old kernels) and is written as a
//! plain number.
//!
//! On cgroup v2 each device has its own governor (see [`crate::blockdev::DeviceTable`]): `io.bfq.weight` acts on
//! BFQ devices, `io.weight` on devices with io.cost enabled, nothing on the others. A write therefore:
//! 1. lists the devices that matter: the `MAJ:MIN` lines of the container's `io.stat` (read at write time; writes
//!    are rare) and the devices of `[devices] check`;
//! 2. writes `default W` into every file that governs one of them (both files when none is governed yet, so a
//!    device the container uses later already has it), plus `MAJ:MIN W` for a governed device whose existing
//!    override would otherwise win;
//! 3. reads each file back and checks the *effective* value (override, else default) of every governed device:
//!    any other value fails the write, naming file, device and values. A disagreement first re-reads the
//!    disagreeing devices' facts and, if their governor changed, plans the write once more.
//!
//! [`CgroupDirWriter::read_weight`] (the daemon's `read`, taken before the first change) keeps a snapshot of both
//! v2 files, overrides included; writing that same weight again (what the daemon does to restore) puts the files
//! back exactly as snapshotted: default values, overrides, and the removal of overrides the agent added (by
//! writing `MAJ:MIN default`, which removes an override in both files, checked on Linux 6.18).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::time::Instant;

use qos_core::{ContainerId, Weight};
use tracing::{debug, info, warn};

use crate::backend::{AppliedVia, BackendError, ContainerInfo, DeviceWeight, WeightWriter};
use crate::blockdev::vrate::{self, VrateNews, VrateWatch};
use crate::blockdev::{DevNum, DeviceFacts, DeviceTable, Governor};
use crate::cgroup::{CgroupDir, CgroupError, CgroupVersion, WeightFile, WeightFileKind, WeightLines, V2_IO_STAT};
use crate::metrics::DeviceWeightEffective;

/// Where the v2 hierarchy is mounted unless told otherwise (its root holds `io.cost.qos`).
const DEFAULT_V2_ROOT: &str = "/sys/fs/cgroup";

/// Writes the cgroup weight file(s) that act on the container's devices and reads them back.
#[derive(Debug)]
pub struct CgroupDirWriter {
    table: DeviceTable,
    /// `[devices] check` (or the runtime's data disk): always part of a v2 write.
    configured: Vec<String>,
    /// Configured names already reported as unusable (logged once).
    bad_names: BTreeSet<String>,
    /// v2 files as the first `read` found them, per container: what a restore puts back.
    snapshots: HashMap<ContainerId, Snapshot>,
    /// The devices of each container's last read or write, what governed them and the effective weights read
    /// back (for status).
    devices_of: HashMap<ContainerId, (PathBuf, Vec<DeviceWeight>)>,
    /// Map size at which entries of vanished cgroups are dropped next.
    prune_at: usize,
    /// Devices no weight acts on that were already warned about.
    warned: BTreeSet<DevNum>,
    metric: Option<DeviceWeightEffective>,
    /// Says nothing about devices (a second writer that only reads back, beside the one that reports).
    quiet: bool,
    /// io.cost's rate per device under io.cost, and when it was last read.
    vrate: VrateWatch,
    vrate_read: Option<Instant>,
}

/// A container's v2 weight files before the agent changed them.
#[derive(Debug, Clone)]
struct Snapshot {
    /// What `read` returned: writing this weight means "restore".
    weight: Weight,
    /// The cgroup directory: the snapshot is dropped once it is gone.
    dir: PathBuf,
    files: Vec<(WeightFileKind, WeightLines)>,
}

/// The devices of one v2 write and what governs each.
#[derive(Debug, Default)]
struct Plan {
    /// Every device of the write, with what governs it (`Governor::NONE` included).
    all: Vec<(DevNum, Governor)>,
    governed: BTreeMap<DevNum, Governor>,
}

impl Plan {
    fn governed_by(&self, kind: WeightFileKind) -> impl Iterator<Item = DevNum> + '_ {
        self.governed.iter().filter(move |(_, g)| governs(**g, kind)).map(|(d, _)| *d)
    }

    /// The files to write: those governing some device; both when no device is governed. `io.weight` first, so a
    /// check that fails on both names io.cost (what Docker never writes) rather than a BFQ override.
    fn kinds(&self) -> Vec<WeightFileKind> {
        let all = [WeightFileKind::V2Io, WeightFileKind::V2Bfq];
        let some: Vec<_> = all.into_iter().filter(|k| self.governed_by(*k).next().is_some()).collect();
        if some.is_empty() {
            all.to_vec()
        } else {
            some
        }
    }
}

fn governs(g: Governor, kind: WeightFileKind) -> bool {
    match kind {
        WeightFileKind::V2Bfq => g.bfq,
        WeightFileKind::V2Io => g.io_cost,
        _ => false,
    }
}

impl Default for CgroupDirWriter {
    fn default() -> Self {
        Self::new(Path::new(DEFAULT_V2_ROOT))
    }
}

impl CgroupDirWriter {
    /// A writer whose v2 device facts come from `/sys` and `v2_root/io.cost.qos` (`v2_root`: the cgroup root,
    /// unused on v1).
    pub fn new(v2_root: &Path) -> Self {
        Self::with_table(DeviceTable::new(v2_root))
    }

    /// A writer over a given device table (fixtures).
    pub fn with_table(table: DeviceTable) -> Self {
        Self {
            table,
            configured: Vec::new(),
            bad_names: BTreeSet::new(),
            snapshots: HashMap::new(),
            devices_of: HashMap::new(),
            prune_at: 64,
            warned: BTreeSet::new(),
            metric: None,
            quiet: false,
            vrate: VrateWatch::default(),
            vrate_read: None,
        }
    }

    /// Devices (names in /sys/block) written and checked on v2 whatever the container's `io.stat` says:
    /// `[devices] check`.
    pub fn with_devices(mut self, names: Vec<String>) -> Self {
        self.configured = names;
        self
    }

    /// A writer that logs nothing about devices and exports no metric: for reading back beside the writer that
    /// does (the systemd actuator), so each device is reported once.
    pub fn quiet(mut self) -> Self {
        self.quiet = true;
        self
    }

    /// Exports `ddiskqos_device_weight_effective` per device.
    pub fn with_metric(mut self, metric: DeviceWeightEffective) -> Self {
        self.metric = Some(metric);
        self
    }

    /// Every device looked at so far and what governs it (for status).
    pub fn device_table(&self) -> Vec<DeviceFacts> {
        self.table.snapshot()
    }

    /// The devices of a container's last weight read or write on v2 (its `io.stat` devices and the configured
    /// ones), what governed each then, and the effective value read back from each file that acts on it; empty
    /// on v1 or before the first read (for status, per container).
    pub fn container_devices(&self, id: &ContainerId) -> Vec<DeviceWeight> {
        self.devices_of.get(id).map(|(_, d)| d.clone()).unwrap_or_default()
    }

    /// Every [`vrate::CHECK_EVERY`]: reads io.cost's rate (`cost.vrate` in the v2 root's `io.stat`) of each device
    /// in the table that io.cost governs and warns, once per stay, about one pinned at its minimum (`min=` of
    /// `io.cost.qos`) for [`vrate::HOLD`]: its model overstates the device and weights act weakly there.
    pub fn watch_io_cost(&mut self) {
        let now = Instant::now();
        if self.vrate_read.is_some_and(|t| now.saturating_duration_since(t) < vrate::CHECK_EVERY) {
            return;
        }
        self.vrate_read = Some(now);
        let devices: Vec<DeviceFacts> = self.table.snapshot().into_iter().filter(|f| f.governor.io_cost).collect();
        let gone: Vec<DevNum> = self.vrate.devices().filter(|d| !devices.iter().any(|f| f.dev == *d)).collect();
        for dev in gone {
            self.vrate.forget(dev);
        }
        if devices.is_empty() {
            return;
        }
        let root = self.table.v2_root();
        let (stat_path, qos_path) = (root.join("io.stat"), root.join("io.cost.qos"));
        let (stat, qos) = match (std::fs::read_to_string(&stat_path), std::fs::read_to_string(&qos_path)) {
            (Ok(stat), Ok(qos)) => (stat, qos),
            (Err(e), _) | (_, Err(e)) => {
                debug!(error = %e, stat = %stat_path.display(), qos = %qos_path.display(), "cannot read io.cost's rate");
                return;
            }
        };
        for f in devices {
            let (Some(rate), Some(min)) = (vrate::vrate_of(&stat, f.dev), vrate::qos_min_of(&qos, f.dev)) else {
                continue;
            };
            let disk = f.disk.as_deref().unwrap_or("DEV");
            match self.vrate.observe(f.dev, rate, min, now) {
                Some(VrateNews::AtFloor { dev, vrate, min, held }) => warn!(
                    device = %dev,
                    disk,
                    vrate,
                    min,
                    held_s = held.as_secs(),
                    "io.cost RUNS AT ITS MINIMUM RATE on device {dev} ({disk}): cost.vrate {vrate:.2} % = the min of \
                     io.cost.qos for {} s, so the device is slower than io.cost.model says and cgroup weights act \
                     weakly or not at all there. Measure the device again: `ddiskqos-agent iocost /dev/{disk} --apply`",
                    held.as_secs()
                ),
                Some(VrateNews::LeftFloor { dev, vrate }) => {
                    info!(device = %dev, disk, vrate, "io.cost is off its minimum rate on device {dev} again");
                }
                None => {}
            }
        }
    }

    /// Looks at the configured devices (`[devices] check`) now, so that each one no weight acts on is warned
    /// about (once) and exported at start-up, before the first write; the agent calls it once on cgroup v2.
    pub fn check_configured(&mut self) {
        let now = Instant::now();
        for name in self.configured.clone() {
            match self.table.dev_of_name(&name) {
                Ok(dev) => {
                    let (facts, changed) = self.table.get(dev, now);
                    if let Some(before) = changed {
                        let facts = facts.clone();
                        self.report(&facts, before);
                    }
                }
                Err(e) => {
                    if self.bad_names.insert(name.clone()) {
                        warn!(device = %name, error = %e, "[devices] check names a device this host does not have");
                    }
                }
            }
        }
    }

    /// Fills in the effective values of the container's devices from the weight files as just read back.
    fn record_effective(&mut self, id: &ContainerId, files: &[(WeightFileKind, WeightLines)]) {
        let Some((_, devices)) = self.devices_of.get_mut(id) else { return };
        for d in devices.iter_mut() {
            d.effective = files
                .iter()
                .filter(|(kind, _)| governs(d.governor, *kind))
                .map(|(kind, lines)| (*kind, lines.effective(d.dev)))
                .collect();
        }
    }

    /// The container's weight now: v1 the file's value; v2 the effective weight on the devices that have a
    /// governor (the lowest, if they differ), else the default of `io.bfq.weight` (or `io.weight`). On v2 the
    /// first read of a container also snapshots both files for the restore.
    pub fn read_weight(&mut self, info: &ContainerInfo) -> Result<Weight, BackendError> {
        let dir = cgroup_of(info)?;
        if dir.version() == CgroupVersion::V1 {
            return Ok(WeightFile::open(dir)?.read()?);
        }
        let plan = self.plan(info, dir)?;
        let mut files = Vec::new();
        for kind in [WeightFileKind::V2Bfq, WeightFileKind::V2Io] {
            if let Some(file) = WeightFile::open_kind(dir, kind)? {
                files.push((kind, file.read_lines()?, file));
            }
        }
        let mut lowest: Option<Weight> = None;
        for (kind, lines, file) in &files {
            for dev in plan.governed_by(*kind) {
                let w = weight_of(file, *kind, lines.effective(dev))?;
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
        if !self.snapshots.contains_key(&info.id) {
            self.prune();
            self.snapshots.insert(info.id.clone(), Snapshot { weight, dir: dir.path().to_owned(), files });
        }
        Ok(weight)
    }

    /// Writes `weight` into the file(s) that act and verifies the effective value of every governed device.
    pub fn write_weight(&mut self, info: &ContainerInfo, weight: Weight) -> Result<AppliedVia, BackendError> {
        let dir = cgroup_of(info)?;
        if dir.version() == CgroupVersion::V1 {
            WeightFile::open(dir)?.write_verified(weight)?;
            return Ok(AppliedVia::CgroupFile);
        }
        if let Some(snapshot) = self.snapshots.get(&info.id).filter(|s| s.weight == weight).cloned() {
            self.plan(info, dir)?;
            let back = restore(dir, &snapshot)?;
            self.record_effective(&info.id, &back);
            return Ok(AppliedVia::CgroupFile);
        }
        let plan = self.plan(info, dir)?;
        let err = match write_plan(dir, &plan, weight) {
            Ok(back) => {
                self.record_effective(&info.id, &back);
                return Ok(AppliedVia::CgroupFile);
            }
            Err(e) => e,
        };
        // A read-back that disagrees may mean a device changed hands (scheduler switched, io.cost toggled).
        if self.recheck(&err) {
            let plan = self.plan(info, dir)?;
            let back = write_plan(dir, &plan, weight)?;
            self.record_effective(&info.id, &back);
            return Ok(AppliedVia::CgroupFile);
        }
        Err(err.into())
    }

    /// Checks, without writing, that `weight` is in force: v1 the file's value; v2 the effective value of every
    /// governed device in the file that governs it (what `docker update --blkio-weight` must have achieved).
    pub fn verify_weight(&mut self, info: &ContainerInfo, weight: Weight) -> Result<(), BackendError> {
        let dir = cgroup_of(info)?;
        if dir.version() == CgroupVersion::V1 {
            return Ok(WeightFile::open(dir)?.verify(weight)?);
        }
        let plan = self.plan(info, dir)?;
        let back = match verify_plan(dir, &plan, weight) {
            Err(e) if self.recheck(&e) => {
                let plan = self.plan(info, dir)?;
                verify_plan(dir, &plan, weight)?
            }
            other => other?,
        };
        self.record_effective(&info.id, &back);
        Ok(())
    }

    /// The governed devices of `dir` now: its `io.stat` devices and the configured ones, each looked up in the
    /// device table (re-read when stale), ineffective ones reported once.
    fn plan(&mut self, info: &ContainerInfo, dir: &CgroupDir) -> Result<Plan, CgroupError> {
        let mut devices = io_stat_devices(dir)?;
        for name in &self.configured {
            match self.table.dev_of_name(name) {
                Ok(dev) => {
                    devices.insert(dev);
                }
                Err(e) => {
                    if self.bad_names.insert(name.clone()) && !self.quiet {
                        warn!(device = %name, error = %e, "[devices] check names a device this host does not have");
                    }
                }
            }
        }
        let now = Instant::now();
        let mut plan = Plan::default();
        for dev in devices {
            let (facts, changed) = self.table.get(dev, now);
            let governor = facts.governor;
            if let Some(before) = changed {
                let facts = facts.clone();
                self.report(&facts, before);
            }
            if governor.is_effective() {
                plan.governed.insert(dev, governor);
            }
            plan.all.push((dev, governor));
        }
        if !self.devices_of.contains_key(&info.id) {
            self.prune();
        }
        // Effective values are filled in by the read-back that follows; a failed one leaves them unknown.
        let devices =
            plan.all.iter().map(|(dev, governor)| DeviceWeight { dev: *dev, governor: *governor, effective: vec![] });
        self.devices_of.insert(info.id.clone(), (dir.path().to_owned(), devices.collect()));
        Ok(plan)
    }

    /// Re-reads the facts of the devices a failed write names; true if any governor changed.
    fn recheck(&mut self, err: &CgroupError) -> bool {
        let CgroupError::DeviceMismatch { device, .. } = err else { return false };
        let Ok(dev) = device.parse::<DevNum>() else { return false };
        let (facts, changed) = self.table.refresh(dev, Instant::now());
        match changed {
            Some(before) => {
                let facts = facts.clone();
                self.report(&facts, before);
                true
            }
            None => false,
        }
    }

    /// Logs (once per device while it lasts) and exports a device's governor.
    fn report(&mut self, facts: &DeviceFacts, before: Option<Governor>) {
        if self.quiet {
            return;
        }
        let name = facts.disk.as_deref().unwrap_or("?");
        let governor = facts.governor;
        if let Some(metric) = &self.metric {
            metric.set(&facts.dev.to_string(), governor.as_str(), governor.is_effective());
        }
        if governor.is_effective() {
            self.warned.remove(&facts.dev);
            let file = match (governor.bfq, governor.io_cost) {
                (true, true) => "io.bfq.weight and io.weight act",
                (true, false) => "io.bfq.weight acts",
                _ => "io.weight acts",
            };
            info!(device = %facts.dev, disk = name, governor = %governor, previous = ?before.map(|g| g.as_str()),
                  "cgroup v2: {file} on this device");
        } else if self.warned.insert(facts.dev) {
            warn!(device = %facts.dev, disk = name, scheduler = facts.scheduler.as_deref().unwrap_or("?"),
                  error = facts.error.as_deref().unwrap_or(""),
                  "BLOCK-I/O WEIGHTS HAVE NO EFFECT ON DEVICE {} ({name}): its scheduler is not bfq and io.cost is \
                   off for it. Fix: {}", facts.dev, facts.fix());
        }
    }

    /// Drops what is kept for containers whose cgroup is gone, once the maps have doubled since the last time
    /// (so churn costs amortized O(1) per container).
    fn prune(&mut self) {
        if self.snapshots.len().max(self.devices_of.len()) < self.prune_at {
            return;
        }
        self.snapshots.retain(|_, s| s.dir.is_dir());
        self.devices_of.retain(|_, (dir, _)| dir.is_dir());
        self.prune_at = (self.snapshots.len().max(self.devices_of.len()) * 2).max(64);
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

/// The devices in a v2 cgroup's `io.stat` (first field of each line).
fn io_stat_devices(dir: &CgroupDir) -> Result<BTreeSet<DevNum>, CgroupError> {
    let path = dir.path().join(V2_IO_STAT);
    let bytes = std::fs::read(&path).map_err(|e| CgroupError::on_cgroup_file("read", &path, dir.path(), e))?;
    let mut devices = BTreeSet::new();
    for (index, line) in bytes.split(|b| *b == b'\n').enumerate() {
        let Some(first) = line.split(u8::is_ascii_whitespace).find(|f| !f.is_empty()) else { continue };
        let dev = std::str::from_utf8(first)
            .ok()
            .and_then(|f| f.parse::<DevNum>().ok())
            .ok_or_else(|| CgroupError::parse(&path, index + 1, line, "expected MAJ:MIN"))?;
        devices.insert(dev);
    }
    Ok(devices)
}

/// Writes `weight` per the plan (see the module doc), then verifies it; returns the files as read back.
fn write_plan(dir: &CgroupDir, plan: &Plan, weight: Weight) -> Result<Vec<(WeightFileKind, WeightLines)>, CgroupError> {
    for kind in plan.kinds() {
        let file = open_required(dir, kind)?;
        let value = kind.file_value(weight);
        let before = file.read_lines()?;
        file.write_default_value(value)?;
        for dev in plan.governed_by(kind) {
            if before.devices.get(&dev).is_some_and(|v| *v != value) {
                file.write_device(dev, Some(value))?;
            }
        }
    }
    verify_plan(dir, plan, weight)
}

/// Checks every governed device's effective value in the file that governs it; with no governed device, the
/// defaults of the files a write would touch. Returns the files as read.
fn verify_plan(
    dir: &CgroupDir,
    plan: &Plan,
    weight: Weight,
) -> Result<Vec<(WeightFileKind, WeightLines)>, CgroupError> {
    let mut read_back = Vec::new();
    for kind in plan.kinds() {
        let file = open_required(dir, kind)?;
        let value = kind.file_value(weight);
        let lines = file.read_lines()?;
        let mut any = false;
        for dev in plan.governed_by(kind) {
            any = true;
            let read = lines.effective(dev);
            if read != value {
                let what = if lines.devices.contains_key(&dev) { "its MAJ:MIN override" } else { "the default" };
                return Err(CgroupError::DeviceMismatch {
                    path: file.path().to_owned(),
                    device: dev.to_string(),
                    wrote: value,
                    read,
                    what,
                });
            }
        }
        if !any && lines.default != value {
            return Err(CgroupError::Mismatch { path: file.path().to_owned(), wrote: value, read: lines.default });
        }
        read_back.push((kind, lines));
    }
    Ok(read_back)
}

fn open_required(dir: &CgroupDir, kind: WeightFileKind) -> Result<WeightFile, CgroupError> {
    WeightFile::open_kind(dir, kind)?.ok_or_else(|| CgroupError::MissingFile {
        dir: dir.path().to_owned(),
        candidates: match kind {
            WeightFileKind::V2Io => &[crate::cgroup::V2_IO_WEIGHT],
            _ => &[crate::cgroup::V2_BFQ_WEIGHT],
        },
    })
}

/// Puts both v2 files back as snapshotted and checks they read back so; returns them as read back.
fn restore(dir: &CgroupDir, snapshot: &Snapshot) -> Result<Vec<(WeightFileKind, WeightLines)>, CgroupError> {
    let mut read_back = Vec::new();
    for (kind, want) in &snapshot.files {
        let Some(file) = WeightFile::open_kind(dir, *kind)? else { continue };
        let now = file.read_lines()?;
        if now.default != want.default {
            file.write_default_value(want.default)?;
        }
        for dev in now.devices.keys().filter(|d| !want.devices.contains_key(d)) {
            file.write_device(*dev, None)?;
        }
        for (dev, v) in &want.devices {
            if now.devices.get(dev) != Some(v) {
                file.write_device(*dev, Some(*v))?;
            }
        }
        let back = file.read_lines()?;
        if back.default != want.default {
            return Err(CgroupError::Mismatch {
                path: file.path().to_owned(),
                wrote: want.default,
                read: back.default,
            });
        }
        let devices: BTreeSet<&DevNum> = back.devices.keys().chain(want.devices.keys()).collect();
        for dev in devices {
            if back.devices.get(dev) != want.devices.get(dev) {
                let (wrote, read) = (want.effective(*dev), back.effective(*dev));
                let what = if back.devices.contains_key(dev) { "its MAJ:MIN override" } else { "the default" };
                return Err(CgroupError::DeviceMismatch {
                    path: file.path().to_owned(),
                    device: dev.to_string(),
                    wrote,
                    read,
                    what,
                });
            }
        }
        read_back.push((*kind, back));
    }
    Ok(read_back)
}

impl WeightWriter for CgroupDirWriter {
    async fn read(&mut self, info: &ContainerInfo) -> Result<Weight, BackendError> {
        self.read_weight(info)
    }

    async fn write(&mut self, info: &ContainerInfo, weight: Weight) -> Result<AppliedVia, BackendError> {
        self.write_weight(info, weight)
    }

    fn device_table(&self) -> Vec<DeviceFacts> {
        CgroupDirWriter::device_table(self)
    }

    fn watch_devices(&mut self) {
        self.watch_io_cost();
    }

    fn container_devices(&self, id: &ContainerId) -> Vec<DeviceWeight> {
        CgroupDirWriter::container_devices(self, id)
    }
}

#[cfg(test)]
mod tests {
    use std::fs;
    use std::os::unix::fs::symlink;

    use super::*;
    use crate::cgroup::CgroupRoot;

    /// A fake /sys with loop3 (7:3, BFQ), loop4 (7:4, scheduler none, io.cost on) and vda (254:0, mq-deadline,
    /// nothing acts), and a v2 root with container `docker/c1` that did I/O on all three.
    struct Fixture {
        tmp: tempfile::TempDir,
        metric: DeviceWeightEffective,
        writer: CgroupDirWriter,
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
        let writer = CgroupDirWriter::with_table(DeviceTable::with_sys(&sys, &cg))
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
            f.writer.device_table().iter().map(|d| (d.dev.to_string(), d.governor.as_str())).collect();
        assert_eq!(table, [("7:3".into(), "bfq"), ("7:4".into(), "io-cost"), ("254:0".into(), "none")]);
        assert_eq!(f.metric.get("7:3"), Some(("bfq".into(), 1)));
        assert_eq!(f.metric.get("7:4"), Some(("io-cost".into(), 1)));
        assert_eq!(f.metric.get("254:0"), Some(("none".into(), 0)));
        assert_eq!(devices_of(&f), ["7:3=bfq io.bfq.weight:10", "7:4=io-cost io.weight:10", "254:0=none"]);

        // Restoring the weight `read` returned puts both files back.
        f.writer.write_weight(&f.info, w(100)).unwrap();
        assert_eq!((f.file("io.bfq.weight"), f.file("io.weight")), ("default 100\n".into(), "default 100\n".into()));
        assert_eq!(devices_of(&f), ["7:3=bfq io.bfq.weight:100", "7:4=io-cost io.weight:100", "254:0=none"]);
    }

    /// `DEV=GOVERNOR FILE:EFFECTIVE...` for each device of the fixture's container, as status shows them.
    fn devices_of(f: &Fixture) -> Vec<String> {
        f.writer
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
        f.writer.configured = vec!["vda".into(), "loop4".into()];
        let logs = logs_of(|| {
            f.writer.check_configured();
            // Known at start, before any container: the metric and the device table.
            assert_eq!(f.metric.get("254:0"), Some(("none".into(), 0)));
            assert_eq!(f.metric.get("7:4"), Some(("io-cost".into(), 1)));
            assert_eq!(f.writer.device_table().len(), 2);
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
        f.writer.table = DeviceTable::with_sys(&sys, &cg).with_max_age(std::time::Duration::ZERO);
        let logs = logs_of(|| {
            f.writer.write_weight(&f.info, w(200)).unwrap();
            f.writer.write_weight(&f.info, w(10)).unwrap();
        });
        assert_eq!(logs.matches("NO EFFECT").count(), 1, "{logs}");
        assert!(logs.contains("HAVE NO EFFECT ON DEVICE 7:4 (loop4)"), "{logs}");
        assert_eq!(devices_of(&f), ["7:3=bfq io.bfq.weight:10", "7:4=none", "254:0=none"]);
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
    fn an_override_that_would_win_is_overwritten_and_restored() {
        // loop3 has an io.bfq.weight override; io.weight has one for a device the container does not use.
        let mut f = fixture("default 100\n7:3 500\n", "default 100\n8:0 300\n");
        // Effective on loop3 is 500 and on loop4 100: read gives the lowest.
        assert_eq!(f.writer.read_weight(&f.info).unwrap(), w(100));
        f.writer.write_weight(&f.info, w(1000)).unwrap();
        assert_eq!(f.file("io.bfq.weight"), "default 1000\n7:3 1000\n");
        assert_eq!(f.file("io.weight"), "default 1000\n8:0 300\n", "8:0 is not governed for this container");
        f.writer.write_weight(&f.info, w(10)).unwrap();
        assert_eq!(f.file("io.bfq.weight"), "default 10\n7:3 10\n");

        // Someone adds an io.weight override on loop4 meanwhile; the next write beats it, the restore removes it.
        f.put("io.weight", "default 10\n7:4 900\n8:0 300\n");
        f.writer.write_weight(&f.info, w(40)).unwrap();
        assert_eq!(f.file("io.weight"), "default 40\n7:4 40\n8:0 300\n");
        f.writer.write_weight(&f.info, w(100)).unwrap();
        assert_eq!(f.file("io.bfq.weight"), "default 100\n7:3 500\n");
        assert_eq!(f.file("io.weight"), "default 100\n8:0 300\n");
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
        f.writer.configured.clear();
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
        let mut writer = CgroupDirWriter::default();
        assert_eq!(writer.read_weight(&info).unwrap(), w(100));
        writer.write_weight(&info, w(40)).unwrap();
        assert_eq!(fs::read_to_string(tmp.path().join("c/blkio.bfq.weight")).unwrap(), "40\n");
        assert!(writer.device_table().is_empty(), "v1 never looks at devices");
    }
}
