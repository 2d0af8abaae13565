//! [`AgentWriter`]: the agent's [`WeightWriter`], one way of applying weights chosen once at assembly
//! ([`crate::agent`]), over the one [`FileWriter`].
//!
//! Three self-contained ways, like runc's cgroup managers (one per way, the caller never knows which):
//! - [`Way::Files`]: the cgroup weight files ([`FileWriter`]);
//! - [`Way::SystemdUnits`]: the properties of the systemd unit a cgroup is ([`UnitWriter`]);
//! - [`Way::DockerApi`]: `docker update --blkio-weight` ([`DockerApiWriter`]).
//!
//! The [`FileWriter`] is the one place that owns the device table and the read-back rule: the other two ways
//! borrow it for each call to verify what they applied, and what they cannot take goes to its files (a cgroup
//! that is no unit; a container whose runtime is still starting it, see [`Starting`]). So there is one writer
//! per way, one verifier and one device table, and no writer wraps another.

use qos_core::{ContainerId, Weight};
use tracing::debug;

use crate::backend::{AppliedVia, BackendError, CapApplied, ContainerInfo, Starting, WeightWriter};
use crate::cgroup::CgroupRoot;
use crate::files::{FileDevices, FileWriter, LeftoverCap};
use crate::runtime::docker::DockerApiWriter;
use crate::systemd::UnitWriter;

/// How the weights are applied besides the files, chosen once at assembly.
#[derive(Debug)]
#[non_exhaustive]
pub enum Way {
    /// The cgroup files only (`actuator = "files"`, `auto` off a systemd host, the cgroup-dir runtime).
    Files,
    /// Cgroups that are systemd units through systemd (`auto` and `systemd` on a systemd host with cgroup v2);
    /// every other cgroup through the files.
    SystemdUnits(UnitWriter),
    /// Through Docker's API (`actuator = "docker"`), but a container still starting through its files.
    DockerApi(DockerApiWriter),
}

/// The agent's writer: the files, and the way chosen at assembly (see the module doc).
#[derive(Debug)]
pub struct AgentWriter {
    /// Writes the files, reads every weight back, keeps the restore snapshots and the device table.
    files: FileWriter,
    way: Way,
    /// Containers whose runtime is still starting them (from discovery): their files are written directly.
    starting: Starting,
}

impl AgentWriter {
    /// A writer applying weights `way`, verifying them and writing every other cgroup through `files`.
    pub fn new(files: FileWriter, way: Way) -> Self {
        Self { files, way, starting: Starting::default() }
    }

    /// Takes discovery's set of containers still starting ([`crate::backend::RuntimeBackends::starting`]): their
    /// weights go into their files. dockerd answers a `docker update` only once the start completed; a
    /// `SetUnitProperties` on a scope runc is still configuring through systemd makes systemd apply the unit's
    /// cgroup settings under runc (seen: `docker run` failing at `BPF_PROG_ATTACH`). Once such a container
    /// settled (`DiscoveryEvent::Settled`), the daemon writes its weight again, the chosen way.
    pub fn with_starting(mut self, starting: Starting) -> Self {
        self.starting = starting;
        self
    }

    /// The devices the file writer plans with, for the daemon (see [`FileWriter::devices`]).
    pub fn devices(&self) -> FileDevices {
        self.files.devices()
    }

    /// The way chosen at assembly.
    pub fn way(&self) -> &Way {
        &self.way
    }

    /// Puts back the caps a previous agent left, whatever the way (see [`FileWriter::restore_leftover_caps`]):
    /// for the agent to call once at start-up, before any cap, and log.
    pub fn restore_leftover_caps(&mut self, root: &CgroupRoot) -> Vec<LeftoverCap> {
        self.files.restore_leftover_caps(root)
    }

    /// A write (`restore`: of the original) the chosen way, else into the files.
    async fn apply(&mut self, info: &ContainerInfo, weight: Weight, restore: bool) -> Result<AppliedVia, BackendError> {
        match &mut self.way {
            Way::Files => {}
            Way::SystemdUnits(units) => {
                if let Some(unit) = units.unit_of(info) {
                    if !self.starting.contains(&info.id) {
                        if restore {
                            units.restore(info, &unit, weight, &mut self.files).await?;
                        } else {
                            units.write(info, &unit, weight, &mut self.files).await?;
                        }
                        return Ok(AppliedVia::Systemd);
                    }
                    debug!(unit = %unit, "unit still being set up by its runtime: its cgroup files are written directly");
                }
            }
            Way::DockerApi(api) => {
                if !self.starting.contains(&info.id) {
                    return if restore {
                        api.restore(info, weight, &mut self.files).await
                    } else {
                        api.write(info, weight, &mut self.files).await
                    };
                }
                debug!(container = %info.id.short(), %weight,
                    "container still starting: writing its cgroup files directly (dockerd would answer \
                     docker update only after the start)");
            }
        }
        if restore {
            self.files.restore_weight(info, weight)
        } else {
            self.files.write_weight(info, weight)
        }
    }
}

impl WeightWriter for AgentWriter {
    async fn read(&mut self, info: &ContainerInfo) -> Result<Weight, BackendError> {
        let weight = self.files.read_weight(info)?;
        if let Way::SystemdUnits(units) = &mut self.way {
            if let Some(unit) = units.unit_of(info) {
                units.record_original(info, &unit).await;
            }
        }
        Ok(weight)
    }

    async fn write(&mut self, info: &ContainerInfo, weight: Weight) -> Result<AppliedVia, BackendError> {
        self.apply(info, weight, false).await
    }

    /// The chosen way's restore (a unit gets its own properties back, see [`UnitWriter::restore`]; Docker's API
    /// is given the original); the files are put back as first read.
    async fn restore(&mut self, info: &ContainerInfo, original: Weight) -> Result<AppliedVia, BackendError> {
        self.apply(info, original, true).await
    }

    /// Through the files whatever the way ([`FileWriter::write_cap`]): neither Docker's API nor systemd is asked.
    /// That is safe because neither rewrites a throttle limit it was not given itself: `docker update` (runc's
    /// `update`) writes the `blkio.throttle.*` / `io.max` lines of the devices in the container's own
    /// `--device-read-bps`-style settings only, and systemd writes those of a unit's own `IOReadBandwidthMax=` /
    /// `IOWriteBandwidthMax=` only, so a cap on another device, or on the same device where the container set
    /// none, stays. Where the container (or its unit) has a limit of its own on a device, the cap written there is
    /// never above it, and a re-apply puts back that limit, which only loosens the cap to what the container was
    /// given. A limit either of them sets while the cap is in force is taken in as the container's own at the next
    /// cap or lift (the lift leaves it; see [`crate::files::cap_plan::adopt`]); the daemon writes the cap again
    /// when discovery reports the container updated (`docker update`); a systemd property change is seen only at
    /// the next cap or lift, as a cap is read back when it is written, not watched.
    async fn cap(&mut self, info: &ContainerInfo, cap: Option<qos_core::Cap>) -> Result<CapApplied, BackendError> {
        Ok(CapApplied::Files(self.files.write_cap(info, cap)?))
    }

    /// Docker's API keeps the weight in the container's configuration; the files and systemd's runtime unit
    /// properties go with the cgroup.
    fn persists(&self) -> bool {
        matches!(self.way, Way::DockerApi(_))
    }

    async fn restore_exited(&mut self, id: &ContainerId, original: Weight) -> Result<AppliedVia, BackendError> {
        match &mut self.way {
            Way::DockerApi(api) => api.restore_exited(id, original).await,
            Way::Files | Way::SystemdUnits(_) => Err(BackendError::NoContainer {
                id: id.clone(),
                detail: "the files and systemd's runtime properties keep nothing of a container beyond its cgroup"
                    .into(),
            }),
        }
    }

    /// Whatever the way: the caps are the files' ([`FileWriter::retry_leftover_caps`]).
    async fn retry_leftovers(&mut self) {
        self.files.retry_leftovers().await
    }

    fn forget(&mut self, id: &ContainerId) {
        if let Way::SystemdUnits(units) = &mut self.way {
            units.forget(id);
        }
        self.files.forget(id);
    }
}
