//! The throughput cap on [`FileWriter`]: a container's byte-rate limits in its cgroup's throttle files (v1
//! `blkio.throttle.read_bps_device` and `blkio.throttle.write_bps_device`, v2 `io.max`), set, read back and put
//! back. The files' formats and the rule (a cap never loosens a limit the container had; a lift puts back exactly
//! what was there) are [`crate::files::cap_plan`]'s.
//!
//! A cap covers the devices where BFQ decides among the devices the weight write plans with (the container's
//! counters and `[devices] check`): a cap is there to leave BFQ idle time to serve others, which only matters
//! where BFQ schedules. On v1 without `blkio.bfq.weight_device` (BFQ before Linux 5.4), the devices of the
//! cgroup's BFQ counters that BFQ still schedules; without those counters, none (said in the log).
//!
//! Before the first cap of a container touches a device, the throttle files' limits on that device (both
//! directions; none is a value too) go into a snapshot, which is recorded ([`RestoreRecords`], beside the state
//! file with [`FileWriter::with_cap_records_file`]) before anything is written; a lift puts the snapshot back and
//! drops it. An agent restarted after a crash puts back the caps it left with
//! [`FileWriter::restore_leftover_caps`], and those that could not be put back then with
//! [`FileWriter::retry_leftover_caps`] (the daemon, every round).
//!
//! The snapshot also keeps what the agent's last cap left in the files (and, while a write may have landed in
//! part, what they held before it): before each cap and each lift, a limit in the files that is neither the
//! snapshot's nor the agent's was set by someone else meanwhile (`docker update --device-read-bps`, a unit's
//! `IOReadBandwidthMax=`) and becomes the snapshot's ([`cap_plan::adopt`]), so the lift leaves it in place.
//!
//! The lift acts on the cgroup the cap was written to (the snapshot's), also when the container's cgroup has
//! changed since and the old one still exists; a cap in a new cgroup first lifts the old one's.

use std::path::PathBuf;

use qos_core::{Cap, ContainerId};
use serde::{Deserialize, Serialize};
use tracing::{debug, info, warn};

use super::{cgroup_of, counter_devices, FileWriter};
use crate::backend::{BackendError, ContainerInfo, DeviceCap};
use crate::cgroup::{CgroupDir, CgroupError, CgroupRoot, CgroupVersion, V1_BFQ_BYTES};
use crate::files::cap_plan::{self, DeviceLimits, Direction, ZeroCap};
use crate::files::restore_records::RestoreRecords;
use crate::kernel::DevNum;

/// A container's throttle-file limits before the agent first capped it, on each device a cap covered (with the
/// limits someone else set since taken in), and what the agent left there.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct CapSnapshot {
    /// The cgroup directory the cap was written to: the lift acts there; the snapshot is dropped once it is gone.
    dir: PathBuf,
    /// Each device's limits before its first cap (a device without a limit included, as none), or the limit
    /// someone else set since.
    before: DeviceLimits,
    /// The limits the agent's last cap left on each device (empty in an older agent's record: nothing is taken
    /// in from the files then).
    #[serde(default)]
    wrote: DeviceLimits,
    /// What the files held before a cap write that has not been read back whole (it failed, or the agent died in
    /// it): a line may hold this or `wrote`, both the agent's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    unsure: Option<DeviceLimits>,
}

impl CapSnapshot {
    fn new(dir: &CgroupDir) -> Self {
        Self { dir: dir.path().to_owned(), before: DeviceLimits::new(), wrote: DeviceLimits::new(), unsure: None }
    }

    /// Takes into the snapshot the limits someone else set in the files (`now`) since the agent wrote, and says so.
    fn adopt(&mut self, id: &ContainerId, now: &DeviceLimits) {
        let mut ours = vec![&self.wrote];
        ours.extend(self.unsure.as_ref());
        for (dev, dir, limit) in cap_plan::adopt(&mut self.before, &ours, now) {
            info!(container = %id.short(), cgroup = %self.dir.display(), device = %dev, what = what(dir), ?limit,
                  "cap: a limit set by someone else while capped is kept (the lift leaves it; a cap never loosens it)");
        }
    }
}

/// What [`FileWriter::restore_leftover_caps`] did with one recorded cap.
#[derive(Debug)]
#[non_exhaustive]
pub enum LeftoverCap {
    /// Put back and read back: each device's limits now. The record is dropped.
    Restored {
        /// The container.
        id: ContainerId,
        /// Its cgroup directory.
        dir: PathBuf,
        /// The limits in force on each device the cap had covered.
        devices: Vec<DeviceCap>,
    },
    /// The cgroup is gone, and the cap with it: the record is dropped.
    Gone {
        /// The container.
        id: ContainerId,
        /// Its cgroup directory, which no longer exists.
        dir: PathBuf,
    },
    /// Could not be put back. `kept`: the record stays (a lift of the container, or the next start, tries again);
    /// not kept when it can never be (a directory outside the cgroup root).
    Failed {
        /// The container.
        id: ContainerId,
        /// Its cgroup directory.
        dir: PathBuf,
        /// Why.
        error: BackendError,
        /// Whether the record was kept.
        kept: bool,
    },
}

impl LeftoverCap {
    /// Says what was done: a failure as a warning at start-up, at debug level when tried again (`retry`), which
    /// happens every round until it succeeds.
    pub fn log(&self, retry: bool) {
        match self {
            LeftoverCap::Restored { id, dir, devices } => info!(container = %id.short(), dir = %dir.display(),
                ?devices, "put back the throttle limits of a cap a previous agent left"),
            LeftoverCap::Gone { id, dir } => debug!(container = %id.short(), dir = %dir.display(),
                "a cap a previous agent left went with its cgroup"),
            LeftoverCap::Failed { id, dir, error, kept } if retry => debug!(container = %id.short(),
                dir = %dir.display(), error = %error, record_kept = kept,
                "still cannot put back the throttle limits of a cap a previous agent left"),
            LeftoverCap::Failed { id, dir, error, kept } => warn!(container = %id.short(), dir = %dir.display(),
                error = %error, record_kept = kept,
                "cannot put back the throttle limits of a cap a previous agent left"),
        }
    }
}

impl FileWriter {
    /// Keeps the cap snapshots in `path` too (see [`RestoreRecords`]; the agent's: `<state file>.caps.jsonl`,
    /// [`crate::files::cap_records_file`]): an agent restarted after a crash puts the caps it left back with
    /// [`Self::restore_leftover_caps`]. Snapshots already taken are kept in memory only.
    pub fn with_cap_records_file(mut self, path: PathBuf) -> Self {
        self.caps = RestoreRecords::load(path);
        self
    }

    /// Holds the container's throughput at most `cap` on the devices where BFQ decides (see the module doc), or
    /// with `None` lifts the cap: puts back exactly the limits the throttle files held before the first cap and
    /// forgets them. On each device and direction a cap writes the lower of the limit the container had and the
    /// cap's; a direction the cap leaves alone (and a device the cap no longer covers) gets what it had. Every
    /// write is read back: a device reading back another limit fails the call ([`CgroupError::LimitMismatch`],
    /// naming file, device and values).
    ///
    /// Returns every device the call covered with the limits in force on it now; empty when there was nothing
    /// to cap (no device where BFQ decides) or to lift.
    pub fn write_cap(&mut self, info: &ContainerInfo, cap: Option<Cap>) -> Result<Vec<DeviceCap>, BackendError> {
        let dir = cgroup_of(info)?;
        match cap {
            Some(cap) => self.set_cap(info, dir, cap),
            None => self.lift_cap(info, dir),
        }
    }

    fn set_cap(&mut self, info: &ContainerInfo, dir: &CgroupDir, cap: Cap) -> Result<Vec<DeviceCap>, BackendError> {
        // Refused before anything is read or recorded.
        if let Err(ZeroCap(d)) = cap_plan::targets([], &DeviceLimits::new(), Some(cap)) {
            return Err(BackendError::ZeroCap { id: info.id.clone(), what: what(d) });
        }
        self.leftovers.remove(&info.id);
        let devices = self.cap_devices(info, dir)?;
        let mut snapshot = match self.caps.get(&info.id).cloned() {
            Some(s) if s.dir == dir.path() => s,
            Some(old) => {
                // The container's cgroup changed while the old one still holds the cap: put that one back first
                // (kept, and this cap not written, while it cannot be).
                warn!(container = %info.id.short(), old = %old.dir.display(), new = %dir.path().display(),
                      "cap: the container's cgroup changed; lifting the cap in the old one first");
                self.lift_at_snapshot(&info.id, dir, old)?;
                CapSnapshot::new(dir)
            }
            None => CapSnapshot::new(dir),
        };
        let now = read_limits(dir)?;
        snapshot.adopt(&info.id, &now);
        let new: Vec<DevNum> = devices.iter().copied().filter(|d| !snapshot.before.contains_key(d)).collect();
        if !new.is_empty() && !self.caps.contains(&info.id) {
            self.caps.prune_gone(|s| &s.dir);
        }
        snapshot.before.extend(cap_plan::select(&now, new));
        let target = cap_plan::targets(devices.iter().copied(), &snapshot.before, Some(cap))
            .map_err(|ZeroCap(d)| BackendError::ZeroCap { id: info.id.clone(), what: what(d) })?;
        if !cap_plan::write_lines(dir.version(), &target, &now).is_empty() {
            // Until read back, a line holds either what it held or the target: both the agent's.
            snapshot.unsure = Some(cap_plan::select(&now, target.keys().copied()));
            snapshot.wrote = target.clone();
        }
        // Recorded before anything is written: a crash from here on leaves a record to restore.
        self.record_cap(&info.id, &snapshot);
        let in_force = apply(dir, &target, &now)?;
        snapshot.wrote = in_force.clone();
        snapshot.unsure = None;
        self.record_cap(&info.id, &snapshot);
        debug!(container = %info.id.short(), ?cap, devices = ?in_force, "cap written and read back");
        Ok(device_caps(&in_force))
    }

    fn lift_cap(&mut self, info: &ContainerInfo, dir: &CgroupDir) -> Result<Vec<DeviceCap>, BackendError> {
        self.leftovers.remove(&info.id);
        let Some(snapshot) = self.caps.get(&info.id).cloned() else { return Ok(Vec::new()) };
        if snapshot.dir != dir.path() {
            debug!(container = %info.id.short(), old = %snapshot.dir.display(), new = %dir.path().display(),
                   "cap: lifted in the cgroup it was written to, not the container's new one");
        }
        Ok(device_caps(&self.lift_at_snapshot(&info.id, dir, snapshot)?))
    }

    /// Puts `snapshot` back in the cgroup it was taken in, resolved beside `known` (a directory of the same root),
    /// and drops it; also dropped when that cgroup is gone (nothing in force then).
    fn lift_at_snapshot(
        &mut self,
        id: &ContainerId,
        known: &CgroupDir,
        mut snapshot: CapSnapshot,
    ) -> Result<DeviceLimits, CgroupError> {
        let result = if snapshot.dir == known.path() { Ok(known.clone()) } else { known.resolve_other(&snapshot.dir) }
            .and_then(|dir| self.put_back(id, &dir, &mut snapshot));
        match result {
            Ok(in_force) => {
                self.caps.remove(id);
                debug!(container = %id.short(), cgroup = %snapshot.dir.display(), devices = ?in_force,
                       "cap lifted, limits put back");
                Ok(in_force)
            }
            Err(e) if e.is_vanished() => {
                self.caps.remove(id);
                Ok(DeviceLimits::new())
            }
            Err(e @ CgroupError::OutsideRoot { .. }) => {
                // Can never be put back (the record was not the agent's to keep).
                self.caps.remove(id);
                Err(e)
            }
            Err(e) => Err(e),
        }
    }

    /// Reads `dir`'s files, takes in what someone else set since (recorded before anything is written), and
    /// writes the snapshot's limits back; the limits in force after (the record is the caller's to drop).
    fn put_back(
        &mut self,
        id: &ContainerId,
        dir: &CgroupDir,
        snapshot: &mut CapSnapshot,
    ) -> Result<DeviceLimits, CgroupError> {
        let now = read_limits(dir)?;
        snapshot.adopt(id, &now);
        self.record_cap(id, snapshot);
        apply(dir, &snapshot.before, &now)
    }

    /// Records `snapshot` as `id`'s unless that is what the records hold already.
    fn record_cap(&mut self, id: &ContainerId, snapshot: &CapSnapshot) {
        if self.caps.get(id) != Some(snapshot) {
            self.caps.insert(id, snapshot.clone());
        }
    }

    /// Puts back every cap a previous agent left (the records of [`Self::with_cap_records_file`]) whose cgroup
    /// still exists under `root`, and drops the records of cgroups that are gone; for the agent to call once at
    /// start-up, before any cap, and log. A record that cannot be put back is kept (see [`LeftoverCap::Failed`]),
    /// and [`Self::retry_leftover_caps`] tries it again until it is put back, or a cap or lift of its container
    /// takes it over.
    pub fn restore_leftover_caps(&mut self, root: &CgroupRoot) -> Vec<LeftoverCap> {
        let ids: Vec<ContainerId> = self.caps.iter().map(|(id, _)| id.clone()).collect();
        self.leftover_root = Some(root.clone());
        self.leftovers = ids.into_iter().collect();
        self.retry_leftover_caps()
    }

    /// [`Self::restore_leftover_caps`] from the records in `path` (an agent that keeps no records of its own, a
    /// dry run, putting back what a dead agent left), once: what fails stays recorded there for the next agent,
    /// and this writer's own records are untouched.
    pub fn restore_leftover_caps_in(&mut self, path: PathBuf, root: &CgroupRoot) -> Vec<LeftoverCap> {
        let own = std::mem::replace(&mut self.caps, RestoreRecords::load(path));
        let done = self.restore_leftover_caps(root);
        self.caps = own;
        self.leftovers.clear();
        self.leftover_root = None;
        done
    }

    /// Tries again to put back the caps [`Self::restore_leftover_caps`] could not (none before it ran): each
    /// outcome, as there. For the daemon to call every round; nothing to do costs nothing.
    pub fn retry_leftover_caps(&mut self) -> Vec<LeftoverCap> {
        // Every round: nothing owed costs no clone of the root.
        if self.leftovers.is_empty() {
            return Vec::new();
        }
        let Some(root) = self.leftover_root.clone() else { return Vec::new() };
        let mut done = Vec::new();
        for id in std::mem::take(&mut self.leftovers) {
            let Some(mut snapshot) = self.caps.get(&id).cloned() else { continue };
            let dir = snapshot.dir.clone();
            let outcome = match root.resolve_absolute(&snapshot.dir).and_then(|d| self.put_back(&id, &d, &mut snapshot))
            {
                Ok(in_force) => LeftoverCap::Restored { id: id.clone(), dir, devices: device_caps(&in_force) },
                Err(e) if e.is_vanished() => LeftoverCap::Gone { id: id.clone(), dir },
                Err(e) => {
                    let kept = !matches!(e, CgroupError::OutsideRoot { .. });
                    LeftoverCap::Failed { id: id.clone(), dir, error: e.into(), kept }
                }
            };
            match outcome {
                LeftoverCap::Failed { kept: true, .. } => {
                    self.leftovers.insert(id.clone());
                }
                _ => self.caps.remove(&id),
            }
            done.push(outcome);
        }
        done
    }

    /// Drops the cap snapshot of a container whose cgroup is gone (the cap went with it).
    pub(super) fn forget_cap(&mut self, id: &ContainerId) {
        match self.caps.get(id) {
            Some(s) if !s.dir.is_dir() => {
                self.caps.remove(id);
            }
            // The cgroup the cap was written to outlived the container (it had moved to another one while capped,
            // or lingers): nothing would lift it, so it is put back like a previous agent's leftover, every round
            // until it is ([`Self::retry_leftover_caps`]).
            Some(_) if self.leftover_root.is_some() => {
                self.leftovers.insert(id.clone());
            }
            _ => {}
        }
    }

    /// The devices a cap covers: those of the weight plan where BFQ decides; v1 without the per-device weight
    /// file, those of the BFQ counters BFQ still schedules.
    fn cap_devices(&mut self, info: &ContainerInfo, dir: &CgroupDir) -> Result<Vec<DevNum>, CgroupError> {
        if let Some(plan) = self.plan(info, dir)? {
            return Ok(plan.devices().iter().filter(|(_, g)| g.bfq).map(|(d, _)| *d).collect());
        }
        if !dir.path().join(V1_BFQ_BYTES).is_file() {
            warn!(container = %info.id.short(), cgroup = %dir.path().display(),
                  "cap: no BFQ in this cgroup (neither {} nor blkio.bfq.weight_device): nothing capped", V1_BFQ_BYTES);
            return Ok(Vec::new());
        }
        let devices = counter_devices(dir, V1_BFQ_BYTES)?;
        Ok(self.devices.governors(devices).into_iter().filter(|(_, g)| g.bfq).map(|(d, _)| d).collect())
    }
}

/// Writes the lines that turn `now` into `target`, reads the files back and checks every device of `target`;
/// returns `target` as in force. A device the kernel says does not exist (ENODEV while the cgroup is there: a disk
/// that went away) is left out: it holds no limit, and a disk that comes back under its number is another disk.
fn apply(dir: &CgroupDir, target: &DeviceLimits, now: &DeviceLimits) -> Result<DeviceLimits, CgroupError> {
    let version = dir.version();
    let mut target = target.clone();
    for line in cap_plan::write_lines(version, &target, now) {
        match write_line(dir, line.file_name(), &line.text()) {
            Err(CgroupError::Write { source, .. }) if source.raw_os_error() == Some(libc::ENODEV) => {
                debug!(cgroup = %dir.path().display(), device = %line.dev(), "cap: no such device any more; skipped");
                target.remove(&line.dev());
            }
            other => other?,
        }
    }
    let back = read_limits(dir)?;
    cap_plan::check(&target, &back).map_err(|m| CgroupError::LimitMismatch {
        path: dir.path().join(m.dir.file(version)),
        device: m.dev.to_string(),
        what: what(m.dir),
        wrote: m.wanted,
        read: m.read,
    })?;
    Ok(target)
}

/// The cgroup's byte-rate limits on every device, from its throttle file(s).
fn read_limits(dir: &CgroupDir) -> Result<DeviceLimits, CgroupError> {
    match dir.version() {
        CgroupVersion::V1 => {
            let read =
                cap_plan::parse_v1(&dir.path().join(cap_plan::V1_READ_BPS), &read_file(dir, cap_plan::V1_READ_BPS)?)?;
            let write =
                cap_plan::parse_v1(&dir.path().join(cap_plan::V1_WRITE_BPS), &read_file(dir, cap_plan::V1_WRITE_BPS)?)?;
            Ok(cap_plan::join_v1(&read, &write))
        }
        CgroupVersion::V2 => {
            cap_plan::parse_v2(&dir.path().join(cap_plan::V2_IO_MAX), &read_file(dir, cap_plan::V2_IO_MAX)?)
        }
    }
}

fn read_file(dir: &CgroupDir, name: &str) -> Result<Vec<u8>, CgroupError> {
    crate::cgroup::read_file(&dir.path().join(name), dir.path())
}

/// One `write(2)` of `data` through the directory's [`crate::cgroup::CgroupFs`]. ENODEV while the directory is
/// still there names a device that does not exist (the throttle files' answer), not a vanished cgroup.
fn write_line(dir: &CgroupDir, name: &str, data: &str) -> Result<(), CgroupError> {
    match dir.fs().write_file(&dir.path().join(name), dir.path(), data) {
        Err(CgroupError::Vanished { path, source })
            if source.raw_os_error() == Some(libc::ENODEV) && dir.path().is_dir() =>
        {
            Err(CgroupError::Write { path, data: data.to_owned(), source })
        }
        other => other,
    }
}

fn what(dir: Direction) -> &'static str {
    match dir {
        Direction::Read => "read bytes/s",
        Direction::Write => "write bytes/s",
    }
}

fn device_caps(limits: &DeviceLimits) -> Vec<DeviceCap> {
    limits.iter().map(|(dev, l)| DeviceCap { dev: *dev, read_bps: l.read_bps, write_bps: l.write_bps }).collect()
}
