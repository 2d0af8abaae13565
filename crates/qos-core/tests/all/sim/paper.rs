//! Replays the paper's experiments on the deterministic simulator (`super`) and checks the level trajectories
//! the rules imply, the starvation bound, and that small reads finish sooner with dDiskQoS than without.
//!
//! Sizes are in MiB, like the default thresholds (2, 8, 32, 128 MiB), so "2 MB" in Table 4 is exactly the top
//! level's allotment. The disk moves 70 MiB/s (±10 % per millisecond, seeded); the driver samples every 500 ms
//! (the agent's default).

use std::time::Duration;

use qos_core::{Config, Reason};

use super::{random_workloads, run, Outcome, SimConfig, TimerMode, Workload, MIB};

const fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

/// Level a container must be at once `bytes` were counted since it entered the top, if nothing lifted it since:
/// the number of cumulative allotments (2, 2+8, 2+8+32 MiB) it has exceeded.
fn level_for(config: &Config, bytes: u64) -> usize {
    let mut sum = 0;
    let mut level = 0;
    for l in &config.levels[..config.levels.len() - 1] {
        sum += l.threshold.0;
        if bytes > sum {
            level += 1;
        }
    }
    level
}

/// Checks, for every sample before the container was first lifted (boost or idle promotion), that its level is
/// exactly what its counter implies. Returns the number of samples checked.
fn assert_levels_follow_allotments(out: &Outcome, config: &Config, name: &str) -> usize {
    let trajectory = out.trajectory(name);
    let first_lift =
        trajectory.iter().find(|(_, _, r)| !matches!(r, Reason::New | Reason::Demoted)).map(|(t, _, _)| *t);
    let mut checked = 0;
    for sample in out.samples_of(name).filter(|s| first_lift.is_none_or(|t| s.at < t)) {
        let level = trajectory.iter().rev().find(|(t, _, _)| *t <= sample.at).and_then(|(_, l, _)| *l).unwrap();
        assert_eq!(
            level,
            level_for(config, sample.read),
            "{name} at {:?} with {} MiB read",
            sample.at,
            sample.read as f64 / MIB as f64
        );
        checked += 1;
    }
    checked
}

/// Every time a container leaves the top, it is back within `boost_after` (+ `slack`), and no earlier than
/// `boost_after` unless idle promotion brought it back. Returns the number of boosts seen.
fn assert_boosts_on_time(out: &Outcome, config: &Config, name: &str, slack: Duration) -> usize {
    let mut left_top = None;
    let mut boosts = 0;
    for (t, level, reason) in out.trajectory(name) {
        match level {
            Some(0) => {
                if let Some(left) = left_top.take() {
                    let below = t - left;
                    assert!(below <= config.boost_after + slack, "{name} below the top for {below:?} at {t:?}");
                    if reason == Reason::Boosted {
                        assert!(below >= config.boost_after, "{name} boosted early, after {below:?} at {t:?}");
                        boosts += 1;
                    }
                }
            }
            Some(_) => {
                left_top.get_or_insert(t);
            }
            None => left_top = None,
        }
    }
    boosts
}

// ----- Table 3: one reader of 1, 10, 100, 1000 MiB under a background reader -----

#[test]
fn table3_small_readers_keep_the_top_and_finish_sooner() {
    let config = Config::default();
    for (size, expected_steps) in
        [(1, vec![(0, Reason::New)]), (10, vec![(0, Reason::New), (1, Reason::Demoted), (0, Reason::IdlePromoted)])]
    {
        let workloads = [Workload::background("bg", Duration::ZERO), Workload::read("reader", secs(3), size * MIB)];
        let qos = run(&SimConfig::paper(secs(20), 3), &workloads);
        let original = run(&SimConfig::paper(secs(20), 3).without_qos(), &workloads);
        assert_eq!(qos.steps("reader"), expected_steps, "{size} MiB");
        assert_levels_follow_allotments(&qos, &config, "reader");
        // With the background reader at the bottom (weight 10) the new reader (1000) gets ~99 % of the disk
        // instead of half of it: about twice as fast.
        let (q, o) = (qos.read_time("reader"), original.read_time("reader"));
        assert!(q * 10 < o * 6, "{size} MiB: {q:?} with dDiskQoS, {o:?} without");
    }
}

#[test]
fn table3_large_readers_sink_to_the_bottom_after_42_mib() {
    let config = Config::default();
    for size in [100, 1000] {
        let workloads = [Workload::background("bg", Duration::ZERO), Workload::read("reader", secs(3), size * MIB)];
        let qos = run(&SimConfig::paper(secs(45), 3), &workloads);
        let original = run(&SimConfig::paper(secs(45), 3).without_qos(), &workloads);
        assert_eq!(qos.bytes_read["reader"], size * MIB);
        let steps = qos.steps("reader");
        assert_eq!(steps[0], (0, Reason::New));
        assert!(steps.contains(&(3, Reason::Demoted)), "{size} MiB reaches the bottom: {steps:?}");
        assert!(assert_levels_follow_allotments(&qos, &config, "reader") >= 2);
        assert_boosts_on_time(&qos, &config, "reader", Duration::ZERO);
        // It ends back at the top: by idle promotion (one level per 2 s idle) or by the starvation boost.
        assert_eq!(steps.last().unwrap().0, 0, "{steps:?}");
        let (q, o) = (qos.read_time("reader"), original.read_time("reader"));
        assert!(q < o, "{size} MiB: {q:?} with dDiskQoS, {o:?} without");
    }
}

#[test]
fn background_reader_sinks_and_is_boosted_every_boost_after() {
    let config = Config::default();
    let qos = run(&SimConfig::paper(secs(45), 11), &[Workload::background("bg", Duration::ZERO)]);
    let checked = assert_levels_follow_allotments(&qos, &config, "bg");
    assert!(checked >= 2, "it reaches the bottom only once more than 2+8+32 MiB were read");
    let trajectory = qos.trajectory("bg");
    let bottom = trajectory.iter().find(|(_, l, _)| *l == Some(3)).expect("reaches the bottom");
    let at_bottom = qos.samples_of("bg").find(|s| s.at == bottom.0).unwrap().read;
    assert!(at_bottom > 42 * MIB, "at the bottom after {at_bottom} bytes");
    // Boosted exactly boost_after after leaving the top (the driver wakes at poll_timeout()): at 10.5 s, then
    // every 10 s after each departure; never at the top long (it has 2 MiB there).
    assert_eq!(assert_boosts_on_time(&qos, &config, "bg", Duration::ZERO), 4);
    let boosts: Vec<_> = trajectory.iter().filter(|(_, _, r)| *r == Reason::Boosted).map(|(t, _, _)| *t).collect();
    assert_eq!(boosts[0], Duration::from_millis(10_500));
}

#[test]
fn boost_with_a_tick_driver_comes_within_one_sampling_interval() {
    let config = Config::default();
    // 300 ms does not divide 10 s: the boost is due between two ticks and comes at the next one.
    let mut cfg = SimConfig::paper(secs(45), 5);
    cfg.timers = TimerMode::OnSampleTick;
    cfg.sample_interval = Duration::from_millis(300);
    let qos = run(&cfg, &[Workload::background("bg", Duration::ZERO)]);
    assert!(assert_boosts_on_time(&qos, &config, "bg", cfg.sample_interval) >= 3);
    let lateness: Vec<_> = {
        let t = qos.trajectory("bg");
        let departures = t.windows(2).filter(|w| w[0].1 == Some(0) && w[1].1 != Some(0)).map(|w| w[1].0);
        let boosts = t.iter().filter(|(_, _, r)| *r == Reason::Boosted).map(|(t, _, _)| *t);
        departures.zip(boosts).map(|(d, b)| b - d - config.boost_after).collect()
    };
    assert!(lateness.iter().all(|l| *l > Duration::ZERO && *l < cfg.sample_interval), "{lateness:?}");
}

// ----- Table 4: staggered readers over a background reader -----

fn table4() -> Vec<Workload> {
    vec![
        Workload::background("bg", Duration::ZERO),
        // Table 5 reports a 64 MB read without its start time; it starts at 1 s here.
        Workload::read("r64m@1s", secs(1), 64 * MIB),
        Workload::read("r2m@2s", secs(2), 2 * MIB),
        Workload::read("r4m@2s", secs(2), 4 * MIB),
        Workload::read("r16m@3s", secs(3), 16 * MIB),
        Workload::read("r4m@4s", secs(4), 4 * MIB),
    ]
}

#[test]
fn table4_levels_follow_the_allotments() {
    let config = Config::default();
    let qos = run(&SimConfig::paper(secs(25), 42), &table4());
    use Reason::{Demoted, IdlePromoted, New};
    // 2 MiB is exactly the top's allotment: never demoted.
    assert_eq!(qos.steps("r2m@2s"), [(0, New)]);
    // 4 MiB: 2 MiB over the top's allotment, well within level 1's; back up after 2 s without I/O.
    assert_eq!(qos.steps("r4m@2s"), [(0, New), (1, Demoted), (0, IdlePromoted)]);
    assert_eq!(qos.steps("r4m@4s"), [(0, New), (1, Demoted), (0, IdlePromoted)]);
    // 16 MiB: past 2 + 8 MiB in one sample (surplus carried), then one level per idle period.
    assert_eq!(qos.steps("r16m@3s"), [(0, New), (2, Demoted), (1, IdlePromoted), (0, IdlePromoted)]);
    // 64 MiB: past 2 + 8 + 32 MiB, to the bottom.
    let steps = qos.steps("r64m@1s");
    assert!(steps.contains(&(3, Demoted)), "{steps:?}");
    assert_eq!(&steps[steps.len() - 3..], [(2, IdlePromoted), (1, IdlePromoted), (0, IdlePromoted)]);
    for w in &table4() {
        assert_levels_follow_allotments(&qos, &config, &w.name);
        assert_boosts_on_time(&qos, &config, &w.name, Duration::ZERO);
    }
    // Idle promotions come one idle period (2 s) after the last sample that showed I/O, then every 2 s.
    for name in ["r4m@2s", "r4m@4s", "r16m@3s", "r64m@1s"] {
        let samples: Vec<_> = qos.samples_of(name).collect();
        let last_io = samples.windows(2).filter(|w| w[1].read > w[0].read).map(|w| w[1].at).next_back();
        let last_io = last_io.unwrap_or(samples[0].at);
        let t = qos.trajectory(name);
        let promotions: Vec<_> = t.iter().filter(|(_, _, r)| *r == IdlePromoted).map(|(t, _, _)| *t).collect();
        let expected: Vec<_> = (1..=promotions.len() as u32).map(|k| last_io + secs(2) * k).collect();
        assert_eq!(promotions, expected, "{name}");
    }
}

#[test]
fn table5_every_read_finishes_sooner_with_ddiskqos() {
    for seed in [1, 2, 3] {
        let qos = run(&SimConfig::paper(secs(25), seed), &table4());
        let original = run(&SimConfig::paper(secs(25), seed).without_qos(), &table4());
        for w in &table4()[1..] {
            let (q, o) = (qos.read_time(&w.name), original.read_time(&w.name));
            assert!(q < o, "seed {seed}, {}: {q:?} with dDiskQoS, {o:?} without", w.name);
        }
    }
}

// ----- determinism and random workloads -----

#[test]
fn runs_repeat_exactly_and_depend_on_the_seed() {
    let workloads = random_workloads(9, 10, secs(10));
    let a = run(&SimConfig::paper(secs(20), 9), &workloads);
    let b = run(&SimConfig::paper(secs(20), 9), &workloads);
    assert_eq!(a, b);
    assert!(!a.changes.is_empty());
    let c = run(&SimConfig::paper(secs(20), 10), &workloads);
    assert_ne!(a.samples, c.samples, "the seed drives the disk's jitter");
    assert_eq!(random_workloads(9, 10, secs(10)), workloads);
    assert_ne!(random_workloads(8, 10, secs(10)), workloads);
}

#[test]
fn random_workloads_keep_the_rules() {
    let config = Config::default();
    for seed in 0..6 {
        let mut workloads = random_workloads(seed, 12, secs(20));
        workloads.push(Workload::background("bg", Duration::ZERO));
        for timers in [TimerMode::AtPollTimeout, TimerMode::OnSampleTick] {
            let mut cfg = SimConfig::paper(secs(40), seed);
            cfg.timers = timers;
            let out = run(&cfg, &workloads);
            let slack = if timers == TimerMode::AtPollTimeout { Duration::ZERO } else { cfg.sample_interval };
            for w in &workloads {
                assert_levels_follow_allotments(&out, &config, &w.name);
                assert_boosts_on_time(&out, &config, &w.name, slack);
                // Demotions only at samples that show new I/O.
                let samples: Vec<_> = out.samples_of(&w.name).collect();
                for (t, _, _) in out.trajectory(&w.name).into_iter().filter(|(_, _, r)| *r == Reason::Demoted) {
                    let i = samples.iter().position(|s| s.at == t).expect("demoted at a sample");
                    let before = if i == 0 { 0 } else { samples[i - 1].read };
                    assert!(samples[i].read > before, "seed {seed}: {} demoted without I/O at {t:?}", w.name);
                }
                // Every weight applied is its level's.
                for (_, c) in out.changes.iter().filter(|(_, c)| c.id.as_str() == w.name) {
                    assert_eq!(c.weight, Some(config.levels[c.new_level.unwrap()].weight));
                }
            }
        }
    }
}
