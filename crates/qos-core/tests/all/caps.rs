//! The bottom level's cap (`bottom_cap_window`, `bottom_cap_percent`): when it is set, from what, and every way it
//! is lifted.

use std::time::Instant;

use qos_core::{Cap, CapChange, Config, Engine, IoCounters, Policy, Reason};

use crate::common::{drain, id, mib, ms, no_idle, read, s, t0, w};

/// The paper's rules without idle promotion, with the cap on (1 s at 95 %).
fn capped() -> Config {
    Config { bottom_cap_window: Some(s(1)), ..no_idle() }
}

/// `got` is `want` give or take a byte per second or two (integer arithmetic).
fn assert_close(got: Option<u64>, want: u64) {
    let got = got.expect("a cap");
    assert!(got.abs_diff(want) <= 2, "cap {got}, want {want}");
}

/// Every pending cap change.
fn caps(engine: &mut Engine) -> Vec<CapChange> {
    std::iter::from_fn(|| engine.poll_cap_change()).collect()
}

/// A reader that reads `rate` MiB per 100 ms round from `from` for `rounds` rounds, starting at `start` bytes;
/// returns its counter and clock after the last round.
fn read_steadily(e: &mut Engine, name: &str, start: u64, from: Instant, rounds: u64, rate: u64) -> (u64, Instant) {
    let mut bytes = start;
    let mut now = from;
    for _ in 0..rounds {
        now += ms(100);
        bytes += mib(rate);
        e.handle_sample(&id(name), read(bytes), now);
    }
    (bytes, now)
}

/// Started at `t`, read 200 MiB in one sample at `t + 100 ms`: at the bottom (the paper's four levels).
fn at_bottom(e: &mut Engine, name: &str, t: Instant) -> (u64, Instant) {
    e.handle_started(&id(name), t);
    e.handle_sample(&id(name), read(mib(200)), t + ms(100));
    assert_eq!(e.container(&id(name), t + ms(100)).unwrap().level, 3);
    drain(e);
    (mib(200), t + ms(100))
}

#[test]
fn a_reader_settled_at_the_bottom_is_capped_at_95_percent_of_its_own_rate_after_one_second() {
    let t = t0();
    let mut e = Engine::new(capped(), t).unwrap();
    let (bytes, now) = at_bottom(&mut e, "big", t);
    // 14 MiB a round is 140 MiB/s: nothing before a whole second of it.
    let (bytes, now) = read_steadily(&mut e, "big", bytes, now, 9, 14);
    assert_eq!(caps(&mut e), vec![], "capped before bottom_cap_window");
    let (_, now) = read_steadily(&mut e, "big", bytes, now, 1, 14);
    let want = Cap { read_bps: Some(mib(140) * 95 / 100), write_bps: None };
    assert_eq!(caps(&mut e), vec![CapChange { id: id("big"), cap: Some(want) }]);
    assert_eq!(e.container(&id("big"), now).unwrap().cap, Some(want));
    // Set once: more of the same changes nothing.
    read_steadily(&mut e, "big", mib(400), now, 20, 14);
    assert_eq!(caps(&mut e), vec![]);
}

#[test]
fn each_direction_is_capped_on_its_own_rate_and_a_slow_one_not_at_all() {
    let t = t0();
    let mut e = Engine::new(capped(), t).unwrap();
    let (_, now) = at_bottom(&mut e, "mixed", t);
    // 10 MiB read and 100 KiB written a round: 100 MiB/s and 1000 KiB/s (under MIN_CAP_BPS) over one second.
    let mut now2 = now;
    for i in 1..=10u64 {
        now2 = now + ms(100 * i);
        e.handle_sample(&id("mixed"), IoCounters::new(mib(200) + i * mib(10), i * 100 * 1024), now2);
    }
    let got = caps(&mut e);
    assert_eq!(got, vec![CapChange { id: id("mixed"), cap: Some(Cap { read_bps: Some(mib(95)), write_bps: None }) }]);
    assert!(e.container(&id("mixed"), now2).unwrap().cap.is_some());
}

#[test]
fn a_pause_restarts_the_measurement_so_the_rate_is_never_averaged_over_idle_time() {
    let t = t0();
    let mut e = Engine::new(capped(), t).unwrap();
    let (bytes, now) = at_bottom(&mut e, "bursty", t);
    let (bytes, now) = read_steadily(&mut e, "bursty", bytes, now, 8, 14);
    // A round without I/O.
    let now = now + ms(100);
    e.handle_sample(&id("bursty"), read(bytes), now);
    let (bytes, now) = read_steadily(&mut e, "bursty", bytes, now, 5, 14);
    assert_eq!(caps(&mut e), vec![], "the second before the pause was counted");
    // The measurement starts at the first sample after the pause: a whole second of reading from there.
    let (_, _) = read_steadily(&mut e, "bursty", bytes, now, 6, 14);
    let got = caps(&mut e);
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].cap.unwrap().read_bps, Some(mib(140) * 95 / 100));
}

#[test]
fn a_boost_lifts_the_cap_and_the_next_stay_at_the_bottom_measures_afresh() {
    let t = t0();
    let mut e = Engine::new(capped(), t).unwrap();
    let (bytes, now) = at_bottom(&mut e, "big", t);
    let (bytes, now) = read_steadily(&mut e, "big", bytes, now, 10, 14);
    assert_eq!(caps(&mut e).len(), 1);
    // boost_after (10 s) after it left the top.
    let boost = t + ms(100) + s(10);
    e.handle_timeout(boost);
    let changes = drain(&mut e);
    assert_eq!(changes.len(), 1);
    assert_eq!((changes[0].reason, changes[0].weight), (Reason::Boosted, Some(w(1000))));
    assert_eq!(caps(&mut e), vec![CapChange { id: id("big"), cap: None }]);
    assert_eq!(e.container(&id("big"), boost).unwrap().cap, None);
    // Down again and a slower second at the bottom: the new cap is from the new rate.
    // A sample at the boost, then 200 MiB in the next round: all of it counted after the boost, to the bottom.
    let now = now.max(boost);
    e.handle_sample(&id("big"), read(bytes), now);
    e.handle_sample(&id("big"), read(bytes + mib(200)), now + ms(100));
    assert_eq!(e.container(&id("big"), now + ms(100)).unwrap().level, 3);
    let (_, _) = read_steadily(&mut e, "big", bytes + mib(200), now + ms(100), 10, 7);
    let got = caps(&mut e);
    assert_eq!(
        got,
        vec![CapChange { id: id("big"), cap: Some(Cap { read_bps: Some(mib(70) * 95 / 100), write_bps: None }) }]
    );
}

#[test]
fn idle_promotion_the_fair_share_floor_a_policy_change_and_a_restart_each_lift_the_cap() {
    let t = t0();
    // Idle promotion: one level up after 2 s without I/O.
    let mut e =
        Engine::new(Config { share_window: None, bottom_cap_window: Some(s(1)), ..Config::default() }, t).unwrap();
    let (bytes, now) = at_bottom(&mut e, "a", t);
    let (bytes, now) = read_steadily(&mut e, "a", bytes, now, 10, 14);
    assert_eq!(caps(&mut e).len(), 1);
    e.handle_sample(&id("a"), read(bytes), now + ms(100));
    e.handle_timeout(now + s(3));
    assert_eq!(drain(&mut e)[0].reason, Reason::IdlePromoted);
    assert_eq!(caps(&mut e), vec![CapChange { id: id("a"), cap: None }]);

    // Policy: pinned.
    let mut e = Engine::new(capped(), t).unwrap();
    let (bytes, now) = at_bottom(&mut e, "b", t);
    let (_, now) = read_steadily(&mut e, "b", bytes, now, 10, 14);
    assert_eq!(caps(&mut e).len(), 1);
    e.set_policy(&id("b"), Policy::Pinned(w(500)), now);
    assert_eq!(caps(&mut e), vec![CapChange { id: id("b"), cap: None }]);
    e.set_policy(&id("b"), Policy::Excluded, now);
    assert_eq!(caps(&mut e), vec![], "lifted once");

    // A restart.
    let mut e = Engine::new(capped(), t).unwrap();
    let (bytes, now) = at_bottom(&mut e, "c", t);
    let (_, now) = read_steadily(&mut e, "c", bytes, now, 10, 14);
    assert_eq!(caps(&mut e).len(), 1);
    e.handle_started(&id("c"), now);
    assert_eq!(caps(&mut e), vec![CapChange { id: id("c"), cap: None }]);
    assert_eq!(e.container(&id("c"), now).unwrap().level, 0);

    // The fair-share floor: a capped reader that gets under 10 % of a peer's bytes at the same weight.
    let mut e = Engine::new(Config { idle_promote_after: None, bottom_cap_window: Some(s(1)), ..Config::default() }, t)
        .unwrap();
    let (_, _) = at_bottom(&mut e, "slow", t);
    let (_, now) = at_bottom(&mut e, "fast", t);
    let (mut slow, mut fast) = (mib(200), mib(200));
    let mut now2 = now;
    let mut lifted = false;
    for _ in 0..40 {
        now2 += ms(100);
        slow += mib(1);
        fast += mib(14);
        e.handle_sample(&id("slow"), read(slow), now2);
        e.handle_sample(&id("fast"), read(fast), now2);
        e.handle_timeout(now2);
        let share = drain(&mut e).iter().any(|c| c.id == id("slow") && c.reason == Reason::ShareBoosted);
        let got = caps(&mut e);
        if share {
            assert!(got.contains(&CapChange { id: id("slow"), cap: None }), "{got:?}");
            lifted = true;
            break;
        }
    }
    // With 1 MiB against 14 the slow one is under the floor's 10 %: it was capped (10 MiB/s) and boosted.
    assert!(lifted, "the fair-share floor never boosted the slow reader");
}

#[test]
fn off_means_no_cap_and_turning_it_off_lifts_every_cap() {
    // Opt-in: the defaults have it off.
    assert_eq!(Config::default().bottom_cap_window, None);
    let t = t0();
    let mut e = Engine::new(Config { bottom_cap_window: None, ..capped() }, t).unwrap();
    let (bytes, now) = at_bottom(&mut e, "big", t);
    read_steadily(&mut e, "big", bytes, now, 30, 14);
    assert_eq!(caps(&mut e), vec![]);

    let mut e = Engine::new(capped(), t).unwrap();
    let (bytes, now) = at_bottom(&mut e, "big", t);
    let (_, now) = read_steadily(&mut e, "big", bytes, now, 10, 14);
    assert_eq!(caps(&mut e).len(), 1);
    e.reconfigure(Config { bottom_cap_window: None, ..capped() }, now).unwrap();
    assert_eq!(caps(&mut e), vec![CapChange { id: id("big"), cap: None }]);
    assert_eq!(drain(&mut e), vec![], "the weight stays");
}

#[test]
fn a_container_that_left_the_bottom_before_the_window_ended_is_never_capped() {
    let t = t0();
    let mut e = Engine::new(capped(), t).unwrap();
    let (bytes, now) = at_bottom(&mut e, "big", t);
    let (bytes, now) = read_steadily(&mut e, "big", bytes, now, 5, 14);
    e.set_policy(&id("big"), Policy::Pinned(w(10)), now);
    e.set_policy(&id("big"), Policy::Managed, now);
    drain(&mut e);
    // Back at the top: its reads demote it to the bottom again, and the window starts there, not before.
    let (_, _) = read_steadily(&mut e, "big", bytes, now, 9, 14);
    assert_eq!(caps(&mut e), vec![]);
}

#[test]
fn cap_settings_are_validated_naming_the_field() {
    for (config, field) in [
        (Config { bottom_cap_percent: 49, ..Config::default() }, "bottom_cap_percent"),
        (Config { bottom_cap_percent: 100, ..Config::default() }, "bottom_cap_percent"),
        (Config { bottom_cap_window: Some(ms(0)), ..Config::default() }, "bottom_cap_window"),
    ] {
        let err = config.validate().unwrap_err().to_string();
        assert!(err.contains(field), "{err}");
    }
    let parsed: Config = toml::from_str("bottom_cap_window = \"off\"\nbottom_cap_percent = 90").unwrap();
    assert_eq!((parsed.bottom_cap_window, parsed.bottom_cap_percent), (None, 90));
}

#[test]
fn a_reader_measured_beside_a_new_one_at_the_top_is_capped_from_the_whole_load_not_from_what_it_got() {
    let t = t0();
    let mut e = Engine::new(capped(), t).unwrap();
    let (mut bg, now) = at_bottom(&mut e, "bg", t);
    e.handle_started(&id("fg"), now);
    drain(&mut e);
    // For 1.2 s the new container (sampled first in each round, as a daemon's rounds go) reads 1.1 MiB a round
    // (it goes down to the third level) and the bottom reader 3. It leaves the top in the second round, which
    // starts the bottom reader's window afresh: capped at the twelfth.
    let (mut fg, mut now2) = (0, now);
    for _ in 0..12 {
        now2 += ms(100);
        bg += mib(3);
        fg += mib(1) + mib(10) / 100;
        e.handle_sample(&id("fg"), read(fg), now2);
        e.handle_sample(&id("bg"), read(bg), now2);
    }
    let got = caps(&mut e);
    let cap = got.iter().find(|c| c.id == id("bg")).and_then(|c| c.cap).expect("bg capped");
    // The load was 4.1 MiB a round, 41 MiB/s, and the bottom's all bg's: 95 % of 41 MiB/s, not of the 30 it got.
    let load = (mib(3) + mib(1) + mib(10) / 100) * 10;
    assert_close(cap.read_bps, load * 95 / 100);
}

#[test]
fn a_container_that_leaves_the_top_lifts_every_other_cap_and_starts_their_windows_afresh() {
    let t = t0();
    let mut e = Engine::new(capped(), t).unwrap();
    let (bg, now) = at_bottom(&mut e, "bg", t);
    let (bg, now) = read_steadily(&mut e, "bg", bg, now, 10, 14);
    assert_eq!(caps(&mut e).len(), 1, "capped after a second at the bottom");
    // A small read (under the top's 2 MiB) leaves the cap alone.
    e.handle_started(&id("small"), now);
    e.handle_sample(&id("small"), read(mib(1)), now + ms(50));
    drain(&mut e);
    assert_eq!(caps(&mut e), vec![]);
    // A reader that uses up its top allotment lifts it at once.
    e.handle_started(&id("big"), now + ms(60));
    e.handle_sample(&id("big"), read(mib(3)), now + ms(80));
    drain(&mut e);
    assert_eq!(caps(&mut e), vec![CapChange { id: id("bg"), cap: None }]);
    assert_eq!(e.container(&id("bg"), now + ms(80)).unwrap().cap, None);
    // Measured afresh from its next sample: a whole window later it is capped again, not before.
    let (bg, now) = read_steadily(&mut e, "bg", bg, now, 10, 14);
    assert_eq!(caps(&mut e), vec![], "capped again before a whole window");
    read_steadily(&mut e, "bg", bg, now, 1, 14);
    assert_eq!(caps(&mut e).len(), 1);
}

#[test]
fn two_readers_at_the_bottom_are_each_capped_under_the_whole_load() {
    // Not by their shares of it: a reader that shared the bottom with a passing big read for its window would be
    // held at its share for the rest of its stay.
    let t = t0();
    let mut e = Engine::new(capped(), t).unwrap();
    e.handle_started(&id("a"), t);
    e.handle_started(&id("b"), t);
    // 50 MiB each in the first round: both at the bottom. b, sampled after a, leaves the top after a's window
    // began, which starts a's afresh at its next sample: b's window begins in round 0, a's in round 1.
    let (mut a, mut b, mut now) = (mib(50), mib(50), t + ms(100));
    e.handle_sample(&id("a"), read(a), now);
    e.handle_sample(&id("b"), read(b), now);
    for _ in 0..11 {
        now += ms(100);
        a += mib(10);
        b += mib(4);
        e.handle_sample(&id("a"), read(a), now);
        e.handle_sample(&id("b"), read(b), now);
    }
    let got = caps(&mut e);
    let cap_of = |name: &str| got.iter().find(|c| c.id == id(name)).and_then(|c| c.cap).and_then(|c| c.read_bps);
    // Each one's window holds ten rounds of the other's bytes beside its own: b's (rounds 1-10) a's 100 MiB and its
    // own 40; a's (rounds 2-11) b's rounds 1-10, 40 MiB, and its own 100. Both 140 MiB/s.
    assert_close(cap_of("b"), mib(140) * 95 / 100);
    assert_close(cap_of("a"), mib(140) * 95 / 100);
}

#[test]
fn a_cap_is_split_between_reads_and_writes_as_the_container_did_them() {
    let t = t0();
    let mut e = Engine::new(capped(), t).unwrap();
    let (_, now) = at_bottom(&mut e, "rw", t);
    for i in 1..=10u64 {
        e.handle_sample(&id("rw"), IoCounters::new(mib(200) + i * mib(9), i * mib(3)), now + ms(100 * i));
    }
    let got = caps(&mut e);
    let cap = got[0].cap.unwrap();
    assert_close(cap.read_bps, mib(90) * 95 / 100);
    assert_close(cap.write_bps, mib(30) * 95 / 100);
}

#[test]
fn a_gap_between_samples_is_a_pause_too_for_a_driver_that_passes_no_sample_without_io() {
    // The agent feeds the engine only samples whose counters changed: a pause shows as a gap.
    let t = t0();
    let mut e = Engine::new(capped(), t).unwrap();
    let (bytes, now) = at_bottom(&mut e, "bursty", t);
    let (bytes, now) = read_steadily(&mut e, "bursty", bytes, now, 5, 14);
    // 1.5 s without a sample, then reading on: without the gap rule 19 samples' bytes over 2.5 s.
    let now = now + ms(1400);
    // The first sample after the gap starts the window: ten rounds are 0.9 s of it.
    let (bytes, now) = read_steadily(&mut e, "bursty", bytes, now, 10, 14);
    assert_eq!(caps(&mut e), vec![], "the pause was counted in the window");
    let (_, _) = read_steadily(&mut e, "bursty", bytes, now, 1, 14);
    let got = caps(&mut e);
    assert_eq!(got.len(), 1, "{got:?}");
    assert_close(got[0].cap.unwrap().read_bps, mib(140) * 95 / 100);
}

#[test]
fn with_one_level_nothing_is_capped() {
    // The bottom is the top then: no boost, idle promotion or floor would ever lift a cap.
    let t = t0();
    let one = Config { levels: vec![Config::default().levels[0].clone()], ..capped() };
    let mut e = Engine::new(one, t).unwrap();
    e.handle_started(&id("big"), t);
    read_steadily(&mut e, "big", 0, t, 30, 14);
    assert_eq!(caps(&mut e), vec![]);
}
