//! Block devices: which scheduler is active, whether v2 io.cost is on, and an opt-in switch to BFQ.
//!
//! Weights only act on a device whose scheduler is BFQ (v1 and v2) or that has io.cost enabled (v2). This module
//! reports that; it never decides on its own to change a device. [`switch_to_bfq`] changes only a device the
//! operator named, and never the disk backing `/` (nor the disks under it, for device-mapper roots).

use std::fmt;
use std::fs::{self, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use super::error::{CgroupError, Result};
use super::mount::root_device;

const SYS: &str = "/sys";
const MOUNTINFO: &str = "/proc/self/mountinfo";

/// A block device number, `MAJ:MIN` as in the cgroup stat files.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DevNum {
    /// Major number.
    pub major: u32,
    /// Minor number.
    pub minor: u32,
}

impl FromStr for DevNum {
    type Err = CgroupError;

    /// Parses `8:16`.
    fn from_str(s: &str) -> Result<Self> {
        let invalid =
            || CgroupError::InvalidName { what: "device number", value: s.into(), reason: "expected MAJ:MIN" };
        let (major, minor) = s.split_once(':').ok_or_else(invalid)?;
        let num = |t: &str| t.parse::<u32>().ok().filter(|_| t.bytes().all(|b| b.is_ascii_digit()));
        Ok(Self { major: num(major).ok_or_else(invalid)?, minor: num(minor).ok_or_else(invalid)? })
    }
}

impl fmt::Display for DevNum {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.major, self.minor)
    }
}

/// The active I/O scheduler of device `name` (e.g. "loop3"): the bracketed entry of
/// `/sys/block/NAME/queue/scheduler`, such as "bfq", "mq-deadline" or "none".
pub fn scheduler(name: &str) -> Result<String> {
    scheduler_in(Path::new(SYS), name)
}

/// The name of the whole disk with number `dev`, via the `/sys/dev/block/MAJ:MIN` symlink; for a partition, its
/// disk (schedulers, and the cgroup counters, are per disk).
pub fn name_of(dev: DevNum) -> Result<String> {
    disk_of_dev(Path::new(SYS), dev)?.ok_or_else(|| CgroupError::Device {
        device: dev.to_string(),
        reason: "no such block device in /sys/dev/block".into(),
    })
}

/// Whether v2 io.cost is enabled for `dev`: a line `MAJ:MIN enable=1 …` in `io.cost.qos` of the v2 root
/// `v2_root` (e.g. `/sys/fs/cgroup`). A missing file (v1-only host, kernel without io.cost) means no.
pub fn io_cost_enabled(v2_root: &Path, dev: DevNum) -> Result<bool> {
    let path = v2_root.join("io.cost.qos");
    match fs::read(&path) {
        Ok(bytes) => Ok(io_cost_enabled_in(&bytes, dev)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(source) => Err(CgroupError::Io { op: "read", path, source }),
    }
}

/// Makes BFQ the scheduler of device `name`, and checks that it took.
///
/// Refuses (with an error naming the device) a device that is not literally in `allowed` (the operator's list),
/// and the disk backing `/` (and, when `/` is on device-mapper or md, the disks under it); if it cannot tell
/// which disk backs `/` (e.g. `/` on btrfs or overlayfs with no `/dev/…` source), it refuses every device.
pub fn switch_to_bfq(name: &str, allowed: &[String]) -> Result<()> {
    let mountinfo = fs::read_to_string(MOUNTINFO).map_err(|source| CgroupError::Io {
        op: "read",
        path: MOUNTINFO.into(),
        source,
    })?;
    switch_to_bfq_in(Path::new(SYS), &mountinfo, name, allowed)
}

fn switch_to_bfq_in(sys: &Path, mountinfo: &str, name: &str, allowed: &[String]) -> Result<()> {
    validate_name(name)?;
    let refuse = |reason: String| CgroupError::Device { device: name.into(), reason };
    if !allowed.iter().any(|a| a == name) {
        return Err(refuse("not in the list of devices the operator allowed to switch".into()));
    }
    let protected = protected_disks(sys, mountinfo).map_err(|e| refuse(format!("refusing: {e}")))?;
    if protected.iter().any(|p| p == name) {
        return Err(refuse(format!("backs the root filesystem (protected: {protected:?})")));
    }
    let path = scheduler_path(sys, name);
    let current = scheduler_in(sys, name)?;
    if current == "bfq" {
        return Ok(());
    }
    let data = "bfq";
    let mut file = OpenOptions::new()
        .write(true)
        .create(false)
        .truncate(true)
        .open(&path)
        .map_err(|source| CgroupError::Io { op: "open", path: path.clone(), source })?;
    file.write_all(data.as_bytes()).map_err(|source| CgroupError::Write {
        path: path.clone(),
        data: data.into(),
        source,
    })?;
    let now = scheduler_in(sys, name)?;
    if now != "bfq" {
        return Err(refuse(format!("wrote \"bfq\" to {} but the active scheduler is {now:?}", path.display())));
    }
    tracing::info!(device = name, previous = %current, "switched scheduler to bfq");
    Ok(())
}

fn scheduler_path(sys: &Path, name: &str) -> PathBuf {
    sys.join("block").join(name).join("queue").join("scheduler")
}

fn scheduler_in(sys: &Path, name: &str) -> Result<String> {
    validate_name(name)?;
    let path = scheduler_path(sys, name);
    let bytes = fs::read(&path).map_err(|source| CgroupError::Io { op: "read", path: path.clone(), source })?;
    parse_scheduler(&bytes)
        .map(str::to_owned)
        .ok_or_else(|| CgroupError::parse(&path, 1, &bytes, "expected a list with the active scheduler in brackets"))
}

/// `none mq-deadline kyber [bfq]` -> `bfq`; a lone `none` (devices without a scheduler) -> `none`.
fn parse_scheduler(bytes: &[u8]) -> Option<&str> {
    let text = std::str::from_utf8(bytes).ok()?;
    let mut words = text.split_whitespace();
    if let Some(active) = text.split_whitespace().find_map(|w| w.strip_prefix('[')?.strip_suffix(']')) {
        return Some(active);
    }
    match (words.next(), words.next()) {
        (Some("none"), None) => Some("none"),
        _ => None,
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
    let bad = |reason| CgroupError::InvalidName { what: "device name", value: name.into(), reason };
    if name.is_empty() || name.len() > 64 {
        return Err(bad("must be 1..=64 characters"));
    }
    if name == "." || name == ".." || name.bytes().any(|b| b == b'/' || b == 0 || b.is_ascii_whitespace()) {
        return Err(bad("must be a single /sys/block entry name"));
    }
    Ok(())
}

/// The disks whose scheduler must not be touched: the one backing `/`, and recursively the disks under it
/// (`/sys/block/NAME/slaves`) when it is a device-mapper or md device.
fn protected_disks(sys: &Path, mountinfo: &str) -> Result<Vec<String>> {
    let Some((major, minor, source)) = root_device(mountinfo) else {
        return Err(CgroupError::Device { device: "/".into(), reason: "no mount on / in mountinfo".into() });
    };
    let dev = DevNum { major, minor };
    let mut root = disk_of_dev(sys, dev)?;
    if root.is_none() {
        // Anonymous device numbers (btrfs, overlayfs): fall back to the mount source if it names a device.
        if let Some(name) = source.strip_prefix("/dev/").filter(|n| validate_name(n).is_ok()) {
            root = disk_of_name(sys, name)?;
        }
    }
    let Some(root) = root else {
        return Err(CgroupError::Device {
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
fn disk_of_dev(sys: &Path, dev: DevNum) -> Result<Option<String>> {
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
        Err(source) => return Err(CgroupError::Io { op: "read link of", path: link.into(), source }),
    };
    let is_partition = link.join("partition").exists();
    let disk = if is_partition { target.parent() } else { Some(target.as_path()) };
    Ok(disk.and_then(Path::file_name).and_then(|n| n.to_str()).map(str::to_owned))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    /// A fake /sys: vda (254:0) with partition vda2 (254:2), loop3 (7:3), dm-0 (253:0) over vda2.
    fn fake_sys() -> tempfile::TempDir {
        let tmp = tempfile::tempdir().unwrap();
        let sys = tmp.path();
        for (name, sched) in
            [("vda", "[mq-deadline] kyber bfq none\n"), ("loop3", "[none] mq-deadline kyber bfq\n"), ("dm-0", "none\n")]
        {
            fs::create_dir_all(sys.join("devices/block").join(name).join("queue")).unwrap();
            fs::write(sys.join("devices/block").join(name).join("queue/scheduler"), sched).unwrap();
        }
        fs::create_dir_all(sys.join("devices/block/vda/vda2")).unwrap();
        fs::write(sys.join("devices/block/vda/vda2/partition"), "2\n").unwrap();
        fs::create_dir_all(sys.join("devices/block/dm-0/slaves")).unwrap();
        symlink("../../vda/vda2", sys.join("devices/block/dm-0/slaves/vda2")).unwrap();
        for dir in ["block", "dev/block", "class/block"] {
            fs::create_dir_all(sys.join(dir)).unwrap();
        }
        for (name, target, num) in [
            ("vda", "vda", "254:0"),
            ("vda2", "vda/vda2", "254:2"),
            ("loop3", "loop3", "7:3"),
            ("dm-0", "dm-0", "253:0"),
        ] {
            if !target.contains('/') {
                symlink(format!("../devices/block/{target}"), sys.join("block").join(name)).unwrap();
            }
            symlink(format!("../../devices/block/{target}"), sys.join("dev/block").join(num)).unwrap();
            symlink(format!("../../devices/block/{target}"), sys.join("class/block").join(name)).unwrap();
        }
        tmp
    }

    const ROOT_ON_VDA: &str = "27 1 254:0 / / rw,relatime - ext4 /dev/vda rw\n";
    const ROOT_ON_VDA2: &str = "27 1 254:2 / / rw,relatime - ext4 /dev/vda2 rw\n";
    const ROOT_ON_DM: &str = "27 1 253:0 / / rw,relatime - ext4 /dev/mapper/root rw\n";
    const ROOT_ON_BTRFS: &str = "27 1 0:31 / / rw,relatime - btrfs /dev/vda2 rw\n";
    const ROOT_ON_OVERLAY: &str = "27 1 0:31 / / rw,relatime - overlay overlay rw\n";

    fn allowed(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn schedulers() {
        let sys = fake_sys();
        assert_eq!(scheduler_in(sys.path(), "vda").unwrap(), "mq-deadline");
        assert_eq!(scheduler_in(sys.path(), "loop3").unwrap(), "none");
        assert_eq!(scheduler_in(sys.path(), "dm-0").unwrap(), "none");
        assert!(matches!(scheduler_in(sys.path(), "sdz").unwrap_err(), CgroupError::Io { .. }));
        assert!(matches!(scheduler_in(sys.path(), "../vda").unwrap_err(), CgroupError::InvalidName { .. }));
        assert_eq!(parse_scheduler(b"mq-deadline bfq\n"), None);
        assert_eq!(parse_scheduler(b"\xff"), None);
    }

    #[test]
    fn names_of_device_numbers() {
        let sys = fake_sys();
        assert_eq!(disk_of_dev(sys.path(), "254:0".parse().unwrap()).unwrap().as_deref(), Some("vda"));
        assert_eq!(disk_of_dev(sys.path(), "254:2".parse().unwrap()).unwrap().as_deref(), Some("vda"));
        assert_eq!(disk_of_dev(sys.path(), "7:3".parse().unwrap()).unwrap().as_deref(), Some("loop3"));
        assert_eq!(disk_of_dev(sys.path(), "8:0".parse().unwrap()).unwrap(), None);
        assert!("8".parse::<DevNum>().is_err());
        assert!("8:-1".parse::<DevNum>().is_err());
        assert!("+8:1".parse::<DevNum>().is_err());
        assert_eq!("8:16".parse::<DevNum>().unwrap(), DevNum { major: 8, minor: 16 });
    }

    #[test]
    fn switch_only_named_non_root_devices() {
        let sys = fake_sys();
        let err = switch_to_bfq_in(sys.path(), ROOT_ON_VDA, "loop3", &allowed(&["loop4"])).unwrap_err();
        assert!(matches!(err, CgroupError::Device { ref device, .. } if device == "loop3"), "{err}");
        assert_eq!(scheduler_in(sys.path(), "loop3").unwrap(), "none", "refused switch must not write");

        for mountinfo in [ROOT_ON_VDA, ROOT_ON_VDA2, ROOT_ON_DM, ROOT_ON_BTRFS] {
            let err = switch_to_bfq_in(sys.path(), mountinfo, "vda", &allowed(&["vda"])).unwrap_err();
            assert!(err.to_string().contains("device vda: backs the root filesystem"), "{mountinfo}: {err}");
        }
        let err = switch_to_bfq_in(sys.path(), ROOT_ON_DM, "dm-0", &allowed(&["dm-0"])).unwrap_err();
        assert!(err.to_string().contains("backs the root"), "{err}");
        let err = switch_to_bfq_in(sys.path(), ROOT_ON_OVERLAY, "loop3", &allowed(&["loop3"])).unwrap_err();
        assert!(err.to_string().contains("cannot tell which block device backs /"), "{err}");
        assert_eq!(
            fs::read_to_string(sys.path().join("block/vda/queue/scheduler")).unwrap(),
            "[mq-deadline] kyber bfq none\n"
        );

        // An allowed device is written; a regular file does not turn "bfq" into a bracketed list, so the
        // read-back check fails, which is the point.
        let err = switch_to_bfq_in(sys.path(), ROOT_ON_VDA, "loop3", &allowed(&["loop3"])).unwrap_err();
        assert!(matches!(err, CgroupError::Parse { .. }), "{err}");
        assert_eq!(fs::read_to_string(sys.path().join("block/loop3/queue/scheduler")).unwrap(), "bfq");
        fs::write(sys.path().join("block/loop3/queue/scheduler"), "none [bfq]\n").unwrap();
        switch_to_bfq_in(sys.path(), ROOT_ON_VDA, "loop3", &allowed(&["loop3"])).unwrap();
    }

    #[test]
    fn io_cost_lines() {
        let text = b"8:16 enable=1 ctrl=auto rpct=0.00 rlat=250000\n8:0 enable=0 ctrl=auto\n";
        assert!(io_cost_enabled_in(text, DevNum { major: 8, minor: 16 }));
        assert!(!io_cost_enabled_in(text, DevNum { major: 8, minor: 0 }));
        assert!(!io_cost_enabled_in(text, DevNum { major: 8, minor: 1 }));
        let tmp = tempfile::tempdir().unwrap();
        assert!(!io_cost_enabled(tmp.path(), DevNum { major: 8, minor: 16 }).unwrap());
        fs::write(tmp.path().join("io.cost.qos"), text).unwrap();
        assert!(io_cost_enabled(tmp.path(), DevNum { major: 8, minor: 16 }).unwrap());
    }
}
