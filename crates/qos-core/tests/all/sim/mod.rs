//! A deterministic disk simulator for the qos-core engine: a virtual clock, a proportional-share disk and seeded
//! workloads. No I/O, no threads, no wall clock (apart from one base `Instant`, only ever used as an origin): the
//! same [`SimConfig`] and workloads always give the same [`Outcome`], so a test can replay the paper's experiments
//! in milliseconds and compare runs exactly.
//!
//! The model: the disk moves `bandwidth` bytes per second (varied by a seeded ±`jitter_percent` per step) and
//! shares them among the containers that want to read, in proportion to their block-I/O weight, the way BFQ
//! shares a disk (work-conserving: what a finishing reader leaves is handed to the others). The driver mirrors
//! the agent: `handle_started` when a container starts, a sample of every live container's counters each
//! `sample_interval`, `handle_timeout` when `poll_timeout()` comes due (or only on the sampling tick), and every
//! `WeightChange` applied at once. Without a QoS config every container keeps the kernel default weight: the
//! paper's "Original" column.
//!
//! The disk is ideal by default ([`DiskModel::Proportional`]). [`DiskModel::BfqSlots`] is BFQ's default mode as
//! measured on this project's machine: a queue-depth-1 reader beside a deep reader in another group is served
//! about one request per slot of the deep one, so its weight counts only `request time / slot` as much.
//!
//! `paper` replays the paper's experiments on it; `starvation` checks the fair-share floor on the BFQ model.

mod paper;
mod starvation;

use std::collections::BTreeMap;
use std::time::Duration;

use qos_core::{Config, ContainerId, Engine, IoCounters, Reason, Weight, WeightChange};
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::common::t0;

/// One mebibyte.
pub const MIB: u64 = 1 << 20;

/// A container that reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Workload {
    /// Container id.
    pub name: String,
    /// When it starts, from the beginning of the run.
    pub start: Duration,
    /// Bytes it reads; `None` reads until the run ends (the paper's background traffic).
    pub bytes: Option<u64>,
    /// Whether the container exits (and the driver calls `handle_removed`) when its read is done.
    pub exits_when_done: bool,
    /// A deep reader (many requests in flight: the paper's background at queue depth 32); the others read one
    /// request at a time (queue depth 1).
    pub deep: bool,
}

impl Workload {
    /// A container that reads `bytes` starting at `start` and then idles until the end of the run.
    pub fn read(name: &str, start: Duration, bytes: u64) -> Self {
        Self { name: name.to_owned(), start, bytes: Some(bytes), exits_when_done: false, deep: false }
    }

    /// The background reader: starts at `start` and never stops.
    pub fn background(name: &str, start: Duration) -> Self {
        Self { name: name.to_owned(), start, bytes: None, exits_when_done: false, deep: true }
    }
}

/// When the simulated driver calls `handle_timeout`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimerMode {
    /// As soon as the clock reaches `poll_timeout()` (to the step's resolution).
    AtPollTimeout,
    /// Only right after each round of samples.
    OnSampleTick,
}

/// How the disk shares its bandwidth among the readers of a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DiskModel {
    /// In proportion to the weights (an ideal proportional-share scheduler).
    Proportional,
    /// BFQ's default mode (no idling for a queue-depth-1 reader, no preemption between groups below the root):
    /// while a deep reader is busy, a queue-depth-1 reader gets one `request` per `slot` of the deep one at equal
    /// weight, so its weight is scaled by `request time / slot` (request time = `request` / bandwidth). Calibrated
    /// on this machine's loop device with fio (crates/bench/results/2026-11-26/starvation-fio-*.txt): a 1 MiB
    /// reader at weight 10 beside a QD32 reader at 10 read 2-8 MiB/s of ~500, at 1000 beside 10 about half.
    BfqSlots {
        /// Bytes of one request of a queue-depth-1 reader.
        request: u64,
        /// How long a deep reader keeps the disk once it has it (BFQ's `timeout_sync`, 124 ms by default).
        slot: Duration,
    },
}

/// Everything a run depends on.
#[derive(Debug, Clone)]
pub struct SimConfig {
    /// The engine's config; `None` runs without dDiskQoS (every container at the kernel default weight).
    pub qos: Option<Config>,
    /// Bytes per second the disk moves.
    pub bandwidth: u64,
    /// Each step's bandwidth varies uniformly within ±this percentage.
    pub jitter_percent: u64,
    /// Resolution of the virtual clock.
    pub step: Duration,
    /// How often the driver samples counters (the agent's default is 500 ms).
    pub sample_interval: Duration,
    /// When timers are driven.
    pub timers: TimerMode,
    /// Length of the run.
    pub duration: Duration,
    /// Seed of the jitter.
    pub seed: u64,
    /// How the disk shares a step.
    pub disk: DiskModel,
}

impl SimConfig {
    /// The paper's setting: the default engine config, a 70 MiB/s disk (an HDD: the paper's 1000 MB read takes
    /// 28.6 s while sharing with the background reader), 1 ms steps, 500 ms sampling.
    pub fn paper(duration: Duration, seed: u64) -> Self {
        Self {
            qos: Some(Config::default()),
            bandwidth: 70 * MIB,
            jitter_percent: 10,
            step: Duration::from_millis(1),
            sample_interval: Duration::from_millis(500),
            timers: TimerMode::AtPollTimeout,
            duration,
            seed,
            disk: DiskModel::Proportional,
        }
    }

    /// The same without dDiskQoS.
    pub fn without_qos(self) -> Self {
        Self { qos: None, ..self }
    }
}

/// One sample the driver took.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sample {
    /// When, from the beginning of the run.
    pub at: Duration,
    /// Container.
    pub name: String,
    /// Its read counter.
    pub read: u64,
}

/// Everything a run produced, with times from the beginning of the run.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Outcome {
    /// Every change the engine emitted, in order.
    pub changes: Vec<(Duration, WeightChange)>,
    /// Every sample fed to the engine, in order.
    pub samples: Vec<Sample>,
    /// How long each finished read took, from its start to its last byte.
    pub read_time: BTreeMap<String, Duration>,
    /// Bytes each container read.
    pub bytes_read: BTreeMap<String, u64>,
}

impl Outcome {
    /// `(time, new level, reason)` of each change of one container.
    pub fn trajectory(&self, name: &str) -> Vec<(Duration, Option<usize>, Reason)> {
        self.changes.iter().filter(|(_, c)| c.id.as_str() == name).map(|(t, c)| (*t, c.new_level, c.reason)).collect()
    }

    /// `(new level, reason)` of each change of one container, without the times.
    pub fn steps(&self, name: &str) -> Vec<(usize, Reason)> {
        self.trajectory(name).into_iter().map(|(_, l, r)| (l.expect("managed"), r)).collect()
    }

    /// Samples of one container.
    pub fn samples_of<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a Sample> + 'a {
        self.samples.iter().filter(move |s| s.name == name)
    }

    /// Time its read took.
    pub fn read_time(&self, name: &str) -> Duration {
        *self.read_time.get(name).unwrap_or_else(|| panic!("{name} did not finish"))
    }
}

struct Job {
    id: ContainerId,
    workload: Workload,
    remaining: u64,
    read: u64,
    weight: u64,
    started: bool,
    done: bool,
    gone: bool,
}

/// Runs the workloads and returns what happened.
pub fn run(cfg: &SimConfig, workloads: &[Workload]) -> Outcome {
    let origin = t0(); // the origin of the virtual clock: only ever used plus an offset

    let mut rng = ChaCha8Rng::seed_from_u64(cfg.seed);
    let mut engine = cfg.qos.clone().map(|c| Engine::new(c, origin).expect("valid config"));
    let mut jobs: Vec<Job> = workloads
        .iter()
        .map(|w| Job {
            id: ContainerId::new(&w.name),
            workload: w.clone(),
            remaining: w.bytes.unwrap_or(u64::MAX),
            read: 0,
            weight: u64::from(Weight::KERNEL_DEFAULT.get()),
            started: false,
            done: false,
            gone: false,
        })
        .collect();
    let mut out = Outcome::default();
    let step_nanos = cfg.step.as_nanos() as u64;
    let interval_nanos = cfg.sample_interval.as_nanos() as u64;
    let mut t = Duration::ZERO;
    while t < cfg.duration {
        let now = origin + t;
        let t_nanos = t.as_nanos() as u64;
        // Containers starting now enter the engine before any I/O.
        for job in jobs.iter_mut().filter(|j| !j.started && j.workload.start <= t) {
            job.started = true;
            if let Some(engine) = engine.as_mut() {
                engine.handle_started(&job.id, now);
            }
        }
        if let Some(engine) = engine.as_mut() {
            apply(engine, &mut jobs, &mut out, t);
            let tick = t_nanos % interval_nanos == 0 && t_nanos > 0;
            if tick {
                for job in jobs.iter().filter(|j| j.started && !j.gone) {
                    engine.handle_sample(&job.id, IoCounters::new(job.read, 0), now);
                    out.samples.push(Sample { at: t, name: job.workload.name.clone(), read: job.read });
                }
                apply(engine, &mut jobs, &mut out, t);
            }
            let due = match cfg.timers {
                TimerMode::AtPollTimeout => engine.poll_timeout().is_some_and(|d| d <= now),
                TimerMode::OnSampleTick => tick,
            };
            if due {
                engine.handle_timeout(now);
                apply(engine, &mut jobs, &mut out, t);
            }
        }
        // The disk, for one step.
        let jitter = rng.random_range(100 - cfg.jitter_percent..=100 + cfg.jitter_percent);
        let budget = u128::from(cfg.bandwidth) * u128::from(step_nanos) * u128::from(jitter) / 100 / 1_000_000_000;
        share(&mut jobs, budget as u64, cfg.disk, cfg.bandwidth);
        t += cfg.step;
        for job in jobs.iter_mut().filter(|j| j.started && !j.done && j.remaining == 0) {
            job.done = true;
            out.read_time.insert(job.workload.name.clone(), t - job.workload.start);
            if job.workload.exits_when_done {
                job.gone = true;
                if let Some(engine) = engine.as_mut() {
                    engine.handle_removed(&job.id, origin + t);
                }
            }
        }
    }
    out.bytes_read = jobs.iter().map(|j| (j.workload.name.clone(), j.read)).collect();
    out
}

/// Drains the engine's changes into the jobs' weights and the record.
fn apply(engine: &mut Engine, jobs: &mut [Job], out: &mut Outcome, t: Duration) {
    while let Some(change) = engine.poll_change() {
        if let Some(job) = jobs.iter_mut().find(|j| j.id == change.id) {
            job.weight = u64::from(change.weight.unwrap_or(Weight::KERNEL_DEFAULT).get());
        }
        out.changes.push((t, change));
    }
}

/// Shares `budget` bytes among the readers in proportion to their (effective) weights; what a reader cannot take
/// (it is about to finish) goes to the others.
fn share(jobs: &mut [Job], mut budget: u64, disk: DiskModel, bandwidth: u64) {
    // Effective weight: the weight, or under BFQ's slots with a deep reader busy, a queue-depth-1 reader's weight
    // times request time / slot (both sides in nanoseconds).
    let deep_busy = jobs.iter().any(|j| j.started && !j.gone && j.remaining > 0 && j.workload.deep);
    let effective = |j: &Job| -> u128 {
        match disk {
            DiskModel::BfqSlots { request, slot } if deep_busy => {
                let request_nanos = u128::from(request) * 1_000_000_000 / u128::from(bandwidth.max(1));
                if j.workload.deep {
                    u128::from(j.weight) * slot.as_nanos()
                } else {
                    u128::from(j.weight) * request_nanos.max(1)
                }
            }
            _ => u128::from(j.weight),
        }
    };
    loop {
        let readers = jobs.iter().filter(|j| j.started && !j.gone && j.remaining > 0);
        let total: u128 = readers.map(effective).sum();
        if total == 0 || budget == 0 {
            return;
        }
        let mut used = 0;
        let mut capped = false;
        for job in jobs.iter_mut().filter(|j| j.started && !j.gone && j.remaining > 0) {
            let fair = (u128::from(budget) * effective(job) / total) as u64;
            let take = fair.min(job.remaining);
            capped |= take < fair;
            job.remaining -= take;
            job.read += take;
            used += take;
        }
        budget -= used;
        if !capped || used == 0 {
            return;
        }
    }
}

/// `n` seeded random readers: sizes from 256 KiB to 512 MiB (log-uniform), starts within `span`; a third exit
/// when done.
pub fn random_workloads(seed: u64, n: usize, span: Duration) -> Vec<Workload> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..n)
        .map(|i| {
            let bytes = 1u64 << rng.random_range(18..=29u32);
            let bytes = bytes + rng.random_range(0..bytes);
            let start = Duration::from_millis(rng.random_range(0..=span.as_millis() as u64));
            Workload {
                name: format!("r{i:02}"),
                start,
                bytes: Some(bytes),
                exits_when_done: rng.random_ratio(1, 3),
                deep: false,
            }
        })
        .collect()
}
