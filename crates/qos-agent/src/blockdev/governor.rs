//! Which cgroup-v2 weight governs each block device, cached in a [`DeviceTable`].
//!
//! On v2 two weight files exist in every cgroup and each acts on some devices only: `io.bfq.weight` on devices
//! whose scheduler is BFQ, `io.weight` on devices with io.cost enabled (`MAJ:MIN enable=1` in the root's
//! `io.cost.qos`). Both may hold for one device; on a device with neither, no weight acts at all. The facts are
//! two sysfs/cgroupfs reads per device, so the table keeps them and re-reads a device only when its entry is older
//! than [`DeviceTable::max_age`] at the time it is asked, or when the caller says a read-back disagreed
//! ([`DeviceTable::refresh`]): weight writes are rare, and never per container per sampling round.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::{disk_of_dev_in, io_cost_enabled_in, scheduler_in, DevNum, DeviceError, Result, SYS};

/// How long a device's facts are trusted before they are read again at the next weight write.
pub const DEFAULT_MAX_AGE: Duration = Duration::from_secs(5);

/// What makes cgroup weights act on one device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Governor {
    /// The scheduler is BFQ: `io.bfq.weight` (1..=1000) acts.
    pub bfq: bool,
    /// io.cost is enabled for the device: `io.weight` (1..=10000) acts.
    pub io_cost: bool,
}

impl Governor {
    /// Neither BFQ nor io.cost: no cgroup weight acts on the device.
    pub const NONE: Self = Self { bfq: false, io_cost: false };

    /// Whether any weight acts.
    pub fn is_effective(self) -> bool {
        self.bfq || self.io_cost
    }

    /// `bfq`, `io-cost`, `bfq+io-cost` or `none`: the metric label and the status column.
    pub fn as_str(self) -> &'static str {
        match (self.bfq, self.io_cost) {
            (true, true) => "bfq+io-cost",
            (true, false) => "bfq",
            (false, true) => "io-cost",
            (false, false) => "none",
        }
    }
}

impl fmt::Display for Governor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One row of the device table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceFacts {
    /// The device number, as in `io.stat` and the weight files.
    pub dev: DevNum,
    /// Its disk's name in /sys/block; `None` if sysfs has no such device (then nothing governs it).
    pub disk: Option<String>,
    /// The active scheduler; `None` when it could not be read.
    pub scheduler: Option<String>,
    /// What acts on it.
    pub governor: Governor,
    /// Why the facts may be incomplete (a read that failed), for the log and status.
    pub error: Option<String>,
    /// When the facts were read.
    pub checked: Instant,
}

impl DeviceFacts {
    /// The fix for a device no weight acts on, for warnings and status.
    pub fn fix(&self) -> String {
        let name = self.disk.as_deref().unwrap_or("DEV");
        format!(
            "{}, or enable io.cost for it with a model measured from the device: `ddiskqos-agent iocost /dev/{name} \
             --apply` (writes its io.cost.model and \"{} enable=1 ...\" into /sys/fs/cgroup/io.cost.qos)",
            self.fix_bfq(),
            self.dev
        )
    }

    /// The fix that BFQ brings, the only one on cgroup v1 (which has no io.cost).
    pub fn fix_bfq(&self) -> String {
        let name = self.disk.as_deref().unwrap_or("DEV");
        format!("`echo bfq > /sys/block/{name}/queue/scheduler` (or [devices] switch_to_bfq = [\"{name}\"])")
    }
}

/// The governing facts of every device the agent has looked at, read from a (possibly fake) `/sys` and the v2
/// root's `io.cost.qos`.
#[derive(Debug, Clone)]
pub struct DeviceTable {
    sys: PathBuf,
    v2_root: PathBuf,
    io_cost_qos: PathBuf,
    max_age: Duration,
    devices: BTreeMap<DevNum, DeviceFacts>,
}

impl DeviceTable {
    /// A table over the real `/sys`; `v2_root` is the cgroup2 mount (its `io.cost.qos` is read).
    pub fn new(v2_root: &Path) -> Self {
        Self::with_sys(Path::new(SYS), v2_root)
    }

    /// A table over a fixture `/sys` and v2 root.
    pub fn with_sys(sys: &Path, v2_root: &Path) -> Self {
        Self {
            sys: sys.to_owned(),
            v2_root: v2_root.to_owned(),
            io_cost_qos: v2_root.join("io.cost.qos"),
            max_age: DEFAULT_MAX_AGE,
            devices: BTreeMap::new(),
        }
    }

    /// Sets how long facts are trusted.
    pub fn with_max_age(mut self, max_age: Duration) -> Self {
        self.max_age = max_age;
        self
    }

    /// The cgroup2 root whose `io.cost.qos` (and `io.stat`) the table reads.
    pub fn v2_root(&self) -> &Path {
        &self.v2_root
    }

    /// How long facts are trusted.
    pub fn max_age(&self) -> Duration {
        self.max_age
    }

    /// The facts of `dev`, read again if they are older than [`DeviceTable::max_age`] at `now`. The second value
    /// is the governor the device had before, when this call changed it (or first saw the device: `None` inside).
    pub fn get(&mut self, dev: DevNum, now: Instant) -> (&DeviceFacts, Option<Option<Governor>>) {
        let stale = self.devices.get(&dev).is_none_or(|f| now.saturating_duration_since(f.checked) >= self.max_age);
        if stale {
            return self.refresh(dev, now);
        }
        (&self.devices[&dev], None)
    }

    /// Reads the facts of `dev` again now (a read-back disagreed, or they are stale); returns them and, when the
    /// governor changed or the device is new, the one before.
    pub fn refresh(&mut self, dev: DevNum, now: Instant) -> (&DeviceFacts, Option<Option<Governor>>) {
        let facts = self.read_facts(dev, now);
        let before = self.devices.get(&dev).map(|f| f.governor);
        let changed = (before != Some(facts.governor)).then_some(before);
        self.devices.insert(dev, facts);
        (&self.devices[&dev], changed)
    }

    /// The device number of a disk named in the config (`/sys/block/NAME/dev`).
    pub fn dev_of_name(&self, name: &str) -> Result<DevNum> {
        super::validate_name(name)?;
        let path = self.sys.join("block").join(name).join("dev");
        let text = std::fs::read_to_string(&path).map_err(|source| DeviceError::Io {
            op: "read",
            path: path.clone(),
            source,
        })?;
        text.trim().parse().map_err(|_| DeviceError::Parse { path, text, reason: "expected MAJ:MIN" })
    }

    /// Every device looked at so far, by device number (for status).
    pub fn snapshot(&self) -> Vec<DeviceFacts> {
        self.devices.values().cloned().collect()
    }

    fn read_facts(&self, dev: DevNum, now: Instant) -> DeviceFacts {
        let mut errors = Vec::new();
        let disk = match disk_of_dev_in(&self.sys, dev) {
            Ok(disk) => disk,
            Err(e) => {
                errors.push(e.to_string());
                None
            }
        };
        let scheduler = disk.as_deref().and_then(|name| match scheduler_in(&self.sys, name) {
            Ok(s) => Some(s.active),
            Err(e) => {
                errors.push(e.to_string());
                None
            }
        });
        let io_cost = match std::fs::read(&self.io_cost_qos) {
            Ok(bytes) => io_cost_enabled_in(&bytes, dev),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
            Err(e) => {
                errors.push(format!("cannot read {}: {e}", self.io_cost_qos.display()));
                false
            }
        };
        if disk.is_none() && errors.is_empty() {
            errors.push(format!("no block device {dev} in {}", self.sys.join("dev/block").display()));
        }
        let governor = Governor { bfq: scheduler.as_deref() == Some("bfq"), io_cost };
        DeviceFacts {
            dev,
            disk,
            scheduler,
            governor,
            error: (!errors.is_empty()).then(|| errors.join("; ")),
            checked: now,
        }
    }
}
