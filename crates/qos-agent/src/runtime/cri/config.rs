//! `[cri]`, the CRI runtime's section of the agent's configuration, and its rules: the section lives with the
//! runtime that reads it (`crate::config` embeds it and calls [`CriConfig::validate`]).

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::naming::KubeletRoot;

/// `[cri]`, for `runtime = "cri"`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CriConfig {
    /// The runtime's CRI socket: containerd's by default; CRI-O's is `/var/run/crio/crio.sock`.
    pub socket: PathBuf,
    /// How often the READY pod sandboxes are listed (containerd 1.6 has no CRI event stream). A new pod is
    /// normally seen sooner: a change in the kubepods cgroup tree triggers a re-list at once. 2 s.
    #[serde(with = "qos_core::units::duration")]
    pub relist_interval: Duration,
    /// The kubelet's `--cgroup-root` (`cgroupRoot`): `/` by default, `/kubelet` under kind. Pod cgroups are
    /// looked for below it (`<root>/kubepods/...` with cgroupfs, `<root>-kubepods-....slice` with systemd).
    pub cgroup_root: String,
    /// The kubelet's and the runtime's state directories: with `[devices] check` empty, the disks holding those
    /// that exist (in the agent's mount namespace) are the devices checked at start and by readiness
    /// (`/readyz`). Default: the kubelet's, containerd's and CRI-O's (`/var/lib/containers`).
    pub state_dirs: Vec<PathBuf>,
}

impl Default for CriConfig {
    fn default() -> Self {
        Self {
            socket: PathBuf::from("/run/containerd/containerd.sock"),
            relist_interval: Duration::from_secs(2),
            cgroup_root: "/".into(),
            state_dirs: ["/var/lib/kubelet", "/var/lib/containerd", "/var/lib/containers"].map(PathBuf::from).to_vec(),
        }
    }
}

impl CriConfig {
    /// The section's rules; an error names the field (`cri.<field>`) and the value.
    pub fn validate(&self) -> Result<(), qos_core::ConfigError> {
        let invalid = |field: &str, value: String, reason: &str| qos_core::ConfigError::Invalid {
            field: format!("cri.{field}"),
            value,
            reason: reason.into(),
        };
        let ri = self.relist_interval;
        if ri < Duration::from_millis(100) || ri > Duration::from_secs(3600) {
            return Err(invalid("relist_interval", qos_core::units::format_duration(ri), "must be 100ms..=1h"));
        }
        KubeletRoot::parse(&self.cgroup_root)
            .map_err(|reason| invalid("cgroup_root", self.cgroup_root.clone(), reason))?;
        for (i, dir) in self.state_dirs.iter().enumerate() {
            if !dir.is_absolute() {
                return Err(invalid(
                    &format!("state_dirs[{i}]"),
                    dir.display().to_string(),
                    "must be an absolute path",
                ));
            }
        }
        Ok(())
    }
}
