//! Runs the experiments of one BFQ mode: starts the agent's daemon (in dry run), the readers' containers (Docker)
//! and the background, lets the daemon demote the background, then runs every round's variant blocks in rotating
//! order.
//!
//! A variant block: Alone stops the background (SIGSTOP, waits for its in-flight I/O to drain); Original lets it
//! run; dDiskQoS lets it run with the daemon out of dry run (its weights written). In Alone and Original blocks the
//! daemon is in dry run: it has restored every original weight and keeps sampling and deciding, writing nothing.
//! With `--static-best` a second background runs, created at the engine's bottom weight, and the static-best blocks
//! stop the first and let the second run (the others keep the second stopped); their readers are created at the
//! top weight; the daemon is in dry run and is not told of them (`crate::static_best`). Where the runtime's way does
//! not put a static weight into the file that governs the device (the static background shows whether it does),
//! the bench writes that file as soon as the cgroup exists. Every static weight is read back from that file, the
//! background's after every read: one that does not read as set fails the run.
//! Each read is a new cgroup/container. A Docker reader reads as soon as its container starts, while the bench
//! times the agent's reaction (its cgroup's appearance to the top weight in its file); cgroup and CRI readers wait,
//! in dDiskQoS blocks, until their weight file reads the top weight.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use indicatif::ProgressBar;
use qos_agent::backend::ContainerInfo;
use qos_agent::cgroup::CgroupRoot;
use qos_core::ContainerId;

use crate::agent::{Agent, Backends, WeightProbe, WeightRead};
use crate::cleanup::Cleanup;
use crate::disk::Disk;
use crate::report::data::{CaseReport, ModeReport, Sample, Throughput};
use crate::runtime::{Background, BackgroundKind, PlannedRead, ReaderHooks, Runtime};
use crate::static_best::{Delivery, StaticWeight, StaticWeights};
use crate::stats::Latency;
use crate::workload::{self, BfqMode, Exp2Reader, Plan, Variant};

/// How to run a mode.
#[derive(Debug, Clone)]
pub struct RunConfig {
    /// Repetitions and schedule.
    pub plan: Plan,
    /// The agent's engine configuration (`[mlfq]`).
    pub engine: qos_core::Config,
    /// The agent's `sample_interval`.
    pub sample_interval: Duration,
    /// The agent's `entry_sample_interval` (`None`: off).
    pub entry_sample_interval: Option<Duration>,
    /// Pause after each foreground read.
    pub gap: Duration,
    /// Pause after switching variant (background resumes, weights set).
    pub settle: Duration,
    /// Time the background runs under the agent before the first round (at least; up to 3x until it is demoted).
    pub warmup: Duration,
    /// Background reader.
    pub background: BackgroundKind,
    /// Run Experiment 1.
    pub exp1: bool,
    /// Run Experiment 2.
    pub exp2: bool,
    /// BFQ tunables (`KEY=VALUE`) the agent sets on the test device (its `[devices] bfq_tunables`) for each mode.
    pub agent_bfq: Vec<String>,
    /// The agent's nice value (`--agent-nice`).
    pub agent_nice: i8,
    /// The agent's `actuator` (`--agent-actuator`).
    pub agent_actuator: qos_agent::config::ActuatorMode,
    /// `soak`: measure for this long instead of for the plan's repetitions (Experiment 1 rounds for the first 55 %,
    /// Experiment 2 rounds for the rest); rounds start while time is left and always finish.
    pub soak: Option<Duration>,
    /// `--static-best`: also the static-best variant (the background at the engine's bottom weight, readers at its
    /// top, set at their creation), interleaved with the others.
    pub static_best: bool,
}

impl RunConfig {
    /// The variants each round runs.
    pub fn variants(&self) -> Vec<Variant> {
        Variant::measured(self.static_best)
    }
}

/// Share of a soak's time given to Experiment 1 (the rest goes to Experiment 2).
pub const SOAK_EXP1_SHARE: f64 = 0.55;

/// How long the device may take to finish the frozen background's requests before an Alone read (stretched by
/// [`crate::sys::patience`]); more is an error.
const ALONE_IDLE_TIMEOUT: Duration = Duration::from_secs(10);

/// Reader containers prepared ahead in a soak (the rest are created as they are needed).
const SOAK_PREPARED_ROUNDS: usize = 2;

/// What a mode needs from the outside.
#[derive(Debug)]
pub struct Env<'a> {
    /// The prepared disk.
    pub disk: &'a Disk,
    /// Where readers run.
    pub runtime: &'a dyn Runtime,
    /// The agent's backends for this runtime.
    pub backends: Backends,
    /// The cgroup hierarchy, as the agent detected it.
    pub root: Arc<CgroupRoot>,
    /// The agent's state file and control socket go here (under /run, as the shipped agent's).
    pub run_dir: PathBuf,
    /// Test files by name.
    pub files: BTreeMap<String, PathBuf>,
    /// The undo stack (a mode's device settings go there).
    pub cleanup: &'static Cleanup,
}

impl Env<'_> {
    fn file(&self, name: &str) -> Result<&Path> {
        self.files.get(name).map(PathBuf::as_path).with_context(|| format!("test file {name} was not created"))
    }
}

/// What the bench expects of a new cgroup's weight file.
#[derive(Debug, Clone, Copy)]
enum Expect<'a> {
    /// Whatever it holds, read once (Alone, Original: the original).
    Read,
    /// The agent's top weight, awaited (dDiskQoS).
    AgentTop,
    /// Static best, the background (its runtime's set-up complete when its cgroup is looked at): the static weight
    /// it was created with, written by the bench where the runtime's way did not put it in the governing file;
    /// `Delivery` learns which. The agent is not told of the cgroup.
    StaticSetUp(StaticWeight, &'a Delivery),
    /// Static best, a reader (its runtime may still be setting it up): the static weight it was created with,
    /// written at once where the background showed that the runtime's way does not take, else awaited a moment
    /// (Docker writes it as the container starts); another value fails the run. The agent is not told of it.
    StaticStarting(StaticWeight, &'a Delivery),
}

impl Expect<'_> {
    fn is_static(&self) -> bool {
        matches!(self, Expect::StaticSetUp(..) | Expect::StaticStarting(..))
    }
}

/// What the bench does around a reader: announce it to the agent (cgroup runtime; not the static-best variant's),
/// read its weight (in dDiskQoS blocks: wait until the agent's top weight is in its file; static best: check the
/// weight it was created with), announce its end.
struct AgentHooks<'a> {
    agent: &'a Agent,
    expect: Expect<'a>,
}

impl ReaderHooks for AgentHooks<'_> {
    fn created(&self, info: &ContainerInfo, since: Instant) -> Result<WeightRead> {
        let dir = info.cgroup.as_ref().with_context(|| format!("container {} has no cgroup", info.id))?;
        match self.expect {
            Expect::StaticSetUp(weight, delivery) => weight.settle_set_up(dir, since, delivery),
            Expect::StaticStarting(weight, delivery) => weight.settle_starting(dir, since, delivery),
            Expect::AgentTop => {
                self.agent.announce_started(info)?;
                self.agent.wait_for_weight(dir, self.agent.top(), since)
            }
            Expect::Read => {
                self.agent.announce_started(info)?;
                self.agent.read_weight(dir)
            }
        }
    }

    fn finished(&self, id: &ContainerId) {
        if !self.expect.is_static() {
            self.agent.announce_stopped(id);
        }
    }
}

/// The static-best variant's weights on the mode's governing file, and whether the runtime puts them there.
#[derive(Debug, Clone, Copy)]
struct Statics<'a> {
    reader: StaticWeight,
    background: StaticWeight,
    delivery: &'a Delivery,
}

/// Per (case, variant) accumulator.
#[derive(Debug, Default)]
struct Acc {
    lat: Latency,
    bg: Throughput,
    samples: Vec<Sample>,
}

/// The state of a mode in progress.
struct ModeRun<'a, 'e> {
    env: &'a Env<'e>,
    cfg: &'a RunConfig,
    bg: &'a Background,
    /// The static-best variant's background and weights (`--static-best`).
    statics: Option<(&'a Background, Statics<'a>)>,
    agent: &'a Agent,
    blocks: BTreeMap<Variant, Throughput>,
    progress: &'a ProgressBar,
    mode: BfqMode,
    /// When measuring began (after the warm-up): a soak's clock.
    measuring: Instant,
}

/// Runs one BFQ mode; returns its results.
pub fn run_mode(env: &Env<'_>, cfg: &RunConfig, mode: BfqMode, progress: &ProgressBar) -> Result<ModeReport> {
    let started = Instant::now();
    crate::disk::ensure_iocost_possible(mode, &env.root)?;
    let (undo, iocost) = env.disk.set_mode(mode, &env.root, env.cleanup)?;
    // The mode's device settings (io.cost) are undone when it ends, however it ends; signals run the stack.
    let report = run_mode_on_device(env, cfg, mode, progress, started, iocost);
    if let Some(token) = undo {
        let undone = env.cleanup.run(token).with_context(|| format!("undoing the device settings of {}", mode.name()));
        let report = report?;
        undone?;
        return Ok(report);
    }
    report
}

fn run_mode_on_device(
    env: &Env<'_>,
    cfg: &RunConfig,
    mode: BfqMode,
    progress: &ProgressBar,
    started: Instant,
    iocost: Option<crate::disk::IoCostSetting>,
) -> Result<ModeReport> {
    let dev: qos_agent::blockdev::DevNum =
        env.disk.info.maj_min.parse().with_context(|| format!("device number {}", env.disk.info.maj_min))?;
    let probe = WeightProbe::for_device(&env.root, dev);
    let delivery = Delivery::default();
    let statics = match cfg.static_best {
        true => {
            let w = StaticWeights::of(&cfg.engine)?;
            Some(Statics {
                reader: StaticWeight { weight: w.reader, probe },
                background: StaticWeight { weight: w.background, probe },
                delivery: &delivery,
            })
        }
        false => None,
    };
    let bg_file = env.file(workload::BACKGROUND_FILE)?;
    let reads = planned_reads(env, cfg, statics.map(|s| s.reader))?;
    progress.set_message(format!("{}: starting the agent", mode.name()));
    let v2 = env.root.version() == qos_agent::cgroup::CgroupVersion::V2;
    let test_disk = v2.then_some(env.disk.info.disk_name.as_str());
    let mut agent_cfg = crate::agent::config(cfg.engine.clone(), cfg.sample_interval, &env.run_dir, test_disk);
    agent_cfg.entry_sample_interval = cfg.entry_sample_interval;
    agent_cfg.nice = cfg.agent_nice;
    agent_cfg.actuator = cfg.agent_actuator;
    // The device set-up is the mode's: the agent's protection runs (its own code, at its start, on the test disk as
    // its managed device) in `protect` and `iocost-protect` only; every other mode sets the device itself.
    if mode.agent_protects() {
        agent_cfg.devices.protect = qos_agent::config::ProtectMode::Auto;
        agent_cfg.devices.check = vec![env.disk.info.disk_name.clone()];
    } else {
        agent_cfg.devices.protect = qos_agent::config::ProtectMode::Off;
    }
    let mode_tunables = mode.agent_tunables().iter().map(|(k, v)| format!("{k}={v}"));
    for assignment in cfg.agent_bfq.iter().cloned().chain(mode_tunables) {
        let Some((key, value)) = assignment.split_once('=') else {
            anyhow::bail!("--agent-bfq-tunable wants KEY=VALUE, got {assignment:?}");
        };
        agent_cfg
            .devices
            .bfq_tunables
            .entry(env.disk.info.disk_name.clone())
            .or_default()
            .insert(key.into(), qos_agent::blockdev::tune::TunableValue::Text(value.into()));
    }
    let found = env.disk.iosched();
    let found = qos_agent::blockdev::protect::QueueFound::from_values(|key| found.get(key).cloned());
    let agent = Agent::start(agent_cfg, env.backends.clone(), env.root.clone(), probe)?;
    // After the agent's start: the report shows what the agent set too, and the mode's set-up must be in force.
    let iosched = env.disk.iosched();
    for (key, want) in mode.expected_settings(found) {
        if iosched.get(key) != Some(&want) {
            drop(agent);
            anyhow::bail!(
                "{} mode: {key} of {} reads {:?} after the agent's start, not {want:?}: the mode's device set-up is \
                 not in force",
                mode.name(),
                env.disk.info.disk_name,
                iosched.get(key)
            );
        }
    }
    // Whatever else the agent set at its start (a slot chosen from what it measured there, say) reads as it set it.
    if let Some(row) = agent.device_settings().into_iter().find(|r| !r.as_set()) {
        drop(agent);
        anyhow::bail!(
            "{} mode: the agent set {} of {} to {:?} at its start, and it reads {:?}: the mode's device set-up is not \
             in force",
            mode.name(),
            row.setting,
            row.device,
            row.set,
            row.now
        );
    }
    // io.cost as the agent's protection enabled it, read back for the report; the mode fails if it is not in force.
    let iocost = match (mode, iocost) {
        (BfqMode::IocostProtect, None) => {
            let set_by =
                "by the agent's protection at its start ([devices] protect = \"auto\"): the lines above are what it measured";
            match env.disk.iocost_setting(mode, &env.root, Some(set_by.to_string())) {
                Ok(s) => Some(s),
                Err(e) => {
                    drop(agent);
                    return Err(
                        e.context(format!("{} mode: the agent's protection did not enable io.cost", mode.name()))
                    );
                }
            }
        }
        (_, iocost) => iocost,
    };
    progress.set_message(format!("{}: preparing {} readers", mode.name(), reads.len()));
    let bgs = env.runtime.prepare(&reads).and_then(|()| {
        progress.set_message(format!("{}: starting the background", mode.name()));
        let hooks = AgentHooks { agent: &agent, expect: Expect::Read };
        let bg = env.runtime.start_background(bg_file, cfg.background, None, &hooks)?;
        let Some(s) = statics else { return Ok((bg, None)) };
        progress.set_message(format!("{}: starting the static-best background", mode.name()));
        match start_static_background(env, cfg, bg_file, s.background, s.delivery, &agent) {
            Ok(static_bg) => Ok((bg, Some(static_bg))),
            Err(e) => {
                let _ = env.runtime.stop_background(&bg);
                Err(e)
            }
        }
    });
    let (bg, static_bg) = match bgs {
        Ok(bgs) => bgs,
        Err(e) => {
            drop(agent);
            let _ = env.runtime.end_mode();
            return Err(e);
        }
    };
    let result = (|| -> Result<_> {
        // Let the daemon demote the background (it enters at the top like any container it first sees).
        let warm = Instant::now();
        while warm.elapsed() < cfg.warmup || (!agent.demoted_any() && warm.elapsed() < 3 * cfg.warmup) {
            std::thread::sleep(Duration::from_millis(10));
        }
        let measuring = Instant::now();
        let statics = static_bg.as_ref().zip(statics);
        let mut run =
            ModeRun { env, cfg, bg: &bg, statics, agent: &agent, blocks: BTreeMap::new(), progress, mode, measuring };
        let exp1 = if cfg.exp1 { run.exp1()? } else { Vec::new() };
        let exp2 = if cfg.exp2 { run.exp2()? } else { Vec::new() };
        Ok((exp1, exp2, run.blocks))
    })();
    bg.thaw();
    if let Some(s) = &static_bg {
        s.thaw();
    }
    // Stopped while its containers still exist: the daemon restores what it changed.
    let agent_report = agent.stop();
    let stopped = env.runtime.stop_background(&bg);
    let static_stopped = static_bg.as_ref().map_or(Ok(()), |s| env.runtime.stop_background(s));
    let ended = env.runtime.end_mode();
    let (exp1, exp2, background_blocks) = result?;
    let agent = agent_report?;
    stopped?;
    static_stopped?;
    ended?;
    Ok(ModeReport {
        mode,
        iosched,
        duration_s: started.elapsed().as_secs_f64(),
        exp1,
        exp2,
        background_blocks,
        agent: Some(agent),
        iocost,
        weight_file: Some(probe.describe()),
        static_background: delivery.first(),
    })
}

impl ModeRun<'_, '_> {
    /// Puts the system in the state of `variant`.
    fn enter(&self, variant: Variant) -> Result<()> {
        // The static-best background runs in its own blocks only; stopping it waits for its in-flight I/O.
        let freeze_static = || self.statics.map_or(Ok(()), |(s, _)| s.freeze());
        match variant {
            Variant::Alone => {
                self.agent.set_dry_run(true)?;
                self.bg.freeze()?;
                freeze_static()?;
                // The frozen background's requests already in the device are served before anything else: Alone
                // starts once the device has none left.
                self.env.disk.wait_idle(crate::sys::patience(ALONE_IDLE_TIMEOUT))?;
            }
            Variant::Original => {
                freeze_static()?;
                self.bg.thaw();
                self.agent.set_dry_run(true)?;
            }
            Variant::DDiskQos => {
                freeze_static()?;
                self.bg.thaw();
                self.agent.set_dry_run(false)?;
            }
            Variant::StaticBest => {
                // The agent writes nothing (and has restored what it wrote); the weights are those set at creation.
                self.agent.set_dry_run(true)?;
                self.bg.freeze()?;
                self.active_bg(variant)?.thaw();
            }
        }
        std::thread::sleep(self.cfg.settle);
        self.bg.check_alive()?;
        self.statics.map_or(Ok(()), |(s, _)| s.check_alive())
    }

    /// The background that runs in `variant`'s blocks (frozen in Alone's).
    fn active_bg(&self, variant: Variant) -> Result<&Background> {
        match (variant, self.statics) {
            (Variant::StaticBest, Some((s, _))) => Ok(s),
            (Variant::StaticBest, None) => bail!("static best without its background (--static-best not given)"),
            _ => Ok(self.bg),
        }
    }

    fn bg_bytes(&self, variant: Variant) -> Result<u64> {
        self.active_bg(variant)?.bytes()
    }

    /// One read, measured; returns the sample and the background's bytes during it.
    fn read_one(&self, file: &Path, size_mib: u64, round: usize, variant: Variant) -> Result<(Sample, f64)> {
        let statics = self.statics.map(|(_, s)| s);
        let (expect, weight) = match (variant, statics) {
            (Variant::DDiskQos, _) => (Expect::AgentTop, None),
            (Variant::StaticBest, Some(s)) => (Expect::StaticStarting(s.reader, s.delivery), Some(s.reader)),
            _ => (Expect::Read, None),
        };
        let hooks = AgentHooks { agent: self.agent, expect };
        let bg = self.active_bg(variant)?;
        let b0 = bg.bytes()?;
        let t0 = Instant::now();
        let out = self.env.runtime.run_reader(file, weight, &hooks)?;
        let window = t0.elapsed().as_secs_f64();
        let bg_bytes = bg.bytes()?.saturating_sub(b0);
        // What the background's weight is now, read from its file: the agent's decision in dDiskQoS blocks, the
        // restored original in the others; in static-best blocks the bottom weight it was created with, or the run
        // fails.
        let bg_dir = self.env.runtime.background_weight_dir(bg);
        let bg_weight = match (variant, statics) {
            (Variant::StaticBest, Some(s)) => s.background.check(&bg_dir)?.weight,
            _ => self.agent.read_weight(&bg_dir)?.weight,
        };
        let want = size_mib << 20;
        if out.report.bytes != want {
            bail!("reader of {} read {} bytes, expected {want}", file.display(), out.report.bytes);
        }
        if let Some(charged) = out.charged_bytes {
            // The kernel must have charged the reader's cgroup for what it read (else weights cannot act on it).
            if charged < want {
                bail!("cgroup {} was charged {charged} bytes for a {want}-byte read", out.id);
            }
        }
        self.progress.inc(1);
        let sample = Sample {
            round,
            read_ms: out.report.elapsed_ns as f64 / 1e6,
            wall_ms: out.wall.as_secs_f64() * 1e3,
            bytes: out.report.bytes,
            charged_bytes: out.charged_bytes,
            bg_bytes: if variant == Variant::Alone { 0 } else { bg_bytes },
            id: out.id,
            weight: Some(out.weight),
            bg_weight: Some(bg_weight),
            vrate: if self.mode.is_iocost() { vrate(&self.env.root, &self.env.disk.info.maj_min) } else { None },
        };
        Ok((sample, window))
    }

    /// Whether a soak's time for this experiment is up (never in a plain run).
    fn soak_over(&self, exp2: bool) -> bool {
        self.cfg.soak.is_some_and(|total| {
            let until = if exp2 { total } else { total.mul_f64(SOAK_EXP1_SHARE) };
            self.measuring.elapsed() >= until
        })
    }

    fn exp1(&mut self) -> Result<Vec<CaseReport>> {
        let mut accs: BTreeMap<(u64, Variant), Acc> = BTreeMap::new();
        for round in workload::exp1_rounds(&self.cfg.plan.exp1, &self.cfg.variants()) {
            if self.soak_over(false) {
                break;
            }
            for variant in round.order {
                self.progress.set_message(format!(
                    "{} exp1 round {} {}",
                    self.mode.name(),
                    round.index + 1,
                    variant.label()
                ));
                self.enter(variant)?;
                let (b0, t0) = (self.bg_bytes(variant)?, Instant::now());
                for &size in &round.sizes {
                    let file = self.env.file(&workload::exp1_file(size))?.to_path_buf();
                    let (sample, window) = self.read_one(&file, size, round.index, variant)?;
                    let acc = accs.entry((size, variant)).or_default();
                    acc.lat.record(Duration::from_secs_f64(sample.read_ms / 1e3));
                    acc.bg.add(sample.bg_bytes, window);
                    acc.samples.push(sample);
                    std::thread::sleep(self.cfg.gap);
                }
                self.close_block(variant, b0, t0)?;
            }
        }
        let mut sizes: Vec<u64> = self.cfg.plan.exp1.iter().map(|c| c.size_mib).collect();
        sizes.sort_unstable();
        sizes.dedup();
        Ok(sizes
            .into_iter()
            .map(|size| {
                let parts = Variant::ALL
                    .into_iter()
                    .filter_map(|v| accs.remove(&(size, v)).map(|a| (v, a.lat, a.bg, a.samples)))
                    .collect();
                CaseReport::build(format!("{size}MiB"), size, None, workload::paper_table3(size), parts)
            })
            .collect())
    }

    fn close_block(&mut self, variant: Variant, b0: u64, t0: Instant) -> Result<()> {
        let bytes = if variant == Variant::Alone { 0 } else { self.bg_bytes(variant)?.saturating_sub(b0) };
        self.blocks.entry(variant).or_default().add(bytes, t0.elapsed().as_secs_f64());
        Ok(())
    }

    fn exp2(&mut self) -> Result<Vec<CaseReport>> {
        let schedule = self.cfg.plan.exp2.clone();
        let mut accs: BTreeMap<(usize, Variant), Acc> = BTreeMap::new();
        for r in 0..self.cfg.plan.exp2_reps as usize {
            if self.soak_over(true) {
                break;
            }
            for variant in workload::variant_order(r, &self.cfg.variants()) {
                self.progress.set_message(format!("{} exp2 round {} {}", self.mode.name(), r + 1, variant.label()));
                self.enter(variant)?;
                let (b0, t0) = (self.bg_bytes(variant)?, Instant::now());
                let results = self.run_schedule(&schedule, r, variant)?;
                for (i, (sample, window)) in results.into_iter().enumerate() {
                    let acc = accs.entry((i, variant)).or_default();
                    acc.lat.record(Duration::from_secs_f64(sample.read_ms / 1e3));
                    acc.bg.add(sample.bg_bytes, window);
                    acc.samples.push(sample);
                }
                self.close_block(variant, b0, t0)?;
                std::thread::sleep(self.cfg.gap);
            }
        }
        Ok(schedule
            .iter()
            .enumerate()
            .map(|(i, reader)| {
                let parts = Variant::ALL
                    .into_iter()
                    .filter_map(|v| accs.remove(&(i, v)).map(|a| (v, a.lat, a.bg, a.samples)))
                    .collect();
                let start = Some(reader.start.as_millis() as u64);
                CaseReport::build(
                    reader.label.clone(),
                    reader.size_mib,
                    start,
                    workload::paper_table5(reader.size_mib),
                    parts,
                )
            })
            .collect())
    }

    /// Starts every reader of the schedule at its time (one thread each) and collects them in schedule order.
    fn run_schedule(&self, schedule: &[Exp2Reader], round: usize, variant: Variant) -> Result<Vec<(Sample, f64)>> {
        let origin = Instant::now();
        let files: Vec<PathBuf> = schedule
            .iter()
            .enumerate()
            .map(|(i, r)| self.env.file(&workload::exp2_file(i, r)).map(Path::to_path_buf))
            .collect::<Result<_>>()?;
        let this = self;
        std::thread::scope(|scope| {
            let handles: Vec<_> = schedule
                .iter()
                .zip(&files)
                .map(|(reader, file)| {
                    scope.spawn(move || {
                        std::thread::sleep((origin + reader.start).saturating_duration_since(Instant::now()));
                        this.read_one(file, reader.size_mib, round, variant)
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().map_err(|_| anyhow::anyhow!("reader thread panicked"))?).collect()
        })
    }
}

/// Every read a mode does, in the order it reads them (so a runtime can prepare each reader ahead), the
/// static-best variant's with `reader` (its readers' weight); a soak's first rounds only.
fn planned_reads(env: &Env<'_>, cfg: &RunConfig, reader: Option<StaticWeight>) -> Result<Vec<PlannedRead>> {
    let rounds = if cfg.soak.is_some() { SOAK_PREPARED_ROUNDS } else { usize::MAX };
    let variants = cfg.variants();
    let weight = |v: Variant| if v == Variant::StaticBest { reader } else { None };
    let mut reads = Vec::new();
    if cfg.exp1 {
        for round in workload::exp1_rounds(&cfg.plan.exp1, &variants).into_iter().take(rounds) {
            for v in round.order {
                for &size in &round.sizes {
                    let file = env.file(&workload::exp1_file(size))?.to_path_buf();
                    reads.push(PlannedRead { file, weight: weight(v) });
                }
            }
        }
    }
    if cfg.exp2 {
        for r in 0..(cfg.plan.exp2_reps as usize).min(rounds) {
            for v in workload::variant_order(r, &variants) {
                for (i, reader) in cfg.plan.exp2.iter().enumerate() {
                    let file = env.file(&workload::exp2_file(i, reader))?.to_path_buf();
                    reads.push(PlannedRead { file, weight: weight(v) });
                }
            }
        }
    }
    Ok(reads)
}

/// Starts the static-best background at `weight` (set at its creation, not announced to the agent; written by the
/// bench where the runtime's way did not take, which `delivery` learns for the readers), checks that the file
/// governing the device reads it, and stops it until its first block.
fn start_static_background(
    env: &Env<'_>,
    cfg: &RunConfig,
    file: &Path,
    weight: StaticWeight,
    delivery: &Delivery,
    agent: &Agent,
) -> Result<Background> {
    let hooks = AgentHooks { agent, expect: Expect::StaticSetUp(weight, delivery) };
    let bg = env.runtime.start_background(file, cfg.background, Some(weight), &hooks)?;
    // Where its weight governs (a pod: the pod cgroup), as after every static-best read.
    let checked = weight.check(&env.runtime.background_weight_dir(&bg)).and_then(|_| bg.freeze());
    if let Err(e) = checked {
        let _ = env.runtime.stop_background(&bg);
        return Err(e);
    }
    Ok(bg)
}

/// The device's `cost.vrate=P` (percent) in the v2 root's `io.stat` (the kernel prints it for the root cgroup of a
/// device with io.cost enabled), read with the agent's parser; `None` when absent.
fn vrate(root: &CgroupRoot, maj_min: &str) -> Option<f64> {
    let text = std::fs::read_to_string(root.path().join("io.stat")).ok()?;
    qos_agent::blockdev::vrate::vrate_of(&text, maj_min.parse().ok()?)
}
