//! The one place that assembles the agent: from an [`AgentConfig`] and the cgroup root, the configured runtime
//! (each runtime assembles itself: `runtime::<name>::assemble`, with the devices it cares about), the device
//! set-up at start (`devices_at_start`), the one choice of the way weights are applied ([`with_writer`]: the
//! files, systemd unit properties where cgroups are units, or Docker's API) and the daemon over them. The binary
//! (`app::run`) and the bench both call [`AgentBuilder::assemble`]; an embedder whose containers are plain cgroups
//! it announces itself calls [`AgentBuilder::assemble_on_files`] with its own [`Discovery`].
//!
//! The assembled [`Agent`] runs until its daemon stops ([`Agent::run`]) and then puts back every device setting it
//! made at start.

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;

use tokio::sync::mpsc;
use tracing::{info, warn};

use crate::backend::{CounterSource, Discovery, DiscoveryError, RuntimeBackends, WeightWriter};
use crate::blockdev::protect::{self, Decision, Managed, Planned};
use crate::blockdev::tune::{self, TuneError, TunedDevices};
use crate::blockdev::{self, DeviceError};
use crate::cgroup::{CgroupRoot, CgroupVersion};
use crate::config::{ActuatorMode, AgentConfig, ProtectMode, RuntimeKind};
use crate::daemon::{Command, Daemon, DaemonError, Summary};
use crate::files::{FileDevices, FileWriter};
use crate::ops::metrics::Metrics;
use crate::ops::readiness::Readiness;
use crate::runtime::docker::DockerApiWriter;
use crate::runtime::{cgroup_dir, cri, docker};
use crate::state::OriginalWeights;
use crate::systemd::{self, UnitWriter};
use crate::writer::{AgentWriter, Way};

/// Why the agent could not be assembled; each names the config field or the device concerned.
#[derive(Debug, thiserror::Error)]
pub enum AssembleError {
    /// The runtime could not be reached, or its discovery could not start.
    #[error(transparent)]
    Runtime(#[from] DiscoveryError),
    /// `[cgroup] parent` names no cgroup.
    #[error("cgroup.parent = {parent:?}: no such cgroup under {root}: {source}")]
    CgroupParent {
        /// The configured parent.
        parent: String,
        /// The cgroup root.
        root: PathBuf,
        /// What listing it said.
        #[source]
        source: Box<DiscoveryError>,
    },
    /// A device of `[devices] switch_to_bfq` could not be switched.
    #[error("devices.switch_to_bfq: cannot switch {device} to bfq: {source}")]
    Switch {
        /// The device.
        device: String,
        /// Why.
        #[source]
        source: DeviceError,
    },
    /// A device setting at start (the operator's `bfq_tunables`, protection by default) failed.
    #[error(transparent)]
    Devices(#[from] TuneError),
    /// `actuator = "systemd"` where systemd cannot act.
    #[error(
        "actuator = \"systemd\" needs systemd as PID 1 (/run/systemd/system: {run_systemd}) and cgroup v2 (found \
         {version:?} at {})",
        root.display()
    )]
    NoSystemd {
        /// `present` or `missing`: whether systemd is PID 1.
        run_systemd: &'static str,
        /// The cgroup version found.
        version: CgroupVersion,
        /// The cgroup root.
        root: PathBuf,
    },
    /// The state file could not be read or locked.
    #[error(transparent)]
    State(#[from] crate::state::StateError),
    /// The daemon refused its configuration.
    #[error(transparent)]
    Daemon(#[from] DaemonError),
}

/// Builds an [`Agent`] from its configuration and the cgroup root.
#[derive(Debug)]
pub struct AgentBuilder {
    cfg: AgentConfig,
    root: Arc<CgroupRoot>,
    metrics: Arc<Metrics>,
    originals: Option<OriginalWeights>,
    write_devices: bool,
    notify_systemd: bool,
}

impl AgentBuilder {
    /// An agent for `cfg` (validated by the caller: `preflight::check` for the binary) under `root`: new metrics,
    /// the state file of `cfg` (none in a dry run, which writes nothing), device settings written unless
    /// `cfg.dry_run`.
    pub fn new(cfg: AgentConfig, root: Arc<CgroupRoot>) -> Self {
        let write_devices = !cfg.dry_run;
        Self { cfg, root, metrics: Arc::new(Metrics::new()), originals: None, write_devices, notify_systemd: false }
    }

    /// The metrics the agent exports (shared with whoever serves them).
    pub fn metrics(mut self, metrics: Arc<Metrics>) -> Self {
        self.metrics = metrics;
        self
    }

    /// The originals instead of those of `cfg`'s state file (an embedder whose daemon runs in dry run for its own
    /// reasons and keeps the file all the same: the bench).
    pub fn originals(mut self, originals: OriginalWeights) -> Self {
        self.originals = Some(originals);
        self
    }

    /// Whether the device settings at start are written: by default not in the agent's dry run (the plan is
    /// logged); an embedder whose daemon runs in dry run for its own reasons (the bench: its Alone and Original
    /// blocks) says true.
    pub fn write_devices(mut self, write: bool) -> Self {
        self.write_devices = write;
        self
    }

    /// Tells systemd (`sd_notify`) when the daemon is ready, stopping, reloading (the binary under systemd).
    pub fn notify_systemd(mut self, on: bool) -> Self {
        self.notify_systemd = on;
        self
    }

    /// Connects to the configured runtime (first: an agent that cannot reach it changes nothing), makes the
    /// device settings at start on the devices the runtime cares about, and assembles the daemon over the
    /// runtime's backends with the writer the configuration and the host call for.
    pub async fn assemble(mut self) -> Result<Agent, AssembleError> {
        let originals = self.take_originals()?;
        match self.cfg.runtime {
            RuntimeKind::Docker => {
                let runtime = docker::assemble(&self.cfg).await?;
                let tuned = self.devices_at_start(runtime.managed(&self.cfg))?;
                let api = runtime.api_writer(&self.cfg);
                let backends = runtime.backends(&self.cfg, self.root.clone(), &self.metrics).await?;
                info!(actuator = ?self.cfg.actuator, dry_run = self.cfg.dry_run, "managing Docker containers");
                let backends = with_writer(&self.cfg, &self.root, backends, api)?;
                self.finish(backends, originals, tuned, None)
            }
            RuntimeKind::CgroupDir => {
                let tuned = self.devices_at_start(protect::managed(&self.cfg.devices, std::iter::empty()))?;
                let backends = cgroup_dir::backends(&self.cfg, self.root.clone(), &self.metrics).map_err(|source| {
                    AssembleError::CgroupParent {
                        parent: self.cfg.cgroup.parent.clone(),
                        root: self.root.path().to_owned(),
                        source: Box::new(source),
                    }
                })?;
                info!(parent = %self.cfg.cgroup.parent, dry_run = self.cfg.dry_run, "managing child cgroups");
                let mut backends = backends;
                restore_leftover_caps(&mut backends.writer, &self.cfg, &self.root);
                self.finish(backends, originals, tuned, None)
            }
            RuntimeKind::Cri => {
                let runtime = cri::assemble(&self.cfg, &self.root, &self.metrics).await?;
                // The devices that matter, as the runtime found them when the config names none: the daemon's
                // configuration says so too (what `status` shows and a reload compares with).
                self.cfg.devices.check = runtime.checked_devices();
                let tuned = self.devices_at_start(runtime.managed())?;
                let (client, readiness) = runtime.into_parts();
                let backends = cri::backends(&self.cfg, client, self.root.clone(), &self.metrics);
                info!(dry_run = self.cfg.dry_run, "managing Kubernetes pods (one weight per pod cgroup)");
                let backends = with_writer(&self.cfg, &self.root, backends, None)?;
                self.finish(backends, originals, tuned, Some(Arc::new(readiness)))
            }
        }
    }

    /// The agent over `discovery` (an embedder's own: containers that are plain cgroup directories it announces)
    /// with the files layer's counters and writer, after the device settings at start on `[devices] check`.
    pub fn assemble_on_files<D: Discovery + 'static>(mut self, discovery: D) -> Result<Agent, AssembleError> {
        let originals = self.take_originals()?;
        let tuned = self.devices_at_start(protect::managed(&self.cfg.devices, std::iter::empty()))?;
        let mut backends = crate::files::backends_on_files(discovery, &self.cfg, &self.root, &self.metrics);
        restore_leftover_caps(&mut backends.writer, &self.cfg, &self.root);
        self.finish(backends, originals, tuned, None)
    }

    /// The state file (the weights a previous agent recorded: its containers start at the top and get their own
    /// weights back at stop), unless given.
    fn take_originals(&mut self) -> Result<OriginalWeights, AssembleError> {
        if let Some(given) = self.originals.take() {
            return Ok(given);
        }
        let originals = OriginalWeights::load((!self.cfg.dry_run).then_some(self.cfg.state_file.as_path()))?;
        if !originals.is_empty() {
            info!(
                containers = originals.len(),
                "state file from a previous agent found; its containers start at the top"
            );
        }
        Ok(originals)
    }

    fn devices_at_start(&self, managed: Vec<Managed>) -> Result<TunedDevices, AssembleError> {
        devices_at_start(&self.cfg, &self.root, managed, &self.metrics, self.write_devices)
    }

    fn finish<D, C, W>(
        self,
        backends: RuntimeBackends<D, C, W, FileDevices>,
        originals: OriginalWeights,
        tuned: TunedDevices,
        readiness: Option<Arc<Readiness>>,
    ) -> Result<Agent, AssembleError>
    where
        D: Discovery + 'static,
        C: CounterSource + 'static,
        W: WeightWriter + 'static,
    {
        let daemon = backends.into_daemon(self.cfg, originals, self.metrics.clone())?;
        let daemon = daemon.with_systemd_notify(self.notify_systemd);
        Ok(Agent { daemon: Box::new(daemon), tuned, readiness, metrics: self.metrics })
    }
}

/// The assembled agent: its daemon, the device settings it made at start, and (for pods) the readiness that
/// `/readyz` answers from.
pub struct Agent {
    daemon: Box<dyn RunDaemon>,
    tuned: TunedDevices,
    readiness: Option<Arc<Readiness>>,
    metrics: Arc<Metrics>,
}

impl std::fmt::Debug for Agent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Agent").field("readiness", &self.readiness.is_some()).finish_non_exhaustive()
    }
}

/// How an agent's run ended.
#[derive(Debug, Clone)]
pub struct Stopped {
    /// The daemon's restores at its stop.
    pub summary: Summary,
    /// Device settings made at start that could not be put back (logged, each naming the device and setting).
    pub device_restore_failures: usize,
}

impl Agent {
    /// The agent's metrics.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// What `/readyz` answers from (the CRI runtime's devices and its answer), if anything.
    pub fn readiness(&self) -> Option<Arc<Readiness>> {
        self.readiness.clone()
    }

    /// Runs the daemon on `commands` until it stops (`Command::Shutdown`, or the channel closing), then puts back
    /// every device setting made at start, even when the daemon failed.
    pub async fn run(self, commands: mpsc::Receiver<Command>) -> Result<Stopped, DaemonError> {
        let Agent { daemon, mut tuned, .. } = self;
        let result = daemon.run(commands).await;
        let device_restore_failures = tuned.restore();
        result.map(|summary| Stopped { summary, device_restore_failures })
    }
}

/// A daemon of any backends, run once (what [`Agent`] holds).
trait RunDaemon {
    fn run(self: Box<Self>, commands: mpsc::Receiver<Command>) -> DaemonRun;
}

type DaemonRun = Pin<Box<dyn Future<Output = Result<Summary, DaemonError>>>>;

impl<D, C, W> RunDaemon for Daemon<D, C, W>
where
    D: Discovery + 'static,
    C: CounterSource + 'static,
    W: WeightWriter + 'static,
{
    fn run(self: Box<Self>, commands: mpsc::Receiver<Command>) -> DaemonRun {
        Box::pin((*self).run(commands))
    }
}

/// Switches the opted-in devices, sets their opted-in BFQ tunables and protects the managed devices
/// (`[devices] protect`, [`blockdev::protect`]), then, on cgroup v1, checks the managed devices and warns about
/// each one where weights cannot act. The returned [`TunedDevices`] puts every setting back when restored or
/// dropped: keep it until the agent stops. What was set is handed to `metrics` (read back in status and metrics).
///
/// On cgroup v2 the devices are checked by the weight writer's device table instead
/// ([`crate::files::FileWriter::check_configured`], called by [`crate::files::agent_writer`]): it is the one place
/// that warns about a device no weight acts on, once per device, whether the device comes from the config or from a
/// container's `io.stat`.
///
/// `write`: false for the agent's dry run (the plan is logged, nothing is written).
fn devices_at_start(
    cfg: &AgentConfig,
    root: &CgroupRoot,
    managed: Vec<Managed>,
    metrics: &Metrics,
    write: bool,
) -> Result<TunedDevices, AssembleError> {
    for name in &cfg.devices.switch_to_bfq {
        blockdev::switch_to_bfq(name, &cfg.devices.switch_to_bfq)
            .map_err(|source| AssembleError::Switch { device: name.clone(), source })?;
        info!(device = %name, "scheduler is bfq, as configured");
    }
    let v2_root = (root.version() == CgroupVersion::V2).then(|| root.path().to_path_buf());
    if managed.is_empty() && cfg.devices.protect == ProtectMode::Auto {
        // Not a warning: a cgroup-dir agent without `check` is a plain configuration; nothing is wrong.
        info!(
            "protect: no managed device (name them in [devices] check): no device is changed, and weights act \
               only where the scheduler is bfq or io.cost is on"
        );
    }
    let protected = blockdev::protected_disks().map_err(|e| e.to_string());
    let plan = protect::plan_in(std::path::Path::new("/sys"), &protected, v2_root.as_deref(), &cfg.devices, &managed);
    let plan: Vec<Planned> = plan.into_iter().map(|p| with_lone_read(p, write)).collect();
    let mut settings = Vec::new();
    let mut left = Vec::new();
    for p in &plan {
        match &p.decision {
            Decision::Leave(why) if why.contains("root filesystem") => {
                warn!(device = %p.device, managed_as = %p.why, "protect: {}", p.describe());
                left.push((p.device.clone(), why.clone()));
            }
            Decision::Leave(why) => {
                info!(device = %p.device, managed_as = %p.why, "protect: {}", p.describe());
                left.push((p.device.clone(), why.clone()));
            }
            Decision::Bfq { .. } => {
                info!(device = %p.device, managed_as = %p.why, "protect: {}", p.describe());
                settings.extend(p.bfq_settings());
            }
            Decision::IoCost { dev } if !write => {
                info!(device = %p.device, dev = %dev, "dry run: protect would measure the device and enable io.cost");
            }
            Decision::IoCost { dev } => {
                info!(device = %p.device, dev = %dev, "protect: measuring the device for io.cost (reads only, ~4 s)");
                match protect::measure_for_io_cost(&p.device) {
                    Ok(m) => {
                        let s = protect::io_cost_settings(&p.device, *dev, &m);
                        info!(device = %p.device, model = %s[0].value, qos = %s[1].value,
                              "protect: io.cost model measured; enabling io.cost (restored at stop)");
                        settings.extend(s);
                    }
                    Err(e) => {
                        warn!(device = %p.device, error = %e, "protect: cannot measure the device for io.cost; \
                              left as it is (no weight acts on it)");
                        left.push((p.device.clone(), format!("io.cost measurement failed: {e}")));
                    }
                }
            }
        }
    }
    let originals = tune::originals_path(&cfg.state_file);
    // Devices protection manages now: an earlier agent's originals on them are put back at stop too.
    let adopt: Vec<String> = plan
        .iter()
        .filter(|p| match &p.decision {
            Decision::Bfq { .. } | Decision::IoCost { .. } => true,
            Decision::Leave(why) => why.starts_with("io.cost is enabled already"),
        })
        .map(|p| p.device.clone())
        .collect();
    let tuned = TunedDevices::apply_all(
        v2_root.as_deref(),
        &cfg.devices.bfq_tunables,
        &settings,
        &adopt,
        write.then_some(originals.as_path()),
    )?;
    metrics.device_settings.set_view(tuned.view(left));
    if root.version() == CgroupVersion::V2 {
        return Ok(tuned);
    }
    for m in managed {
        let name = m.name;
        match blockdev::scheduler(&name) {
            Ok(s) if s.active == "bfq" => info!(device = %name, "scheduler is bfq: weights act on this device"),
            Ok(s) => warn!(device = %name, scheduler = %s.active,
                "BLOCK-I/O WEIGHTS HAVE NO EFFECT ON THIS DEVICE: it does not use the bfq scheduler. \
                 Fix: `echo bfq > /sys/block/{name}/queue/scheduler`, or add \"{name}\" to [devices] switch_to_bfq"),
            Err(e) => warn!(device = %name, error = %e, "cannot read the device's scheduler"),
        }
    }
    Ok(tuned)
}

/// A BFQ plan for a device that reports it rotates, with the device's lone reads measured (reads only, a quarter
/// of a second; not in a dry run): the short slots where no moving heads answer
/// ([`protect::Planned::with_lone_read`]). A failed measurement keeps the plan as it was (BFQ's slots).
fn with_lone_read(p: Planned, write: bool) -> Planned {
    if !p.wants_lone_read() {
        return p;
    }
    if !write {
        info!(device = %p.device, "dry run: protect would measure the device's lone reads to choose its slots");
        return p;
    }
    match protect::measure_lone_read(&p.device) {
        Ok(median) => {
            let p = p.with_lone_read(median);
            info!(device = %p.device, lone_read_us = median.as_micros() as u64,
                  seek_free_under_us = protect::SEEK_FREE_US, "protect: measured a device that reports it rotates");
            p
        }
        Err(e) => {
            warn!(device = %p.device, error = %e, "protect: cannot measure the lone reads of a device that reports \
                  it rotates; BFQ's slots are kept on it");
            p
        }
    }
}

/// The backends' file writer in the agent's writer, with the way weights are applied chosen once: systemd unit
/// properties for `auto` and `systemd` on a cgroup-v2 host whose PID 1 is systemd (`systemd` elsewhere is an
/// error); Docker's API where the runtime offers it (`api`: `actuator = "docker"`); else the files alone.
pub fn with_writer<D, C>(
    cfg: &AgentConfig,
    root: &CgroupRoot,
    backends: RuntimeBackends<D, C, FileWriter, FileDevices>,
    api: Option<DockerApiWriter>,
) -> Result<RuntimeBackends<D, C, AgentWriter, FileDevices>, AssembleError> {
    let v2 = root.version() == CgroupVersion::V2;
    let host = systemd::is_systemd_host();
    let units = match cfg.actuator {
        ActuatorMode::Auto => host && v2,
        ActuatorMode::Systemd if host && v2 => true,
        ActuatorMode::Systemd => {
            return Err(AssembleError::NoSystemd {
                run_systemd: if host { "present" } else { "missing" },
                version: root.version(),
                root: root.path().to_owned(),
            })
        }
        ActuatorMode::Docker | ActuatorMode::Files => false,
    };
    let way = match api {
        _ if units => {
            info!("systemd host on cgroup v2: the weights of cgroups that are systemd units go through systemd");
            let mut units = UnitWriter::new(root.path().to_owned());
            if !cfg.dry_run {
                units = units.with_records_file(crate::files::restore_records::records_path(&cfg.state_file, "units"));
            }
            Way::SystemdUnits(units)
        }
        Some(api) => Way::DockerApi(api),
        None => Way::Files,
    };
    let RuntimeBackends { discovery, counters, mut writer, devices, starting } = backends;
    restore_leftover_caps(&mut writer, cfg, root);
    let writer = AgentWriter::new(writer, way).with_starting(starting.clone());
    Ok(RuntimeBackends { discovery, counters, writer, devices, starting })
}

/// Before any cap: puts back the throttle limits of caps an agent that did not stop cleanly left in force (its
/// records beside the state file), and says what it did; the daemon tries again those that fail
/// ([`crate::backend::WeightWriter::retry_leftovers`]).
///
/// In dry run too: those limits are the agent's own writes from a previous life, and putting them back is not
/// steering (an operator expects a dry-run agent never to leave a container throttled by the agent). A dry-run
/// agent keeps no state file, so it does so only while it holds the state file's lock for a moment (another agent
/// holding it is alive, and the caps recorded are its own), and once: what fails stays recorded for the next
/// agent that is not in dry run. (An agent that starts in that moment finds the lock held, naming the dry run's
/// pid, and fails to start: a systemd unit's restart takes it up again.)
///
/// Every way of assembling calls it on the files' writer before anything else writes: Docker's and the CRI's
/// (in [`with_writer`]), the cgroup-dir runtime's and an embedder's ([`AgentBuilder::assemble_on_files`]).
fn restore_leftover_caps(writer: &mut FileWriter, cfg: &AgentConfig, root: &CgroupRoot) {
    let done = if cfg.dry_run {
        let path = crate::files::restore_records::records_path(&cfg.state_file, "caps");
        if !path.exists() {
            return;
        }
        match crate::state::lock_for_a_moment(&cfg.state_file) {
            Ok(_lock) => writer.restore_leftover_caps_in(path, root),
            Err(e) => {
                info!(records = %path.display(), error = %e,
                      "dry run: the caps recorded beside the state file are not put back");
                return;
            }
        }
    } else {
        writer.restore_leftover_caps(root)
    };
    for leftover in done {
        leftover.log(false);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ProtectMode;

    /// A v1 fixture root with `parent/` (no child yet) and a config of the cgroup-dir runtime on it, in dry run,
    /// changing no device.
    fn fixture(parent: &str) -> (tempfile::TempDir, Arc<CgroupRoot>, AgentConfig) {
        let dir = tempfile::tempdir().unwrap();
        let cgroups = dir.path().join("cgroups");
        std::fs::create_dir_all(cgroups.join("parent")).unwrap();
        let root = Arc::new(CgroupRoot::from_dir(CgroupVersion::V1, &cgroups).unwrap());
        let mut cfg = AgentConfig {
            runtime: RuntimeKind::CgroupDir,
            dry_run: true,
            state_file: dir.path().join("state.json"),
            control_socket: dir.path().join("agent.sock"),
            ..AgentConfig::default()
        };
        cfg.cgroup.parent = parent.into();
        cfg.devices.protect = ProtectMode::Off;
        (dir, root, cfg)
    }

    #[tokio::test]
    async fn a_cgroup_dir_agent_is_assembled_runs_and_stops() {
        let (_dir, root, cfg) = fixture("parent");
        let agent = AgentBuilder::new(cfg, root).assemble().await.expect("assembled");
        assert!(agent.readiness().is_none(), "only the CRI runtime has a readiness");
        let (tx, rx) = mpsc::channel(4);
        tx.send(Command::Shutdown).await.unwrap();
        let stopped = agent.run(rx).await.expect("ran");
        assert_eq!(stopped.device_restore_failures, 0);
        assert_eq!(stopped.summary.restore_failures, 0);
    }

    #[tokio::test]
    async fn a_missing_cgroup_parent_is_named() {
        let (_dir, root, cfg) = fixture("nope");
        let err = AgentBuilder::new(cfg, root).assemble().await.expect_err("no such parent");
        assert!(matches!(&err, AssembleError::CgroupParent { parent, .. } if parent == "nope"), "{err:?}");
        assert!(err.to_string().starts_with("cgroup.parent = \"nope\": no such cgroup under "), "{err}");
    }

    #[test]
    fn the_systemd_actuator_without_cgroup_v2_is_an_error_naming_the_setting() {
        let (_dir, root, mut cfg) = fixture("parent");
        cfg.actuator = ActuatorMode::Systemd;
        let metrics = Metrics::new();
        let backends = cgroup_dir::backends(&cfg, root.clone(), &metrics).unwrap();
        let err = with_writer(&cfg, &root, backends, None).map(|_| ()).expect_err("v1 root");
        let text = err.to_string();
        assert!(text.starts_with("actuator = \"systemd\" needs systemd as PID 1"), "{text}");
        assert!(text.contains("cgroup v2 (found V1 at "), "{text}");
        cfg.actuator = ActuatorMode::Files;
        let backends = cgroup_dir::backends(&cfg, root.clone(), &metrics).unwrap();
        let backends = with_writer(&cfg, &root, backends, None).expect("files never asks systemd");
        assert!(matches!(backends.writer.way(), Way::Files));
    }
}
