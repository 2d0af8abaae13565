//! Wiring for the binary: picks the backends from the config and connects to the runtime, then (only then)
//! starts metrics and the status socket, turns signals into daemon commands (SIGTERM/SIGINT stop, SIGHUP reloads
//! the config file), and runs the daemon.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result};
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::mpsc;
use tracing::{debug, error, info, warn};

use crate::backend::{CounterSource, Discovery, WeightWriter};
use crate::blockdev::protect::{self, Decision, Managed};
use crate::blockdev::tune::{self, TunedDevices};
use crate::cgroup::{CgroupRoot, CgroupVersion};
use crate::config::{ActuatorMode, AgentConfig, ProtectMode, RuntimeKind};
use crate::daemon::{Command, Daemon, RuntimeBackends, Summary};
use crate::files::FileWriter;
use crate::metrics::Metrics;
use crate::priority::Autogroup;
use crate::readiness::{self, CheckedDevice, Readiness};
use crate::runtime::cri::CriClient;
use crate::runtime::{cgroup_dir, cri, docker};
use crate::state::OriginalWeights;
use crate::systemd::{self, SystemdActuator};
use crate::{blockdev, control, metrics};

/// Below this many descriptors the agent warns at start (the unit sets `LimitNOFILE=65536`).
const MIN_NOFILE: u64 = 4096;

/// Runs the agent until SIGTERM/SIGINT; `config_path` is re-read on SIGHUP.
pub async fn run(cfg: AgentConfig, config_path: Option<PathBuf>) -> Result<Summary> {
    // The same checks as `check-config`, so the two agree; nothing is written or served before they pass.
    let root = Arc::new(crate::preflight::check(&cfg).context("invalid configuration")?.root);
    // Signals are taken from here on, before anything is changed (device settings, weights) or served: a SIGTERM
    // that comes before the daemon runs waits in the channel, and the daemon's first act is to restore and stop.
    // (Installed once the control socket was bound, a SIGTERM right after the socket appeared killed the agent
    // with the default action, restoring nothing.)
    let (tx, rx) = mpsc::channel(16);
    spawn_signal_handlers(tx.clone(), config_path)?;
    let commands = (tx, rx);
    // One counter file per container stays open; connections are bounded (`listen`), but a host with many
    // containers needs more than the usual soft limit of 1,024.
    match crate::limits::raise_nofile_limit() {
        Ok(n) if n < MIN_NOFILE => warn!(
            limit = n,
            wanted = MIN_NOFILE,
            "few descriptors allowed (RLIMIT_NOFILE): on a host with many containers cgroup files may fail to \
             open; raise LimitNOFILE"
        ),
        Ok(n) => debug!(limit = n, "open descriptor limit"),
        Err(e) => warn!(error = %e, "cannot read or raise RLIMIT_NOFILE"),
    }
    // On this (the daemon's) thread before any watcher thread starts: they inherit it.
    apply_nice(cfg.nice);
    info!(version = ?root.version(), path = %root.path().display(), "cgroup root");
    let originals =
        OriginalWeights::load((!cfg.dry_run).then_some(cfg.state_file.as_path())).context("loading the state file")?;
    if !originals.is_empty() {
        info!(containers = originals.len(), "state file from a previous agent found; its containers start at the top");
    }
    let metrics = Arc::new(Metrics::new());
    let systemd = std::env::var_os("NOTIFY_SOCKET").is_some();

    // The runtime first: an agent that cannot reach it stops here, before it serves anything or writes anything.
    let summary = match cfg.runtime {
        RuntimeKind::Docker => {
            let docker = docker::connect(&cfg.docker.socket).await?;
            let data_disk = if cfg.devices.check.is_empty() { docker::data_disk(&docker).await } else { None };
            let devices = if cfg.devices.check.is_empty() {
                data_disk.iter().cloned().collect()
            } else {
                cfg.devices.check.clone()
            };
            let managed = managed_devices(&cfg, data_disk.iter().map(|d| (d.clone(), "Docker's data root".into())));
            let tuned = devices_at_start(&cfg, &root, managed, &metrics, !cfg.dry_run)?;
            let records = crate::files::records_file(&cfg);
            let backends = docker::backends(docker, root.clone(), cfg.actuator, devices, records, &metrics).await?;
            let backends = with_systemd(&cfg, &root, backends)?;
            info!(actuator = ?cfg.actuator, dry_run = cfg.dry_run, "managing Docker containers");
            run_daemon(&cfg, backends, originals, metrics, systemd, commands, tuned, None).await?
        }
        RuntimeKind::CgroupDir => {
            let managed = managed_devices(&cfg, std::iter::empty());
            let tuned = devices_at_start(&cfg, &root, managed, &metrics, !cfg.dry_run)?;
            let backends = cgroup_dir::backends(&cfg, root.clone(), &metrics).with_context(|| {
                format!("cgroup.parent = {:?}: no such cgroup under {}", cfg.cgroup.parent, root.path().display())
            })?;
            info!(parent = %cfg.cgroup.parent, dry_run = cfg.dry_run, "managing child cgroups");
            run_daemon(&cfg, backends, originals, metrics, systemd, commands, tuned, None).await?
        }
        RuntimeKind::Cri => {
            let mut client = CriClient::new(&cfg.cri.socket)?.with_metric(metrics.cri_requests.clone());
            let (name, version) = client.version().await.context("is the container runtime running?")?;
            info!(socket = %cfg.cri.socket.display(), runtime = %name, version = %version, "connected to the CRI runtime");
            // The devices that matter: as configured, else the disks holding the kubelet's and the runtime's state.
            let mut cfg = cfg;
            let from_config = !cfg.devices.check.is_empty();
            let checked = if cfg.devices.check.is_empty() {
                let found = readiness::state_dir_disks(&cfg.cri.state_dirs);
                cfg.devices.check = found.iter().map(|d| d.name.clone()).collect();
                found
            } else {
                let why = "[devices] check".to_string();
                cfg.devices.check.iter().map(|name| CheckedDevice { name: name.clone(), why: why.clone() }).collect()
            };
            let readiness = Readiness::new(metrics.runtime_up.clone(), checked, &root);
            for line in readiness.check().lines.iter().filter(|l| l.starts_with("device ")) {
                info!(check = %line, "device checked for readiness");
            }
            if readiness.devices().is_empty() {
                warn!(state_dirs = ?cfg.cri.state_dirs,
                      "no device to check: none of [cri] state_dirs is visible and [devices] check is empty; \
                       /readyz answers 503 until one is named");
            }
            let managed = if from_config {
                managed_devices(&cfg, std::iter::empty())
            } else {
                readiness.devices().iter().map(|d| Managed { name: d.name.clone(), why: d.why.clone() }).collect()
            };
            let tuned = devices_at_start(&cfg, &root, managed, &metrics, !cfg.dry_run)?;
            let backends = with_systemd(&cfg, &root, cri::backends(&cfg, client, root.clone(), &metrics))?;
            info!(dry_run = cfg.dry_run, "managing Kubernetes pods (one weight per pod cgroup)");
            let readiness = Some(Arc::new(readiness));
            run_daemon(&cfg, backends, originals, metrics, systemd, commands, tuned, readiness).await?
        }
    };
    info!(restored = summary.restored, failures = summary.restore_failures, "stopped");
    Ok(summary)
}

/// The daemon over `backends`, served (metrics with `/readyz` when `readiness` is given, status socket, signals)
/// until it stops; then the BFQ tunables set at start are put back.
#[allow(clippy::too_many_arguments)]
async fn run_daemon<D: Discovery, C: CounterSource, W: WeightWriter>(
    cfg: &AgentConfig,
    backends: RuntimeBackends<D, C, W>,
    originals: OriginalWeights,
    metrics: Arc<Metrics>,
    systemd: bool,
    commands: (mpsc::Sender<Command>, mpsc::Receiver<Command>),
    mut tuned: TunedDevices,
    readiness: Option<Arc<Readiness>>,
) -> Result<Summary> {
    let daemon = backends.into_daemon(cfg.clone(), originals, metrics.clone())?;
    let daemon = daemon.with_systemd_notify(systemd);
    let summary = serve_and_run_ready(cfg, daemon, metrics, commands, readiness).await?;
    tuned.restore();
    Ok(summary)
}

/// The managed devices: `[devices] check` when the operator names devices, else `runtime_disks` (the disk holding
/// the runtime's data, with why).
pub fn managed_devices(cfg: &AgentConfig, runtime_disks: impl Iterator<Item = (String, String)>) -> Vec<Managed> {
    if cfg.devices.check.is_empty() {
        runtime_disks.map(|(name, why)| Managed { name, why }).collect()
    } else {
        cfg.devices.check.iter().map(|name| Managed { name: name.clone(), why: "[devices] check".into() }).collect()
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
/// container's `io.stat`. (This was `blockdev::check`: it reads the config and the cgroup version, so it sits here,
/// above both `blockdev` and `cgroup`, which no longer import each other.)
///
/// `write`: false for the agent's dry run (the plan is logged, nothing is written); an embedder whose daemon runs
/// in dry run for its own reasons (the bench: its Alone and Original blocks) passes true.
pub fn devices_at_start(
    cfg: &AgentConfig,
    root: &CgroupRoot,
    managed: Vec<Managed>,
    metrics: &Metrics,
    write: bool,
) -> Result<TunedDevices> {
    for name in &cfg.devices.switch_to_bfq {
        blockdev::switch_to_bfq(name, &cfg.devices.switch_to_bfq)
            .with_context(|| format!("devices.switch_to_bfq: cannot switch {name} to bfq"))?;
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

/// The backends' writer inside the systemd actuator, which sends the weights of cgroups that are systemd units
/// through systemd: on for `auto` and `systemd` on a cgroup-v2 host whose PID 1 is systemd (`systemd` elsewhere is
/// an error), off otherwise (then it is the writer itself).
pub fn with_systemd<D, C, W: WeightWriter>(
    cfg: &AgentConfig,
    root: &CgroupRoot,
    backends: RuntimeBackends<D, C, W>,
) -> Result<RuntimeBackends<D, C, SystemdActuator<W>>> {
    let v2 = root.version() == CgroupVersion::V2;
    let host = systemd::is_systemd_host();
    let enabled = match cfg.actuator {
        ActuatorMode::Auto => host && v2,
        ActuatorMode::Systemd if host && v2 => true,
        ActuatorMode::Systemd => anyhow::bail!(
            "actuator = \"systemd\" needs systemd as PID 1 (/run/systemd/system: {}) and cgroup v2 (found {:?} at {})",
            if host { "present" } else { "missing" },
            root.version(),
            root.path().display()
        ),
        ActuatorMode::Docker | ActuatorMode::Files => false,
    };
    if enabled {
        info!("systemd host on cgroup v2: the weights of cgroups that are systemd units go through systemd");
    }
    // Reads back through the runtime writer's own devices: one table, each device reported once, and the devices
    // of a container weighted through systemd shown in status like any other.
    let files = FileWriter::with_shared_devices(backends.devices.clone());
    let RuntimeBackends { discovery, counters, writer, devices, starting } = backends;
    let mut writer =
        SystemdActuator::new(writer, enabled, files, root.path().to_owned()).with_starting(starting.clone());
    if enabled && !cfg.dry_run {
        writer = writer.with_records_file(crate::restore_records::records_path(&cfg.state_file, "units"));
    }
    Ok(RuntimeBackends { discovery, counters, writer, devices, starting })
}

/// Serves metrics (and `GET /readyz` from `readiness` when there is one) and the status socket, and runs the daemon
/// on the commands of `rx` (the signal handlers' and the status socket's); the control socket is removed however
/// the daemon ends.
async fn serve_and_run_ready<D: Discovery, C: CounterSource, W: WeightWriter>(
    cfg: &AgentConfig,
    daemon: Daemon<D, C, W>,
    metrics: Arc<Metrics>,
    (tx, rx): (mpsc::Sender<Command>, mpsc::Receiver<Command>),
    readiness: Option<Arc<Readiness>>,
) -> Result<Summary> {
    if cfg.metrics.enabled {
        let listener = metrics::bind(cfg.metrics.listen)
            .await
            .with_context(|| format!("metrics.listen = {}: cannot bind", cfg.metrics.listen))?;
        if !cfg.metrics.listen.ip().is_loopback() {
            warn!(listen = %cfg.metrics.listen, "metrics served on a non-loopback address, as configured");
        }
        info!(listen = %cfg.metrics.listen, "serving Prometheus metrics");
        tokio::spawn(metrics::serve_with_readiness(listener, metrics, readiness));
    }
    let listener = control::bind(&cfg.control_socket)
        .with_context(|| format!("control_socket = {}: cannot bind", cfg.control_socket.display()))?;
    let _socket = RemoveOnDrop(cfg.control_socket.clone());
    tokio::spawn(control::serve(listener, tx));
    Ok(daemon.run(rx).await?)
}

/// Removes a file (the control socket) when dropped.
struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn spawn_signal_handlers(tx: mpsc::Sender<Command>, config_path: Option<PathBuf>) -> Result<()> {
    let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    let mut hup = signal(SignalKind::hangup()).context("installing the SIGHUP handler")?;
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = term.recv() => { info!("SIGTERM: restoring weights and stopping"); let _ = tx.send(Command::Shutdown).await; }
                _ = int.recv() => { info!("SIGINT: restoring weights and stopping"); let _ = tx.send(Command::Shutdown).await; }
                _ = hup.recv() => {
                    let Some(path) = config_path.as_ref() else {
                        warn!("SIGHUP: no config file was given; nothing to reload");
                        continue;
                    };
                    match AgentConfig::load(path) {
                        Ok(cfg) => { let _ = tx.send(Command::Reload(Box::new(cfg))).await; }
                        Err(e) => error!(error = %e, "SIGHUP: new config rejected; keeping the old one"),
                    }
                }
            }
        }
    });
    Ok(())
}

/// Sets the calling thread's nice value to `nice` ([`crate::priority`]) and, where the agent leads its session, its
/// session's scheduling group (autogroup) too, logging the outcome: an agent that cannot (no `CAP_SYS_NICE`) runs on
/// at the priority it has, with a warning. The binary and the bench's embedded agent call this on the thread that
/// runs the daemon, first.
pub fn apply_nice(nice: i8) {
    match crate::priority::apply(nice) {
        Ok(()) => debug!(nice, "nice value set"),
        Err(e) => warn!(error = %e, "new containers' weights may wait for a CPU on a busy host"),
    }
    match crate::priority::apply_autogroup(nice) {
        Ok(Autogroup::Set { from }) => {
            info!(nice, from, "the agent's session group (autogroup) set to the agent's nice value")
        }
        Ok(Autogroup::Shared { nice: group }) => info!(
            nice,
            group,
            "the agent shares its session (started from a shell?): the kernel schedules the session as one group at \
             nice {group}, so the agent's nice value weighs only inside it; as a service (systemd gives it a session \
             of its own) or under setsid(1) the agent sets its group too"
        ),
        Ok(Autogroup::Root) => info!(
            nice,
            "the agent runs in the kernel's root scheduling group (the session of init, which has no group of its \
             own): its nice value weighs host-wide, no session group to set"
        ),
        Ok(Autogroup::Off | Autogroup::Unchanged) => debug!(nice, "session group (autogroup): nothing to set"),
        Err(e) => warn!(error = %e, "cannot give the agent's session group (autogroup) its nice value; on a busy \
                                     host new containers' weights may wait for a CPU"),
    }
}
