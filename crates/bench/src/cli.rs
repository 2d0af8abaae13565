//! Command line.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Result};
use clap::{Args, Parser, Subcommand};
use qos_core::units::parse_duration;
use qos_core::{ByteSize, Config, LevelConfig, Weight};

use crate::disk::DiskSource;
use crate::runtime::cgroup::CgroupLayout;
use crate::runtime::{BackgroundKind, RuntimeChoice};
use crate::throttled::{self, ThrottleModel};
use crate::workload::{BfqMode, Exp1Case, Plan};

/// Replays the dDiskQoS paper's experiments (Tables 3-5) on a real BFQ device, with real cgroups or containers
/// and the engine live.
#[derive(Debug, Parser)]
#[command(name = "ddiskqos-bench", version, about, long_about = None)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Cmd,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Cmd {
    /// Prepare a disk, run Alone/Original/dDiskQoS in both BFQ modes, print the tables, write JSON and charts,
    /// clean up. Without flags: quick mode, a few minutes.
    Run(RunArgs),
    /// Measure for a long time (`--minutes`) in the first mode of `--modes`: Experiment 1's sizes 1, 10, 64 and
    /// 100 MiB, then Experiment 2's schedule, Alone / Original / dDiskQoS interleaved; report the STARVED reads.
    Soak(SoakArgs),
    /// Try engine settings (bottom weight, sampling interval, boost period) in both BFQ modes on 1 and 10 MiB reads
    /// and report the best small-read latency whose background keeps >= 90 % of Original's throughput.
    Sweep(SweepArgs),
    /// Draw the Grafana dashboard's panels (deploy/grafana/ddiskqos-agent.json) from a run's recorded scrapes
    /// (scripts/record-metrics.sh; .gz read through gzip) into a PNG, evaluating each panel's own queries.
    Dashboard {
        /// The recorded scrapes.
        scrapes: PathBuf,
        /// The dashboard JSON.
        #[arg(long, default_value = "deploy/grafana/ddiskqos-agent.json")]
        dashboard: PathBuf,
        /// The PNG to write.
        #[arg(long, default_value = "deploy/grafana/dashboard.png")]
        out: PathBuf,
        /// What Grafana's $__rate_interval stands for (Grafana: four scrape intervals at least).
        #[arg(long, default_value = "15s")]
        rate_interval: String,
        /// Seconds between evaluations.
        #[arg(long, default_value_t = 2.0)]
        step: f64,
    },
    /// Render the tables and charts of a results.json again.
    Report {
        /// The results.json of a run.
        json: PathBuf,
        /// Where to write the chart (default: next to the JSON).
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// (internal) Join a cgroup, read a whole file with O_DIRECT, print the read time as JSON.
    #[command(hide = true)]
    ReadFile {
        /// Cgroup directory to join first.
        #[arg(long)]
        cgroup: Option<PathBuf>,
        /// Wait until this file exists before reading.
        #[arg(long)]
        wait_for: Option<PathBuf>,
        /// Block on this FIFO until the bench writes the path to read into it (replaces PATH).
        #[arg(long, requires = "result")]
        go_fifo: Option<PathBuf>,
        /// Write the report to this file instead of stdout.
        #[arg(long)]
        result: Option<PathBuf>,
        /// The file.
        #[arg(required_unless_present = "go_fifo")]
        path: Option<PathBuf>,
    },
    /// (internal) Join a cgroup and stream a file with O_DIRECT until killed.
    #[command(hide = true)]
    Stream {
        /// Cgroup directory to join first.
        #[arg(long)]
        cgroup: Option<PathBuf>,
        /// Reader threads.
        #[arg(long, default_value_t = 4)]
        threads: usize,
        /// The file.
        path: PathBuf,
    },
    /// (internal) Spin on one CPU until the process `parent` is no longer this one's parent (`--cpu-hogs`).
    #[command(hide = true)]
    Spin {
        /// The bench's pid.
        #[arg(long)]
        parent: u32,
    },
    /// (internal) Prepare the disk of the disk flags with room for `--size-mib` of files, print it as JSON (one line:
    /// `disk`, `daemon_pid`), keep it until standard input closes, then clean up (the throttled disk's real test).
    #[command(hide = true)]
    HoldDisk {
        /// The disk.
        #[command(flatten)]
        disk: DiskArgs,
        /// Room for this many MiB of files.
        #[arg(long, default_value_t = 64)]
        size_mib: u64,
    },
    /// (internal) Join a cgroup, then exec a command.
    #[command(hide = true)]
    ExecIn {
        /// Cgroup directory to join.
        #[arg(long)]
        cgroup: PathBuf,
        /// The command.
        #[arg(last = true, required = true)]
        argv: Vec<String>,
    },
}

fn duration(s: &str) -> Result<Duration, String> {
    parse_duration(s)
}

fn opt_duration(s: &str) -> Result<Option<Duration>, String> {
    if s == "off" {
        Ok(None)
    } else {
        parse_duration(s).map(Some)
    }
}

/// What `--disk` makes when neither `--device` nor `--dir` names a disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DiskKind {
    /// An image in a private tmpfs, served by qemu-storage-daemon through a throttle (`--disk-bps`, `--disk-iops`;
    /// the cgroup-v2 guest's disk model) over FUSE, attached as a loop device: nothing reaches the root disk.
    Throttled,
    /// A sparse file in the work directory (on the root disk as a rule), attached as a loop device: its speed is the
    /// root disk's, shared with Docker's data.
    Loop,
}

/// The disk under test: `--disk`, or an existing device or directory.
#[derive(Debug, Clone, Args)]
pub struct DiskArgs {
    /// The disk to create when neither --device nor --dir is given: `throttled` (RAM-backed image behind
    /// qemu-storage-daemon's throttle; the image takes RAM up to the files' size plus 10 % and 256 MiB) or `loop`
    /// (sparse file on the root file system).
    #[arg(long, value_enum, default_value = "throttled", conflicts_with_all = ["device", "dir"])]
    pub disk: DiskKind,
    /// `--disk throttled`: the device's bytes per second, reads and writes together [default: 157286400, 150 MiB/s].
    #[arg(long, value_name = "BYTES")]
    pub disk_bps: Option<u64>,
    /// `--disk throttled`: the device's I/O requests per second [default: 1500].
    #[arg(long, value_name = "N")]
    pub disk_iops: Option<u64>,
    /// Use this (unmounted) block device instead of a loop device; needs --format.
    #[arg(long, conflicts_with = "dir")]
    pub device: Option<PathBuf>,
    /// Allow creating an ext4 file system on --device (destroys its data).
    #[arg(long)]
    pub format: bool,
    /// Use this directory (on a disk other than the root disk) instead of a loop device.
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Where the work directory (the loop device's sparse backing file, the throttled disk's tmpfs) goes.
    #[arg(long)]
    pub work_dir: Option<PathBuf>,
}

impl DiskArgs {
    /// The disk to prepare in `work` for `files_mib` of files.
    pub fn source(&self, work: &Path, files_mib: u64) -> Result<DiskSource> {
        let throttled = self.disk == DiskKind::Throttled && self.device.is_none() && self.dir.is_none();
        if !throttled && (self.disk_bps.is_some() || self.disk_iops.is_some()) {
            bail!("--disk-bps and --disk-iops set the throttled disk's model: they need --disk throttled");
        }
        Ok(if let Some(dev) = &self.device {
            DiskSource::Device { path: dev.clone(), format: self.format }
        } else if let Some(dir) = &self.dir {
            DiskSource::Dir(dir.clone())
        } else if throttled {
            let model = ThrottleModel::new(self.disk_bps, self.disk_iops)?;
            DiskSource::Throttled { dir: work.to_path_buf(), size: throttled::image_size(files_mib), model }
        } else {
            DiskSource::Loop { dir: work.to_path_buf(), size: crate::disk::loop_size(files_mib) }
        })
    }
}

/// Settings shared by `run` and `sweep`.
#[derive(Debug, Clone, Args)]
pub struct Common {
    /// Where readers run: docker when a daemon answers, else cgroup-dir.
    #[arg(long, value_enum, default_value = "auto")]
    pub runtime: RuntimeChoice,
    /// `--runtime cri`: the CRI runtime's socket (containerd's by default; CRI-O's is /var/run/crio/crio.sock).
    #[arg(long, env = "DDISKQOS_CRI_SOCKET", default_value = crate::runtime::cri::DEFAULT_SOCKET)]
    pub cri_socket: PathBuf,
    /// Readers' cgroups under one common parent (nested: Docker's default `docker/<id>`, the layout users run) or
    /// directly under the blkio root (flat: Docker with `--cgroup-parent=/`, an operator's choice). On cgroup v1,
    /// BFQ lets a new cgroup preempt the one in service only between top-level groups, so the layout decides
    /// whether a new high-weight container gets the disk at once (`strict-tuned` is the remedy for nested).
    #[arg(long, value_enum, default_value = "nested")]
    pub cgroup_layout: CgroupLayout,
    /// BFQ modes to run, in order: BFQ defaults (the host as it was); the device as the shipped agent protects it
    /// (`protect`); strict_guarantees=1 with the short BFQ slots (`strict-tuned`); strict_guarantees=1 alone.
    /// (Also: `strict-nolowlat`, and on cgroup v2 `iocost-kernel`, `iocost-calibrated`.)
    #[arg(long, value_enum, value_delimiter = ',', default_value = "default,protect,strict-tuned,strict")]
    pub modes: Vec<BfqMode>,
    /// The disk under test.
    #[command(flatten)]
    pub disk: DiskArgs,
    /// Set a BFQ tunable of the test device for the whole run (repeatable), e.g. `low_latency=0`.
    #[arg(long = "bfq-set", value_name = "KEY=VALUE")]
    pub bfq_set: Vec<String>,
    /// A BFQ tunable the agent sets on the test device at its start and restores at its stop (its
    /// `[devices] bfq_tunables`), for every mode and variant (repeatable), e.g. `max_budget=256`.
    #[arg(long = "agent-bfq-tunable", value_name = "KEY=VALUE")]
    pub agent_bfq_tunables: Vec<String>,
    /// The agent's nice value (its config's `nice`; default: the agent's own default).
    #[arg(long, allow_hyphen_values = true, default_value_t = qos_agent::priority::DEFAULT_NICE,
          value_parser = clap::value_parser!(i8).range(-20..=19))]
    pub agent_nice: i8,
    /// How the agent applies weights (its config's `actuator`; default: the shipped `auto`, which on a systemd host
    /// with cgroup v2 sends the weights of units through systemd). `files` writes the cgroup files only: the A/B
    /// against `auto` on Docker's systemd driver.
    #[arg(long, value_enum, default_value = "auto")]
    pub agent_actuator: qos_agent::config::ActuatorMode,
    /// Busy processes (nice 0, each in a session of its own, as other programs of a host are) spinning through the
    /// whole run beside everything else: a host whose CPUs are busy.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u16).range(0..=64))]
    pub cpu_hogs: u16,
    /// The background reader.
    #[arg(long, value_enum, default_value = "auto")]
    pub background: BackgroundKind,
    /// Size of the background's file (MiB); it is read in a loop.
    #[arg(long, default_value_t = 2048)]
    pub bg_size_mib: u64,
    /// Live engine: counter sampling interval (default: the agent's shipped `sample_interval`; every result until
    /// 2026-11-26 was measured at 100ms).
    #[arg(long, value_parser = duration, default_value = "500ms")]
    pub sample_interval: Duration,
    /// Live engine: the agent's `entry_sample_interval` (rounds this often for 2 s after a container enters the top
    /// level; default: as shipped), or "off".
    #[arg(long, value_parser = opt_duration, default_value = "50ms")]
    pub entry_sample_interval: ::std::option::Option<Duration>, // qualified, as idle_promote_after
    /// Engine: weight of each level, top first (paper: new containers at 1000).
    #[arg(long, value_delimiter = ',', default_value = "1000,200,40,10")]
    pub weights: Vec<u64>,
    /// Engine: allotment of each level (paper's Table 1).
    #[arg(long, value_delimiter = ',', default_value = "2MiB,8MiB,32MiB,128MiB")]
    pub thresholds: Vec<String>,
    /// Engine: starvation boost of a container below the top for this long.
    #[arg(long, value_parser = duration, default_value = "10s")]
    pub boost_after: Duration,
    /// Engine: idle promotion period, or `off`.
    #[arg(long, value_parser = opt_duration, default_value = "2s")]
    pub idle_promote_after: ::std::option::Option<Duration>, // qualified: clap must not treat it as optional
    /// Engine: the fair-share floor's `share_floor_percent` (default: as shipped).
    #[arg(long, value_name = "PERCENT")]
    pub share_floor_percent: Option<u8>,
    /// Engine: `bottom_cap_window`, how long a container reads at the bottom before it is capped under the
    /// device's load, or `off` (default: as shipped, off).
    #[arg(long, value_parser = opt_duration, default_value = "off")]
    pub bottom_cap_window: ::std::option::Option<Duration>, // qualified, as idle_promote_after
    /// Engine: `bottom_cap_percent` (default: as shipped).
    #[arg(long, value_name = "PERCENT")]
    pub bottom_cap_percent: Option<u8>,
    /// Docker runtime only: the reference run with static weights. Readers and background carry the agent's own
    /// `ddiskqos.weight` label, READER and BACKGROUND (e.g. `1000,10`), so in dDiskQoS blocks the agent pins them
    /// there from their creation and its MLFQ never moves them.
    #[arg(long, value_name = "READER,BACKGROUND", value_delimiter = ',')]
    pub pin_weights: Option<Vec<u32>>,
    /// Pause after each foreground read.
    #[arg(long, value_parser = duration, default_value = "100ms")]
    pub gap: Duration,
    /// Pause after entering each block (Alone, Original, dDiskQoS: the background frozen or thawed, the agent in or
    /// out of dry run) before its first read. A longer one lets what the block set take hold first (the bottom's
    /// cap, lifted in the dry-run blocks, refills a throttled device's bucket only at its headroom).
    #[arg(long, value_parser = duration, default_value = "50ms")]
    pub settle: Duration,
    /// Seed of the file contents.
    #[arg(long, default_value_t = 2026)]
    pub seed: u64,
    /// Output directory.
    #[arg(long, default_value = "bench-out")]
    pub out: PathBuf,
}

impl Common {
    /// `--pin-weights` as (reader, background), checked against the agent's range.
    pub fn pin(&self) -> Result<Option<(u32, u32)>> {
        let Some(pins) = &self.pin_weights else { return Ok(None) };
        let [reader, bg] = pins[..] else { bail!("--pin-weights wants READER,BACKGROUND, got {pins:?}") };
        for (what, w) in [("READER", reader), ("BACKGROUND", bg)] {
            Weight::new(u64::from(w)).map_err(|e| anyhow::anyhow!("--pin-weights {what} = {w}: {e}"))?;
        }
        Ok(Some((reader, bg)))
    }

    /// The engine configuration from the flags (validated).
    pub fn engine_config(&self) -> Result<Config> {
        if self.weights.len() != self.thresholds.len() {
            bail!("--weights has {} values but --thresholds has {}", self.weights.len(), self.thresholds.len());
        }
        let mut levels = Vec::new();
        for (i, (w, t)) in self.weights.iter().zip(&self.thresholds).enumerate() {
            let weight = Weight::new(*w).map_err(|e| anyhow::anyhow!("--weights[{i}] = {w}: {e}"))?;
            let threshold = ByteSize::parse(t).map_err(|e| anyhow::anyhow!("--thresholds[{i}] = {t}: {e}"))?;
            levels.push(LevelConfig { weight, threshold });
        }
        let cfg = Config {
            levels,
            boost_after: self.boost_after,
            idle_promote_after: self.idle_promote_after,
            share_floor_percent: self.share_floor_percent.unwrap_or(Config::default().share_floor_percent),
            bottom_cap_window: self.bottom_cap_window,
            bottom_cap_percent: self.bottom_cap_percent.unwrap_or(Config::default().bottom_cap_percent),
            ..Config::default()
        };
        cfg.validate()?;
        Ok(cfg)
    }
}

/// `run`.
#[derive(Debug, Clone, Args)]
pub struct RunArgs {
    /// Common settings.
    #[command(flatten)]
    pub common: Common,
    /// The paper's 50 repetitions of everything (instead of quick mode).
    #[arg(long)]
    pub full: bool,
    /// Experiment 1 sizes in MiB (default 1,10,100,1000).
    #[arg(long, value_delimiter = ',')]
    pub sizes: Option<Vec<u64>>,
    /// Repetitions of every Experiment 1 size (overrides quick/full).
    #[arg(long)]
    pub reps: Option<u32>,
    /// Repetitions of Experiment 2.
    #[arg(long)]
    pub exp2_reps: Option<u32>,
    /// Multiply Experiment 2's start times by this (1 = the paper's seconds).
    #[arg(long, default_value_t = 1.0)]
    pub exp2_time_scale: f64,
    /// Skip Experiment 1.
    #[arg(long)]
    pub no_exp1: bool,
    /// Skip Experiment 2.
    #[arg(long)]
    pub no_exp2: bool,
    /// Also run the static-best variant (issue 25), interleaved per repetition with the others: a second background
    /// created at the engine's bottom weight and every reader at its top weight, set once at creation through the
    /// runtime (Docker: `--blkio-weight`), the agent writing nothing; the report compares dDiskQoS with it (target
    /// 1.2x). Off by default: it adds a third to the run's time.
    #[arg(long)]
    pub static_best: bool,
    /// A remark about the test bed that the report and the JSON carry first among their notes (repeatable), e.g.
    /// that the run is under emulation on a throttled disk (`scripts/bench-v2.sh` says so).
    #[arg(long = "note", value_name = "TEXT")]
    pub notes: Vec<String>,
}

impl RunArgs {
    /// The plan from quick/full and the overrides.
    pub fn plan(&self) -> Result<Plan> {
        let mut plan = if self.full { Plan::full() } else { Plan::quick() };
        if let Some(sizes) = &self.sizes {
            if sizes.is_empty() || sizes.contains(&0) {
                bail!("--sizes must list sizes of at least 1 MiB");
            }
            // A round reads each size once per variant: a size given twice would be two reads of one round.
            if let Some(twice) = sizes.iter().enumerate().find_map(|(i, s)| sizes[..i].contains(s).then_some(s)) {
                bail!("--sizes lists {twice} twice ({sizes:?}): give each size once");
            }
            let default_reps = |size: u64| plan.exp1.iter().find(|c| c.size_mib == size).map_or(10, |c| c.reps);
            plan.exp1 = sizes.iter().map(|&size_mib| Exp1Case { size_mib, reps: default_reps(size_mib) }).collect();
        }
        if let Some(reps) = self.reps {
            plan.exp1.iter_mut().for_each(|c| c.reps = reps);
        }
        if let Some(reps) = self.exp2_reps {
            plan.exp2_reps = reps;
        }
        if !(self.exp2_time_scale > 0.0 && self.exp2_time_scale <= 100.0) {
            bail!("--exp2-time-scale must be in (0, 100], got {}", self.exp2_time_scale);
        }
        plan.exp2 = crate::workload::scale_schedule(&plan.exp2, self.exp2_time_scale);
        Ok(plan)
    }
}

/// `soak`.
#[derive(Debug, Clone, Args)]
pub struct SoakArgs {
    /// Common settings; the soak runs the first mode of `--modes`.
    #[command(flatten)]
    pub common: Common,
    /// How long to measure (the set-up and the report come on top).
    #[arg(long, value_parser = minutes)]
    pub minutes: f64,
}

fn minutes(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(m) if m > 0.0 && m <= 24.0 * 60.0 => Ok(m),
        _ => Err(format!("--minutes must be a number of minutes in (0, 1440], got {s:?}")),
    }
}

/// `sweep`.
#[derive(Debug, Clone, Args)]
pub struct SweepArgs {
    /// Common settings (the baseline the sweep varies one knob at a time from).
    #[command(flatten)]
    pub common: Common,
    /// Repetitions of 1 and 10 MiB per setting and variant.
    #[arg(long, default_value_t = 10)]
    pub reps: u32,
    /// Smallest acceptable background throughput, as a fraction of Original's.
    #[arg(long, default_value_t = 0.9)]
    pub min_background: f64,
    /// Sweep BFQ tunables instead of the engine's knobs: each point is one or more `KEY=VALUE` separated by `+`
    /// (e.g. `timeout_sync=8+slice_idle=0`), set on the test device for that point only (repeatable). The sweep
    /// then runs the baseline (the device as `--bfq-set` left it) and these points, with the engine fixed.
    #[arg(long = "bfq-point", value_name = "KEY=VALUE[+KEY=VALUE...]")]
    pub bfq_points: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Cli {
        Cli::try_parse_from(std::iter::once("ddiskqos-bench").chain(args.iter().copied())).unwrap()
    }

    #[test]
    fn soak_takes_minutes_and_the_common_flags() {
        let Cmd::Soak(soak) = parse(&["soak", "--minutes", "30", "--modes", "strict-tuned"]).command else { panic!() };
        assert_eq!(soak.minutes, 30.0);
        assert_eq!(soak.common.modes, vec![BfqMode::StrictTuned]);
        for bad in ["0", "-1", "1441", "soon"] {
            let err = Cli::try_parse_from(["ddiskqos-bench", "soak", "--minutes", bad]).unwrap_err().to_string();
            assert!(err.contains("--minutes") && err.contains(bad), "{bad}: {err}");
        }
        assert!(Cli::try_parse_from(["ddiskqos-bench", "soak"]).is_err(), "--minutes is required");
        let plan = Plan::soak();
        assert_eq!(plan.exp1.iter().map(|c| c.size_mib).collect::<Vec<_>>(), vec![1, 10, 64, 100]);
        assert!(plan.describe_soak().contains("64 MiB") && plan.describe_soak().contains("64MiB@2s"));
    }

    #[test]
    fn run_without_flags_is_quick_both_modes_with_the_papers_engine() {
        let Cmd::Run(run) = parse(&["run"]).command else { panic!() };
        assert_eq!(run.common.modes, vec![BfqMode::Default, BfqMode::Protect, BfqMode::StrictTuned, BfqMode::Strict]);
        assert_eq!(run.common.cgroup_layout, CgroupLayout::Nested);
        assert_eq!(run.plan().unwrap(), Plan::quick());
        assert_eq!(run.common.engine_config().unwrap(), Config::default());
        // As shipped: the agent's own sampling interval.
        assert_eq!(run.common.sample_interval, qos_agent::config::AgentConfig::default().sample_interval);
        let shipped = qos_agent::config::AgentConfig::default().entry_sample_interval;
        assert_eq!(run.common.entry_sample_interval, shipped);
        assert_eq!(run.common.out, PathBuf::from("bench-out"));
        assert_eq!(run.common.runtime, RuntimeChoice::Auto);
        assert!(run.notes.is_empty());
        assert!(!run.static_best, "the static-best variant only when asked for");
        let Cmd::Run(noted) = parse(&["run", "--note", "under emulation", "--note", "throttled"]).command else {
            panic!()
        };
        assert_eq!(noted.notes, vec!["under emulation", "throttled"]);
    }

    #[test]
    fn overrides() {
        let Cmd::Run(run) = parse(&[
            "run",
            "--sizes",
            "1,2",
            "--reps",
            "3",
            "--exp2-reps",
            "1",
            "--exp2-time-scale",
            "0.1",
            "--modes",
            "strict",
            "--weights",
            "1000,1",
            "--thresholds",
            "2MiB,8MiB",
            "--idle-promote-after",
            "off",
        ])
        .command
        else {
            panic!()
        };
        let plan = run.plan().unwrap();
        assert_eq!(plan.exp1, vec![Exp1Case { size_mib: 1, reps: 3 }, Exp1Case { size_mib: 2, reps: 3 }]);
        assert_eq!(plan.exp2_reps, 1);
        assert_eq!(plan.exp2[2].start, Duration::from_millis(300));
        let cfg = run.common.engine_config().unwrap();
        assert_eq!(cfg.levels.len(), 2);
        let Cmd::Run(twice) = parse(&["run", "--sizes", "1,10,1"]).command else { panic!() };
        assert!(twice.plan().unwrap_err().to_string().contains("--sizes lists 1 twice"));
        let Cmd::Run(pinned) = parse(&["run", "--pin-weights", "1000,10"]).command else { panic!() };
        assert_eq!(pinned.common.pin().unwrap(), Some((1000, 10)));
        let Cmd::Run(bad) = parse(&["run", "--pin-weights", "1000,0"]).command else { panic!() };
        assert!(bad.common.pin().unwrap_err().to_string().contains("BACKGROUND = 0"));
        let Cmd::Run(one) = parse(&["run", "--pin-weights", "1000"]).command else { panic!() };
        assert!(one.common.pin().unwrap_err().to_string().contains("READER,BACKGROUND"));
        assert_eq!(cfg.idle_promote_after, None);
        assert!(parse(&["run", "--full"]).command.is_run_full());
    }

    #[test]
    fn bad_engine_flags_name_the_field() {
        let Cmd::Run(run) = parse(&["run", "--weights", "1000,2000", "--thresholds", "2MiB,8MiB"]).command else {
            panic!()
        };
        assert!(run.common.engine_config().unwrap_err().to_string().contains("--weights[1]"));
        let Cmd::Run(run) = parse(&["run", "--weights", "10,1000", "--thresholds", "2MiB,8MiB"]).command else {
            panic!()
        };
        assert!(run.common.engine_config().unwrap_err().to_string().contains("levels[1].weight"));
    }

    #[test]
    fn the_disk_is_throttled_by_default_and_loop_on_request() {
        let work = Path::new("/w");
        let Cmd::Run(run) = parse(&["run"]).command else { panic!() };
        assert_eq!(run.common.disk.disk, DiskKind::Throttled);
        let DiskSource::Throttled { dir, size, model } = run.common.disk.source(work, 2359).unwrap() else {
            panic!("default: throttled")
        };
        assert_eq!((dir.as_path(), size, model), (work, throttled::image_size(2359), ThrottleModel::default()));

        let Cmd::Run(run) = parse(&["run", "--disk-bps", "104857600", "--disk-iops", "800"]).command else { panic!() };
        let DiskSource::Throttled { model, .. } = run.common.disk.source(work, 10).unwrap() else { panic!() };
        assert_eq!(model, ThrottleModel { bytes_per_sec: 104_857_600, iops: 800 });
        let Cmd::Run(run) = parse(&["run", "--disk-iops", "1"]).command else { panic!() };
        let err = run.common.disk.source(work, 10).unwrap_err().to_string();
        assert!(err.contains("--disk-iops") && err.contains("got 1"), "{err}");

        let Cmd::Run(run) = parse(&["run", "--disk", "loop"]).command else { panic!() };
        let DiskSource::Loop { dir, size } = run.common.disk.source(work, 2359).unwrap() else { panic!("loop") };
        assert_eq!((dir.as_path(), size), (work, crate::disk::loop_size(2359)));
        let Cmd::Run(run) = parse(&["run", "--disk", "loop", "--disk-bps", "104857600"]).command else { panic!() };
        let err = run.common.disk.source(work, 10).unwrap_err().to_string();
        assert!(err.contains("need --disk throttled"), "{err}");

        // An existing device or directory replaces the default; naming --disk beside them is a contradiction.
        let Cmd::Run(run) = parse(&["run", "--device", "/dev/vdb", "--format"]).command else { panic!() };
        let DiskSource::Device { path, format } = run.common.disk.source(work, 10).unwrap() else { panic!() };
        assert_eq!((path, format), (PathBuf::from("/dev/vdb"), true));
        let Cmd::Run(run) = parse(&["run", "--dir", "/mnt/x"]).command else { panic!() };
        assert!(matches!(run.common.disk.source(work, 10).unwrap(), DiskSource::Dir(d) if d == Path::new("/mnt/x")));
        for flags in [["--disk", "loop", "--device", "/dev/vdb"], ["--disk", "throttled", "--dir", "/mnt/x"]] {
            let err = Cli::try_parse_from(["ddiskqos-bench", "run"].into_iter().chain(flags)).unwrap_err();
            assert_eq!(err.kind(), clap::error::ErrorKind::ArgumentConflict, "{flags:?}: {err}");
        }
        let err = Cli::try_parse_from(["ddiskqos-bench", "run", "--disk", "ram"]).unwrap_err().to_string();
        assert!(err.contains("ram") && err.contains("throttled"), "{err}");

        let Cmd::HoldDisk { disk, size_mib } = parse(&["hold-disk", "--disk", "throttled", "--size-mib", "64"]).command
        else {
            panic!()
        };
        assert_eq!((disk.disk, size_mib), (DiskKind::Throttled, 64));
    }

    #[test]
    fn static_best_is_a_flag_of_run() {
        let Cmd::Run(run) = parse(&["run", "--static-best", "--modes", "protect"]).command else { panic!() };
        assert!(run.static_best);
        assert_eq!(run.common.modes, vec![BfqMode::Protect]);
        let err = Cli::try_parse_from(["ddiskqos-bench", "run", "--static-best=yes"]).unwrap_err();
        assert!(err.to_string().contains("--static-best"), "{err}");
        // A flag of `run` (the main jobs), not of `soak` or `sweep`.
        assert!(Cli::try_parse_from(["ddiskqos-bench", "soak", "--minutes", "1", "--static-best"]).is_err());
        assert!(Cli::try_parse_from(["ddiskqos-bench", "sweep", "--static-best"]).is_err());
    }

    #[test]
    fn internal_subcommands_parse() {
        let Cmd::ExecIn { argv, .. } = parse(&["exec-in", "--cgroup", "/x", "--", "fio", "--name=a"]).command else {
            panic!()
        };
        assert_eq!(argv, vec!["fio", "--name=a"]);
    }

    impl Cmd {
        fn is_run_full(&self) -> bool {
            matches!(self, Cmd::Run(r) if r.full && r.plan().unwrap() == Plan::full())
        }
    }
}
