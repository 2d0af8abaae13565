//! [`Engine`]: the multi-level feedback queue itself, in the handle/poll shape.
//!
//! Methods come in four groups:
//! - getters: [`Engine::config`], [`Engine::container`], [`Engine::containers`], [`Engine::len`];
//! - inputs, each taking `now`: [`Engine::handle_started`], [`Engine::handle_sample`], [`Engine::handle_removed`],
//!   [`Engine::handle_timeout`], [`Engine::set_policy`], [`Engine::reconfigure`];
//! - outputs: [`Engine::poll_change`] and [`Engine::poll_cap_change`] (drain each until `None`) and
//!   [`Engine::poll_timeout`];
//! - nothing else: the engine never reads a clock, does no I/O and logs nothing.
//!
//! The rule for drivers: after every input, drain [`Engine::poll_change`] and then [`Engine::poll_cap_change`]
//! until they return `None`, then ask [`Engine::poll_timeout`] when to call [`Engine::handle_timeout`] next. A
//! cap is only ever set on a container at the bottom level, and lifted (a [`CapChange`] with `None`) before or
//! with the weight change that takes it elsewhere.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::cap::{Cap, CapChange};
use crate::config::{Config, ConfigError, CountMode};
use crate::id::ContainerId;
use crate::units::IoCounters;
use crate::weight::Weight;

/// How the engine treats one container.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "lowercase", tag = "policy", content = "weight")]
pub enum Policy {
    /// Moves through the levels (default).
    #[default]
    Managed,
    /// Held at a fixed weight; never demoted or boosted.
    Pinned(Weight),
    /// Not touched at all: the driver should leave (or put back) the weight the container had.
    Excluded,
}

/// Why a container's weight changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum Reason {
    /// First seen: enters the top level.
    New,
    /// Used more than its level's allotment.
    Demoted,
    /// Below the top for `boost_after`: back to the top (starvation rule).
    Boosted,
    /// Periodic boost of every container (`boost_all_every`).
    PeriodicBoost,
    /// Got less than `share_floor_percent` of what a container of the same or lower weight got at that weight over
    /// the last `share_window`: back to the top (fair-share floor).
    ShareBoosted,
    /// No I/O for `idle_promote_after`: one level up.
    IdlePromoted,
    /// Policy set to pinned.
    Pinned,
    /// Policy changed from excluded or pinned back to managed: enters the top level.
    Managed,
    /// Policy set to excluded: the driver should restore the weight the container had before it was managed.
    Released,
    /// The configuration changed the weight of the container's level.
    Reconfigured,
}

impl Reason {
    /// Kebab-case name, for logs and metrics labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::New => "new",
            Reason::Demoted => "demoted",
            Reason::Boosted => "boosted",
            Reason::PeriodicBoost => "periodic-boost",
            Reason::ShareBoosted => "share-boosted",
            Reason::IdlePromoted => "idle-promoted",
            Reason::Pinned => "pinned",
            Reason::Managed => "managed",
            Reason::Released => "released",
            Reason::Reconfigured => "reconfigured",
        }
    }
}

/// One decision: a container's weight must change. Levels are 0-based (0 = top).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct WeightChange {
    /// The container.
    pub id: ContainerId,
    /// The weight to apply; `None` means "release": restore the weight it had before the engine managed it.
    pub weight: Option<Weight>,
    /// Level before, if it was managed.
    pub old_level: Option<usize>,
    /// Level after, if it is managed.
    pub new_level: Option<usize>,
    /// Why.
    pub reason: Reason,
    /// Bytes counted at the old level when the change happened (the allotment used).
    pub bytes_at_old_level: u64,
}

/// A read-only view of one container's state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ContainerView {
    /// The container.
    pub id: ContainerId,
    /// Its policy.
    pub policy: Policy,
    /// Current level (0 = top); meaningful only for managed containers.
    pub level: usize,
    /// The weight the engine wants it to have; `None` for excluded containers.
    pub weight: Option<Weight>,
    /// Bytes counted since it entered its current level.
    pub bytes_at_level: u64,
    /// Bytes counted since the engine first saw it.
    pub total_bytes: u64,
    /// Time spent at the current level.
    pub time_at_level: Duration,
    /// The cap set on it at the bottom level, if any (`bottom_cap_window`).
    pub cap: Option<Cap>,
}

#[derive(Debug, Clone)]
struct Container {
    policy: Policy,
    level: usize,
    entered_level: Instant,
    /// When it left the top level; `None` while at the top.
    left_top: Option<Instant>,
    /// Last time it did counted I/O (or entered its level, whichever is later, for the idle rule).
    last_io: Instant,
    bytes_at_level: u64,
    total_bytes: u64,
    /// Previous counters; `None` means the next sample is a baseline (adopted container, I/O before unknown).
    last: Option<IoCounters>,
    /// Bytes counted since the current share window began (the fair-share floor).
    window_bytes: u64,
    /// Of `window_bytes`, those counted at its current weight (since its last weight change in the window): what
    /// it got as a peer of the containers at that weight or above (the fair-share floor). Bytes a container did
    /// while boosted to the top do not make the readers it outweighed then look starved once it is back down.
    window_at_weight: u64,
    /// Whether its last sample counted I/O: it is still asking for I/O.
    active: bool,
    /// When its last sample came (`None`: none yet).
    sampled_at: Option<Instant>,
    /// When a timer (a boost, an idle promotion, the fair-share floor) or a policy change last moved it up since
    /// its last sample: the next sample's I/O is counted at the new level only for the part of its interval after
    /// the move (see `handle_sample`).
    promoted_at: Option<Instant>,
    /// Where the measurement of its rate at the bottom began, while it has no cap yet.
    cap_from: Option<CapStart>,
    /// The cap set on it at the bottom (`bottom_cap_window`).
    cap: Option<Cap>,
}

/// The start of a container's measurement at the bottom: when, its counters, and the engine's totals then.
#[derive(Debug, Clone, Copy)]
struct CapStart {
    at: Instant,
    counters: IoCounters,
    /// [`Engine`]'s `counted_all` then.
    all: u128,
}

impl Container {
    fn enter(policy: Policy, now: Instant, last: Option<IoCounters>) -> Self {
        Self {
            policy,
            level: 0,
            entered_level: now,
            left_top: None,
            last_io: now,
            bytes_at_level: 0,
            total_bytes: 0,
            last,
            window_bytes: 0,
            window_at_weight: 0,
            active: false,
            sampled_at: None,
            promoted_at: None,
            cap_from: None,
            cap: None,
        }
    }

    /// Stops measuring its rate and lifts its cap, if it has one (queued in `caps`): it left the bottom level, the
    /// rules changed, or another managed container used up its top allotment ([`Engine::lift_other_caps`]).
    fn lift_cap(&mut self, id: &ContainerId, caps: &mut VecDeque<CapChange>) {
        self.cap_from = None;
        if self.cap.take().is_some() {
            caps.push_back(CapChange { id: id.clone(), cap: None });
        }
    }

    /// Back to the top with a fresh allotment (the fair-share floor); the caller lifts its cap.
    fn back_to_top(&mut self, now: Instant) {
        self.level = 0;
        self.entered_level = now;
        self.bytes_at_level = 0;
        self.left_top = None;
        self.promoted_at = Some(now);
    }
}

/// The multi-level feedback queue. See the module documentation for the calling rules.
#[derive(Debug, Clone)]
pub struct Engine {
    config: Config,
    containers: BTreeMap<ContainerId, Container>,
    changes: VecDeque<WeightChange>,
    caps: VecDeque<CapChange>,
    /// Bytes counted from every container's samples since the engine started (the device's load, as the cap's
    /// measurement sees it).
    counted_all: u128,
    /// Earliest time a timer may fire; may be earlier than the true next deadline (a spurious wake-up costs one
    /// scan), never later.
    next_deadline: Option<Instant>,
    last_periodic_boost: Instant,
    /// When the current share window ends (`None`: the fair-share floor is off).
    share_check: Option<Instant>,
}

impl Engine {
    /// Creates an engine with a validated config; `now` starts the periodic-boost clock.
    pub fn new(config: Config, now: Instant) -> Result<Self, ConfigError> {
        config.validate()?;
        let mut engine = Self {
            config,
            containers: BTreeMap::new(),
            changes: VecDeque::new(),
            caps: VecDeque::new(),
            counted_all: 0,
            next_deadline: None,
            last_periodic_boost: now,
            share_check: None,
        };
        engine.share_check = engine.config.share_window.and_then(|w| now.checked_add(w));
        engine.next_deadline = earliest(engine.periodic_deadline(), engine.share_check);
        Ok(engine)
    }

    // ----- getters -----

    /// The config in force.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Number of containers known (any policy).
    pub fn len(&self) -> usize {
        self.containers.len()
    }

    /// Whether no container is known.
    pub fn is_empty(&self) -> bool {
        self.containers.is_empty()
    }

    /// State of one container.
    pub fn container(&self, id: &ContainerId, now: Instant) -> Option<ContainerView> {
        self.containers.get(id).map(|c| self.view(id, c, now))
    }

    /// Bytes counted for a container since it entered (cheaper than [`Engine::container`] when that is all).
    pub fn total_bytes(&self, id: &ContainerId) -> Option<u64> {
        self.containers.get(id).map(|c| c.total_bytes)
    }

    /// State of every container, in id order.
    pub fn containers(&self, now: Instant) -> impl Iterator<Item = ContainerView> + '_ {
        self.containers.iter().map(move |(id, c)| self.view(id, c, now))
    }

    fn view(&self, id: &ContainerId, c: &Container, now: Instant) -> ContainerView {
        ContainerView {
            id: id.clone(),
            policy: c.policy,
            level: c.level,
            weight: self.weight_for(c),
            bytes_at_level: c.bytes_at_level,
            total_bytes: c.total_bytes,
            time_at_level: now.saturating_duration_since(c.entered_level),
            cap: c.cap,
        }
    }

    fn weight_for(&self, c: &Container) -> Option<Weight> {
        match c.policy {
            Policy::Managed => Some(self.config.levels[c.level].weight),
            Policy::Pinned(w) => Some(w),
            Policy::Excluded => None,
        }
    }

    // ----- inputs -----

    /// A container was just created or started: it enters the top level at once (before any sample), and its
    /// counters are taken to start from zero, so I/O it does before the first sample counts.
    ///
    /// Starting a container the engine already knows (a restart) puts it back at the top as a new one, counting
    /// from its last sample: a cgroup made again reads lower than that, which counts as a reset (from zero), and a
    /// cgroup that outlived its container (a pod's, across a new sandbox) is not charged its whole history again.
    pub fn handle_started(&mut self, id: &ContainerId, now: Instant) {
        let (policy, last) = self.containers.get(id).map_or((Policy::Managed, None), |c| (c.policy, c.last));
        let last = last.unwrap_or_default();
        let mut old = self.containers.insert(id.clone(), Container::enter(policy, now, Some(last)));
        if let Some(old) = old.as_mut() {
            old.lift_cap(id, &mut self.caps);
        }
        self.announce_entry(id, old, policy);
    }

    /// A sample of a container's cumulative counters. An unknown container is adopted: it enters the top level
    /// and this sample is its baseline (what it did before is not held against it).
    ///
    /// A counter lower than the previous sample is a reset (cgroup recreated): the new value is counted from zero.
    pub fn handle_sample(&mut self, id: &ContainerId, counters: IoCounters, now: Instant) {
        let Some(c) = self.containers.get_mut(id) else {
            self.containers.insert(id.clone(), Container::enter(Policy::Managed, now, Some(counters)));
            self.announce_entry(id, None, Policy::Managed);
            return;
        };
        let delta = match c.last.replace(counters) {
            Some(prev) => counted(self.config.count, prev, counters),
            // Entered through `set_policy` without a sample: this one is the baseline.
            None => 0,
        };
        let (sampled_at, promoted_at) = (c.sampled_at.replace(now), c.promoted_at.take());
        c.active = delta > 0;
        if delta == 0 {
            // A pause: the rate measured so far would understate what it asks for.
            c.cap_from = None;
            return;
        }
        // I/O done before a timer moved it up was done at its old weight: of a sample whose interval spans the
        // move, only the part after it (pro rata by time) counts against the new level's allotment and weight.
        // Counting all of it demoted a boosted reader again in the round right after its boost, for I/O it did at
        // the bottom.
        let at_level = match (promoted_at, sampled_at) {
            (Some(moved), Some(prev)) => after_move(delta, prev, moved, now),
            _ => delta,
        };
        c.window_bytes = c.window_bytes.saturating_add(delta);
        c.window_at_weight = c.window_at_weight.saturating_add(at_level);
        c.total_bytes = c.total_bytes.saturating_add(delta);
        c.bytes_at_level = c.bytes_at_level.saturating_add(at_level);
        c.last_io = now;
        if c.policy != Policy::Managed {
            self.counted_all = self.counted_all.saturating_add(u128::from(delta));
            return;
        }
        let old_level = c.level;
        let used = c.bytes_at_level;
        let bottom = self.config.bottom();
        // Allotment rule: cross as many levels as the sample covers, carrying the surplus down.
        while c.level < bottom && c.bytes_at_level > self.config.levels[c.level].threshold.0 {
            c.bytes_at_level -= self.config.levels[c.level].threshold.0;
            c.level += 1;
        }
        self.counted_all = self.counted_all.saturating_add(u128::from(delta));
        let all = self.counted_all;
        let cap = (c.level == bottom).then(|| measure_cap(&self.config, c, counters, all, (sampled_at, now))).flatten();
        if let Some(cap) = cap {
            self.caps.push_back(CapChange { id: id.clone(), cap: Some(cap) });
        }
        if c.level != old_level {
            c.entered_level = now;
            if old_level == 0 {
                c.left_top = Some(now);
            }
            let (deadline, new_level) = (deadline_of(&self.config, c), c.level);
            self.lower_deadline(deadline);
            self.push_level_change(id, old_level, new_level, Reason::Demoted, used);
            if old_level == 0 {
                self.lift_other_caps(id);
            }
        }
    }

    /// `leaver` used up its top allotment: no small read that the headroom at the bottom serves at once, but a
    /// reader the weights must serve. Every other cap is lifted and measured afresh (a window from now): a capped
    /// container kept up to 1.7x the service the weights gave it uncapped beside such a reader (blk-throttle's held
    /// bios come back through its worker), and the reader lost what the cap gave the small reads
    /// (`crates/bench/results/2026-11-29/bottom-cap-steady-state-50650cb/`).
    fn lift_other_caps(&mut self, leaver: &ContainerId) {
        for (id, c) in self.containers.iter_mut().filter(|(id, _)| *id != leaver) {
            c.lift_cap(id, &mut self.caps);
        }
    }

    /// The container is gone; its state is dropped. No change is emitted (there is no cgroup left to write).
    pub fn handle_removed(&mut self, id: &ContainerId, _now: Instant) {
        self.containers.remove(id);
    }

    /// Sets a container's policy (adding it at the top if unknown). Emits the change it implies.
    pub fn set_policy(&mut self, id: &ContainerId, policy: Policy, now: Instant) {
        let Some(c) = self.containers.get_mut(id) else {
            self.containers.insert(id.clone(), Container::enter(policy, now, None));
            self.announce_entry(id, None, policy);
            return;
        };
        if c.policy == policy {
            return;
        }
        c.lift_cap(id, &mut self.caps);
        let old_policy = std::mem::replace(&mut c.policy, policy);
        let old_level = (old_policy == Policy::Managed).then_some(c.level);
        let used = c.bytes_at_level;
        let (weight, new_level, reason) = match policy {
            Policy::Pinned(w) => (Some(w), None, Reason::Pinned),
            Policy::Excluded => (None, None, Reason::Released),
            Policy::Managed => {
                let (last, last_io, sampled_at) = (c.last, c.last_io, c.sampled_at);
                *c = Container::enter(Policy::Managed, now, last);
                c.last_io = last_io.max(now);
                // I/O it did pinned or excluded does not count against its new allotment.
                (c.sampled_at, c.promoted_at) = (sampled_at, Some(now));
                (Some(self.config.levels[0].weight), Some(0), Reason::Managed)
            }
        };
        self.push_change(id, weight, (old_level, new_level), reason, used);
    }

    /// Queues one change for [`Engine::poll_change`]: `levels` is (before, after).
    fn push_change(
        &mut self,
        id: &ContainerId,
        weight: Option<Weight>,
        levels: (Option<usize>, Option<usize>),
        reason: Reason,
        used: u64,
    ) {
        let (old_level, new_level) = levels;
        if let Some(c) = self.containers.get_mut(id) {
            c.window_at_weight = 0;
        }
        self.changes.push_back(WeightChange {
            id: id.clone(),
            weight,
            old_level,
            new_level,
            reason,
            bytes_at_old_level: used,
        });
    }

    /// Fires every timer due at `now`: the fair-share floor, starvation boost, idle promotion, periodic boost.
    /// Calling it early or often is harmless.
    pub fn handle_timeout(&mut self, now: Instant) {
        if self.share_check.is_some_and(|due| now >= due) {
            self.share_boosts(now);
            self.share_check = self.config.share_window.and_then(|w| now.checked_add(w));
        }
        let periodic = self
            .config
            .boost_all_every
            .filter(|p| self.last_periodic_boost.checked_add(*p).is_some_and(|due| now >= due));
        if periodic.is_some() {
            self.last_periodic_boost = now;
        }
        let mut next: Option<Instant> = self.periodic_deadline();
        let (config, changes, caps) = (&self.config, &mut self.changes, &mut self.caps);
        for (id, c) in self.containers.iter_mut() {
            // Only managed containers below the top have timers.
            if c.policy != Policy::Managed || c.level == 0 {
                continue;
            }
            let old = c.level;
            let used = c.bytes_at_level;
            let (boost, idle) = timers(config, c);
            let boost_due = boost.is_some_and(|d| now >= d);
            let idle_due = idle.is_some_and(|d| now >= d);
            let reason = if periodic.is_some() {
                Some(Reason::PeriodicBoost)
            } else if boost_due {
                Some(Reason::Boosted)
            } else if idle_due {
                Some(Reason::IdlePromoted)
            } else {
                None
            };
            let deadline = match reason {
                Some(reason) => {
                    c.level = if reason == Reason::IdlePromoted { old - 1 } else { 0 };
                    c.window_at_weight = 0;
                    c.entered_level = now;
                    c.bytes_at_level = 0;
                    c.promoted_at = Some(now);
                    if c.level == 0 {
                        c.left_top = None;
                    }
                    c.lift_cap(id, caps);
                    changes.push_back(level_change(config, id, old, c.level, reason, used));
                    deadline_of(config, c)
                }
                // Nothing moved: the timers just computed are still the container's.
                None => earliest(boost, idle),
            };
            if let Some(d) = deadline {
                next = Some(next.map_or(d, |n| n.min(d)));
            }
        }
        self.next_deadline = earliest(next, self.share_check);
    }

    /// The fair-share floor: every managed container below the top that did I/O in the window and still does, but
    /// got less than `share_floor_percent` % of the bytes another container whose weight is the same or lower did at
    /// that weight (since its last weight change in the window), goes back to the top. Counting a peer's bytes of
    /// the whole window made a container that was boosted to the top for part of it (its starvation boost) look
    /// like an equal of the readers it outweighed then, and share-boosted them. Every window then starts afresh.
    fn share_boosts(&mut self, now: Instant) {
        let floor = u128::from(self.config.share_floor_percent);
        let mut starving: Vec<ContainerId> = Vec::new();
        {
            // Every container the engine weights that did I/O at its weight in the window, by that weight.
            let mut peers: Vec<(Weight, u64, &ContainerId)> = self
                .containers
                .iter()
                .filter(|(_, c)| c.window_at_weight > 0)
                .filter_map(|(id, c)| self.weight_for(c).map(|w| (w, c.window_at_weight, id)))
                .collect();
            peers.sort_by_key(|(w, _, _)| *w);
            // best[i]: the two largest byte counts among peers[..=i] (the first with its owner).
            let mut best: Vec<(u64, Option<&ContainerId>, u64)> = Vec::with_capacity(peers.len());
            let mut top: (u64, Option<&ContainerId>, u64) = (0, None, 0);
            for &(_, bytes, id) in &peers {
                if bytes > top.0 {
                    top = (bytes, Some(id), top.0);
                } else if bytes > top.2 {
                    top.2 = bytes;
                }
                best.push(top);
            }
            for (id, c) in &self.containers {
                if c.policy != Policy::Managed || c.level == 0 || !c.active || c.window_bytes == 0 {
                    continue;
                }
                let w = self.config.levels[c.level].weight;
                // The peers weighted at most `w`.
                let n = peers.partition_point(|(pw, _, _)| *pw <= w);
                let Some(&(most, owner, second)) = n.checked_sub(1).map(|i| &best[i]) else { continue };
                let most_other = if owner == Some(id) { second } else { most };
                if u128::from(c.window_bytes) * 100 < floor * u128::from(most_other) {
                    starving.push(id.clone());
                }
            }
        }
        for id in starving {
            let c = self.containers.get_mut(&id).expect("listed above");
            let (old, used) = (c.level, c.bytes_at_level);
            c.back_to_top(now);
            c.lift_cap(&id, &mut self.caps);
            self.push_level_change(&id, old, 0, Reason::ShareBoosted, used);
        }
        self.containers.values_mut().for_each(|c| {
            c.window_bytes = 0;
            c.window_at_weight = 0;
        });
    }

    /// Replaces the config. On error the old config stays in force. Containers keep their level (clamped to the
    /// new bottom); those whose weight changes get a [`Reason::Reconfigured`] change. Running timers keep their
    /// start (a shorter `boost_after` can make a boost due at once); a periodic boost that was off starts now.
    pub fn reconfigure(&mut self, config: Config, now: Instant) -> Result<(), ConfigError> {
        config.validate()?;
        let old = std::mem::replace(&mut self.config, config);
        if old.boost_all_every.is_none() {
            // Periodic boost switched on: the first one comes a period from now, not from when the engine started.
            self.last_periodic_boost = now;
        }
        if old.share_window != self.config.share_window {
            // A new window length starts a new window.
            self.share_check = self.config.share_window.and_then(|w| now.checked_add(w));
            self.containers.values_mut().for_each(|c| {
                c.window_bytes = 0;
                c.window_at_weight = 0;
            });
        }
        let bottom = self.config.bottom();
        // New levels or a new cap rule: every cap is measured afresh under them.
        let recap = old.levels != self.config.levels
            || old.bottom_cap_window != self.config.bottom_cap_window
            || old.bottom_cap_percent != self.config.bottom_cap_percent;
        let mut moves = Vec::new();
        for (id, c) in self.containers.iter_mut() {
            if recap {
                c.lift_cap(id, &mut self.caps);
            }
            if c.policy != Policy::Managed {
                continue;
            }
            let old_level = c.level;
            let used = c.bytes_at_level;
            if c.level > bottom {
                // Moved up to the new bottom: like any level change, it starts that level with nothing counted.
                c.level = bottom;
                c.entered_level = now;
                c.bytes_at_level = 0;
                if c.level == 0 {
                    c.left_top = None;
                }
            }
            if old.levels[old_level].weight != self.config.levels[c.level].weight || old_level != c.level {
                moves.push((id.clone(), old_level, c.level, used));
            }
        }
        for (id, old_level, new_level, used) in moves {
            self.push_level_change(&id, old_level, new_level, Reason::Reconfigured, used);
        }
        // Timers may now be due earlier or later: recompute on the next poll.
        self.next_deadline = Some(now);
        Ok(())
    }

    // ----- outputs -----

    /// Next decision to carry out, oldest first. Drain until `None` after every input.
    pub fn poll_change(&mut self) -> Option<WeightChange> {
        self.changes.pop_front()
    }

    /// Next cap to set or lift, oldest first. Drain until `None` after every input, after [`Engine::poll_change`].
    pub fn poll_cap_change(&mut self) -> Option<CapChange> {
        self.caps.pop_front()
    }

    /// When [`Engine::handle_timeout`] must be called next; `None` if no timer is pending. May be earlier than
    /// strictly needed (never later).
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.next_deadline
    }

    // ----- internals -----

    fn announce_entry(&mut self, id: &ContainerId, old: Option<Container>, policy: Policy) {
        let (old_level, used) = match &old {
            Some(c) if c.policy == Policy::Managed => (Some(c.level), c.bytes_at_level),
            _ => (None, 0),
        };
        let (weight, new_level, reason) = match policy {
            Policy::Managed => (Some(self.config.levels[0].weight), Some(0), Reason::New),
            Policy::Pinned(w) => (Some(w), None, Reason::Pinned),
            // Entering as excluded: nothing was applied, nothing to release (set_policy emits the release when a
            // managed container becomes excluded).
            Policy::Excluded => return,
        };
        // An entering container is at the top (`Container::enter`): it has no timer, no deadline to lower.
        self.push_change(id, weight, (old_level, new_level), reason, used);
    }

    fn push_level_change(&mut self, id: &ContainerId, old: usize, new: usize, reason: Reason, used: u64) {
        if let Some(c) = self.containers.get_mut(id) {
            c.window_at_weight = 0;
        }
        self.changes.push_back(level_change(&self.config, id, old, new, reason, used));
    }

    fn lower_deadline(&mut self, d: Option<Instant>) {
        if let Some(d) = d {
            self.next_deadline = Some(self.next_deadline.map_or(d, |n| n.min(d)));
        }
    }

    fn periodic_deadline(&self) -> Option<Instant> {
        self.config.boost_all_every.and_then(|p| self.last_periodic_boost.checked_add(p))
    }
}

/// The change for a managed container moving from level `old` to `new`.
fn level_change(config: &Config, id: &ContainerId, old: usize, new: usize, reason: Reason, used: u64) -> WeightChange {
    WeightChange {
        id: id.clone(),
        weight: Some(config.levels[new].weight),
        old_level: Some(old),
        new_level: Some(new),
        reason,
        bytes_at_old_level: used,
    }
}

/// The part of `delta` bytes, counted over the interval `prev..now`, that falls after `moved` (pro rata by time;
/// all of it if the interval is empty or the move came before it).
fn after_move(delta: u64, prev: Instant, moved: Instant, now: Instant) -> u64 {
    let whole = now.saturating_duration_since(prev).as_nanos();
    if whole == 0 || moved <= prev {
        return delta;
    }
    let after = now.saturating_duration_since(moved).as_nanos();
    // after <= whole, so the result fits in u64.
    u64::try_from(u128::from(delta) * after / whole).unwrap_or(delta)
}

/// When a container's starvation boost and idle promotion fall due (either may be unset).
fn timers(config: &Config, c: &Container) -> (Option<Instant>, Option<Instant>) {
    let boost = c.left_top.and_then(|t| t.checked_add(config.boost_after));
    let idle = config.idle_promote_after.and_then(|d| c.last_io.max(c.entered_level).checked_add(d));
    (boost, idle)
}

fn earliest(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// Earliest timer of one managed container below the top: its boost or its idle promotion.
fn deadline_of(config: &Config, c: &Container) -> Option<Instant> {
    if c.policy != Policy::Managed || c.level == 0 {
        return None;
    }
    let (boost, idle) = timers(config, c);
    earliest(boost, idle)
}

/// Counters below this rate (bytes per second, each direction) are not capped: such a container leaves the device
/// idle most of the time anyway.
pub const MIN_CAP_BPS: u64 = 1 << 20;

/// The cap rule for a managed container at the bottom with no cap yet, at a sample of `counters` at `now` that
/// counted I/O, `all` the engine's `counted_all` after it: starts measuring, or, `bottom_cap_window` after the
/// start, sets the cap at `bottom_cap_percent` % of the device's load over the window (every container's bytes,
/// its own included), split between reads and writes as its own bytes were. The load, not its own rate: a reader
/// measured while a new container at the top took most of the device is not held at what it got then (the bench
/// saw a background capped at 18 MB/s, an eighth of the device, that way). A direction that did under
/// [`MIN_CAP_BPS`] is not capped (and neither direction did: measured afresh). A counter that went down (a cgroup
/// made again), a sample that counted nothing or one that came more than three quarters of the window after the previous
/// one (a pause its driver did not pass on) starts the measurement again, and so does another managed container
/// leaving the top level ([`Engine::lift_other_caps`]). Never with a single level (no rule would lift the cap).
///
/// The engine knows no devices: the load is every container's bytes on whatever device. On a host whose containers
/// use several disks it overstates each disk's load, and a cap then holds less (never more than percent of the
/// container's own rate); and a reader leaving the top on any disk lifts every cap on every disk.
///
/// Two big readers at the bottom are each capped under the whole load, so together they may still fill the
/// device: sharing one headroom by what each did then held a reader that shared the bottom with a passing big
/// read to a fifth of the device for the rest of its stay.
fn measure_cap(
    config: &Config,
    c: &mut Container,
    counters: IoCounters,
    all: u128,
    (previous, now): (Option<Instant>, Instant),
) -> Option<Cap> {
    let window = config.bottom_cap_window?;
    // With one level the bottom is the top: nothing would ever lift the cap.
    if c.policy != Policy::Managed || c.cap.is_some() || config.bottom() == 0 {
        return None;
    }
    let start = CapStart { at: now, counters, all };
    let Some(from) = c.cap_from else {
        c.cap_from = Some(start);
        return None;
    };
    // A driver need not pass samples that counted nothing (the agent does not): a gap of more than three quarters
    // of the window since the previous sample is a pause (the agent's rounds at 500 ms, a 1 s window: one skipped
    // round is a gap of 1 s; its rounds' jitter is milliseconds).
    let paused = previous.is_some_and(|p| now.saturating_duration_since(p) > window * 3 / 4);
    if paused || counters.read < from.counters.read || counters.write < from.counters.write {
        c.cap_from = Some(start);
        return None;
    }
    let elapsed = now.saturating_duration_since(from.at);
    if elapsed < window {
        return None;
    }
    let (read, write) = (counters.read - from.counters.read, counters.write - from.counters.write);
    let mine = u128::from(read) + u128::from(write);
    let load = all.saturating_sub(from.all);
    let nanos = elapsed.as_nanos().max(1);
    let percent = u128::from(config.bottom_cap_percent);
    // Its part of the cap, bytes per second: percent x load/s x (bytes / mine); never under percent of its own
    // rate (the load holds its own bytes; with `count` other than "both" it may not hold them all).
    let part = |bytes: u64| -> Option<u64> {
        let own_bps = u128::from(bytes) * 1_000_000_000 / nanos;
        if own_bps < u128::from(MIN_CAP_BPS) {
            return None;
        }
        let load_bps = load.saturating_mul(1_000_000_000) / nanos;
        let bps = (percent * load_bps / 100).saturating_mul(u128::from(bytes)) / mine.max(1);
        Some(u64::try_from(bps.max(percent * own_bps / 100)).unwrap_or(u64::MAX))
    };
    let cap = Cap { read_bps: part(read), write_bps: part(write) };
    if cap.read_bps.is_none() && cap.write_bps.is_none() {
        c.cap_from = Some(start);
        return None;
    }
    c.cap_from = None;
    c.cap = Some(cap);
    Some(cap)
}

/// Bytes counted between two samples; a counter that went down restarted from zero.
fn counted(mode: CountMode, prev: IoCounters, now: IoCounters) -> u64 {
    let step = |p: u64, n: u64| if n >= p { n - p } else { n };
    let read = step(prev.read, now.read);
    let write = step(prev.write, now.write);
    match mode {
        CountMode::Read => read,
        CountMode::Write => write,
        CountMode::Both => read.saturating_add(write),
    }
}
