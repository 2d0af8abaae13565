//! The daemon loop: discover → sample → decide → apply → verify, generic over the backend traits.
//!
//! One task owns all state. It waits on: discovery events (a started container gets the top weight at once, without
//! waiting for a tick), the sampling tick, the engine's next deadline and control commands (reload, shutdown,
//! status). Nothing else mutates the state, so there are no locks.
//!
//! The policy lives in two synchronous state machines: [`qos_core::Engine`] decides the weights, and
//! [`Reconciler`] decides what to read, write and keep on file to get them into the cgroup files (and the originals
//! back out). This loop feeds both, carries out the reconciler's actions with the [`WeightWriter`] and the
//! [`OriginalWeights`] file, feeds the results back, and turns its reports into log lines and metrics.
//!
//! Discovery's `Stopped` means the cgroup is gone: the container's original is forgotten, not put back (with a
//! writer whose weights outlive the cgroup, Docker's API, it is first put back into the container's configuration,
//! see the reconciler); `Removed`, the container is gone too: forgotten. A tracked
//! container announced as started again (an exit not seen, a pod's sandbox made again on the same cgroup) keeps its
//! original, whatever its cgroup file holds now; what discovery says of it now is taken in, and labels that ask for
//! another policy are that policy's decision (one opted out gets its original back). After an outage, a listed
//! container in another cgroup than before is dropped and tracked anew.
//!
//! Caps ([`qos_core::Cap`]: a container settled at the bottom held a few percent under the device's load) go from the
//! engine straight to the writer ([`WeightWriter::cap`]), not through the reconciler: no original is kept on file
//! for them (the writer keeps what the throttle files held, in its own records), and a lift that fails is tried
//! again every round. Every cap is lifted at shutdown and on entering dry run; in dry run none is written, and
//! leaving it sets the caps the engine holds. A container whose configuration changed (`Updated`) gets its cap
//! written again: the writer takes a limit set meanwhile as the container's own. Caps a previous agent left that
//! could not be put back at start are the writer's to try again ([`WeightWriter::retry_leftovers`], every round).
//!
//! One clock: tokio's (`tokio::time::Instant`, converted to std for the engine), so paused-time tests see the
//! same time everywhere.

mod cpu_clock;
pub mod pacing;
pub mod reconcile;
mod report;
mod status;

use std::collections::HashMap;
use std::sync::Arc;

use qos_core::{Cap, ContainerId, Engine, IoCounters, Policy, WeightChange};
use tokio::sync::{mpsc, oneshot};
use tracing::{debug, error, info, warn};

use crate::backend::RuntimeBackends;
use crate::backend::{BackendError, CapApplied};
use crate::backend::{
    ContainerInfo, CounterSource, DeviceMonitor, Discovery, DiscoveryError, DiscoveryEvent, WeightWriter,
};
use crate::config::AgentConfig;
use crate::daemon::pacing::{Pacer, Transition};
use crate::daemon::reconcile::{Original, Output, Reconciler, Tracking};
use crate::labels::policy_from_labels;
use crate::ops::metrics::{ContainerLabels, Metrics, ReasonLabels};
use crate::state::OriginalWeights;

pub use crate::daemon::reconcile::Summary;
pub use cpu_clock::CpuClock;
pub use status::{display_level, Actuator, DeviceRow, DeviceSummary, FileWeight, PolicyKind, Status, StatusRow};

/// What the outside world can ask of a running daemon.
#[derive(Debug)]
pub enum Command {
    /// Apply a new, already validated config (SIGHUP). Fields that need a restart are reported and ignored.
    Reload(Box<AgentConfig>),
    /// Send the status table.
    Status(oneshot::Sender<Status>),
    /// Restore every original weight and stop (SIGTERM, SIGINT).
    Shutdown,
}

/// Why the daemon stopped with an error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DaemonError {
    /// Discovery failed permanently.
    #[error(transparent)]
    Discovery(#[from] DiscoveryError),
    /// The engine config is invalid.
    #[error(transparent)]
    Config(#[from] qos_core::ConfigError),
}

/// What the loop keeps of one container (its weights and originals are the reconciler's).
#[derive(Debug)]
struct Tracked {
    info: ContainerInfo,
    labels: ContainerLabels,
    /// This container's `container_bytes` series, kept so a sample does not look it up by its labels.
    bytes: prometheus_client::metrics::gauge::Gauge,
    /// Counters of the previous sample; an identical sample is not fed to the engine.
    last_counters: Option<IoCounters>,
}

/// The agent's state and backends. Build with [`Daemon::new`], run with [`Daemon::run`].
#[derive(Debug)]
pub struct Daemon<D, C, W> {
    cfg: AgentConfig,
    /// Taken by [`Daemon::run`], which keeps it inside a stream (see there).
    discovery: Option<D>,
    counters: C,
    writer: W,
    /// The devices the weights act on, ticked every round and shown in status (none: no device rows).
    devices: Option<Box<dyn DeviceMonitor>>,
    engine: Engine,
    reconciler: Reconciler,
    tracked: HashMap<ContainerId, Tracked>,
    /// Names of containers that stopped while their original's restore into the runtime's configuration is still
    /// owed (they left `tracked` when they stopped), for that restore's log lines; dropped once the reconciler
    /// forgot them. Originals on file of containers this agent never saw have no name here.
    exited_names: HashMap<ContainerId, String>,
    originals: OriginalWeights,
    metrics: Arc<Metrics>,
    /// The sampling buffer, reused every round.
    samples: Vec<(ContainerId, Result<IoCounters, BackendError>)>,
    actuator: Actuator,
    notify_systemd: bool,
    pacer: Pacer,
    cpu_clock: CpuClock,
    /// What the last batch of restores (shutdown, or entering dry run) did.
    restores: Option<Summary>,
    /// Containers whose counters could not be attached (e.g. descriptors exhausted): tried again every
    /// [`REATTACH_EVERY`] rounds.
    unattached: std::collections::HashSet<ContainerId>,
    /// Rounds run.
    rounds: u64,
    /// Until when rounds come every `entry_sample_interval`: `entry_sample_for` after the last entry at the top.
    entry_until: Option<std::time::Instant>,
    /// Containers the writer was asked to cap and that are owed a lift: the cap asked for, and whether the writer
    /// said it is in force (a write that failed may have landed before its check failed: a lift is owed all the
    /// same).
    caps: HashMap<ContainerId, (Cap, bool)>,
}

impl<D: Discovery, C: CounterSource, W: WeightWriter, M: DeviceMonitor + 'static> RuntimeBackends<D, C, W, M> {
    /// The daemon over these backends (`originals`: weights a previous agent recorded), its device monitor
    /// attached.
    pub fn into_daemon(
        self,
        cfg: AgentConfig,
        originals: OriginalWeights,
        metrics: Arc<Metrics>,
    ) -> Result<Daemon<D, C, W>, DaemonError> {
        let daemon = Daemon::new(cfg, self.discovery, self.counters, self.writer, originals, metrics)?;
        Ok(daemon.with_device_monitor(self.devices))
    }
}

/// How often (in rounds) counters that could not be attached are tried again.
pub const REATTACH_EVERY: u64 = 16;

/// Now on the daemon's one clock, as the engine takes it.
fn now() -> std::time::Instant {
    tokio::time::Instant::now().into_std()
}

impl<D: Discovery, C: CounterSource, W: WeightWriter> Daemon<D, C, W> {
    /// Assembles a daemon. `originals` holds weights a previous agent recorded (crash recovery).
    pub fn new(
        cfg: AgentConfig,
        discovery: D,
        counters: C,
        writer: W,
        originals: OriginalWeights,
        metrics: Arc<Metrics>,
    ) -> Result<Self, DaemonError> {
        let engine = Engine::new(cfg.mlfq.clone(), now())?;
        let pacer = Pacer::new(cfg.sample_interval, cfg.cpu_budget);
        Ok(Self {
            pacer,
            cpu_clock: CpuClock::thread(),
            reconciler: Reconciler::new(cfg.dry_run).with_persisting_writer(writer.persists()),
            actuator: Actuator { configured: cfg.actuator, in_use: None },
            cfg,
            discovery: Some(discovery),
            counters,
            writer,
            devices: None,
            engine,
            tracked: HashMap::new(),
            exited_names: HashMap::new(),
            originals,
            metrics,
            samples: Vec::new(),
            notify_systemd: false,
            restores: None,
            unattached: Default::default(),
            rounds: 0,
            entry_until: None,
            caps: HashMap::new(),
        })
    }

    /// Charges rounds with CPU time from `clock` (default [`CpuClock::thread`], right for the current-thread runtime
    /// the binary and the bench run the daemon on). An embedder whose daemon shares a multi-thread runtime gives
    /// the CPU time its rounds cost some other way (its process's, say); tests give a fake one. The seam the
    /// pacer's time comes through, like [`Daemon::with_device_monitor`] for the devices: no test code behind it.
    pub fn with_cpu_clock(mut self, clock: CpuClock) -> Self {
        self.cpu_clock = clock;
        self
    }

    /// Ticks `devices` every round on the daemon's clock and shows them in status (e.g. the writer's
    /// [`crate::files::FileWriter::devices`]).
    pub fn with_device_monitor(mut self, devices: impl DeviceMonitor + 'static) -> Self {
        self.devices = Some(Box::new(devices));
        self
    }

    /// Sends READY/WATCHDOG/STOPPING to systemd (when run as a `Type=notify` service).
    pub fn with_systemd_notify(mut self, on: bool) -> Self {
        self.notify_systemd = on;
        self
    }

    /// Runs until [`Command::Shutdown`] (or the command channel closes), then restores every original weight and
    /// lifts every cap. A permanent discovery error ends it the same way, then is returned.
    pub async fn run(mut self, mut commands: mpsc::Receiver<Command>) -> Result<Summary, DaemonError> {
        let mut discovery = self.discovery.take().expect("run consumes the daemon");
        let initial = discovery.start().await?;
        self.metrics.runtime_up.set(1);
        info!(containers = initial.len(), "discovered running containers");
        for c in initial {
            self.track(c, false).await;
        }
        // One batch for all of them: one state-file save before their writes.
        self.apply_changes().await;
        // Ready first: with Docker's API as the writer each leftover is a `docker update` and an inspect, one after
        // another, which after a crash with many stopped containers could outlast the unit's start timeout.
        self.sd_notify(&[sd_notify::NotifyState::Ready]);
        self.reset_leftovers().await;

        // `next_event` runs inside this stream, which keeps a half-done call across loop iterations: when the tick
        // or a command wins the select below, an `inspect` of a just-started container or a reconnect backoff is
        // resumed later, not dropped and started again (a dropped start event left that container unmanaged; a
        // backoff longer than the sampling interval never completed, so the agent never reconnected).
        let events = futures_util::stream::unfold(discovery, |mut d| async move {
            let ev = d.next_event().await;
            Some((ev, d))
        });
        let mut events = std::pin::pin!(events);

        let mut next_round = tokio::time::Instant::now();
        let mut last_round = next_round;
        // A permanent discovery error ends the loop like a shutdown (every weight put back, every cap lifted: the
        // agent leaves nothing at a weight it set), then ends `run` with it.
        let mut failed = None;
        self.metrics.round_interval_seconds.set(self.pacer.period().as_secs_f64());
        loop {
            let deadline = self.engine.poll_timeout().map(tokio::time::Instant::from_std);
            let round_at = self.entry_round(last_round).map_or(next_round, |fast| fast.min(next_round));
            tokio::select! {
                biased;
                cmd = commands.recv() => match cmd {
                    Some(Command::Shutdown) | None => break,
                    Some(Command::Reload(cfg)) => {
                        self.reload(*cfg).await;
                        next_round = tokio::time::Instant::now();
                    }
                    Some(Command::Status(reply)) => { let _ = reply.send(self.status()); }
                },
                Some(ev) = futures_util::StreamExt::next(&mut events) => match ev {
                    Ok(ev) => self.on_event(ev).await,
                    Err(e) => {
                        error!(error = %e, "discovery failed for good: putting back every weight and lifting every cap");
                        failed = Some(e);
                        break;
                    }
                },
                _ = tokio::time::sleep_until(round_at) => {
                    let started = tokio::time::Instant::now();
                    last_round = started;
                    self.paced_round().await;
                    // A round that overran its period is followed by a full period, not by another round at once.
                    let (due, now) = (started + self.pacer.period(), tokio::time::Instant::now());
                    next_round = if due > now { due } else { now + self.pacer.period() };
                }
                _ = sleep_until_opt(deadline) => {
                    self.engine.handle_timeout(now());
                    self.apply_changes().await;
                }
            }
        }
        self.sd_notify(&[sd_notify::NotifyState::Stopping]);
        self.restores = None;
        self.lift_all_caps().await;
        self.reconciler.handle_shutdown();
        self.drive().await;
        let summary = self.restores.take().unwrap_or_default();
        match failed {
            None => Ok(summary),
            Some(e) => {
                info!(
                    restored = summary.restored,
                    restore_failures = summary.restore_failures,
                    "put back the weights before ending on the discovery error"
                );
                Err(e.into())
            }
        }
    }

    // ----- discovery -----

    async fn on_event(&mut self, ev: DiscoveryEvent) {
        match ev {
            DiscoveryEvent::Started(info) => {
                if self.tracked.contains_key(&info.id) {
                    self.started_again(info).await;
                } else {
                    self.track(info, true).await;
                }
                self.apply_changes().await;
            }
            DiscoveryEvent::Stopped(id) => self.drop_exited(&[id]).await,
            DiscoveryEvent::Removed(id) => self.forget_all(&[id]).await,
            DiscoveryEvent::Updated(id) => {
                self.reconciler.handle_updated(&id);
                self.drive().await;
                self.recheck_cap(&id).await;
            }
            DiscoveryEvent::StillStarting(ids) => {
                for id in &ids {
                    self.reconciler.handle_still_starting(id);
                }
                self.drive().await;
            }
            DiscoveryEvent::Settled(id) => {
                // Written again the writer's way once the container's entry window is over, not during its first
                // reads (which the files already serve at the right weight).
                self.reconciler.handle_settled(&id, now() + self.cfg.entry_sample_for);
                self.drive().await;
            }
            DiscoveryEvent::Lost(why) => {
                warn!(reason = %why, "container runtime unreachable; keeping weights, retrying with backoff");
                self.metrics.runtime_up.set(0);
                self.metrics.runtime_outages.inc();
            }
            DiscoveryEvent::Resync(list) => {
                info!(containers = list.len(), "container runtime reachable again; resynchronising");
                self.metrics.runtime_up.set(1);
                let alive: std::collections::HashSet<ContainerId> = list.iter().map(|c| c.id.clone()).collect();
                // Stopped or removed meanwhile: a writer whose weights outlive the cgroup learns which when it
                // puts a stopped one's original back.
                let gone: Vec<ContainerId> = self.tracked.keys().filter(|id| !alive.contains(*id)).cloned().collect();
                self.drop_exited(&gone).await;
                for c in list {
                    match self.tracked.get(&c.id) {
                        Some(t) if t.info.cgroup_path() != c.cgroup_path() => {
                            // Made again in another cgroup while the runtime was away (a pod's new sandbox): the
                            // old cgroup, and what the agent wrote there, is gone; a writer whose weights outlive
                            // it puts the original back first, and tracking it anew keeps that original.
                            self.drop_exited(std::slice::from_ref(&c.id)).await;
                            self.track(c, false).await;
                        }
                        Some(_) => {
                            let id = c.id.clone();
                            // A pod's sandbox made again meanwhile may carry other annotations.
                            self.retake(c);
                            // Its cgroup may be a new one at the same path (a runtime restarted without
                            // live-restore starts its containers again), and its weight may have been changed
                            // while the runtime was away.
                            self.reopen(&id).await;
                        }
                        None => self.track(c, false).await,
                    }
                }
                self.apply_changes().await;
            }
        }
    }

    /// Opens a container's counters; `false` if it is gone already (churn: its removal event follows). One that
    /// cannot be opened otherwise is tried again every [`REATTACH_EVERY`] rounds.
    async fn attach_counters(&mut self, info: &ContainerInfo) -> bool {
        match self.counters.attach(info).await {
            Ok(()) => true,
            Err(e) if e.is_vanished() => {
                debug!(container = %info.id.short(), name = %info.name, error = %e, "container gone before it was tracked");
                false
            }
            Err(e) => {
                warn!(container = %info.id.short(), name = %info.name, error = %e,
                      "cannot sample this container's I/O; trying again every {REATTACH_EVERY} rounds");
                self.unattached.insert(info.id.clone());
                true
            }
        }
    }

    /// The policy a container's labels ask for; what is not honoured is logged. Docker labels go through
    /// `[policy] docker_labels` (CRI discovery has applied `[policy]` to pods already).
    fn policy_of(&self, info: &ContainerInfo) -> Policy {
        let id = &info.id;
        let (policy, label_errors) = if self.cfg.runtime == crate::config::RuntimeKind::Docker {
            let (labels, notes) = self.cfg.policy.decide_docker(&info.labels);
            for n in notes {
                warn!(container = %id.short(), name = %info.name, label = n.annotation, value = %n.value, rule = %n.rule,
                      "label not honoured; the container is managed without it");
            }
            policy_from_labels(&labels)
        } else {
            policy_from_labels(&info.labels)
        };
        for e in label_errors {
            warn!(container = %id.short(), name = %info.name, error = %e, "bad policy label");
        }
        policy
    }

    /// Starts tracking a container: fresh ones count their I/O from zero, adopted ones from their first sample.
    async fn track(&mut self, info: ContainerInfo, fresh: bool) {
        let id = info.id.clone();
        let policy = self.policy_of(&info);
        if !self.attach_counters(&info).await {
            return;
        }
        // The state file wins: after a crash the file holds our own stale demotion, not the original.
        let original = match self.originals.get(&id) {
            Some(w) => Original::OnFile(w),
            None => match self.writer.read(&info).await {
                Ok(w) => Original::Read(w),
                Err(e) => {
                    debug!(container = %id.short(), error = %e, "cannot read current weight");
                    Original::Unknown
                }
            },
        };
        let (labels, bytes) = self.series(&info);
        self.tracked.insert(id.clone(), Tracked { info, labels, bytes, last_counters: None });
        self.metrics.containers.set(self.tracked.len() as i64);
        let t = now();
        match policy {
            Policy::Managed if fresh => self.engine.handle_started(&id, t),
            _ => self.engine.set_policy(&id, policy, t),
        }
        let tracking = if policy == Policy::Excluded { Tracking::Excluded } else { Tracking::Follow };
        self.reconciler.handle_tracked(&id, original, tracking);
    }

    /// A tracked container started again: one whose exit was not seen (a `die` lost to a runtime restart, or a
    /// cgroup watch ahead of it), or a pod whose sandbox was made again on the same cgroup. It keeps its entry and
    /// its original (the cgroup file holds the agent's weight, or the runtime's, never one to restore to): what
    /// discovery says now is taken in ([`Daemon::retake`]), it goes back to the top as a new one unless its policy
    /// changed (then that change is the engine's decision), its counters' handles are opened again (its cgroup may
    /// be a new one) and its weight file is checked and written again.
    async fn started_again(&mut self, info: ContainerInfo) {
        let id = info.id.clone();
        if !self.retake(info) {
            self.engine.handle_started(&id, now());
        }
        self.reopen(&id).await;
    }

    /// A tracked container whose cgroup may be a new one at the same path: its counters' handles are opened again
    /// (the old ones read a removed cgroup) and its weight file is checked and written again.
    async fn reopen(&mut self, id: &ContainerId) {
        let Some(tr) = self.tracked.get_mut(id) else { return };
        tr.last_counters = None; // a restarted container's counters may start again from zero
        let info = tr.info.clone();
        self.counters.detach(id);
        self.unattached.remove(id);
        if self.attach_counters(&info).await {
            self.reconciler.handle_updated(id);
        }
    }

    /// Takes what discovery says now of a tracked container into its entry (name, labels, cgroup: a pod's new
    /// sandbox may carry other annotations) and gives the engine the policy its labels now ask for, if that changed.
    /// The engine's decision is carried out like any other: one excluded now is released, so the reconciler puts its
    /// original back (and keeps it, should the container be managed again). Returns whether the policy changed.
    fn retake(&mut self, info: ContainerInfo) -> bool {
        let policy = self.policy_of(&info);
        // The engine holds the policy the labels asked for last (nothing else sets one).
        let old = self.engine.container(&info.id, now()).map_or(Policy::Managed, |c| c.policy);
        let renamed = self.tracked.get(&info.id).is_some_and(|t| t.info.name != info.name);
        let series = renamed.then(|| self.series(&info));
        let Some(tr) = self.tracked.get_mut(&info.id) else { return false };
        if let Some((labels, bytes)) = series {
            // Its metric series are named after it.
            self.metrics.forget(&std::mem::replace(&mut tr.labels, labels));
            tr.bytes = bytes;
        }
        tr.info = info;
        if old == policy {
            return false;
        }
        info!(container = %tr.info.id.short(), name = %tr.info.name, old = ?old, new = ?policy,
              "container's labels ask for another policy now");
        let id = tr.info.id.clone();
        self.engine.set_policy(&id, policy, now());
        true
    }

    /// A container's metric labels and its `container_bytes` series.
    fn series(&self, info: &ContainerInfo) -> (ContainerLabels, prometheus_client::metrics::gauge::Gauge) {
        let labels = ContainerLabels { id: info.id.short().to_string(), name: info.name.clone() };
        let bytes = self.metrics.bytes.get_or_create(&labels).clone();
        (labels, bytes)
    }

    /// Drops containers that no longer exist, with one state-file save for all of them.
    async fn forget_all(&mut self, ids: &[ContainerId]) {
        self.drop_all(ids, Reconciler::handle_removed).await;
    }

    /// Drops containers that stopped (their cgroups are gone), with one state-file save for all of them; with a
    /// writer whose weights outlive the cgroup, each one the agent changed first gets its original back in its
    /// configuration (the reconciler's rules).
    async fn drop_exited(&mut self, ids: &[ContainerId]) {
        for id in ids {
            if let Some(t) = self.tracked.get(id) {
                self.exited_names.insert(id.clone(), t.info.name.clone());
            }
        }
        self.drop_all(ids, Reconciler::handle_exited).await;
    }

    /// The container's name for a log line: a tracked container's, else that of one that stopped and whose
    /// restore is owed; empty for one this agent never saw.
    fn name_of(&self, id: &ContainerId) -> String {
        self.tracked.get(id).map(|t| &t.info.name).or_else(|| self.exited_names.get(id)).cloned().unwrap_or_default()
    }

    /// Drops containers from everything but the reconciler, then tells it with `tell`.
    async fn drop_all(&mut self, ids: &[ContainerId], tell: fn(&mut Reconciler, &[ContainerId])) {
        if ids.is_empty() {
            return;
        }
        for id in ids {
            self.drop_tracked(id);
        }
        tell(&mut self.reconciler, ids);
        self.drive().await;
    }

    /// Drops a container from the engine, the counters, the metrics and the table (not from the reconciler).
    fn drop_tracked(&mut self, id: &ContainerId) {
        self.engine.handle_removed(id, now());
        // Its cgroup is gone, and the throttle limits with it; a cgroup a cap was written to that outlived it is the
        // writer's to put back (`forget`).
        self.caps.remove(id);
        self.counters.detach(id);
        self.writer.forget(id);
        self.unattached.remove(id);
        if let Some(t) = self.tracked.remove(id) {
            self.metrics.forget(&t.labels);
            debug!(container = %id.short(), name = %t.info.name, "container gone");
        }
        self.metrics.containers.set(self.tracked.len() as i64);
    }

    /// Tries again to attach the counters that could not be attached.
    async fn reattach(&mut self) {
        for id in self.unattached.clone() {
            let Some(t) = self.tracked.get(&id) else {
                self.unattached.remove(&id);
                continue;
            };
            match self.counters.attach(&t.info).await {
                Ok(()) => {
                    info!(container = %id.short(), name = %t.info.name, "sampling this container's I/O again");
                    self.unattached.remove(&id);
                }
                Err(e) => debug!(container = %id.short(), error = %e, "counters still cannot be attached"),
            }
        }
    }

    /// After a crash: containers a previous agent recorded but that no longer run are dropped from the state file,
    /// in one save; with a writer whose weights outlive the cgroup, each first gets its original back in its
    /// configuration, where that agent's weight may still be (the reconciler's rules).
    async fn reset_leftovers(&mut self) {
        let stale: Vec<(ContainerId, qos_core::Weight)> = self
            .originals
            .ids()
            .filter(|id| !self.tracked.contains_key(*id))
            .filter_map(|id| Some((id.clone(), self.originals.get(id)?)))
            .collect();
        if !stale.is_empty() {
            info!(
                containers = stale.len(),
                restored_first = self.writer.persists(),
                "forgetting the originals on file of containers not running (restored first where the writer's \
                   weights outlive the cgroup: in the containers' configuration)"
            );
        }
        self.reconciler.handle_leftovers(&stale);
        self.drive().await;
    }

    // ----- sampling and deciding -----

    /// When the next entry round is due (`entry_sample_interval` after the last round's start), while a recent
    /// entry at the top asks for them and the CPU budget leaves room for rounds that often.
    fn entry_round(&self, last_round: tokio::time::Instant) -> Option<tokio::time::Instant> {
        let fast = self.cfg.entry_sample_interval?;
        let until = tokio::time::Instant::from_std(self.entry_until?);
        let at = last_round + fast;
        (at < until && self.pacer.allows(fast)).then_some(at)
    }

    /// A round, charged to the pacer: rounds costlier than the CPU budget allows are spread out.
    async fn paced_round(&mut self) {
        let cpu_before = self.cpu_clock.now();
        self.round().await;
        let cpu = self.cpu_clock.now().saturating_sub(cpu_before);
        self.metrics.round_cpu_seconds.inc_by(cpu.as_secs_f64());
        let transition = self.pacer.after_round(cpu);
        let (period, per_round) = (self.pacer.period(), self.pacer.cpu_per_round());
        self.metrics.round_interval_seconds.set(period.as_secs_f64());
        // Only formatted when a transition is logged (rare), not every round.
        let budget = || self.cfg.cpu_budget.map(|b| b.to_string()).unwrap_or_default();
        match transition {
            Transition::None => {}
            Transition::Stretched => {
                info!(?period, cpu_per_round = ?per_round, budget = %budget(), containers = self.tracked.len(),
                "sampling rounds cost more CPU than the budget: spreading them out")
            }
            Transition::Relaxed => info!(?period, cpu_per_round = ?per_round, budget = %budget(),
                "sampling rounds back within the CPU budget at sample_interval"),
            Transition::OverBudget => warn!(?period, cpu_per_round = ?per_round, budget = %budget(),
                containers = self.tracked.len(),
                "sampling rounds exceed the CPU budget even at the longest period (8 x sample_interval)"),
        }
    }

    async fn round(&mut self) {
        let started = tokio::time::Instant::now();
        self.rounds += 1;
        if !self.unattached.is_empty() && self.rounds % REATTACH_EVERY == 0 {
            self.reattach().await;
        }
        let mut samples = std::mem::take(&mut self.samples);
        samples.clear();
        self.counters.sample(&mut samples).await;
        let t = now();
        let mut vanished = Vec::new();
        for (id, result) in samples.drain(..) {
            match result {
                Ok(counters) => {
                    let Some(tr) = self.tracked.get_mut(&id) else { continue };
                    self.reconciler.handle_sample_ok(&id);
                    // Unchanged counters carry no information for the engine (its timers run on their own).
                    if tr.last_counters == Some(counters) {
                        continue;
                    }
                    tr.last_counters = Some(counters);
                    self.engine.handle_sample(&id, counters, t);
                    if let Some(total) = self.engine.total_bytes(&id) {
                        tr.bytes.set(total.min(i64::MAX as u64) as i64);
                    }
                }
                Err(e) if e.is_vanished() => vanished.push(id),
                Err(e) => {
                    self.metrics.sample_failures.inc();
                    self.reconciler.handle_sample_failed(&id, e);
                }
            }
        }
        self.samples = samples;
        self.drop_exited(&vanished).await;
        if self.engine.poll_timeout().is_some_and(|d| d <= t) {
            self.engine.handle_timeout(t);
        }
        self.feed_decisions();
        self.reconciler.handle_round(now());
        self.drive().await;
        self.apply_caps().await;
        self.retry_lifts().await;
        self.writer.retry_leftovers().await;
        if let Some(devices) = &mut self.devices {
            devices.tick(now());
        }
        self.metrics.round_seconds.observe(started.elapsed().as_secs_f64());
        self.sd_notify(&[sd_notify::NotifyState::Watchdog]);
    }

    // ----- applying -----

    /// Hands the engine's decisions to the reconciler and carries out what follows.
    async fn apply_changes(&mut self) {
        self.feed_decisions();
        self.drive().await;
        self.apply_caps().await;
    }

    /// Carries out the engine's cap decisions through the writer, each at once (none in dry run).
    async fn apply_caps(&mut self) {
        while let Some(change) = self.engine.poll_cap_change() {
            match change.cap {
                Some(cap) => self.set_cap(&change.id, cap).await,
                None => self.lift_cap(&change.id, false).await,
            }
        }
    }

    /// Writes again the cap of a container whose configuration changed (`docker update --device-read-bps` writes
    /// the throttle files): the writer takes the new limit in as the container's own, so its lift leaves it, and
    /// the cap written is never looser than it.
    async fn recheck_cap(&mut self, id: &ContainerId) {
        if !self.caps.contains_key(id) {
            return;
        }
        if let Some(cap) = self.engine.container(id, now()).and_then(|v| v.cap) {
            self.set_cap(id, cap).await;
        }
    }

    /// Caps one container; whatever the outcome (a write may have landed before its check failed) a lift is owed,
    /// unless the writer does not cap.
    async fn set_cap(&mut self, id: &ContainerId, cap: Cap) {
        let Some(t) = self.tracked.get(id) else { return };
        if self.cfg.dry_run {
            debug!(container = %id.short(), name = %t.info.name, read_bps = ?cap.read_bps, write_bps = ?cap.write_bps,
                   "dry run: would cap at the bottom");
            return;
        }
        let name = t.info.name.clone();
        match self.writer.cap(&t.info, Some(cap)).await {
            Ok(CapApplied::Unsupported) => {}
            Ok(applied) => {
                self.caps.insert(id.clone(), (cap, true));
                info!(container = %id.short(), name = %name, read_bps = ?cap.read_bps, write_bps = ?cap.write_bps,
                      ?applied, "capped at the bottom, a few percent under the device's load (headroom for other I/O)");
            }
            Err(e) if e.is_vanished() => debug!(container = %id.short(), error = %e, "gone before its cap"),
            Err(e) => {
                self.caps.insert(id.clone(), (cap, false));
                warn!(container = %id.short(), name = %name, error = %e, "cannot cap at the bottom");
            }
        }
    }

    /// Lifts one container's cap, if the writer was asked for one; a failure leaves it owed
    /// ([`Self::retry_lifts`]), logged as a warning the first time and at debug level on each retry.
    async fn lift_cap(&mut self, id: &ContainerId, retry: bool) {
        if !self.caps.contains_key(id) {
            return;
        }
        let Some(t) = self.tracked.get(id) else {
            self.caps.remove(id);
            return;
        };
        match self.writer.cap(&t.info, None).await {
            Ok(applied) => {
                self.caps.remove(id);
                debug!(container = %id.short(), name = %t.info.name, ?applied, "cap lifted");
            }
            Err(e) if e.is_vanished() => {
                self.caps.remove(id);
            }
            Err(e) if retry => {
                debug!(container = %id.short(), name = %t.info.name, error = %e, "cannot lift the cap yet")
            }
            Err(e) => warn!(container = %id.short(), name = %t.info.name, error = %e,
                            "cannot lift the cap; trying again every round"),
        }
    }

    /// Lifts again the caps the engine no longer wants, and every cap in dry run (a lift that failed).
    async fn retry_lifts(&mut self) {
        if self.caps.is_empty() {
            return;
        }
        let t = now();
        let dry_run = self.cfg.dry_run;
        let owed: Vec<ContainerId> = self
            .caps
            .keys()
            .filter(|id| dry_run || self.engine.container(id, t).is_none_or(|v| v.cap.is_none()))
            .cloned()
            .collect();
        for id in owed {
            self.lift_cap(&id, true).await;
        }
    }

    /// Sets the caps the engine holds that are not in force (leaving dry run, where none was written).
    async fn reapply_caps(&mut self) {
        let t = now();
        let wanted: Vec<(ContainerId, Cap)> = self
            .engine
            .containers(t)
            .filter(|v| !self.caps.contains_key(&v.id))
            .filter_map(|v| Some((v.id, v.cap?)))
            .collect();
        for (id, cap) in wanted {
            self.set_cap(&id, cap).await;
        }
    }

    /// Lifts every cap (shutdown, entering dry run).
    async fn lift_all_caps(&mut self) {
        let ids: Vec<ContainerId> = self.caps.keys().cloned().collect();
        for id in ids {
            self.lift_cap(&id, false).await;
        }
    }

    /// Drains the engine into the reconciler, as one batch (one state-file save for all its writes).
    fn feed_decisions(&mut self) {
        let batch: Vec<WeightChange> = std::iter::from_fn(|| self.engine.poll_change()).collect();
        if batch.is_empty() {
            return;
        }
        if self.cfg.entry_sample_interval.is_some() && batch.iter().any(|c| c.new_level == Some(0)) {
            // Entrants at the top share the device as peers until a round tells the big readers among them.
            let until = now() + self.cfg.entry_sample_for;
            self.entry_until = Some(self.entry_until.map_or(until, |u| u.max(until)));
        }
        for change in &batch {
            self.metrics.decisions.get_or_create(&ReasonLabels { reason: change.reason.as_str().into() }).inc();
            if let (Some(level), Some(t)) = (change.new_level, self.tracked.get(&change.id)) {
                self.metrics.level.get_or_create(&t.labels).set(level as i64);
            }
        }
        self.reconciler.handle_decisions(batch);
    }

    /// Drains the reconciler: carries out each action, feeding reads and writes back before the next poll.
    async fn drive(&mut self) {
        while let Some(output) = self.reconciler.poll_output() {
            match output {
                // The table and the reconciler forget containers together, so an action always finds its
                // container; were it missing, a fault keeps the reconciler's bookkeeping whole.
                Output::ReadWeight { id } => {
                    let result = match self.tracked.get(&id) {
                        Some(t) => self.writer.read(&t.info).await,
                        None => Err(BackendError::NoCgroup(id.clone())),
                    };
                    self.reconciler.handle_read_result(&id, result);
                }
                Output::Write { id, weight } => {
                    let result = match self.tracked.get(&id) {
                        Some(t) => self.writer.write(&t.info, weight).await,
                        None => Err(BackendError::NoCgroup(id.clone())),
                    };
                    self.reconciler.handle_write_result(&id, result);
                }
                Output::Restore { id, weight } => {
                    let result = match self.tracked.get(&id) {
                        Some(t) => self.writer.restore(&t.info, weight).await,
                        None => Err(BackendError::NoCgroup(id.clone())),
                    };
                    self.reconciler.handle_write_result(&id, result);
                }
                Output::RestoreExited { id, weight } => {
                    let result = self.writer.restore_exited(&id, weight).await;
                    self.reconciler.handle_write_result(&id, result);
                }
                Output::SaveOriginals(items) => {
                    let result = self.originals.record_all(items.iter().map(|(id, w)| (id, *w)));
                    self.reconciler.handle_save_result(result);
                }
                Output::ForgetOriginals(ids) => {
                    // An original left on file is the weight the container has now: harmless, and rewritten by
                    // the next save that works.
                    if let Err(e) = self.originals.forget_all(&ids) {
                        if self.reconciler.saves_held() {
                            debug!(error = %e, "cannot update state file");
                        } else {
                            warn!(error = %e, "cannot update state file");
                        }
                    }
                }
                Output::Report(report) => self.report(report),
            }
        }
        if !self.exited_names.is_empty() {
            let reconciler = &self.reconciler;
            self.exited_names.retain(|id, _| reconciler.is_tracked(id));
        }
    }

    // ----- control -----

    async fn reload(&mut self, mut cfg: AgentConfig) {
        if self.cfg.dry_run && !cfg.dry_run && !self.originals.is_kept_in_file() {
            // Started in dry run: no state file, no restore records, no device settings. Written weights would
            // have no record a crash could be undone from.
            warn!(
                "reload: dry_run = false needs a restart; this agent started in dry run, without its state file, \
                 restore records and device settings, so it stays in dry run (a crash after writing weights would \
                 leave them with nothing to put them back from)"
            );
            cfg.dry_run = true;
        }
        let restart = self.cfg.needs_restart(&cfg);
        if !restart.is_empty() {
            // Named in the message itself: the one line an operator reads after `systemctl reload`.
            warn!(
                "reload: {} changed and need a restart to take effect (not applied); a reload applies only [mlfq], \
                 sample_interval, entry_sample_interval, entry_sample_for, cpu_budget and dry_run",
                restart.join(", ")
            );
        }
        if let Err(e) = self.engine.reconfigure(cfg.mlfq.clone(), now()) {
            error!(error = %e, "reload rejected; keeping the old configuration");
            return;
        }
        // Entering dry run puts the originals back first (and lifts every cap); the engine's new decisions follow.
        if cfg.dry_run && !self.cfg.dry_run {
            self.lift_all_caps().await;
        }
        self.reconciler.handle_reload(cfg.dry_run);
        self.cfg.mlfq = cfg.mlfq;
        self.cfg.sample_interval = cfg.sample_interval;
        self.cfg.entry_sample_interval = cfg.entry_sample_interval;
        self.cfg.entry_sample_for = cfg.entry_sample_for;
        self.cfg.cpu_budget = cfg.cpu_budget;
        self.pacer.reconfigure(cfg.sample_interval, cfg.cpu_budget);
        let leaving_dry_run = self.cfg.dry_run && !cfg.dry_run;
        self.cfg.dry_run = cfg.dry_run;
        if leaving_dry_run {
            self.reapply_caps().await;
        }
        info!(sample_interval = ?self.cfg.sample_interval, entry_sample_interval = ?self.cfg.entry_sample_interval,
              entry_sample_for = ?self.cfg.entry_sample_for, cpu_budget = ?self.cfg.cpu_budget,
              dry_run = self.cfg.dry_run, "configuration reloaded");
        self.apply_changes().await;
    }

    fn sd_notify(&self, state: &[sd_notify::NotifyState]) {
        if self.notify_systemd {
            let _ = sd_notify::notify(state);
        }
    }
}

async fn sleep_until_opt(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}
