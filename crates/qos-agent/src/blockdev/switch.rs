//! Guarded writes to a device's queue settings: the scheduler and BFQ's tunables. Each refuses a device that is
//! not in the caller's allow-list and every disk in [`protected_disks`](super::protected_disks), and reads the
//! value back.

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::path::Path;

use super::{
    protected_disks_in, queue_dir, scheduler_in, validate_name, DeviceError, InvalidName, Result, MOUNTINFO, SYS,
};

/// Makes BFQ the scheduler of device `name`; see [`switch_scheduler`].
pub fn switch_to_bfq(name: &str, allowed: &[String]) -> Result<()> {
    switch_scheduler(name, "bfq", allowed).map(|_| ())
}

/// Makes `to` the active scheduler of device `name` and checks that it took. Returns the scheduler it had.
///
/// Refuses (with an error naming the device) a device that is not literally in `allowed` (the operator's list),
/// and the disk backing `/` (and, when `/` is on device-mapper or md, the disks under it); if it cannot tell
/// which disk backs `/` (e.g. `/` on btrfs or overlayfs with no `/dev/…` source), it refuses every device.
pub fn switch_scheduler(name: &str, to: &str, allowed: &[String]) -> Result<String> {
    let mountinfo = read_mountinfo()?;
    switch_scheduler_in(Path::new(SYS), &mountinfo, name, to, allowed)
}

/// Sets BFQ tunable `key` (`strict_guarantees`, `low_latency`, `slice_idle`, ...) of device `name` to `value`,
/// under the same guard as [`switch_scheduler`], and checks it reads back. Returns the old value.
pub fn set_bfq_tunable(name: &str, key: &str, value: &str, allowed: &[String]) -> Result<String> {
    let mountinfo = read_mountinfo()?;
    set_bfq_tunable_in(Path::new(SYS), &mountinfo, name, key, value, allowed)
}

fn read_mountinfo() -> Result<String> {
    fs::read_to_string(MOUNTINFO).map_err(|source| DeviceError::Io { op: "read", path: MOUNTINFO.into(), source })
}

/// The allow-list and root-disk guard shared by every write.
pub(super) fn guard(sys: &Path, mountinfo: &str, name: &str, allowed: &[String]) -> Result<()> {
    validate_name(name)?;
    let refuse = |reason: String| DeviceError::Refused { device: name.into(), reason };
    if !allowed.iter().any(|a| a == name) {
        return Err(refuse("not in the list of devices the operator allowed to change".into()));
    }
    let protected = protected_disks_in(sys, mountinfo).map_err(|e| refuse(format!("refusing: {e}")))?;
    if protected.iter().any(|p| p == name) {
        return Err(refuse(format!("backs the root filesystem (protected: {protected:?})")));
    }
    Ok(())
}

pub(super) fn switch_scheduler_in(
    sys: &Path,
    mountinfo: &str,
    name: &str,
    to: &str,
    allowed: &[String],
) -> Result<String> {
    guard(sys, mountinfo, name, allowed)?;
    validate_value("scheduler", to)?;
    let current = scheduler_in(sys, name)?.active;
    if current == to {
        return Ok(current);
    }
    let path = queue_dir(sys, name).join("scheduler");
    write_existing(&path, to)?;
    let now = scheduler_in(sys, name)?.active;
    if now != to {
        return Err(DeviceError::Refused {
            device: name.into(),
            reason: format!("wrote {to:?} to {} but the active scheduler is {now:?}", path.display()),
        });
    }
    tracing::info!(device = name, previous = %current, scheduler = to, "switched scheduler");
    Ok(current)
}

pub(super) fn set_bfq_tunable_in(
    sys: &Path,
    mountinfo: &str,
    name: &str,
    key: &str,
    value: &str,
    allowed: &[String],
) -> Result<String> {
    validate_value("BFQ tunable", key)?;
    set_queue_file_in(sys, mountinfo, name, &Path::new("iosched").join(key), value, allowed)
}

/// Sets the file `rel` of device `name`'s queue directory (`nr_requests`, `iosched/<tunable>`) to `value` under the
/// guard, and checks it reads back. Returns the old value.
pub(super) fn set_queue_file_in(
    sys: &Path,
    mountinfo: &str,
    name: &str,
    rel: &Path,
    value: &str,
    allowed: &[String],
) -> Result<String> {
    guard(sys, mountinfo, name, allowed)?;
    validate_value("queue setting value", value)?;
    let path = queue_dir(sys, name).join(rel);
    let old = read_trim(&path)?;
    write_existing(&path, value)?;
    let back = read_trim(&path)?;
    if back != value {
        return Err(DeviceError::Refused {
            device: name.into(),
            reason: format!("{} reads {back:?} after writing {value:?}", path.display()),
        });
    }
    Ok(old)
}

/// A scheduler name, tunable name or value: one word, no path characters.
fn validate_value(what: &'static str, value: &str) -> Result<()> {
    let ok = !value.is_empty()
        && value.len() <= 64
        && value != "."
        && value != ".."
        && value.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'.');
    if ok {
        Ok(())
    } else {
        Err(DeviceError::InvalidName(InvalidName {
            what,
            value: value.into(),
            reason: "must be one word of [A-Za-z0-9_.-]",
        }))
    }
}

fn read_trim(path: &Path) -> Result<String> {
    fs::read_to_string(path).map(|s| s.trim().to_owned()).map_err(|source| DeviceError::Io {
        op: "read",
        path: path.into(),
        source,
    })
}

/// Writes an existing sysfs file in one `write(2)`; never creates one.
fn write_existing(path: &Path, data: &str) -> Result<()> {
    let mut file = OpenOptions::new()
        .write(true)
        .create(false)
        .truncate(true)
        .open(path)
        .map_err(|source| DeviceError::Io { op: "open", path: path.into(), source })?;
    file.write_all(data.as_bytes()).map_err(|source| DeviceError::Write {
        path: path.into(),
        data: data.into(),
        source,
    })
}
