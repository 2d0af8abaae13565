//! Helpers shared by the test modules.

use std::time::{Duration, Instant};

use qos_core::{Config, ContainerId, Engine, IoCounters, Weight, WeightChange};

/// The one clock reading of the tests: every other instant is `t0() + offset`. The engine itself never reads the
/// clock (clippy.toml bans it in this crate); tests need one base value because `Instant` has no constructor.
#[allow(clippy::disallowed_methods)]
pub fn t0() -> Instant {
    Instant::now()
}

/// `n` mebibytes as a byte count.
pub const fn mib(n: u64) -> u64 {
    n << 20
}

/// `n` milliseconds.
pub const fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// `n` seconds.
pub const fn s(n: u64) -> Duration {
    Duration::from_secs(n)
}

/// A container id.
pub fn id(name: &str) -> ContainerId {
    ContainerId::new(name)
}

/// A weight known to be in range.
pub fn w(v: u64) -> Weight {
    Weight::new(v).expect("test weight in range")
}

/// Counters with only reads.
pub const fn read(bytes: u64) -> IoCounters {
    IoCounters::new(bytes, 0)
}

/// Drains every pending change.
pub fn drain(engine: &mut Engine) -> Vec<WeightChange> {
    std::iter::from_fn(|| engine.poll_change()).collect()
}

/// The paper's rules: the default configuration without the fair-share floor, so a test of a time rule sees only
/// that rule (the floor's tests switch it on).
pub fn paper() -> Config {
    Config { share_window: None, ..Config::default() }
}

/// The paper's configuration without idle promotion, so a test of another rule sees only that rule.
pub fn no_idle() -> Config {
    Config { idle_promote_after: None, ..paper() }
}
