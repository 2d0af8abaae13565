//! Opt-in BFQ tunables (`[devices] bfq_tunables`): set at start-up on the devices the operator names, logged with
//! their old and new value, and put back on a clean shutdown.
//!
//! Why: on cgroup v1, BFQ lets a newly busy group preempt the group in service only among top-level groups, so
//! containers in Docker's default layout (`docker/<id>`, siblings under one parent) wait for the background's slot
//! to end whatever their weight. A small `max_budget` (and a short `timeout_sync`) ends every slot soon, and then
//! the weights decide who is served next (crate README, "Docker's default layout on cgroup v1").
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

use super::switch::set_bfq_tunable_in;
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
    /// The tunable.
    pub key: String,
    /// What it read before the agent (or a killed earlier agent) changed it: what a clean shutdown puts back.
    pub original: String,
    /// What the agent wrote.
    pub value: String,
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
    tuned: Vec<Tuned>,
    /// The originals file, removed once everything is restored; `None` in dry run or when nothing was set.
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

impl TunedDevices {
    /// Sets every configured tunable on the real `/sys`, keeping the originals in `originals` (see
    /// [`originals_path`]; `None`: dry run, nothing is written and the plan is only logged).
    pub fn apply(map: &TunableMap, originals: Option<&Path>) -> Result<Self, TuneError> {
        let mountinfo = std::fs::read_to_string(MOUNTINFO)
            .map_err(|e| TuneError::File { path: MOUNTINFO.into(), reason: e.to_string() })?;
        Self::apply_in(Path::new(SYS), &mountinfo, map, originals)
    }

    /// [`apply`](Self::apply) on a given sysfs tree and mount table (tests use fixtures).
    pub fn apply_in(
        sys: &Path,
        mountinfo: &str,
        map: &TunableMap,
        originals: Option<&Path>,
    ) -> Result<Self, TuneError> {
        validate_map(map)?;
        let mut me = TunedDevices {
            sys: sys.to_path_buf(),
            mountinfo: mountinfo.to_string(),
            tuned: Vec::new(),
            file: None,
            restored: false,
        };
        let Some(file) = originals else {
            for (device, tunables) in map {
                for (key, value) in tunables {
                    info!(device = %device, tunable = %key, value = %value, "dry run: would set BFQ tunable");
                }
            }
            me.restored = true;
            return Ok(me);
        };
        if map.values().all(BTreeMap::is_empty) {
            me.restored = true;
            return Ok(me);
        }
        // Originals a killed agent left behind: the values now on the devices are its, not the operator's.
        let earlier = read_originals(file)?;
        for (device, tunables) in &earlier {
            for (key, original) in tunables {
                if !map.get(device).is_some_and(|t| t.contains_key(key)) {
                    // No longer configured, so not this agent's to touch: the operator puts it back.
                    warn!(device = %device, tunable = %key, original = %original,
                          "a BFQ tunable an earlier agent set is no longer configured; not restored: write the original \
                           back by hand if it is still changed");
                }
            }
        }
        let allowed: Vec<String> = map.keys().cloned().collect();
        me.file = Some(file.to_path_buf());
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
                // Record before writing, so a kill between the two still leaves the original on disk.
                let current = read_tunable(sys, device, key).map_err(err)?;
                let original = earlier.get(device).and_then(|t| t.get(key)).cloned().unwrap_or(current.clone());
                me.tuned.push(Tuned { device: device.clone(), key: key.clone(), original, value: n.clone() });
                me.write_originals()?;
                let old = match set_bfq_tunable_in(sys, mountinfo, device, key, &n, &allowed) {
                    Ok(old) => old,
                    Err(e) => {
                        // Refused before writing: nothing of ours to put back on this one. (Written but read back
                        // otherwise: it stays listed, and dropping `me` tries to put the original back.)
                        if read_tunable(sys, device, key).is_ok_and(|now| now == current) {
                            me.tuned.pop();
                            me.write_originals()?;
                        }
                        return Err(err(e));
                    }
                };
                let t = me.tuned.last().expect("pushed above");
                info!(device = %device, tunable = %key, old = %old, new = %n, original = %t.original,
                      "set BFQ tunable, as configured");
            }
        }
        Ok(me)
    }

    /// What was set.
    pub fn tuned(&self) -> &[Tuned] {
        &self.tuned
    }

    fn write_originals(&self) -> Result<(), TuneError> {
        let Some(path) = &self.file else { return Ok(()) };
        let mut map: BTreeMap<&str, BTreeMap<&str, &str>> = BTreeMap::new();
        for t in &self.tuned {
            map.entry(&t.device).or_default().insert(&t.key, &t.original);
        }
        let text = serde_json::to_string_pretty(&map).expect("a map of strings serializes");
        // Beside the state file, maybe in a shared directory: written as the state file is (0600, no symlink).
        crate::state::write_private(path, text.as_bytes())
            .map_err(|e| TuneError::File { path: path.clone(), reason: e.to_string() })
    }

    /// Puts every original back (last set, first restored), logs each, and removes the originals file when all
    /// went back. Returns how many failed (each is logged with the device, tunable and value).
    pub fn restore(&mut self) -> usize {
        if self.restored {
            return 0;
        }
        self.restored = true;
        let allowed: Vec<String> = self.tuned.iter().map(|t| t.device.clone()).collect();
        let mut failures = 0;
        for t in self.tuned.iter().rev() {
            match set_bfq_tunable_in(&self.sys, &self.mountinfo, &t.device, &t.key, &t.original, &allowed) {
                Ok(_) => info!(device = %t.device, tunable = %t.key, value = %t.original, "restored BFQ tunable"),
                Err(e) => {
                    failures += 1;
                    warn!(device = %t.device, tunable = %t.key, value = %t.original, error = %e,
                          "cannot restore BFQ tunable");
                }
            }
        }
        if failures == 0 {
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

fn read_tunable(sys: &Path, device: &str, key: &str) -> Result<String, DeviceError> {
    let path = super::queue_dir(sys, device).join("iosched").join(key);
    std::fs::read_to_string(&path).map(|s| s.trim().to_string()).map_err(|source| DeviceError::Io {
        op: "read",
        path,
        source,
    })
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
