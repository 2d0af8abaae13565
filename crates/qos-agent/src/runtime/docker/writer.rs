//! [`DockerWriter`]: weights through the cgroup files (`auto`, `files`) or through `docker update --blkio-weight`
//! (`docker`), always verified in the file.
//!
//! `auto` never asks Docker: `docker update` persists the weight in the container's `hostconfig.json`, so after an
//! agent crash or removal a restarted container would come back at the agent's last demotion (10), and a new agent
//! would take that for the container's own weight. The agent's weights are transient; the files hold them for the
//! cgroup's life and no longer. (On a systemd host the units' weights go through systemd's runtime properties, see
//! `SystemdActuator`, which do not persist either.)
//!
//! `docker` is for an operator who wants Docker's own view to show the weight, and accepts that persistence: the
//! restore at stop writes the original back through Docker too. On cgroup v2 Docker 20.10 writes `io.bfq.weight`
//! (`default N`) and never `io.weight`, so its weight reaches BFQ devices only; the check after `docker update` is
//! the file writer's per-device one, and a weight not in force is an error. A container seen at its cgroup's
//! creation is still starting, and dockerd answers a `docker update` for it only once the start completed (it holds
//! the container's lock meanwhile), so such a container's files are written directly ([`Starting`]); its later
//! weights go through Docker.

use bollard::models::ContainerUpdateBody;
use bollard::Docker;
use qos_core::Weight;
use tracing::debug;

use crate::backend::Starting;
use crate::backend::{AppliedVia, BackendError, ContainerInfo, WeightWriter};
use crate::cgroup::{CgroupError, V2_IO_WEIGHT};
use crate::config::ActuatorMode;
use crate::files::{FileDevices, FileWriter};

/// Applies weights through the cgroup files or `docker update --blkio-weight`, per [`ActuatorMode`]; every
/// write is verified by reading the cgroup file back.
pub struct DockerWriter {
    docker: Docker,
    mode: ActuatorMode,
    /// Writes and verifies the cgroup files (and holds the restore snapshots and the devices it plans with).
    files: FileWriter,
    /// Containers still starting (from discovery): `docker` writes their files rather than wait for dockerd.
    starting: Starting,
}

impl std::fmt::Debug for DockerWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DockerWriter").field("mode", &self.mode).finish()
    }
}

impl DockerWriter {
    /// A writer in the given mode, with a default [`FileWriter`] for the files.
    pub fn new(docker: Docker, mode: ActuatorMode) -> Self {
        Self::with_files(docker, mode, FileWriter::default())
    }

    /// A writer in the given mode whose file writes and checks go through `files`.
    pub fn with_files(docker: Docker, mode: ActuatorMode, files: FileWriter) -> Self {
        Self { docker, mode, files, starting: Starting::default() }
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
            let why = match &e {
                BackendError::Cgroup(CgroupError::DeviceMismatch { path, .. }) if path.ends_with(V2_IO_WEIGHT) => {
                    "Docker's --blkio-weight writes io.bfq.weight only, which does not act on a device under io.cost"
                }
                BackendError::Cgroup(CgroupError::DeviceMismatch { what, .. }) if what.contains("override") => {
                    "Docker's --blkio-weight sets only the default of io.bfq.weight, and a per-device override \
                     (e.g. from --blkio-weight-device) wins over it"
                }
                _ => "Docker discards --blkio-weight on kernels without blkio.weight (e.g. BFQ-only cgroup v1)",
            };
            return Err(BackendError::Runtime {
                id: info.id.clone(),
                what: "docker update --blkio-weight",
                detail: format!(
                    "dockerd answered success but the weight is not in force ({why}; actuator \"auto\" writes the \
                     files): {e}"
                ),
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
            ActuatorMode::Auto | ActuatorMode::Files | ActuatorMode::Systemd => direct(&mut self.files),
            ActuatorMode::Docker if self.starting.contains(&info.id) => {
                debug!(container = %info.id.short(), %weight,
                    "container still starting: writing its cgroup files directly (dockerd would answer \
                     docker update only after the start)");
                direct(&mut self.files)
            }
            ActuatorMode::Docker => self.via_docker(info, weight).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use qos_core::ContainerId;

    use super::*;
    use crate::cgroup::{CgroupRoot, CgroupVersion};

    fn w(n: u64) -> Weight {
        Weight::new(n).unwrap()
    }

    /// A dockerd that fails every call (it accepts the connection and closes it), and how often it was asked.
    fn failing_dockerd(dir: &std::path::Path) -> (Docker, impl Fn() -> usize) {
        let sock = dir.join("failing-dockerd.sock");
        let listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        let asked = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counter = asked.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                drop(conn);
            }
        });
        let docker = Docker::connect_with_unix(sock.to_str().unwrap(), 2, bollard::API_DEFAULT_VERSION).unwrap();
        (docker, move || asked.load(std::sync::atomic::Ordering::SeqCst))
    }

    fn fixture() -> (tempfile::TempDir, impl Fn(&str) -> ContainerInfo, impl Fn(&str) -> String) {
        let tmp = tempfile::tempdir().unwrap();
        for c in ["new", "old"] {
            std::fs::create_dir(tmp.path().join(c)).unwrap();
            std::fs::write(tmp.path().join(c).join("blkio.bfq.weight"), "100\n").unwrap();
        }
        let root = CgroupRoot::from_dir(CgroupVersion::V1, tmp.path()).unwrap();
        let info = move |c: &str| ContainerInfo {
            id: ContainerId::new(c),
            name: c.into(),
            labels: Default::default(),
            cgroup: Some(root.resolve_relative(c).unwrap()),
        };
        let base = tmp.path().to_owned();
        let file = move |c: &str| std::fs::read_to_string(base.join(c).join("blkio.bfq.weight")).unwrap();
        (tmp, info, file)
    }

    /// Defect 3 of issue 28: `docker update` persists the weight in the container's hostconfig.json, so `auto`
    /// never sends one there, started or starting, write or restore.
    #[tokio::test]
    async fn auto_never_asks_docker_so_no_weight_of_the_agent_persists_in_the_containers_config() {
        let (tmp, info, file) = fixture();
        let (docker, asked) = failing_dockerd(tmp.path());
        let starting = Starting::default();
        starting.insert(&ContainerId::new("new"));
        let mut writer = DockerWriter::new(docker, ActuatorMode::Auto).with_starting(starting.clone());
        assert_eq!(writer.read(&info("old")).await.unwrap(), w(100));
        for (c, weight) in [("new", 1000), ("old", 1000), ("old", 10), ("new", 200)] {
            assert_eq!(writer.write(&info(c), w(weight)).await.unwrap(), AppliedVia::CgroupFile);
            assert_eq!(file(c), format!("{weight}\n"));
            starting.remove(&ContainerId::new("new"));
        }
        assert_eq!(writer.restore(&info("old"), w(100)).await.unwrap(), AppliedVia::CgroupFile);
        assert_eq!(file("old"), "100\n");
        assert_eq!(asked(), 0, "auto asked Docker, which would persist the agent's weight in hostconfig.json");
    }

    /// `docker`: a starting container's files directly (dockerd would answer only after the start), then Docker;
    /// a failed call is an error for that write and leaves the file alone (no silent fallback in this mode).
    #[tokio::test]
    async fn docker_mode_writes_a_starting_containers_file_then_asks_docker() {
        let (tmp, info, file) = fixture();
        let (docker, asked) = failing_dockerd(tmp.path());
        let starting = Starting::default();
        starting.insert(&ContainerId::new("new"));
        let mut writer = DockerWriter::new(docker, ActuatorMode::Docker).with_starting(starting.clone());

        assert_eq!(writer.write(&info("new"), w(1000)).await.unwrap(), AppliedVia::CgroupFile);
        assert_eq!(file("new"), "1000\n");
        assert_eq!(asked(), 0, "Docker was asked about a starting container");

        starting.remove(&ContainerId::new("new"));
        let err = writer.write(&info("new"), w(200)).await.unwrap_err().to_string();
        assert!(err.contains("docker update --blkio-weight"), "{err}");
        assert!(asked() >= 1, "Docker was not asked about a started container");
        assert_eq!(file("new"), "1000\n", "a failed Docker call must not be papered over by a file write");
        let err = writer.write(&info("old"), w(5)).await.unwrap_err().to_string();
        assert!(err.contains("10..=1000") && err.contains('5'), "{err}");
    }
}
