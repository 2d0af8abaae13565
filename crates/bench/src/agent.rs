//! The shipped agent, run by the bench: assembled by `qos_agent::agent::AgentBuilder` as `ddiskqos-agent`
//! assembles it, and run on its own thread with a current-thread tokio runtime (as the binary runs it).
//!
//! - Docker runtime: `AgentBuilder::assemble` with `runtime = "docker"` (`DockerDiscovery` by events,
//!   `DockerCounters` behind the parent gate, the agent's writer with the way the configuration and the host call
//!   for: systemd unit properties on a systemd host with cgroup v2, where the containers' scopes get their weights
//!   through systemd, Docker's API for actuator `docker`, else the files). The
//!   daemon finds the bench's containers itself, as it would any container.
//! - CRI runtime: the same with `runtime = "cri"` (`CriDiscovery` over the CRI socket, `FileCounters` and
//!   `FileWriter` on the pod cgroups). The daemon finds the bench's pods itself, as it would on a Kubernetes node.
//! - cgroup runtime: `AgentBuilder::assemble_on_files` with a [`ChannelDiscovery`] (the bench announces
//!   `Started`/`Stopped` of its reader cgroups, which sit directly under the blkio root where no discovery of the
//!   agent's could tell them from the host's other cgroups): `FileCounters::with_root` and the agent's
//!   `FileWriter`.
//!
//! The device settings at start (`[devices] protect`, the operator's `bfq_tunables`) are the agent's own, made by
//! the builder and put back when the agent stops.
//!
//! The daemon runs for a whole BFQ mode, sampling and deciding all the time, so its timers (the starvation boost
//! of the background every `boost_after`) follow the wall clock as in a long deployment. Alone and Original blocks
//! use its own dry run ([`Agent::set_dry_run`]: `Command::Reload` with `dry_run = true`, whereupon it restores
//! every original weight and writes nothing); dDiskQoS blocks `dry_run = false`, whereupon its next round writes
//! every container's weight. The bench writes no weight for the agent; it only reads weight files
//! ([`Agent::wait_for_weight`], [`read_weight`]) to record what the kernel holds. (The static-best variant's weights
//! are set by hand at each container's creation, as an operator would: [`crate::static_best`].)

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use qos_agent::agent::{AgentBuilder, Stopped};
use qos_agent::backend::{ContainerInfo, Discovery, DiscoveryError, DiscoveryEvent};
use qos_agent::blockdev::{DevNum, DeviceTable};
use qos_agent::cgroup::{CgroupDir, CgroupRoot, CgroupVersion, WeightFile, WeightFileKind};
use qos_agent::config::RuntimeKind;
use qos_agent::daemon::Command;
use qos_agent::files::WeightPlan;
use qos_agent::ops::metrics::{Metrics, ReasonLabels};
use qos_agent::state::OriginalWeights;
use qos_agent::AgentConfig;
use qos_core::{ContainerId, Reason, Weight};
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, oneshot};

/// Every reason the engine gives for a decision, for reading the daemon's `decisions` metric.
const REASONS: [Reason; 9] = [
    Reason::New,
    Reason::Demoted,
    Reason::Boosted,
    Reason::PeriodicBoost,
    Reason::IdlePromoted,
    Reason::Pinned,
    Reason::Managed,
    Reason::Released,
    Reason::Reconfigured,
];

/// How long a reader's weight may take to arrive before the run fails.
pub const WEIGHT_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a switch out of the daemon's dry run may take (it writes every container's weight: with the Docker
/// runtime on cgroup v2 that is one `docker update` each, since Docker delivers there, and under BFQ's default
/// mode each took ~0.45 s while the background loaded the disk holding dockerd's data: ~20 s for a mode's 40
/// readers). Each switch's time is recorded (`modes[].agent.switches`).
pub const SWITCH_TIMEOUT: Duration = Duration::from_secs(120);

/// Which backends the daemon runs on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Backends {
    /// The agent binary's Docker backends.
    Docker,
    /// The agent binary's CRI backends (`runtime = "cri"`) on the runtime listening on `socket`.
    Cri {
        /// The CRI socket (`[cri] socket`).
        socket: PathBuf,
    },
    /// The bench's channel discovery with the cgroup-dir runtime's counters and writer.
    CgroupDir,
}

impl Backends {
    /// For the report.
    pub fn describe(&self) -> &'static str {
        match self {
            Backends::Docker => {
                "qos_agent::agent::AgentBuilder::assemble, runtime docker: DockerDiscovery (events), \
                 DockerCounters::with_root, AgentWriter from agent::with_writer (units through systemd on a systemd \
                 v2 host)"
            }
            Backends::Cri { .. } => {
                "qos_agent::agent::AgentBuilder::assemble, runtime cri: CriDiscovery (CRI re-list + inotify on \
                 kubepods), FileCounters::with_root and FileWriter on the pod cgroups, in agent::with_writer's AgentWriter"
            }
            Backends::CgroupDir => {
                "qos_agent::agent::AgentBuilder::assemble_on_files with the bench's ChannelDiscovery \
                 (Started/Stopped announced by the bench): FileCounters::with_root, FileWriter"
            }
        }
    }
}

/// Which weight file the bench reads a cgroup's weight from, and how.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightProbe {
    /// cgroup v1: the cgroup's weight file (`blkio.bfq.weight`), as the agent opens it.
    V1,
    /// cgroup v2: the file that acts on the test device, as the agent's own [`WeightPlan`] says from the device's
    /// facts (scheduler, io.cost) when the mode starts; read as its effective value on `dev` (the device's
    /// `MAJ:MIN N` override, else `default N`).
    V2 {
        /// The file: the first the plan writes (the one acting on the device; `io.weight` if both or neither act).
        kind: WeightFileKind,
        /// The test device.
        dev: DevNum,
    },
}

impl WeightProbe {
    /// The file that governs `dev` now on `root`'s hierarchy (call it once the mode's scheduler and io.cost are
    /// set).
    pub fn for_device(root: &CgroupRoot, dev: DevNum) -> Self {
        match root.version() {
            CgroupVersion::V1 => WeightProbe::V1,
            CgroupVersion::V2 => {
                let governor = DeviceTable::new(root.path()).refresh(dev, Instant::now()).0.governor;
                let kind = WeightPlan::new([(dev, governor)]).files()[0];
                WeightProbe::V2 { kind, dev }
            }
        }
    }

    /// For the report: which file and value.
    pub fn describe(&self) -> String {
        match self {
            WeightProbe::V1 => "the cgroup's v1 weight file (blkio.bfq.weight)".into(),
            WeightProbe::V2 { kind, dev } => format!("{}, effective value on {dev}", kind.file_name()),
        }
    }

    /// The value `weight` has in the probed file.
    pub fn file_value(&self, weight: Weight) -> u32 {
        match self {
            WeightProbe::V1 => weight.to_bfq(),
            WeightProbe::V2 { kind, .. } => kind.file_value(weight),
        }
    }

    /// Writes `weight` into the probed file of `dir` (v2: its `default` line), as an operator sets a cgroup's weight
    /// by hand; returns the file's path. Only the static-best variant writes a weight this way
    /// ([`crate::static_best`]); the agent's weights are the agent's.
    pub fn write(&self, dir: &CgroupDir, weight: Weight) -> Result<std::path::PathBuf> {
        let file = match *self {
            WeightProbe::V1 => WeightFile::open(dir)?,
            WeightProbe::V2 { kind, .. } => WeightFile::open_kind(dir, kind)?
                .with_context(|| format!("{} has no {}", dir.path().display(), kind.file_name()))?,
        };
        match *self {
            WeightProbe::V1 => file.write(weight)?,
            WeightProbe::V2 { kind, .. } => file.write_default_value(kind.file_value(weight))?,
        }
        Ok(file.path().to_path_buf())
    }

    /// Reads the weight that acts on the test device, on the file's own scale, and the file's path.
    pub fn read(&self, dir: &CgroupDir) -> Result<(u32, std::path::PathBuf)> {
        match *self {
            WeightProbe::V1 => {
                let file = WeightFile::open(dir)?;
                Ok((file.kind().file_value(file.read()?), file.path().to_path_buf()))
            }
            WeightProbe::V2 { kind, dev } => {
                let file = WeightFile::open_kind(dir, kind)?
                    .with_context(|| format!("{} has no {}", dir.path().display(), kind.file_name()))?;
                Ok((file.read_lines()?.effective(dev), file.path().to_path_buf()))
            }
        }
    }
}

/// A weight file's content as the bench read it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct WeightRead {
    /// The weight the file held (on cgroup v2: the effective value on the test device of the file that governs
    /// it, on that file's scale).
    pub weight: u32,
    /// How long the bench waited for it, from the reader's cgroup existing (0 when read once, not awaited). For a
    /// reader that reads at once (Docker), the agent's reaction time.
    pub waited_ms: f64,
    /// Bytes the reader's cgroup had been charged when the weight was read (Docker: how much of the read came
    /// before the top weight was in force); `None` where not read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes_before: Option<u64>,
    /// Awaited: whether the top weight arrived before the reader finished (`None`: read once, not awaited).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reached: Option<bool>,
    /// The static-best variant: who put the weight into the file (`None` elsewhere, and in reports from before it
    /// was recorded). `waited_ms` is then from the cgroup's appearance to the file reading the weight.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub set_by: Option<SetBy>,
}

/// Who put a static-best weight into the file that governs the test device (`crate::static_best`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SetBy {
    /// The runtime's own way of setting it at creation: Docker's `--blkio-weight`; for the cgroup-dir and CRI
    /// runtimes, whose way that is, the weight file written when the cgroup (pod) was made.
    Runtime,
    /// The bench: the runtime's own way left another value in the file (Docker on a cgroup-v1 BFQ host discards
    /// `--blkio-weight`), so the bench wrote the file as soon as it saw that.
    Bench,
}

impl SetBy {
    /// For the report.
    pub fn describe(self) -> &'static str {
        match self {
            SetBy::Runtime => "set by the runtime",
            SetBy::Bench => "written by the bench",
        }
    }
}

/// One switch of the daemon's dry run (a `Command::Reload`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct DryRunSwitch {
    /// Milliseconds since the daemon started.
    pub t_ms: f64,
    /// The new setting.
    pub dry_run: bool,
    /// Until the daemon had handled it: restored every original (to dry run), or ran the round that writes every
    /// weight (from dry run).
    pub took_ms: f64,
}

/// The daemon's own metrics at the end of a mode (`qos_agent::ops::metrics::Metrics`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AgentMetrics {
    /// Sampling rounds (`round_duration_seconds` count).
    pub rounds: u64,
    /// Wall time of all rounds, seconds (`round_duration_seconds` sum).
    pub round_seconds: f64,
    /// CPU time of all rounds, seconds (`round_cpu_seconds`).
    pub round_cpu_seconds: f64,
    /// Time between round starts at the end, ms (`round_interval_seconds`: the pacer's period).
    pub round_interval_ms: f64,
    /// Weight writes that failed or did not verify (`write_failures`).
    pub write_failures: u64,
    /// Counter reads that failed (`sample_failures`).
    pub sample_failures: u64,
    /// Times the runtime became unreachable (`runtime_outages`).
    pub runtime_outages: u64,
    /// Decisions by reason (`decisions`), reasons that never occurred left out.
    pub decisions: BTreeMap<String, u64>,
}

impl AgentMetrics {
    /// Reads the daemon's metrics (the round histogram's count and sum from its text exposition: prometheus-client
    /// offers no other reader of them).
    pub fn of(m: &Arc<Metrics>) -> Self {
        let decisions = REASONS
            .iter()
            .filter_map(|r| {
                let n = m.decisions.get(&ReasonLabels { reason: r.as_str().into() })?.get();
                Some((r.as_str().to_string(), n))
            })
            .collect();
        let text = m.render();
        let value =
            |name: &str| text.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse::<f64>().ok());
        Self {
            rounds: value("ddiskqos_round_duration_seconds_count").unwrap_or_default() as u64,
            round_seconds: value("ddiskqos_round_duration_seconds_sum").unwrap_or_default(),
            round_cpu_seconds: m.round_cpu_seconds.get(),
            round_interval_ms: m.round_interval_seconds.get() * 1e3,
            write_failures: m.write_failures.get(),
            sample_failures: m.sample_failures.get(),
            runtime_outages: m.runtime_outages.get(),
            decisions,
        }
    }

    /// Mean wall time of a round, µs.
    pub fn mean_round_us(&self) -> f64 {
        if self.rounds == 0 {
            0.0
        } else {
            self.round_seconds * 1e6 / self.rounds as f64
        }
    }
}

/// What the daemon did during one BFQ mode.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgentReport {
    /// The backends it ran on.
    pub backends: String,
    /// Its `sample_interval`, ms.
    pub sample_interval_ms: f64,
    /// Every switch of its dry run.
    pub switches: Vec<DryRunSwitch>,
    /// `Summary::restored`: originals restored at shutdown (none when the mode ended in a dry-run block: the
    /// switch to dry run restored them already).
    pub restored: usize,
    /// `Summary::restore_failures`.
    pub restore_failures: usize,
    /// Its metrics.
    pub metrics: AgentMetrics,
}

/// Discovery by announcement: the bench sends `Started` when it created a reader's cgroup (before the reader's
/// first I/O) and `Stopped` when the reader exited.
#[derive(Debug)]
pub struct ChannelDiscovery {
    events: mpsc::UnboundedReceiver<DiscoveryEvent>,
}

impl Discovery for ChannelDiscovery {
    async fn start(&mut self) -> Result<Vec<ContainerInfo>, DiscoveryError> {
        Ok(Vec::new())
    }

    async fn next_event(&mut self) -> Result<DiscoveryEvent, DiscoveryError> {
        match self.events.recv().await {
            Some(ev) => Ok(ev),
            // The bench stopped announcing: no more changes; the daemon stops on `Shutdown`.
            None => std::future::pending().await,
        }
    }
}

/// The running daemon.
#[derive(Debug)]
pub struct Agent {
    cfg: AgentConfig,
    backends: Backends,
    commands: mpsc::Sender<Command>,
    /// `Some` for [`Backends::CgroupDir`]: where the bench announces its cgroups.
    announce: Option<mpsc::UnboundedSender<DiscoveryEvent>>,
    metrics: Arc<Metrics>,
    thread: Option<JoinHandle<Result<Stopped>>>,
    started: Instant,
    dry_run: Mutex<bool>,
    switches: Mutex<Vec<DryRunSwitch>>,
    probe: WeightProbe,
}

impl Agent {
    /// Starts the daemon in dry run with `cfg` (whose `dry_run` is overridden) on `backends`, and waits until it
    /// has discovered what runs and serves commands.
    /// `probe` says which file the bench reads weights from.
    pub fn start(mut cfg: AgentConfig, backends: Backends, root: Arc<CgroupRoot>, probe: WeightProbe) -> Result<Self> {
        cfg.dry_run = true;
        match &backends {
            Backends::Docker => cfg.runtime = RuntimeKind::Docker,
            Backends::Cri { socket } => {
                cfg.runtime = RuntimeKind::Cri;
                cfg.cri.socket = socket.clone();
            }
            // Its own discovery on the files layer (`AgentBuilder::assemble_on_files`): no runtime to reach.
            Backends::CgroupDir => {}
        }
        cfg.validate().context("agent configuration")?;
        let originals = OriginalWeights::load(Some(&cfg.state_file)).context("agent state file")?;
        let metrics = Arc::new(Metrics::new());
        let (commands, rx) = mpsc::channel(16);
        let (announce, discovery) = match backends {
            Backends::Docker | Backends::Cri { .. } => (None, None),
            Backends::CgroupDir => {
                let (tx, events) = mpsc::unbounded_channel();
                (Some(tx), Some(ChannelDiscovery { events }))
            }
        };
        let (c, m) = (cfg.clone(), metrics.clone());
        let thread = std::thread::Builder::new()
            .name("ddiskqos-agent".into())
            .spawn(move || -> Result<Stopped> {
                // As the binary does first on its daemon's thread (its watcher threads inherit it).
                qos_agent::priority::apply_logged(c.nice);
                let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
                rt.block_on(async move {
                    // The binary's assembly ([`AgentBuilder`]): the runtime, the device settings at start (the
                    // daemon's dry run is the bench's Alone and Original blocks, so they are written and hold for
                    // all three variants of the mode; put back when the agent stops), the writer, the daemon.
                    let builder = AgentBuilder::new(c, root).metrics(m).originals(originals).write_devices(true);
                    let agent = match discovery {
                        None => builder.assemble().await.context("assembling the agent")?,
                        Some(d) => builder.assemble_on_files(d).context("assembling the agent")?,
                    };
                    Ok(agent.run(rx).await?)
                })
            })
            .context("cannot start the agent's thread")?;
        let mut agent = Self {
            cfg,
            backends,
            commands,
            announce,
            metrics,
            thread: Some(thread),
            started: Instant::now(),
            dry_run: Mutex::new(true),
            switches: Mutex::new(Vec::new()),
            probe,
        };
        if let Err(e) = agent.round_trip() {
            return Err(agent.failure(e));
        }
        Ok(agent)
    }

    /// Every device setting the agent made at its start, read back from the device now (its `status` rows).
    pub fn device_settings(&self) -> Vec<qos_agent::blockdev::tune::SettingRow> {
        self.metrics.device_settings.rows().0
    }

    /// The top level's weight (new containers').
    pub fn top(&self) -> Weight {
        self.cfg.mlfq.levels[0].weight
    }

    /// Whether the daemon has demoted any container yet (its `decisions` metric).
    pub fn demoted_any(&self) -> bool {
        let demoted = ReasonLabels { reason: Reason::Demoted.as_str().into() };
        self.metrics.decisions.get(&demoted).is_some_and(|c| c.get() > 0)
    }

    /// Sends a command; a daemon that is gone is an error.
    fn send(&self, cmd: Command) -> Result<()> {
        self.commands.blocking_send(cmd).map_err(|_| anyhow!("the agent's daemon has stopped"))
    }

    /// Asks for the status and waits for it: every command sent before has been handled. (Only the reply's
    /// arrival matters; its fields are the agent's business.)
    fn round_trip(&self) -> Result<()> {
        let (tx, rx) = oneshot::channel();
        self.send(Command::Status(tx))?;
        rx.blocking_recv().map(|_| ()).map_err(|_| anyhow!("the agent's daemon stopped without answering"))
    }

    /// The daemon thread's error, once it has ended (for a failure while talking to it).
    fn failure(&mut self, e: anyhow::Error) -> anyhow::Error {
        match self.thread.take().map(JoinHandle::join) {
            Some(Ok(Err(daemon))) => daemon.context(e),
            Some(Err(_)) => e.context("the agent's thread panicked"),
            _ => e,
        }
    }

    /// Switches the daemon's dry run and waits until it took effect: going dry, every original weight has been
    /// restored; leaving it, the round that writes every container's weight has run.
    pub fn set_dry_run(&self, dry_run: bool) -> Result<()> {
        let mut current = self.dry_run.lock().unwrap_or_else(|p| p.into_inner());
        if *current == dry_run {
            return Ok(());
        }
        let t0 = Instant::now();
        let cfg = AgentConfig { dry_run, ..self.cfg.clone() };
        self.send(Command::Reload(Box::new(cfg)))?;
        self.round_trip()?;
        if !dry_run {
            // The reload asked for a round at once; the first round that ends after it wrote the weights. Every round
            // adds its (non-zero) CPU time to `round_cpu_seconds`.
            let cpu = self.metrics.round_cpu_seconds.get();
            while self.metrics.round_cpu_seconds.get() == cpu {
                if t0.elapsed() > SWITCH_TIMEOUT {
                    bail!("the agent ran no sampling round within {SWITCH_TIMEOUT:?} after leaving dry run");
                }
                std::thread::sleep(Duration::from_micros(200));
            }
        }
        *current = dry_run;
        let t_ms = t0.duration_since(self.started).as_secs_f64() * 1e3;
        let took_ms = t0.elapsed().as_secs_f64() * 1e3;
        self.switches.lock().unwrap_or_else(|p| p.into_inner()).push(DryRunSwitch { t_ms, dry_run, took_ms });
        Ok(())
    }

    /// Tells a [`Backends::CgroupDir`] daemon that a container started (no-op for Docker, whose daemon sees its
    /// events itself).
    pub fn announce_started(&self, info: &ContainerInfo) -> Result<()> {
        match &self.announce {
            Some(tx) => tx.send(DiscoveryEvent::Started(info.clone())).map_err(|_| anyhow!("the agent has stopped")),
            None => Ok(()),
        }
    }

    /// Tells a [`Backends::CgroupDir`] daemon that a container stopped (no-op for Docker).
    pub fn announce_stopped(&self, id: &ContainerId) {
        if let Some(tx) = &self.announce {
            let _ = tx.send(DiscoveryEvent::Stopped(id.clone()));
        }
    }

    /// Waits until the weight file of `dir` that governs the test device reads `want` (the daemon wrote it), at
    /// most [`WEIGHT_TIMEOUT`]. A reader that finished first (its cgroup removed) is not an error: the weight
    /// returned is the last one read, not `want`.
    pub fn wait_for_weight(&self, dir: &CgroupDir, want: Weight, since: Instant) -> Result<WeightRead> {
        let value = self.probe.file_value(want);
        let mut last = None;
        loop {
            // A regular file standing in for a cgroup file (the fixtures) is truncated, then written: a read between
            // the two finds it empty. Such a read is retried until the deadline; a real cgroup file never reads torn,
            // so there an error persists and is reported when the time is up.
            let have = self.probe.read(dir);
            let waited = since.elapsed();
            if let Ok((have, _)) = &have {
                if *have == value {
                    let bytes_before = bytes_read(dir);
                    return Ok(WeightRead {
                        weight: *have,
                        waited_ms: waited.as_secs_f64() * 1e3,
                        bytes_before,
                        reached: Some(true),
                        set_by: None,
                    });
                }
                last = Some(*have);
            }
            if !dir.path().exists() {
                let waited_ms = waited.as_secs_f64() * 1e3;
                return Ok(WeightRead {
                    weight: last.unwrap_or(0),
                    waited_ms,
                    bytes_before: None,
                    reached: Some(false),
                    set_by: None,
                });
            }
            let timeout = crate::sys::patience(WEIGHT_TIMEOUT);
            if waited > timeout {
                let (have, path) = have?;
                bail!(
                    "{} still reads {have} ({}) {timeout:?} after the container started: the agent did not \
                     give it the top weight {want} ({value} in this file)",
                    path.display(),
                    self.probe.describe()
                );
            }
            std::thread::sleep(Duration::from_micros(100));
        }
    }

    /// Reads the weight file of `dir` that governs the test device once.
    pub fn read_weight(&self, dir: &CgroupDir) -> Result<WeightRead> {
        read_weight(&self.probe, dir)
    }

    /// Stops the daemon (`Command::Shutdown`: it restores what it changed) and returns what it did.
    pub fn stop(mut self) -> Result<AgentReport> {
        let sent = self.send(Command::Shutdown);
        let Stopped { summary, device_restore_failures } = match self.thread.take().map(JoinHandle::join) {
            Some(Ok(r)) => r.context("the agent's daemon failed")?,
            Some(Err(_)) => bail!("the agent's thread panicked"),
            None => bail!("the agent's daemon was already gone"),
        };
        sent?;
        if device_restore_failures > 0 {
            bail!("the agent could not restore {device_restore_failures} device setting(s) it made at start");
        }
        Ok(AgentReport {
            backends: self.backends.describe().into(),
            sample_interval_ms: self.cfg.sample_interval.as_secs_f64() * 1e3,
            switches: std::mem::take(&mut *self.switches.lock().unwrap_or_else(|p| p.into_inner())),
            restored: summary.restored,
            restore_failures: summary.restore_failures,
            metrics: AgentMetrics::of(&self.metrics),
        })
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        // A run that failed half-way: stop the daemon so it restores the weights it wrote.
        if let Some(thread) = self.thread.take() {
            let _ = self.commands.blocking_send(Command::Shutdown);
            let _ = thread.join();
        }
    }
}

/// Reads the weight of `dir` from the file `probe` names, once.
pub fn read_weight(probe: &WeightProbe, dir: &CgroupDir) -> Result<WeightRead> {
    Ok(WeightRead { weight: probe.read(dir)?.0, waited_ms: 0.0, bytes_before: None, reached: None, set_by: None })
}

/// The agent's configuration for the bench: the defaults, the bench's engine and sampling interval, the state file
/// and control socket in the bench's work directory, and `[devices] check` = the test disk (as an operator names
/// the devices that matter: on cgroup v2 the agent then writes and verifies the weight file that governs it even
/// before a new container's first I/O shows the device in its `io.stat`).
pub fn config(mlfq: qos_core::Config, sample_interval: Duration, dir: &Path, test_disk: Option<&str>) -> AgentConfig {
    let mut cfg = AgentConfig {
        mlfq,
        sample_interval,
        state_file: dir.join("agent-state.json"),
        control_socket: dir.join("agent.sock"),
        ..AgentConfig::default()
    };
    cfg.devices.check = test_disk.map(|d| vec![d.to_string()]).unwrap_or_default();
    // The dockerd the bench's containers run on: `$DOCKER_HOST` when it names a socket (the v2 test bed's
    // throw-away dockerd), as for the docker CLI the bench uses; else the agent's default socket.
    if let Some(socket) = docker_host_socket() {
        cfg.docker.socket = socket;
    }
    cfg
}

/// The socket of `$DOCKER_HOST=unix://PATH`, if set.
pub fn docker_host_socket() -> Option<std::path::PathBuf> {
    let host = std::env::var("DOCKER_HOST").ok()?;
    host.strip_prefix("unix://").map(std::path::PathBuf::from)
}

/// A container's description as discovery gives it to the daemon.
pub fn container_info(id: &str, dir: CgroupDir) -> ContainerInfo {
    ContainerInfo { id: ContainerId::new(id), name: id.to_string(), labels: BTreeMap::new(), cgroup: Some(dir) }
}

/// The bytes the container of `dir` has read so far (its cgroup's counters); `None` where they cannot be read (the
/// cgroup gone). What a reader had read when its weight was found in force, for the agent's and the static weights.
pub fn bytes_read(dir: &CgroupDir) -> Option<u64> {
    qos_agent::cgroup::CounterReader::open(dir).and_then(|mut c| c.read()).ok().map(|c| c.read)
}

#[cfg(test)]
mod tests {
    use super::*;
    use qos_agent::cgroup::{CgroupVersion, V1_BFQ_BYTES, V1_BFQ_WEIGHT};

    /// A fixture v1 tree: the daemon's own counters and writer drive it through the channel discovery.
    fn fixture() -> (tempfile::TempDir, Arc<CgroupRoot>) {
        let dir = tempfile::tempdir().unwrap();
        let root = Arc::new(CgroupRoot::from_dir(CgroupVersion::V1, dir.path()).unwrap());
        (dir, root)
    }

    fn cgroup(root: &CgroupRoot, name: &str, bytes: u64) -> CgroupDir {
        let p = root.path().join(name);
        std::fs::create_dir_all(&p).unwrap();
        std::fs::write(p.join(V1_BFQ_WEIGHT), "100\n").unwrap();
        set_bytes(root, name, bytes);
        root.resolve_relative(name).unwrap()
    }

    fn set_bytes(root: &CgroupRoot, name: &str, bytes: u64) {
        let text = format!("7:0 Read {bytes}\n7:0 Write 0\nTotal {bytes}\n");
        std::fs::write(root.path().join(name).join(V1_BFQ_BYTES), text).unwrap();
    }

    fn weight(dir: &CgroupDir) -> u32 {
        read_weight(&WeightProbe::V1, dir).unwrap().weight
    }

    fn wait_until(mut f: impl FnMut() -> bool) {
        let start = Instant::now();
        while !f() {
            assert!(start.elapsed() < Duration::from_secs(5), "condition not reached");
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    #[test]
    fn dry_run_switches_write_and_restore_through_the_daemon() {
        let (tmp, root) = fixture();
        let work = tempfile::tempdir().unwrap();
        let cfg = config(qos_core::Config::default(), Duration::from_millis(10), work.path(), None);
        let agent = Agent::start(cfg, Backends::CgroupDir, root.clone(), WeightProbe::V1).unwrap();
        let bg = cgroup(&root, "bg", 0);
        agent.announce_started(&container_info("bg", bg.clone())).unwrap();
        set_bytes(&root, "bg", 1 << 30);
        // Dry run: the engine decides (the background sinks) but nothing is written.
        wait_until(|| agent.demoted_any());
        assert_eq!(weight(&bg), 100);
        agent.set_dry_run(false).unwrap();
        assert_eq!(weight(&bg), 10, "leaving dry run writes the engine's weight before set_dry_run returns");
        let fg = cgroup(&root, "fg", 0);
        let since = Instant::now();
        agent.announce_started(&container_info("fg", fg.clone())).unwrap();
        let read = agent.wait_for_weight(&fg, agent.top(), since).unwrap();
        assert_eq!(read.weight, 1000);
        agent.set_dry_run(true).unwrap();
        assert_eq!((weight(&bg), weight(&fg)), (100, 100), "dry run restores the originals");
        agent.set_dry_run(false).unwrap();
        assert_eq!((weight(&bg), weight(&fg)), (10, 1000));
        let report = agent.stop().unwrap();
        assert_eq!((weight(&bg), weight(&fg)), (100, 100), "shutdown restores");
        assert_eq!((report.restored, report.restore_failures), (2, 0), "{report:?}");
        assert_eq!(report.metrics.write_failures, 0);
        assert!(report.metrics.rounds > 0 && report.metrics.decisions["new"] >= 2, "{report:?}");
        assert_eq!(report.switches.iter().map(|s| s.dry_run).collect::<Vec<_>>(), [false, true, false]);
        drop(tmp);
    }

    #[test]
    fn a_weight_that_never_arrives_fails() {
        let (_tmp, root) = fixture();
        let work = tempfile::tempdir().unwrap();
        let cfg = config(qos_core::Config::default(), Duration::from_millis(10), work.path(), None);
        let agent = Agent::start(cfg, Backends::CgroupDir, root.clone(), WeightProbe::V1).unwrap();
        let fg = cgroup(&root, "fg", 0);
        // Not announced, and in dry run anyway: the file keeps 100.
        let since = Instant::now() - WEIGHT_TIMEOUT;
        let err = agent.wait_for_weight(&fg, agent.top(), since).unwrap_err().to_string();
        assert!(err.contains("still reads 100"), "{err}");
        agent.stop().unwrap();
    }
}
