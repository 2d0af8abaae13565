//! Random runs: generated operation sequences, and `Run`, a driver that applies them to an engine (and optionally
//! to the model), checks the invariants after every input and records everything for comparison.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use proptest::prelude::*;
use qos_core::{ByteSize, Config, ContainerId, CountMode, Engine, IoCounters, LevelConfig, Policy, Reason, Weight};
use qos_core::{WeightChange, MAX_LEVELS};

use crate::common::{mib, t0};
use crate::model::Model;

/// Containers `0..BUSY` do I/O; `BUSY..IDS` are quiet: their counters never move and they are never announced
/// with `handle_started` (which would count their constant counters as I/O done since zero).
pub const BUSY: usize = 4;
pub const IDS: usize = 6;

pub fn container(i: usize) -> ContainerId {
    ContainerId::new(format!("c{i}"))
}

/// How a sample's counters relate to the previous ones.
#[derive(Debug, Clone, Copy)]
pub enum Step {
    /// Counters advance by this much (saturating at u64::MAX).
    Add(u64, u64),
    /// Counters take these values: a reset when lower, a jump when higher.
    Set(u64, u64),
    /// Counters unchanged.
    Same,
}

#[derive(Debug, Clone)]
pub enum Op {
    Start(usize),
    Sample(usize, Step),
    Remove(usize),
    SetPolicy(usize, Policy),
    /// The clock moves forward by this much (possibly zero); timers fire as the driver says.
    Advance(Duration),
    /// The clock moves backwards by this much (only in the chaos run).
    Rewind(Duration),
    Reconfigure(Config),
}

/// A generated run.
#[derive(Debug, Clone)]
pub struct Scenario {
    pub config: Config,
    /// Constant counters of the quiet containers.
    pub quiet: [IoCounters; IDS - BUSY],
    pub ops: Vec<Op>,
}

fn weight() -> impl Strategy<Value = Weight> {
    (1u64..=1000).prop_map(|v| Weight::new(v).unwrap())
}

fn millis(range: std::ops::RangeInclusive<u64>) -> impl Strategy<Value = Duration> {
    range.prop_map(Duration::from_millis)
}

/// Any valid config with 1..=5 levels and timers short enough for a run to see many of them fire.
pub fn valid_config() -> impl Strategy<Value = Config> {
    let levels = prop::collection::vec((weight(), 1u64..=mib(16)), 1..=5).prop_map(|mut levels| {
        levels.sort_by_key(|l| std::cmp::Reverse(l.0));
        let mut sum = 0;
        levels
            .into_iter()
            .map(|(weight, step)| {
                sum += step;
                LevelConfig { weight, threshold: ByteSize(sum) }
            })
            .collect::<Vec<_>>()
    });
    let count = prop_oneof![Just(CountMode::Both), Just(CountMode::Read), Just(CountMode::Write)];
    (
        levels,
        count,
        millis(200..=30_000),
        prop::option::weighted(0.7, millis(100..=20_000)),
        prop::option::weighted(0.2, millis(500..=60_000)),
        (prop::option::weighted(0.7, millis(100..=5_000)), 1u8..=100),
        (prop::option::weighted(0.7, millis(100..=3_000)), 50u8..=99),
    )
        .prop_map(
            |(
                levels,
                count,
                boost_after,
                idle_promote_after,
                boost_all_every,
                (share_window, share_floor_percent),
                (bottom_cap_window, bottom_cap_percent),
            )| {
                Config {
                    levels,
                    count,
                    boost_after,
                    idle_promote_after,
                    boost_all_every,
                    share_window,
                    share_floor_percent,
                    bottom_cap_window,
                    bottom_cap_percent,
                }
            },
        )
}

/// A config that validation must refuse.
fn invalid_config() -> impl Strategy<Value = Config> {
    prop_oneof![
        Just(Config { levels: vec![], ..Config::default() }),
        Just(Config { boost_after: Duration::ZERO, ..Config::default() }),
        Just(Config { idle_promote_after: Some(Duration::ZERO), ..Config::default() }),
        Just(Config {
            levels: vec![Config::default().levels[1].clone(), Config::default().levels[0].clone()],
            ..Config::default()
        }),
        Just(Config { levels: vec![Config::default().levels[0].clone(); MAX_LEVELS + 1], ..Config::default() }),
    ]
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        6 => (0..mib(4), 0..mib(1)).prop_map(|(r, w)| Step::Add(r, w)),
        2 => (0..mib(64), 0..mib(64)).prop_map(|(r, w)| Step::Add(r, w)),
        1 => (0..mib(8), 0..mib(8)).prop_map(|(r, w)| Step::Set(r, w)),
        1 => (any::<u64>(), any::<u64>()).prop_map(|(r, w)| Step::Set(r, w)),
        1 => Just(Step::Set(u64::MAX, u64::MAX)),
        1 => Just(Step::Add(u64::MAX, u64::MAX)),
        2 => Just(Step::Same),
    ]
}

fn policy() -> impl Strategy<Value = Policy> {
    prop_oneof![Just(Policy::Managed), weight().prop_map(Policy::Pinned), Just(Policy::Excluded)]
}

fn advance() -> impl Strategy<Value = Duration> {
    prop_oneof![
        3 => Just(Duration::ZERO),
        6 => millis(1..=1_000),
        3 => millis(1_000..=15_000),
        1 => millis(15_000..=60_000),
    ]
}

fn op(rewind: bool) -> BoxedStrategy<Op> {
    let ops = prop_oneof![
        3 => (0..IDS).prop_map(Op::Start),
        12 => (0..IDS, step()).prop_map(|(i, s)| Op::Sample(i, s)),
        1 => (0..IDS).prop_map(Op::Remove),
        2 => (0..IDS, policy()).prop_map(|(i, p)| Op::SetPolicy(i, p)),
        8 => advance().prop_map(Op::Advance),
        1 => prop_oneof![4 => valid_config(), 1 => invalid_config()].prop_map(Op::Reconfigure),
    ];
    if rewind {
        prop_oneof![14 => ops, 1 => millis(0..=20_000).prop_map(Op::Rewind)].boxed()
    } else {
        ops.boxed()
    }
}

fn quiet_counters() -> impl Strategy<Value = IoCounters> {
    prop_oneof![
        Just(IoCounters::new(0, 0)),
        Just(IoCounters::new(u64::MAX, u64::MAX)),
        (any::<u64>(), any::<u64>()).prop_map(|(r, w)| IoCounters::new(r, w)),
    ]
}

/// A run of up to `max_ops` operations; `rewind` lets the clock go backwards too.
pub fn scenario(max_ops: usize, rewind: bool) -> impl Strategy<Value = Scenario> {
    let config = prop_oneof![1 => Just(Config::default()), 3 => valid_config()];
    (config, [quiet_counters(), quiet_counters()], prop::collection::vec(op(rewind), 1..=max_ops))
        .prop_map(|(config, quiet, ops)| Scenario { config, quiet, ops })
}

/// When the driver calls `handle_timeout`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Timers {
    /// At every `poll_timeout()` as the clock passes it.
    AtPollTimeout,
    /// At every multiple of this sampling interval since the start, and never otherwise.
    EveryTick(Duration),
}

/// What the driver knows about one container from the changes alone.
#[derive(Debug, Clone, Default)]
struct Observed {
    /// Managed level, from the last change.
    level: Option<usize>,
    /// When it left the top level, and the longest `boost_after` in force since.
    below_top: Option<(Instant, Duration)>,
}

/// One entry of a run's record, for comparing runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record {
    Change(Duration, WeightChange),
    Timeout(Option<Duration>),
}

/// Applies a scenario to an engine and checks, after every input:
/// - every weight emitted is the weight of the change's level in the config in force, the requested pin, or
///   `None` for a release;
/// - quiet containers are never demoted and count nothing;
/// - no managed container stays below the top longer than `boost_after` (plus one tick for `EveryTick`);
/// - with a model: the same changes, the same views, and `poll_timeout()` no later than the model's deadline.
#[derive(Debug, Clone)]
pub struct Run {
    pub engine: Engine,
    model: Option<Model>,
    timers: Timers,
    /// Chaos mode (clock may go backwards): only checks what must hold whatever the clock does.
    chaos: bool,
    start: Instant,
    now: Instant,
    quiet: [IoCounters; IDS - BUSY],
    counters: [IoCounters; IDS],
    pins: BTreeMap<ContainerId, Weight>,
    observed: BTreeMap<ContainerId, Observed>,
    /// The caps the engine's outputs set and have not lifted.
    capped: BTreeMap<ContainerId, qos_core::Cap>,
    pub record: Vec<Record>,
}

impl Run {
    pub fn new(scenario: &Scenario, timers: Timers, with_model: bool, chaos: bool) -> Self {
        // Far from the clock's origin, so rewinding never underflows.
        let start = t0() + Duration::from_secs(86_400);
        let engine = Engine::new(scenario.config.clone(), start).expect("generated configs are valid");
        Self {
            engine,
            model: with_model.then(|| Model::new(scenario.config.clone(), start)),
            timers,
            chaos,
            start,
            now: start,
            quiet: scenario.quiet,
            counters: [IoCounters::default(); IDS],
            pins: BTreeMap::new(),
            observed: BTreeMap::new(),
            capped: BTreeMap::new(),
            record: Vec::new(),
        }
    }

    /// Runs the whole scenario (checks panic with a message on the first violation).
    pub fn run(scenario: &Scenario, timers: Timers, with_model: bool, chaos: bool) -> Vec<Record> {
        let mut run = Self::new(scenario, timers, with_model, chaos);
        for op in &scenario.ops {
            run.apply(op);
        }
        run.record
    }

    pub fn apply(&mut self, op: &Op) {
        let now = self.now;
        match *op {
            Op::Start(i) if i >= BUSY => self.apply(&Op::Sample(i, Step::Same)),
            Op::Start(i) => {
                self.counters[i] = IoCounters::default();
                self.engine.handle_started(&container(i), now);
                self.model(|m| m.started(&container(i), now));
                self.after_input();
            }
            Op::Sample(i, step) => {
                let c = &mut self.counters[i];
                *c = if i >= BUSY {
                    self.quiet[i - BUSY]
                } else {
                    match step {
                        Step::Add(r, w) => IoCounters::new(c.read.saturating_add(r), c.write.saturating_add(w)),
                        Step::Set(r, w) => IoCounters::new(r, w),
                        Step::Same => *c,
                    }
                };
                let counters = *c;
                self.engine.handle_sample(&container(i), counters, now);
                self.model(|m| m.sample(&container(i), counters, now));
                self.after_input();
            }
            Op::Remove(i) => {
                self.engine.handle_removed(&container(i), now);
                self.model(|m| m.removed(&container(i)));
                self.observed.remove(&container(i));
                self.after_input();
            }
            Op::SetPolicy(i, policy) => {
                if let Policy::Pinned(w) = policy {
                    self.pins.insert(container(i), w);
                }
                self.engine.set_policy(&container(i), policy, now);
                self.model(|m| m.set_policy(&container(i), policy, now));
                self.after_input();
            }
            Op::Advance(dt) => self.advance_to(now + dt),
            Op::Rewind(dt) => {
                assert!(self.chaos, "rewind only in chaos runs");
                self.now = now.checked_sub(dt).unwrap_or(now).max(self.start);
                // The driver's habit: handle_timeout whenever the engine asked for a time not after the clock.
                if self.engine.poll_timeout().is_some_and(|d| d <= self.now) {
                    self.engine.handle_timeout(self.now);
                    self.after_input();
                }
            }
            Op::Reconfigure(ref config) => {
                let result = self.engine.reconfigure(config.clone(), now);
                assert_eq!(result.is_ok(), config.validate().is_ok(), "reconfigure validates");
                if result.is_ok() {
                    for o in self.observed.values_mut() {
                        if let Some((_, bound)) = &mut o.below_top {
                            *bound = (*bound).max(config.boost_after);
                        }
                    }
                } else {
                    assert_ne!(self.engine.config(), config, "a refused config is not applied");
                }
                let model_result = self.model.as_mut().map(|m| m.reconfigure(config.clone(), now));
                if let Some(m) = model_result {
                    assert_eq!(m.is_ok(), result.is_ok());
                }
                self.after_input();
            }
        }
    }

    fn model(&mut self, f: impl FnOnce(&mut Model)) {
        if let Some(m) = self.model.as_mut() {
            f(m);
        }
    }

    fn advance_to(&mut self, target: Instant) {
        match self.timers {
            Timers::AtPollTimeout => {
                let mut fired = 0;
                while let Some(due) = self.engine.poll_timeout().filter(|d| *d <= target) {
                    self.now = due.max(self.now);
                    self.engine.handle_timeout(self.now);
                    let now = self.now;
                    self.model(|m| m.timeout(now));
                    self.after_input();
                    fired += 1;
                    assert!(fired < 100_000, "poll_timeout() does not move forward: {due:?}");
                }
            }
            Timers::EveryTick(tick) => {
                let tick_nanos = tick.as_nanos();
                let since = (self.now - self.start).as_nanos();
                let mut k = since / tick_nanos + 1;
                loop {
                    let at = self.start + Duration::from_nanos((k * tick_nanos) as u64);
                    if at > target {
                        break;
                    }
                    self.now = at;
                    self.engine.handle_timeout(at);
                    self.model(|m| m.timeout(at));
                    self.after_input();
                    k += 1;
                }
            }
        }
        self.now = target;
        self.check_starvation_bound();
        self.record.push(Record::Timeout(self.engine.poll_timeout().map(|d| d.saturating_duration_since(self.start))));
    }

    /// Drains the changes and checks everything that must hold after an input.
    fn after_input(&mut self) {
        let now = self.now;
        let changes: Vec<WeightChange> = std::iter::from_fn(|| self.engine.poll_change()).collect();
        let config = self.engine.config().clone();
        for c in &changes {
            self.check_weight(c, &config);
            let quiet = (BUSY..IDS).any(|i| container(i) == c.id);
            if quiet {
                assert_ne!(c.reason, Reason::Demoted, "a container without I/O was demoted: {c:?}");
                if let (Some(a), Some(b)) = (c.old_level, c.new_level) {
                    assert!(b <= a, "a container without I/O went down: {c:?}");
                }
            }
            let o = self.observed.entry(c.id.clone()).or_default();
            o.level = c.new_level;
            match c.new_level {
                Some(l) if l > 0 => {
                    o.below_top.get_or_insert((now, config.boost_after));
                }
                _ => o.below_top = None,
            }
            self.record.push(Record::Change(now.saturating_duration_since(self.start), c.clone()));
        }
        for i in BUSY..IDS {
            if let Some(view) = self.engine.container(&container(i), now) {
                assert_eq!((view.total_bytes, view.bytes_at_level), (0, 0), "quiet container counted I/O");
            }
        }
        if !self.chaos {
            self.check_starvation_bound();
        }
        self.check_caps(now, &config);
        // A container that used up its top allotment leaves no other cap in force (`lift_other_caps`).
        let left_top = changes.iter().find(|c| c.reason == Reason::Demoted && c.old_level == Some(0));
        if let Some(leaver) = left_top {
            for view in self.engine.containers(now).filter(|v| v.id != leaver.id) {
                assert_eq!(view.cap, None, "a cap left in force as {} left the top: {view:?}", leaver.id);
            }
        }
        if let Some(model) = self.model.as_mut() {
            let expected = model.drain();
            assert_eq!(changes, expected, "changes differ from the model's at {:?}", now - self.start);
            // Caps are checked on their own (`check_caps`); the model does not have them.
            let views: Vec<_> =
                self.engine.containers(now).map(|v| qos_core::ContainerView { cap: None, ..v }).collect();
            assert_eq!(views, model.views(now), "views differ from the model's");
            assert_eq!(self.engine.len(), model.len());
            assert_eq!(self.engine.config(), &model.config);
            // A deadline already past (a timer made due by reconfigure) is met by any poll_timeout() up to now.
            if let Some(deadline) = model.deadline().map(|d| d.max(now)) {
                let got = self.engine.poll_timeout();
                assert!(
                    got.is_some_and(|d| d <= deadline),
                    "poll_timeout() = {:?} is later than a pending deadline at {:?}",
                    got.map(|d| d - self.start),
                    deadline - self.start
                );
            }
        }
    }

    /// The caps: set only on a managed container at the bottom with no cap, lifted only where one is set, at least
    /// `bottom_cap_percent` % of [`qos_core::engine::MIN_CAP_BPS`] in each capped direction, never with the rule
    /// off; and after every input, exactly the containers the outputs left capped have a cap in their view, each
    /// at the bottom and managed.
    fn check_caps(&mut self, now: Instant, config: &Config) {
        let min = qos_core::engine::MIN_CAP_BPS * u64::from(config.bottom_cap_percent) / 100;
        while let Some(change) = self.engine.poll_cap_change() {
            match change.cap {
                Some(cap) => {
                    assert!(config.bottom_cap_window.is_some(), "a cap with the rule off: {change:?}");
                    assert!(cap.read_bps.is_some() || cap.write_bps.is_some(), "an empty cap: {change:?}");
                    for bps in [cap.read_bps, cap.write_bps].into_iter().flatten() {
                        assert!(bps >= min, "a cap under the least rate capped: {change:?}");
                    }
                    let view = self.engine.container(&change.id, now).expect("a cap for a known container");
                    assert_eq!((view.policy, view.level), (Policy::Managed, config.bottom()), "{change:?}");
                    let old = self.capped.insert(change.id.clone(), cap);
                    assert_eq!(old, None, "capped twice without a lift: {change:?}");
                }
                None => {
                    assert!(self.capped.remove(&change.id).is_some(), "a lift of no cap: {change:?}");
                }
            }
        }
        // A removed container's cap goes with its cgroup: no output.
        let engine = &self.engine;
        self.capped.retain(|id, _| engine.container(id, now).is_some());
        for view in self.engine.containers(now) {
            assert_eq!(view.cap, self.capped.get(&view.id).copied(), "the view's cap is not what the outputs say");
            if view.cap.is_some() {
                assert_eq!((view.policy, view.level), (Policy::Managed, config.bottom()), "{view:?}");
            }
        }
    }

    fn check_weight(&self, c: &WeightChange, config: &Config) {
        match c.reason {
            Reason::Released => assert_eq!((c.weight, c.new_level), (None, None), "{c:?}"),
            Reason::Pinned => {
                assert_eq!(c.weight, self.pins.get(&c.id).copied(), "a pin is the weight asked for: {c:?}");
                assert_eq!(c.new_level, None);
            }
            _ => {
                let level = c.new_level.unwrap_or_else(|| panic!("a level change names its level: {c:?}"));
                assert!(level < config.levels.len(), "level beyond the bottom: {c:?}");
                assert_eq!(c.weight, Some(config.levels[level].weight), "weight is the level's: {c:?}");
            }
        }
    }

    fn check_starvation_bound(&self) {
        if self.chaos {
            return;
        }
        let slack = match self.timers {
            Timers::AtPollTimeout => Duration::ZERO,
            Timers::EveryTick(tick) => tick,
        };
        for (id, o) in &self.observed {
            if let Some((left, bound)) = o.below_top {
                let below = self.now - left;
                assert!(
                    below <= bound + slack,
                    "{id} has been below the top for {below:?} > boost_after {bound:?} + {slack:?} (level {:?})",
                    o.level
                );
            }
        }
    }
}
