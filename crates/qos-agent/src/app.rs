//! The binary's process around the agent: checks the config (`preflight`), takes the signals (SIGTERM/SIGINT
//! stop, SIGHUP reloads the config file), raises the descriptor limit, sets the CPU priority, has the agent
//! assembled ([`qos_agent::agent::AgentBuilder`]: connected to the runtime first), then (only then) serves metrics and
//! the status socket and runs it.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::mpsc;
use tracing::{debug, error, info, warn};

use qos_agent::agent::{Agent, AgentBuilder, Stopped};
use qos_agent::config::{ActuatorMode, AgentConfig};
use qos_agent::daemon::{Command, Summary};
use qos_agent::ops::metrics::Metrics;
use qos_agent::ops::{control, http};

/// Below this many descriptors the agent warns at start (the unit sets `LimitNOFILE=65536`).
const MIN_NOFILE: u64 = 4096;

/// What the command line sets over the config file. Laid over the file again at every reload, so a SIGHUP cannot
/// undo it: an agent started with `--dry-run` stays in dry run whatever the file says.
#[derive(Debug, Clone, Default)]
pub(crate) struct Overrides {
    /// `--dry-run`.
    pub dry_run: bool,
    /// `--actuator`.
    pub actuator: Option<ActuatorMode>,
    /// `--sample-interval`.
    pub sample_interval: Option<Duration>,
    /// `--metrics-listen` (also turns metrics on).
    pub metrics_listen: Option<SocketAddr>,
    /// `--docker-socket`.
    pub docker_socket: Option<PathBuf>,
}

impl Overrides {
    /// The config file at `path` (without one, the embedded defaults) with these over it, checked.
    pub(crate) fn load(&self, path: Option<&Path>) -> Result<AgentConfig> {
        let mut cfg = match path {
            Some(p) => AgentConfig::load(p)?,
            None => AgentConfig::default(),
        };
        if self.dry_run {
            cfg.dry_run = true;
        }
        if let Some(a) = self.actuator {
            cfg.actuator = a;
        }
        if let Some(d) = self.sample_interval {
            cfg.sample_interval = d;
        }
        if let Some(l) = self.metrics_listen {
            cfg.metrics.enabled = true;
            cfg.metrics.listen = l;
        }
        if let Some(s) = &self.docker_socket {
            cfg.docker.socket = s.clone();
        }
        cfg.validate().map_err(|e| anyhow::anyhow!("{e}"))?;
        Ok(cfg)
    }
}

/// Runs the agent until SIGTERM/SIGINT; `config_path` is re-read on SIGHUP, with `overrides` over it.
pub(crate) async fn run(cfg: AgentConfig, config_path: Option<PathBuf>, overrides: Overrides) -> Result<Summary> {
    // The same checks as `check-config`, so the two agree; nothing is written or served before they pass.
    let root = Arc::new(qos_agent::ops::preflight::check(&cfg).context("invalid configuration")?.root);
    // Signals are taken from here on, before anything is changed (device settings, weights) or served: a SIGTERM
    // that comes before the daemon runs waits in the channel, and the daemon's first act is to restore and stop.
    // (Installed once the control socket was bound, a SIGTERM right after the socket appeared killed the agent
    // with the default action, restoring nothing.)
    let (tx, rx) = mpsc::channel(16);
    spawn_signal_handlers(tx.clone(), config_path.clone(), overrides)?;
    let commands = (tx, rx);
    // One counter file per container stays open; connections are bounded (`listen`), but a host with many
    // containers needs more than the usual soft limit of 1,024.
    match qos_agent::ops::limits::raise_nofile_limit() {
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
    qos_agent::priority::apply_logged(cfg.nice);
    info!(version = ?root.version(), path = %root.path().display(), "cgroup root");
    // What this agent runs with (an upgraded or restarted service says which file and values it took).
    info!(
        config = %config_path.as_deref().map_or_else(|| "(none: the embedded defaults)".into(), |p| p.display().to_string()),
        runtime = ?cfg.runtime,
        actuator = ?cfg.actuator,
        sample_interval = ?cfg.sample_interval,
        dry_run = cfg.dry_run,
        "configuration"
    );
    let metrics = Arc::new(Metrics::new());
    // The runtime first: an agent that cannot reach it stops here, before it serves anything or writes anything.
    let agent = AgentBuilder::new(cfg.clone(), root)
        .metrics(metrics)
        .notify_systemd(std::env::var_os("NOTIFY_SOCKET").is_some())
        .assemble()
        .await?;
    let stopped = serve_and_run(&cfg, agent, commands).await?;
    info!(
        restored = stopped.summary.restored,
        failures = stopped.summary.restore_failures,
        device_settings_not_restored = stopped.device_restore_failures,
        "stopped"
    );
    Ok(stopped.summary)
}

/// Serves the HTTP endpoint (`/metrics`, `/readyz` from the agent's readiness if it has one, `/healthz`) and the status socket, and runs the agent on
/// the commands of `rx` (the signal handlers' and the status socket's); the control socket is removed however the
/// agent ends.
async fn serve_and_run(
    cfg: &AgentConfig,
    agent: Agent,
    (tx, rx): (mpsc::Sender<Command>, mpsc::Receiver<Command>),
) -> Result<Stopped> {
    if cfg.metrics.enabled {
        let listener = http::bind(cfg.metrics.listen)
            .await
            .with_context(|| format!("metrics.listen = {}: cannot bind", cfg.metrics.listen))?;
        if !cfg.metrics.listen.ip().is_loopback() {
            warn!(listen = %cfg.metrics.listen, "metrics served on a non-loopback address, as configured");
        }
        info!(listen = %cfg.metrics.listen, "serving /metrics, /readyz and /healthz");
        tokio::spawn(http::serve(listener, agent.metrics().clone(), agent.readiness()));
    }
    let listener = control::bind(&cfg.control_socket)
        .with_context(|| format!("control_socket = {}: cannot bind", cfg.control_socket.display()))?;
    let _socket = RemoveOnDrop(cfg.control_socket.clone());
    tokio::spawn(control::serve(listener, tx));
    Ok(agent.run(rx).await?)
}

/// Removes a file (the control socket) when dropped.
struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn spawn_signal_handlers(tx: mpsc::Sender<Command>, config_path: Option<PathBuf>, overrides: Overrides) -> Result<()> {
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
                    match overrides.load(Some(path)) {
                        Ok(cfg) => { let _ = tx.send(Command::Reload(Box::new(cfg))).await; }
                        Err(e) => error!(error = %format!("{e:#}"), "SIGHUP: new config rejected; keeping the old one"),
                    }
                }
            }
        }
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_line_stays_over_a_reloaded_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("agent.toml");
        std::fs::write(&path, "dry_run = false\nsample_interval = \"1s\"\n").unwrap();
        let cli = Overrides {
            dry_run: true,
            sample_interval: Some(Duration::from_millis(200)),
            metrics_listen: Some("127.0.0.1:9999".parse().unwrap()),
            ..Default::default()
        };
        let cfg = cli.load(Some(&path)).unwrap();
        assert!(cfg.dry_run, "--dry-run is not undone by the file");
        assert_eq!(cfg.sample_interval, Duration::from_millis(200));
        assert!(cfg.metrics.enabled);
        assert_eq!(cfg.metrics.listen, "127.0.0.1:9999".parse::<SocketAddr>().unwrap());
        // Without overrides the file's values stand.
        let plain = Overrides::default().load(Some(&path)).unwrap();
        assert!(!plain.dry_run);
        assert_eq!(plain.sample_interval, Duration::from_secs(1));
    }

    #[test]
    fn a_bad_file_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("agent.toml");
        std::fs::write(&path, "sample_interval = \"soon\"\n").unwrap();
        let err = format!("{:#}", Overrides::default().load(Some(&path)).unwrap_err());
        assert!(err.contains("agent.toml"), "{err}");
    }
}
