//! The `run` command end to end: work directory, disk, files, runtime, every BFQ mode, report. Also the set-up
//! shared with `sweep`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};

use qos_agent::cgroup::{CgroupRoot, CgroupVersion, V1_BFQ_BYTES};

use crate::agent::Backends;
use crate::cleanup::Cleanup;
use crate::cli::{Common, DiskArgs, RunArgs, SoakArgs};
use crate::disk::{self, Disk};
use crate::files::{self, FileSpec};
use crate::report::data::{Meta, ModeReport, RunReport};
use crate::runner::{self, Env, RunConfig};
use crate::runtime::cgroup::CgroupRuntime;
use crate::runtime::cri::CriRuntime;
use crate::runtime::docker::{self, DockerRuntime};
use crate::runtime::{BackgroundKind, Runtime, RuntimeChoice};
use crate::workload::{self, BfqMode, Plan};
use crate::{report, sys};

/// Everything set up for measuring.
#[derive(Debug)]
pub struct Setup {
    /// The disk.
    pub disk: Disk,
    /// The runtime.
    pub runtime: Box<dyn Runtime>,
    /// Why this runtime.
    pub runtime_reason: String,
    /// The agent's backends for the runtime.
    pub backends: Backends,
    /// The cgroup hierarchy, as the agent detects it.
    pub root: Arc<CgroupRoot>,
    /// Where the agent keeps its state file and control socket (under /run).
    pub run_dir: PathBuf,
    /// Test files by name.
    pub files: BTreeMap<String, PathBuf>,
    /// The undo stack.
    pub cleanup: &'static Cleanup,
    /// The CPU priority of the bench's session, where the agent runs ([`crate::session`]), for the notes.
    pub session: String,
}

impl Setup {
    /// The environment a mode runs in.
    pub fn env(&self) -> Env<'_> {
        Env {
            disk: &self.disk,
            runtime: &*self.runtime,
            backends: self.backends.clone(),
            root: self.root.clone(),
            run_dir: self.run_dir.clone(),
            files: self.files.clone(),
            cleanup: self.cleanup,
        }
    }
}

/// Fails unless the process can do what the bench needs, in every mode of `modes`.
pub fn preflight(modes: &[BfqMode]) -> Result<()> {
    if !sys::is_root() {
        bail!("ddiskqos-bench needs root (loop devices, mounts, cgroups, scheduler settings)");
    }
    let root = detect_root()?;
    for &mode in modes {
        disk::ensure_iocost_possible(mode, &root)?;
    }
    Ok(())
}

/// The block-I/O cgroup hierarchy, detected as the agent detects it: v1 blkio, or v2 with the io controller
/// enabled for the root's children (the bench's cgroups and Docker's are created there).
fn detect_root() -> Result<CgroupRoot> {
    let root = CgroupRoot::detect().context("detecting the cgroup hierarchy (qos_agent::cgroup::CgroupRoot)")?;
    if root.version() == CgroupVersion::V2 {
        let file = root.path().join("cgroup.subtree_control");
        let enabled = sys::read_trim(&file)?;
        if !enabled.split_whitespace().any(|c| c == "io") {
            bail!(
                "cgroup v2 at {}: the io controller is not enabled for children ({} reads {enabled:?}); \
                 `echo +io > {}`, or run the bench inside scripts/cgroup-v2.sh",
                root.path().display(),
                file.display(),
                file.display()
            );
        }
    }
    Ok(root)
}

/// Creates the work directory, the disk, the files and the runtime.
pub fn set_up(common: &Common, plan: &Plan, cleanup: &'static Cleanup) -> Result<Setup> {
    let work = make_work_dir(&common.disk, cleanup)?;
    // The agent's state file and control socket: under /run, as the shipped agent keeps them, where /run is a tmpfs
    // (systemd hosts); else /dev/shm. On a disk, the save of the originals before a new container's first weight
    // waits for the file system's journal behind the background's load (measured: 20 ms median, 80 ms p99 in BFQ's
    // default mode with /run on the root disk of this machine kind, 1 ms on tmpfs).
    let run_dir = tmpfs_run_base().join(format!("ddiskqos-bench-{}", std::process::id()));
    std::fs::create_dir_all(&run_dir).with_context(|| format!("cannot create {}", run_dir.display()))?;
    let r = run_dir.clone();
    cleanup.push(format!("remove {}", run_dir.display()), move || {
        std::fs::remove_dir_all(&r).with_context(|| format!("cannot remove {}", r.display()))
    });
    let mut specs: Vec<FileSpec> =
        plan.files().into_iter().map(|(name, size_mib)| FileSpec { name, size_mib }).collect();
    specs.push(FileSpec { name: workload::BACKGROUND_FILE.into(), size_mib: common.bg_size_mib });
    let total_mib: u64 = specs.iter().map(|s| s.size_mib).sum();
    let source = common.disk.source(&work, total_mib)?;
    let (disk, paths) = disk::prepare(&source, &work, cleanup, |files_dir| {
        let bar = ProgressBar::new(total_mib).with_style(
            ProgressStyle::with_template("creating files {bar:40} {pos}/{len} MiB {elapsed}").expect("valid template"),
        );
        let started = std::time::Instant::now();
        let paths = files::create_all(files_dir, &specs, common.seed, |n| bar.set_position(n))?;
        bar.finish_and_clear();
        eprintln!("files: {total_mib} MiB written in {:.1} s", started.elapsed().as_secs_f64());
        Ok(paths)
    })?;
    for assignment in &common.bfq_set {
        disk.set_tunable(assignment, cleanup)?;
    }
    let d = &disk.info;
    eprintln!("disk: {}, scheduler bfq, files in {}", d.describe(), d.files_dir.display());
    let files = specs.iter().zip(paths).map(|(s, p)| (s.name.clone(), p)).collect();
    let root = Arc::new(detect_root()?);
    if root.version() == CgroupVersion::V1 && !root.path().join(V1_BFQ_BYTES).exists() {
        bail!("{} has no {V1_BFQ_BYTES}: BFQ is not active on any device", root.path().display());
    }
    let exe = std::env::current_exe().context("cannot find this executable")?;
    let files_dir = disk.info.files_dir.clone();
    let docker = |reason: &str| -> Result<(Box<dyn Runtime>, String, Backends)> {
        let rt =
            DockerRuntime::new(&exe, common.cgroup_layout, common.pin()?, &files_dir, &work, root.clone(), cleanup)?;
        Ok((Box::new(rt), format!("runtime docker ({reason})"), Backends::Docker))
    };
    let cgroup = |reason: &str| -> Result<(Box<dyn Runtime>, String, Backends)> {
        let rt = CgroupRuntime::new(exe.clone(), common.cgroup_layout, root.clone(), cleanup, &work)?;
        Ok((Box::new(rt), format!("runtime cgroup ({reason})"), Backends::CgroupDir))
    };
    let (runtime, runtime_reason, backends) = match common.runtime {
        RuntimeChoice::Cri => {
            let socket = common.cri_socket.clone();
            let rt = CriRuntime::new(&socket, &exe, &files_dir, &work, root.clone(), cleanup)?;
            let reason = format!("runtime cri (asked for: {})", rt.describe());
            (Box::new(rt) as Box<dyn Runtime>, reason, Backends::Cri { socket })
        }
        RuntimeChoice::CgroupDir => cgroup("asked for")?,
        RuntimeChoice::Docker => docker("asked for")?,
        RuntimeChoice::Auto if docker::daemon_answers() => docker("a daemon answers")?,
        RuntimeChoice::Auto => cgroup("no Docker daemon answers")?,
    };
    let session = crate::session::give_the_agents_nice(common.agent_nice, cleanup)?;
    Ok(Setup { disk, runtime, runtime_reason, backends, root, run_dir, files, cleanup, session })
}

/// Creates the bench's work directory `ddiskqos-bench-PID` under `--work-dir` (default: the temp dir), its removal
/// on `cleanup`.
fn make_work_dir(disk: &DiskArgs, cleanup: &Cleanup) -> Result<PathBuf> {
    let base = disk.work_dir.clone().unwrap_or_else(std::env::temp_dir);
    let work = base.join(format!("ddiskqos-bench-{}", std::process::id()));
    std::fs::create_dir_all(&work).with_context(|| format!("cannot create {}", work.display()))?;
    let w = work.clone();
    cleanup.push(format!("remove {}", work.display()), move || {
        std::fs::remove_dir_all(&w).with_context(|| format!("cannot remove {}", w.display()))
    });
    Ok(work)
}

/// What we print for `hold-disk`: the prepared disk and the daemon serving it.
#[derive(Debug, serde::Serialize)]
struct HeldDisk<'a> {
    disk: &'a disk::DiskInfo,
    daemon_pid: Option<u32>,
}

/// `hold-disk`: prepares the disk, prints it as one line of JSON, keeps it until standard input closes (or a signal
/// comes), then the caller's guard cleans up.
pub fn hold_disk(args: &DiskArgs, size_mib: u64, cleanup: &'static Cleanup) -> Result<()> {
    if !sys::is_root() {
        bail!("ddiskqos-bench needs root (loop devices, mounts, scheduler settings)");
    }
    let work = make_work_dir(args, cleanup)?;
    let (disk, ()) = disk::prepare(&args.source(&work, size_mib)?, &work, cleanup, |_| Ok(()))?;
    eprintln!("disk: {}, scheduler bfq, files in {}", disk.info.describe(), disk.info.files_dir.display());
    println!("{}", serde_json::to_string(&HeldDisk { disk: &disk.info, daemon_pid: disk.daemon_pid })?);
    use std::io::{Read, Write};
    std::io::stdout().flush()?;
    let mut sink = Vec::new();
    std::io::stdin().read_to_end(&mut sink).context("reading standard input")?;
    Ok(())
}

/// The run configuration from the flags.
pub fn run_config(common: &Common, plan: Plan, exp1: bool, exp2: bool) -> Result<RunConfig> {
    Ok(RunConfig {
        plan,
        engine: common.engine_config()?,
        sample_interval: common.sample_interval,
        entry_sample_interval: common.entry_sample_interval,
        gap: common.gap,
        settle: common.settle,
        warmup: Duration::from_millis(500),
        background: common.background,
        exp1,
        exp2,
        agent_bfq: common.agent_bfq_tunables.clone(),
        agent_nice: common.agent_nice,
        agent_actuator: common.agent_actuator,
        soak: None,
        static_best: false,
    })
}

/// A progress bar over `total` reads.
pub fn progress(total: u64) -> ProgressBar {
    ProgressBar::new(total).with_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} reads {elapsed_precise} eta {eta} {msg}")
            .expect("valid template"),
    )
}

/// `run`.
pub fn run(args: &RunArgs, cleanup: &'static Cleanup) -> Result<RunReport> {
    preflight(&args.common.modes)?;
    let plan = args.plan()?;
    let common = &args.common;
    let mut cfg = run_config(common, plan.clone(), !args.no_exp1, !args.no_exp2)?;
    cfg.static_best = args.static_best;
    let variants = cfg.variants().len() as u64;
    let date = sys::utc_now();
    let setup = set_up(common, &plan, cleanup)?;
    let env = setup.env();
    let counted = Plan {
        exp1: if cfg.exp1 { plan.exp1.clone() } else { Vec::new() },
        exp2_reps: if cfg.exp2 { plan.exp2_reps } else { 0 },
        ..plan.clone()
    };
    let per_variant = counted.reads_per_variant();
    let estimate = estimate(&counted, &common.modes, variants);
    eprintln!(
        "plan: {} reads in {} mode(s) ({}); estimated {:.0} min on this project's 2-core VM (measured there: ~0.5 s per \
         read in strict modes, ~1 s in BFQ's default mode, container start and pauses included)",
        per_variant * variants * common.modes.len() as u64,
        common.modes.len(),
        if args.full { "full: the paper's sizes and 50 repetitions" } else { "quick" },
        estimate.as_secs_f64() / 60.0
    );
    let hogs = crate::hogs::CpuHogs::start(common.cpu_hogs).context("--cpu-hogs: starting the busy processes")?;
    let started = std::time::Instant::now();
    let bar = progress(per_variant * variants * common.modes.len() as u64);
    let mut modes: Vec<ModeReport> = Vec::new();
    let mut background = String::new();
    for &mode in &common.modes {
        let report = runner::run_mode(&env, &cfg, mode, &bar)?;
        modes.push(report);
        background = background_label(common.background);
    }
    bar.finish_and_clear();
    drop(hogs);
    let mut meta = meta(common, &setup, &cfg, plan, !args.full, date, background)?;
    // The caller's remarks on the test bed (`--note`) first.
    meta.notes.splice(0..0, args.notes.iter().cloned());
    meta.duration_s = started.elapsed().as_secs_f64();
    let run = RunReport { meta, modes };
    finish(&run, &common.out)?;
    Ok(run)
}

/// `soak`: the first mode of `--modes` for `--minutes`, Experiment 1's sizes 1, 10, 64 and 100 MiB in rotating
/// rounds, then Experiment 2's schedule, Alone / Original / dDiskQoS interleaved as in `run`; the report counts the
/// STARVED reads like `run`'s.
pub fn soak(args: &SoakArgs, cleanup: &'static Cleanup) -> Result<RunReport> {
    let mode = *args.common.modes.first().context("--modes is empty")?;
    preflight(&[mode])?;
    let plan = workload::Plan::soak();
    let common = &args.common;
    let minutes = Duration::from_secs_f64(args.minutes * 60.0);
    let mut cfg = run_config(common, plan.clone(), true, true)?;
    cfg.soak = Some(minutes);
    let date = sys::utc_now();
    let setup = set_up(common, &plan, cleanup)?;
    let env = setup.env();
    eprintln!("soak: {} for {:.1} min (mode {}), then the report", plan.describe_soak(), args.minutes, mode.name());
    let hogs = crate::hogs::CpuHogs::start(common.cpu_hogs).context("--cpu-hogs: starting the busy processes")?;
    let started = std::time::Instant::now();
    let bar = ProgressBar::new_spinner();
    let report = runner::run_mode(&env, &cfg, mode, &bar)?;
    bar.finish_and_clear();
    drop(hogs);
    let mut meta = meta(common, &setup, &cfg, plan, true, date, background_label(common.background))?;
    meta.notes.push(format!(
        "SOAK: {:.1} minutes of measuring in mode {} (Experiment 1 for the first {:.0} %, then Experiment 2)",
        args.minutes,
        mode.name(),
        100.0 * runner::SOAK_EXP1_SHARE
    ));
    meta.duration_s = started.elapsed().as_secs_f64();
    let run = RunReport { meta, modes: vec![report] };
    finish(&run, &common.out)?;
    let mode = &run.modes[0];
    let rows = || mode.exp1.iter().chain(&mode.exp2);
    let reads: usize =
        rows().filter_map(|r| r.variant(crate::workload::Variant::DDiskQos)).map(|c| c.samples.len()).sum();
    let starved: usize = rows().map(|r| r.starved().len()).sum();
    println!("soak: {reads} dDiskQoS reads in {:.1} min, {starved} STARVED", run.meta.duration_s / 60.0);
    Ok(run)
}

fn background_label(kind: BackgroundKind) -> String {
    match kind.resolve() {
        BackgroundKind::Fio => "fio seq read 1 MiB libaio QD32 O_DIRECT".into(),
        _ => format!("internal streamer, {} threads x 1 MiB O_DIRECT", crate::runtime::INTERNAL_THREADS),
    }
}

/// The run's metadata.
pub fn meta(
    common: &Common,
    setup: &Setup,
    cfg: &RunConfig,
    plan: Plan,
    quick: bool,
    date: String,
    background: String,
) -> Result<Meta> {
    let mut notes = vec![
        "sizes in MiB (the paper's MB); read time = the reader's own, first read to last, O_DIRECT 1 MiB reads".into(),
        "Experiment 2: the paper gives no start time for the 64 MB reader; it starts at 2 s with the first two".into(),
    ];
    if plan.exp2.iter().zip(workload::exp2_schedule()).any(|(a, b)| a.start != b.start) {
        notes.push("Experiment 2 start times are scaled (--exp2-time-scale)".into());
    }
    if cfg.static_best {
        let w = crate::static_best::StaticWeights::of(&cfg.engine)?;
        notes.push(format!(
            "STATIC BEST (--static-best): a fourth variant, interleaved per repetition: a second background created at \
             the engine's bottom weight {} and every reader at its top weight {}, set once at creation through the \
             runtime (Docker: --blkio-weight; cgroup-dir: the new cgroup's weight file; CRI: the pod cgroup's weight \
             file), the agent in its dry run and not told of them; every weight read back from the file governing the \
             device",
            w.background, w.reader
        ));
    }
    if let Some((reader, bg)) = common.pin()? {
        notes.push(format!(
            "STATIC WEIGHTS (--pin-weights {reader},{bg}): in the dDiskQoS blocks the agent pins every reader at \
             {reader} and the background at {bg} by their ddiskqos.weight labels; its MLFQ moves nothing"
        ));
    }
    notes.push(format!("agent's CPU priority: nice {}; {}", cfg.agent_nice, setup.session));
    if common.agent_actuator != qos_agent::config::ActuatorMode::Auto {
        notes.push(format!("AGENT ACTUATOR {:?} (--agent-actuator), not the shipped auto", common.agent_actuator));
    }
    if common.cpu_hogs > 0 {
        notes.push(format!(
            "BUSY CPUS (--cpu-hogs {}): that many processes, each in a session of its own, spun at nice 0 through \
             every mode, beside the readers, the background and the agent",
            common.cpu_hogs
        ));
    }
    Ok(Meta {
        tool: format!("ddiskqos-bench {}", env!("CARGO_PKG_VERSION")),
        date_utc: date,
        kernel: sys::kernel_release(),
        cpus: std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        runtime: setup.runtime.name().into(),
        runtime_reason: setup.runtime_reason.clone(),
        cgroup_layout: match setup.runtime.cgroup_layout() {
            // The kubelet's layout, whatever --cgroup-layout says.
            Some(layout) => layout.into(),
            None => common.cgroup_layout.describe(setup.runtime.name()),
        },
        cgroup: format!("{} {}", setup.root.version(), setup.root.path().display()),
        agent: format!("qos_agent::daemon::Daemon on {}, at nice {}", setup.backends.describe(), cfg.agent_nice),
        background: if background.is_empty() { background_label(common.background) } else { background },
        disk: setup.disk.info.clone(),
        engine: cfg.engine.clone(),
        sample_interval_ms: cfg.sample_interval.as_secs_f64() * 1e3,
        entry_sample_interval_ms: cfg.entry_sample_interval.map(|d| d.as_secs_f64() * 1e3),
        plan,
        quick,
        gap_ms: cfg.gap.as_secs_f64() * 1e3,
        settle_ms: cfg.settle.as_secs_f64() * 1e3,
        seed: common.seed,
        notes,
        duration_s: 0.0,
    })
}

/// Writes the outputs and prints the tables.
pub fn finish(run: &RunReport, out: &Path) -> Result<()> {
    print!("{}", report::table::render(run));
    let written = report::write_all(run, out)?;
    println!("\nwrote {} and {}", written.json.display(), written.text.display());
    if let Some((svg, png)) = written.charts {
        println!("chart: {} and {}", svg.display(), png.display());
    }
    Ok(())
}

/// `/run` where it is a tmpfs, else `/dev/shm`.
fn tmpfs_run_base() -> PathBuf {
    let is_tmpfs =
        |p: &str| nix::sys::statfs::statfs(p).is_ok_and(|s| s.filesystem_type() == nix::sys::statfs::TMPFS_MAGIC);
    if is_tmpfs("/run") || !is_tmpfs("/dev/shm") {
        PathBuf::from("/run")
    } else {
        PathBuf::from("/dev/shm")
    }
}

/// A rough duration of `plan` in `modes` with `variants` variants, from this project's VM: per read the container's
/// start, the pauses and the settle time (~0.5 s; ~1 s in BFQ's default mode, where the background slows container
/// starts), plus the read itself at ~500 MiB/s.
pub fn estimate(plan: &Plan, modes: &[BfqMode], variants: u64) -> std::time::Duration {
    let variants = variants as f64;
    let reads = plan.reads_per_variant() as f64 * variants;
    let mib: f64 = (plan.exp1.iter().map(|c| (c.size_mib * u64::from(c.reps)) as f64).sum::<f64>()
        + plan.exp2.iter().map(|r| r.size_mib as f64).sum::<f64>() * f64::from(plan.exp2_reps))
        * variants;
    let secs: f64 =
        modes.iter().map(|m| reads * if *m == BfqMode::Default { 1.0 } else { 0.5 } + mib / 500.0 + 20.0).sum();
    std::time::Duration::from_secs_f64(secs)
}

#[cfg(test)]
mod estimate_tests {
    use super::*;

    #[test]
    fn the_quick_main_job_fits_15_minutes_and_full_is_much_longer() {
        let modes = [BfqMode::Default, BfqMode::Strict, BfqMode::StrictTuned, BfqMode::StrictNoLowLatency];
        let quick = estimate(&Plan::quick(), &modes, 3);
        let full = estimate(&Plan::full(), &modes, 3);
        assert!(quick < std::time::Duration::from_secs(15 * 60), "{quick:?}");
        assert!(full > quick * 10, "{full:?} vs {quick:?}");
        assert!(estimate(&Plan::quick(), &modes[1..2], 3) < estimate(&Plan::quick(), &modes[..1], 3));
        // The static-best variant adds a fourth of the reads.
        assert!(estimate(&Plan::quick(), &modes, 4) > quick);
    }
}
