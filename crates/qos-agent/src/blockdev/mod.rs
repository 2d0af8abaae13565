//! Block-device facts the agent and the bench both need: the disk a path or a device number is
//! on, the active scheduler, whether v2 io.cost is on, and the guarded writes (scheduler, BFQ tunables) that never
//! touch the disk backing `/`.
//!
//! Weights only act on a device whose scheduler is BFQ (v1 and v2) or that has io.cost enabled (v2). This module
//! reports that; it never decides on its own to change a device: [`switch_scheduler`] and [`set_bfq_tunable`]
//! change only a device the caller names in an allow-list, and never the disk backing `/` (nor the disks under
//! it, for device-mapper and md roots).
//!
//! ## Layout
//! - this file: [`DeviceError`] (with [`DevNum`]'s errors in its words), the read-only facts ([`scheduler`], [`disk_of_dev`],
//!   [`disk_of_path`], [`io_cost_enabled`]) and the root-disk protection;
//! - `switch.rs`: the guarded writes;
//! - [`tune`]: the opt-in BFQ tunables of `[devices] bfq_tunables`, set at start and restored at stop;
//! - [`iocost`]: the opt-in io.cost set-up (measure a device, write its model and qos lines);
//! - `governor.rs`: which cgroup-v2 weight file acts on each device ([`Governor`]), cached in a [`DeviceTable`].

mod governor;
pub mod iocost;
pub mod protect;
mod setting;
mod switch;
pub mod tune;
pub mod vrate;

use std::fs;
use std::path::{Path, PathBuf};

pub use governor::{DeviceFacts, DeviceTable, Governor, DEFAULT_MAX_AGE};
pub use switch::{set_bfq_tunable, switch_scheduler, switch_to_bfq};

use crate::kernel::mountinfo::root_device;
use crate::kernel::mountinfo::MOUNTINFO;
/// Re-exported from its home at the bottom (`crate::kernel`, crate-private), where the bench, the tests and the cgroup layer
/// also find it.
pub use crate::kernel::DevNum;
use crate::kernel::DevNumError;
pub use crate::kernel::InvalidName;

const SYS: &str = "/sys";

/// A failure of the block-device layer; every variant names the device or the file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DeviceError {
    /// Reading or inspecting a sysfs or proc file failed.
    #[error("cannot {op} {path}: {source}")]
    Io {
        /// What was attempted.
        op: &'static str,
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// Writing a sysfs file failed.
    #[error("cannot write {data:?} to {path}: {source}")]
    Write {
        /// The file.
        path: PathBuf,
        /// Exactly what was written.
        data: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A sysfs file's content is not in the expected format.
    #[error("{path}: {reason}: {text:?}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The offending text.
        text: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A device name or number that cannot be right ("device name", "device number", "BFQ tunable").
    #[error(transparent)]
    InvalidName(#[from] InvalidName),
    /// The operation was refused (a protected disk, a device not allowed) or did not take effect.
    #[error("device {device}: {reason}")]
    Refused {
        /// The device name (or `MAJ:MIN`).
        device: String,
        /// Why.
        reason: String,
    },
}

impl From<DevNumError> for DeviceError {
    /// The same words as before [`DevNum`] moved to [`crate::kernel`].
    fn from(e: DevNumError) -> Self {
        match e {
            DevNumError::Invalid { value } => {
                DeviceError::InvalidName(InvalidName { what: "device number", value, reason: "expected MAJ:MIN" })
            }
            DevNumError::Stat { path, source } => DeviceError::Io { op: "stat", path, source },
            DevNumError::NotBlockDevice { path } => {
                DeviceError::Refused { device: path.display().to_string(), reason: "not a block device".into() }
            }
        }
    }
}

/// Result of the block-device layer.
pub type Result<T, E = DeviceError> = std::result::Result<T, E>;

/// A device's I/O schedulers, from `/sys/block/NAME/queue/scheduler`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scheduler {
    /// The active one: "bfq", "mq-deadline", "none", ...
    pub active: String,
    /// Every one the kernel offers for the device (modules not loaded yet are missing).
    pub available: Vec<String>,
}

/// The schedulers of device `name` (e.g. "loop3").
pub fn scheduler(name: &str) -> Result<Scheduler> {
    scheduler_in(Path::new(SYS), name)
}

/// The name of the whole disk with number `dev`, via the `/sys/dev/block/MAJ:MIN` symlink; for a partition, its
/// disk (schedulers, and the cgroup counters, are per disk).
pub fn disk_of_dev(dev: DevNum) -> Result<String> {
    disk_of_dev_in(Path::new(SYS), dev)?.ok_or_else(|| DeviceError::Refused {
        device: dev.to_string(),
        reason: "no such block device in /sys/dev/block".into(),
    })
}

/// The name of the whole disk holding `path` (e.g. `vda` for a file on `/dev/vda1`).
pub fn disk_of_path(path: &Path) -> Result<String> {
    let dev = DevNum::of_path(path)?;
    disk_of_dev_in(Path::new(SYS), dev)?.ok_or_else(|| DeviceError::Refused {
        device: dev.to_string(),
        reason: format!("{} is not on a block device", path.display()),
    })
}

/// Whether v2 io.cost is enabled for `dev`: a line `MAJ:MIN enable=1 …` in `io.cost.qos` of the v2 root
/// `v2_root` (e.g. `/sys/fs/cgroup`). A missing file (v1-only host, kernel without io.cost) means no.
pub fn io_cost_enabled(v2_root: &Path, dev: DevNum) -> Result<bool> {
    let path = v2_root.join("io.cost.qos");
    match fs::read(&path) {
        Ok(bytes) => Ok(io_cost_enabled_in(&bytes, dev)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(source) => Err(DeviceError::Io { op: "read", path, source }),
    }
}

/// The disks whose settings this crate never changes: the one backing `/`, and recursively the disks under it.
/// An error when it cannot tell which disk backs `/` (callers then refuse every change).
pub fn protected_disks() -> Result<Vec<String>> {
    let mountinfo = fs::read_to_string(MOUNTINFO).map_err(|source| DeviceError::Io {
        op: "read",
        path: MOUNTINFO.into(),
        source,
    })?;
    protected_disks_in(Path::new(SYS), &mountinfo)
}

fn queue_dir(sys: &Path, name: &str) -> PathBuf {
    sys.join("block").join(name).join("queue")
}

fn scheduler_in(sys: &Path, name: &str) -> Result<Scheduler> {
    validate_name(name)?;
    let path = queue_dir(sys, name).join("scheduler");
    let bytes = fs::read(&path).map_err(|source| DeviceError::Io { op: "read", path: path.clone(), source })?;
    parse_scheduler(&bytes).ok_or_else(|| DeviceError::Parse {
        path,
        text: String::from_utf8_lossy(&bytes).into_owned(),
        reason: "expected a list with the active scheduler in brackets",
    })
}

/// `none mq-deadline kyber [bfq]` -> active `bfq`; a lone `none` (devices without a scheduler) -> `none`.
fn parse_scheduler(bytes: &[u8]) -> Option<Scheduler> {
    let text = std::str::from_utf8(bytes).ok()?;
    let mut active = None;
    let mut available = Vec::new();
    for word in text.split_whitespace() {
        match word.strip_prefix('[').and_then(|w| w.strip_suffix(']')) {
            Some(name) => {
                active = Some(name.to_owned());
                available.push(name.to_owned());
            }
            None => available.push(word.to_owned()),
        }
    }
    match active {
        Some(active) => Some(Scheduler { active, available }),
        None if available == ["none"] => Some(Scheduler { active: "none".into(), available }),
        None => None,
    }
}

fn io_cost_enabled_in(bytes: &[u8], dev: DevNum) -> bool {
    let Ok(text) = std::str::from_utf8(bytes) else { return false };
    let wanted = dev.to_string();
    text.lines().any(|line| {
        let mut fields = line.split_whitespace();
        fields.next() == Some(wanted.as_str()) && fields.any(|f| f == "enable=1")
    })
}

/// A device name as in /sys/block: one path component, nothing that could walk elsewhere.
fn validate_name(name: &str) -> Result<()> {
    let bad = |reason| DeviceError::InvalidName(InvalidName { what: "device name", value: name.into(), reason });
    if name.is_empty() || name.len() > 64 {
        return Err(bad("must be 1..=64 characters"));
    }
    if name == "." || name == ".." || name.bytes().any(|b| b == b'/' || b == 0 || b.is_ascii_whitespace()) {
        return Err(bad("must be a single /sys/block entry name"));
    }
    Ok(())
}

fn protected_disks_in(sys: &Path, mountinfo: &str) -> Result<Vec<String>> {
    let Some((dev, source)) = root_device(mountinfo) else {
        return Err(DeviceError::Refused { device: "/".into(), reason: "no mount on / in mountinfo".into() });
    };
    let mut root = disk_of_dev_in(sys, dev)?;
    if root.is_none() {
        // Anonymous device numbers (btrfs, overlayfs): fall back to the mount source if it names a device.
        if let Some(name) = source.strip_prefix("/dev/").filter(|n| validate_name(n).is_ok()) {
            root = disk_of_name(sys, name)?;
        }
    }
    let Some(root) = root else {
        return Err(DeviceError::Refused {
            device: dev.to_string(),
            reason: format!("cannot tell which block device backs / (source {source:?})"),
        });
    };
    let mut protected = vec![root];
    let mut next = 0;
    while next < protected.len() && protected.len() < 64 {
        let slaves_dir = sys.join("block").join(&protected[next]).join("slaves");
        next += 1;
        let Ok(entries) = fs::read_dir(&slaves_dir) else { continue };
        for entry in entries.flatten() {
            let Some(name) = entry.file_name().to_str().map(str::to_owned) else { continue };
            if let Some(disk) = disk_of_name(sys, &name)? {
                if !protected.contains(&disk) {
                    protected.push(disk);
                }
            }
        }
    }
    Ok(protected)
}

/// The disk of device number `dev`; `None` if sysfs has no such block device.
fn disk_of_dev_in(sys: &Path, dev: DevNum) -> Result<Option<String>> {
    disk_of_link(&sys.join("dev").join("block").join(dev.to_string()))
}

/// The disk of block device (or partition) `name`; `None` if sysfs has no such block device.
fn disk_of_name(sys: &Path, name: &str) -> Result<Option<String>> {
    disk_of_link(&sys.join("class").join("block").join(name))
}

/// Reads a sysfs link to a block device's directory (`…/devices/…/vda` or `…/vda/vda2` for a partition) and
/// returns the disk's name.
fn disk_of_link(link: &Path) -> Result<Option<String>> {
    let target = match fs::read_link(link) {
        Ok(target) => target,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(DeviceError::Io { op: "read link of", path: link.into(), source }),
    };
    let is_partition = link.join("partition").exists();
    let disk = if is_partition { target.parent() } else { Some(target.as_path()) };
    Ok(disk.and_then(Path::file_name).and_then(|n| n.to_str()).map(str::to_owned))
}

#[cfg(test)]
mod tests;

/// The devices with io.cost enabled: every `MAJ:MIN … enable=1 …` line of `io.cost.qos` in the v2 root `v2_root`.
/// A missing file (v1-only host, kernel without io.cost) means none.
pub fn io_cost_devices(v2_root: &Path) -> Result<Vec<DevNum>> {
    let path = v2_root.join("io.cost.qos");
    let bytes = match fs::read(&path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => return Err(DeviceError::Io { op: "read", path, source }),
    };
    let text = String::from_utf8_lossy(&bytes);
    Ok(text
        .lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let dev = fields.next()?.parse::<DevNum>().ok()?;
            fields.any(|f| f == "enable=1").then_some(dev)
        })
        .collect())
}
