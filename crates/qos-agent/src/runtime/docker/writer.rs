//! [`DockerWriter`]: weights through `docker update --blkio-weight` and/or the cgroup file, always verified in
//! the file.
//!
//! On cgroup v2 Docker 20.10 writes `io.bfq.weight` (`default N`) and never `io.weight`, so its weight reaches
//! BFQ devices only. The check after `docker update` is therefore the cgroup-dir writer's per-device one: the
//! effective value in the file that governs each device. When a device under io.cost does not get the weight,
//! `auto` writes the files itself from then on (which writes `io.weight`), and says so once.

use bollard::models::ContainerUpdateBody;
use bollard::Docker;
use qos_core::Weight;
use tracing::warn;

use crate::backend::{AppliedVia, BackendError, ContainerInfo, WeightWriter};
use crate::cgroup::{CgroupError, V2_IO_WEIGHT};
use crate::config::ActuatorMode;
use crate::files::{FileDevices, FileWriter};

/// Applies weights through `docker update --blkio-weight` and/or the cgroup file, per [`ActuatorMode`]; every
/// write is verified by reading the cgroup file back.
pub struct DockerWriter {
    docker: Docker,
    mode: ActuatorMode,
    /// `Some(false)` once Docker was seen to discard a weight: `auto` then writes the file directly.
    docker_delivers: Option<bool>,
    /// Why the last Docker write was not in force, for the one fallback message.
    missed: Missed,
    /// Writes and verifies the cgroup files (and holds the restore snapshots and the devices it plans with).
    files: FileWriter,
}

impl std::fmt::Debug for DockerWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DockerWriter")
            .field("mode", &self.mode)
            .field("docker_delivers", &self.docker_delivers)
            .finish()
    }
}

impl DockerWriter {
    /// A writer in the given mode, with a default [`FileWriter`] for the files.
    pub fn new(docker: Docker, mode: ActuatorMode) -> Self {
        Self::with_files(docker, mode, FileWriter::default())
    }

    /// A writer in the given mode whose file writes and checks go through `files`.
    pub fn with_files(docker: Docker, mode: ActuatorMode, files: FileWriter) -> Self {
        Self { docker, mode, docker_delivers: None, missed: Missed::Other, files }
    }

    /// The devices its file writer plans with, for the daemon (see [`FileWriter::devices`]).
    pub fn devices(&self) -> FileDevices {
        self.files.devices()
    }

    async fn via_docker(&mut self, info: &ContainerInfo, weight: Weight) -> Result<AppliedVia, BackendError> {
        if weight.get() < 10 {
            return Err(BackendError::Runtime {
                id: info.id.clone(),
                what: "docker update --blkio-weight",
                detail: format!("Docker accepts weights 10..=1000 only, not {weight}"),
            });
        }
        let body = ContainerUpdateBody { blkio_weight: Some(weight.to_docker()), ..Default::default() };
        self.docker.update_container(info.id.as_str(), body).await.map_err(|e| BackendError::Runtime {
            id: info.id.clone(),
            what: "docker update --blkio-weight",
            detail: e.to_string(),
        })?;
        // Trust only the kernel's files: Docker 20.10 answers success and discards the weight on BFQ-only v1
        // kernels, and on v2 writes only io.bfq.weight, which does not act on io.cost devices.
        if let Err(e) = self.files.verify_weight(info, weight) {
            if e.is_vanished() {
                return Err(e);
            }
            self.missed = match &e {
                BackendError::Cgroup(CgroupError::DeviceMismatch { path, .. }) if path.ends_with(V2_IO_WEIGHT) => {
                    Missed::IoWeight
                }
                BackendError::Cgroup(CgroupError::DeviceMismatch { what, .. }) if what.contains("override") => {
                    Missed::Override
                }
                _ => Missed::Other,
            };
            return Err(BackendError::Runtime {
                id: info.id.clone(),
                what: "docker update --blkio-weight",
                detail: format!("dockerd answered success but the weight is not in force: {e}"),
            });
        }
        Ok(AppliedVia::DockerApi)
    }
}

impl WeightWriter for DockerWriter {
    async fn read(&mut self, info: &ContainerInfo) -> Result<Weight, BackendError> {
        self.files.read_weight(info)
    }

    async fn write(&mut self, info: &ContainerInfo, weight: Weight) -> Result<AppliedVia, BackendError> {
        self.apply(info, weight, false).await
    }

    async fn restore(&mut self, info: &ContainerInfo, original: Weight) -> Result<AppliedVia, BackendError> {
        self.apply(info, original, true).await
    }
}

impl DockerWriter {
    /// A write (`restore`: of the original) per the mode; where the files are written directly, a restore puts
    /// them back as first read.
    async fn apply(&mut self, info: &ContainerInfo, weight: Weight, restore: bool) -> Result<AppliedVia, BackendError> {
        let direct = |files: &mut FileWriter| {
            if restore {
                files.restore_weight(info, weight)
            } else {
                files.write_weight(info, weight)
            }
        };
        match self.mode {
            // `systemd`: units go through `SystemdActuator` around this writer; what reaches here is not a unit.
            ActuatorMode::Files | ActuatorMode::Systemd => direct(&mut self.files),
            ActuatorMode::Docker => self.via_docker(info, weight).await,
            ActuatorMode::Auto => {
                if self.docker_delivers != Some(false) && weight.get() >= 10 {
                    match self.via_docker(info, weight).await {
                        Ok(via) => {
                            self.docker_delivers = Some(true);
                            return Ok(via);
                        }
                        Err(e) if e.is_vanished() => return Err(e),
                        Err(e) => {
                            match self.missed {
                                Missed::IoWeight => warn!(container = %info.id.short(), error = %e,
                                    "actuator auto: Docker's --blkio-weight writes io.bfq.weight only, which does \
                                     not act on a device under io.cost; writing the cgroup weight files (io.weight \
                                     included) directly from now on"),
                                Missed::Override => warn!(container = %info.id.short(), error = %e,
                                    "actuator auto: Docker's --blkio-weight sets only the default of io.bfq.weight, \
                                     and a per-device override (e.g. from --blkio-weight-device) wins over it; \
                                     writing the cgroup weight files (overrides included) directly from now on"),
                                Missed::Other => warn!(container = %info.id.short(), error = %e,
                                    "actuator auto: the Docker API did not deliver the weight to the kernel \
                                     (Docker discards --blkio-weight on kernels without blkio.weight, e.g. \
                                     BFQ-only cgroup v1); writing cgroup weight files directly from now on"),
                            }
                            self.docker_delivers = Some(false);
                        }
                    }
                }
                direct(&mut self.files)
            }
        }
    }
}

/// Why a weight written through Docker was not in force.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Missed {
    /// v2: a device under io.cost did not get it (Docker never writes `io.weight`).
    IoWeight,
    /// v2: a per-device `io.bfq.weight` override won over Docker's `default N`.
    Override,
    /// Anything else (v1: Docker discarded the weight).
    Other,
}
