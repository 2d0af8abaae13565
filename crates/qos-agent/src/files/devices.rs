//! [`FileDevices`]: the block devices as the weight files see them (cgroup v2, and v1 with BFQ's per-device file):
//! the device table (what governs each device), each container's devices and the values in force on them, the warnings about devices no weight
//! acts on, and the io.cost rate watch. The [`FileWriter`](super::FileWriter) plans its writes with it; the
//! daemon ticks it once a round on its own clock and shows it in status, through
//! [`DeviceMonitor`](crate::backend::DeviceMonitor). One handle, shared: the writer and the daemon hold clones.
//!
//! Time is the daemon's: [`DeviceMonitor::tick`](crate::backend::DeviceMonitor::tick) brings `now`, which the
//! io.cost watch and the table's staleness use until the next tick (facts may be one round older than the
//! table's `max_age` says: weights are written rarely, rounds are short).

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use qos_core::ContainerId;
use tracing::{debug, info, warn};

use crate::backend::{DeviceMonitor, DeviceWeight};
use crate::blockdev::vrate::{self, VrateNews, VrateWatch};
use crate::blockdev::{DeviceFacts, DeviceTable, Governor};
use crate::cgroup::{CgroupError, WeightFileKind, WeightLines};
use crate::kernel::DevNum;
use crate::ops::metrics::DeviceWeightEffective;

use super::WeightPlan;

/// The devices the weight files act on (cgroup v2, v1 BFQ), shared by the writer and the daemon. Clones share one state.
#[derive(Debug, Clone)]
pub struct FileDevices(Arc<Mutex<DeviceState>>);

#[derive(Debug)]
struct DeviceState {
    table: DeviceTable,
    /// `[devices] check` (or the runtime's data disk): always part of a planned write.
    configured: Vec<String>,
    /// Configured names already reported as unusable (logged once).
    bad_names: BTreeSet<String>,
    /// The devices of each container's last read or write, what governed them and the effective weights read
    /// back (for status), with the cgroup directory (dropped once it is gone).
    devices_of: HashMap<ContainerId, (PathBuf, Vec<DeviceWeight>)>,
    /// Map size at which entries of vanished cgroups are dropped next.
    prune_at: usize,
    /// Devices no weight acts on that were already warned about.
    warned: BTreeSet<DevNum>,
    metric: Option<DeviceWeightEffective>,
    /// io.cost's rate per device under io.cost, and when it was last read.
    vrate: VrateWatch,
    vrate_read: Option<Instant>,
    /// The daemon's time at its last tick (at creation before the first).
    now: Instant,
    /// The writes plan v1's `blkio.bfq.weight_device` (v1 has no io.cost): what the logs name.
    v1: bool,
}

impl FileDevices {
    /// Devices over a device table (`/sys` and the v2 root's `io.cost.qos`, or fixtures).
    pub fn new(table: DeviceTable) -> Self {
        Self(Arc::new(Mutex::new(DeviceState {
            table,
            configured: Vec::new(),
            bad_names: BTreeSet::new(),
            devices_of: HashMap::new(),
            prune_at: 64,
            warned: BTreeSet::new(),
            metric: None,
            vrate: VrateWatch::default(),
            vrate_read: None,
            // Until the daemon's first tick: the one reading of the clock outside the daemon.
            now: Instant::now(),
            v1: false,
        })))
    }

    fn state(&self) -> MutexGuard<'_, DeviceState> {
        // Never held across a panic that matters: the state stays usable.
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Devices (names in /sys/block) written and checked on v2 (and v1 BFQ) whatever the container's `io.stat` says:
    /// `[devices] check`.
    pub fn set_configured(&self, names: Vec<String>) {
        self.state().configured = names;
    }

    /// Exports `ddiskqos_device_weight_effective` per device.
    pub fn set_metric(&self, metric: DeviceWeightEffective) {
        self.state().metric = Some(metric);
    }

    /// Replaces the device table (fixtures: another `/sys`, another `max_age`).
    pub fn set_table(&self, table: DeviceTable) {
        self.state().table = table;
    }

    /// Looks at the configured devices (`[devices] check`) now, so that each one no weight acts on is warned
    /// about (once) and exported at start-up, before the first write; the agent calls it once on cgroup v2.
    pub fn check_configured(&self) {
        let mut s = self.state();
        let now = s.now;
        for name in s.configured.clone() {
            match s.table.dev_of_name(&name) {
                Ok(dev) => {
                    let (facts, changed) = s.table.get(dev, now);
                    if let Some(before) = changed {
                        let facts = facts.clone();
                        s.report(&facts, before);
                    }
                }
                Err(e) => {
                    if s.bad_names.insert(name.clone()) {
                        warn!(device = %name, error = %e, "[devices] check names a device this host does not have");
                    }
                }
            }
        }
    }

    /// The plan of a write of the files `kinds` to container `id` (cgroup `dir`) whose counters list `devices`:
    /// those and the configured ones, each looked up in the table (re-read when stale), ineffective ones reported
    /// once.
    pub(crate) fn plan(
        &self,
        id: &ContainerId,
        dir: &Path,
        kinds: &'static [WeightFileKind],
        mut devices: BTreeSet<DevNum>,
    ) -> WeightPlan {
        let mut s = self.state();
        s.v1 = kinds.contains(&WeightFileKind::V1BfqDevice);
        for name in s.configured.clone() {
            match s.table.dev_of_name(&name) {
                Ok(dev) => {
                    devices.insert(dev);
                }
                Err(e) => {
                    if s.bad_names.insert(name.clone()) {
                        warn!(device = %name, error = %e, "[devices] check names a device this host does not have");
                    }
                }
            }
        }
        let all = s.governors(devices);
        let plan = WeightPlan::over(kinds, all);
        if !s.devices_of.contains_key(id) {
            s.prune();
        }
        // Effective values are filled in by the read-back that follows; a failed one leaves them unknown.
        let devices = plan.devices().iter().map(|(dev, governor)| DeviceWeight {
            dev: *dev,
            governor: *governor,
            effective: vec![],
        });
        s.devices_of.insert(id.clone(), (dir.to_owned(), devices.collect()));
        plan
    }

    /// What governs each of `devices`, looked up in the table (re-read when stale, changes reported), without
    /// making them any container's devices (the cap's devices on v1 without the per-device weight file).
    pub(crate) fn governors(&self, devices: BTreeSet<DevNum>) -> Vec<(DevNum, Governor)> {
        self.state().governors(devices)
    }

    /// Re-reads the facts of the device a failed check names; true if its governor changed.
    pub(crate) fn recheck(&self, err: &CgroupError) -> bool {
        let CgroupError::DeviceMismatch { device, .. } = err else { return false };
        let Ok(dev) = device.parse::<DevNum>() else { return false };
        let mut s = self.state();
        let now = s.now;
        let (facts, changed) = s.table.refresh(dev, now);
        match changed {
            Some(before) => {
                let facts = facts.clone();
                s.report(&facts, before);
                true
            }
            None => false,
        }
    }

    /// Fills in the effective values of the container's devices from the weight files as just read back.
    pub(crate) fn record_effective(&self, id: &ContainerId, files: &[(WeightFileKind, WeightLines)]) {
        let mut s = self.state();
        let Some((_, devices)) = s.devices_of.get_mut(id) else { return };
        *devices = WeightPlan::new(devices.iter().map(|d| (d.dev, d.governor))).device_weights(files);
    }
}

impl DeviceMonitor for FileDevices {
    fn device_table(&self) -> Vec<DeviceFacts> {
        self.state().table.snapshot()
    }

    fn container_devices(&self, id: &ContainerId) -> Vec<DeviceWeight> {
        self.state().devices_of.get(id).map(|(_, d)| d.clone()).unwrap_or_default()
    }

    fn tick(&mut self, now: Instant) {
        let mut s = self.state();
        s.now = now;
        s.watch_io_cost(now);
    }
}

impl DeviceState {
    /// What governs each of `devices`, looked up in the table (re-read when stale, changes reported).
    fn governors(&mut self, devices: BTreeSet<DevNum>) -> Vec<(DevNum, Governor)> {
        let now = self.now;
        let mut out = Vec::new();
        for dev in devices {
            let (facts, changed) = self.table.get(dev, now);
            let governor = facts.governor;
            if let Some(before) = changed {
                let facts = facts.clone();
                self.report(&facts, before);
            }
            out.push((dev, governor));
        }
        out
    }

    /// Every [`vrate::CHECK_EVERY`]: reads io.cost's rate (`cost.vrate` in the v2 root's `io.stat`) of each device
    /// in the table that io.cost governs and warns, once per stay, about one pinned at its minimum (`min=` of
    /// `io.cost.qos`) for [`vrate::HOLD`]: its model overstates the device and weights act weakly there.
    fn watch_io_cost(&mut self, now: Instant) {
        if self.vrate_read.is_some_and(|t| now.saturating_duration_since(t) < vrate::CHECK_EVERY) {
            return;
        }
        self.vrate_read = Some(now);
        let devices: Vec<DeviceFacts> = self.table.snapshot().into_iter().filter(|f| f.governor.io_cost).collect();
        let gone: Vec<DevNum> = self.vrate.devices().filter(|d| !devices.iter().any(|f| f.dev == *d)).collect();
        for dev in gone {
            self.vrate.forget(dev);
        }
        if devices.is_empty() {
            return;
        }
        let root = self.table.v2_root();
        let (stat_path, qos_path) = (root.join("io.stat"), root.join("io.cost.qos"));
        let (stat, qos) = match (std::fs::read_to_string(&stat_path), std::fs::read_to_string(&qos_path)) {
            (Ok(stat), Ok(qos)) => (stat, qos),
            (Err(e), _) | (_, Err(e)) => {
                debug!(error = %e, stat = %stat_path.display(), qos = %qos_path.display(), "cannot read io.cost's rate");
                return;
            }
        };
        for f in devices {
            let (Some(rate), Some(min)) = (vrate::vrate_of(&stat, f.dev), vrate::qos_min_of(&qos, f.dev)) else {
                continue;
            };
            let disk = f.disk.as_deref().unwrap_or("DEV");
            match self.vrate.observe(f.dev, rate, min, now) {
                Some(VrateNews::AtFloor { dev, vrate, min, held }) => warn!(
                    device = %dev,
                    disk,
                    vrate,
                    min,
                    held_s = held.as_secs(),
                    "io.cost RUNS AT ITS MINIMUM RATE on device {dev} ({disk}): cost.vrate {vrate:.2} % = the min of \
                     io.cost.qos for {} s, so the device is slower than io.cost.model says and cgroup weights act \
                     weakly or not at all there. Measure the device again: `ddiskqos-agent iocost /dev/{disk} --apply`",
                    held.as_secs()
                ),
                Some(VrateNews::LeftFloor { dev, vrate }) => {
                    info!(device = %dev, disk, vrate, "io.cost is off its minimum rate on device {dev} again");
                }
                None => {}
            }
        }
    }

    /// Logs (once per device while it lasts) and exports a device's governor.
    fn report(&mut self, facts: &DeviceFacts, before: Option<Governor>) {
        let name = facts.disk.as_deref().unwrap_or("?");
        let governor = facts.governor;
        if let Some(metric) = &self.metric {
            metric.set(&facts.dev.to_string(), governor.as_str(), governor.is_effective());
        }
        if governor.is_effective() {
            self.warned.remove(&facts.dev);
            let file = match (self.v1, governor.bfq, governor.io_cost) {
                (true, _, _) => "cgroup v1: blkio.bfq.weight_device acts",
                (false, true, true) => "cgroup v2: io.bfq.weight and io.weight act",
                (false, true, false) => "cgroup v2: io.bfq.weight acts",
                _ => "cgroup v2: io.weight acts",
            };
            info!(device = %facts.dev, disk = name, governor = %governor, previous = ?before.map(|g| g.as_str()),
                  "{file} on this device");
        } else if self.warned.insert(facts.dev) {
            let (cause, fix) = if self.v1 {
                ("its scheduler is not bfq (cgroup v1 has no io.cost)", facts.fix_bfq())
            } else {
                ("its scheduler is not bfq and io.cost is off for it", facts.fix())
            };
            warn!(device = %facts.dev, disk = name, scheduler = facts.scheduler.as_deref().unwrap_or("?"),
                  error = facts.error.as_deref().unwrap_or(""),
                  "BLOCK-I/O WEIGHTS HAVE NO EFFECT ON DEVICE {} ({name}): {cause}. Fix: {fix}", facts.dev);
        }
    }

    /// Drops the devices of containers whose cgroup is gone, once the map has doubled since the last time (so
    /// churn costs amortized O(1) per container).
    fn prune(&mut self) {
        if self.devices_of.len() < self.prune_at {
            return;
        }
        self.devices_of.retain(|_, (dir, _)| dir.is_dir());
        self.prune_at = (self.devices_of.len() * 2).max(64);
    }
}
