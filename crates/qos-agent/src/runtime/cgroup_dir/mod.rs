//! The cgroup-dir runtime: every child directory of one cgroup is a container (`runtime = "cgroup-dir"`).
//!
//! - `discovery.rs`: [`CgroupDirDiscovery`], the children of `[cgroup] parent`, watched with inotify.
//!
//! Its counters and writer are the files layer's ([`crate::files::FileCounters`], [`crate::files::FileWriter`]),
//! which every runtime uses on its containers' cgroup directories.

mod discovery;

pub use discovery::CgroupDirDiscovery;

use std::sync::Arc;

use crate::backend::DiscoveryError;
use crate::backend::RuntimeBackends;
use crate::cgroup::CgroupRoot;
use crate::config::AgentConfig;
use crate::files::{backends_on_files, FileCounters, FileDevices, FileWriter};
use crate::ops::metrics::Metrics;

/// The cgroup-dir runtime's backends as the agent binary assembles them: the children of `[cgroup] parent`,
/// counters and writer on their cgroup files.
pub fn backends(
    cfg: &AgentConfig,
    root: Arc<CgroupRoot>,
    metrics: &Metrics,
) -> Result<RuntimeBackends<CgroupDirDiscovery, FileCounters, FileWriter, FileDevices>, DiscoveryError> {
    let discovery = CgroupDirDiscovery::new(root.clone(), &cfg.cgroup.parent)?;
    Ok(backends_on_files(discovery, cfg, &root, metrics))
}
