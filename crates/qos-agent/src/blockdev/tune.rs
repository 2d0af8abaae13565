//! Opt-in BFQ tunables (`[devices] bfq_tunables`): set at start-up on the devices the operator names, logged with
//! their old and new value, and put back on a clean shutdown.
//!
//! Why: on cgroup v1, BFQ lets a newly busy group preempt the group in service only among top-level groups, so
//! containers in Docker's default layout (`docker/<id>`, siblings under one parent) wait for the background's slot
//! to end whatever their weight. A small `max_budget` (and a short `timeout_sync`) ends every slot soon, and then
//! the weights decide who is served next (docs/devices.md, "Docker's default layout on cgroup v1").
//!
//! Every write goes through [`set_bfq_tunable`](super::set_bfq_tunable): the device must be one the config names,
//! never the disk backing `/`, and the value must read back. Only the tunables of [`ALLOWED`] can be set, each
//! within its range.
//!
//! After SIGKILL nothing is put back at once: the originals are kept in a small JSON file beside the state file
//! ([`originals_path`]), and the next agent restores *those* on its clean shutdown (not the values the killed
//! agent left), then removes the file.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use super::setting::{read_setting, restore_setting, write_setting, Setting};
use super::{DeviceError, MOUNTINFO, SYS};

/// A BFQ tunable the agent may set: its name, the smallest and largest value it accepts, and its unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tunable {
    /// The file under `/sys/block/<dev>/queue/iosched/`.
    pub name: &'static str,
    /// Smallest value accepted.
    pub min: u64,
    /// Largest value accepted.
    pub max: u64,
    /// What the number means.
    pub unit: &'static str,
}

/// The BFQ tunables `[devices] bfq_tunables` may set. Others (e.g. `back_seek_*`, `fifo_expire_*`) do not bear on
/// the weights and are left to the operator.
pub const ALLOWED: &[Tunable] = &[
    Tunable { name: "max_budget", min: 0, max: 1 << 24, unit: "sectors per slot, 0 = automatic" },
    Tunable { name: "timeout_sync", min: 1, max: 1000, unit: "ms per slot of a sync queue" },
    Tunable { name: "slice_idle", min: 0, max: 1000, unit: "ms of idling for a queue's next request" },
    Tunable { name: "slice_idle_us", min: 0, max: 1_000_000, unit: "us of idling for a queue's next request" },
    Tunable { name: "strict_guarantees", min: 0, max: 1, unit: "0 or 1" },
    Tunable { name: "low_latency", min: 0, max: 1, unit: "0 or 1" },
];

/// A tunable's value in the config: a TOML integer or a string of digits.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum TunableValue {
    /// `timeout_sync = 8`.
    Int(i64),
    /// `timeout_sync = "8"`.
    Text(String),
}

impl std::fmt::Display for TunableValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TunableValue::Int(n) => write!(f, "{n}"),
            TunableValue::Text(s) => write!(f, "{s}"),
        }
    }
}

/// Checks one `(tunable, value)` and returns the value as written to sysfs; the error says why, for a message that
/// names the config key and the value.
pub fn validate(key: &str, value: &TunableValue) -> Result<u64, String> {
    let Some(t) = ALLOWED.iter().find(|t| t.name == key) else {
        let names: Vec<&str> = ALLOWED.iter().map(|t| t.name).collect();
        return Err(format!("not a BFQ tunable the agent sets (allowed: {})", names.join(", ")));
    };
    let n: u64 = match value {
        TunableValue::Int(n) => u64::try_from(*n).map_err(|_| "must not be negative".to_string())?,
        TunableValue::Text(s) => {
            if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
                return Err("must be a whole number".into());
            }
            s.parse().map_err(|_| "too large".to_string())?
        }
    };
    if n < t.min || n > t.max {
        return Err(format!("must be {}..={} ({})", t.min, t.max, t.unit));
    }
    Ok(n)
}

/// One tunable as the agent set it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tuned {
    /// The device, e.g. `sdb`.
    pub device: String,
    /// The tunable (a file of `queue/iosched/`), or `scheduler`, `io.cost.model`, `io.cost.qos`.
    pub key: String,
    /// What it read before the agent (or a killed earlier agent) changed it: what a clean shutdown puts back.
    pub original: String,
    /// What the agent wrote.
    pub value: String,
    /// Who asked: `bfq_tunables` (the operator's list) or `protect` (protection by default).
    pub by: String,
}

impl Tuned {
    fn recorded(device: &str, key: &str, original: &str) -> Self {
        Tuned {
            device: device.into(),
            key: key.into(),
            original: original.into(),
            value: "(set by an agent that did not stop cleanly)".into(),
            by: "originals file".into(),
        }
    }
}

/// What [`restore_left_settings`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LeftSettings {
    /// No originals file beside the state file: nothing to put back.
    None {
        /// The originals file looked for.
        file: PathBuf,
    },
    /// The settings on file were put back, but `failed` of them (each logged, naming device and setting).
    PutBack {
        /// The originals file.
        file: PathBuf,
        /// How many settings it held.
        count: usize,
        /// How many could not be put back.
        failed: usize,
    },
}

/// `ddiskqos-agent devices restore`: puts back the device settings an agent that did not stop cleanly left
/// (the originals file beside `state_file`, see [`originals_path`]); `v2_root`: the cgroup v2 root, for io.cost
/// settings. The caller makes sure no running agent holds the state file.
pub fn restore_left_settings(v2_root: Option<&Path>, state_file: &Path) -> Result<LeftSettings, TuneError> {
    let file = originals_path(state_file);
    if !file.exists() {
        return Ok(LeftSettings::None { file });
    }
    let mut tuned = TunedDevices::from_originals_file(v2_root, &file)?;
    let count = tuned.tuned().len();
    let failed = tuned.restore();
    Ok(LeftSettings::PutBack { file, count, failed })
}

/// Where the originals of the tunables are kept while the agent runs: `<state_file>.bfq-tunables.json`.
pub fn originals_path(state_file: &Path) -> PathBuf {
    let mut name = state_file.file_name().map(|n| n.to_os_string()).unwrap_or_default();
    name.push(".bfq-tunables.json");
    state_file.with_file_name(name)
}

/// The tunables set on devices; [`TunedDevices::restore`] (or dropping it) puts the originals back.
#[derive(Debug)]
#[must_use = "dropping it restores the tunables at once"]
pub struct TunedDevices {
    sys: PathBuf,
    mountinfo: String,
    /// The cgroup v2 root whose `io.cost.*` files io.cost settings go to (`None` on v1).
    v2_root: Option<PathBuf>,
    tuned: Vec<Tuned>,
    /// Originals an earlier agent recorded for settings this one does not manage (no longer configured, opted out):
    /// not this agent's to put back, so they stay in the originals file for the operator (`devices restore`).
    kept: BTreeMap<String, BTreeMap<String, String>>,
    /// The originals file, removed once everything is restored and nothing is kept; `None` in dry run or when
    /// nothing was set.
    file: Option<PathBuf>,
    restored: bool,
}

/// What went wrong setting or restoring a tunable; names the config key, device and value.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TuneError {
    /// A config value is not acceptable.
    #[error("devices.bfq_tunables.{device}.{key} = {value}: {reason}")]
    Invalid {
        /// The device.
        device: String,
        /// The tunable.
        key: String,
        /// The value as configured.
        value: String,
        /// Why.
        reason: String,
    },
    /// The device layer refused or failed (not opted in, root disk, not BFQ, did not read back).
    #[error("devices.bfq_tunables.{device}.{key} = {value}: {source}")]
    Device {
        /// The device.
        device: String,
        /// The tunable.
        key: String,
        /// The value.
        value: String,
        /// Why.
        #[source]
        source: Box<DeviceError>,
    },
    /// The originals file could not be read or written.
    #[error("{path}: {reason}")]
    File {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
}

/// Device -> tunable -> value, as configured.
pub type TunableMap = BTreeMap<String, BTreeMap<String, TunableValue>>;

/// Checks every entry of the map (names and values); no device is read.
pub fn validate_map(map: &TunableMap) -> Result<(), TuneError> {
    for (device, tunables) in map {
        for (key, value) in tunables {
            validate(key, value).map_err(|reason| TuneError::Invalid {
                device: device.clone(),
                key: key.clone(),
                value: value.to_string(),
                reason,
            })?;
        }
    }
    Ok(())
}

/// This process's mount table, which says which disk holds `/` (never tuned).
fn read_mountinfo() -> Result<String, TuneError> {
    std::fs::read_to_string(MOUNTINFO).map_err(|e| TuneError::File { path: MOUNTINFO.into(), reason: e.to_string() })
}

impl TunedDevices {
    /// Sets every configured tunable on the real `/sys`, keeping the originals in `originals` (see
    /// [`originals_path`]; `None`: dry run, nothing is written and the plan is only logged).
    pub fn apply(map: &TunableMap, originals: Option<&Path>) -> Result<Self, TuneError> {
        let mountinfo = read_mountinfo()?;
        Self::apply_in(Path::new(SYS), &mountinfo, map, originals)
    }

    /// [`apply`](Self::apply) on a given sysfs tree and mount table (tests use fixtures).
    pub fn apply_in(
        sys: &Path,
        mountinfo: &str,
        map: &TunableMap,
        originals: Option<&Path>,
    ) -> Result<Self, TuneError> {
        Self::apply_all_adopting_in(sys, mountinfo, None, map, &[], &[], originals)
    }

    /// The operator's `map` (any failure stops the start, naming the key), then the settings of protection by
    /// default (`protect`, [`super::protect`]: a device whose setting fails is left where it got to, with a
    /// warning, and put back at stop like everything else), on the real `/sys` and the cgroup v2 root `v2_root`
    /// (for io.cost settings; `None` on v1).
    ///
    /// `adopt`: devices protection manages now (not opted out) whose originals an earlier agent recorded and that
    /// are not among `protect`'s settings this time (e.g. the scheduler a killed agent switched: it reads `bfq` now,
    /// so no switch is planned; io.cost a killed agent enabled): those originals are kept and put back at stop too.
    pub fn apply_all(
        v2_root: Option<&Path>,
        map: &TunableMap,
        protect: &[Setting],
        adopt: &[String],
        originals: Option<&Path>,
    ) -> Result<Self, TuneError> {
        let mountinfo = read_mountinfo()?;
        Self::apply_all_adopting_in(Path::new(SYS), &mountinfo, v2_root, map, protect, adopt, originals)
    }

    /// [`apply_all`](Self::apply_all) on a given sysfs tree, mount table and v2 root (tests use fixtures).
    pub fn apply_all_adopting_in(
        sys: &Path,
        mountinfo: &str,
        v2_root: Option<&Path>,
        map: &TunableMap,
        protect: &[Setting],
        adopt: &[String],
        originals: Option<&Path>,
    ) -> Result<Self, TuneError> {
        validate_map(map)?;
        let mut me = TunedDevices {
            sys: sys.to_path_buf(),
            mountinfo: mountinfo.to_string(),
            v2_root: v2_root.map(Path::to_path_buf),
            tuned: Vec::new(),
            kept: BTreeMap::new(),
            file: None,
            restored: false,
        };
        let Some(file) = originals else {
            for (device, tunables) in map {
                for (key, value) in tunables {
                    info!(device = %device, tunable = %key, value = %value, "dry run: would set BFQ tunable");
                }
            }
            for s in protect {
                info!(device = %s.device, setting = %s.key, value = %s.value, "dry run: protect would set");
            }
            me.restored = true;
            return Ok(me);
        };
        // Originals a killed agent left behind: the values now on the devices are its, not the operator's.
        let earlier = read_originals(file)?;
        let adopted = |device: &String, key: &String| {
            adopt.contains(device)
                && !map.get(device).is_some_and(|t| t.contains_key(key))
                && !protect.iter().any(|s| &s.device == device && &s.key == key)
        };
        if map.values().all(BTreeMap::is_empty)
            && protect.is_empty()
            && !earlier.iter().any(|(d, t)| t.keys().any(|k| adopted(d, k)))
        {
            me.restored = true;
            return Ok(me);
        }
        me.file = Some(file.to_path_buf());
        let configured = |device: &String, key: &String| {
            map.get(device).is_some_and(|t| t.contains_key(key))
                || protect.iter().any(|s| &s.device == device && &s.key == key)
                || adopted(device, key)
        };
        for (device, tunables) in &earlier {
            for (key, original) in tunables.iter().filter(|(k, _)| !configured(device, k)) {
                // No longer configured, so not this agent's to touch: the operator puts it back.
                warn!(device = %device, tunable = %key, original = %original, file = %file.display(),
                      "a device setting an earlier agent made is no longer configured; not restored, its original \
                       stays in the file: write it back by hand if it is still changed (or run `ddiskqos-agent \
                       devices restore` once this agent has stopped)");
                me.kept.entry(device.clone()).or_default().insert(key.clone(), original.clone());
            }
        }
        // Adopted first, so they go back last (a scheduler after the tunables it resets).
        for (device, settings) in &earlier {
            let mut keys: Vec<&String> = settings.keys().filter(|k| adopted(device, k)).collect();
            keys.sort_by_key(|k| k.as_str() != super::setting::SCHEDULER);
            for key in keys {
                let original = &settings[key];
                let now = read_setting(sys, v2_root, device, key).unwrap_or_else(|e| format!("(unreadable: {e})"));
                info!(device = %device, setting = %key, now = %now, original = %original,
                      "protect: a setting an agent that did not stop cleanly made; its original is put back at stop");
                me.tuned.push(Tuned {
                    device: device.clone(),
                    key: key.clone(),
                    original: original.clone(),
                    value: now,
                    by: "protect (adopted)".into(),
                });
            }
        }
        me.write_originals()?;
        let mut allowed: Vec<String> = map.keys().cloned().collect();
        allowed.extend(protect.iter().map(|s| s.device.clone()));
        for (device, tunables) in map {
            for (key, value) in tunables {
                let n = validate(key, value).expect("validated above").to_string();
                let err = |source| TuneError::Device {
                    device: device.clone(),
                    key: key.clone(),
                    value: value.to_string(),
                    source: Box::new(source),
                };
                require_bfq(sys, device).map_err(err)?;
                me.set_one(device, key, &n, By::Operator, &allowed, &earlier).map_err(|e| match e {
                    SetError::Device(d) => err(d),
                    SetError::File(f) => f,
                })?;
            }
        }
        let mut failed: Vec<&str> = Vec::new();
        for s in protect {
            if failed.contains(&s.device.as_str()) {
                continue;
            }
            match me.set_one(&s.device, &s.key, &s.value, By::Protect, &allowed, &earlier) {
                Ok(_) => {}
                Err(SetError::File(f)) => return Err(f),
                Err(SetError::Device(e)) => {
                    failed.push(&s.device);
                    warn!(device = %s.device, setting = %s.key, value = %s.value, error = %e,
                          "protect: cannot set; this device's remaining settings are skipped (what was set is put \
                           back at stop). Opt it out with [devices] opt_out = [\"{}\"]", s.device);
                }
            }
        }
        Ok(me)
    }

    /// Sets one setting, recording its original first (the earlier agent's, if it left one); logs old and new.
    fn set_one(
        &mut self,
        device: &str,
        key: &str,
        value: &str,
        by: By,
        allowed: &[String],
        earlier: &BTreeMap<String, BTreeMap<String, String>>,
    ) -> Result<String, SetError> {
        let sys = self.sys.clone();
        let v2_root = self.v2_root.clone();
        // Record before writing, so a kill between the two still leaves the original on disk.
        let current = read_setting(&sys, v2_root.as_deref(), device, key).map_err(SetError::Device)?;
        let original = earlier.get(device).and_then(|t| t.get(key)).cloned().unwrap_or(current.clone());
        self.tuned.push(Tuned {
            device: device.into(),
            key: key.into(),
            original,
            value: value.into(),
            by: by.as_str().into(),
        });
        self.write_originals().map_err(SetError::File)?;
        let old = match write_setting(&sys, &self.mountinfo, v2_root.as_deref(), device, key, value, allowed) {
            Ok(old) => old,
            Err(e) => {
                // Refused before writing: nothing of ours to put back on this one. (Written but read back
                // otherwise: it stays listed, and restoring puts the original back.)
                if read_setting(&sys, v2_root.as_deref(), device, key).is_ok_and(|now| now == current) {
                    self.tuned.pop();
                    self.write_originals().map_err(SetError::File)?;
                }
                return Err(SetError::Device(e));
            }
        };
        let t = self.tuned.last().expect("pushed above");
        match by {
            By::Operator => info!(device = %device, tunable = %key, old = %old, new = %value, original = %t.original,
                                  "set BFQ tunable, as configured"),
            By::Protect => info!(device = %device, setting = %key, old = %old, new = %value, original = %t.original,
                                 "protect: set device setting (restored at stop)"),
        }
        Ok(old)
    }

    /// A read-only view of what was set, for status and metrics; it reads the settings back when asked.
    pub fn view(&self, notes: Vec<(String, String)>) -> DeviceSettingsView {
        DeviceSettingsView { sys: self.sys.clone(), v2_root: self.v2_root.clone(), entries: self.tuned.clone(), notes }
    }

    /// For uninstalling after an agent that did not stop cleanly (`ddiskqos-agent devices restore`): every original
    /// the originals file `file` holds, to be put back with [`restore`](Self::restore) (which removes the file
    /// once all went back). An absent file: nothing to restore.
    pub fn from_originals_file(v2_root: Option<&Path>, file: &Path) -> Result<Self, TuneError> {
        let mountinfo = read_mountinfo()?;
        Self::from_originals_file_in(Path::new(SYS), &mountinfo, v2_root, file)
    }

    /// [`from_originals_file`](Self::from_originals_file) on a given sysfs tree and mount table.
    pub fn from_originals_file_in(
        sys: &Path,
        mountinfo: &str,
        v2_root: Option<&Path>,
        file: &Path,
    ) -> Result<Self, TuneError> {
        let earlier = read_originals(file)?;
        let mut tuned = Vec::new();
        // The order they were set in is not kept: the scheduler goes back last (switching it resets BFQ's tunables).
        for (device, settings) in &earlier {
            for (key, original) in settings.iter().filter(|(k, _)| k.as_str() != super::setting::SCHEDULER) {
                tuned.push(Tuned::recorded(device, key, original));
            }
            if let Some(original) = settings.get(super::setting::SCHEDULER) {
                tuned.push(Tuned::recorded(device, super::setting::SCHEDULER, original));
            }
        }
        // `restore` goes last to first.
        tuned.reverse();
        Ok(TunedDevices {
            sys: sys.to_path_buf(),
            mountinfo: mountinfo.to_string(),
            v2_root: v2_root.map(Path::to_path_buf),
            restored: tuned.is_empty(),
            tuned,
            kept: BTreeMap::new(),
            file: Some(file.to_path_buf()),
        })
    }

    /// What was set.
    pub fn tuned(&self) -> &[Tuned] {
        &self.tuned
    }

    /// Writes the originals of what was set and of what is kept.
    fn write_originals(&self) -> Result<(), TuneError> {
        self.write_records(&self.tuned)
    }

    fn write_records(&self, tuned: &[Tuned]) -> Result<(), TuneError> {
        let Some(path) = &self.file else { return Ok(()) };
        let mut map: BTreeMap<&str, BTreeMap<&str, &str>> = BTreeMap::new();
        for (device, settings) in &self.kept {
            for (key, original) in settings {
                map.entry(device).or_default().insert(key, original);
            }
        }
        for t in tuned {
            map.entry(&t.device).or_default().insert(&t.key, &t.original);
        }
        let text = serde_json::to_string_pretty(&map).expect("a map of strings serializes");
        // Beside the state file, maybe in a shared directory: written as the state file is (0600, no symlink).
        crate::state::write_private(path, text.as_bytes())
            .map_err(|e| TuneError::File { path: path.clone(), reason: e.to_string() })
    }

    /// Puts every original back (last set, first restored), logs each, and removes the originals file when all
    /// went back (or leaves in it only the kept ones). Returns how many failed (each is logged with the device,
    /// tunable and value).
    pub fn restore(&mut self) -> usize {
        if self.restored {
            return 0;
        }
        self.restored = true;
        let allowed: Vec<String> = self.tuned.iter().map(|t| t.device.clone()).collect();
        let mut failures = 0;
        for t in self.tuned.iter().rev() {
            let sys = &self.sys;
            match restore_setting(
                sys,
                &self.mountinfo,
                self.v2_root.as_deref(),
                &t.device,
                &t.key,
                &t.original,
                &allowed,
            ) {
                Ok(_) => info!(device = %t.device, tunable = %t.key, value = %t.original, now = %t.value,
                               "restored device setting (BFQ tunable, scheduler or io.cost)"),
                Err(e) => {
                    failures += 1;
                    warn!(device = %t.device, tunable = %t.key, value = %t.original, error = %e,
                          "cannot restore BFQ tunable");
                }
            }
        }
        if failures == 0 && !self.kept.is_empty() {
            if let Err(e) = self.write_records(&[]) {
                warn!(error = %e, "cannot rewrite the device settings' originals file with the kept ones only");
            }
        } else if failures == 0 {
            if let Some(path) = &self.file {
                if let Err(e) = std::fs::remove_file(path) {
                    if e.kind() != std::io::ErrorKind::NotFound {
                        warn!(file = %path.display(), error = %e, "cannot remove the BFQ tunables' originals file");
                    }
                }
            }
        }
        failures
    }
}

impl Drop for TunedDevices {
    fn drop(&mut self) {
        self.restore();
    }
}

fn require_bfq(sys: &Path, device: &str) -> Result<(), DeviceError> {
    let s = super::scheduler_in(sys, device)?;
    if s.active != "bfq" {
        return Err(DeviceError::Refused {
            device: device.into(),
            reason: format!(
                "its scheduler is {:?}, not bfq: add it to devices.switch_to_bfq (or set bfq yourself)",
                s.active
            ),
        });
    }
    Ok(())
}

/// Who asked for a setting.
#[derive(Debug, Clone, Copy)]
enum By {
    Operator,
    Protect,
}

impl By {
    fn as_str(self) -> &'static str {
        match self {
            By::Operator => "bfq_tunables",
            By::Protect => "protect",
        }
    }
}

enum SetError {
    Device(DeviceError),
    File(TuneError),
}

/// One device setting the agent made, read back now: what `status` and the metrics show.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SettingRow {
    /// The device, e.g. `sdb`.
    pub device: String,
    /// `strict_guarantees`, `max_budget`, `timeout_sync`, ... (BFQ tunables), `scheduler`, `io.cost.model`,
    /// `io.cost.qos`.
    pub setting: String,
    /// What it was before the agent: put back at stop.
    pub original: String,
    /// What the agent set.
    pub set: String,
    /// What it reads now (`None`: it could not be read).
    pub now: Option<String>,
    /// `bfq_tunables` or `protect`.
    pub by: String,
}

impl SettingRow {
    /// Whether the device reads what the agent set (io.cost lines: every `key=value` the agent wrote is there).
    pub fn as_set(&self) -> bool {
        match &self.now {
            None => false,
            Some(now) if self.setting.starts_with("io.cost") => super::setting::line_has_all(now, &self.set),
            Some(now) => *now == self.set,
        }
    }
}

/// What the agent set on devices, read back on demand (each call reads sysfs: a few small files per device).
#[derive(Debug, Clone, Default)]
pub struct DeviceSettingsView {
    sys: PathBuf,
    v2_root: Option<PathBuf>,
    entries: Vec<Tuned>,
    notes: Vec<(String, String)>,
}

impl DeviceSettingsView {
    /// Every setting made, read back now.
    pub fn read_back(&self) -> Vec<SettingRow> {
        self.entries
            .iter()
            .map(|t| SettingRow {
                device: t.device.clone(),
                setting: t.key.clone(),
                original: t.original.clone(),
                set: t.value.clone(),
                now: read_setting(&self.sys, self.v2_root.as_deref(), &t.device, &t.key).ok(),
                by: t.by.clone(),
            })
            .collect()
    }

    /// Managed devices protection left as they were, with why (opted out, the root disk, ...).
    pub fn notes(&self) -> &[(String, String)] {
        &self.notes
    }
}

fn read_originals(path: &Path) -> Result<BTreeMap<String, BTreeMap<String, String>>, TuneError> {
    match std::fs::read_to_string(path) {
        Ok(text) => {
            let map: BTreeMap<String, BTreeMap<String, String>> = serde_json::from_str(&text)
                .map_err(|e| TuneError::File { path: path.into(), reason: format!("malformed: {e}") })?;
            if !map.is_empty() {
                warn!(file = %path.display(), "BFQ tunables of an agent that did not stop cleanly: their originals \
                      will be restored at this agent's shutdown");
            }
            Ok(map)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(BTreeMap::new()),
        Err(e) => Err(TuneError::File { path: path.into(), reason: e.to_string() }),
    }
}
