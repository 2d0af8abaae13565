//! Start-up check that weights can matter: the disks containers use must run BFQ (cgroup v1 and v2), or have
//! io.cost enabled (v2). Otherwise the agent warns loudly, naming the device and the fix. Devices listed in
//! `[devices] switch_to_bfq` are switched first, then the tunables of `[devices] bfq_tunables` are set (see
//! [`super::tune`]); no other device is touched.
//!
//! On cgroup v2 the devices are checked by the weight writer's device table instead
//! ([`crate::files::FileWriter::check_configured`], called by [`crate::files::agent_writer`]): it
//! is the one place that warns about a device no weight acts on, once per device, whether the device comes from
//! the config or from a container's `io.stat`.

use anyhow::{Context, Result};
use tracing::{info, warn};

use super::tune::{self, TunedDevices};
use super::{scheduler, switch_to_bfq};
use crate::cgroup::{CgroupRoot, CgroupVersion};
use crate::config::AgentConfig;

/// Switches the opted-in devices and sets their opted-in BFQ tunables, then checks the devices that matter and
/// warns about each one where weights cannot act. `runtime_disk` is the disk holding the runtime's data (Docker's
/// data root), checked when the config names no device. The returned [`TunedDevices`] puts the tunables back when
/// restored or dropped: keep it until the agent stops.
pub fn check_at_start(cfg: &AgentConfig, root: &CgroupRoot, runtime_disk: Option<String>) -> Result<TunedDevices> {
    for name in &cfg.devices.switch_to_bfq {
        switch_to_bfq(name, &cfg.devices.switch_to_bfq)
            .with_context(|| format!("devices.switch_to_bfq: cannot switch {name} to bfq"))?;
        info!(device = %name, "scheduler is bfq, as configured");
    }
    let originals = tune::originals_path(&cfg.state_file);
    let tuned = TunedDevices::apply(&cfg.devices.bfq_tunables, (!cfg.dry_run).then_some(originals.as_path()))?;
    if root.version() == CgroupVersion::V2 {
        return Ok(tuned);
    }
    let mut check = cfg.devices.check.clone();
    if check.is_empty() {
        check.extend(runtime_disk);
    }
    for name in check {
        match scheduler(&name) {
            Ok(s) if s.active == "bfq" => info!(device = %name, "scheduler is bfq: weights act on this device"),
            Ok(s) => warn!(device = %name, scheduler = %s.active,
                "BLOCK-I/O WEIGHTS HAVE NO EFFECT ON THIS DEVICE: it does not use the bfq scheduler. \
                 Fix: `echo bfq > /sys/block/{name}/queue/scheduler`, or add \"{name}\" to [devices] switch_to_bfq"),
            Err(e) => warn!(device = %name, error = %e, "cannot read the device's scheduler"),
        }
    }
    Ok(tuned)
}
