//! A plain reimplementation of the rules as written in the docs: a `Vec` of entries, linear search, one rule per
//! block, no deadline bookkeeping (deadlines are recomputed from scratch). `ops::Run` feeds it the same inputs as
//! the engine and compares changes, views and deadlines after every step.

use std::time::Instant;

use qos_core::{Config, ContainerId, ContainerView, CountMode, IoCounters, Policy, Reason, Weight, WeightChange};

#[derive(Debug, Clone)]
struct Entry {
    id: ContainerId,
    policy: Policy,
    level: usize,
    entered: Instant,
    left_top: Option<Instant>,
    last_io: Instant,
    bytes: u64,
    total: u64,
    /// Counters of the previous sample; `None`: the next sample is only a baseline.
    baseline: Option<IoCounters>,
    /// Bytes counted in the current share window.
    window: u64,
    /// Of `window`, those counted since its last weight change.
    at_weight: u64,
    /// Whether the last sample counted I/O.
    active: bool,
    /// When the last sample came.
    sampled: Option<Instant>,
    /// When a timer (or a policy change back to managed) last moved it up since its last sample.
    moved: Option<Instant>,
}

impl Entry {
    fn fresh(id: &ContainerId, policy: Policy, now: Instant, baseline: Option<IoCounters>) -> Self {
        Self {
            id: id.clone(),
            policy,
            level: 0,
            entered: now,
            left_top: None,
            last_io: now,
            bytes: 0,
            total: 0,
            baseline,
            window: 0,
            at_weight: 0,
            active: false,
            sampled: None,
            moved: None,
        }
    }
}

/// The model. Its state is exactly what the docs describe, nothing more.
#[derive(Debug, Clone)]
pub struct Model {
    pub config: Config,
    entries: Vec<Entry>,
    out: Vec<WeightChange>,
    last_periodic: Instant,
    share_check: Option<Instant>,
}

impl Model {
    pub fn new(config: Config, now: Instant) -> Self {
        let share_check = config.share_window.map(|w| now + w);
        Self { config, entries: Vec::new(), out: Vec::new(), last_periodic: now, share_check }
    }

    fn find(&self, id: &ContainerId) -> Option<usize> {
        self.entries.iter().position(|e| &e.id == id)
    }

    fn sort(&mut self) {
        self.entries.sort_by(|a, b| a.id.cmp(&b.id));
    }

    fn emit(
        &mut self,
        id: &ContainerId,
        weight: Option<Weight>,
        levels: (Option<usize>, Option<usize>),
        reason: Reason,
        used: u64,
    ) {
        // Its bytes at its weight start again with every weight change.
        if let Some(e) = self.entries.iter_mut().find(|e| &e.id == id) {
            e.at_weight = 0;
        }
        self.out.push(WeightChange {
            id: id.clone(),
            weight,
            old_level: levels.0,
            new_level: levels.1,
            reason,
            bytes_at_old_level: used,
        });
    }

    /// A container enters: managed ones at the top, pinned ones at their pin, excluded ones silently.
    fn announce(&mut self, id: &ContainerId, old_managed: Option<(usize, u64)>, policy: Policy) {
        match policy {
            Policy::Managed => {
                let top = self.config.levels[0].weight;
                let (old_level, used) = old_managed.map_or((None, 0), |(l, b)| (Some(l), b));
                self.emit(id, Some(top), (old_level, Some(0)), Reason::New, used);
            }
            Policy::Pinned(w) => self.emit(id, Some(w), (None, None), Reason::Pinned, 0),
            Policy::Excluded => {}
        }
    }

    pub fn started(&mut self, id: &ContainerId, now: Instant) {
        let old = self.find(id).map(|i| self.entries.remove(i));
        let policy = old.as_ref().map_or(Policy::Managed, |o| o.policy);
        // A restart counts from the last sample (a lower counter is a reset), a new container from zero.
        let last = old.as_ref().and_then(|o| o.baseline).unwrap_or_default();
        self.entries.push(Entry::fresh(id, policy, now, Some(last)));
        let old_managed = old.filter(|o| o.policy == Policy::Managed).map(|o| (o.level, o.bytes));
        self.announce(id, old_managed, policy);
    }

    pub fn sample(&mut self, id: &ContainerId, counters: IoCounters, now: Instant) {
        let Some(i) = self.find(id) else {
            self.entries.push(Entry::fresh(id, Policy::Managed, now, Some(counters)));
            self.announce(id, None, Policy::Managed);
            return;
        };
        let mode = self.config.count;
        let e = &mut self.entries[i];
        let delta = match e.baseline {
            None => 0,
            Some(prev) => counted(mode, prev, counters),
        };
        e.baseline = Some(counters);
        let (prev, moved) = (e.sampled.replace(now), e.moved.take());
        e.active = delta > 0;
        if delta == 0 {
            return;
        }
        // A move up inside the sample's interval: only the time after it counts at the new level, pro rata.
        let at_level = match (prev, moved) {
            (Some(p), Some(m)) if m > p && now > p => {
                let share = u128::from(delta) * (now - m).as_nanos() / (now - p).as_nanos();
                u64::try_from(share).unwrap()
            }
            _ => delta,
        };
        e.window = e.window.saturating_add(delta);
        e.at_weight = e.at_weight.saturating_add(at_level);
        e.total = e.total.saturating_add(delta);
        e.bytes = e.bytes.saturating_add(at_level);
        e.last_io = now;
        if e.policy != Policy::Managed {
            return;
        }
        let (from, used) = (e.level, e.bytes);
        // Walk down one allotment at a time; the bottom keeps everything.
        loop {
            if e.level + 1 == self.config.levels.len() {
                break;
            }
            let allotment = self.config.levels[e.level].threshold.0;
            if e.bytes <= allotment {
                break;
            }
            e.bytes -= allotment;
            e.level += 1;
        }
        if e.level != from {
            e.entered = now;
            if from == 0 {
                e.left_top = Some(now);
            }
            let (to, id) = (e.level, e.id.clone());
            let weight = self.config.levels[to].weight;
            self.emit(&id, Some(weight), (Some(from), Some(to)), Reason::Demoted, used);
        }
    }

    pub fn removed(&mut self, id: &ContainerId) {
        self.entries.retain(|e| &e.id != id);
    }

    pub fn set_policy(&mut self, id: &ContainerId, policy: Policy, now: Instant) {
        let Some(i) = self.find(id) else {
            self.entries.push(Entry::fresh(id, policy, now, None));
            self.announce(id, None, policy);
            return;
        };
        if self.entries[i].policy == policy {
            return;
        }
        let top = self.config.levels[0].weight;
        let e = &mut self.entries[i];
        let old_level = (e.policy == Policy::Managed).then_some(e.level);
        let used = e.bytes;
        e.policy = policy;
        match policy {
            Policy::Pinned(w) => self.emit(id, Some(w), (old_level, None), Reason::Pinned, used),
            Policy::Excluded => self.emit(id, None, (old_level, None), Reason::Released, used),
            Policy::Managed => {
                let (last_io, sampled) = (e.last_io.max(now), e.sampled);
                *e = Entry::fresh(id, Policy::Managed, now, e.baseline);
                e.last_io = last_io;
                (e.sampled, e.moved) = (sampled, Some(now));
                self.emit(id, Some(top), (old_level, Some(0)), Reason::Managed, used);
            }
        }
    }

    /// The weight the engine gives an entry, if it gives one.
    fn weight_of(&self, e: &Entry) -> Option<Weight> {
        match e.policy {
            Policy::Managed => Some(self.config.levels[e.level].weight),
            Policy::Pinned(w) => Some(w),
            Policy::Excluded => None,
        }
    }

    /// The fair-share floor as the docs state it: a managed entry below the top, active, that got less than the
    /// floor's percentage of the bytes any other entry weighted the same or lower did at that weight in the window
    /// (since its last weight change), goes to the top.
    fn share_floor(&mut self, now: Instant) {
        self.sort();
        let floor = u64::from(self.config.share_floor_percent);
        let mut boosted = Vec::new();
        for e in &self.entries {
            if e.policy != Policy::Managed || e.level == 0 || !e.active || e.window == 0 {
                continue;
            }
            let w = self.weight_of(e).expect("managed");
            let starved = self.entries.iter().any(|d| {
                d.id != e.id
                    && self.weight_of(d).is_some_and(|dw| dw <= w)
                    && u128::from(e.window) * 100 < u128::from(floor) * u128::from(d.at_weight)
            });
            if starved {
                boosted.push(e.id.clone());
            }
        }
        for id in boosted {
            let i = self.find(&id).expect("listed");
            let e = &mut self.entries[i];
            let (from, used) = (e.level, e.bytes);
            e.level = 0;
            e.entered = now;
            e.bytes = 0;
            e.left_top = None;
            e.moved = Some(now);
            let top = self.config.levels[0].weight;
            self.emit(&id, Some(top), (Some(from), Some(0)), Reason::ShareBoosted, used);
        }
        self.entries.iter_mut().for_each(|e| {
            e.window = 0;
            e.at_weight = 0;
        });
    }

    pub fn timeout(&mut self, now: Instant) {
        if self.share_check.is_some_and(|due| now >= due) {
            self.share_floor(now);
            self.share_check = self.config.share_window.map(|w| now + w);
        }
        let periodic = match self.config.boost_all_every {
            Some(p) if now >= self.last_periodic + p => {
                self.last_periodic = now;
                true
            }
            _ => false,
        };
        self.sort();
        let config = self.config.clone();
        let mut moves = Vec::new();
        for e in &mut self.entries {
            if e.policy != Policy::Managed || e.level == 0 {
                continue;
            }
            let starving = e.left_top.is_some_and(|t| now >= t + config.boost_after);
            let idle = config.idle_promote_after.is_some_and(|d| now >= e.last_io.max(e.entered) + d);
            let (to, reason) = if periodic {
                (0, Reason::PeriodicBoost)
            } else if starving {
                (0, Reason::Boosted)
            } else if idle {
                (e.level - 1, Reason::IdlePromoted)
            } else {
                continue;
            };
            moves.push((e.id.clone(), e.level, to, reason, e.bytes));
            e.level = to;
            e.entered = now;
            e.bytes = 0;
            e.moved = Some(now);
            if to == 0 {
                e.left_top = None;
            }
        }
        for (id, from, to, reason, used) in moves {
            let weight = self.config.levels[to].weight;
            self.emit(&id, Some(weight), (Some(from), Some(to)), reason, used);
        }
    }

    /// `Err` (and nothing changed) for an invalid config.
    pub fn reconfigure(&mut self, config: Config, now: Instant) -> Result<(), ()> {
        config.validate().map_err(|_| ())?;
        let old = std::mem::replace(&mut self.config, config);
        if old.boost_all_every.is_none() {
            self.last_periodic = now;
        }
        if old.share_window != self.config.share_window {
            self.share_check = self.config.share_window.map(|w| now + w);
            self.entries.iter_mut().for_each(|e| {
                e.window = 0;
                e.at_weight = 0;
            });
        }
        let bottom = self.config.levels.len() - 1;
        self.sort();
        let mut moves = Vec::new();
        for e in &mut self.entries {
            if e.policy != Policy::Managed {
                continue;
            }
            let (from, used) = (e.level, e.bytes);
            if e.level > bottom {
                e.level = bottom;
                e.entered = now;
                e.bytes = 0;
                if bottom == 0 {
                    e.left_top = None;
                }
            }
            if old.levels[from].weight != self.config.levels[e.level].weight || from != e.level {
                moves.push((e.id.clone(), from, e.level, used));
            }
        }
        for (id, from, to, used) in moves {
            let weight = self.config.levels[to].weight;
            self.emit(&id, Some(weight), (Some(from), Some(to)), Reason::Reconfigured, used);
        }
        Ok(())
    }

    pub fn drain(&mut self) -> Vec<WeightChange> {
        std::mem::take(&mut self.out)
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn views(&mut self, now: Instant) -> Vec<ContainerView> {
        self.sort();
        self.entries
            .iter()
            .map(|e| ContainerView {
                id: e.id.clone(),
                policy: e.policy,
                level: e.level,
                weight: match e.policy {
                    Policy::Managed => Some(self.config.levels[e.level].weight),
                    Policy::Pinned(w) => Some(w),
                    Policy::Excluded => None,
                },
                bytes_at_level: e.bytes,
                total_bytes: e.total,
                time_at_level: now.saturating_duration_since(e.entered),
                // Caps are not modelled: the driver checks them on their own (`ops`).
                cap: None,
            })
            .collect()
    }

    /// The earliest instant at which some timer is due, recomputed from scratch.
    pub fn deadline(&self) -> Option<Instant> {
        let periodic = self.config.boost_all_every.map(|p| self.last_periodic + p);
        let containers = self.entries.iter().filter(|e| e.policy == Policy::Managed && e.level > 0).flat_map(|e| {
            let boost = e.left_top.map(|t| t + self.config.boost_after);
            let idle = self.config.idle_promote_after.map(|d| e.last_io.max(e.entered) + d);
            [boost, idle]
        });
        containers.chain([periodic, self.share_check]).flatten().min()
    }
}

fn counted(mode: CountMode, prev: IoCounters, now: IoCounters) -> u64 {
    // A counter below its previous value restarted from zero: all of it is new.
    let read = if now.read >= prev.read { now.read - prev.read } else { now.read };
    let write = if now.write >= prev.write { now.write - prev.write } else { now.write };
    match mode {
        CountMode::Read => read,
        CountMode::Write => write,
        CountMode::Both => read.saturating_add(write),
    }
}
