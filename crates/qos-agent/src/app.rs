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
use crate::cgroup::CgroupRoot;
use crate::config::{ActuatorMode, AgentConfig, RuntimeKind};
use crate::daemon::{Command, Daemon, Summary};
use crate::metrics::Metrics;
use crate::readiness::{self, CheckedDevice, Readiness};
use crate::runtime::cgroup_dir::{CgroupDirCounters, CgroupDirDiscovery, CgroupDirWriter};
use crate::runtime::cri::naming::KubeletRoot;
use crate::runtime::cri::{CriClient, CriDiscovery};
use crate::runtime::docker::{self, DockerCounters, DockerDiscovery, DockerWriter};
use crate::state::OriginalWeights;
use crate::systemd::{self, SystemdActuator};
use crate::{blockdev, control, metrics};

/// Below this many descriptors the agent warns at start (the unit sets `LimitNOFILE=65536`).
const MIN_NOFILE: u64 = 4096;

/// Runs the agent until SIGTERM/SIGINT; `config_path` is re-read on SIGHUP.
pub async fn run(cfg: AgentConfig, config_path: Option<PathBuf>) -> Result<Summary> {
    // The same checks as `check-config`, so the two agree; nothing is written or served before they pass.
    let root = Arc::new(crate::preflight::check(&cfg).context("invalid configuration")?.root);
    // One counter file per container stays open; connections are bounded (`listen`), but a host with many
    // containers needs more than the usual soft limit of 1,024.
    match crate::listen::raise_nofile_limit() {
        Ok(n) if n < MIN_NOFILE => warn!(
            limit = n,
            wanted = MIN_NOFILE,
            "few descriptors allowed (RLIMIT_NOFILE): on a host with many containers cgroup files may fail to \
             open; raise LimitNOFILE"
        ),
        Ok(n) => debug!(limit = n, "open descriptor limit"),
        Err(e) => warn!(error = %e, "cannot read or raise RLIMIT_NOFILE"),
    }
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
            let mut tuned = blockdev::check::check_at_start(&cfg, &root, data_disk)?;
            let files = file_writer(&root, devices.clone(), &metrics);
            let (discovery, counters, writer) = docker_backends(docker, root.clone(), cfg.actuator, files).await?;
            let writer = with_systemd(&cfg, &root, writer, devices)?;
            info!(actuator = ?cfg.actuator, dry_run = cfg.dry_run, "managing Docker containers");
            let daemon = Daemon::new(cfg.clone(), discovery, counters, writer, originals, metrics.clone())?;
            let summary = serve_and_run(&cfg, daemon.with_systemd_notify(systemd), metrics, config_path).await?;
            tuned.restore();
            summary
        }
        RuntimeKind::CgroupDir => {
            let mut tuned = blockdev::check::check_at_start(&cfg, &root, None)?;
            let discovery = CgroupDirDiscovery::new(root.clone(), &cfg.cgroup.parent).with_context(|| {
                format!("cgroup.parent = {:?}: no such cgroup under {}", cfg.cgroup.parent, root.path().display())
            })?;
            info!(parent = %cfg.cgroup.parent, dry_run = cfg.dry_run, "managing child cgroups");
            let daemon = daemon_on_cgroup_files(&cfg, discovery, &root, originals, &metrics)?;
            let summary = serve_and_run(&cfg, daemon.with_systemd_notify(systemd), metrics, config_path).await?;
            tuned.restore();
            summary
        }
        RuntimeKind::Cri => {
            let mut client = CriClient::new(&cfg.cri.socket)?.with_metric(metrics.cri_requests.clone());
            let (name, version) = client.version().await.context("is the container runtime running?")?;
            info!(socket = %cfg.cri.socket.display(), runtime = %name, version = %version, "connected to the CRI runtime");
            // The devices that matter: as configured, else the disks holding the kubelet's and the runtime's state.
            let mut cfg = cfg;
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
            let mut tuned = blockdev::check::check_at_start(&cfg, &root, None)?;
            let (discovery, counters, writer) = cri_backends(&cfg, client, root.clone(), &metrics);
            let writer = with_systemd(&cfg, &root, writer, cfg.devices.check.clone())?;
            info!(dry_run = cfg.dry_run, "managing Kubernetes pods (one weight per pod cgroup)");
            let daemon = Daemon::new(cfg.clone(), discovery, counters, writer, originals, metrics.clone())?;
            let daemon = daemon.with_systemd_notify(systemd);
            let summary = serve_and_run_ready(&cfg, daemon, metrics, config_path, Some(Arc::new(readiness))).await?;
            tuned.restore();
            summary
        }
    };
    info!(restored = summary.restored, failures = summary.restore_failures, "stopped");
    Ok(summary)
}

/// The Docker runtime's discovery, counters and writer, assembled as [`run`] assembles them (the bench runs the
/// daemon on these too, so it measures the shipped wiring): discovery by events, counters from the cgroup files
/// behind the parent gate, the writer in `actuator` mode over `files` (see [`file_writer`]).
pub async fn docker_backends(
    docker: bollard::Docker,
    root: Arc<CgroupRoot>,
    actuator: ActuatorMode,
    files: CgroupDirWriter,
) -> Result<(DockerDiscovery, DockerCounters, DockerWriter)> {
    let discovery = DockerDiscovery::new(docker.clone(), root.clone()).await?;
    let counters = DockerCounters::with_root(docker.clone(), root);
    let writer = DockerWriter::with_files(docker, actuator, files);
    Ok((discovery, counters, writer))
}

/// The CRI runtime's discovery, counters and writer, assembled as [`run`] assembles them for `runtime = "cri"`
/// (the bench runs the daemon on these too): pods from `client` (connected and answering), counters from the pod
/// cgroups behind the parent gate, the file writer on the pod cgroups.
pub fn cri_backends(
    cfg: &AgentConfig,
    client: CriClient,
    root: Arc<CgroupRoot>,
    metrics: &Metrics,
) -> (CriDiscovery, CgroupDirCounters, CgroupDirWriter) {
    // Validated with the config (`AgentConfig::validate`); the default root if it somehow is not.
    let kubelet_root = KubeletRoot::parse(&cfg.cri.cgroup_root).unwrap_or_default();
    let discovery = CriDiscovery::new(client, root.clone(), cfg.cri.relist_interval)
        .with_kubelet_root(kubelet_root)
        .with_policy(Arc::new(cfg.policy.clone()));
    let (counters, writer) = cgroup_file_backends(cfg, &root, metrics);
    (discovery, counters, writer)
}

/// The counters and writer of every runtime whose containers are plain cgroup directories (cgroup-dir runtime,
/// CRI pod cgroups): the gated counters and the file writer, as every runtime without an API actuator uses them.
fn cgroup_file_backends(
    cfg: &AgentConfig,
    root: &Arc<CgroupRoot>,
    metrics: &Metrics,
) -> (CgroupDirCounters, CgroupDirWriter) {
    (CgroupDirCounters::with_root(root.clone()), file_writer(root, cfg.devices.check.clone(), metrics))
}

/// A daemon over `discovery` whose containers are plain cgroup directories, on [`cgroup_file_backends`].
fn daemon_on_cgroup_files<D: Discovery>(
    cfg: &AgentConfig,
    discovery: D,
    root: &Arc<CgroupRoot>,
    originals: OriginalWeights,
    metrics: &Arc<Metrics>,
) -> Result<Daemon<D, CgroupDirCounters, CgroupDirWriter>> {
    let (counters, writer) = cgroup_file_backends(cfg, root, metrics);
    Ok(Daemon::new(cfg.clone(), discovery, counters, writer, originals, metrics.clone())?)
}

/// The cgroup-file writer: on v2 it checks the devices of `[devices] check` (or Docker's data disk) besides each
/// container's own, and exports which weight acts on each device. On v2 it looks at those devices at once, so
/// one where no weight acts is warned about (once: the start-up check leaves v2 devices to it) before any write.
pub fn file_writer(root: &CgroupRoot, devices: Vec<String>, metrics: &Metrics) -> CgroupDirWriter {
    let mut writer =
        CgroupDirWriter::new(root.path()).with_devices(devices).with_metric(metrics.device_weight_effective.clone());
    if root.version() == crate::cgroup::CgroupVersion::V2 {
        writer.check_configured();
    }
    writer
}

/// `writer` inside the systemd actuator, which sends the weights of cgroups that are systemd units through
/// systemd: on for `auto` and `systemd` on a cgroup-v2 host whose PID 1 is systemd (`systemd` elsewhere is an
/// error), off otherwise (then it is `writer` itself).
pub fn with_systemd<W: WeightWriter>(
    cfg: &AgentConfig,
    root: &CgroupRoot,
    writer: W,
    devices: Vec<String>,
) -> Result<SystemdActuator<W>> {
    let v2 = root.version() == crate::cgroup::CgroupVersion::V2;
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
        ActuatorMode::Docker | ActuatorMode::Cgroupfs => false,
    };
    if enabled {
        info!("systemd host on cgroup v2: the weights of cgroups that are systemd units go through systemd");
    }
    // Reads back only: the runtime's own writer reports the devices and exports their metric.
    let files = CgroupDirWriter::new(root.path()).with_devices(devices).quiet();
    Ok(SystemdActuator::new(writer, enabled, files, root.path().to_owned()))
}

/// Serves metrics and the status socket, installs the signal handlers, and runs the daemon; the control socket
/// is removed however the daemon ends.
async fn serve_and_run<D: Discovery, C: CounterSource, W: WeightWriter>(
    cfg: &AgentConfig,
    daemon: Daemon<D, C, W>,
    metrics: Arc<Metrics>,
    config_path: Option<PathBuf>,
) -> Result<Summary> {
    serve_and_run_ready(cfg, daemon, metrics, config_path, None).await
}

/// [`serve_and_run`], answering `GET /readyz` on the metrics listener from `readiness` when there is one.
async fn serve_and_run_ready<D: Discovery, C: CounterSource, W: WeightWriter>(
    cfg: &AgentConfig,
    daemon: Daemon<D, C, W>,
    metrics: Arc<Metrics>,
    config_path: Option<PathBuf>,
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
    let (tx, rx) = mpsc::channel(16);
    let listener = control::bind(&cfg.control_socket)
        .with_context(|| format!("control_socket = {}: cannot bind", cfg.control_socket.display()))?;
    let _socket = RemoveOnDrop(cfg.control_socket.clone());
    tokio::spawn(control::serve(listener, tx.clone()));
    spawn_signal_handlers(tx, config_path)?;
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
