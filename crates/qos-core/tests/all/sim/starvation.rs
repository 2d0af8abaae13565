//! The fair-share floor on the BFQ model ([`DiskModel::BfqSlots`]): the starvation issue 26 found (a 100 MiB
//! reader, demoted to the background's bottom weight, served about one request per background slot until the time
//! rule lifted it `boost_after` after it left the top), and the property that rules it out: a reader that keeps
//! reading gets a stated part of its fair share over any window of a stated length.

use std::time::Duration;

use proptest::prelude::*;
use qos_core::{Config, Reason};

use super::{run, DiskModel, Outcome, SimConfig, TimerMode, Workload, MIB};

/// This machine's loop device in BFQ's default mode: ~500 MiB/s, 1 MiB requests, 124 ms slots.
fn bfq_disk(sample_ms: u64, config: Config, duration: Duration, seed: u64) -> SimConfig {
    SimConfig {
        qos: Some(config),
        bandwidth: 500 * MIB,
        jitter_percent: 10,
        step: Duration::from_millis(1),
        sample_interval: Duration::from_millis(sample_ms),
        timers: TimerMode::AtPollTimeout,
        duration,
        seed,
        disk: DiskModel::BfqSlots { request: MIB, slot: Duration::from_millis(124) },
    }
}

fn without_floor() -> Config {
    Config { share_window: None, ..Config::default() }
}

/// The background from the start, a 100 MiB reader at 5 s: the bench's Experiment 1 case that starved.
fn reader_beside_background() -> Vec<Workload> {
    vec![Workload::background("bg", Duration::ZERO), Workload::read("reader", Duration::from_secs(5), 100 * MIB)]
}

#[test]
fn without_the_floor_a_reader_at_the_backgrounds_weight_reads_at_a_trickle() {
    // The engine before the fair-share floor, sampling every 100 ms as the bench did: the reader reaches the
    // bottom (the background's weight) after 42 MiB and reads the rest at about one request per background slot
    // (8 MiB/s of 500) until it is done or the time rule lifts it.
    let out = run(&bfq_disk(100, without_floor(), Duration::from_secs(30), 7), &reader_beside_background());
    let took = out.read_time("reader");
    assert!(took >= Duration::from_secs(6), "{took:?}");
    assert!(!out.steps("reader").iter().any(|(_, r)| *r == Reason::ShareBoosted));
}

#[test]
fn the_fair_share_floor_lifts_a_starved_reader_within_a_window() {
    let out = run(&bfq_disk(100, Config::default(), Duration::from_secs(30), 7), &reader_beside_background());
    let took = out.read_time("reader");
    assert!(took <= Duration::from_secs(3), "{took:?}");
    let steps = out.steps("reader");
    assert!(steps.iter().any(|(l, r)| *l == 0 && *r == Reason::ShareBoosted), "{steps:?}");
    assert!(!steps.iter().any(|(_, r)| *r == Reason::Boosted), "the time rule was not needed: {steps:?}");
    for sample_ms in [100, 500] {
        let out = run(&bfq_disk(sample_ms, Config::default(), Duration::from_secs(30), 7), &reader_beside_background());
        assert!(out.read_time("reader") <= Duration::from_secs(3), "{sample_ms} ms: {:?}", out.read_time("reader"));
        // The background is never lifted by the floor: it has the most bytes at the lowest weight.
        assert!(!out.steps("bg").iter().any(|(_, r)| *r == Reason::ShareBoosted), "{:?}", out.steps("bg"));
    }
}

#[test]
fn on_an_ideal_disk_the_floor_changes_nothing() {
    // Proportional sharing gives the reader its weight's share: nobody falls below the floor, the trajectories are
    // the same with and without it.
    let ideal =
        |config| SimConfig { disk: DiskModel::Proportional, ..bfq_disk(500, config, Duration::from_secs(30), 7) };
    let with = run(&ideal(Config::default()), &reader_beside_background());
    let without = run(&ideal(without_floor()), &reader_beside_background());
    assert_eq!(with.changes, without.changes);
}

/// Bytes `name` read between two sample instants (both multiples of the sample interval).
fn read_between(out: &Outcome, name: &str, from: Duration, to: Duration) -> Option<u64> {
    let at = |t: Duration| out.samples_of(name).find(|s| s.at == t).map(|s| s.read);
    Some(at(to)? - at(from)?)
}

/// The stated share: over any window of `2 x share_window + 2 x sample_interval`, a reader that reads through the
/// whole window gets at least `FLOOR_OF_FAIR` of its fair share (the window's bytes of every container / the
/// containers reading through it). The floor's own test is a tenth of another container's bytes; half of that,
/// against the fair share, leaves room for the window boundaries.
const FLOOR_OF_FAIR: f64 = 0.05;

/// The window of the stated share with the default `share_window` (1 s).
fn window(cfg: &SimConfig) -> Duration {
    2 * Config::default().share_window.expect("on by default") + 2 * cfg.sample_interval
}

/// Windows in which some reader got less than the stated share: (reader, window start, its share of fair).
fn starved_windows(out: &Outcome, cfg: &SimConfig, workloads: &[Workload]) -> Vec<(String, Duration, f64)> {
    let window = window(cfg);
    let mut found = Vec::new();
    let mut from = cfg.sample_interval;
    while from + window <= cfg.duration {
        let to = from + window;
        // Readers through the whole window: started before it, still reading at its end.
        let through: Vec<&Workload> = workloads
            .iter()
            .filter(|w| w.start < from && out.read_time.get(&w.name).is_none_or(|t| w.start + *t > to))
            .collect();
        let total: u64 = workloads.iter().filter_map(|w| read_between(out, &w.name, from, to)).sum();
        if through.len() >= 2 {
            let fair = total as f64 / through.len() as f64;
            for w in through.iter().filter(|w| !w.deep) {
                let got = read_between(out, &w.name, from, to).unwrap_or(0) as f64;
                if got < FLOOR_OF_FAIR * fair {
                    found.push((w.name.clone(), from, got / fair));
                }
            }
        }
        from += cfg.sample_interval;
    }
    found
}

#[test]
fn the_stated_share_fails_without_the_floor() {
    // The property is not vacuous: the engine without the floor breaks it on the case above.
    let cfg = bfq_disk(100, without_floor(), Duration::from_secs(30), 7);
    let out = run(&cfg, &reader_beside_background());
    assert!(!starved_windows(&out, &cfg, &reader_beside_background()).is_empty());
}

/// Random queue-depth-1 readers (8 to 256 MiB, starting within 20 s) beside the deep background.
fn random_readers() -> impl Strategy<Value = Vec<Workload>> {
    prop::collection::vec((8u64..=256, 0u64..=20_000), 1..=4).prop_map(|readers| {
        let mut all = vec![Workload::background("bg", Duration::ZERO)];
        all.extend(
            readers.into_iter().enumerate().map(|(i, (mib, start))| {
                Workload::read(&format!("r{i}"), Duration::from_millis(500 + start), mib * MIB)
            }),
        );
        all
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Every reader that keeps reading gets at least the stated share over every window, on the BFQ model, with
    /// the bench's and the agent's sample intervals.
    #[test]
    fn every_reader_gets_the_stated_share(workloads in random_readers(), sample_ms in prop::sample::select(vec![100u64, 500]), seed in 0u64..1000) {
        let cfg = bfq_disk(sample_ms, Config::default(), Duration::from_secs(40), seed);
        let out = run(&cfg, &workloads);
        let starved = starved_windows(&out, &cfg, &workloads);
        prop_assert!(starved.is_empty(), "{:?}", starved);
    }
}
