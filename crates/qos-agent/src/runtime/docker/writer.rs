//! [`DockerWriter`]: weights through `docker update --blkio-weight` and/or the cgroup file, always verified in
//! the file.

use bollard::models::ContainerUpdateBody;
use bollard::Docker;
use qos_core::Weight;
use tracing::warn;

use crate::backend::{AppliedVia, BackendError, ContainerInfo, WeightWriter};
use crate::config::ActuatorMode;
use crate::runtime::cgroup_dir::CgroupDirWriter;

/// Applies weights through `docker update --blkio-weight` and/or the cgroup file, per [`ActuatorMode`]; every
/// write is verified by reading the cgroup file back.
pub struct DockerWriter {
    docker: Docker,
    mode: ActuatorMode,
    /// `Some(false)` once Docker was seen to discard a weight: `auto` then writes the file directly.
    docker_delivers: Option<bool>,
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
    /// A writer in the given mode.
    pub fn new(docker: Docker, mode: ActuatorMode) -> Self {
        Self { docker, mode, docker_delivers: None }
    }

    async fn via_docker(&self, info: &ContainerInfo, weight: Weight) -> Result<AppliedVia, BackendError> {
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
        // Trust only the kernel's file: Docker 20.10 answers success and discards the weight on BFQ kernels.
        let have = CgroupDirWriter::read_now(info)?;
        let want = weight;
        if have != want {
            let path = info.cgroup.as_ref().map(|d| d.path().display().to_string()).unwrap_or_default();
            return Err(BackendError::Runtime {
                id: info.id.clone(),
                what: "docker update --blkio-weight",
                detail: format!("dockerd answered success but {path} reads weight {have}, not {want}"),
            });
        }
        Ok(AppliedVia::RuntimeApi)
    }
}

impl WeightWriter for DockerWriter {
    async fn read(&mut self, info: &ContainerInfo) -> Result<Weight, BackendError> {
        CgroupDirWriter::read_now(info)
    }

    async fn write(&mut self, info: &ContainerInfo, weight: Weight) -> Result<AppliedVia, BackendError> {
        match self.mode {
            ActuatorMode::Cgroupfs => CgroupDirWriter::write_now(info, weight),
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
                            warn!(container = %info.id.short(), error = %e,
                                  "actuator auto: the Docker API did not deliver the weight to the kernel \
                                   (Docker discards --blkio-weight on kernels without blkio.weight, e.g. BFQ-only \
                                   cgroup v1); writing cgroup weight files directly from now on");
                            self.docker_delivers = Some(false);
                        }
                    }
                }
                CgroupDirWriter::write_now(info, weight)
            }
        }
    }
}
