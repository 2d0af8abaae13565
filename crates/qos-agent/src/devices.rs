//! Start-up check that weights can matter: the disks containers use must run BFQ (cgroup v1 and v2), or have
//! io.cost enabled (v2). Otherwise the agent warns loudly, naming the device and the fix. Devices listed in
//! `[devices] switch_to_bfq` are switched first; no other device is touched.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use anyhow::{Context, Result};
use bollard::Docker;
use tracing::{info, warn};

use crate::cgroup::{device, CgroupRoot, CgroupVersion};
use crate::config::AgentConfig;

/// Name of the whole disk holding `path` (e.g. `vda` for a file on `/dev/vda1`), from sysfs.
pub fn disk_of_path(path: &Path) -> Result<String> {
    let meta = std::fs::metadata(path).with_context(|| format!("stat {}", path.display()))?;
    let dev = meta.dev();
    let (major, minor) = (nix::sys::stat::major(dev), nix::sys::stat::minor(dev));
    let link = format!("/sys/dev/block/{major}:{minor}");
    let target =
        std::fs::canonicalize(&link).with_context(|| format!("{link} (is {} on a block device?)", path.display()))?;
    // A partition's sysfs directory sits inside its disk's; a whole disk has a `device` link or is virtual.
    let is_partition = target.join("partition").exists();
    let disk = if is_partition { target.parent().unwrap_or(&target) } else { &target };
    disk.file_name().and_then(|n| n.to_str()).map(str::to_string).with_context(|| format!("no name for {link}"))
}

/// Switches the opted-in devices, then checks the devices that matter and warns about each one where weights
/// cannot act.
pub async fn check_at_start(cfg: &AgentConfig, root: &CgroupRoot, docker: Option<&Docker>) -> Result<()> {
    for name in &cfg.devices.switch_to_bfq {
        device::switch_to_bfq(name, &cfg.devices.switch_to_bfq)
            .with_context(|| format!("devices.switch_to_bfq: cannot switch {name} to bfq"))?;
        info!(device = %name, "scheduler switched to bfq, as configured");
    }
    let mut check = cfg.devices.check.clone();
    if check.is_empty() {
        if let Some(d) = docker {
            if let Some(dir) = d.info().await.ok().and_then(|i| i.docker_root_dir) {
                match disk_of_path(Path::new(&dir)) {
                    Ok(disk) => check.push(disk),
                    Err(e) => warn!(dir = %dir, error = %e, "cannot tell which disk holds Docker's data"),
                }
            }
        }
    }
    for name in check {
        match device::scheduler(&name) {
            Ok(s) if s == "bfq" => info!(device = %name, "scheduler is bfq: weights act on this device"),
            Ok(s) => {
                let iocost = root.version() == CgroupVersion::V2 && iocost_enabled(root, &name);
                if iocost {
                    info!(device = %name, scheduler = %s, "io.cost is enabled: io.weight acts on this device");
                } else {
                    warn!(device = %name, scheduler = %s,
                          "BLOCK-I/O WEIGHTS HAVE NO EFFECT ON THIS DEVICE: it does not use the bfq scheduler{}. \
                           Fix: `echo bfq > /sys/block/{name}/queue/scheduler`, or add \"{name}\" to \
                           [devices] switch_to_bfq", if root.version() == CgroupVersion::V2 { " and io.cost is off" } else { "" });
                }
            }
            Err(e) => warn!(device = %name, error = %e, "cannot read the device's scheduler"),
        }
    }
    Ok(())
}

/// Whether v2 io.cost is enabled for device `name` (root `io.cost.qos` says `enable=1`).
fn iocost_enabled(root: &CgroupRoot, name: &str) -> bool {
    let Ok(text) = std::fs::read_to_string(format!("/sys/block/{name}/dev")) else { return false };
    let Ok(dev) = text.trim().parse::<device::DevNum>() else { return false };
    device::io_cost_enabled(root.path(), dev).unwrap_or(false)
}
