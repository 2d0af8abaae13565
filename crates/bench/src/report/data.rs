//! The results of a run as data: what the JSON holds and what the table, chart and sweep read. Everything a
//! report shows can be recomputed from here (histograms included), so `ddiskqos-bench report FILE.json` renders
//! an old run again.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::agent::{AgentReport, WeightRead};
use crate::disk::{DiskInfo, IoCostSetting};
use crate::stats::{mib_per_s, Latency, Ratios, Spread, Summary};
use crate::workload::{BfqMode, PaperRow, Plan, Variant};

/// A whole run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunReport {
    /// Configuration, machine, device.
    pub meta: Meta,
    /// One entry per BFQ mode, in the order run.
    pub modes: Vec<ModeReport>,
}

/// Configuration and environment.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Meta {
    /// `ddiskqos-bench <version>`.
    pub tool: String,
    /// When the run started (UTC).
    pub date_utc: String,
    /// `uname -r`.
    pub kernel: String,
    /// Online CPUs.
    pub cpus: usize,
    /// `cgroup` or `docker`.
    pub runtime: String,
    /// Why that runtime.
    pub runtime_reason: String,
    /// `flat` or `nested` cgroups (see `--cgroup-layout`).
    #[serde(default)]
    pub cgroup_layout: String,
    /// The block-I/O cgroup hierarchy, as the agent detected it: `v1 /sys/fs/cgroup/blkio` or `v2 /sys/fs/cgroup`
    /// (empty in reports from before the bench ran on v2).
    #[serde(default)]
    pub cgroup: String,
    /// The agent's daemon and the backends it ran on (`crate::agent::Backends`).
    #[serde(default)]
    pub agent: String,
    /// The background reader's command.
    pub background: String,
    /// The device.
    pub disk: DiskInfo,
    /// The engine's configuration (the agent's `[mlfq]`).
    pub engine: qos_core::Config,
    /// The agent's `sample_interval`, ms.
    pub sample_interval_ms: f64,
    /// The agent's `entry_sample_interval`, ms (`None`: off, or a run before it existed).
    #[serde(default)]
    pub entry_sample_interval_ms: Option<f64>,
    /// Repetitions and schedule.
    pub plan: Plan,
    /// Quick (default) or full (`--full`).
    pub quick: bool,
    /// Pause between foreground reads, ms.
    pub gap_ms: f64,
    /// Pause after entering each block before its first read, ms (`--settle`; 50 before it was recorded).
    #[serde(default = "default_settle_ms")]
    pub settle_ms: f64,
    /// Seed of the file contents.
    pub seed: u64,
    /// Free-form remarks (e.g. what was scaled).
    pub notes: Vec<String>,
    /// Wall time of the whole run, seconds (0 in reports from before it was recorded).
    #[serde(default)]
    pub duration_s: f64,
}

/// Results of one BFQ mode.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ModeReport {
    /// The mode.
    pub mode: BfqMode,
    /// Scheduler and BFQ tunables as read during the mode.
    pub iosched: BTreeMap<String, String>,
    /// Wall time of the mode, seconds.
    pub duration_s: f64,
    /// Experiment 1 cases (Table 3), by size.
    pub exp1: Vec<CaseReport>,
    /// Experiment 2 readers (Table 5).
    pub exp2: Vec<CaseReport>,
    /// The background's throughput over whole variant blocks (reads and pauses between them).
    pub background_blocks: BTreeMap<Variant, Throughput>,
    /// What the agent's daemon did (dry-run switches, restores, its metrics); absent in reports from before the
    /// bench ran the shipped daemon.
    #[serde(default)]
    pub agent: Option<AgentReport>,
    /// io.cost modes: the device's `io.cost.model` and `io.cost.qos` lines as read back (and the calibration).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iocost: Option<IoCostSetting>,
    /// Which file every recorded weight was read from (on cgroup v2 the one that governs the test device).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight_file: Option<String>,
    /// `--static-best`: the static background's weight when it was created, who set it (`set_by`) and how long
    /// after its cgroup was found its file read it (`waited_ms`); the readers' are in their samples.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub static_background: Option<WeightRead>,
}

impl ModeReport {
    /// Every sample of `variant`, Experiment 1's then Experiment 2's.
    pub fn samples(&self, variant: Variant) -> impl Iterator<Item = &Sample> {
        self.exp1.iter().chain(&self.exp2).filter_map(move |r| r.variant(variant)).flat_map(|c| &c.samples)
    }
}

/// Bytes over time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Throughput {
    /// Bytes.
    pub bytes: u64,
    /// Seconds.
    pub secs: f64,
    /// MiB/s.
    pub mib_per_s: f64,
}

impl Throughput {
    /// Adds a window.
    pub fn add(&mut self, bytes: u64, secs: f64) {
        self.bytes += bytes;
        self.secs += secs;
        self.mib_per_s = mib_per_s(self.bytes, self.secs);
    }
}

/// One foreground read.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Sample {
    /// Round (repetition) number.
    pub round: usize,
    /// The reader's own read time, ms.
    pub read_ms: f64,
    /// Cgroup/container creation to exit, ms.
    pub wall_ms: f64,
    /// Bytes read.
    pub bytes: u64,
    /// Bytes the kernel charged to the reader's cgroup, when known.
    pub charged_bytes: Option<u64>,
    /// Background bytes during the read's window.
    pub bg_bytes: u64,
    /// The container/cgroup id.
    pub id: String,
    /// The reader's weight, read from its cgroup file before its first I/O: in dDiskQoS blocks awaited until it
    /// was the top weight, in the others read once (the original).
    #[serde(default)]
    pub weight: Option<WeightRead>,
    /// The background's weight, read from its cgroup file when this reader had finished.
    #[serde(default)]
    pub bg_weight: Option<u32>,
    /// io.cost modes: the device's `cost.vrate` (percent) in the v2 root's `io.stat` when this reader had finished:
    /// how far io.cost scales the model's rates (100 = as the model says).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vrate: Option<f64>,
}

/// One variant of one case.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct VariantCase {
    /// Alone, Original, dDiskQoS or static best.
    pub variant: Variant,
    /// From the histogram.
    pub summary: Summary,
    /// The histogram (µs), hdrhistogram V2 + DEFLATE, base64.
    pub histogram_v2_base64: String,
    /// The histogram as (µs, count) pairs.
    pub histogram_us: Vec<(u64, u64)>,
    /// The background's throughput during this case's read windows.
    pub background_during: Throughput,
    /// Every read, in order.
    pub samples: Vec<Sample>,
}

/// A dDiskQoS read slower than this many times the slowest Original read of the same case is STARVED: no noise of
/// the device explains it, and it fails the run's targets (issue 26).
pub const STARVED_FACTOR: f64 = 2.0;

/// One row of a table: a size (Experiment 1) or a reader (Experiment 2).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CaseReport {
    /// Row label (`1MiB`, `4MiB@2s`).
    pub label: String,
    /// File size.
    pub size_mib: u64,
    /// Start time in the schedule (Experiment 2).
    pub start_ms: Option<u64>,
    /// The paper's numbers for this row.
    pub paper: Option<PaperRow>,
    /// Alone, Original, dDiskQoS, static best (those that ran).
    pub variants: Vec<VariantCase>,
    /// dDiskQoS / Original, from the histograms.
    pub ddiskqos_over_original: Ratios,
    /// dDiskQoS / Alone, from the histograms.
    pub ddiskqos_over_alone: Ratios,
    /// dDiskQoS / Original per repetition (the two reads of the same round, whose blocks ran in the same rotation
    /// of the variants): the median and range. Targets are judged on its median.
    #[serde(default)]
    pub reps_over_original: Option<Spread>,
    /// dDiskQoS / Alone per repetition.
    #[serde(default)]
    pub reps_over_alone: Option<Spread>,
    /// dDiskQoS / static best, from the histograms; `None` where the static-best variant did not run (and in reports
    /// from before it existed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ddiskqos_over_static_best: Option<Ratios>,
    /// dDiskQoS / static best per repetition (issue 25's target is judged on its median).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reps_over_static_best: Option<Spread>,
}

impl CaseReport {
    /// Builds a row from per-variant histograms and samples; the ratios come from the histograms' summaries.
    pub fn build(
        label: String,
        size_mib: u64,
        start_ms: Option<u64>,
        paper: Option<PaperRow>,
        parts: Vec<(Variant, Latency, Throughput, Vec<Sample>)>,
    ) -> Self {
        let variants: Vec<VariantCase> = parts
            .into_iter()
            .map(|(variant, lat, bg, samples)| VariantCase {
                variant,
                summary: lat.summary(),
                histogram_v2_base64: lat.to_base64(),
                histogram_us: lat.value_counts(),
                background_during: bg,
                samples,
            })
            .collect();
        let mut row = Self {
            label,
            size_mib,
            start_ms,
            paper,
            variants,
            ddiskqos_over_original: Ratios::of(&Summary::empty(), &Summary::empty()),
            ddiskqos_over_alone: Ratios::of(&Summary::empty(), &Summary::empty()),
            reps_over_original: None,
            reps_over_alone: None,
            ddiskqos_over_static_best: None,
            reps_over_static_best: None,
        };
        row.recompute_ratios();
        row
    }

    /// Recomputes the ratios from the summaries.
    pub fn recompute_ratios(&mut self) {
        let get = |v| self.variant(v).map(|c| c.summary).unwrap_or_else(Summary::empty);
        let (alone, orig, ddq) = (get(Variant::Alone), get(Variant::Original), get(Variant::DDiskQos));
        self.ddiskqos_over_original = Ratios::of(&ddq, &orig);
        self.ddiskqos_over_alone = Ratios::of(&ddq, &alone);
        self.reps_over_original = self.per_rep(Variant::Original);
        self.reps_over_alone = self.per_rep(Variant::Alone);
        let static_best = self.variant(Variant::StaticBest).map(|c| c.summary);
        self.ddiskqos_over_static_best = static_best.map(|s| Ratios::of(&ddq, &s));
        self.reps_over_static_best = static_best.and_then(|_| self.per_rep(Variant::StaticBest));
    }

    /// dDiskQoS / `base` read time per round in which both ran (a round's reads of one case, one per variant).
    pub(crate) fn per_rep(&self, base: Variant) -> Option<Spread> {
        let by_round = |v: Variant| -> BTreeMap<usize, f64> {
            self.variant(v).map(|c| c.samples.iter().map(|s| (s.round, s.read_ms)).collect()).unwrap_or_default()
        };
        let (ddq, base) = (by_round(Variant::DDiskQos), by_round(base));
        Spread::of(ddq.iter().filter_map(|(r, d)| base.get(r).filter(|b| **b > 0.0).map(|b| d / b)))
    }

    /// The dDiskQoS reads of this case slower than [`STARVED_FACTOR`] times the slowest Original read of the same
    /// case: reads the agent starved. Empty when either variant has no reads.
    pub fn starved(&self) -> Vec<&Sample> {
        self.over_starved_line(Variant::DDiskQos)
    }

    /// The reads of `variant` over the line [`CaseReport::starved`] draws for dDiskQoS's. For Alone's (no
    /// background, no agent) a control: readers that start together reach it by themselves (Experiment 2's
    /// 2MiB@2s did so 6 times in 117 reads of the protect mode's main jobs, dDiskQoS 5;
    /// `crates/bench/results/2026-11-29/costart-tail-50650cb/`).
    pub fn over_starved_line(&self, variant: Variant) -> Vec<&Sample> {
        let (Some(orig), Some(these)) = (self.variant(Variant::Original), self.variant(variant)) else {
            return Vec::new();
        };
        let Some(worst_orig) = orig.samples.iter().map(|s| s.read_ms).reduce(f64::max) else { return Vec::new() };
        these.samples.iter().filter(|s| s.read_ms > STARVED_FACTOR * worst_orig).collect()
    }

    /// The slowest dDiskQoS read over the slowest Original read of this case.
    pub fn worst_over_worst_original(&self) -> Option<f64> {
        self.worst_over_worst(Variant::Original)
    }

    /// The slowest dDiskQoS read over the slowest `base` read of this case.
    pub fn worst_over_worst(&self, base: Variant) -> Option<f64> {
        let worst =
            |v| self.variant(v).and_then(|c: &VariantCase| c.samples.iter().map(|s| s.read_ms).reduce(f64::max));
        match (worst(Variant::DDiskQos), worst(base)) {
            (Some(d), Some(o)) if o > 0.0 => Some(d / o),
            _ => None,
        }
    }

    /// One variant's results.
    pub fn variant(&self, v: Variant) -> Option<&VariantCase> {
        self.variants.iter().find(|c| c.variant == v)
    }
}

/// What `--settle` was before the report recorded it.
fn default_settle_ms() -> f64 {
    50.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn lat(ms: &[u64]) -> Latency {
        let mut l = Latency::new();
        ms.iter().for_each(|m| l.record(Duration::from_millis(*m)));
        l
    }

    #[test]
    fn row_ratios_come_from_histograms() {
        let tp = Throughput::default();
        let row = CaseReport::build(
            "1MiB".into(),
            1,
            None,
            None,
            vec![
                (Variant::Alone, lat(&[1, 1]), tp, vec![]),
                (Variant::Original, lat(&[100, 100]), tp, vec![]),
                (Variant::DDiskQos, lat(&[2, 2]), tp, vec![]),
            ],
        );
        assert!((row.ddiskqos_over_original.mean.unwrap() - 0.02).abs() < 1e-3);
        assert!((row.ddiskqos_over_alone.p99.unwrap() - 2.0).abs() < 1e-2);
        let back = Latency::from_base64(&row.variant(Variant::DDiskQos).unwrap().histogram_v2_base64).unwrap();
        assert_eq!(back.summary(), row.variant(Variant::DDiskQos).unwrap().summary);
    }

    #[test]
    fn throughput_accumulates() {
        let mut t = Throughput::default();
        t.add(1 << 20, 0.5);
        t.add(1 << 20, 0.5);
        assert_eq!(t.bytes, 2 << 20);
        assert!((t.mib_per_s - 2.0).abs() < 1e-9);
    }
}
