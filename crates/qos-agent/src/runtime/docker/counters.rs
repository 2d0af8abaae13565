//! [`DockerCounters`]: the cgroup-dir runtime's counters, with Docker's stats API as a logged fallback.

use std::collections::HashMap;
use std::sync::Arc;

use bollard::query_parameters::StatsOptions;
use bollard::Docker;
use futures_util::StreamExt;
use qos_core::{ContainerId, IoCounters};
use tracing::{info, warn};

use crate::backend::{BackendError, ContainerInfo, CounterSource};
use crate::cgroup::{CgroupRoot, CgroupVersion};
use crate::files::FileCounters;

/// How often (in rounds) a container on the stats API tries its cgroup files again: a failure to open them may be
/// passing (descriptors exhausted for a moment), and the stats API may report nothing on this kernel.
pub const REATTACH_EVERY: u64 = 16;

/// Counters from cgroup files; for a container whose cgroup files cannot be opened, the Docker stats API (one
/// call per round for that container, logged when it starts) until the files open again (tried every
/// [`REATTACH_EVERY`] rounds).
pub struct DockerCounters {
    docker: Docker,
    files: FileCounters,
    /// Containers sampled through the stats API, with what it takes to try their files again.
    via_stats: HashMap<ContainerId, ContainerInfo>,
    rounds: u64,
    /// Set with a root: warn once when containers sit below a parent cgroup on cgroup v1 (see `attach`).
    nested_check: Option<Arc<CgroupRoot>>,
}

impl std::fmt::Debug for DockerCounters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DockerCounters")
            .field("files", &self.files.len())
            .field("via_stats", &self.via_stats.len())
            .finish()
    }
}

impl DockerCounters {
    /// Counters for containers of `docker`.
    pub fn new(docker: Docker) -> Self {
        Self { docker, files: FileCounters::new(), via_stats: HashMap::new(), rounds: 0, nested_check: None }
    }

    /// Like [`DockerCounters::new`], with the parent-cgroup gate of [`FileCounters::with_root`].
    pub fn with_root(docker: Docker, root: Arc<CgroupRoot>) -> Self {
        let nested_check = Some(root.clone());
        let files = FileCounters::with_root(root);
        Self { docker, files, via_stats: HashMap::new(), rounds: 0, nested_check }
    }

    /// Tries the cgroup files of the containers on the stats API again.
    fn reattach(&mut self) {
        let mut back = Vec::new();
        for (id, info) in &self.via_stats {
            match self.files.attach_now(info) {
                Ok(()) => {
                    info!(container = %id.short(), name = %info.name,
                          "cgroup counter files reachable again; no longer using the Docker stats API");
                    back.push(id.clone());
                }
                Err(e) => {
                    tracing::debug!(container = %id.short(), error = %e, "cgroup counter files still unreachable")
                }
            }
        }
        for id in back {
            self.via_stats.remove(&id);
        }
    }

    /// Containers sampled through the stats API now.
    pub fn via_stats(&self) -> usize {
        self.via_stats.len()
    }

    async fn stats(&self, id: &ContainerId) -> Result<IoCounters, BackendError> {
        let runtime = |detail: String| BackendError::Runtime { id: id.clone(), what: "docker stats", detail };
        let opts = StatsOptions { stream: false, one_shot: true };
        let resp =
            self.docker.stats(id.as_str(), Some(opts)).next().await.ok_or_else(|| runtime("no answer".into()))?;
        let resp = resp.map_err(|e| runtime(e.to_string()))?;
        let mut c = IoCounters::default();
        for e in resp.blkio_stats.and_then(|b| b.io_service_bytes_recursive).unwrap_or_default() {
            let v = e.value.unwrap_or(0);
            match e.op.as_deref().map(str::to_ascii_lowercase).as_deref() {
                Some("read") => c.read = c.read.saturating_add(v),
                Some("write") => c.write = c.write.saturating_add(v),
                _ => {}
            }
        }
        Ok(c)
    }
}

impl CounterSource for DockerCounters {
    async fn attach(&mut self, info: &ContainerInfo) -> Result<(), BackendError> {
        if let (Some(root), Some(dir)) = (self.nested_check.as_ref(), info.cgroup.as_ref()) {
            let parent_is_root = dir.path().parent() == Some(root.path());
            if root.version() == CgroupVersion::V1 && !parent_is_root {
                // Measured by the bench (crates/bench/README.md, "Findings"): BFQ lets a newly busy group preempt
                // the one in service only at the root level, so below a shared parent a new container at weight
                // 1000 still waits for the background's slot (1 MiB read: 37 ms nested vs 2 ms at the root),
                // unless every slot is short, as protection by default makes them on the devices it manages
                // (docs/devices.md). Said once, as a fact of the layout: on a managed device it is taken care of.
                info!(cgroup = %dir.path().display(),
                      "containers sit below a parent cgroup: on cgroup v1 with BFQ a new container cannot preempt \
                       the slot BFQ is serving, so its first reads may wait one slot (timeout_sync); protection by \
                       default keeps slots short on the devices it manages (status: DEVICE SETTINGS); on others \
                       shorten them, or run dockerd with \"cgroup-parent\": \"/\"");
                self.nested_check = None;
            }
        }
        match self.files.attach_now(info) {
            Ok(()) => Ok(()),
            Err(e) if e.is_vanished() => Err(e),
            Err(e) => {
                warn!(container = %info.id.short(), name = %info.name, error = %e,
                      "cgroup counter files unreachable; using the Docker stats API for this container \
                       (one API call per round)");
                self.via_stats.insert(info.id.clone(), info.clone());
                Ok(())
            }
        }
    }

    fn detach(&mut self, id: &ContainerId) {
        self.files.detach(id);
        self.via_stats.remove(id);
    }

    async fn sample(&mut self, out: &mut Vec<(ContainerId, Result<IoCounters, BackendError>)>) {
        self.rounds += 1;
        if !self.via_stats.is_empty() && self.rounds % REATTACH_EVERY == 0 {
            self.reattach();
        }
        self.files.sample_now(out);
        for id in self.via_stats.keys() {
            out.push((id.clone(), self.stats(id).await));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cgroup::CgroupRoot;

    #[tokio::test]
    async fn a_container_on_the_stats_api_returns_to_its_cgroup_files() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("docker/abc");
        std::fs::create_dir_all(&dir).unwrap();
        let root = CgroupRoot::from_dir(CgroupVersion::V1, tmp.path()).unwrap();
        let info = ContainerInfo {
            id: ContainerId::new("abc"),
            name: "abc".into(),
            labels: Default::default(),
            cgroup: Some(root.resolve_relative("docker/abc").unwrap()),
        };
        // No dockerd behind this socket (bound, then closed: connecting is refused at once): the stats API fails,
        // as it answers nothing useful on this kernel.
        drop(std::os::unix::net::UnixListener::bind(tmp.path().join("no.sock")).unwrap());
        let docker = Docker::connect_with_unix(
            &tmp.path().join("no.sock").display().to_string(),
            5,
            bollard::API_DEFAULT_VERSION,
        )
        .unwrap();
        let mut counters = DockerCounters::new(docker);
        counters.attach(&info).await.unwrap();
        assert_eq!(counters.via_stats(), 1, "no counter file yet (descriptors exhausted, say): stats API");
        // The files become readable.
        let stat = "7:0 Read 1048576\n7:0 Write 0\n7:0 Total 1048576\nTotal 1048576\n";
        std::fs::write(dir.join("blkio.bfq.io_service_bytes_recursive"), stat).unwrap();
        let mut out = Vec::new();
        for _ in 0..REATTACH_EVERY {
            out.clear();
            counters.sample(&mut out).await;
        }
        assert_eq!(counters.via_stats(), 0, "back on the cgroup files within {REATTACH_EVERY} rounds");
        out.clear();
        counters.sample(&mut out).await;
        let read = out.iter().find(|(id, _)| id.as_str() == "abc").map(|(_, r)| r.as_ref().map(|c| c.read).ok());
        assert_eq!(read, Some(Some(1 << 20)), "{out:?}");
    }
}
