//! One device setting, read, written through the guard and put back: a BFQ tunable, the queue's depth
//! ([`NR_REQUESTS`]) or largest request ([`MAX_SECTORS_KB`]), the scheduler ([`SCHEDULER`]) or an io.cost line. What protection plans
//! ([`super::protect`]) and what the operator's tunables name ([`super::tune`]) are both made of these.

use std::path::Path;

use super::iocost::{self, IO_COST_MODEL, IO_COST_QOS};
use super::switch::{guard, set_bfq_tunable_in, set_queue_file_in, switch_scheduler_in};
use super::{scheduler_in, validate_name, DevNum, DeviceError, Result};

/// The key of the queue's depth (`/sys/block/NAME/queue/nr_requests`, not a BFQ tunable) among the settings.
pub const NR_REQUESTS: &str = "nr_requests";

/// The key of the largest request the block layer makes (`/sys/block/NAME/queue/max_sectors_kb`, in KiB; bigger
/// reads and writes are split) among the settings.
pub const MAX_SECTORS_KB: &str = "max_sectors_kb";

/// The settings that are files of the queue directory itself, not BFQ tunables.
pub const QUEUE_FILES: [&str; 2] = [NR_REQUESTS, MAX_SECTORS_KB];

/// Where setting `key` of a BFQ device lives, relative to its queue directory: one of [`QUEUE_FILES`], or
/// `iosched/<key>` for a BFQ tunable.
pub fn queue_file(key: &str) -> std::path::PathBuf {
    if QUEUE_FILES.contains(&key) {
        key.into()
    } else {
        Path::new("iosched").join(key)
    }
}

/// The key of a scheduler switch among the settings.
pub const SCHEDULER: &str = "scheduler";

/// One setting to make: device, key (a BFQ tunable, [`SCHEDULER`], `io.cost.model`, `io.cost.qos`), value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Setting {
    /// The device, e.g. `sdb`.
    pub device: String,
    /// What is set.
    pub key: String,
    /// The value (for io.cost, the whole line written).
    pub value: String,
}

/// The device number of disk `name`, from `/sys/block/NAME/dev`.
pub(super) fn devnum_in(sys: &Path, name: &str) -> Result<DevNum> {
    validate_name(name)?;
    let path = sys.join("block").join(name).join("dev");
    let text = std::fs::read_to_string(&path).map_err(|source| DeviceError::Io { op: "read", path, source })?;
    Ok(text.trim().parse::<DevNum>()?)
}

fn is_io_cost(key: &str) -> bool {
    key == IO_COST_MODEL || key == IO_COST_QOS
}

/// Whether every `key=value` word of `want` (after its device number) is in `line`.
pub fn line_has_all(line: &str, want: &str) -> bool {
    let have: Vec<&str> = line.split_whitespace().collect();
    want.split_whitespace().skip(1).all(|w| have.contains(&w))
}

/// What a setting reads now: a BFQ tunable's file, the active scheduler, or the device's io.cost line (`""` when
/// the file has none).
pub(crate) fn read_setting(sys: &Path, v2_root: Option<&Path>, device: &str, key: &str) -> Result<String> {
    if key == SCHEDULER {
        return Ok(scheduler_in(sys, device)?.active);
    }
    if is_io_cost(key) {
        let v2 = v2_root.ok_or_else(|| DeviceError::Refused {
            device: device.into(),
            reason: format!("{key}: no cgroup v2 root"),
        })?;
        let dev = devnum_in(sys, device)?;
        return Ok(iocost::read_line(&v2.join(key), dev)?.unwrap_or_default());
    }
    validate_name(device)?;
    read_tunable(sys, device, key)
}

/// Writes one setting through the guard (allow-list, root disk) and checks it reads back; returns the old value.
pub(crate) fn write_setting(
    sys: &Path,
    mountinfo: &str,
    v2_root: Option<&Path>,
    device: &str,
    key: &str,
    value: &str,
    allowed: &[String],
) -> Result<String> {
    if key == SCHEDULER {
        return switch_scheduler_in(sys, mountinfo, device, value, allowed);
    }
    if is_io_cost(key) {
        guard(sys, mountinfo, device, allowed)?;
        let old = read_setting(sys, v2_root, device, key)?;
        let v2 = v2_root.expect("read_setting checked it");
        let dev = devnum_in(sys, device)?;
        if value.split_whitespace().next() != Some(dev.to_string().as_str()) {
            return Err(DeviceError::Refused {
                device: device.into(),
                reason: format!("{key} line {value:?} is not for its device number {dev}"),
            });
        }
        iocost::write_line(&v2.join(key), value, dev)?;
        let back = read_setting(sys, v2_root, device, key)?;
        if !line_has_all(&back, value) {
            return Err(DeviceError::Refused {
                device: device.into(),
                reason: format!("{} reads {back:?} after writing {value:?}", v2.join(key).display()),
            });
        }
        return Ok(old);
    }
    if QUEUE_FILES.contains(&key) {
        return set_queue_file_in(sys, mountinfo, device, Path::new(key), value, allowed);
    }
    set_bfq_tunable_in(sys, mountinfo, device, key, value, allowed)
}

/// Puts one setting back to `original` as recorded: a tunable or scheduler as it was; an io.cost line as it was
/// where the operator had set its values (`ctrl=user`), or, where the kernel chose them (`ctrl=auto`, or no line
/// yet), automatic again, enabled as it was (off with no line): writing only `enable=0` left the agent's latency
/// targets in `io.cost.qos` (measured in the guest, `crates/bench/results/2026-11-28/ddq-v2-cost-*`).
pub(crate) fn restore_setting(
    sys: &Path,
    mountinfo: &str,
    v2_root: Option<&Path>,
    device: &str,
    key: &str,
    original: &str,
    allowed: &[String],
) -> Result<String> {
    if is_io_cost(key) {
        let dev = devnum_in(sys, device)?;
        let value = io_cost_restore_line(dev, key, original);
        return write_setting(sys, mountinfo, v2_root, device, key, &value, allowed);
    }
    write_setting(sys, mountinfo, v2_root, device, key, original, allowed)
}

/// The line that puts `key` (`io.cost.qos` or `io.cost.model`) of `dev` back to `original` (see
/// [`restore_setting`]).
pub(crate) fn io_cost_restore_line(dev: DevNum, key: &str, original: &str) -> String {
    let words: Vec<&str> = original.split_whitespace().collect();
    if !words.is_empty() && !words.contains(&"ctrl=auto") {
        return original.to_string();
    }
    if key == IO_COST_QOS {
        let enable = words.iter().find(|w| w.starts_with("enable=")).copied().unwrap_or("enable=0");
        format!("{dev} {enable} ctrl=auto")
    } else {
        format!("{dev} ctrl=auto")
    }
}

/// What setting `key` (a BFQ tunable, or one of [`QUEUE_FILES`]) of `device` reads now.
pub(super) fn read_tunable(sys: &Path, device: &str, key: &str) -> Result<String, DeviceError> {
    let path = super::queue_dir(sys, device).join(queue_file(key));
    std::fs::read_to_string(&path).map(|s| s.trim().to_string()).map_err(|source| DeviceError::Io {
        op: "read",
        path,
        source,
    })
}
