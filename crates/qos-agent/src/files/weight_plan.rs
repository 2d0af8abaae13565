//! [`WeightPlan`]: which weight file acts on which device and what to write to set or restore a weight, on cgroup v2
//! and on v1 with BFQ's per-device file. Pure: device facts and file contents in; lines to write, values expected
//! and mismatches out. No I/O, so the writer ([`super::FileWriter`]) and the bench's weight probe share one rule.
//!
//! The kernel's rule (Linux 6.x): on v2 `io.bfq.weight` acts on a device whose scheduler is BFQ, `io.weight` on a
//! device with io.cost enabled (both may hold); on v1 `blkio.bfq.weight_device` acts on BFQ devices (v1 has no
//! io.cost); on a device with none of these no weight acts. In each file a `MAJ:MIN N` line overrides the
//! `default N` line on that device. `MAJ:MIN N` sets an override, `MAJ:MIN default` removes one; writing
//! `default N` sets the default and, in BFQ's files, removes every override
//! ([`WeightFileKind::default_clears_overrides`]; `io.weight` keeps them). The lines planned here reach the same
//! file whether or not a default removes the overrides, so a kernel that kept them would be served too.

use std::collections::BTreeSet;

use qos_core::Weight;

use crate::backend::DeviceWeight;
use crate::blockdev::Governor;
use crate::cgroup::{WeightFileKind, WeightLines};
use crate::kernel::DevNum;

/// The two v2 weight files, `io.weight` first: a check that fails on both names io.cost (which Docker never
/// writes) rather than a BFQ override.
pub const V2_FILES: [WeightFileKind; 2] = [WeightFileKind::V2Io, WeightFileKind::V2Bfq];

/// The v1 weight file planned like v2's: BFQ's `blkio.bfq.weight_device` (its default is `blkio.bfq.weight`).
pub const V1_FILES: [WeightFileKind; 1] = [WeightFileKind::V1BfqDevice];

/// One line to write into a weight file with per-device lines, on the file's own scale.
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
        WeightFileKind::V2Bfq | WeightFileKind::V1BfqDevice => g.bfq,
        WeightFileKind::V2Io => g.io_cost,
        _ => false,
    }
}

/// The devices of one cgroup's weight write, what governs each, and the files the write manages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WeightPlan {
    /// Every device of the write, by device number, with its governor ([`Governor::NONE`] included).
    devices: Vec<(DevNum, Governor)>,
    /// The files of the hierarchy: [`V2_FILES`] or [`V1_FILES`].
    kinds: &'static [WeightFileKind],
}

impl WeightPlan {
    /// A cgroup-v2 plan over these devices (a device named twice counts once, with its first governor).
    pub fn new(devices: impl IntoIterator<Item = (DevNum, Governor)>) -> Self {
        Self::over(&V2_FILES, devices)
    }

    /// A plan of the files `kinds` ([`V2_FILES`], [`V1_FILES`]) over these devices (a device named twice counts
    /// once, with its first governor).
    pub fn over(kinds: &'static [WeightFileKind], devices: impl IntoIterator<Item = (DevNum, Governor)>) -> Self {
        let mut seen = BTreeSet::new();
        let mut devices: Vec<_> = devices.into_iter().filter(|(d, _)| seen.insert(*d)).collect();
        devices.sort_by_key(|(d, _)| *d);
        Self { devices, kinds }
    }

    /// The files of the hierarchy, whether a write touches them or not.
    pub fn kinds(&self) -> &'static [WeightFileKind] {
        self.kinds
    }

    /// Every device and its governor, by device number.
    pub fn devices(&self) -> &[(DevNum, Governor)] {
        &self.devices
    }

    /// The devices `kind` acts on.
    pub fn governed_by(&self, kind: WeightFileKind) -> impl Iterator<Item = DevNum> + '_ {
        self.devices.iter().filter(move |(_, g)| governs(*g, kind)).map(|(d, _)| *d)
    }

    /// The files a write touches: those acting on some device; all of them (v2: both) when none does, so a device
    /// the cgroup uses later already has the weight. In [`Self::kinds`] order.
    pub fn files(&self) -> Vec<WeightFileKind> {
        let some: Vec<_> = self.kinds.iter().copied().filter(|k| self.governed_by(*k).next().is_some()).collect();
        if some.is_empty() {
            self.kinds.to_vec()
        } else {
            some
        }
    }

    /// The lines that set `weight` in file `kind`, which holds `current`: `default W`, plus `MAJ:MIN W` for each
    /// governed device whose override would otherwise win. Other devices' overrides are left as they are: where
    /// the default line removes them (BFQ's files) they are written back.
    pub fn write_lines(&self, kind: WeightFileKind, weight: Weight, current: &WeightLines) -> Vec<Line> {
        let value = kind.file_value(weight);
        let mut lines = vec![Line::Default(value)];
        for (dev, v) in &current.devices {
            let governed = self.governed_by(kind).any(|d| d == *dev);
            if governed && *v != value {
                lines.push(Line::Device(*dev, Some(value)));
            } else if !governed && kind.default_clears_overrides() {
                lines.push(Line::Device(*dev, Some(*v)));
            }
        }
        lines
    }

    /// The effective value each governed device must read back after `weight` is written, per file that acts on
    /// it, on that file's scale.
    pub fn expected(&self, weight: Weight) -> Vec<(DevNum, WeightFileKind, u32)> {
        let mut out = Vec::new();
        for (dev, g) in &self.devices {
            for kind in self.kinds.iter().copied().filter(|k| governs(*g, *k)) {
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

/// The lines that turn file `kind` holding `now` back into `want` (a snapshot): the default if it differs, the
/// removal of overrides `want` does not have, and every override of `want` that `now` does not hold, or, where the
/// default line removes the overrides (BFQ's files), every override of `want`.
pub fn restore_lines(kind: WeightFileKind, want: &WeightLines, now: &WeightLines) -> Vec<Line> {
    let mut lines = Vec::new();
    let rewrite_all = now.default != want.default && kind.default_clears_overrides();
    if now.default != want.default {
        lines.push(Line::Default(want.default));
    }
    for dev in now.devices.keys().filter(|d| !want.devices.contains_key(d)) {
        lines.push(Line::Device(*dev, None));
    }
    for (dev, v) in &want.devices {
        if rewrite_all || now.devices.get(dev) != Some(v) {
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
