//! The CRI runtime (`runtime = "cri"`): the pods of a Kubernetes node, found through the container runtime's CRI
//! v1 socket (containerd by default, CRI-O by `[cri] socket`). One entry per pod, whose cgroup is the pod cgroup
//! the kubelet made: its containers' counters are summed there by the kernel's recursive counters, and the weight
//! written there divides the disk between pods (README, "Kubernetes").
//!
//! - `client.rs`: [`CriClient`], the three CRI calls made (Version, ListPodSandbox, verbose PodSandboxStatus);
//! - `discovery.rs`: [`CriDiscovery`], periodic re-list plus inotify on the kubepods tree, reconnect with backoff;
//! - `naming.rs`: the kubelet's pod cgroup naming (cgroupfs and systemd drivers), checked before a path is used.
//!
//! Counters and writes reuse [`crate::files::FileCounters`] and
//! [`crate::files::FileWriter`] on the pod cgroup.

mod client;
mod discovery;
pub mod naming;

pub use client::{unix_channel, unix_channel_connected, CriClient, EventWake, SandboxSource};
pub use discovery::{CriDiscovery, ANNOTATION_PREFIX};

use std::sync::Arc;

use crate::cgroup::CgroupRoot;
use crate::config::AgentConfig;
use crate::daemon::RuntimeBackends;
use crate::files::{backends_on_files, FileCounters, FileWriter};
use crate::metrics::Metrics;

/// The CRI runtime's backends as the agent binary assembles them for `runtime = "cri"` (the bench runs the
/// daemon on these too): pods from `client` (connected and answering), counters and writer on the pod cgroups.
pub fn backends(
    cfg: &AgentConfig,
    client: CriClient,
    root: Arc<CgroupRoot>,
    metrics: &Metrics,
) -> RuntimeBackends<CriDiscovery, FileCounters, FileWriter> {
    // Validated with the config (`AgentConfig::validate`); the default root if it somehow is not.
    let kubelet_root = naming::KubeletRoot::parse(&cfg.cri.cgroup_root).unwrap_or_default();
    let discovery = CriDiscovery::new(client, root.clone(), cfg.cri.relist_interval)
        .with_kubelet_root(kubelet_root)
        .with_policy(Arc::new(cfg.policy.clone()));
    backends_on_files(discovery, cfg, &root, metrics)
}
