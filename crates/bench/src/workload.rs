//! What runs when: the paper's two experiments as data, the variants, and the interleaving of repetitions.
//!
//! Sizes are MiB (the paper writes "MB"; 1000 MB is read as 1000 MiB).

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The device's setting for a mode of the run: one of BFQ's (cgroup v1 and v2), or io.cost (cgroup v2 only).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum BfqMode {
    /// BFQ defaults (`strict_guarantees=0`): the device queue may hold many requests.
    Default,
    /// `strict_guarantees=1`: one request at a time, so weights decide latency.
    Strict,
    /// `strict_guarantees=1` and `low_latency=0`: also without BFQ's weight raising and injection heuristics,
    /// which act inside groups and work against the groups' weights.
    #[value(name = "strict-nolowlat")]
    #[serde(rename = "strict-nolowlat")]
    StrictNoLowLatency,
    /// `strict_guarantees=1` with the short BFQ slots the agent sets when told to (`[devices] bfq_tunables`:
    /// `max_budget=256`, `timeout_sync=8`): the remedy for Docker's nested layout on cgroup v1, where a new
    /// container cannot preempt the background's slot. The agent sets them at its start, so the same mode's Alone
    /// and Original run with them too (the fair comparison).
    #[value(name = "strict-tuned")]
    #[serde(rename = "strict-tuned")]
    StrictTuned,
    /// What the shipped agent makes of a BFQ device by default (`[devices] protect = "auto"`, the test disk as its
    /// managed device): BFQ's defaults with a shallow request queue of small requests (`nr_requests=4`,
    /// `max_sectors_kb` at most 128) and short slots (`timeout_sync` at most 32) where the device pays nothing for
    /// seeks (it reports it does not rotate, or it answers a lone 4 KiB read in under 2 ms at the agent's start),
    /// set by the agent's own code
    /// (`qos_agent::blockdev::protect`) at its start, so the mode's Alone and Original run with it too; judged
    /// also against the `default` mode's Original, the host as it was.
    Protect,
    /// cgroup v2 only: scheduler `none`, io.cost enabled (`io.cost.qos` enable=1) with the kernel's automatic
    /// model; `io.weight` acts.
    #[value(name = "iocost-kernel")]
    #[serde(rename = "iocost-kernel")]
    IocostKernel,
    /// cgroup v2 only: scheduler `none`, io.cost with the model and latency target that the agent's `iocost`
    /// subcommand measures and writes (`qos_agent::blockdev::iocost`), calibrated on the test device at the start
    /// of the mode.
    #[value(name = "iocost-calibrated")]
    #[serde(rename = "iocost-calibrated")]
    IocostCalibrated,
    /// cgroup v2 only: what the shipped agent makes of a device that does not run BFQ (`[devices] protect =
    /// "auto"`, the test disk as its managed device), as on most v2 hosts (NVMe and multi-queue virtio disks run
    /// `none`, others `mq-deadline`): the bench sets scheduler `none` and leaves io.cost off, and the agent's
    /// protection measures the device at its start and enables io.cost with that model and latency target (its own
    /// code and calibration, `qos_agent::blockdev::protect`), putting it back at its stop. The mode's Alone and
    /// Original run with it too.
    #[value(name = "iocost-protect")]
    #[serde(rename = "iocost-protect")]
    IocostProtect,
}

impl BfqMode {
    /// Label used in tables and charts.
    pub fn label(self) -> &'static str {
        match self {
            BfqMode::Default => "BFQ default (strict_guarantees=0)",
            BfqMode::Strict => "BFQ strict_guarantees=1",
            BfqMode::StrictNoLowLatency => "BFQ strict_guarantees=1 + low_latency=0",
            BfqMode::StrictTuned => "BFQ strict_guarantees=1 + agent's bfq_tunables max_budget=256 timeout_sync=8",
            BfqMode::Protect => {
                "BFQ as the agent protects it by default (nr_requests=4, max_sectors_kb<=128, timeout_sync<=32 where the device pays nothing for seeks, BFQ's other tunables as found)"
            }
            BfqMode::IocostKernel => "io.cost, kernel's model (scheduler none)",
            BfqMode::IocostCalibrated => "io.cost, calibrated model (scheduler none)",
            BfqMode::IocostProtect => {
                "io.cost as the agent protects a device without BFQ by default (scheduler none, model measured by the agent at its start)"
            }
        }
    }

    /// Short name.
    pub fn name(self) -> &'static str {
        match self {
            BfqMode::Default => "default",
            BfqMode::Strict => "strict",
            BfqMode::StrictNoLowLatency => "strict-nolowlat",
            BfqMode::StrictTuned => "strict-tuned",
            BfqMode::Protect => "protect",
            BfqMode::IocostKernel => "iocost-kernel",
            BfqMode::IocostCalibrated => "iocost-calibrated",
            BfqMode::IocostProtect => "iocost-protect",
        }
    }

    /// Whether strict_guarantees is on.
    pub fn is_strict(self) -> bool {
        matches!(self, BfqMode::Strict | BfqMode::StrictNoLowLatency | BfqMode::StrictTuned)
    }

    /// Whether the device is set up to protect small reads (strict modes, the agent's protection): the small-read
    /// targets (1 MiB near Alone, well under Original) apply.
    pub fn protects(self) -> bool {
        self.is_strict() || self == BfqMode::Protect
    }

    /// The BFQ tunables the agent sets on the test device in this mode (its `[devices] bfq_tunables`), besides
    /// any `--agent-bfq-tunable`.
    pub fn agent_tunables(self) -> &'static [(&'static str, &'static str)] {
        match self {
            BfqMode::StrictTuned => &[("max_budget", "256"), ("timeout_sync", "8")],
            _ => &[],
        }
    }

    /// What the device must read once the agent started in this mode (its set-up read back; a mode that measured
    /// the device as found would report a wrong figure): the BFQ tunables and queue settings, by name, for a
    /// device that read as `found` before the agent's start.
    pub fn expected_settings(self, found: qos_agent::blockdev::protect::QueueFound) -> Vec<(&'static str, String)> {
        match self {
            BfqMode::Protect => qos_agent::blockdev::protect::bfq_settings_for(found),
            BfqMode::StrictTuned => {
                let mut out = vec![("strict_guarantees", "1".to_string())];
                out.extend(self.agent_tunables().iter().map(|(k, v)| (*k, v.to_string())));
                out
            }
            _ => Vec::new(),
        }
    }

    /// The mode whose Original is "the host as it was" for this one: `protect` and `strict-tuned` change the
    /// device, and a host as found has BFQ's defaults. Their dDiskQoS is judged against both Originals of the run.
    pub fn as_found(self) -> Option<BfqMode> {
        matches!(self, BfqMode::Protect | BfqMode::StrictTuned).then_some(BfqMode::Default)
    }

    /// Whether io.cost (not BFQ) governs the device: `io.weight` acts, and only on cgroup v2.
    pub fn is_iocost(self) -> bool {
        matches!(self, BfqMode::IocostKernel | BfqMode::IocostCalibrated | BfqMode::IocostProtect)
    }

    /// Whether the agent's protection (`[devices] protect = "auto"`, its own code at its start) sets the device up
    /// in this mode; every other mode sets the device itself and runs the agent with `protect = "off"`.
    pub fn agent_protects(self) -> bool {
        matches!(self, BfqMode::Protect | BfqMode::IocostProtect)
    }
}

/// The ways every case runs: the three of every run, and the static-best weights when asked for
/// (`run --static-best`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Variant {
    /// No background: the physical limit.
    Alone,
    /// Background running, no weights set (Docker's default: every cgroup at 100).
    Original,
    /// Background running, the engine live: real counters in, real weights out.
    #[serde(rename = "ddiskqos")]
    DDiskQos,
    /// Background running at the engine's bottom weight and every reader at its top weight, each set once by hand
    /// when its container is created (Docker: `--blkio-weight`), the agent writing nothing (issue 25): what an
    /// operator who knew the workload in advance would set.
    #[serde(rename = "static-best")]
    StaticBest,
}

impl Variant {
    /// Every variant, in report order.
    pub const ALL: [Variant; 4] = [Variant::Alone, Variant::Original, Variant::DDiskQos, Variant::StaticBest];

    /// The three every run has (the static-best weights only when asked for).
    pub const BASE: [Variant; 3] = [Variant::Alone, Variant::Original, Variant::DDiskQos];

    /// Label used in tables and charts.
    pub fn label(self) -> &'static str {
        match self {
            Variant::Alone => "Alone",
            Variant::Original => "Original",
            Variant::DDiskQos => "dDiskQoS",
            Variant::StaticBest => "Static best",
        }
    }

    /// The variants a run measures: the three of every run, and the static-best weights with `static_best`.
    pub fn measured(static_best: bool) -> Vec<Variant> {
        let mut out = Variant::BASE.to_vec();
        if static_best {
            out.push(Variant::StaticBest);
        }
        out
    }
}

/// The order of `variants` in round `round`: a rotation, so each variant runs in each position equally often and
/// slow drift (disk warming, host noise) hits all alike.
pub fn variant_order(round: usize, variants: &[Variant]) -> Vec<Variant> {
    let mut order = variants.to_vec();
    if !order.is_empty() {
        let n = order.len();
        order.rotate_left(round % n);
    }
    order
}

/// Repetitions a soak plans (more than any soak reaches: at least a second per round).
const SOAK_REPS: u32 = 100_000;

/// One case of Experiment 1: reading a whole file of `size_mib`, `reps` times per variant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Exp1Case {
    /// File size in MiB.
    pub size_mib: u64,
    /// Repetitions per variant.
    pub reps: u32,
}

/// One round of Experiment 1: the variant order and the sizes read in each variant's block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Round {
    /// 0-based round number.
    pub index: usize,
    /// Variant blocks, in order.
    pub order: Vec<Variant>,
    /// Sizes read in each block (those cases that still have repetitions left), smallest first.
    pub sizes: Vec<u64>,
}

/// Splits Experiment 1 into rounds: round `r` reads every size with more than `r` repetitions once per variant of
/// `variants`.
pub fn exp1_rounds(cases: &[Exp1Case], variants: &[Variant]) -> Vec<Round> {
    let rounds = cases.iter().map(|c| c.reps as usize).max().unwrap_or(0);
    let mut sorted: Vec<Exp1Case> = cases.to_vec();
    sorted.sort_by_key(|c| c.size_mib);
    (0..rounds)
        .map(|r| Round {
            index: r,
            order: variant_order(r, variants),
            sizes: sorted.iter().filter(|c| c.reps as usize > r).map(|c| c.size_mib).collect(),
        })
        .collect()
}

/// One reader of Experiment 2.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Exp2Reader {
    /// Row label, e.g. `4MiB@2s` (two readers have 4 MiB).
    pub label: String,
    /// File size in MiB.
    pub size_mib: u64,
    /// Start time after the schedule's origin.
    #[serde(with = "duration_ms")]
    pub start: Duration,
}

/// The paper's Table 4, plus its 64 MB reader (Table 5), whose start time the paper does not give: it starts at
/// 2 s with the first two, so that it overlaps them as a large concurrent reader.
pub fn exp2_schedule() -> Vec<Exp2Reader> {
    let r = |size_mib: u64, secs: u64| Exp2Reader {
        label: format!("{size_mib}MiB@{secs}s"),
        size_mib,
        start: Duration::from_secs(secs),
    };
    vec![r(2, 2), r(64, 2), r(16, 3), r(4, 2), r(4, 4)]
}

/// Scales every start time (used by tests and by `--exp2-time-scale`).
pub fn scale_schedule(schedule: &[Exp2Reader], factor: f64) -> Vec<Exp2Reader> {
    schedule.iter().map(|r| Exp2Reader { start: r.start.mul_f64(factor), ..r.clone() }).collect()
}

/// The paper's own numbers, for the tables.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct PaperRow {
    /// Original, milliseconds.
    pub original_ms: f64,
    /// dDiskQoS, milliseconds.
    pub ddiskqos_ms: f64,
}

/// Table 3 of the paper (Experiment 1), by size in MiB.
pub fn paper_table3(size_mib: u64) -> Option<PaperRow> {
    let (o, d) = match size_mib {
        1 => (3.0, 2.0),
        10 => (33.1, 22.7),
        100 => (2850.0, 2250.0),
        1000 => (28_600.0, 23_500.0),
        _ => return None,
    };
    Some(PaperRow { original_ms: o, ddiskqos_ms: d })
}

/// Table 5 of the paper (Experiment 2), by size in MiB (both 4 MB readers share the paper's one 4 MB row).
pub fn paper_table5(size_mib: u64) -> Option<PaperRow> {
    let (o, d) = match size_mib {
        2 => (6.0, 5.0),
        64 => (1900.0, 1700.0),
        16 => (50.2, 43.6),
        4 => (12.4, 11.3),
        _ => return None,
    };
    Some(PaperRow { original_ms: o, ddiskqos_ms: d })
}

/// Repetition counts of a run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Plan {
    /// Experiment 1 cases.
    pub exp1: Vec<Exp1Case>,
    /// Experiment 2 schedule.
    pub exp2: Vec<Exp2Reader>,
    /// Experiment 2 repetitions per variant.
    pub exp2_reps: u32,
}

impl Plan {
    /// Quick mode (the default): 10 repetitions of 1 and 10 MiB, 5 of 100 MiB, 3 of Experiment 2 (each
    /// repetition a round of Alone, Original and dDiskQoS). The paper's 1000 MiB is in `--full` (or `--sizes`):
    /// fewer than three repetitions give no spread, and three cost ~25 s per BFQ mode.
    pub fn quick() -> Self {
        Self {
            exp1: [(1, 10), (10, 10), (100, 5)]
                .into_iter()
                .map(|(size_mib, reps)| Exp1Case { size_mib, reps })
                .collect(),
            exp2: exp2_schedule(),
            exp2_reps: 3,
        }
    }

    /// `soak`: Experiment 1's sizes 1, 10, 64 and 100 MiB and Experiment 2's schedule, with as many repetitions as
    /// a soak could ever reach (the soak's clock ends it).
    pub fn soak() -> Self {
        Self {
            exp1: [1, 10, 64, 100].into_iter().map(|size_mib| Exp1Case { size_mib, reps: SOAK_REPS }).collect(),
            exp2: exp2_schedule(),
            exp2_reps: SOAK_REPS,
        }
    }

    /// Whether this is a soak's plan ([`Plan::soak`]): its clock, not its repetitions, ends each case, so a case has
    /// at most the planned reads.
    pub fn is_soak(&self) -> bool {
        self.exp2_reps == SOAK_REPS || self.exp1.iter().any(|c| c.reps == SOAK_REPS)
    }

    /// What a soak reads, for its first line.
    pub fn describe_soak(&self) -> String {
        let sizes: Vec<String> = self.exp1.iter().map(|c| format!("{} MiB", c.size_mib)).collect();
        let exp2: Vec<&str> = self.exp2.iter().map(|r| r.label.as_str()).collect();
        format!("Experiment 1 ({}) then Experiment 2 ({})", sizes.join(", "), exp2.join(", "))
    }

    /// The paper's 50 repetitions of everything.
    pub fn full() -> Self {
        Self {
            exp1: [1, 10, 100, 1000].into_iter().map(|size_mib| Exp1Case { size_mib, reps: 50 }).collect(),
            exp2: exp2_schedule(),
            exp2_reps: 50,
        }
    }

    /// Every distinct (experiment, size) file the plan reads, with its file name.
    pub fn files(&self) -> Vec<(String, u64)> {
        let mut out: Vec<(String, u64)> = Vec::new();
        for c in &self.exp1 {
            let name = exp1_file(c.size_mib);
            if !out.iter().any(|(n, _)| *n == name) {
                out.push((name, c.size_mib));
            }
        }
        for (i, r) in self.exp2.iter().enumerate() {
            out.push((exp2_file(i, r), r.size_mib));
        }
        out
    }

    /// Total foreground reads per variant and BFQ mode (a mode reads this many times the number of variants).
    pub fn reads_per_variant(&self) -> u64 {
        self.exp1.iter().map(|c| u64::from(c.reps)).sum::<u64>() + u64::from(self.exp2_reps) * self.exp2.len() as u64
    }
}

/// File name of an Experiment 1 size.
pub fn exp1_file(size_mib: u64) -> String {
    format!("exp1-{size_mib}MiB.dat")
}

/// File name of an Experiment 2 reader (each reader has its own file, even at equal sizes).
pub fn exp2_file(index: usize, r: &Exp2Reader) -> String {
    format!("exp2-{index}-{}MiB.dat", r.size_mib)
}

/// File name of the background's file.
pub const BACKGROUND_FILE: &str = "background.dat";

mod duration_ms {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::time::Duration;

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(d.as_millis() as u64)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        Ok(Duration::from_millis(u64::deserialize(d)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rotation_puts_each_variant_in_each_slot() {
        for static_best in [false, true] {
            let variants = Variant::measured(static_best);
            let n = variants.len();
            for slot in 0..n {
                let mut in_slot: Vec<Variant> = (0..n).map(|r| variant_order(r, &variants)[slot]).collect();
                in_slot.sort();
                assert_eq!(in_slot, variants, "slot {slot} of {n}");
            }
            assert_eq!(variant_order(0, &variants), variant_order(n, &variants));
        }
        assert_eq!(Variant::measured(false), Variant::BASE.to_vec());
        assert_eq!(Variant::measured(true).last(), Some(&Variant::StaticBest));
        assert!(variant_order(5, &[]).is_empty());
    }

    #[test]
    fn the_agent_sets_the_device_up_in_the_protect_modes_only() {
        use clap::ValueEnum;
        for mode in BfqMode::value_variants() {
            let named = mode.to_possible_value().unwrap();
            assert_eq!(named.get_name(), mode.name(), "the CLI name is the report's name");
            assert_eq!(serde_json::to_value(mode).unwrap(), mode.name(), "the JSON name is the report's name");
        }
        let by_agent: Vec<_> = BfqMode::value_variants().iter().filter(|m| m.agent_protects()).collect();
        assert_eq!(by_agent, [&BfqMode::Protect, &BfqMode::IocostProtect]);
        assert!(
            BfqMode::IocostProtect.is_iocost()
                && BfqMode::IocostProtect.expected_settings(Default::default()).is_empty()
        );
        assert_eq!(BfqMode::IocostProtect.as_found(), None);
    }

    #[test]
    fn static_best_is_named_static_best() {
        assert_eq!(serde_json::to_value(Variant::StaticBest).unwrap(), "static-best");
        assert_eq!(serde_json::from_value::<Variant>("static-best".into()).unwrap(), Variant::StaticBest);
        assert_eq!(serde_json::to_value(Variant::DDiskQos).unwrap(), "ddiskqos");
        assert_eq!(Variant::StaticBest.label(), "Static best");
    }

    #[test]
    fn rounds_cover_every_repetition_exactly_once() {
        let plan = Plan::quick();
        let rounds = exp1_rounds(&plan.exp1, &Variant::BASE);
        assert_eq!(rounds.len(), 10);
        assert!(rounds.iter().all(|r| r.order.len() == 3));
        let with_static = exp1_rounds(&plan.exp1, &Variant::measured(true));
        assert_eq!(
            with_static[1].order,
            vec![Variant::Original, Variant::DDiskQos, Variant::StaticBest, Variant::Alone]
        );
        for c in &plan.exp1 {
            let n = rounds.iter().filter(|r| r.sizes.contains(&c.size_mib)).count();
            assert_eq!(n, c.reps as usize, "size {}", c.size_mib);
        }
        assert_eq!(rounds[0].sizes, vec![1, 10, 100]);
        assert_eq!(rounds[9].sizes, vec![1, 10]);
    }

    #[test]
    fn exp2_is_the_papers_schedule() {
        let s = exp2_schedule();
        let got: Vec<(u64, u64)> = s.iter().map(|r| (r.size_mib, r.start.as_secs())).collect();
        assert_eq!(got, vec![(2, 2), (64, 2), (16, 3), (4, 2), (4, 4)]);
        let labels: Vec<&str> = s.iter().map(|r| r.label.as_str()).collect();
        assert_eq!(labels, vec!["2MiB@2s", "64MiB@2s", "16MiB@3s", "4MiB@2s", "4MiB@4s"]);
        assert!(s.iter().all(|r| paper_table5(r.size_mib).is_some()));
        let half = scale_schedule(&s, 0.5);
        assert_eq!(half[2].start, Duration::from_millis(1500));
    }

    #[test]
    fn files_are_distinct_per_reader() {
        let plan = Plan::quick();
        let files = plan.files();
        assert_eq!(files.len(), 3 + 5);
        let mut names: Vec<&String> = files.iter().map(|(n, _)| n).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), files.len());
        assert_eq!(plan.reads_per_variant(), 10 + 10 + 5 + 3 * 5);
    }

    #[test]
    fn paper_numbers() {
        assert_eq!(paper_table3(10).unwrap().original_ms, 33.1);
        assert_eq!(paper_table5(64).unwrap().ddiskqos_ms, 1700.0);
        assert!(paper_table3(7).is_none());
        assert_eq!(Plan::full().exp1.iter().map(|c| c.reps).collect::<Vec<_>>(), vec![50; 4]);
    }
}
