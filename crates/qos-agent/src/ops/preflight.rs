//! The checks `run` makes before it starts anything, shared with `check-config` so the two never disagree: the
//! config's rules, its paths (state file, control socket, Docker socket), the cgroup root and parent, and the
//! devices it names. Nothing here writes; what only the running runtime can answer is listed as not checked.

use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileTypeExt;
use std::path::Path;

use crate::blockdev;
use crate::cgroup::{CgroupRoot, CgroupVersion};
use crate::config::{AgentConfig, RuntimeKind};

/// Longest Unix socket path (`sun_path` holds 108 bytes with the terminating NUL).
const MAX_SOCKET_PATH: usize = 107;

/// A check that failed: the config field, its value and why.
#[derive(Debug, thiserror::Error)]
#[error("{field} = {value:?}: {reason}")]
pub struct PreflightError {
    /// The config field (dotted, e.g. `devices.check[0]`).
    pub field: String,
    /// Its value.
    pub value: String,
    /// What is wrong.
    pub reason: String,
}

/// What passed, and what could not be checked without the runtime answering.
#[derive(Debug)]
pub struct Preflight {
    /// The cgroup root found.
    pub root: CgroupRoot,
    /// Checks left to the running agent, in words.
    pub not_checked: Vec<String>,
    /// What the agent will change on devices at start (opt-ins of `[devices]`), in words.
    pub device_changes: Vec<String>,
}

fn fail(field: &str, value: impl AsRef<str>, reason: impl Into<String>) -> PreflightError {
    PreflightError { field: field.into(), value: value.as_ref().into(), reason: reason.into() }
}

/// Every check `run` makes before it starts; the first failure is returned.
pub fn check(cfg: &AgentConfig) -> Result<Preflight, PreflightError> {
    cfg.validate().map_err(|e| match e {
        qos_core::ConfigError::Invalid { field, value, reason } => fail(&field, value, reason),
        other => fail("config", "", other.to_string()),
    })?;
    check_paths(cfg)?;
    let root = cgroup_root(cfg)?;
    if cfg.runtime == RuntimeKind::CgroupDir {
        let parent = cfg.cgroup.parent.trim_matches('/');
        root.resolve_relative(parent)
            .map_err(|e| fail("cgroup.parent", &cfg.cgroup.parent, format!("no such cgroup under the root: {e}")))?;
    }
    let device_changes = check_devices(cfg)?;
    let mut not_checked = Vec::new();
    if cfg.runtime == RuntimeKind::Docker {
        let socket = &cfg.docker.socket;
        match std::fs::metadata(socket) {
            Ok(m) if m.file_type().is_socket() => {}
            Ok(_) => return Err(fail("docker.socket", socket.display().to_string(), "is not a socket")),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(fail("docker.socket", socket.display().to_string(), "does not exist (is dockerd running?)"))
            }
            Err(e) => return Err(fail("docker.socket", socket.display().to_string(), e.to_string())),
        }
        not_checked.push(format!("whether dockerd answers on {}", socket.display()));
        if cfg.devices.check.is_empty() {
            not_checked.push("the scheduler of the disk holding Docker's data (asked from dockerd at start)".into());
        }
    }
    if cfg.runtime == RuntimeKind::Cri {
        let socket = &cfg.cri.socket;
        match std::fs::metadata(socket) {
            Ok(m) if m.file_type().is_socket() => {}
            Ok(_) => return Err(fail("cri.socket", socket.display().to_string(), "is not a socket")),
            Err(e) => {
                return Err(fail(
                    "cri.socket",
                    socket.display().to_string(),
                    format!("{e} (is the container runtime running?)"),
                ))
            }
        }
        not_checked.push(format!("whether the CRI runtime answers on {}", socket.display()));
    }
    if cfg.metrics.enabled {
        not_checked.push(format!("whether metrics.listen {} can be bound", cfg.metrics.listen));
    }
    Ok(Preflight { root, not_checked, device_changes })
}

fn check_paths(cfg: &AgentConfig) -> Result<(), PreflightError> {
    let state = cfg.state_file.as_path();
    let socket = cfg.control_socket.as_path();
    for (field, path) in
        [("state_file", state), ("control_socket", socket), ("docker.socket", cfg.docker.socket.as_path())]
    {
        if path.as_os_str().as_bytes().contains(&0) {
            return Err(fail(field, path.to_string_lossy(), "contains a NUL byte"));
        }
    }
    if state == socket {
        return Err(fail("control_socket", socket.display().to_string(), "is the same path as state_file"));
    }
    if socket.as_os_str().len() > MAX_SOCKET_PATH {
        let reason = format!("{} bytes; a Unix socket path has at most {MAX_SOCKET_PATH}", socket.as_os_str().len());
        return Err(fail("control_socket", socket.display().to_string(), reason));
    }
    match std::fs::symlink_metadata(socket) {
        // A stale socket of a crashed agent is replaced; anything else at that path is someone's file.
        Ok(m) if m.file_type().is_socket() => {}
        Ok(_) => {
            return Err(fail(
                "control_socket",
                socket.display().to_string(),
                "exists and is not a socket (not replacing it)",
            ))
        }
        Err(_) => {}
    }
    if let Ok(m) = std::fs::symlink_metadata(state) {
        if !m.is_file() {
            return Err(fail("state_file", state.display().to_string(), "exists and is not a regular file"));
        }
    }
    for (field, path) in [("state_file", state), ("control_socket", socket)] {
        if let Some(dir) = path.parent() {
            check_dir_or_creatable(field, path, dir)?;
        }
    }
    Ok(())
}

/// The directory exists (as a directory), or its nearest existing ancestor is a directory it can be made in.
fn check_dir_or_creatable(field: &str, path: &Path, dir: &Path) -> Result<(), PreflightError> {
    let mut at = Some(dir);
    while let Some(d) = at {
        match std::fs::metadata(d) {
            Ok(m) if m.is_dir() => return Ok(()),
            Ok(_) => {
                let reason = format!("{} is not a directory", d.display());
                return Err(fail(field, path.display().to_string(), reason));
            }
            Err(_) => at = d.parent(),
        }
    }
    Ok(())
}

/// The cgroup root the config names (`auto`: the one mounted), as `run` finds it.
pub fn cgroup_root(cfg: &AgentConfig) -> Result<CgroupRoot, PreflightError> {
    match cfg.cgroup.root.trim() {
        "" | "auto" => CgroupRoot::detect().map_err(|e| fail("cgroup.root", &cfg.cgroup.root, e.to_string())),
        path => {
            let p = Path::new(path);
            // Every cgroup directory, v1 or v2, has `cgroup.procs`; a plain directory would start "successfully" and
            // manage nothing.
            if !p.join("cgroup.procs").is_file() {
                return Err(fail("cgroup.root", path, "not a cgroup directory (it has no cgroup.procs)"));
            }
            let version = if p.join("cgroup.controllers").exists() { CgroupVersion::V2 } else { CgroupVersion::V1 };
            CgroupRoot::from_dir(version, p)
                .map_err(|e| fail("cgroup.root", path, format!("not a usable cgroup mount: {e}")))
        }
    }
}

/// Checks the devices the config names; returns what the agent will change on them at start, in words.
fn check_devices(cfg: &AgentConfig) -> Result<Vec<String>, PreflightError> {
    let mut changes = Vec::new();
    for (list, names) in [("check", &cfg.devices.check), ("switch_to_bfq", &cfg.devices.switch_to_bfq)] {
        for (i, name) in names.iter().enumerate() {
            let field = format!("devices.{list}[{i}]");
            let s = blockdev::scheduler(name)
                .map_err(|e| fail(&field, name, format!("not a block device with a scheduler: {e}")))?;
            if list == "switch_to_bfq" && s.active != "bfq" {
                changes.push(format!("{name}: scheduler {} -> bfq (switch_to_bfq; left as bfq at stop)", s.active));
            }
        }
    }
    let tuned = &cfg.devices.bfq_tunables;
    if !cfg.devices.switch_to_bfq.is_empty() || tuned.values().any(|t| !t.is_empty()) {
        let protected = blockdev::protected_disks().map_err(|e| {
            let names: Vec<&str> = cfg.devices.switch_to_bfq.iter().chain(tuned.keys()).map(String::as_str).collect();
            fail("devices", names.join(","), format!("cannot tell which disk backs /, so none is changed: {e}"))
        })?;
        for (i, name) in cfg.devices.switch_to_bfq.iter().enumerate() {
            if protected.contains(name) {
                let field = format!("devices.switch_to_bfq[{i}]");
                return Err(fail(&field, name, "backs the root filesystem: never switched"));
            }
        }
        for (name, tunables) in tuned {
            let field = format!("devices.bfq_tunables.{name}");
            if tunables.is_empty() {
                continue;
            }
            if protected.contains(name) {
                return Err(fail(&field, name, "backs the root filesystem: its tunables are never changed"));
            }
            let s = blockdev::scheduler(name)
                .map_err(|e| fail(&field, name, format!("not a block device with a scheduler: {e}")))?;
            let will_be_bfq = s.active == "bfq" || cfg.devices.switch_to_bfq.contains(name);
            if !will_be_bfq {
                let reason = format!("scheduler is {:?}, not bfq: add it to devices.switch_to_bfq", s.active);
                return Err(fail(&field, name, reason));
            }
            for (key, value) in tunables {
                let now = if s.active == "bfq" {
                    let path = Path::new("/sys/block").join(name).join("queue/iosched").join(key);
                    let text = std::fs::read_to_string(&path).map_err(|e| {
                        fail(
                            &format!("{field}.{key}"),
                            value.to_string(),
                            format!("cannot read {}: {e}", path.display()),
                        )
                    })?;
                    text.trim().to_string()
                } else {
                    "(set once bfq is active)".to_string()
                };
                changes.push(format!("{name}: BFQ {key} {now} -> {value} (bfq_tunables; restored at stop)"));
            }
        }
    }
    changes.extend(protect_plan(cfg));
    Ok(changes)
}

/// What protection by default will do at start, in words (the devices of `[devices] check`; the runtime's data
/// disk is only known once the runtime answers).
fn protect_plan(cfg: &AgentConfig) -> Vec<String> {
    use crate::blockdev::protect;
    if cfg.devices.protect == crate::config::ProtectMode::Off {
        return vec!["protect = \"off\": no device is changed by protection".into()];
    }
    if cfg.devices.check.is_empty() {
        let what = match cfg.runtime {
            RuntimeKind::Docker => "the disk holding Docker's data root (asked from dockerd at start)",
            RuntimeKind::Cri => "the disks holding [cri] state_dirs (found at start)",
            RuntimeKind::CgroupDir => "none: name the devices in [devices] check",
        };
        return vec![format!("protect: managed devices: {what}; opted out: {:?}", cfg.devices.opt_out)];
    }
    let managed: Vec<protect::Managed> = cfg
        .devices
        .check
        .iter()
        .map(|name| protect::Managed { name: name.clone(), why: "[devices] check".into() })
        .collect();
    let protected = blockdev::protected_disks().map_err(|e| e.to_string());
    let v2 = cgroup_root(cfg).ok().filter(|r| r.version() == CgroupVersion::V2).map(|r| r.path().to_path_buf());
    protect::plan_in(Path::new("/sys"), &protected, v2.as_deref(), &cfg.devices, &managed)
        .iter()
        .map(|p| format!("at start: {}", p.describe()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A config that passes in a temp dir: cgroup-dir runtime over a fixture root.
    fn good(dir: &Path) -> AgentConfig {
        std::fs::create_dir_all(dir.join("cgroup/pods")).unwrap();
        std::fs::write(dir.join("cgroup/cgroup.procs"), "").unwrap();
        let mut cfg = AgentConfig {
            runtime: RuntimeKind::CgroupDir,
            state_file: dir.join("run/state.json"),
            control_socket: dir.join("run/agent.sock"),
            ..AgentConfig::default()
        };
        cfg.cgroup.root = dir.join("cgroup").display().to_string();
        cfg.cgroup.parent = "pods".into();
        cfg
    }

    fn field_of(cfg: &AgentConfig) -> String {
        check(cfg).expect_err("must fail").field
    }

    #[test]
    fn a_good_config_passes_and_each_bad_path_names_its_field() {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path();
        let ok = check(&good(d)).unwrap();
        assert!(ok.not_checked.is_empty(), "{:?}", ok.not_checked);

        let mut c = good(d);
        c.control_socket = c.state_file.clone();
        assert_eq!(field_of(&c), "control_socket");
        let mut c = good(d);
        c.control_socket = d.join("x".repeat(120));
        assert_eq!(field_of(&c), "control_socket");
        let mut c = good(d);
        std::fs::write(d.join("precious"), "data").unwrap();
        c.control_socket = d.join("precious");
        assert_eq!(field_of(&c), "control_socket");
        assert_eq!(std::fs::read_to_string(d.join("precious")).unwrap(), "data", "a check never deletes");
        let mut c = good(d);
        c.state_file = d.to_path_buf();
        assert_eq!(field_of(&c), "state_file");
        let mut c = good(d);
        c.state_file = d.join("precious/state.json");
        assert_eq!(field_of(&c), "state_file", "a parent that is a file");
        let mut c = good(d);
        c.state_file = std::path::PathBuf::from(std::ffi::OsStr::from_bytes(b"/tmp/a\0b"));
        assert_eq!(field_of(&c), "state_file");
        let mut c = good(d);
        c.cgroup.root = d.join("nope").display().to_string();
        assert_eq!(field_of(&c), "cgroup.root");
        let mut c = good(d);
        std::fs::create_dir_all(d.join("plain/pods")).unwrap();
        c.cgroup.root = d.join("plain").display().to_string();
        assert_eq!(field_of(&c), "cgroup.root", "a plain directory is not a cgroup root");
        let mut c = good(d);
        c.cgroup.parent = "missing".into();
        assert_eq!(field_of(&c), "cgroup.parent");
        let mut c = good(d);
        c.devices.check = vec!["no-such-disk".into()];
        assert_eq!(field_of(&c), "devices.check[0]");
        let mut c = good(d);
        c.runtime = RuntimeKind::Docker;
        c.docker.socket = d.join("docker.sock");
        assert_eq!(field_of(&c), "docker.socket");
        let mut c = good(d);
        c.runtime = RuntimeKind::Cri;
        c.cri.socket = d.join("containerd.sock");
        assert_eq!(field_of(&c), "cri.socket");
        let _listener = std::os::unix::net::UnixListener::bind(d.join("containerd.sock")).unwrap();
        let ok = check(&c).unwrap();
        assert!(ok.not_checked.iter().any(|w| w.contains("CRI runtime answers")), "{:?}", ok.not_checked);
        let mut c = good(d);
        c.sample_interval = std::time::Duration::from_millis(1);
        assert_eq!(field_of(&c), "sample_interval");
    }
}
