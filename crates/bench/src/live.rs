//! The engine, live: `qos_core::Engine` fed with real cgroup counters on a sampling thread, its decisions written
//! to real `blkio.bfq.weight` files and verified by reading them back.
//!
//! This is the agent's loop (collection → calculation → proceeding) cut to what the bench needs:
//! - [`LiveEngine::add`] is the "container started" event: the engine puts the new cgroup at the top and the
//!   weight is written *before* `add` returns, so the reader starts its I/O at weight 1000, as the paper's new
//!   containers do;
//! - [`LiveEngine::adopt`] takes a cgroup that already ran (the background): its current counters are the
//!   baseline, it starts at the top and the engine demotes it from what it reads next;
//! - [`LiveEngine::set_active`] gates the actuator. The engine samples and decides during the whole BFQ mode, so
//!   its timers (the starvation boost of the background every `boost_after`) follow the wall clock as in a long
//!   deployment; weights are only written during the dDiskQoS blocks, and every weight is put back to BFQ's
//!   default (100) for the Alone and Original blocks.
//!
//! `add` must be synchronous (the weight must be in place before the first I/O), so the set of cgroups is passed
//! by calls rather than through a watch channel.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use qos_core::{Config, ContainerId, Engine, Weight};
use serde::Serialize;

use crate::cgroups::CgroupBackend;

/// At most this many weight events are kept in [`LiveStats::events`].
const MAX_EVENTS: usize = 200_000;

/// Tuning of the live loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct LiveOptions {
    /// How often every cgroup's counters are read.
    #[serde(serialize_with = "crate::report::json::ser_ms")]
    pub sample_interval: Duration,
}

/// One decision of the engine and what became of it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WeightEvent {
    /// Milliseconds since the engine started.
    pub t_ms: f64,
    /// The cgroup (container) id.
    pub id: String,
    /// Weight decided (`None`: release to the default).
    pub weight: Option<u64>,
    /// Level after the change.
    pub level: Option<usize>,
    /// Why: the engine's reason, or `actuator-on`/`actuator-off` when a dDiskQoS block starts or ends.
    pub reason: &'static str,
    /// Whether it was written (only while active).
    pub applied: bool,
    /// The weight read back from the cgroup file after writing.
    pub read_back: Option<u64>,
}

/// What the live loop did.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct LiveStats {
    /// Sampling rounds.
    pub rounds: u64,
    /// Counter files read.
    pub counter_reads: u64,
    /// Counter reads that failed (other than a cgroup that vanished).
    pub counter_errors: u64,
    /// Weight writes verified by read-back.
    pub verified_writes: u64,
    /// Weight writes that failed or did not read back.
    pub write_errors: u64,
    /// Verified writes per weight value.
    pub writes_by_weight: BTreeMap<u64, u64>,
    /// Mean time of one sampling round (all cgroups), microseconds.
    pub mean_round_us: f64,
    /// Longest sampling round, microseconds.
    pub max_round_us: f64,
    /// Every decision (capped).
    pub events: Vec<WeightEvent>,
    /// The last error, for the report.
    pub last_error: Option<String>,
}

#[derive(Debug)]
struct State {
    engine: Engine,
    members: BTreeMap<ContainerId, PathBuf>,
    active: bool,
    stats: LiveStats,
    total_round: Duration,
    t0: Instant,
}

#[derive(Debug)]
struct Shared {
    state: Mutex<State>,
    stop: Mutex<bool>,
    wake: Condvar,
    backend: Arc<dyn CgroupBackend>,
    opts: LiveOptions,
}

/// A running live engine. Stop it with [`LiveEngine::stop`] (dropping it stops it too, without the stats).
#[derive(Debug)]
pub struct LiveEngine {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl LiveEngine {
    /// Starts the sampling thread with an engine built from `config`. Inactive until [`LiveEngine::set_active`].
    pub fn start(config: Config, opts: LiveOptions, backend: Arc<dyn CgroupBackend>) -> Result<Self> {
        let now = Instant::now();
        let engine = Engine::new(config, now).context("invalid engine config")?;
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                engine,
                members: BTreeMap::new(),
                active: false,
                stats: LiveStats::default(),
                total_round: Duration::ZERO,
                t0: now,
            }),
            stop: Mutex::new(false),
            wake: Condvar::new(),
            backend,
            opts,
        });
        let s = shared.clone();
        let thread = std::thread::Builder::new().name("live-engine".into()).spawn(move || sampler(&s))?;
        Ok(Self { shared, thread: Some(thread) })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.shared.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A new container: enters the top level now; its weight is written before this returns (if active).
    pub fn add(&self, id: &ContainerId, dir: &Path) -> Result<()> {
        let mut st = self.lock();
        st.members.insert(id.clone(), dir.to_path_buf());
        st.engine.handle_started(id, Instant::now());
        apply_changes(&mut st, &*self.shared.backend, true)
    }

    /// A container that already ran: its counters now are the baseline; it enters the top level.
    pub fn adopt(&self, id: &ContainerId, dir: &Path) -> Result<()> {
        let counters = self.shared.backend.read_counters(dir)?;
        let mut st = self.lock();
        st.members.insert(id.clone(), dir.to_path_buf());
        st.engine.handle_sample(id, counters, Instant::now());
        apply_changes(&mut st, &*self.shared.backend, true)
    }

    /// The container is gone (or leaves the experiment).
    pub fn remove(&self, id: &ContainerId) {
        let mut st = self.lock();
        if let Some(dir) = st.members.remove(id) {
            self.shared.backend.forget(&dir);
        }
        st.engine.handle_removed(id, Instant::now());
    }

    /// Gates the actuator: active writes the engine's weights (all of them, now), inactive writes the default.
    pub fn set_active(&self, active: bool) -> Result<()> {
        let mut st = self.lock();
        st.active = active;
        let now = Instant::now();
        let targets: Vec<(ContainerId, PathBuf, Option<Weight>)> = st
            .members
            .iter()
            .map(|(id, dir)| (id.clone(), dir.clone(), st.engine.container(id, now).and_then(|v| v.weight)))
            .collect();
        let default = Weight::KERNEL_DEFAULT;
        let t_ms = st.t0.elapsed().as_secs_f64() * 1e3;
        for (id, dir, weight) in targets {
            let w = if active { weight.unwrap_or(default) } else { default };
            self.shared.backend.write_weight_verified(&dir, w).with_context(|| format!("setting weight of {id}"))?;
            record_write(&mut st.stats, w);
            if st.stats.events.len() < MAX_EVENTS {
                st.stats.events.push(WeightEvent {
                    t_ms,
                    id: id.to_string(),
                    weight: Some(u64::from(w.to_bfq())),
                    level: None,
                    reason: if active { "actuator-on" } else { "actuator-off" },
                    applied: true,
                    read_back: Some(u64::from(w.to_bfq())),
                });
            }
        }
        Ok(())
    }

    /// Current level and weight of a container, as the engine sees it.
    pub fn view(&self, id: &ContainerId) -> Option<(usize, Option<Weight>)> {
        self.lock().engine.container(id, Instant::now()).map(|v| (v.level, v.weight))
    }

    /// Index of the bottom level.
    pub fn bottom(&self) -> usize {
        self.lock().engine.config().bottom()
    }

    /// Stops sampling, puts every remaining cgroup back to the default weight, returns the statistics.
    pub fn stop(mut self) -> LiveStats {
        self.halt();
        let mut st = self.lock();
        st.active = false;
        let default = Weight::KERNEL_DEFAULT;
        let dirs: Vec<PathBuf> = st.members.values().cloned().collect();
        for dir in dirs {
            if self.shared.backend.write_weight(&dir, default).is_ok() {
                record_write(&mut st.stats, default);
            }
        }
        let rounds = st.stats.rounds.max(1) as f64;
        st.stats.mean_round_us = st.total_round.as_secs_f64() * 1e6 / rounds;
        std::mem::take(&mut st.stats)
    }

    fn halt(&mut self) {
        *self.shared.stop.lock().unwrap_or_else(|p| p.into_inner()) = true;
        self.shared.wake.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for LiveEngine {
    fn drop(&mut self) {
        self.halt();
    }
}

fn record_write(stats: &mut LiveStats, w: Weight) {
    stats.verified_writes += 1;
    *stats.writes_by_weight.entry(u64::from(w.to_bfq())).or_default() += 1;
}

/// Drains the engine's decisions; writes them (verified) while active. With `strict`, a failed write is returned.
fn apply_changes(st: &mut State, backend: &dyn CgroupBackend, strict: bool) -> Result<()> {
    let mut first_err = None;
    while let Some(change) = st.engine.poll_change() {
        let dir = st.members.get(&change.id).cloned();
        let mut event = WeightEvent {
            t_ms: st.t0.elapsed().as_secs_f64() * 1e3,
            id: change.id.to_string(),
            weight: change.weight.map(|w| u64::from(w.to_bfq())),
            level: change.new_level,
            reason: change.reason.as_str(),
            applied: false,
            read_back: None,
        };
        if let (true, Some(dir)) = (st.active, dir) {
            let w = change.weight.unwrap_or(Weight::KERNEL_DEFAULT);
            match backend.write_weight_verified(&dir, w) {
                Ok(()) => {
                    event.applied = true;
                    event.read_back = Some(u64::from(w.to_bfq()));
                    record_write(&mut st.stats, w);
                }
                Err(e) if !dir.exists() => tracing::debug!(id = %change.id, "cgroup vanished before write: {e:#}"),
                Err(e) => {
                    st.stats.write_errors += 1;
                    st.stats.last_error = Some(format!("{e:#}"));
                    if first_err.is_none() {
                        first_err = Some(e);
                    }
                }
            }
        }
        if st.stats.events.len() < MAX_EVENTS {
            st.stats.events.push(event);
        }
    }
    match first_err {
        Some(e) if strict => Err(e),
        _ => Ok(()),
    }
}

fn sampler(shared: &Shared) {
    let interval = shared.opts.sample_interval;
    let mut next_sample = Instant::now() + interval;
    loop {
        let deadline = {
            let st = shared.state.lock().unwrap_or_else(|p| p.into_inner());
            st.engine.poll_timeout().map_or(next_sample, |t| t.min(next_sample))
        };
        {
            let stop = shared.stop.lock().unwrap_or_else(|p| p.into_inner());
            let wait = deadline.saturating_duration_since(Instant::now());
            let (stop, _) = shared.wake.wait_timeout_while(stop, wait, |s| !*s).unwrap_or_else(|p| p.into_inner());
            if *stop {
                return;
            }
        }
        let mut st = shared.state.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        if now >= next_sample {
            // `now` is the round's start: the engine's sample time and the origin of the round's duration.
            let State { engine, members, stats, .. } = &mut *st;
            let mut vanished: Vec<ContainerId> = Vec::new();
            for (id, dir) in members.iter() {
                stats.counter_reads += 1;
                match shared.backend.read_counters(dir) {
                    Ok(c) => engine.handle_sample(id, c, now),
                    Err(_) if !dir.exists() => {
                        shared.backend.forget(dir);
                        engine.handle_removed(id, now);
                        vanished.push(id.clone());
                    }
                    Err(e) => {
                        stats.counter_errors += 1;
                        stats.last_error = Some(format!("{e:#}"));
                    }
                }
            }
            for id in &vanished {
                members.remove(id);
            }
            let took = now.elapsed();
            st.stats.rounds += 1;
            st.total_round += took;
            st.stats.max_round_us = st.stats.max_round_us.max(took.as_secs_f64() * 1e6);
            next_sample = if next_sample + interval > now { next_sample + interval } else { now + interval };
        }
        if st.engine.poll_timeout().is_some_and(|t| t <= now) {
            st.engine.handle_timeout(now);
        }
        let _ = apply_changes(&mut st, &*shared.backend, false);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use qos_core::IoCounters;
    use std::sync::Mutex as StdMutex;

    /// In-memory cgroups: counters set by the test, weights recorded.
    #[derive(Debug, Default)]
    struct Fake {
        counters: StdMutex<BTreeMap<PathBuf, IoCounters>>,
        weights: StdMutex<BTreeMap<PathBuf, u64>>,
    }

    impl CgroupBackend for Fake {
        fn read_counters(&self, dir: &Path) -> Result<IoCounters> {
            Ok(self.counters.lock().unwrap().get(dir).copied().unwrap_or_default())
        }
        fn read_weight(&self, dir: &Path) -> Result<u64> {
            Ok(self.weights.lock().unwrap().get(dir).copied().unwrap_or(100))
        }
        fn write_weight(&self, dir: &Path, w: Weight) -> Result<()> {
            self.weights.lock().unwrap().insert(dir.to_path_buf(), u64::from(w.to_bfq()));
            Ok(())
        }
    }

    fn opts() -> LiveOptions {
        LiveOptions { sample_interval: Duration::from_millis(5) }
    }

    fn wait_until(mut f: impl FnMut() -> bool) {
        let start = Instant::now();
        while !f() {
            assert!(start.elapsed() < Duration::from_secs(5), "condition not reached");
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    #[test]
    fn new_container_gets_top_weight_before_add_returns_and_heavy_one_sinks() {
        let fake = Arc::new(Fake::default());
        let live = LiveEngine::start(Config::default(), opts(), fake.clone()).unwrap();
        live.set_active(true).unwrap();
        let (bg, fg) = (PathBuf::from("/bg"), PathBuf::from("/fg"));
        fake.counters.lock().unwrap().insert(bg.clone(), IoCounters::new(10 << 30, 0));
        live.adopt(&ContainerId::new("bg"), &bg).unwrap();
        assert_eq!(fake.read_weight(&bg).unwrap(), 1000, "adopted containers start at the top");
        live.add(&ContainerId::new("fg"), &fg).unwrap();
        assert_eq!(fake.read_weight(&fg).unwrap(), 1000);
        // The background streams: 1 GiB more.
        fake.counters.lock().unwrap().insert(bg.clone(), IoCounters::new(11 << 30, 0));
        wait_until(|| fake.read_weight(&bg).unwrap() == 10);
        assert_eq!(live.view(&ContainerId::new("bg")).unwrap().0, live.bottom());
        assert_eq!(fake.read_weight(&fg).unwrap(), 1000, "an idle new container stays on top");
        let stats = live.stop();
        assert_eq!(fake.read_weight(&bg).unwrap(), 100, "stop restores the default");
        assert!(stats.rounds > 0 && stats.verified_writes >= 3);
        assert!(stats.events.iter().any(|e| e.id == "bg" && e.weight == Some(10) && e.applied));
    }

    #[test]
    fn inactive_engine_decides_but_writes_only_defaults() {
        let fake = Arc::new(Fake::default());
        let live = LiveEngine::start(Config::default(), opts(), fake.clone()).unwrap();
        let bg = PathBuf::from("/bg");
        live.adopt(&ContainerId::new("bg"), &bg).unwrap();
        fake.counters.lock().unwrap().insert(bg.clone(), IoCounters::new(1 << 30, 0));
        wait_until(|| live.view(&ContainerId::new("bg")).unwrap().0 == 3);
        assert!(!fake.weights.lock().unwrap().contains_key(&bg), "no write while inactive");
        live.set_active(true).unwrap();
        assert_eq!(fake.read_weight(&bg).unwrap(), 10);
        live.set_active(false).unwrap();
        assert_eq!(fake.read_weight(&bg).unwrap(), 100);
        live.remove(&ContainerId::new("bg"));
        assert!(live.view(&ContainerId::new("bg")).is_none());
    }
}
