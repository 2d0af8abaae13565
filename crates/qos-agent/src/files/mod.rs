//! The cgroup-file backend as its own layer, used by every runtime: a container's counters read from its cgroup
//! files and its weight written into them and read back. Nothing here knows a container runtime: a runtime
//! brings its discovery (and, like Docker, its own API paths) and uses these on its containers' cgroups.
//!
//! ## Layout
//! - `counters.rs`: [`FileCounters`], each container's counter file kept open and read behind a parent gate;
//! - `writer.rs`: [`FileWriter`], the weight file(s) written, read back and restored;
//! - `devices.rs`: [`FileDevices`], the devices the writer plans with (cgroup v2 and v1 BFQ: what governs each,
//!   each container's devices and weights in force, the io.cost rate watch); the daemon ticks it on its clock and
//!   shows it in status, as its [`crate::backend::DeviceMonitor`];
//! - `weight_plan.rs`: [`WeightPlan`], the pure rule of the files with per-device lines (v2's, v1's
//!   `blkio.bfq.weight_device`: which file acts on which device, the lines that set or restore a weight, the values
//!   expected back); the writer and the bench's weight probe both use it;
//! - `cap_plan.rs`: the pure rule of the throughput cap's throttle files (v1 `blkio.throttle.*_bps_device`, v2
//!   `io.max`: formats, the lines that set a cap without loosening a limit, and that put the limits back), which
//!   [`FileWriter::write_cap`] writes.

pub mod cap_plan;
mod counters;
mod devices;
pub mod restore_records;
pub(crate) mod weight_plan;
mod writer;

pub use counters::{FileCounters, ACTIVE_ROUNDS, FULL_READ_EVERY};
pub use devices::FileDevices;
pub use weight_plan::{check_restored, governs, restore_lines, Line, Mismatch, WeightPlan, V1_FILES, V2_FILES};
pub use writer::{FileWriter, LeftoverCap};

use std::path::PathBuf;
use std::sync::Arc;

use crate::backend::RuntimeBackends;
use crate::backend::Starting;
use crate::cgroup::{CgroupRoot, CgroupVersion};
use crate::config::AgentConfig;
use crate::ops::metrics::Metrics;

/// The file writer as the agent configures it: on v2 (and v1 with `blkio.bfq.weight_device`) it checks the
/// devices `check` names (`[devices] check`, or Docker's data disk) besides each container's own, and exports
/// which weight acts on each device; on v2 it looks at those devices at once, so one where no weight acts is warned
/// about (once: the start-up check leaves v2 devices to it) before any write; its restore snapshots go to `records`
/// too ([`records_file`]), its cap snapshots to `cap_records` ([`cap_records_file`]).
pub fn agent_writer(
    root: &CgroupRoot,
    check: Vec<String>,
    records: Option<PathBuf>,
    cap_records: Option<PathBuf>,
    metrics: &Metrics,
) -> FileWriter {
    let mut writer =
        FileWriter::new(root.path()).with_devices(check).with_metric(metrics.device_weight_effective.clone());
    if let Some(path) = records {
        writer = writer.with_records_file(path);
    }
    if let Some(path) = cap_records {
        writer = writer.with_cap_records_file(path);
    }
    if root.version() == CgroupVersion::V2 {
        writer.check_configured();
    }
    writer
}

/// Where the agent's file writer keeps its restore snapshots: beside the state file (`<state file>.v2-files.jsonl`,
/// on cgroup v1 `<state file>.v1-files.jsonl`, see [`crate::files::restore_records`]); none in a dry run, which
/// writes nothing.
pub fn records_file(cfg: &AgentConfig, version: CgroupVersion) -> Option<PathBuf> {
    let kind = match version {
        CgroupVersion::V2 => "v2-files",
        CgroupVersion::V1 => "v1-files",
    };
    (!cfg.dry_run).then(|| crate::files::restore_records::records_path(&cfg.state_file, kind))
}

/// Where the agent's file writer keeps its cap snapshots ([`FileWriter::with_cap_records_file`]): beside the state
/// file, `<state file>.caps.jsonl`; none in a dry run, which writes nothing.
pub fn cap_records_file(cfg: &AgentConfig) -> Option<PathBuf> {
    (!cfg.dry_run).then(|| crate::files::restore_records::records_path(&cfg.state_file, "caps"))
}

/// The backends of a runtime whose containers are plain cgroup directories (cgroup-dir, CRI pod cgroups, the
/// bench's announced cgroups): its `discovery`, the gated counters and the agent's file writer.
pub fn backends_on_files<D>(
    discovery: D,
    cfg: &AgentConfig,
    root: &Arc<CgroupRoot>,
    metrics: &Metrics,
) -> RuntimeBackends<D, FileCounters, FileWriter, FileDevices> {
    let records = records_file(cfg, root.version());
    let writer = agent_writer(root, cfg.devices.check.clone(), records, cap_records_file(cfg), metrics);
    let devices = writer.devices();
    RuntimeBackends {
        discovery,
        counters: FileCounters::with_root(root.clone()),
        writer,
        devices,
        starting: Starting::default(),
    }
}
