//! The Docker runtime through `bollard`: discovery (events subscribed before listing, reconnect with backoff),
//! counters (cgroup files, Docker stats only as a logged fallback) and the Docker API way of applying weights
//! (`docker update --blkio-weight`, verified in the cgroup files; only for `actuator = "docker"`).
//!
//! - `discovery.rs`: [`DockerDiscovery`]; `cgroup_watch.rs`: new containers seen by their cgroup's creation, before
//!   Docker's `start` event; `naming.rs`: where Docker puts a container's cgroup
//!   ([`container_cgroup`], [`CgroupDriver`]);
//! - `counters.rs`: [`DockerCounters`] (the files layer's counters plus the stats fallback);
//! - `api.rs`: [`DockerApiWriter`] (`actuator = "docker"`; [`api_writer`] says when).

mod api;
mod cgroup_watch;
mod counters;
mod discovery;
mod naming;

use std::path::Path;

use bollard::Docker;

pub use api::DockerApiWriter;
pub use counters::DockerCounters;
pub use discovery::DockerDiscovery;
pub use naming::{container_cgroup, CgroupDriver};

use std::path::PathBuf;
use std::sync::Arc;

use crate::backend::{DiscoveryError, RuntimeBackends};
use crate::blockdev::protect::{self, Managed};
use crate::cgroup::CgroupRoot;
use crate::config::{ActuatorMode, AgentConfig};
use crate::files::{agent_writer, FileDevices, FileWriter};
use crate::ops::metrics::Metrics;

/// Docker as the agent assembles it ([`assemble`], called by [`crate::agent::AgentBuilder`]): connected, with the
/// disk holding its data when the config names no device.
#[derive(Debug)]
pub struct Assembly {
    docker: Docker,
    data_disk: Option<String>,
}

/// Connects to dockerd (`[docker] socket`) and, when `[devices] check` names no device, finds the disk holding
/// Docker's data root: the device its containers' I/O goes to.
pub async fn assemble(cfg: &AgentConfig) -> Result<Assembly, DiscoveryError> {
    let docker = connect(&cfg.docker.socket).await?;
    let data_disk = if cfg.devices.check.is_empty() { data_disk(&docker).await } else { None };
    Ok(Assembly { docker, data_disk })
}

impl Assembly {
    /// The managed devices: `[devices] check`, else the disk holding Docker's data root.
    pub fn managed(&self, cfg: &AgentConfig) -> Vec<Managed> {
        protect::managed(&cfg.devices, self.data_disk.iter().map(|d| (d.clone(), "Docker's data root".into())))
    }

    /// The Docker API way of applying weights, if the configuration asks for it ([`api_writer`]).
    pub fn api_writer(&self, cfg: &AgentConfig) -> Option<DockerApiWriter> {
        api_writer(&self.docker, cfg.actuator)
    }

    /// The backends ([`backends`]), their file writer checking the managed devices (once the device settings at start
    /// are made: the writer looks at the devices at once).
    pub async fn backends(
        self,
        cfg: &AgentConfig,
        root: Arc<CgroupRoot>,
        metrics: &Metrics,
    ) -> Result<RuntimeBackends<DockerDiscovery, DockerCounters, FileWriter, FileDevices>, DiscoveryError> {
        let check =
            if cfg.devices.check.is_empty() { self.data_disk.into_iter().collect() } else { cfg.devices.check.clone() };
        let records = crate::files::records_file(cfg, root.version());
        let cap_records = crate::files::cap_records_file(cfg);
        backends(self.docker, root, check, records, cap_records, metrics).await
    }
}

/// The Docker runtime's backends as the agent binary assembles them (the bench runs the daemon on these too, so
/// it measures the shipped wiring): discovery by events, counters from the cgroup files behind the parent gate,
/// the agent's file writer checking the devices `check` names and keeping its restore snapshots in `records`
/// ([`crate::files::records_file`]) and its cap snapshots in `cap_records` ([`crate::files::cap_records_file`]). The way of applying weights is chosen by the agent's assembly
/// ([`crate::agent`]; Docker's API: [`api_writer`]).
pub async fn backends(
    docker: Docker,
    root: Arc<CgroupRoot>,
    check: Vec<String>,
    records: Option<PathBuf>,
    cap_records: Option<PathBuf>,
    metrics: &Metrics,
) -> Result<RuntimeBackends<DockerDiscovery, DockerCounters, FileWriter, FileDevices>, DiscoveryError> {
    let writer = agent_writer(&root, check, records, cap_records, metrics);
    let devices = writer.devices();
    let discovery = DockerDiscovery::new(docker.clone(), root.clone()).await?;
    let counters = DockerCounters::with_root(docker, root);
    let starting = discovery.starting();
    Ok(RuntimeBackends { discovery, counters, writer, devices, starting })
}

/// The Docker API way of applying weights for `actuator = "docker"` only: `auto` never asks Docker, whose `docker
/// update` persists the weight in the container's `hostconfig.json` (issue 28, defect 3; see [`DockerApiWriter`]).
pub fn api_writer(docker: &Docker, actuator: ActuatorMode) -> Option<DockerApiWriter> {
    (actuator == ActuatorMode::Docker).then(|| DockerApiWriter::new(docker.clone()))
}

/// Connects to dockerd and agrees on an API version (Docker 20.10 speaks 1.41; bollard defaults newer).
pub async fn connect(socket: &Path) -> Result<Docker, DiscoveryError> {
    let what = format!("docker socket {}", socket.display());
    if !socket.exists() {
        return Err(DiscoveryError::Runtime {
            what,
            detail: "does not exist (is dockerd running? see [docker] socket)".into(),
        });
    }
    let path = socket
        .to_str()
        .ok_or_else(|| DiscoveryError::Runtime { what: what.clone(), detail: "path is not UTF-8".into() })?;
    let docker = Docker::connect_with_unix(path, 30, bollard::API_DEFAULT_VERSION)
        .map_err(|e| DiscoveryError::Runtime { what: what.clone(), detail: e.to_string() })?;
    docker.negotiate_version().await.map_err(|e| DiscoveryError::Runtime { what, detail: e.to_string() })
}

/// The disk holding Docker's data root (`docker info`), for the start-up device check; `None` (logged) when it
/// cannot be told.
pub async fn data_disk(docker: &Docker) -> Option<String> {
    let dir = docker.info().await.ok()?.docker_root_dir?;
    match crate::blockdev::disk_of_path(Path::new(&dir)) {
        Ok(disk) => Some(disk),
        Err(e) => {
            tracing::warn!(dir = %dir, error = %e, "cannot tell which disk holds Docker's data");
            None
        }
    }
}
