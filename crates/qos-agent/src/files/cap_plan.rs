//! The throughput cap's files: which throttle file holds a cgroup's byte-rate limits on each hierarchy, how they
//! read, the lines that set a [`Cap`] or put back what was there before, and the check of the files read back.
//! Pure: file contents and device numbers in; limits, lines and mismatches out. No I/O: the writer
//! ([`super::FileWriter::write_cap`]) reads and writes the files.
//!
//! The kernel's files (blk-throttle):
//! - cgroup v1: [`V1_READ_BPS`] and [`V1_WRITE_BPS`] read as lines `MAJ:MIN BYTES`, one per device with a limit
//!   (a device without one is not listed; an empty file: no limit anywhere). Writing `MAJ:MIN BYTES` sets one
//!   device's limit, `MAJ:MIN 0` removes it (also where there is none). Checked on Linux 6.18: the file reads
//!   `7:1 1048576\n` after `7:1 1048576`, and nothing after `7:1 0`; `max` and `-1` are refused (EINVAL); a device
//!   that does not exist is refused with ENODEV; `18446744073709551615` (u64::MAX, the kernel's "no limit") is
//!   accepted and removes the limit.
//! - cgroup v2: [`V2_IO_MAX`] reads as lines `MAJ:MIN rbps=N wbps=N riops=N wiops=N`, each `N` a number or `max`,
//!   one per device with some limit. Writing `MAJ:MIN rbps=N` changes only the keys written, `rbps=max` removes
//!   that limit; `rbps=0` is refused (ERANGE). From the kernel's documentation (cgroup-v2.rst, "IO Interface
//!   Files") and `tg_set_limit`; checked on Linux 6.12 in the Debian 13 guest (`v2_real`: `7:0 rbps=4194304
//!   wbps=2097152 riops=max wiops=max` after a cap, the line gone after the lift).
//!
//! The rule: a cap never loosens a limit the container had before the agent first capped it (the *snapshot*): on
//! each device and direction the limit written is the lower of the snapshot's and the cap's (the snapshot's alone
//! where the cap leaves that direction alone); where the file already holds that, nothing is written. Lifting
//! the cap puts the snapshot back: its limits, and no limit where it had none. Computed against the snapshot, not
//! the file as it is now, so a later, looser cap does loosen the agent's own earlier cap.
//!
//! A limit someone else sets while the cap is in force (`docker update --device-read-bps`, a unit's
//! `IOReadBandwidthMax=`, both of which write the throttle files) is that someone's latest word: before each cap
//! and each lift the files are read, and a device's limit that is neither the snapshot's nor one the agent may
//! have left there becomes the snapshot's ([`adopt`]). So a lift leaves it in place, and a cap written after it is
//! never looser than it. (A new limit equal to the agent's own value cannot be told from it, and is put back to
//! the snapshot's at the lift.)

use std::collections::BTreeMap;
use std::path::Path;

use qos_core::Cap;

use crate::cgroup::{CgroupError, CgroupVersion};
use crate::kernel::DevNum;

/// v1 read byte-rate limits: `MAJ:MIN BYTES` lines.
pub const V1_READ_BPS: &str = "blkio.throttle.read_bps_device";
/// v1 write byte-rate limits: `MAJ:MIN BYTES` lines.
pub const V1_WRITE_BPS: &str = "blkio.throttle.write_bps_device";
/// v2 limits: `MAJ:MIN rbps=N wbps=N riops=N wiops=N` lines.
pub const V2_IO_MAX: &str = "io.max";

/// The kernel's "no limit" (what v1 never lists and v2 shows as `max`).
const NO_LIMIT: u64 = u64::MAX;

/// A direction of I/O.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Direction {
    /// Reads.
    Read,
    /// Writes.
    Write,
}

impl Direction {
    /// Both, reads first.
    pub const BOTH: [Direction; 2] = [Direction::Read, Direction::Write];

    /// The v1 file holding this direction's limits.
    pub fn v1_file(self) -> &'static str {
        match self {
            Self::Read => V1_READ_BPS,
            Self::Write => V1_WRITE_BPS,
        }
    }

    /// Its key in v2's `io.max`: `rbps` or `wbps`.
    pub fn v2_key(self) -> &'static str {
        match self {
            Self::Read => "rbps",
            Self::Write => "wbps",
        }
    }

    /// The file holding this direction's limits on hierarchy `version`.
    pub fn file(self, version: CgroupVersion) -> &'static str {
        match version {
            CgroupVersion::V1 => self.v1_file(),
            CgroupVersion::V2 => V2_IO_MAX,
        }
    }

    /// This direction of a cap or of a device's limits.
    pub fn of(self, limits: &Limits) -> Option<u64> {
        match self {
            Self::Read => limits.read_bps,
            Self::Write => limits.write_bps,
        }
    }

    fn set(self, limits: &mut Limits, value: Option<u64>) {
        match self {
            Self::Read => limits.read_bps = value,
            Self::Write => limits.write_bps = value,
        }
    }
}

/// One device's byte-rate limits in bytes per second (`None`: no limit): the same two numbers as a [`Cap`].
pub type Limits = Cap;

/// A cgroup's byte-rate limits by device, as its throttle files hold them (devices without a limit absent).
pub type DeviceLimits = BTreeMap<DevNum, Limits>;

/// The files holding the byte-rate limits on hierarchy `version`, in the order they are read and written.
pub fn files(version: CgroupVersion) -> &'static [&'static str] {
    match version {
        CgroupVersion::V1 => &[V1_READ_BPS, V1_WRITE_BPS],
        CgroupVersion::V2 => &[V2_IO_MAX],
    }
}

/// Parses a v1 `blkio.throttle.*_bps_device` file (`file` names it in errors): its `MAJ:MIN BYTES` lines.
/// A limit of u64::MAX (the kernel's "none", never listed by it) counts as none.
pub fn parse_v1(file: &Path, bytes: &[u8]) -> Result<BTreeMap<DevNum, u64>, CgroupError> {
    let mut out = BTreeMap::new();
    for (index, line) in bytes.split(|b| *b == b'\n').enumerate() {
        let err = |reason: &str| CgroupError::parse(file, index + 1, line, reason);
        let mut fields = line.split(u8::is_ascii_whitespace).filter(|f| !f.is_empty());
        let (dev, value) = match (fields.next(), fields.next(), fields.next()) {
            (None, ..) => continue,
            (Some(dev), Some(value), None) => (dev, value),
            _ => return Err(err("expected \"MAJ:MIN BYTES\"")),
        };
        let dev = parse_dev(dev).ok_or_else(|| err("bad device number"))?;
        let value = parse_u64(value).ok_or_else(|| err("bad byte rate"))?;
        if value == 0 {
            return Err(err("a listed limit of 0"));
        }
        if value != NO_LIMIT && out.insert(dev, value).is_some() {
            return Err(err("second line for the same device"));
        }
    }
    Ok(out)
}

/// Parses a v2 `io.max` file (`file` names it in errors): `rbps` and `wbps` of each listed device (`max`: no
/// limit). The IOPS keys (`riops`, `wiops`) are checked for form and not kept; another `key=value` is skipped (a
/// later kernel may add one).
pub fn parse_v2(file: &Path, bytes: &[u8]) -> Result<DeviceLimits, CgroupError> {
    let mut out = DeviceLimits::new();
    for (index, line) in bytes.split(|b| *b == b'\n').enumerate() {
        let err = |reason: &str| CgroupError::parse(file, index + 1, line, reason);
        let mut fields = line.split(u8::is_ascii_whitespace).filter(|f| !f.is_empty());
        let Some(dev) = fields.next() else { continue };
        let dev = parse_dev(dev).ok_or_else(|| err("expected \"MAJ:MIN rbps=N wbps=N riops=N wiops=N\""))?;
        let mut limits = Limits::default();
        for field in fields {
            let Some(eq) = field.iter().position(|b| *b == b'=') else {
                return Err(err("expected key=value after the device"));
            };
            let (key, value) = (&field[..eq], &field[eq + 1..]);
            let value = match value {
                b"max" => None,
                v => match parse_u64(v) {
                    Some(0) => return Err(err("a limit of 0")),
                    Some(NO_LIMIT) => None,
                    Some(n) => Some(n),
                    None => return Err(err("bad limit: expected a number or max")),
                },
            };
            match key {
                b"rbps" => limits.read_bps = value,
                b"wbps" => limits.write_bps = value,
                _ => {}
            }
        }
        if out.insert(dev, limits).is_some() {
            return Err(err("second line for the same device"));
        }
    }
    Ok(out)
}

/// The limits of v1's two files taken together.
pub fn join_v1(read: &BTreeMap<DevNum, u64>, write: &BTreeMap<DevNum, u64>) -> DeviceLimits {
    let mut out = DeviceLimits::new();
    for (dev, v) in read {
        out.entry(*dev).or_default().read_bps = Some(*v);
    }
    for (dev, v) in write {
        out.entry(*dev).or_default().write_bps = Some(*v);
    }
    out
}

/// The limits `cap` leaves on each device of `devices` (the devices it covers) and of `before` (the snapshot):
/// on a device it covers, per direction, the lower of the snapshot's limit and the cap's (the snapshot's where the
/// cap leaves the direction alone); on a snapshot device it no longer covers, and everywhere when `cap` is `None`
/// (a lift), the snapshot's. Every device of the result is to be checked, also one that ends with no limit.
///
/// A cap of 0 bytes/s cannot be written (v1 reads 0 as "remove the limit", v2 refuses it): [`ZeroCap`].
pub fn targets(
    devices: impl IntoIterator<Item = DevNum>,
    before: &DeviceLimits,
    cap: Option<Cap>,
) -> Result<DeviceLimits, ZeroCap> {
    let mut out: DeviceLimits = before.clone();
    let Some(cap) = cap else { return Ok(out) };
    for dir in Direction::BOTH {
        if dir.of(&cap) == Some(0) {
            return Err(ZeroCap(dir));
        }
    }
    for dev in devices {
        let was = before.get(&dev).copied().unwrap_or_default();
        let mut limits = Limits::default();
        for dir in Direction::BOTH {
            let value = match (dir.of(&was), dir.of(&cap)) {
                (Some(w), Some(c)) => Some(w.min(c)),
                (w, c) => w.or(c),
            };
            dir.set(&mut limits, value);
        }
        out.insert(dev, limits);
    }
    Ok(out)
}

/// A cap of 0 bytes/s in direction `.0`, which no throttle file can hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ZeroCap(pub Direction);

/// One write to a throttle file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Line {
    /// v1: `MAJ:MIN BYTES` into the direction's file, or with `None` `MAJ:MIN 0` (removes the limit).
    V1(Direction, DevNum, Option<u64>),
    /// v2: `MAJ:MIN key=value...` into `io.max`, only the keys given (`None`: `max`, removes that limit).
    V2(DevNum, Vec<(Direction, Option<u64>)>),
}

impl Line {
    /// The file the line goes to.
    pub fn file_name(&self) -> &'static str {
        match self {
            Self::V1(dir, ..) => dir.v1_file(),
            Self::V2(..) => V2_IO_MAX,
        }
    }

    /// The device the line is about.
    pub fn dev(&self) -> DevNum {
        match self {
            Self::V1(_, dev, _) | Self::V2(dev, _) => *dev,
        }
    }

    /// Exactly what is written (one `write(2)`).
    pub fn text(&self) -> String {
        match self {
            Self::V1(_, dev, value) => format!("{dev} {}\n", value.unwrap_or(0)),
            Self::V2(dev, keys) => {
                let mut text = dev.to_string();
                for (dir, value) in keys {
                    match value {
                        Some(v) => text.push_str(&format!(" {}={v}", dir.v2_key())),
                        None => text.push_str(&format!(" {}=max", dir.v2_key())),
                    }
                }
                text.push('\n');
                text
            }
        }
    }
}

/// The lines that turn the files holding `now` into `target` on the devices of `target` (other devices are left
/// alone): one per device and direction that differs (v2: one per device, with the keys that differ), device by
/// device, reads before writes.
pub fn write_lines(version: CgroupVersion, target: &DeviceLimits, now: &DeviceLimits) -> Vec<Line> {
    let mut lines = Vec::new();
    for (dev, want) in target {
        let have = now.get(dev).copied().unwrap_or_default();
        let changed: Vec<(Direction, Option<u64>)> =
            Direction::BOTH.into_iter().filter(|d| d.of(want) != d.of(&have)).map(|d| (d, d.of(want))).collect();
        if changed.is_empty() {
            continue;
        }
        match version {
            CgroupVersion::V1 => lines.extend(changed.into_iter().map(|(d, v)| Line::V1(d, *dev, v))),
            CgroupVersion::V2 => lines.push(Line::V2(*dev, changed)),
        }
    }
    lines
}

/// What a throttle file read back that it should not have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CapMismatch {
    /// The device.
    pub dev: DevNum,
    /// The direction (and so, on v1, the file).
    pub dir: Direction,
    /// The limit wanted (`None`: no limit).
    pub wanted: Option<u64>,
    /// The limit read (`None`: no limit).
    pub read: Option<u64>,
}

/// Checks the files as read back (`back`) against `target` on every device of `target`: the first disagreement,
/// by device number, reads first.
pub fn check(target: &DeviceLimits, back: &DeviceLimits) -> Result<(), CapMismatch> {
    for (dev, want) in target {
        let have = back.get(dev).copied().unwrap_or_default();
        for dir in Direction::BOTH {
            if dir.of(want) != dir.of(&have) {
                return Err(CapMismatch { dev: *dev, dir, wanted: dir.of(want), read: dir.of(&have) });
            }
        }
    }
    Ok(())
}

/// Takes into `before` (a snapshot) the limits someone else set since the agent wrote: on each device of `before`
/// that some map of `ours` (the limits the agent may have left in the files) lists, each direction whose limit in
/// `now` (the files as read) is neither `before`'s nor one of `ours`' becomes `before`'s. A device no map of
/// `ours` lists is left alone (nothing known of what the agent left there: an older agent's record, a device whose
/// write was skipped). Returns what was taken in: device, direction and the new limit, by device, reads first.
pub fn adopt(
    before: &mut DeviceLimits,
    ours: &[&DeviceLimits],
    now: &DeviceLimits,
) -> Vec<(DevNum, Direction, Option<u64>)> {
    let mut taken = Vec::new();
    for (dev, was) in before.iter_mut() {
        let mine: Vec<Limits> = ours.iter().filter_map(|o| o.get(dev).copied()).collect();
        if mine.is_empty() {
            continue;
        }
        let have = now.get(dev).copied().unwrap_or_default();
        for dir in Direction::BOTH {
            let value = dir.of(&have);
            if value != dir.of(was) && mine.iter().all(|m| dir.of(m) != value) {
                dir.set(was, value);
                taken.push((*dev, dir, value));
            }
        }
    }
    taken
}

/// `devices`' entries in `limits` (a device without one: no limit), for a snapshot.
pub fn select(limits: &DeviceLimits, devices: impl IntoIterator<Item = DevNum>) -> DeviceLimits {
    devices.into_iter().map(|d| (d, limits.get(&d).copied().unwrap_or_default())).collect()
}

fn parse_dev(field: &[u8]) -> Option<DevNum> {
    std::str::from_utf8(field).ok()?.parse().ok()
}

fn parse_u64(field: &[u8]) -> Option<u64> {
    std::str::from_utf8(field).ok().filter(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))?.parse().ok()
}

#[cfg(test)]
mod tests;
