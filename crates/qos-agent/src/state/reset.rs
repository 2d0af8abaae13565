//! The repair `ddiskqos-agent state reset` makes, with the agent stopped: the state file rewritten keeping the
//! entries that still read (or none), the old file kept beside it, and the named cgroups set to one weight through
//! the files layer (each written and read back).

use std::collections::BTreeMap;
use std::path::PathBuf;

use qos_core::{ContainerId, Weight};

use super::{inspect, OriginalWeights, StateError};
use crate::backend::{BackendError, ContainerInfo};
use crate::cgroup::{CgroupDir, CgroupError, CgroupRoot};
use crate::files::FileWriter;

/// What to reset.
#[derive(Debug, Clone)]
pub struct Reset {
    /// The state file.
    pub state_file: PathBuf,
    /// The weight the cgroups get.
    pub weight: Weight,
    /// Cgroups relative to the root.
    pub cgroups: Vec<String>,
    /// Cgroups relative to the root whose every child cgroup is reset too.
    pub children_of: Vec<String>,
    /// Write an empty state file instead of keeping the entries that still read.
    pub forget_all: bool,
}

/// Why nothing was reset.
#[derive(Debug, thiserror::Error)]
pub enum ResetError {
    /// An agent runs: it would restore at its stop what a reset changes now.
    #[error("{} is held by a running agent (pid {pid}): stop it first", path.display())]
    Held {
        /// The state file.
        path: PathBuf,
        /// The agent's pid, from the lock file.
        pid: String,
    },
    /// A named cgroup is not one under the root.
    #[error("cgroup {cgroup}: {source}")]
    Cgroup {
        /// As named.
        cgroup: String,
        /// Why.
        #[source]
        source: CgroupError,
    },
    /// The children of a `children_of` cgroup could not be listed.
    #[error("children of {cgroup}: {}: {source}", path.display())]
    Children {
        /// As named.
        cgroup: String,
        /// Its directory.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The state file could not be read or rewritten.
    #[error(transparent)]
    State(#[from] StateError),
}

/// What a reset did.
#[derive(Debug)]
pub struct ResetReport {
    /// Entries the new state file keeps.
    pub kept: usize,
    /// The old file, copied aside, if there was one.
    pub backup: Option<PathBuf>,
    /// Per cgroup (as named, children after their parent's listing, by name): the weight it had (if readable)
    /// and the write's outcome.
    pub cgroups: Vec<(String, Option<Weight>, Result<(), BackendError>)>,
}

impl ResetReport {
    /// Cgroups whose write failed.
    pub fn failed(&self) -> usize {
        self.cgroups.iter().filter(|(_, _, r)| r.is_err()).count()
    }
}

/// Resets as `reset` says, under `root`: every cgroup is resolved first (nothing is changed when one is not under
/// the root), then the state file is rewritten (its lock keeps an agent from starting meanwhile), then the weights
/// are written.
pub fn reset(root: &CgroupRoot, reset: &Reset) -> Result<ResetReport, ResetError> {
    let found = inspect(&reset.state_file)?;
    if let Some(pid) = found.holder {
        return Err(ResetError::Held { path: reset.state_file.clone(), pid });
    }
    let resolve = |rel: &str| -> Result<CgroupDir, ResetError> {
        root.resolve_relative(rel).map_err(|source| ResetError::Cgroup { cgroup: rel.into(), source })
    };
    let mut targets = Vec::new();
    for rel in &reset.cgroups {
        targets.push((rel.clone(), resolve(rel)?));
    }
    for parent in &reset.children_of {
        let dir = resolve(parent)?;
        let listing = std::fs::read_dir(dir.path()).map_err(|source| ResetError::Children {
            cgroup: parent.clone(),
            path: dir.path().to_owned(),
            source,
        })?;
        let mut names: Vec<String> = listing
            .filter_map(Result::ok)
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        for name in names {
            let rel = format!("{}/{name}", parent.trim_end_matches('/'));
            targets.push((rel.clone(), resolve(&rel)?));
        }
    }
    let keep: BTreeMap<ContainerId, Weight> = if reset.forget_all { BTreeMap::new() } else { found.originals };
    let kept = keep.len();
    let (_lock, backup) = OriginalWeights::rewrite(&reset.state_file, keep)?;
    let mut writer = FileWriter::new(root.path());
    let mut cgroups = Vec::new();
    for (rel, dir) in targets {
        let info = ContainerInfo {
            id: ContainerId::new(&rel),
            name: rel.clone(),
            labels: Default::default(),
            cgroup: Some(dir),
        };
        let before = writer.read_weight(&info).ok();
        let result = writer.write_weight(&info, reset.weight).map(|_| ());
        cgroups.push((rel, before, result));
    }
    Ok(ResetReport { kept, backup, cgroups })
}
