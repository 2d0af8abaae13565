//! [`V2Plan`]: on cgroup v2, which weight file acts on which device and what to write to set or restore a weight.
//! Pure: device facts and file contents in; lines to write, values expected and mismatches out. No I/O, so the
//! writer ([`super::FileWriter`]) and the bench's weight probe share one rule.
//!
//! The kernel's rule (Linux 6.x): `io.bfq.weight` acts on a device whose scheduler is BFQ, `io.weight` on a device
//! with io.cost enabled (both may hold); on a device with neither no weight acts. In each file a `MAJ:MIN N` line
//! overrides the `default N` line on that device. Writing `default N` sets the default and leaves the overrides
//! alone, `MAJ:MIN N` sets an override, `MAJ:MIN default` removes one (checked on Linux 6.18).

use std::collections::BTreeSet;

use qos_core::Weight;

use crate::backend::DeviceWeight;
use crate::blockdev::Governor;
use crate::cgroup::{WeightFileKind, WeightLines};
use crate::kernel::DevNum;

/// The two v2 weight files, `io.weight` first: a check that fails on both names io.cost (which Docker never
/// writes) rather than a BFQ override.
pub const V2_FILES: [WeightFileKind; 2] = [WeightFileKind::V2Io, WeightFileKind::V2Bfq];

/// One line to write into a v2 weight file, on the file's own scale.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Line {
    /// `default N`.
    Default(u32),
    /// `MAJ:MIN N`, or with `None` `MAJ:MIN default` (removes the override).
    Device(DevNum, Option<u32>),
}

/// What a file read back that it should not have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mismatch {
    /// The device whose effective value is wrong; `None`: the `default` line (no device governed by the file).
    pub dev: Option<DevNum>,
    /// The value wanted.
    pub wrote: u32,
    /// The value read.
    pub read: u32,
    /// The device's value came from its `MAJ:MIN` override rather than the default.
    pub from_override: bool,
}

impl Mismatch {
    /// Which line of the file held the wrong value, for error messages.
    pub fn what(&self) -> &'static str {
        if self.from_override {
            "its MAJ:MIN override"
        } else {
            "the default"
        }
    }
}

/// Whether `kind` acts on a device with governor `g`.
pub fn governs(g: Governor, kind: WeightFileKind) -> bool {
    match kind {
        WeightFileKind::V2Bfq => g.bfq,
        WeightFileKind::V2Io => g.io_cost,
        _ => false,
    }
}

/// The devices of one cgroup's weight write and what governs each.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct V2Plan {
    /// Every device of the write, by device number, with its governor ([`Governor::NONE`] included).
    devices: Vec<(DevNum, Governor)>,
}

impl V2Plan {
    /// A plan over these devices (a device named twice counts once, with its first governor).
    pub fn new(devices: impl IntoIterator<Item = (DevNum, Governor)>) -> Self {
        let mut seen = BTreeSet::new();
        let mut devices: Vec<_> = devices.into_iter().filter(|(d, _)| seen.insert(*d)).collect();
        devices.sort_by_key(|(d, _)| *d);
        Self { devices }
    }

    /// Every device and its governor, by device number.
    pub fn devices(&self) -> &[(DevNum, Governor)] {
        &self.devices
    }

    /// The devices `kind` acts on.
    pub fn governed_by(&self, kind: WeightFileKind) -> impl Iterator<Item = DevNum> + '_ {
        self.devices.iter().filter(move |(_, g)| governs(*g, kind)).map(|(d, _)| *d)
    }

    /// The files a write touches: those acting on some device; both when none does, so a device the cgroup uses
    /// later already has the weight. In [`V2_FILES`] order.
    pub fn files(&self) -> Vec<WeightFileKind> {
        let some: Vec<_> = V2_FILES.into_iter().filter(|k| self.governed_by(*k).next().is_some()).collect();
        if some.is_empty() {
            V2_FILES.to_vec()
        } else {
            some
        }
    }

    /// The lines that set `weight` in file `kind`, which holds `current`: `default W`, plus `MAJ:MIN W` for each
    /// governed device whose override would otherwise win. Other devices' overrides are left alone.
    pub fn write_lines(&self, kind: WeightFileKind, weight: Weight, current: &WeightLines) -> Vec<Line> {
        let value = kind.file_value(weight);
        let mut lines = vec![Line::Default(value)];
        for dev in self.governed_by(kind) {
            if current.devices.get(&dev).is_some_and(|v| *v != value) {
                lines.push(Line::Device(dev, Some(value)));
            }
        }
        lines
    }

    /// The effective value each governed device must read back after `weight` is written, per file that acts on
    /// it, on that file's scale.
    pub fn expected(&self, weight: Weight) -> Vec<(DevNum, WeightFileKind, u32)> {
        let mut out = Vec::new();
        for (dev, g) in &self.devices {
            for kind in V2_FILES.into_iter().filter(|k| governs(*g, *k)) {
                out.push((*dev, kind, kind.file_value(weight)));
            }
        }
        out
    }

    /// Checks file `kind` as read back after a write of `weight`: the effective value of every device it governs;
    /// with none, its default. The first disagreement, by device number.
    pub fn check(&self, kind: WeightFileKind, weight: Weight, back: &WeightLines) -> Result<(), Mismatch> {
        let value = kind.file_value(weight);
        let mut any = false;
        for dev in self.governed_by(kind) {
            any = true;
            let read = back.effective(dev);
            if read != value {
                let from_override = back.devices.contains_key(&dev);
                return Err(Mismatch { dev: Some(dev), wrote: value, read, from_override });
            }
        }
        if !any && back.default != value {
            return Err(Mismatch { dev: None, wrote: value, read: back.default, from_override: false });
        }
        Ok(())
    }

    /// The value in force on each governed device, per file that acts on it (file scale), from the files as read.
    /// A file missing from `files` contributes nothing.
    pub fn in_force(&self, files: &[(WeightFileKind, WeightLines)]) -> Vec<(DevNum, WeightFileKind, u32)> {
        let mut out = Vec::new();
        for (dev, g) in &self.devices {
            for (kind, lines) in files.iter().filter(|(k, _)| governs(*g, *k)) {
                out.push((*dev, *kind, lines.effective(*dev)));
            }
        }
        out
    }

    /// Every device, its governor and the value in force on it per file that acts on it (for status).
    pub fn device_weights(&self, files: &[(WeightFileKind, WeightLines)]) -> Vec<DeviceWeight> {
        self.devices
            .iter()
            .map(|(dev, governor)| DeviceWeight {
                dev: *dev,
                governor: *governor,
                effective: files
                    .iter()
                    .filter(|(kind, _)| governs(*governor, *kind))
                    .map(|(kind, lines)| (*kind, lines.effective(*dev)))
                    .collect(),
            })
            .collect()
    }
}

/// The lines that turn a file holding `now` back into `want` (a snapshot): the default if it differs, the removal
/// of overrides `want` does not have, and every override of `want` that `now` does not hold.
pub fn restore_lines(want: &WeightLines, now: &WeightLines) -> Vec<Line> {
    let mut lines = Vec::new();
    if now.default != want.default {
        lines.push(Line::Default(want.default));
    }
    for dev in now.devices.keys().filter(|d| !want.devices.contains_key(d)) {
        lines.push(Line::Device(*dev, None));
    }
    for (dev, v) in &want.devices {
        if now.devices.get(dev) != Some(v) {
            lines.push(Line::Device(*dev, Some(*v)));
        }
    }
    lines
}

/// Checks a file read back after a restore: exactly `want`'s default and overrides. The first disagreement (the
/// default first, then by device number).
pub fn check_restored(want: &WeightLines, back: &WeightLines) -> Result<(), Mismatch> {
    if back.default != want.default {
        return Err(Mismatch { dev: None, wrote: want.default, read: back.default, from_override: false });
    }
    let devices: BTreeSet<&DevNum> = back.devices.keys().chain(want.devices.keys()).collect();
    for dev in devices {
        if back.devices.get(dev) != want.devices.get(dev) {
            let (wrote, read) = (want.effective(*dev), back.effective(*dev));
            let from_override = back.devices.contains_key(dev);
            return Err(Mismatch { dev: Some(*dev), wrote, read, from_override });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
