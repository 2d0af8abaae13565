//! The status protocol (`ddiskqos-agent status`, JSON over the control socket) and the one level-numbering rule.

use qos_core::Policy;
use serde::{Deserialize, Serialize};

use super::{now, Daemon};
use crate::backend::{AppliedVia, CounterSource, Discovery, WeightWriter};
use crate::blockdev::DeviceFacts;
use crate::config::ActuatorMode;

/// The level numbering shown to people.
///
/// Levels are 0-based (0 = top) everywhere inside: in the engine, the reconciler and the `ddiskqos_container_level`
/// metric (whose value is the 0-based level). They are shown 1-based (1 = top, like the paper's Table 1) in the
/// status table ([`StatusRow::level`]) and in log lines (`old_level`, `new_level`). This is the only conversion.
pub fn display_level(level: usize) -> usize {
    level + 1
}

/// How a container is treated, as the status table says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PolicyKind {
    /// Moves through the levels.
    Managed,
    /// Held at a fixed weight (`ddiskqos.weight` label).
    Pinned,
    /// Left alone (`ddiskqos.exclude` label).
    Excluded,
}

impl PolicyKind {
    /// The name in the table and in JSON: `managed`, `pinned` or `excluded`.
    pub fn as_str(self) -> &'static str {
        match self {
            PolicyKind::Managed => "managed",
            PolicyKind::Pinned => "pinned",
            PolicyKind::Excluded => "excluded",
        }
    }
}

impl std::fmt::Display for PolicyKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.as_str())
    }
}

/// How weights are applied: the configured mode, and the path the last verified write took.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Actuator {
    /// `actuator` from the config: `auto`, `docker`, `files` or `systemd`.
    pub configured: ActuatorMode,
    /// `docker`, `files` or `systemd`: the path that delivered the last verified write; `None` before the first one (in
    /// `auto`, the path is only known once a write went through).
    pub in_use: Option<AppliedVia>,
}

impl Actuator {
    /// `files`, `docker`, `systemd`, or before the first write the configured mode and `(nothing written yet)`.
    pub fn describe(&self) -> String {
        let configured = match self.configured {
            ActuatorMode::Auto => "auto",
            ActuatorMode::Docker => "docker",
            ActuatorMode::Files => "files",
            ActuatorMode::Systemd => "systemd",
        };
        match self.in_use {
            Some(via) if via.as_str() == configured => configured.to_string(),
            Some(via) => format!("{} (configured: {configured})", via.as_str()),
            None => format!("{configured} (nothing written yet)"),
        }
    }
}

/// One row of `ddiskqos-agent status`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StatusRow {
    /// Container id (short).
    pub id: String,
    /// Container name.
    pub name: String,
    /// How it is treated.
    pub policy: PolicyKind,
    /// Level, shown 1-based ([`display_level`]); `None` when not managed.
    pub level: Option<usize>,
    /// The weight verified in the cgroup file (in dry run: decided), if the agent wrote one.
    pub weight: Option<u32>,
    /// Bytes counted at the current level.
    pub bytes_at_level: u64,
    /// Seconds at the current level.
    pub seconds_at_level: f64,
    /// The cap in force at the bottom level (bytes per second, each direction), if the agent set one.
    #[serde(default)]
    pub cap: Option<qos_core::Cap>,
    /// cgroup v2: each device of the container's last weight read or write (the devices of its `io.stat` and of
    /// `[devices] check`), what governs it, and the weight read back in the file(s) that act on it. Empty on v1.
    #[serde(default)]
    pub devices: Vec<DeviceRow>,
}

/// One device of a container, as the status table shows it (cgroup v2).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceRow {
    /// `MAJ:MIN`.
    pub device: String,
    /// The disk's name in /sys/block, when known.
    pub disk: Option<String>,
    /// `bfq`, `io-cost`, `bfq+io-cost`, or `none` (no weight acts on the device).
    pub governor: String,
    /// The file(s) written that act on the device and the effective value each read back (its `MAJ:MIN` line, else
    /// its default), in that file's scale; empty when nothing acts on it or before the first read-back.
    pub weights: Vec<FileWeight>,
}

/// A weight file and the value in force in it for one device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileWeight {
    /// `io.bfq.weight` or `io.weight`.
    pub file: String,
    /// The effective value read back.
    pub effective: u32,
}

/// A device the agent has looked at (cgroup v2), with what governs it and, where no weight acts, the fix.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceSummary {
    /// `MAJ:MIN`.
    pub device: String,
    /// The disk's name in /sys/block, when known.
    pub disk: Option<String>,
    /// Its active scheduler, when it could be read.
    pub scheduler: Option<String>,
    /// `bfq`, `io-cost`, `bfq+io-cost` or `none`.
    pub governor: String,
    /// How to make weights act on it, when none does.
    pub fix: Option<String>,
    /// Why the facts may be incomplete (a read that failed).
    pub error: Option<String>,
}

impl DeviceSummary {
    fn of(facts: &DeviceFacts) -> Self {
        Self {
            device: facts.dev.to_string(),
            disk: facts.disk.clone(),
            scheduler: facts.scheduler.clone(),
            governor: facts.governor.as_str().to_string(),
            fix: (!facts.governor.is_effective()).then(|| facts.fix()),
            error: facts.error.clone(),
        }
    }
}

/// The status table.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Status {
    /// How weights are applied.
    pub actuator: Actuator,
    /// Whether writes are suppressed.
    pub dry_run: bool,
    /// One row per container, by name.
    pub containers: Vec<StatusRow>,
    /// The state file cannot be saved: weight changes are held (originals put back) until it can.
    #[serde(default)]
    pub saves_held: bool,
    /// cgroup v2: every device the weight writer has looked at, by device number. Empty on v1.
    #[serde(default)]
    pub devices: Vec<DeviceSummary>,
    /// Every device setting the agent made (protection by default, `bfq_tunables`), read back now.
    #[serde(default)]
    pub device_settings: Vec<crate::blockdev::tune::SettingRow>,
    /// Managed devices protection left as they were: `[device, why]`.
    #[serde(default)]
    pub devices_left: Vec<(String, String)>,
}

impl<D: Discovery, C: CounterSource, W: WeightWriter> Daemon<D, C, W> {
    /// The table, sorted by name.
    pub(super) fn status(&self) -> Status {
        let t = now();
        let (device_settings, devices_left) = self.metrics.device_settings.rows();
        let table = self.devices.as_ref().map(|d| d.device_table()).unwrap_or_default();
        let disk_of = |dev| table.iter().find(|f| f.dev == dev).and_then(|f| f.disk.clone());
        let mut rows: Vec<StatusRow> = self
            .tracked
            .iter()
            .map(|(id, tr)| {
                let v = self.engine.container(id, t);
                let (policy, level) = match v.as_ref().map(|v| (v.policy, v.level)) {
                    Some((Policy::Managed, l)) => (PolicyKind::Managed, Some(display_level(l))),
                    Some((Policy::Pinned(_), _)) => (PolicyKind::Pinned, None),
                    _ => (PolicyKind::Excluded, None),
                };
                StatusRow {
                    id: id.short().to_string(),
                    name: tr.info.name.clone(),
                    policy,
                    level,
                    weight: self.reconciler.applied(id).map(qos_core::Weight::get),
                    bytes_at_level: v.as_ref().map_or(0, |v| v.bytes_at_level),
                    seconds_at_level: v.as_ref().map_or(0.0, |v| v.time_at_level.as_secs_f64()),
                    cap: self.caps.get(id).filter(|(_, in_force)| *in_force).map(|(cap, _)| *cap),
                    devices: self
                        .devices
                        .as_ref()
                        .map(|d| d.container_devices(id))
                        .unwrap_or_default()
                        .into_iter()
                        .map(|d| DeviceRow {
                            device: d.dev.to_string(),
                            disk: disk_of(d.dev),
                            governor: d.governor.as_str().to_string(),
                            weights: d
                                .effective
                                .iter()
                                .map(|(kind, v)| FileWeight { file: kind.file_name().to_string(), effective: *v })
                                .collect(),
                        })
                        .collect(),
                }
            })
            .collect();
        rows.sort_by(|a, b| a.name.cmp(&b.name).then(a.id.cmp(&b.id)));
        Status {
            actuator: self.actuator,
            dry_run: self.cfg.dry_run,
            containers: rows,
            saves_held: self.reconciler.saves_held(),
            devices: table.iter().map(DeviceSummary::of).collect(),
            device_settings,
            devices_left,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn enums_use_their_documented_names_in_json() {
        let st = Status {
            actuator: Actuator { configured: ActuatorMode::Auto, in_use: Some(AppliedVia::CgroupFile) },
            dry_run: false,
            containers: vec![StatusRow {
                id: "a".into(),
                name: "n".into(),
                policy: PolicyKind::Excluded,
                level: None,
                weight: None,
                bytes_at_level: 0,
                seconds_at_level: 0.0,
                cap: None,
                devices: vec![DeviceRow {
                    device: "7:3".into(),
                    disk: Some("loop3".into()),
                    governor: "bfq".into(),
                    weights: vec![FileWeight { file: "io.bfq.weight".into(), effective: 10 }],
                }],
            }],
            saves_held: false,
            devices: vec![],
            device_settings: vec![],
            devices_left: vec![],
        };
        let json = serde_json::to_value(&st).unwrap();
        assert_eq!(json["actuator"], serde_json::json!({"configured": "auto", "in_use": "files"}));
        assert_eq!(json["containers"][0]["policy"], "excluded");
        assert_eq!(
            json["containers"][0]["devices"][0],
            serde_json::json!({"device": "7:3", "disk": "loop3", "governor": "bfq",
                               "weights": [{"file": "io.bfq.weight", "effective": 10}]})
        );
        let back: Status = serde_json::from_value(json).unwrap();
        assert_eq!(back.actuator.in_use, Some(AppliedVia::CgroupFile));
        assert_eq!(back.containers[0].devices[0].weights[0].effective, 10);
        // An answer from an agent without per-device status (or on v1) still parses.
        let old = serde_json::json!({"actuator": {"configured": "auto", "in_use": null}, "dry_run": false,
            "containers": [{"id": "a", "name": "n", "policy": "managed", "level": 1, "weight": 1000,
                            "bytes_at_level": 0, "seconds_at_level": 0.0}]});
        let old: Status = serde_json::from_value(old).unwrap();
        assert!(old.devices.is_empty() && old.containers[0].devices.is_empty());
        let docker = Actuator { configured: ActuatorMode::Auto, in_use: Some(AppliedVia::DockerApi) };
        assert_eq!(serde_json::to_value(docker).unwrap()["in_use"], "docker");
    }

    #[test]
    fn actuator_says_which_path_delivered() {
        let a = |configured, in_use| Actuator { configured, in_use }.describe();
        assert_eq!(a(ActuatorMode::Auto, None), "auto (nothing written yet)");
        assert_eq!(a(ActuatorMode::Auto, Some(AppliedVia::CgroupFile)), "files (configured: auto)");
        assert_eq!(a(ActuatorMode::Files, Some(AppliedVia::CgroupFile)), "files");
    }

    #[test]
    fn levels_are_shown_one_based() {
        assert_eq!(display_level(0), 1);
        assert_eq!(display_level(3), 4);
    }
}
