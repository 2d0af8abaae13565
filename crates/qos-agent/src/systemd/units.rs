//! [`UnitWriter`]: the weights of cgroups that are systemd units, as the units' `IOWeight` and `IODeviceWeight`
//! properties, read back from the files that govern the devices.

use std::path::PathBuf;
use std::time::Duration;

use qos_core::{ContainerId, Weight};
use tracing::{debug, info};

use super::bus::{BusError, SystemdBus, UnitIoProperties, IO_WEIGHT_UNSET};
use super::mapping::{bfq_weight_of, UnitIoWeights};
use super::unit::UnitName;
use crate::backend::{BackendError, ContainerInfo};
use crate::blockdev;
use crate::cgroup::{CgroupDir, CgroupError, CgroupVersion, WeightFile, WeightFileKind};
use crate::files::restore_records::RestoreRecords;
use crate::files::FileWriter;
use crate::kernel::DevNum;

/// systemd applies a unit's new properties from its event loop, possibly just after answering the call: the
/// read-back looks this many times, this far apart, before it calls the weight missing.
const READ_BACK_TRIES: u32 = 10;
const READ_BACK_PAUSE: Duration = Duration::from_millis(20);

/// Sets the weight of a cgroup that is a systemd unit as the unit's `IOWeight` and `IODeviceWeight` (see
/// [`super::mapping`]) and reads it back through the agent's one [`FileWriter`], which the caller lends
/// (`files`): the same per-device rule and device table as every other write. Every other cgroup, and a unit
/// whose runtime is still setting it up, is not its business: the agent's writer
/// ([`crate::writer::AgentWriter`]) writes their files.
pub struct UnitWriter {
    bus: SystemdBus,
    v2_root: PathBuf,
    said_hello: bool,
    /// Each unit's `IOWeight`/`IODeviceWeight` as the first read found them: what a restore puts back (on disk
    /// too with [`Self::with_records_file`]).
    unit_originals: RestoreRecords<UnitIoProperties>,
}

impl std::fmt::Debug for UnitWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UnitWriter").field("v2_root", &self.v2_root).finish_non_exhaustive()
    }
}

impl UnitWriter {
    /// A writer over the system bus; `v2_root`: the cgroup root, whose `io.cost.qos` says which devices are under
    /// io.cost.
    pub fn new(v2_root: PathBuf) -> Self {
        Self { bus: SystemdBus::new(), v2_root, said_hello: false, unit_originals: RestoreRecords::in_memory() }
    }

    /// Keeps the units' own properties in `path` too (see [`RestoreRecords`]): an agent restarted after a crash
    /// puts back an `IOWeight` above 1000 or `IODeviceWeight` entries exactly, not the state file's weight.
    pub fn with_records_file(mut self, path: PathBuf) -> Self {
        self.unit_originals = RestoreRecords::load(path);
        self
    }

    /// With `bus` instead of a client of the system bus (an embedder's or a test's manager, another deadline).
    pub fn with_bus(mut self, bus: SystemdBus) -> Self {
        self.bus = bus;
        self
    }

    /// The unit `info`'s cgroup is (cgroup v2 only), if any: the cgroups this writer takes.
    pub fn unit_of(&self, info: &ContainerInfo) -> Option<UnitName> {
        let dir = info.cgroup.as_ref()?;
        if dir.version() != CgroupVersion::V2 {
            return None;
        }
        UnitName::of_cgroup(dir.path())
    }

    /// Records `unit`'s own I/O properties the first time a weight of it is read (later reads re-verify the
    /// agent's own weight, and a crashed agent's record must survive them until the restore). Best effort:
    /// without the record a restore falls back to the weight (see `put_back_unit`).
    pub async fn record_original(&mut self, info: &ContainerInfo, unit: &UnitName) {
        if self.unit_originals.contains(&info.id) {
            return;
        }
        match self.bus.io_properties(unit).await {
            Ok(props) => {
                self.unit_originals.insert(&info.id, props);
            }
            Err(e) => debug!(unit = %unit, error = %e, "cannot read the unit's I/O properties"),
        }
    }

    /// Gives `unit` its own properties back (unset, for a unit nobody had weighted; see `put_back_unit`), else
    /// its original as a weight, read back through `files`.
    pub async fn restore(
        &mut self,
        info: &ContainerInfo,
        unit: &UnitName,
        original: Weight,
        files: &mut FileWriter,
    ) -> Result<(), BackendError> {
        // A stop during a short stall of the bus still puts the units back (once per outage; see there).
        self.bus.wait_out_backoff().await;
        match self.unit_original(info, original) {
            Some(props) => self.put_back_unit(info, unit, &props).await,
            None => self.write(info, unit, original, files).await,
        }
    }

    /// Drops what is kept about a container that is gone: its unit's recorded properties.
    pub fn forget(&mut self, id: &ContainerId) {
        self.unit_originals.remove(id);
    }

    /// Sets `weight` as `unit`'s properties and reads it back through `files`.
    pub async fn write(
        &mut self,
        info: &ContainerInfo,
        unit: &UnitName,
        weight: Weight,
        files: &mut FileWriter,
    ) -> Result<(), BackendError> {
        let io_cost = blockdev::io_cost_devices(&self.v2_root).map_err(|e| runtime_error(info, e.to_string()))?;
        let props = UnitIoWeights::for_weight(weight, &io_cost);
        let started = std::time::Instant::now();
        self.bus.set_io_weights(unit, &props).await.map_err(|e| bus_error(info, e))?;
        if !self.said_hello {
            self.said_hello = true;
            info!(unit = %unit, io_weight = props.io_weight, device_weights = ?props.device_weights,
                "actuator: weights of systemd units go through systemd (SetUnitProperties, runtime), which keeps \
                 them over daemon-reload; read back from the files that govern each device");
        }
        let tries = read_back_until(|| read_back(files, info, weight, &io_cost, &props)).await?;
        debug!(unit = %unit, weight = weight.get(), tries, took_ms = started.elapsed().as_millis() as u64,
            "weight set through systemd and read back");
        Ok(())
    }

    /// What a restore of `unit` puts back: its properties as the first read found them, or — with no record (an
    /// agent restarted after a crash) and the default weight as the original — unset, which is what an untouched
    /// unit has. `None`: nothing on record and a non-default original, which is then written as a weight.
    fn unit_original(&self, info: &ContainerInfo, original: Weight) -> Option<UnitIoProperties> {
        match self.unit_originals.get(&info.id) {
            Some(p) => Some(p.clone()),
            None if original.get() == 100 => {
                Some(UnitIoProperties { io_weight: IO_WEIGHT_UNSET, device_weights: Vec::new() })
            }
            None => None,
        }
    }

    /// Puts a unit's own properties back. The `io.weight` lines systemd leaves behind when `IODeviceWeight`
    /// entries are dropped (measured: it does not remove them) are removed (`MAJ:MIN default`), so the files are
    /// what systemd itself writes for the unit; then both files are read back.
    async fn put_back_unit(
        &mut self,
        info: &ContainerInfo,
        unit: &UnitName,
        props: &UnitIoProperties,
    ) -> Result<(), BackendError> {
        self.bus.put_back(unit, props).await.map_err(|e| bus_error(info, e))?;
        let dir = info.cgroup.as_ref().ok_or_else(|| BackendError::NoCgroup(info.id.clone()))?;
        let kept: Vec<DevNum> = props
            .device_weights
            .iter()
            .filter_map(|(node, _)| DevNum::of_node(std::path::Path::new(node)).ok())
            .collect();
        if let Some(file) = WeightFile::open_kind(dir, WeightFileKind::V2Io)? {
            for dev in file.read_lines()?.devices.keys().filter(|d| !kept.contains(d)) {
                file.write_device(*dev, None)?;
            }
        }
        let want_io = if props.io_weight == IO_WEIGHT_UNSET { 100 } else { props.io_weight };
        read_back_until(|| unit_files_read(dir, want_io, &kept).map_err(Into::into)).await?;
        debug!(unit = %unit, io_weight = props.io_weight, "unit's own I/O weight properties put back");
        self.unit_originals.remove(&info.id);
        Ok(())
    }
}

/// The weight in force: on the devices the container used or `[devices] check` names (the file writer's
/// rule), and in `io.weight` on every io.cost device, which it may use next. With no such device (a container
/// that has done no I/O, no `[devices] check`), the files as systemd writes them for `props`: the file
/// writer's rule would want the weight in `io.weight`'s default too, which no `IOWeight` chosen for BFQ gives
/// above 100.
fn read_back(
    files: &mut FileWriter,
    info: &ContainerInfo,
    weight: Weight,
    io_cost: &[DevNum],
    props: &UnitIoWeights,
) -> Result<(), BackendError> {
    let dir = info.cgroup.as_ref().ok_or_else(|| BackendError::NoCgroup(info.id.clone()))?;
    if files.governs_a_device(info)? {
        files.verify_weight(info, weight)?;
    } else {
        unit_files_read(dir, props.io_weight, io_cost)?;
    }
    if io_cost.is_empty() {
        return Ok(());
    }
    let file = WeightFile::open_kind(dir, WeightFileKind::V2Io)?.ok_or_else(|| CgroupError::MissingFile {
        dir: dir.path().to_owned(),
        candidates: &[crate::cgroup::V2_IO_WEIGHT],
    })?;
    let lines = file.read_lines()?;
    for dev in io_cost {
        let read = lines.effective(*dev);
        if read != weight.to_io_weight() {
            return Err(CgroupError::DeviceMismatch {
                path: file.path().to_owned(),
                device: dev.to_string(),
                wrote: weight.to_io_weight(),
                read,
                what: if lines.devices.contains_key(dev) { "its MAJ:MIN override" } else { "the default" },
            }
            .into());
        }
    }
    Ok(())
}

/// Calls `check` until it passes, [`READ_BACK_TRIES`] times at most, [`READ_BACK_PAUSE`] apart (systemd applies a
/// unit's properties from its event loop, possibly just after answering); a vanished cgroup ends it at once.
/// Returns how many tries it took.
async fn read_back_until(mut check: impl FnMut() -> Result<(), BackendError>) -> Result<u32, BackendError> {
    let mut tries = 0;
    loop {
        tries += 1;
        match check() {
            Ok(()) => return Ok(tries),
            Err(e) if e.is_vanished() || tries >= READ_BACK_TRIES => return Err(e),
            Err(_) => tokio::time::sleep(READ_BACK_PAUSE).await,
        }
    }
}

/// The files of a unit whose properties were put back: the defaults systemd writes for `IOWeight` `io_weight` in
/// both files, and no `io.weight` override but those of `kept` (the unit's own `IODeviceWeight` entries).
fn unit_files_read(dir: &CgroupDir, io_weight: u64, kept: &[DevNum]) -> Result<(), CgroupError> {
    for (kind, value) in [(WeightFileKind::V2Io, io_weight), (WeightFileKind::V2Bfq, bfq_weight_of(io_weight))] {
        let Some(file) = WeightFile::open_kind(dir, kind)? else { continue };
        let lines = file.read_lines()?;
        let stale = lines.devices.keys().find(|d| kind == WeightFileKind::V2Io && !kept.contains(d));
        if u64::from(lines.default) != value || stale.is_some() {
            return Err(CgroupError::DeviceMismatch {
                path: file.path().to_owned(),
                device: stale.map_or_else(|| "default".to_string(), |d| d.to_string()),
                wrote: value as u32,
                read: stale.map_or(lines.default, |d| lines.effective(*d)),
                what: if stale.is_some() { "its MAJ:MIN override" } else { "the default" },
            });
        }
    }
    Ok(())
}

fn runtime_error(info: &ContainerInfo, detail: String) -> BackendError {
    BackendError::Runtime { id: info.id.clone(), what: "systemd SetUnitProperties", detail }
}

/// A failed call: a unit that is gone with its cgroup is a removal, like any vanished cgroup; anything else a
/// runtime error (retried next round).
fn bus_error(info: &ContainerInfo, e: BusError) -> BackendError {
    match (&e, info.cgroup.as_ref()) {
        (BusError::NoSuchUnit(_), Some(dir)) if !dir.path().exists() => {
            let source = std::io::Error::from_raw_os_error(libc::ENOENT);
            CgroupError::Vanished { path: dir.path().to_owned(), source }.into()
        }
        _ => runtime_error(info, e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A unit's recorded properties go with its container (they grew with every container ever seen before).
    #[test]
    fn forget_drops_a_units_recorded_properties() {
        let tmp = tempfile::tempdir().unwrap();
        let mut act = UnitWriter::new(tmp.path().into());
        let (gone, kept) = (ContainerId::new("gone"), ContainerId::new("kept"));
        for id in [&gone, &kept] {
            let props = UnitIoProperties { io_weight: 300, device_weights: Vec::new() };
            act.unit_originals.insert(id, props);
        }
        act.forget(&gone);
        assert!(!act.unit_originals.contains(&gone) && act.unit_originals.contains(&kept));
    }
}
