//! The daemon loop: discover → sample → decide → apply → verify, generic over the backend traits.
//!
//! One task owns all state. It waits on: discovery events (a started container gets the top weight at once, without
//! waiting for a tick), the sampling tick, the engine's next deadline, control commands (reload, shutdown, status)
//! and status-socket requests. Nothing else mutates the state, so there are no locks.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use qos_core::{ContainerId, Engine, IoCounters, Policy, Reason, Weight, WeightChange};
use serde::Serialize;
use tokio::sync::{mpsc, oneshot};
use tracing::{debug, error, info, warn};

use crate::backend::{AppliedVia, WeightWriter};
use crate::backend::{BackendError, ContainerInfo, CounterSource, Discovery, DiscoveryError, DiscoveryEvent};
use crate::config::AgentConfig;
use crate::labels::policy_from_labels;
use crate::metrics::{ContainerLabels, Metrics, ReasonLabels};
use crate::pacing::{Pacer, Transition};
use crate::state::OriginalWeights;

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

/// One row of `ddiskqos-agent status`.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct StatusRow {
    /// Container id.
    pub id: String,
    /// Container name.
    pub name: String,
    /// `managed`, `pinned` or `excluded`.
    pub policy: String,
    /// Level, 1-based like the paper (empty when not managed).
    pub level: Option<usize>,
    /// The weight verified in the cgroup file, if the agent wrote one.
    pub weight: Option<u32>,
    /// Bytes counted at the current level.
    pub bytes_at_level: u64,
    /// Seconds at the current level.
    pub seconds_at_level: f64,
}

/// The status table.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct Status {
    /// How weights are applied now.
    pub actuator: String,
    /// Whether writes are suppressed.
    pub dry_run: bool,
    /// One row per container.
    pub containers: Vec<StatusRow>,
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

/// What the daemon knows of one container beyond the engine's view.
#[derive(Debug)]
struct Tracked {
    info: ContainerInfo,
    labels: ContainerLabels,
    /// This container's `container_bytes` series, kept so a sample does not look it up by its labels.
    bytes: prometheus_client::metrics::gauge::Gauge,
    /// The weight it had before the agent first wrote one (read at discovery, or from the state file).
    original: Option<Weight>,
    /// What the engine wants; `None` = leave/restore the original.
    desired: Option<Weight>,
    /// What was last verified in the cgroup file.
    applied: Option<Weight>,
    /// Last level-change decision not yet applied (kept for the log line once the write succeeds).
    pending: Option<WeightChange>,
    sample_error_logged: bool,
    /// Counters of the previous sample; an identical sample is not fed to the engine.
    last_counters: Option<IoCounters>,
    write_error_logged: bool,
}

/// Summary returned when the daemon stops.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Summary {
    /// Containers whose original weight was restored at shutdown.
    pub restored: usize,
    /// Restores that failed (logged).
    pub restore_failures: usize,
}

/// The agent's state and backends. Build with [`Daemon::new`], run with [`Daemon::run`].
#[derive(Debug)]
pub struct Daemon<D, C, W> {
    cfg: AgentConfig,
    /// Taken by [`Daemon::run`], which keeps it inside a stream (see there).
    discovery: Option<D>,
    counters: C,
    writer: W,
    engine: Engine,
    tracked: HashMap<ContainerId, Tracked>,
    originals: OriginalWeights,
    metrics: Arc<Metrics>,
    samples: Vec<(ContainerId, Result<IoCounters, BackendError>)>,
    actuator_label: String,
    notify_systemd: bool,
    /// Some container's desired weight is not applied (a write or an original read failed, or a weight must be
    /// written again): `retry_pending` scans only then, so an idle round costs nothing per container.
    retry_needed: bool,
    pacer: Pacer,
    cpu_clock: CpuClock,
}

/// The CPU time a round is charged with, read before and after it (default: the daemon thread's CPU time; the
/// daemon runs on a current-thread runtime, so that is all the work of the round).
#[derive(Clone)]
pub struct CpuClock(Arc<dyn Fn() -> Duration + Send + Sync>);

impl CpuClock {
    /// A clock from a function (tests: a fake one).
    pub fn new(f: impl Fn() -> Duration + Send + Sync + 'static) -> Self {
        Self(Arc::new(f))
    }

    /// `CLOCK_THREAD_CPUTIME_ID` of the calling thread.
    pub fn thread() -> Self {
        Self::new(|| {
            nix::time::clock_gettime(nix::time::ClockId::CLOCK_THREAD_CPUTIME_ID)
                .map(Duration::from)
                .unwrap_or_default()
        })
    }

    fn now(&self) -> Duration {
        (self.0)()
    }
}

impl std::fmt::Debug for CpuClock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CpuClock")
    }
}

fn now() -> Instant {
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
        let actuator_label = format!("{:?}", cfg.actuator).to_lowercase();
        let pacer = Pacer::new(cfg.sample_interval, cfg.cpu_budget);
        Ok(Self {
            pacer,
            cpu_clock: CpuClock::thread(),
            cfg,
            discovery: Some(discovery),
            counters,
            writer,
            engine,
            tracked: HashMap::new(),
            originals,
            metrics,
            samples: Vec::new(),
            actuator_label,
            notify_systemd: false,
            retry_needed: false,
        })
    }

    /// Charges rounds with CPU time from `clock` (default [`CpuClock::thread`]).
    pub fn with_cpu_clock(mut self, clock: CpuClock) -> Self {
        self.cpu_clock = clock;
        self
    }

    /// Sends READY/WATCHDOG/STOPPING to systemd (when run as a `Type=notify` service).
    pub fn with_systemd_notify(mut self, on: bool) -> Self {
        self.notify_systemd = on;
        self
    }

    /// Runs until [`Command::Shutdown`] (or the command channel closes), then restores every original weight.
    pub async fn run(mut self, mut commands: mpsc::Receiver<Command>) -> Result<Summary, DaemonError> {
        let mut discovery = self.discovery.take().expect("run consumes the daemon");
        let initial = discovery.start().await?;
        self.metrics.runtime_up.set(1);
        info!(containers = initial.len(), "discovered running containers");
        for c in initial {
            self.adopt(c).await;
        }
        self.apply_changes().await;
        self.reset_leftovers().await;
        self.sd_notify(&[sd_notify::NotifyState::Ready]);

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
        self.metrics.round_interval_seconds.set(self.pacer.period().as_secs_f64());
        loop {
            let deadline = self.engine.poll_timeout().map(tokio::time::Instant::from_std);
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
                Some(ev) = futures_util::StreamExt::next(&mut events) => self.on_event(ev?).await,
                _ = tokio::time::sleep_until(next_round) => {
                    let started = tokio::time::Instant::now();
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
        Ok(self.restore_all().await)
    }

    // ----- discovery -----

    async fn on_event(&mut self, ev: DiscoveryEvent) {
        match ev {
            DiscoveryEvent::Started(info) => {
                let id = info.id.clone();
                if let Some(tr) = self.tracked.get_mut(&id) {
                    tr.last_counters = None; // a restarted container's counters start again from zero
                    self.engine.handle_started(&id, now());
                } else {
                    self.track(info, true).await;
                }
                self.apply_changes().await;
            }
            DiscoveryEvent::Stopped(id) => self.forget(&id),
            DiscoveryEvent::Updated(id) => self.reverify(&id).await,
            DiscoveryEvent::Lost(why) => {
                warn!(reason = %why, "container runtime unreachable; keeping weights, retrying with backoff");
                self.metrics.runtime_up.set(0);
                self.metrics.runtime_outages.inc();
            }
            DiscoveryEvent::Resync(list) => {
                info!(containers = list.len(), "container runtime reachable again; resynchronising");
                self.metrics.runtime_up.set(1);
                let alive: std::collections::HashSet<ContainerId> = list.iter().map(|c| c.id.clone()).collect();
                let gone: Vec<ContainerId> = self.tracked.keys().filter(|id| !alive.contains(*id)).cloned().collect();
                self.forget_all(&gone);
                for c in list {
                    if self.tracked.contains_key(&c.id) {
                        self.reverify(&c.id).await;
                    } else {
                        self.adopt(c).await;
                    }
                }
                self.apply_changes().await;
            }
        }
    }

    async fn adopt(&mut self, info: ContainerInfo) {
        self.track(info, false).await;
    }

    /// Starts tracking a container: fresh ones count their I/O from zero, adopted ones from their first sample.
    async fn track(&mut self, info: ContainerInfo, fresh: bool) {
        let id = info.id.clone();
        let (policy, label_errors) = policy_from_labels(&info.labels);
        for e in label_errors {
            warn!(container = %id.short(), name = %info.name, error = %e, "bad policy label");
        }
        match self.counters.attach(&info).await {
            Ok(()) => {}
            Err(e) if e.is_vanished() => {
                // Exited between discovery and now (churn): its removal event follows; nothing to track.
                debug!(container = %id.short(), name = %info.name, error = %e, "container gone before it was tracked");
                return;
            }
            Err(e) => {
                warn!(container = %id.short(), name = %info.name, error = %e, "cannot sample this container's I/O")
            }
        }
        // The state file wins: after a crash the file holds our own stale demotion, not the original.
        let original = match self.originals.get(&id) {
            Some(w) => Some(w),
            None => match self.writer.read(&info).await {
                Ok(w) => Some(w),
                Err(e) => {
                    debug!(container = %id.short(), error = %e, "cannot read current weight");
                    None
                }
            },
        };
        let labels = ContainerLabels { id: id.short().to_string(), name: info.name.clone() };
        let bytes = self.metrics.bytes.get_or_create(&labels).clone();
        self.tracked.insert(
            id.clone(),
            Tracked {
                info,
                labels,
                bytes,
                original,
                desired: None,
                applied: None,
                pending: None,
                sample_error_logged: false,
                last_counters: None,
                write_error_logged: false,
            },
        );
        self.metrics.containers.set(self.tracked.len() as i64);
        let t = now();
        match policy {
            Policy::Managed if fresh => self.engine.handle_started(&id, t),
            _ => self.engine.set_policy(&id, policy, t),
        }
        if policy == Policy::Excluded && self.originals.get(&id).is_some() {
            // A previous agent changed it before it was excluded: put the original back, whatever the file holds.
            self.restore_original(&id, true).await;
        }
    }

    fn forget(&mut self, id: &ContainerId) {
        self.forget_all(std::slice::from_ref(id));
    }

    /// Drops containers that are gone, with one state-file save for all of them.
    fn forget_all(&mut self, ids: &[ContainerId]) {
        if ids.is_empty() {
            return;
        }
        let t = now();
        for id in ids {
            self.engine.handle_removed(id, t);
            self.counters.detach(id);
            if let Some(t) = self.tracked.remove(id) {
                self.metrics.forget(&t.labels);
                debug!(container = %id.short(), name = %t.info.name, "container gone");
            }
        }
        if let Err(e) = self.originals.forget_all(ids) {
            warn!(error = %e, "cannot update state file");
        }
        self.metrics.containers.set(self.tracked.len() as i64);
    }

    /// Someone may have changed the weight behind our back (e.g. `docker update`): check the file.
    async fn reverify(&mut self, id: &ContainerId) {
        let Some(t) = self.tracked.get(id) else { return };
        let Some(want) = t.applied else { return };
        match self.writer.read(&t.info).await {
            Ok(have) if have == want => {}
            Ok(have) => {
                warn!(container = %id.short(), name = %t.info.name, want = want.get(), have = have.get(),
                      "weight changed outside the agent; writing it again");
                if let Some(t) = self.tracked.get_mut(id) {
                    t.applied = None;
                }
                self.retry_needed = true;
                self.retry_pending().await;
            }
            Err(e) if e.is_vanished() => self.forget(id),
            Err(e) => debug!(container = %id.short(), error = %e, "cannot re-verify weight"),
        }
    }

    /// After a crash: containers a previous agent recorded but that no longer run are dropped from the state file.
    async fn reset_leftovers(&mut self) {
        let stale: Vec<ContainerId> =
            self.originals.ids().filter(|id| !self.tracked.contains_key(*id)).cloned().collect();
        let _ = self.originals.forget_all(&stale);
    }

    // ----- sampling and deciding -----

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
        let started = Instant::now();
        let mut samples = std::mem::take(&mut self.samples);
        samples.clear();
        self.counters.sample(&mut samples).await;
        let t = now();
        let mut vanished = Vec::new();
        for (id, result) in samples.drain(..) {
            match result {
                Ok(counters) => {
                    let Some(tr) = self.tracked.get_mut(&id) else { continue };
                    tr.sample_error_logged = false;
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
                    if let Some(tr) = self.tracked.get_mut(&id) {
                        if !tr.sample_error_logged {
                            tr.sample_error_logged = true;
                            warn!(container = %id.short(), name = %tr.info.name, error = %e,
                                  "cannot read I/O counters; skipping this container until they read again");
                        }
                    }
                }
            }
        }
        self.samples = samples;
        self.forget_all(&vanished);
        if self.engine.poll_timeout().is_some_and(|d| d <= t) {
            self.engine.handle_timeout(t);
        }
        self.apply_changes().await;
        self.retry_pending().await;
        self.metrics.round_seconds.observe(started.elapsed().as_secs_f64());
        self.sd_notify(&[sd_notify::NotifyState::Watchdog]);
    }

    // ----- applying -----

    async fn apply_changes(&mut self) {
        loop {
            let batch: Vec<WeightChange> = std::iter::from_fn(|| self.engine.poll_change()).collect();
            if batch.is_empty() {
                return;
            }
            let writes = batch.iter().filter(|c| c.reason != Reason::Released && c.weight.is_some());
            self.record_originals(writes.map(|c| c.id.clone()).collect());
            for change in batch {
                self.apply_change(change).await;
            }
        }
    }

    /// Puts the originals of containers about to be written on file, in one save (before any of the writes, so a
    /// SIGKILL in between still leaves them restorable).
    fn record_originals(&mut self, ids: Vec<ContainerId>) {
        if self.cfg.dry_run {
            return;
        }
        let known = ids.iter().filter_map(|id| Some((id, self.tracked.get(id)?.original?)));
        if let Err(e) = self.originals.record_all(known) {
            warn!(error = %e, "cannot record original weights; they may not be restorable after a crash");
        }
    }

    async fn apply_change(&mut self, change: WeightChange) {
        self.metrics.decisions.get_or_create(&ReasonLabels { reason: change.reason.as_str().into() }).inc();
        let Some(t) = self.tracked.get_mut(&change.id) else { return };
        if let Some(level) = change.new_level {
            self.metrics.level.get_or_create(&t.labels).set(level as i64);
        }
        if change.reason == Reason::Released {
            t.pending = Some(change.clone());
            self.release(&change.id).await;
            return;
        }
        t.desired = change.weight;
        t.pending = Some(change.clone());
        self.apply_one(&change.id).await;
    }

    /// Puts the original weight back if the agent wrote one.
    async fn release(&mut self, id: &ContainerId) {
        self.restore_original(id, false).await;
    }

    /// Writes the original weight back if the agent wrote one (or always, with `force`), then forgets it; a failed
    /// write keeps it wanted (retried every round) and on file.
    async fn restore_original(&mut self, id: &ContainerId, force: bool) {
        let Some(t) = self.tracked.get_mut(id) else { return };
        t.desired = t.original.filter(|_| force || t.applied.is_some());
        if t.desired.is_some() {
            self.apply_one(id).await;
        }
        if let Some(t) = self.tracked.get_mut(id) {
            if t.desired.is_some() && t.desired != t.applied {
                // The original did not go back: keep wanting it (retried every round) and keep it on file.
                t.applied = None;
                return;
            }
            t.applied = None;
            t.desired = None;
        }
        let _ = self.originals.forget(id);
    }

    async fn retry_pending(&mut self) {
        if !std::mem::take(&mut self.retry_needed) {
            return;
        }
        let ids: Vec<ContainerId> = self
            .tracked
            .iter()
            .filter(|(_, t)| t.desired.is_some() && t.desired != t.applied)
            .map(|(id, _)| id.clone())
            .collect();
        self.record_originals(ids.clone());
        for id in ids {
            self.apply_one(&id).await;
        }
    }

    /// Writes the desired weight if it differs from what is verified in the file; logs the decision once applied.
    async fn apply_one(&mut self, id: &ContainerId) {
        let Some(t) = self.tracked.get_mut(id) else { return };
        let Some(want) = t.desired else { return };
        let old = t.applied;
        if t.applied == Some(want) {
            log_decision(t, old, want, None, true);
            return;
        }
        if self.cfg.dry_run {
            log_decision(t, old, want, None, false);
            t.applied = Some(want);
            return;
        }
        if t.original.is_none() {
            // The read at discovery failed. A weight changed now could never be put back: read it first, and
            // write nothing until that works (retried every round, like a failed write).
            match self.writer.read(&self.tracked[id].info).await {
                Ok(w) => self.tracked.get_mut(id).expect("still tracked").original = Some(w),
                Err(e) if e.is_vanished() => return self.forget(id),
                Err(e) => {
                    return self.write_failed(
                        id,
                        want,
                        &e,
                        "cannot read the current weight, so it could not be \
                                                            restored: not changing it; will retry every round",
                    );
                }
            }
        }
        // Record the original before the first write, so even a SIGKILL right after leaves it on disk.
        if let Some(orig) = self.tracked.get(id).and_then(|t| t.original) {
            if let Err(e) = self.originals.record(id, orig) {
                warn!(error = %e, "cannot record original weight; it may not be restorable after a crash");
            }
        }
        match self.writer.write(&self.tracked[id].info, want).await {
            Ok(via) => {
                let t = self.tracked.get_mut(id).expect("still tracked");
                t.applied = Some(want);
                t.write_error_logged = false;
                self.metrics.weight.get_or_create(&t.labels).set(want.get().into());
                let label = via.as_str();
                if self.actuator_label != label {
                    self.actuator_label = label.into();
                }
                log_decision(t, old, want, Some(via), false);
            }
            Err(e) if e.is_vanished() => self.forget(id),
            Err(e) => self.write_failed(id, want, &e, "cannot apply weight; will retry every round"),
        }
    }

    /// A weight could not be applied: count it, retry next round, log once per container until a write works.
    fn write_failed(&mut self, id: &ContainerId, want: Weight, e: &BackendError, what: &str) {
        self.metrics.write_failures.inc();
        self.retry_needed = true;
        let Some(t) = self.tracked.get_mut(id) else { return };
        if !t.write_error_logged {
            t.write_error_logged = true;
            error!(container = %id.short(), name = %t.info.name, weight = want.get(), error = %e, "{what}");
        }
    }

    async fn restore_all(&mut self) -> Summary {
        let mut summary = Summary::default();
        let ids: Vec<ContainerId> = self.tracked.keys().cloned().collect();
        // Forgotten in one save at the end, not one save (a rewrite and an fsync of the whole file) per container;
        // an agent killed meanwhile finds them on file and restores them again, harmlessly.
        let mut done = Vec::new();
        for id in ids {
            let t = &self.tracked[&id];
            let (Some(orig), Some(applied)) = (t.original, t.applied) else { continue };
            if self.cfg.dry_run {
                continue;
            }
            if orig == applied {
                done.push(id.clone());
                summary.restored += 1;
                continue;
            }
            match self.writer.write(&t.info, orig).await {
                Ok(_) => {
                    info!(container = %id.short(), name = %t.info.name, weight = orig.get(), "original weight restored");
                    done.push(id.clone());
                    summary.restored += 1;
                }
                Err(e) if e.is_vanished() => {
                    done.push(id.clone());
                }
                Err(e) => {
                    error!(container = %id.short(), name = %t.info.name, error = %e, "cannot restore original weight");
                    summary.restore_failures += 1;
                }
            }
        }
        if let Err(e) = self.originals.forget_all(&done) {
            warn!(error = %e, "cannot update state file");
        }
        summary
    }

    // ----- control -----

    async fn reload(&mut self, cfg: AgentConfig) {
        let restart_needed = cfg.runtime != self.cfg.runtime
            || cfg.docker != self.cfg.docker
            || cfg.cgroup != self.cfg.cgroup
            || cfg.metrics != self.cfg.metrics
            || cfg.control_socket != self.cfg.control_socket
            || cfg.state_file != self.cfg.state_file
            || cfg.actuator != self.cfg.actuator;
        if restart_needed {
            warn!(
                "reload: runtime, docker, cgroup, metrics, actuator, socket and state-file settings need a restart; \
                   applying only mlfq, sample_interval, cpu_budget and dry_run"
            );
        }
        if let Err(e) = self.engine.reconfigure(cfg.mlfq.clone(), now()) {
            error!(error = %e, "reload rejected; keeping the old configuration");
            return;
        }
        let was_dry_run = self.cfg.dry_run;
        if cfg.dry_run && !was_dry_run {
            // Nothing is written from now on, so nothing could be restored at shutdown: put the originals back now.
            self.restore_all().await;
        }
        if cfg.dry_run != was_dry_run {
            // Dry-run "applied" weights were never written, and restored ones are no longer in force: forget both
            // so the next round writes (or, in dry run, decides) every container's weight afresh.
            for t in self.tracked.values_mut() {
                t.applied = None;
            }
            self.retry_needed = true;
        }
        self.cfg.mlfq = cfg.mlfq;
        self.cfg.sample_interval = cfg.sample_interval;
        self.cfg.cpu_budget = cfg.cpu_budget;
        self.pacer.reconfigure(cfg.sample_interval, cfg.cpu_budget);
        self.cfg.dry_run = cfg.dry_run;
        info!(sample_interval = ?self.cfg.sample_interval, cpu_budget = ?self.cfg.cpu_budget, dry_run = self.cfg.dry_run,
              "configuration reloaded");
    }

    fn status(&self) -> Status {
        let t = now();
        let mut rows: Vec<StatusRow> = self
            .tracked
            .iter()
            .map(|(id, tr)| {
                let v = self.engine.container(id, t);
                let (policy, level) = match v.as_ref().map(|v| (v.policy, v.level)) {
                    Some((Policy::Managed, l)) => ("managed", Some(l + 1)),
                    Some((Policy::Pinned(_), _)) => ("pinned", None),
                    _ => ("excluded", None),
                };
                StatusRow {
                    id: id.short().to_string(),
                    name: tr.info.name.clone(),
                    policy: policy.into(),
                    level,
                    weight: tr.applied.map(Weight::get),
                    bytes_at_level: v.as_ref().map_or(0, |v| v.bytes_at_level),
                    seconds_at_level: v.as_ref().map_or(0.0, |v| v.time_at_level.as_secs_f64()),
                }
            })
            .collect();
        rows.sort_by(|a, b| a.name.cmp(&b.name).then(a.id.cmp(&b.id)));
        Status { actuator: self.actuator_label.clone(), dry_run: self.cfg.dry_run, containers: rows }
    }

    fn sd_notify(&self, state: &[sd_notify::NotifyState]) {
        if self.notify_systemd {
            let _ = sd_notify::notify(state);
        }
    }
}

fn log_decision(t: &mut Tracked, old: Option<Weight>, weight: Weight, via: Option<AppliedVia>, unchanged: bool) {
    let Some(c) = t.pending.take() else { return };
    let via = match via {
        Some(via) => via.as_str(),
        None if unchanged => "unchanged",
        None => "dry-run",
    };
    info!(
        container = %c.id.short(),
        name = %t.info.name,
        reason = c.reason.as_str(),
        old_level = c.old_level.map(|l| l + 1),
        new_level = c.new_level.map(|l| l + 1),
        old_weight = old.or(t.original).map(Weight::get),
        weight = weight.get(),
        bytes = c.bytes_at_old_level,
        via,
        "weight decision"
    );
}

async fn sleep_until_opt(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}
