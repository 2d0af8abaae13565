//! Prometheus metrics: per-container level, weight and bytes; decisions; round duration; failures; runtime
//! outages. Served as text on a loopback address when `[metrics] enabled = true` ([`crate::ops::http`]).

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

/// Labels of a per-container series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ContainerLabels {
    /// Short container id.
    pub id: String,
    /// Container name.
    pub name: String,
}

/// Labels of the decision counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    /// Why the weight changed (`demoted`, `boosted`, ...).
    pub reason: String,
}

/// Labels of the CRI request counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CallLabels {
    /// The CRI call (`ListPodSandbox`, `PodSandboxStatus`, ...).
    pub call: String,
}

/// Every metric the agent exports.
#[derive(Debug)]
pub struct Metrics {
    /// Level per container, 0-based (0 = top); status and logs show it 1-based ([`crate::daemon::display_level`]).
    pub level: Family<ContainerLabels, Gauge>,
    /// Weight per container, as verified in the cgroup file.
    pub weight: Family<ContainerLabels, Gauge>,
    /// Bytes counted per container since the agent first saw it.
    pub bytes: Family<ContainerLabels, Gauge>,
    /// Containers currently known.
    pub containers: Gauge,
    /// Decisions taken, by reason.
    pub decisions: Family<ReasonLabels, Counter>,
    /// Weight writes that failed or did not verify.
    pub write_failures: Counter,
    /// Counter reads that failed.
    pub sample_failures: Counter,
    /// 1 while the container runtime answers.
    pub runtime_up: Gauge,
    /// Times the runtime became unreachable.
    pub runtime_outages: Counter,
    /// Sampling-round duration in seconds.
    pub round_seconds: Histogram,
    /// CPU time spent in sampling rounds, in seconds (its rate is the share of a core they use).
    pub round_cpu_seconds: Counter<f64, AtomicU64>,
    /// Current time between round starts: `sample_interval`, or longer when the CPU budget stretches it.
    pub round_interval_seconds: Gauge<f64, AtomicU64>,
    /// Per device: 1 if a cgroup weight acts on it, 0 if not (see [`DeviceWeightEffective`]).
    pub device_weight_effective: DeviceWeightEffective,
    /// CRI calls made, by call (`runtime = "cri"`).
    pub cri_requests: Family<CallLabels, Counter>,
    /// The device settings the agent made (protection by default, `bfq_tunables`), read back at each scrape.
    pub device_settings: DeviceSettingsMetrics,
}

impl Metrics {
    /// Creates the metrics.
    pub fn new() -> Self {
        Self {
            level: Family::default(),
            weight: Family::default(),
            bytes: Family::default(),
            containers: Gauge::default(),
            decisions: Family::default(),
            write_failures: Counter::default(),
            sample_failures: Counter::default(),
            runtime_up: Gauge::default(),
            runtime_outages: Counter::default(),
            round_seconds: Histogram::new(exponential_buckets(1e-5, 2.0, 18)),
            round_cpu_seconds: Counter::default(),
            round_interval_seconds: Gauge::default(),
            device_weight_effective: DeviceWeightEffective::default(),
            cri_requests: Family::default(),
            device_settings: DeviceSettingsMetrics::default(),
        }
    }

    fn registry(self: &Arc<Self>) -> Registry {
        let mut r = Registry::with_prefix("ddiskqos");
        r.register("container_level", "MLFQ level per container (0 = top)", self.level.clone());
        r.register("container_weight", "Block-I/O weight per container, as read back", self.weight.clone());
        r.register("container_bytes", "Bytes counted per container since first seen", self.bytes.clone());
        r.register("containers", "Containers known", self.containers.clone());
        r.register("decisions", "Weight decisions, by reason", self.decisions.clone());
        r.register("write_failures", "Weight writes that failed or did not verify", self.write_failures.clone());
        r.register("sample_failures", "Counter reads that failed", self.sample_failures.clone());
        r.register("runtime_up", "1 while the container runtime answers", self.runtime_up.clone());
        r.register("runtime_outages", "Times the container runtime became unreachable", self.runtime_outages.clone());
        r.register("round_duration_seconds", "Duration of one sampling round", self.round_seconds.clone());
        r.register("round_cpu_seconds", "CPU time spent in sampling rounds", self.round_cpu_seconds.clone());
        r.register(
            "round_interval_seconds",
            "Time between sampling rounds (stretched beyond sample_interval by the CPU budget)",
            self.round_interval_seconds.clone(),
        );
        self.device_weight_effective.register(&mut r);
        r.register("cri_requests", "CRI calls made, by call", self.cri_requests.clone());
        self.device_settings.register(&mut r);
        r
    }

    /// Renders the text exposition format.
    pub fn render(self: &Arc<Self>) -> String {
        // The device settings are read back now, so a scrape sees what the devices say, not what was written.
        let _ = self.device_settings.rows();
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry()).expect("writing to a String");
        out
    }

    /// Drops every series of a removed container, so memory returns to baseline under churn.
    pub fn forget(&self, labels: &ContainerLabels) {
        self.level.remove(labels);
        self.weight.remove(labels);
        self.bytes.remove(labels);
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

// ----- Per-device weight effectiveness (cgroup v2: which weight file acts on each device) -----

/// Labels of `ddiskqos_device_weight_effective`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DeviceLabels {
    /// `MAJ:MIN`.
    pub device: String,
    /// `bfq`, `io-cost`, `bfq+io-cost` or `none`.
    pub governor: String,
}

/// `ddiskqos_device_weight_effective{device,governor}`: 1 when a cgroup weight acts on the device (BFQ, io.cost),
/// 0 when none does. One series per device: a device whose governor changes loses its old series. Set by the
/// weight writer, which owns the device table; cheap to clone (shared).
#[derive(Clone, Debug, Default)]
pub struct DeviceWeightEffective {
    family: Family<DeviceLabels, Gauge>,
    current: Arc<std::sync::Mutex<std::collections::BTreeMap<String, String>>>,
}

impl DeviceWeightEffective {
    /// Records what governs `device` now.
    pub fn set(&self, device: &str, governor: &str, effective: bool) {
        let mut current = self.current.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(old) = current.insert(device.to_owned(), governor.to_owned()) {
            if old != governor {
                self.family.remove(&DeviceLabels { device: device.to_owned(), governor: old });
            }
        }
        let labels = DeviceLabels { device: device.to_owned(), governor: governor.to_owned() };
        self.family.get_or_create(&labels).set(i64::from(effective));
    }

    /// The value of `device`'s series, with its governor label (for tests and status).
    pub fn get(&self, device: &str) -> Option<(String, i64)> {
        let current = self.current.lock().unwrap_or_else(|e| e.into_inner());
        let governor = current.get(device)?.clone();
        let value =
            self.family.get_or_create(&DeviceLabels { device: device.to_owned(), governor: governor.clone() }).get();
        Some((governor, value))
    }

    fn register(&self, registry: &mut Registry) {
        registry.register(
            "device_weight_effective",
            "1 if a cgroup block-I/O weight acts on the device (BFQ or io.cost), 0 if none does",
            self.family.clone(),
        );
    }
}

// ----- Device settings (protection by default and `bfq_tunables`): read back at each scrape and status -----

/// Labels of `ddiskqos_device_setting` and `ddiskqos_device_setting_as_set`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SettingLabels {
    /// The device, e.g. `sdb`.
    pub device: String,
    /// `strict_guarantees`, `max_budget`, `timeout_sync`, `scheduler`, `io.cost.model`, `io.cost.qos`, ...
    pub setting: String,
}

/// `ddiskqos_device_setting{device,setting}`: the value a numeric setting reads now (BFQ tunables);
/// `ddiskqos_device_setting_as_set{device,setting}`: 1 while the device reads what the agent set, 0 when not
/// (someone changed it, or it cannot be read). Cheap to clone (shared).
#[derive(Clone, Debug, Default)]
pub struct DeviceSettingsMetrics {
    view: Arc<std::sync::Mutex<Option<crate::blockdev::tune::DeviceSettingsView>>>,
    value: Family<SettingLabels, Gauge>,
    as_set: Family<SettingLabels, Gauge>,
}

impl DeviceSettingsMetrics {
    /// What the agent set, to be read back from now on.
    pub fn set_view(&self, view: crate::blockdev::tune::DeviceSettingsView) {
        *self.view.lock().unwrap_or_else(|e| e.into_inner()) = Some(view);
    }

    /// Every setting read back now (updating both gauges), and the managed devices left as they were, with why.
    pub fn rows(&self) -> (Vec<crate::blockdev::tune::SettingRow>, Vec<(String, String)>) {
        let view = self.view.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let Some(view) = view else { return (Vec::new(), Vec::new()) };
        let rows = view.read_back();
        for r in &rows {
            let labels = SettingLabels { device: r.device.clone(), setting: r.setting.clone() };
            self.as_set.get_or_create(&labels).set(i64::from(r.as_set()));
            if let Some(n) = r.now.as_deref().and_then(|n| n.parse::<i64>().ok()) {
                self.value.get_or_create(&labels).set(n);
            }
        }
        (rows, view.notes().to_vec())
    }

    fn register(&self, registry: &mut Registry) {
        registry.register(
            "device_setting",
            "A numeric device setting the agent made (BFQ tunable), as read back now",
            self.value.clone(),
        );
        registry.register(
            "device_setting_as_set",
            "1 while a device setting the agent made reads what it set, 0 when not",
            self.as_set.clone(),
        );
    }
}
