//! One decision round of the qos-core engine, as the agent runs it every sampling tick: `handle_sample` for every
//! container with advancing counters, one `handle_timeout`, and draining `poll_change`.
//!
//! The fleet is seeded and warmed up for 40 rounds (20 s of virtual time) so the containers are spread over the
//! levels and boosts, idle promotions and demotions happen while it is measured: a tenth idle, half light
//! readers, the rest bursty (on for a few rounds, off for longer) or heavy.
//!
//! The reported time is **per container per round** (the round's time divided by the number of containers);
//! the target is under 1 µs.
//!
//! `cargo bench -p ddiskqos --bench decision_round -- --warm-up-time 1 --measurement-time 3`

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use qos_core::{Config, ContainerId, Engine, IoCounters};
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

const MIB: u64 = 1 << 20;
const SAMPLE_INTERVAL: Duration = Duration::from_millis(500);

/// How a container's counters advance each round.
#[derive(Clone, Copy)]
enum Habit {
    Idle,
    Steady(u64),
    /// `bytes` per round for `on` rounds out of every `period`, starting at `phase`.
    Bursty {
        bytes: u64,
        on: u64,
        period: u64,
        phase: u64,
    },
}

struct Fleet {
    engine: Engine,
    ids: Vec<ContainerId>,
    habits: Vec<Habit>,
    counters: Vec<IoCounters>,
    now: Instant,
    round: u64,
}

impl Fleet {
    fn new(n: usize, seed: u64) -> Self {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let start = Instant::now();
        let mut engine = Engine::new(Config::default(), start).expect("default config is valid");
        let ids: Vec<_> = (0..n)
            .map(|_| {
                let [a, b, c, d]: [u64; 4] = rng.random();
                ContainerId::new(format!("{a:016x}{b:016x}{c:016x}{d:016x}")) // like a Docker id
            })
            .collect();
        let habits = (0..n)
            .map(|_| match rng.random_range(0..10) {
                0 => Habit::Idle,
                1..=5 => Habit::Steady(rng.random_range(0..MIB / 2)),
                6..=8 => Habit::Bursty {
                    bytes: rng.random_range(MIB..16 * MIB),
                    on: rng.random_range(1..4),
                    period: rng.random_range(8..24),
                    phase: rng.random_range(0..24),
                },
                _ => Habit::Steady(rng.random_range(16 * MIB..128 * MIB)),
            })
            .collect();
        for id in &ids {
            engine.handle_started(id, start);
        }
        while engine.poll_change().is_some() {}
        let mut fleet = Self { engine, ids, habits, counters: vec![IoCounters::default(); n], now: start, round: 0 };
        for _ in 0..40 {
            fleet.round();
        }
        fleet
    }

    /// One decision round; returns the number of weight changes.
    fn round(&mut self) -> usize {
        self.round += 1;
        self.now += SAMPLE_INTERVAL;
        for ((id, habit), counters) in self.ids.iter().zip(&self.habits).zip(&mut self.counters) {
            let bytes = match *habit {
                Habit::Idle => 0,
                Habit::Steady(bytes) => bytes,
                Habit::Bursty { bytes, on, period, phase } => {
                    if (self.round + phase) % period < on {
                        bytes
                    } else {
                        0
                    }
                }
            };
            counters.read += bytes;
            self.engine.handle_sample(id, *counters, self.now);
        }
        self.engine.handle_timeout(self.now);
        let mut changes = 0;
        while let Some(change) = self.engine.poll_change() {
            black_box(change);
            changes += 1;
        }
        changes
    }
}

fn decision_round(c: &mut Criterion) {
    let mut group = c.benchmark_group("decision_round_per_container");
    for n in [10usize, 1_000, 10_000] {
        let mut fleet = Fleet::new(n, 2016);
        // Sanity: the measured rounds do make decisions.
        let changes: usize = (0..40).map(|_| fleet.round()).sum();
        assert!(changes > 0, "a round with no decisions measures nothing");
        group.bench_with_input(BenchmarkId::from_parameter(n), &n, |b, &n| {
            b.iter_custom(|iters| {
                let start = Instant::now();
                for _ in 0..iters {
                    black_box(fleet.round());
                }
                start.elapsed() / n as u32
            })
        });
    }
    group.finish();
}

criterion_group!(benches, decision_round);
criterion_main!(benches);
