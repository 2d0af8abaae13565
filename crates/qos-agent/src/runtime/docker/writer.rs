//! [`DockerWriter`]: weights through `docker update --blkio-weight` and/or the cgroup file, always verified in
//! the file.
//!
//! On cgroup v2 Docker 20.10 writes `io.bfq.weight` (`default N`) and never `io.weight`, so its weight reaches
//! BFQ devices only. The check after `docker update` is therefore the cgroup-dir writer's per-device one: the
//! effective value in the file that governs each device. When a device under io.cost does not get the weight,
//! `auto` writes the files itself from then on (which writes `io.weight`), and says so once.
//!
//! A container seen at its cgroup's creation is still starting, and dockerd answers a `docker update` for it only
//! once the start completed (it holds the container's lock meanwhile): tens to hundreds of milliseconds during
//! which the container already runs at whatever weight its cgroup had, and the agent's round waits. `auto` writes
//! such a container's files directly ([`Starting`]); its later weights go through Docker as usual. `docker` mode
//! always asks Docker, and so waits.

use bollard::models::ContainerUpdateBody;
use bollard::Docker;
use qos_core::Weight;
use tracing::{debug, warn};

use super::cgroup_watch::Starting;
use crate::backend::{AppliedVia, BackendError, ContainerInfo, WeightWriter};
use crate::cgroup::{CgroupError, V2_IO_WEIGHT};
use crate::config::ActuatorMode;
use crate::files::{FileDevices, FileWriter};

/// Applies weights through `docker update --blkio-weight` and/or the cgroup file, per [`ActuatorMode`]; every
/// write is verified by reading the cgroup file back.
pub struct DockerWriter {
    docker: Docker,
    mode: ActuatorMode,
    /// `Some(false)` once Docker was seen to discard a weight (it answered success and the weight was not in
    /// force): `auto` then writes the file directly. An API error (a timeout, a restarting dockerd) is not such
    /// evidence: that write goes to the file, and the next one asks Docker again.
    docker_delivers: Option<bool>,
    /// Set by [`Self::via_docker`] when Docker answered success but the file did not hold the weight.
    not_in_force: bool,
    /// Why the last Docker write was not in force, for the one fallback message.
    missed: Missed,
    /// Writes and verifies the cgroup files (and holds the restore snapshots and the devices it plans with).
    files: FileWriter,
    /// Containers still starting (from discovery): `auto` writes their files rather than wait for dockerd.
    starting: Starting,
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
        Self {
            docker,
            mode,
            docker_delivers: None,
            not_in_force: false,
            missed: Missed::Other,
            files,
            starting: Starting::default(),
        }
    }

    /// Takes discovery's set of containers still starting ([`DockerDiscovery::starting`](super::DockerDiscovery)).
    pub fn with_starting(mut self, starting: Starting) -> Self {
        self.starting = starting;
        self
    }

    /// The devices its file writer plans with, for the daemon (see [`FileWriter::devices`]).
    pub fn devices(&self) -> FileDevices {
        self.files.devices()
    }

    async fn via_docker(&mut self, info: &ContainerInfo, weight: Weight) -> Result<AppliedVia, BackendError> {
        self.not_in_force = false;
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
            self.not_in_force = true;
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

    fn forget(&mut self, id: &qos_core::ContainerId) {
        self.files.forget(id);
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
                if self.starting.contains(&info.id) {
                    debug!(container = %info.id.short(), %weight,
                        "container still starting: writing its cgroup files directly (dockerd would answer \
                         docker update only after the start)");
                } else if self.docker_delivers != Some(false) && weight.get() >= 10 {
                    match self.via_docker(info, weight).await {
                        Ok(via) => {
                            self.docker_delivers = Some(true);
                            return Ok(via);
                        }
                        Err(e) if e.is_vanished() => return Err(e),
                        Err(e) if !self.not_in_force => warn!(container = %info.id.short(), error = %e,
                            "actuator auto: the Docker API failed; writing this weight to the cgroup files directly \
                             (the next one asks Docker again)"),
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

#[cfg(test)]
mod tests {
    use qos_core::ContainerId;

    use super::*;
    use crate::cgroup::{CgroupRoot, CgroupVersion};

    fn w(n: u64) -> Weight {
        Weight::new(n).unwrap()
    }

    #[tokio::test]
    async fn auto_writes_a_starting_containers_file_without_asking_docker() {
        let tmp = tempfile::tempdir().unwrap();
        for c in ["new", "old"] {
            std::fs::create_dir(tmp.path().join(c)).unwrap();
            std::fs::write(tmp.path().join(c).join("blkio.bfq.weight"), "100\n").unwrap();
        }
        let root = CgroupRoot::from_dir(CgroupVersion::V1, tmp.path()).unwrap();
        let info = |c: &str| ContainerInfo {
            id: ContainerId::new(c),
            name: c.into(),
            labels: Default::default(),
            cgroup: Some(root.resolve_relative(c).unwrap()),
        };
        // A dockerd that fails every call (it accepts the connection and closes it): `auto` falls back to the
        // files for that write and asks again next time (an API error is no evidence that Docker discards weights).
        let sock = tmp.path().join("failing-dockerd.sock");
        let listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        let asked = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counter = asked.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                drop(conn);
            }
        });
        let asked = move || asked.load(std::sync::atomic::Ordering::SeqCst);
        let docker = Docker::connect_with_unix(sock.to_str().unwrap(), 2, bollard::API_DEFAULT_VERSION).unwrap();
        let starting = Starting::default();
        starting.insert(&ContainerId::new("new"));
        let mut writer = DockerWriter::new(docker, ActuatorMode::Auto).with_starting(starting.clone());

        assert_eq!(writer.write(&info("new"), w(1000)).await.unwrap(), AppliedVia::CgroupFile);
        assert_eq!(std::fs::read_to_string(tmp.path().join("new/blkio.bfq.weight")).unwrap(), "1000\n");
        assert_eq!(asked(), 0, "Docker was asked about a starting container");

        // Started: its next weight goes to Docker first (here failing, so `auto` falls back for this write) ...
        starting.remove(&ContainerId::new("new"));
        assert_eq!(writer.write(&info("new"), w(200)).await.unwrap(), AppliedVia::CgroupFile);
        assert!(asked() >= 1, "Docker was not asked about a started container");
        assert_eq!(std::fs::read_to_string(tmp.path().join("new/blkio.bfq.weight")).unwrap(), "200\n");
        // ... and a failed call does not turn Docker off for the life of the agent: the next write asks again.
        let before = asked();
        assert_eq!(writer.write(&info("old"), w(500)).await.unwrap(), AppliedVia::CgroupFile);
        assert!(asked() > before, "one API error made the agent stop asking Docker");
        assert_eq!(writer.docker_delivers, None);
        assert_eq!(std::fs::read_to_string(tmp.path().join("old/blkio.bfq.weight")).unwrap(), "500\n");
    }
}
