//! [`CgroupDirDiscovery`]: every child directory of one cgroup (a systemd slice, another runtime's parent cgroup)
//! is a container. Discovery watches the parent with inotify, so a new cgroup is seen at once.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use qos_core::ContainerId;
use tracing::debug;

use crate::backend::{ContainerInfo, Discovery, DiscoveryError, DiscoveryEvent};
use crate::cgroup::{CgroupDir, CgroupRoot};
use crate::runtime::support::DirWatch;

/// Discovers the child cgroups of `parent`.
pub struct CgroupDirDiscovery {
    root: Arc<CgroupRoot>,
    parent: CgroupDir,
    parent_rel: String,
    known: BTreeSet<String>,
    queue: std::collections::VecDeque<DiscoveryEvent>,
    /// The inotify watch on the parent, from `start` on.
    changed: Option<DirWatch>,
}

impl std::fmt::Debug for CgroupDirDiscovery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CgroupDirDiscovery")
            .field("parent", &self.parent_rel)
            .field("known", &self.known.len())
            .finish()
    }
}

impl CgroupDirDiscovery {
    /// Containers are the child directories of `parent` (relative to the cgroup root).
    pub fn new(root: Arc<CgroupRoot>, parent: &str) -> Result<Self, DiscoveryError> {
        let parent_rel = parent.trim_matches('/').to_string();
        let dir = root.resolve_relative(&parent_rel)?;
        Ok(Self { root, parent: dir, parent_rel, known: BTreeSet::new(), queue: Default::default(), changed: None })
    }

    fn list_names(&self) -> Result<BTreeSet<String>, DiscoveryError> {
        let rd = std::fs::read_dir(self.parent.path()).map_err(|e| DiscoveryError::Runtime {
            what: format!("list {}", self.parent.path().display()),
            detail: e.to_string(),
        })?;
        let mut names = BTreeSet::new();
        for entry in rd.flatten() {
            // file_type() does not follow symlinks: a symlink is never taken for a container.
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                if let Some(n) = entry.file_name().to_str() {
                    names.insert(n.to_string());
                }
            }
        }
        Ok(names)
    }

    fn info(&self, name: &str) -> Option<ContainerInfo> {
        let rel = format!("{}/{}", self.parent_rel, name);
        match self.root.resolve_relative(&rel) {
            Ok(dir) => Some(ContainerInfo {
                id: ContainerId::new(name),
                name: name.to_string(),
                labels: BTreeMap::new(),
                cgroup: Some(dir),
            }),
            Err(e) => {
                debug!(cgroup = %rel, error = %e, "skipping child cgroup");
                None
            }
        }
    }

    /// Compares the directory with what is known and queues the differences.
    fn rescan(&mut self) -> Result<(), DiscoveryError> {
        let now = self.list_names()?;
        for gone in self.known.difference(&now) {
            self.queue.push_back(DiscoveryEvent::Stopped(ContainerId::new(gone)));
        }
        for new in now.difference(&self.known) {
            if let Some(info) = self.info(new) {
                self.queue.push_back(DiscoveryEvent::Started(info));
            }
        }
        self.known = now;
        Ok(())
    }
}

impl Discovery for CgroupDirDiscovery {
    async fn start(&mut self) -> Result<Vec<ContainerInfo>, DiscoveryError> {
        // Watch first, then list: a cgroup created in between shows up as an event.
        let watch = DirWatch::start("ddiskqos-inotify")?;
        watch.add(self.parent.path()).map_err(|e| DiscoveryError::Runtime {
            what: format!("watch {}", self.parent.path().display()),
            detail: e.to_string(),
        })?;
        self.changed = Some(watch);
        self.known = self.list_names()?;
        Ok(self.known.iter().filter_map(|n| self.info(n)).collect())
    }

    async fn next_event(&mut self) -> Result<DiscoveryEvent, DiscoveryError> {
        loop {
            if let Some(ev) = self.queue.pop_front() {
                return Ok(ev);
            }
            let Some(watch) = self.changed.as_mut() else { return std::future::pending().await };
            if watch.changed().await.is_none() {
                return Err(DiscoveryError::Runtime {
                    what: format!("watch {}", self.parent.path().display()),
                    detail: "inotify watcher stopped".into(),
                });
            }
            // What changed is read from the directory itself, so coalesced or overflowed notifications lose nothing.
            self.rescan()?;
        }
    }
}
