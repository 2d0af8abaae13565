//! The CRI runtime (`runtime = "cri"`): the pods of a Kubernetes node, found through the container runtime's CRI
//! v1 socket (containerd by default, CRI-O by `[cri] socket`). One entry per pod, whose cgroup is the pod cgroup
//! the kubelet made: its containers' counters are summed there by the kernel's recursive counters, and the weight
//! written there divides the disk between pods (docs/kubernetes.md).
//!
//! - `client.rs`: [`CriClient`], the three CRI calls made (Version, ListPodSandbox, verbose PodSandboxStatus);
//! - `discovery.rs`: [`CriDiscovery`], periodic re-list plus inotify on the kubepods tree, reconnect with backoff;
//! - `naming.rs`: the kubelet's pod cgroup naming (cgroupfs and systemd drivers), checked before a path is used.
//!
//! Counters and writes reuse [`crate::files::FileCounters`] and
//! [`crate::files::FileWriter`] on the pod cgroup.

mod client;
pub(crate) mod config;
mod discovery;
pub mod naming;

pub use client::{unix_channel, unix_channel_connected, CriClient, EventWake, SandboxSource};
pub use config::CriConfig;
pub use discovery::{CriDiscovery, ANNOTATION_PREFIX};

use std::sync::Arc;

use tracing::{info, warn};

use crate::backend::{DiscoveryError, RuntimeBackends};
use crate::blockdev::protect::Managed;
use crate::cgroup::CgroupRoot;
use crate::config::AgentConfig;
use crate::files::{backends_on_files, FileCounters, FileDevices, FileWriter};
use crate::ops::metrics::Metrics;
use crate::ops::readiness::{self, CheckedDevice, Readiness};

/// The CRI runtime as the agent assembles it ([`assemble`], called by [`crate::agent::AgentBuilder`]): a client
/// that answered, and the devices that matter with the readiness that checks them.
#[derive(Debug)]
pub struct Assembly {
    client: CriClient,
    readiness: Readiness,
}

/// Connects to the runtime (`[cri] socket`; it must answer `Version`), and finds the devices that matter: as
/// configured (`[devices] check`), else the disks holding the kubelet's and the runtime's state (`[cri]
/// state_dirs`). `/readyz` checks them.
pub async fn assemble(cfg: &AgentConfig, root: &CgroupRoot, metrics: &Metrics) -> Result<Assembly, DiscoveryError> {
    let mut client = CriClient::new(&cfg.cri.socket)?.with_metric(metrics.cri_requests.clone());
    let (name, version) = client.version().await.map_err(|e| match e {
        DiscoveryError::Runtime { what, detail } => {
            DiscoveryError::Runtime { what: format!("{what} (is the container runtime running?)"), detail }
        }
        other => other,
    })?;
    info!(socket = %cfg.cri.socket.display(), runtime = %name, version = %version, "connected to the CRI runtime");
    let checked = if cfg.devices.check.is_empty() {
        readiness::state_dir_disks(&cfg.cri.state_dirs)
    } else {
        let why = "[devices] check".to_string();
        cfg.devices.check.iter().map(|name| CheckedDevice { name: name.clone(), why: why.clone() }).collect()
    };
    let readiness = Readiness::new(metrics.runtime_up.clone(), checked, root);
    for line in readiness.check().lines.iter().filter(|l| l.starts_with("device ")) {
        info!(check = %line, "device checked for readiness");
    }
    if readiness.devices().is_empty() {
        warn!(state_dirs = ?cfg.cri.state_dirs,
              "no device to check: none of [cri] state_dirs is visible and [devices] check is empty; \
               /readyz answers 503 until one is named");
    }
    Ok(Assembly { client, readiness })
}

impl Assembly {
    /// The devices that matter by name: the config's `[devices] check` as the runtime completes it.
    pub fn checked_devices(&self) -> Vec<String> {
        self.readiness.devices().iter().map(|d| d.name.clone()).collect()
    }

    /// The managed devices: those [`Self::checked_devices`] names, each with why.
    pub fn managed(&self) -> Vec<Managed> {
        self.readiness.devices().iter().map(|d| Managed { name: d.name.clone(), why: d.why.clone() }).collect()
    }

    /// The client, for [`backends`], and the readiness, for `/readyz`.
    pub fn into_parts(self) -> (CriClient, Readiness) {
        (self.client, self.readiness)
    }
}

/// The CRI runtime's backends as the agent binary assembles them for `runtime = "cri"` (the bench runs the
/// daemon on these too): pods from `client` (connected and answering), counters and writer on the pod cgroups.
pub fn backends(
    cfg: &AgentConfig,
    client: CriClient,
    root: Arc<CgroupRoot>,
    metrics: &Metrics,
) -> RuntimeBackends<CriDiscovery, FileCounters, FileWriter, FileDevices> {
    // Validated with the config (`AgentConfig::validate`); the default root if it somehow is not.
    let kubelet_root = naming::KubeletRoot::parse(&cfg.cri.cgroup_root).unwrap_or_default();
    let discovery = CriDiscovery::new(client, root.clone(), cfg.cri.relist_interval)
        .with_kubelet_root(kubelet_root)
        .with_policy(Arc::new(cfg.policy.clone()));
    backends_on_files(discovery, cfg, &root, metrics)
}
