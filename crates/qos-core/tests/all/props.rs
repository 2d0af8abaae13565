//! Property tests over random runs. The invariants themselves are checked inside `ops::Run` after every input;
//! each test here picks a driver and what to compare.

use std::time::Duration;

use proptest::prelude::*;

use crate::ops::{scenario, Run, Timers};

fn config(cases: u32) -> ProptestConfig {
    ProptestConfig { cases, max_shrink_iters: 4096, ..ProptestConfig::default() }
}

proptest! {
    #![proptest_config(config(256))]

    /// The engine and the model agree after every step; the driver fires timers at `poll_timeout()`, so nothing
    /// stays below the top longer than `boost_after`.
    #[test]
    fn engine_matches_model(s in scenario(120, false)) {
        Run::run(&s, Timers::AtPollTimeout, true, false);
    }

    /// A driver that only calls `handle_timeout` on its sampling tick: nothing stays below the top longer than
    /// `boost_after` plus one tick, and the model still agrees.
    #[test]
    fn tick_driver_bounds_starvation(s in scenario(120, false), tick_ms in prop::sample::select(vec![100u64, 500, 1000])) {
        Run::run(&s, Timers::EveryTick(Duration::from_millis(tick_ms)), true, false);
    }

    /// The same inputs give the same outputs: two fresh engines, and a clone taken halfway.
    #[test]
    fn identical_input_gives_identical_output(s in scenario(150, false)) {
        let first = Run::run(&s, Timers::AtPollTimeout, false, false);
        let second = Run::run(&s, Timers::AtPollTimeout, false, false);
        prop_assert_eq!(&first, &second);

        // A clone taken halfway continues exactly like the original.
        let half = s.ops.len() / 2;
        let mut run = Run::new(&s, Timers::AtPollTimeout, false, false);
        s.ops[..half].iter().for_each(|op| run.apply(op));
        let mut twin = run.clone();
        for op in &s.ops[half..] {
            run.apply(op);
            twin.apply(op);
        }
        prop_assert_eq!(&run.record, &twin.record);
        prop_assert_eq!(&run.record, &first);
    }

    /// Nothing panics whatever the inputs, even with a clock that jumps backwards; weights stay valid.
    #[test]
    fn nothing_panics_even_when_time_goes_back(s in scenario(200, true)) {
        Run::run(&s, Timers::AtPollTimeout, false, true);
    }
}
