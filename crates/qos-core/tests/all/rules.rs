//! One test (or a few) per rule of the engine, on a hand-stepped clock.

use std::time::Duration;

use qos_core::{Config, CountMode, Engine, IoCounters, LevelConfig, Policy, Reason, Weight, WeightChange};

use crate::common::{drain, id, mib, ms, no_idle, paper, read, s, t0, w};

/// The single change of a step, asserting there is exactly one.
fn one(engine: &mut Engine) -> WeightChange {
    let changes = drain(engine);
    assert_eq!(changes.len(), 1, "expected exactly one change, got {changes:#?}");
    changes.into_iter().next().expect("one change")
}

fn level_of(engine: &Engine, name: &str, now: std::time::Instant) -> usize {
    engine.container(&id(name), now).expect("known container").level
}

// ----- entry -----

#[test]
fn started_container_enters_the_top_at_once() {
    let t = t0();
    let mut e = Engine::new(paper(), t).unwrap();
    e.handle_started(&id("a"), t);
    let c = one(&mut e);
    assert_eq!(c.id, id("a"));
    assert_eq!(c.weight, Some(Weight::MAX));
    assert_eq!((c.old_level, c.new_level, c.reason), (None, Some(0), Reason::New));
    assert_eq!(e.len(), 1);
    // Nobody is below the top and there is no periodic boost: no timer.
    assert_eq!(e.poll_timeout(), None);
}

#[test]
fn started_container_counts_from_zero() {
    let t = t0();
    let mut e = Engine::new(paper(), t).unwrap();
    e.handle_started(&id("a"), t);
    drain(&mut e);
    // The very first sample already counts: 3 MiB > the 2 MiB allotment of the top level.
    e.handle_sample(&id("a"), read(mib(3)), t + ms(500));
    let c = one(&mut e);
    assert_eq!((c.old_level, c.new_level, c.reason), (Some(0), Some(1), Reason::Demoted));
    assert_eq!(c.weight, Some(w(200)));
    assert_eq!(c.bytes_at_old_level, mib(3));
    let view = e.container(&id("a"), t + ms(500)).unwrap();
    assert_eq!((view.bytes_at_level, view.total_bytes), (mib(1), mib(3)));
}

#[test]
fn adopted_container_takes_its_first_sample_as_baseline() {
    let t = t0();
    let mut e = Engine::new(paper(), t).unwrap();
    // Seen first through a sample: 100 MiB done before the engine knew it are not held against it.
    e.handle_sample(&id("old"), read(mib(100)), t);
    let c = one(&mut e);
    assert_eq!((c.new_level, c.reason, c.weight), (Some(0), Reason::New, Some(Weight::MAX)));
    e.handle_sample(&id("old"), read(mib(102)), t + ms(500));
    assert!(drain(&mut e).is_empty(), "2 MiB is exactly the allotment, not more");
    e.handle_sample(&id("old"), read(mib(102) + 1), t + s(1));
    assert_eq!(one(&mut e).new_level, Some(1));
}

#[test]
fn threshold_is_exceeded_only_by_more_than_the_allotment() {
    let t = t0();
    let mut e = Engine::new(paper(), t).unwrap();
    e.handle_started(&id("a"), t);
    drain(&mut e);
    e.handle_sample(&id("a"), read(mib(2)), t + ms(100));
    assert!(drain(&mut e).is_empty());
    assert_eq!(level_of(&e, "a", t), 0);
    e.handle_sample(&id("a"), read(mib(2) + 1), t + ms(200));
    let c = one(&mut e);
    assert_eq!((c.new_level, c.bytes_at_old_level), (Some(1), mib(2) + 1));
    assert_eq!(e.container(&id("a"), t).unwrap().bytes_at_level, 1);
}

#[test]
fn several_thresholds_in_one_sample_carry_the_surplus_down() {
    let t = t0();
    let mut e = Engine::new(paper(), t).unwrap();
    e.handle_started(&id("a"), t);
    drain(&mut e);
    // 2 + 8 + 1 MiB: two allotments used up, 1 MiB counted at level 2; one change, not two.
    e.handle_sample(&id("a"), read(mib(11)), t + ms(500));
    let c = one(&mut e);
    assert_eq!((c.old_level, c.new_level, c.weight), (Some(0), Some(2), Some(w(40))));
    assert_eq!(c.bytes_at_old_level, mib(11));
    assert_eq!(e.container(&id("a"), t).unwrap().bytes_at_level, mib(1));
    // 31 MiB more is exactly level 2's 32 MiB: stays.
    e.handle_sample(&id("a"), read(mib(42)), t + s(1));
    assert!(drain(&mut e).is_empty());
    // One byte more reaches the bottom with one byte counted there.
    e.handle_sample(&id("a"), read(mib(42) + 1), t + ms(1500));
    let c = one(&mut e);
    assert_eq!((c.old_level, c.new_level, c.weight), (Some(2), Some(3), Some(w(10))));
    assert_eq!(e.container(&id("a"), t).unwrap().bytes_at_level, 1);
}

#[test]
fn a_huge_sample_goes_straight_to_the_bottom_and_stays() {
    let t = t0();
    let mut e = Engine::new(no_idle(), t).unwrap();
    e.handle_started(&id("a"), t);
    drain(&mut e);
    e.handle_sample(&id("a"), read(mib(2 + 8 + 32 + 500)), t + ms(500));
    let c = one(&mut e);
    assert_eq!((c.old_level, c.new_level), (Some(0), Some(3)));
    // The bottom demotes nowhere: its allotment is only reported.
    e.handle_sample(&id("a"), read(mib(10_000)), t + s(1));
    assert!(drain(&mut e).is_empty());
    let view = e.container(&id("a"), t + s(1)).unwrap();
    assert_eq!((view.level, view.bytes_at_level, view.total_bytes), (3, mib(10_000 - 42), mib(10_000)));
}

#[test]
fn count_mode_selects_the_counters() {
    let t = t0();
    for (mode, counters, expect_demoted) in [
        (CountMode::Both, IoCounters::new(mib(1), mib(1) + 1), true),
        (CountMode::Read, IoCounters::new(mib(1), mib(100)), false),
        (CountMode::Read, IoCounters::new(mib(3), 0), true),
        (CountMode::Write, IoCounters::new(mib(100), mib(1)), false),
        (CountMode::Write, IoCounters::new(0, mib(3)), true),
    ] {
        let mut e = Engine::new(Config { count: mode, ..paper() }, t).unwrap();
        e.handle_started(&id("a"), t);
        drain(&mut e);
        e.handle_sample(&id("a"), counters, t + ms(500));
        assert_eq!(!drain(&mut e).is_empty(), expect_demoted, "{mode:?} {counters:?}");
    }
}

// ----- counters that go backwards -----

#[test]
fn counter_decrease_is_a_reset_counted_from_zero() {
    let t = t0();
    let mut e = Engine::new(paper(), t).unwrap();
    e.handle_started(&id("a"), t);
    drain(&mut e);
    e.handle_sample(&id("a"), read(mib(3) / 2), t + ms(500));
    assert!(drain(&mut e).is_empty());
    // The cgroup was recreated: 1 MiB since, which brings the level's count to 2.5 MiB.
    e.handle_sample(&id("a"), read(mib(1)), t + s(1));
    let c = one(&mut e);
    assert_eq!((c.new_level, c.bytes_at_old_level), (Some(1), mib(5) / 2));
    // The new value is the next baseline: 1 MiB -> 2 MiB counts 1 MiB, not 2.
    e.handle_sample(&id("a"), read(mib(2)), t + ms(1500));
    assert_eq!(e.container(&id("a"), t).unwrap().total_bytes, mib(3) / 2 + mib(1) + mib(1));
}

#[test]
fn each_counter_resets_on_its_own() {
    let t = t0();
    let mut e = Engine::new(paper(), t).unwrap();
    e.handle_started(&id("a"), t);
    e.handle_sample(&id("a"), IoCounters::new(mib(1), 100), t + ms(500));
    // Reads went back to 10 bytes (counted as 10), writes advanced by 50.
    e.handle_sample(&id("a"), IoCounters::new(10, 150), t + s(1));
    assert_eq!(e.container(&id("a"), t).unwrap().total_bytes, mib(1) + 100 + 10 + 50);
}

#[test]
fn counters_at_u64_max_saturate_without_panicking() {
    let t = t0();
    let mut e = Engine::new(paper(), t).unwrap();
    e.handle_started(&id("a"), t);
    drain(&mut e);
    e.handle_sample(&id("a"), IoCounters::new(u64::MAX, u64::MAX), t + ms(500));
    let c = one(&mut e);
    assert_eq!((c.new_level, c.bytes_at_old_level), (Some(3), u64::MAX));
    e.handle_sample(&id("a"), IoCounters::new(0, 0), t + s(1));
    e.handle_sample(&id("a"), IoCounters::new(u64::MAX, u64::MAX), t + s(2));
    let view = e.container(&id("a"), t + s(2)).unwrap();
    assert_eq!((view.level, view.total_bytes), (3, u64::MAX));
    // An adopted container whose counters are already at the top does nothing with an equal sample.
    e.handle_sample(&id("b"), IoCounters::new(u64::MAX, u64::MAX), t);
    e.handle_sample(&id("b"), IoCounters::new(u64::MAX, u64::MAX), t + s(1));
    assert_eq!(drain(&mut e).iter().filter(|c| c.id == id("b")).count(), 1, "only the New");
}

// ----- removal and re-adding -----

#[test]
fn removal_forgets_the_container_without_a_change() {
    let t = t0();
    let mut e = Engine::new(no_idle(), t).unwrap();
    e.handle_started(&id("a"), t);
    e.handle_sample(&id("a"), read(mib(50)), t + ms(500));
    drain(&mut e);
    assert!(e.poll_timeout().is_some());
    e.handle_removed(&id("a"), t + s(1));
    assert!(drain(&mut e).is_empty());
    assert!(e.is_empty());
    assert!(e.container(&id("a"), t).is_none());
    // Its boost timer does nothing once it fired for a container that is gone.
    e.handle_timeout(t + s(11));
    assert!(drain(&mut e).is_empty());
    assert_eq!(e.poll_timeout(), None);
    // Removing an unknown container is harmless.
    e.handle_removed(&id("never"), t + s(11));
    assert!(drain(&mut e).is_empty());
}

#[test]
fn re_added_container_starts_afresh() {
    let t = t0();
    let mut e = Engine::new(no_idle(), t).unwrap();
    e.handle_started(&id("a"), t);
    e.handle_sample(&id("a"), read(mib(50)), t + ms(500));
    e.handle_removed(&id("a"), t + s(1));
    drain(&mut e);
    // Same id again, announced: new, at the top, counting from zero, old history gone.
    e.handle_started(&id("a"), t + s(2));
    let c = one(&mut e);
    assert_eq!((c.old_level, c.new_level, c.reason), (None, Some(0), Reason::New));
    let view = e.container(&id("a"), t + s(2)).unwrap();
    assert_eq!((view.level, view.total_bytes, view.bytes_at_level), (0, 0, 0));
    // Same id again after removal, adopted through a sample: that sample is the baseline.
    e.handle_removed(&id("a"), t + s(3));
    e.handle_sample(&id("a"), read(mib(500)), t + s(4));
    let c = one(&mut e);
    assert_eq!((c.new_level, c.reason), (Some(0), Reason::New));
    assert_eq!(e.container(&id("a"), t).unwrap().total_bytes, 0);
}

#[test]
fn restart_of_a_known_container_puts_it_back_at_the_top() {
    let t = t0();
    let mut e = Engine::new(no_idle(), t).unwrap();
    e.handle_started(&id("a"), t);
    e.handle_sample(&id("a"), read(mib(11)), t + ms(500));
    drain(&mut e);
    e.handle_started(&id("a"), t + s(1));
    let c = one(&mut e);
    assert_eq!((c.old_level, c.new_level, c.reason), (Some(2), Some(0), Reason::New));
    assert_eq!(c.bytes_at_old_level, mib(1));
    // Counts from zero again: the old counter value is not the baseline.
    e.handle_sample(&id("a"), read(mib(1)), t + ms(1500));
    assert!(drain(&mut e).is_empty());
    assert_eq!(e.container(&id("a"), t).unwrap().total_bytes, mib(1));
}

#[test]
fn restart_counts_from_the_last_sample_so_a_cgroup_that_outlived_its_container_is_not_charged_again() {
    let t = t0();
    let mut e = Engine::new(no_idle(), t).unwrap();
    e.handle_started(&id("pod"), t);
    e.handle_sample(&id("pod"), read(mib(1)), t + ms(500));
    drain(&mut e);
    // The pod's sandbox is made again on the same cgroup, whose counters go on from 1 MiB: only the 1.5 MiB read
    // since counts, which keeps it at the top (the first level's allotment is 2 MiB).
    e.handle_started(&id("pod"), t + s(1));
    drain(&mut e);
    e.handle_sample(&id("pod"), read(mib(1) + mib(3) / 2), t + ms(1500));
    assert!(drain(&mut e).is_empty(), "charged the cgroup's history again");
    let view = e.container(&id("pod"), t + ms(1500)).unwrap();
    assert_eq!((view.level, view.total_bytes), (0, mib(3) / 2));
}

// ----- policies -----

#[test]
fn pinned_container_holds_its_weight() {
    let t = t0();
    let mut e = Engine::new(paper(), t).unwrap();
    e.handle_started(&id("db"), t);
    e.handle_sample(&id("db"), read(mib(3)), t + ms(500));
    drain(&mut e);
    e.set_policy(&id("db"), Policy::Pinned(w(300)), t + s(1));
    let c = one(&mut e);
    assert_eq!((c.weight, c.old_level, c.new_level, c.reason), (Some(w(300)), Some(1), None, Reason::Pinned));
    // Neither I/O nor time moves it.
    e.handle_sample(&id("db"), read(mib(10_000)), t + s(2));
    e.handle_timeout(t + s(100));
    assert!(drain(&mut e).is_empty());
    let view = e.container(&id("db"), t + s(100)).unwrap();
    assert_eq!((view.policy, view.weight), (Policy::Pinned(w(300)), Some(w(300))));
    // Re-pinning at another weight emits the new weight; the same policy again emits nothing.
    e.set_policy(&id("db"), Policy::Pinned(w(500)), t + s(101));
    assert_eq!(one(&mut e).weight, Some(w(500)));
    e.set_policy(&id("db"), Policy::Pinned(w(500)), t + s(102));
    assert!(drain(&mut e).is_empty());
    // Back to managed: top level, and the I/O done while pinned is not held against it: of 2 MiB read between
    // the last sample (t + 2 s) and the next (t + 104 s), only the part after the change (1 s of 102) counts.
    e.set_policy(&id("db"), Policy::Managed, t + s(103));
    let c = one(&mut e);
    assert_eq!((c.weight, c.old_level, c.new_level, c.reason), (Some(Weight::MAX), None, Some(0), Reason::Managed));
    e.handle_sample(&id("db"), read(mib(10_002)), t + s(104));
    assert_eq!(e.container(&id("db"), t + s(104)).unwrap().bytes_at_level, mib(2) / 102);
    e.handle_sample(&id("db"), read(mib(10_004) - mib(2) / 102), t + s(105));
    assert!(drain(&mut e).is_empty(), "exactly its 2 MiB allotment");
    e.handle_sample(&id("db"), read(mib(10_004) - mib(2) / 102 + 1), t + s(106));
    assert_eq!(one(&mut e).new_level, Some(1));
}

#[test]
fn pinning_an_unknown_container_adds_it() {
    let t = t0();
    let mut e = Engine::new(paper(), t).unwrap();
    e.set_policy(&id("x"), Policy::Pinned(w(7)), t);
    let c = one(&mut e);
    assert_eq!((c.weight, c.old_level, c.new_level, c.reason), (Some(w(7)), None, None, Reason::Pinned));
    // A restart keeps the pin.
    e.handle_started(&id("x"), t + s(1));
    assert_eq!(one(&mut e).weight, Some(w(7)));
}

#[test]
fn excluded_container_is_released_and_left_alone() {
    let t = t0();
    let mut e = Engine::new(paper(), t).unwrap();
    e.handle_started(&id("a"), t);
    drain(&mut e);
    e.set_policy(&id("a"), Policy::Excluded, t + s(1));
    let c = one(&mut e);
    assert_eq!((c.weight, c.old_level, c.new_level, c.reason), (None, Some(0), None, Reason::Released));
    e.handle_sample(&id("a"), read(mib(1000)), t + s(2));
    e.handle_timeout(t + s(100));
    e.handle_started(&id("a"), t + s(101));
    assert!(drain(&mut e).is_empty(), "an excluded container gets no decision at all");
    assert_eq!(e.container(&id("a"), t).unwrap().weight, None);
    // Unknown container excluded from the start: known, never announced.
    e.set_policy(&id("b"), Policy::Excluded, t + s(102));
    assert!(drain(&mut e).is_empty());
    assert_eq!(e.len(), 2);
    // Managed again: enters the top.
    e.set_policy(&id("b"), Policy::Managed, t + s(103));
    let c = one(&mut e);
    assert_eq!((c.new_level, c.reason), (Some(0), Reason::Managed));
    // Pinned from excluded emits the pin; excluded from pinned releases.
    e.set_policy(&id("a"), Policy::Pinned(w(50)), t + s(104));
    assert_eq!(one(&mut e).reason, Reason::Pinned);
    e.set_policy(&id("a"), Policy::Excluded, t + s(105));
    let c = one(&mut e);
    assert_eq!((c.weight, c.old_level, c.reason), (None, None, Reason::Released));
}

#[test]
fn container_adopted_through_a_policy_takes_its_next_sample_as_baseline() {
    let t = t0();
    let mut e = Engine::new(paper(), t).unwrap();
    e.set_policy(&id("a"), Policy::Managed, t);
    assert_eq!(one(&mut e).reason, Reason::New);
    e.handle_sample(&id("a"), read(mib(500)), t + s(1));
    assert!(drain(&mut e).is_empty());
    assert_eq!(e.container(&id("a"), t).unwrap().total_bytes, 0);
}

// ----- starvation boost -----

#[test]
fn boost_comes_boost_after_leaving_the_top() {
    let t = t0();
    let mut e = Engine::new(no_idle(), t).unwrap();
    e.handle_started(&id("a"), t);
    e.handle_sample(&id("a"), read(mib(3)), t + ms(500));
    drain(&mut e);
    let due = t + ms(500) + s(10);
    assert_eq!(e.poll_timeout(), Some(due));
    e.handle_timeout(due - Duration::from_nanos(1));
    assert!(drain(&mut e).is_empty(), "one nanosecond early");
    e.handle_timeout(due);
    let c = one(&mut e);
    assert_eq!((c.old_level, c.new_level, c.reason, c.weight), (Some(1), Some(0), Reason::Boosted, Some(Weight::MAX)));
    assert_eq!(e.poll_timeout(), None);
    // Back at the top with a fresh allotment.
    let view = e.container(&id("a"), due).unwrap();
    assert_eq!((view.level, view.bytes_at_level), (0, 0));
}

#[test]
fn boost_counts_from_leaving_the_top_not_from_reaching_the_bottom() {
    let t = t0();
    let mut e = Engine::new(no_idle(), t).unwrap();
    e.handle_started(&id("a"), t);
    e.handle_sample(&id("a"), read(mib(3)), t + ms(500)); // 0 -> 1, leaves the top
    e.handle_sample(&id("a"), read(mib(12)), t + s(3)); // 1 -> 2
    e.handle_sample(&id("a"), read(mib(50)), t + s(6)); // 2 -> 3
    let levels: Vec<_> = drain(&mut e).iter().map(|c| c.new_level).collect();
    assert_eq!(levels, [Some(0), Some(1), Some(2), Some(3)]);
    assert_eq!(e.poll_timeout(), Some(t + ms(10_500)));
    e.handle_timeout(t + ms(10_500));
    let c = one(&mut e);
    assert_eq!((c.old_level, c.new_level, c.reason), (Some(3), Some(0), Reason::Boosted));
    // The next cycle is counted from the next departure.
    e.handle_sample(&id("a"), read(mib(50)), t + ms(10_500));
    e.handle_sample(&id("a"), read(mib(53)), t + s(11));
    assert_eq!(one(&mut e).new_level, Some(1));
    assert_eq!(e.poll_timeout(), Some(t + s(21)));
}

#[test]
fn io_done_before_a_boost_is_not_counted_at_the_top() {
    // CI of stop 40: a reader at 3 MiB per 100 ms round was boosted 1 ms before a round, and that round's 3 MiB,
    // read at the bottom, demoted it again at once; its weight 1000 lasted no round. Only the part of a sample's
    // interval after the boost counts at the top.
    let t = t0();
    let mut e = Engine::new(no_idle(), t).unwrap();
    e.handle_started(&id("r"), t);
    let mut counter = 0;
    let mut now = t;
    for _ in 0..100 {
        now += ms(100);
        counter += mib(3);
        e.handle_sample(&id("r"), read(counter), now);
    }
    assert_eq!(e.container(&id("r"), now).unwrap().level, 3);
    drain(&mut e);
    let due = e.poll_timeout().expect("its boost");
    assert_eq!(due, t + ms(100) + s(10), "10 s after it left the top");
    e.handle_timeout(due);
    assert_eq!(one(&mut e).reason, Reason::Boosted);
    // The round after the boost: 3 MiB over 101 ms, of which the last 1 ms was at the top (3 MiB / 101).
    let round = due + ms(1);
    assert_eq!(round, now + ms(101), "the boost fell 1 ms before a round");
    counter += mib(3);
    e.handle_sample(&id("r"), read(counter), round);
    assert!(drain(&mut e).is_empty(), "demoted for I/O it did at the bottom");
    let view = e.container(&id("r"), round).unwrap();
    assert_eq!((view.level, view.bytes_at_level), (0, mib(3) / 101));
    assert_eq!(view.total_bytes, counter, "all of it still counts as its I/O");
    // The next round's 3 MiB were read at the top: over the 2 MiB allotment.
    counter += mib(3);
    e.handle_sample(&id("r"), read(counter), round + ms(100));
    let c = one(&mut e);
    assert_eq!((c.old_level, c.new_level, c.reason), (Some(0), Some(1), Reason::Demoted));
}

#[test]
fn busy_container_in_a_middle_level_is_boosted_too() {
    let t = t0();
    // Idle promotion on: steady small I/O keeps it from being idle, the starvation rule still bounds its stay.
    let mut e = Engine::new(paper(), t).unwrap();
    e.handle_started(&id("a"), t);
    e.handle_sample(&id("a"), read(mib(3)), t + ms(500));
    drain(&mut e);
    let mut counter = mib(3);
    let mut now = t + ms(500);
    let mut boosted_at = None;
    for _ in 0..40 {
        now += ms(500);
        counter += 1024; // 1 KiB per half second: never exhausts level 1's 8 MiB
        e.handle_sample(&id("a"), read(counter), now);
        if e.poll_timeout().is_some_and(|d| d <= now) {
            e.handle_timeout(now);
        }
        for c in drain(&mut e) {
            assert_eq!(c.reason, Reason::Boosted, "{c:?}");
            boosted_at.get_or_insert(now);
        }
    }
    assert_eq!(boosted_at, Some(t + ms(10_500)));
}

#[test]
fn time_that_does_not_move_fires_nothing_twice() {
    let t = t0();
    let mut e = Engine::new(paper(), t).unwrap();
    e.handle_started(&id("a"), t);
    e.handle_sample(&id("a"), read(mib(100)), t);
    let changes = drain(&mut e);
    assert_eq!(changes.last().unwrap().new_level, Some(3));
    for _ in 0..3 {
        e.handle_timeout(t);
        assert!(drain(&mut e).is_empty());
    }
    // Its timers lie in the future of t, never at t itself (that would spin a driver).
    assert!(e.poll_timeout().is_some_and(|d| d > t));
}

#[test]
fn early_and_repeated_timeouts_are_harmless() {
    let t = t0();
    let mut e = Engine::new(no_idle(), t).unwrap();
    e.handle_started(&id("a"), t);
    e.handle_sample(&id("a"), read(mib(100)), t + s(1));
    drain(&mut e);
    for k in 0..=10 {
        e.handle_timeout(t + s(k));
        assert!(drain(&mut e).is_empty(), "at {k} s");
    }
    e.handle_timeout(t + s(11));
    assert_eq!(one(&mut e).reason, Reason::Boosted);
    e.handle_timeout(t + s(11));
    assert!(drain(&mut e).is_empty());
}

// ----- idle promotion -----

#[test]
fn idle_container_climbs_one_level_per_idle_period() {
    let t = t0();
    let mut e = Engine::new(paper(), t).unwrap();
    e.handle_started(&id("a"), t);
    e.handle_sample(&id("a"), read(mib(100)), t + ms(500));
    drain(&mut e);
    // Samples with unchanged counters are not I/O: they do not reset the idle clock.
    e.handle_sample(&id("a"), read(mib(100)), t + ms(2000));
    assert_eq!(e.poll_timeout(), Some(t + ms(2500)));
    let mut trail = Vec::new();
    while let Some(due) = e.poll_timeout() {
        e.handle_timeout(due);
        for c in drain(&mut e) {
            trail.push((due - t, c.old_level.unwrap(), c.new_level.unwrap(), c.reason));
        }
    }
    assert_eq!(
        trail,
        [
            (ms(2500), 3, 2, Reason::IdlePromoted),
            (ms(4500), 2, 1, Reason::IdlePromoted),
            (ms(6500), 1, 0, Reason::IdlePromoted),
        ]
    );
}

#[test]
fn io_restarts_the_idle_clock() {
    let t = t0();
    let mut e = Engine::new(paper(), t).unwrap();
    e.handle_started(&id("a"), t);
    e.handle_sample(&id("a"), read(mib(100)), t + ms(500));
    e.handle_sample(&id("a"), read(mib(101)), t + ms(2000));
    drain(&mut e);
    e.handle_timeout(t + ms(2500));
    assert!(drain(&mut e).is_empty());
    assert_eq!(e.poll_timeout(), Some(t + ms(4000)));
    e.handle_timeout(t + ms(4000));
    assert_eq!(one(&mut e).reason, Reason::IdlePromoted);
}

#[test]
fn a_late_timeout_promotes_one_level_only() {
    let t = t0();
    let cfg = Config { boost_after: s(3600), ..paper() };
    let mut e = Engine::new(cfg, t).unwrap();
    e.handle_started(&id("a"), t);
    e.handle_sample(&id("a"), read(mib(100)), t);
    drain(&mut e);
    // Idle for 9 s, called once: one level, and the next idle period counts from now.
    e.handle_timeout(t + s(9));
    let c = one(&mut e);
    assert_eq!((c.old_level, c.new_level), (Some(3), Some(2)));
    assert_eq!(e.poll_timeout(), Some(t + s(11)));
}

#[test]
fn boost_wins_over_idle_promotion() {
    let t = t0();
    let mut e = Engine::new(paper(), t).unwrap();
    e.handle_started(&id("a"), t);
    e.handle_sample(&id("a"), read(mib(100)), t);
    drain(&mut e);
    // Both idle (since 0) and starving (left the top at 0) at 10 s: straight to the top, reason Boosted.
    e.handle_timeout(t + s(10));
    let c = one(&mut e);
    assert_eq!((c.old_level, c.new_level, c.reason), (Some(3), Some(0), Reason::Boosted));
}

#[test]
fn idle_promotion_keeps_the_boost_clock_running() {
    let t = t0();
    let mut e = Engine::new(paper(), t).unwrap();
    e.handle_started(&id("a"), t);
    e.handle_sample(&id("a"), read(mib(100)), t); // leaves the top at 0
    e.handle_timeout(t + s(2)); // 3 -> 2
    e.handle_sample(&id("a"), read(mib(100) + 1), t + s(3)); // a byte of I/O: idle clock restarts
    e.handle_sample(&id("a"), read(mib(100) + 2), t + s(5));
    e.handle_sample(&id("a"), read(mib(100) + 3), t + s(7));
    e.handle_sample(&id("a"), read(mib(100) + 4), t + s(9));
    e.handle_timeout(t + s(9)); // not idle (I/O at 9 s), not starving yet
    drain(&mut e);
    assert_eq!(e.poll_timeout(), Some(t + s(10)), "the boost, 10 s after leaving the top, comes first");
    e.handle_timeout(t + s(10));
    let c = one(&mut e);
    assert_eq!((c.old_level, c.new_level, c.reason), (Some(2), Some(0), Reason::Boosted));
}

// ----- periodic boost -----

#[test]
fn periodic_boost_lifts_everyone_below_the_top() {
    let t = t0();
    let cfg = Config { boost_all_every: Some(s(5)), boost_after: s(3600), idle_promote_after: None, ..paper() };
    let mut e = Engine::new(cfg, t).unwrap();
    assert_eq!(e.poll_timeout(), Some(t + s(5)), "the periodic timer runs from construction");
    for (name, bytes) in [("c", mib(100)), ("a", mib(3)), ("b", mib(11)), ("top", mib(1))] {
        e.handle_started(&id(name), t);
        e.handle_sample(&id(name), read(bytes), t + s(1));
    }
    drain(&mut e);
    e.handle_timeout(t + s(5));
    let changes = drain(&mut e);
    let got: Vec<_> = changes.iter().map(|c| (c.id.as_str(), c.old_level.unwrap(), c.reason)).collect();
    assert_eq!(
        got,
        [("a", 1, Reason::PeriodicBoost), ("b", 2, Reason::PeriodicBoost), ("c", 3, Reason::PeriodicBoost)],
        "everyone below the top, in id order"
    );
    assert_eq!(e.poll_timeout(), Some(t + s(10)));
}

// ----- reconfigure -----

fn levels(spec: &[(u64, u64)]) -> Vec<LevelConfig> {
    spec.iter().map(|&(weight, m)| LevelConfig { weight: w(weight), threshold: qos_core::ByteSize::mib(m) }).collect()
}

#[test]
fn reconfigure_reweights_and_clamps_levels() {
    let t = t0();
    let mut e = Engine::new(no_idle(), t).unwrap();
    for (name, bytes) in [("a", 0), ("b", mib(3)), ("c", mib(100))] {
        e.handle_started(&id(name), t);
        e.handle_sample(&id(name), read(bytes), t + s(1));
    }
    e.set_policy(&id("p"), Policy::Pinned(w(5)), t + s(1));
    drain(&mut e);
    // Two levels; the top keeps its weight, level 1 changes from 200 to 100.
    let cfg = Config { levels: levels(&[(1000, 4), (100, 64)]), ..no_idle() };
    e.reconfigure(cfg.clone(), t + s(2)).unwrap();
    assert_eq!(e.config(), &cfg);
    let got: Vec<_> = drain(&mut e).iter().map(|c| (c.id.to_string(), c.old_level, c.new_level, c.weight)).collect();
    assert_eq!(
        got,
        [("b".into(), Some(1), Some(1), Some(w(100))), ("c".into(), Some(3), Some(1), Some(w(100)))],
        "a keeps its weight, the pinned one is not touched"
    );
    assert_eq!(e.poll_timeout(), Some(t + s(2)), "timers are recomputed at the next handle_timeout");
    e.handle_timeout(t + s(2));
    assert!(drain(&mut e).is_empty());
    assert_eq!(e.poll_timeout(), Some(t + s(11)), "boost_after still counts from leaving the top");
    // The new thresholds apply to the next I/O: a has 4 MiB of allotment now.
    e.handle_sample(&id("a"), read(mib(4)), t + s(3));
    assert!(drain(&mut e).is_empty());
    e.handle_sample(&id("a"), read(mib(4) + 1), t + s(4));
    assert_eq!(one(&mut e).weight, Some(w(100)));
}

#[test]
fn reconfigure_to_one_level_puts_everyone_at_the_top_for_good() {
    let t = t0();
    let mut e = Engine::new(no_idle(), t).unwrap();
    e.handle_started(&id("a"), t);
    e.handle_sample(&id("a"), read(mib(100)), t + s(1));
    drain(&mut e);
    e.reconfigure(Config { levels: levels(&[(500, 2)]), ..no_idle() }, t + s(2)).unwrap();
    let c = one(&mut e);
    assert_eq!((c.old_level, c.new_level, c.weight), (Some(3), Some(0), Some(w(500))));
    e.handle_timeout(t + s(2));
    e.handle_timeout(t + s(60));
    assert!(drain(&mut e).is_empty());
    assert_eq!(e.poll_timeout(), None);
    // Four levels again: the stale departure time must not boost it early after its next departure.
    e.reconfigure(no_idle(), t + s(100)).unwrap();
    assert_eq!(one(&mut e).weight, Some(Weight::MAX));
    e.handle_sample(&id("a"), read(mib(103)), t + s(101));
    assert_eq!(one(&mut e).new_level, Some(1));
    e.handle_timeout(t + s(101));
    assert_eq!(e.poll_timeout(), Some(t + s(111)));
}

#[test]
fn reconfigure_with_a_shorter_boost_fires_at_once() {
    let t = t0();
    let mut e = Engine::new(no_idle(), t).unwrap();
    e.handle_started(&id("a"), t);
    e.handle_sample(&id("a"), read(mib(100)), t + s(1));
    drain(&mut e);
    e.reconfigure(Config { boost_after: s(2), ..no_idle() }, t + s(5)).unwrap();
    assert!(drain(&mut e).is_empty(), "weights unchanged");
    e.handle_timeout(e.poll_timeout().unwrap());
    assert_eq!(one(&mut e).reason, Reason::Boosted);
}

#[test]
fn invalid_reconfigure_keeps_the_old_config() {
    let t = t0();
    let mut e = Engine::new(paper(), t).unwrap();
    e.handle_started(&id("a"), t);
    drain(&mut e);
    let bad = Config { levels: vec![], ..paper() };
    assert!(e.reconfigure(bad, t).is_err());
    assert_eq!(e.config(), &paper());
    assert!(drain(&mut e).is_empty());
    assert_eq!(e.poll_timeout(), None);
}

#[test]
fn new_rejects_an_invalid_config() {
    let bad = Config { boost_after: Duration::ZERO, ..paper() };
    let err = Engine::new(bad, t0()).unwrap_err();
    assert!(err.to_string().contains("boost_after"), "{err}");
}

// ----- getters -----

#[test]
fn views_report_the_state() {
    let t = t0();
    let mut e = Engine::new(paper(), t).unwrap();
    e.handle_started(&id("b"), t);
    e.handle_started(&id("a"), t);
    e.handle_sample(&id("b"), read(mib(3)), t + s(1));
    let views: Vec<_> = e.containers(t + s(4)).collect();
    assert_eq!(views.iter().map(|v| v.id.as_str()).collect::<Vec<_>>(), ["a", "b"], "id order");
    assert_eq!(views[1].time_at_level, s(3));
    assert_eq!(views[1].weight, Some(w(200)));
    assert_eq!(views[1].policy, Policy::Managed);
    assert_eq!(views[0].time_at_level, s(4));
    // A `now` before the level was entered does not panic.
    assert_eq!(e.container(&id("b"), t).unwrap().time_at_level, Duration::ZERO);
}

#[test]
fn periodic_boost_switched_on_by_reconfigure_starts_its_period_then() {
    let t = t0();
    let mut e = Engine::new(no_idle(), t).unwrap();
    e.handle_started(&id("a"), t);
    e.handle_sample(&id("a"), read(mib(100)), t + s(100));
    drain(&mut e);
    e.reconfigure(Config { boost_all_every: Some(s(5)), ..no_idle() }, t + s(101)).unwrap();
    e.handle_timeout(t + s(101));
    assert!(drain(&mut e).is_empty(), "not due at once just because the engine is older than one period");
    assert_eq!(e.poll_timeout(), Some(t + s(106)));
    e.handle_timeout(t + s(106));
    assert_eq!(one(&mut e).reason, Reason::PeriodicBoost);
    // Changing the period while it runs keeps the last boost as its start.
    e.reconfigure(Config { boost_all_every: Some(s(2)), ..no_idle() }, t + s(107)).unwrap();
    e.handle_timeout(t + s(107));
    assert_eq!(e.poll_timeout(), Some(t + s(108)));
}

// ----- the fair-share floor -----

/// The default configuration, floor on (1 s windows, 10 %), with idle promotion off so only the floor moves.
fn floor() -> Config {
    Config { idle_promote_after: None, ..Config::default() }
}

/// An engine with `a` and `b` both demoted to the bottom (weight 10) in the first window (they read as much as
/// each other: nobody moves at its end, 1 s after the start); the tests then work in the second window.
fn two_at_the_bottom(t: std::time::Instant) -> Engine {
    let mut e = Engine::new(floor(), t).unwrap();
    for name in ["a", "b"] {
        e.handle_started(&id(name), t);
        e.handle_sample(&id(name), read(mib(200)), t + ms(100));
    }
    e.handle_timeout(t + s(1));
    assert!(drain(&mut e).iter().all(|c| c.reason == Reason::New || c.reason == Reason::Demoted));
    e
}

#[test]
fn a_container_below_a_tenth_of_an_equal_weights_bytes_goes_to_the_top_at_the_window_end() {
    let t = t0();
    let mut e = two_at_the_bottom(t);
    assert_eq!(e.poll_timeout(), Some(t + s(2)), "the second window ends 2 s after the engine started");
    // In the window: a reads 5 MiB, b 100 MiB (a got 5 %, under the 10 % floor).
    e.handle_sample(&id("a"), read(mib(205)), t + ms(1900));
    e.handle_sample(&id("b"), read(mib(300)), t + ms(1900));
    e.handle_timeout(t + ms(1999));
    assert!(drain(&mut e).is_empty(), "not before the window ends");
    e.handle_timeout(t + s(2));
    let c = one(&mut e);
    assert_eq!((c.id.as_str(), c.old_level, c.new_level, c.reason), ("a", Some(3), Some(0), Reason::ShareBoosted));
    assert_eq!(c.weight, Some(Weight::MAX));
    assert_eq!(level_of(&e, "a", t + s(2)), 0);
    // The next window starts afresh and ends a window later.
    assert_eq!(e.poll_timeout(), Some(t + s(3)));
}

#[test]
fn a_fair_or_an_idle_or_a_lower_weighted_container_stays_where_it_is() {
    let t = t0();
    // Fair enough: 15 % of b's bytes.
    let mut e = two_at_the_bottom(t);
    e.handle_sample(&id("a"), read(mib(215)), t + ms(1900));
    e.handle_sample(&id("b"), read(mib(300)), t + ms(1900));
    e.handle_timeout(t + s(2));
    assert!(drain(&mut e).is_empty());
    // No longer asking: its last sample counted nothing.
    let mut e = two_at_the_bottom(t);
    e.handle_sample(&id("a"), read(mib(201)), t + ms(1500));
    e.handle_sample(&id("a"), read(mib(201)), t + ms(1900));
    e.handle_sample(&id("b"), read(mib(300)), t + ms(1900));
    e.handle_timeout(t + s(2));
    assert!(drain(&mut e).is_empty());
    // The one with more bytes has a higher weight: that is what weights are for.
    let mut e = two_at_the_bottom(t);
    e.handle_started(&id("c"), t + ms(1200));
    drain(&mut e);
    e.handle_sample(&id("c"), read(mib(1) + (900 << 10)), t + ms(1900)); // still at the top: 1000
    e.handle_sample(&id("a"), read(mib(200) + (100 << 10)), t + ms(1900)); // bottom: 10, 5 % of c's bytes
    e.handle_sample(&id("b"), read(mib(200) + (100 << 10)), t + ms(1900));
    e.handle_timeout(t + s(2));
    assert!(drain(&mut e).is_empty(), "a and b got as much as each other; c is above them");
}

#[test]
fn bytes_a_container_did_while_boosted_above_a_reader_do_not_share_boost_the_reader() {
    // Issue 26's trace (crates/bench/results/2026-11-27/exp2-trace-*): the background's starvation boost put it at
    // the top for one sample, where it read 100 MiB; back at the bottom by the window's end, its window's bytes
    // made a reader at 40 (which it had outweighed) look starved, and the reader went to the top beside the new
    // small readers. The floor now counts a peer's bytes at its current weight only.
    let t = t0();
    let mut e = Engine::new(floor(), t).unwrap();
    e.handle_started(&id("bg"), t);
    e.handle_sample(&id("bg"), read(mib(200)), t + ms(100)); // to the bottom (10)
    e.handle_timeout(t + s(1));
    e.handle_started(&id("r"), t + s(5));
    e.handle_sample(&id("r"), read(mib(11)), t + ms(5100)); // to level 2 (40)
    e.handle_timeout(t + s(6));
    drain(&mut e);
    e.handle_timeout(t + ms(10_100));
    let c = one(&mut e);
    assert_eq!((c.id.as_str(), c.reason), ("bg", Reason::Boosted), "10 s below the top");
    // At the top it reads 100 MiB and goes back down; the reader reads 2 MiB at 40.
    e.handle_sample(&id("bg"), read(mib(200)), t + ms(10_100));
    e.handle_sample(&id("bg"), read(mib(300)), t + ms(10_500));
    e.handle_sample(&id("r"), read(mib(13)), t + ms(10_500));
    assert_eq!(one(&mut e).new_level, Some(3));
    e.handle_timeout(t + ms(11_100));
    assert!(drain(&mut e).is_empty(), "its bytes were done at 1000, above the reader's 40");
    // The next window: the background reads 100 MiB at 10, the reader 2 MiB at 40: under the floor.
    e.handle_sample(&id("bg"), read(mib(400)), t + ms(12_000));
    e.handle_sample(&id("r"), read(mib(15)), t + ms(12_000));
    e.handle_timeout(t + ms(12_100));
    let c = one(&mut e);
    assert_eq!((c.id.as_str(), c.reason), ("r", Reason::ShareBoosted));
}

#[test]
fn a_pinned_container_counts_as_the_other_side_but_is_never_moved() {
    let t = t0();
    let mut e = Engine::new(floor(), t).unwrap();
    e.set_policy(&id("pinned"), Policy::Pinned(w(5)), t);
    e.handle_sample(&id("pinned"), read(0), t + ms(100));
    e.handle_started(&id("a"), t);
    e.handle_sample(&id("a"), read(mib(200)), t + ms(100));
    e.handle_timeout(t + s(1));
    drain(&mut e);
    // The pinned one (weight 5, below a's 10) reads 500 MiB, a 1 MiB.
    e.handle_sample(&id("pinned"), read(mib(500)), t + ms(1900));
    e.handle_sample(&id("a"), read(mib(201)), t + ms(1900));
    e.handle_timeout(t + s(2));
    let c = one(&mut e);
    assert_eq!((c.id.as_str(), c.reason), ("a", Reason::ShareBoosted));
}

#[test]
fn switching_the_floor_off_and_on_by_reconfigure() {
    let t = t0();
    let mut e = two_at_the_bottom(t);
    e.reconfigure(Config { share_window: None, ..floor() }, t + ms(500)).unwrap();
    e.handle_sample(&id("a"), read(mib(201)), t + ms(1900));
    e.handle_sample(&id("b"), read(mib(400)), t + ms(1900));
    e.handle_timeout(t + s(5));
    assert!(drain(&mut e).iter().all(|c| c.reason != Reason::ShareBoosted));
    // On again: a new window from the reconfigure, counting only what comes after it.
    e.reconfigure(Config { share_window: Some(ms(500)), ..floor() }, t + s(6)).unwrap();
    drain(&mut e);
    e.handle_sample(&id("a"), read(mib(202)), t + ms(6400));
    e.handle_sample(&id("b"), read(mib(500)), t + ms(6400));
    e.handle_timeout(t + ms(6500));
    let c = one(&mut e);
    assert_eq!((c.id.as_str(), c.reason), ("a", Reason::ShareBoosted));
}
