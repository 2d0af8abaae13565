//! [`SystemdActuator`]: weights of systemd units through systemd, every other cgroup through the runtime's own
//! writer; every weight read back from the files that govern the devices.

use std::collections::HashSet;
use std::path::PathBuf;
use std::time::Duration;

use qos_core::{ContainerId, Weight};
use tracing::{debug, info};

use super::bus::{BusError, SystemdBus};
use super::mapping::UnitIoWeights;
use super::unit::UnitName;
use crate::backend::{AppliedVia, BackendError, ContainerInfo, DeviceWeight, WeightWriter};
use crate::blockdev::{self, DeviceFacts};
use crate::cgroup::{CgroupError, CgroupVersion, WeightFile, WeightFileKind};
use crate::runtime::cgroup_dir::CgroupDirWriter;

/// systemd applies a unit's new properties from its event loop, possibly just after answering the call: the
/// read-back looks this many times, this far apart, before it calls the weight missing.
const READ_BACK_TRIES: u32 = 10;
const READ_BACK_PAUSE: Duration = Duration::from_millis(20);

/// A [`WeightWriter`] that sets the weight of a cgroup that is a systemd unit as the unit's `IOWeight` and
/// `IODeviceWeight` (see [`super::mapping`]) and leaves every other cgroup to `inner`. Disabled (`enabled =
/// false`: not a systemd host, cgroup v1, or another actuator chosen) it is `inner` itself.
pub struct SystemdActuator<W> {
    inner: W,
    enabled: bool,
    bus: SystemdBus,
    /// Reads back what systemd wrote (the same per-device rule as the file writer) and keeps the device facts.
    files: CgroupDirWriter,
    v2_root: PathBuf,
    /// Containers whose last weight went through systemd (their device table for status is `files`').
    via_systemd: HashSet<ContainerId>,
    said_hello: bool,
}

impl<W> std::fmt::Debug for SystemdActuator<W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SystemdActuator").field("enabled", &self.enabled).finish()
    }
}

impl<W: WeightWriter> SystemdActuator<W> {
    /// Around `inner`; `files` reads the weights back (give it the same `[devices] check` as the inner writer's).
    pub fn new(inner: W, enabled: bool, files: CgroupDirWriter, v2_root: PathBuf) -> Self {
        Self { inner, enabled, bus: SystemdBus::new(), files, v2_root, via_systemd: HashSet::new(), said_hello: false }
    }

    /// Whether units go through systemd.
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    fn unit_of(&self, info: &ContainerInfo) -> Option<UnitName> {
        let dir = info.cgroup.as_ref()?;
        if !self.enabled || dir.version() != CgroupVersion::V2 {
            return None;
        }
        UnitName::of_cgroup(dir.path())
    }

    async fn via_systemd(&mut self, info: &ContainerInfo, unit: &UnitName, weight: Weight) -> Result<(), BackendError> {
        let runtime_err =
            |detail: String| BackendError::Runtime { id: info.id.clone(), what: "systemd SetUnitProperties", detail };
        let io_cost = blockdev::io_cost_devices(&self.v2_root).map_err(|e| runtime_err(e.to_string()))?;
        let props = UnitIoWeights::for_weight(weight, &io_cost);
        let started = std::time::Instant::now();
        match self.bus.set_io_weights(unit, &props).await {
            Ok(()) => {}
            // A unit that is gone with its cgroup is a removal, like any vanished cgroup.
            Err(BusError::NoSuchUnit(_)) if info.cgroup.as_ref().is_some_and(|d| !d.path().exists()) => {
                let path = info.cgroup.as_ref().map(|d| d.path().to_owned()).unwrap_or_default();
                let source = std::io::Error::from_raw_os_error(libc::ENOENT);
                return Err(CgroupError::Vanished { path, source }.into());
            }
            Err(e) => return Err(runtime_err(e.to_string())),
        }
        if !self.said_hello {
            self.said_hello = true;
            info!(unit = %unit, io_weight = props.io_weight, device_weights = ?props.device_weights,
                "actuator: weights of systemd units go through systemd (SetUnitProperties, runtime), which keeps \
                 them over daemon-reload; read back from the files that govern each device");
        }
        let mut tries = 0;
        loop {
            tries += 1;
            match self.read_back(info, weight, &io_cost) {
                Ok(()) => {
                    debug!(unit = %unit, weight = weight.get(), tries, took_ms = started.elapsed().as_millis() as u64,
                        "weight set through systemd and read back");
                    return Ok(());
                }
                Err(e) if e.is_vanished() || tries >= READ_BACK_TRIES => return Err(e),
                Err(_) => tokio::time::sleep(READ_BACK_PAUSE).await,
            }
        }
    }

    /// The weight in force: on the devices the container used or `[devices] check` names (the file writer's
    /// rule), and in `io.weight` on every io.cost device, which it may use next.
    fn read_back(
        &mut self,
        info: &ContainerInfo,
        weight: Weight,
        io_cost: &[blockdev::DevNum],
    ) -> Result<(), BackendError> {
        self.files.verify_weight(info, weight)?;
        let dir = info.cgroup.as_ref().ok_or_else(|| BackendError::NoCgroup(info.id.clone()))?;
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
}

impl<W: WeightWriter> WeightWriter for SystemdActuator<W> {
    async fn read(&mut self, info: &ContainerInfo) -> Result<Weight, BackendError> {
        self.inner.read(info).await
    }

    async fn write(&mut self, info: &ContainerInfo, weight: Weight) -> Result<AppliedVia, BackendError> {
        match self.unit_of(info) {
            Some(unit) => {
                self.via_systemd(info, &unit, weight).await?;
                self.via_systemd.insert(info.id.clone());
                Ok(AppliedVia::Systemd)
            }
            None => {
                self.via_systemd.remove(&info.id);
                self.inner.write(info, weight).await
            }
        }
    }

    fn device_table(&self) -> Vec<DeviceFacts> {
        let mut table = self.inner.device_table();
        for facts in self.files.device_table() {
            if !table.iter().any(|f| f.dev == facts.dev) {
                table.push(facts);
            }
        }
        table
    }

    fn container_devices(&self, id: &ContainerId) -> Vec<DeviceWeight> {
        if self.via_systemd.contains(id) {
            self.files.container_devices(id)
        } else {
            self.inner.container_devices(id)
        }
    }

    fn watch_devices(&mut self) {
        self.inner.watch_devices();
    }
}
