//! [`Config`]: the levels and timers of the feedback queue, with the paper's values as defaults, and validation
//! that names the field and the value at fault.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::units::{format_duration, ByteSize};
use crate::weight::Weight;

/// Most levels a config may have; more would only make the queue harder to reason about.
pub const MAX_LEVELS: usize = 16;

/// Longest duration any timer may be set to (one year), so deadline arithmetic on `Instant` cannot overflow.
pub const MAX_DURATION: Duration = Duration::from_secs(365 * 24 * 3600);

/// One level (queue) of the multi-level feedback queue.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LevelConfig {
    /// Block-I/O weight of the containers at this level (1..=1000).
    pub weight: Weight,
    /// I/O a container may do at this level before it moves one level down (its allotment). The bottom level has
    /// no level below it: its threshold is the size of the last queue in the paper's Table 1 and is reported as
    /// the allotment used, but demotes nowhere.
    pub threshold: ByteSize,
}

/// Which of a container's counters count towards its allotment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CountMode {
    /// Bytes read only.
    Read,
    /// Bytes written only.
    Write,
    /// Bytes read plus bytes written (default).
    #[default]
    Both,
}

/// Configuration of the engine. Deserializable from TOML; [`Config::default`] is the paper's configuration.
///
/// ```toml
/// count = "both"
/// boost_after = "10s"
/// idle_promote_after = "2s"
/// boost_all_every = "off"
/// share_window = "1s"
/// share_floor_percent = 10
/// bottom_cap_window = "off"
/// bottom_cap_percent = 95
/// levels = [
///   { weight = 1000, threshold = "2MiB" },
///   { weight = 200,  threshold = "8MiB" },
///   { weight = 40,   threshold = "32MiB" },
///   { weight = 10,   threshold = "128MiB" },
/// ]
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// The levels, top (highest weight, where containers enter) first.
    pub levels: Vec<LevelConfig>,
    /// Which counters count towards the allotments.
    pub count: CountMode,
    /// Starvation rule: a container that left the top level this long ago is put back at the top with a fresh
    /// allotment. The paper boosts the bottom level "after some time"; counting from when the container left the
    /// top also covers a container that lingers in a middle level doing steady small I/O.
    #[serde(with = "crate::units::duration")]
    pub boost_after: Duration,
    /// A container below the top that did no I/O for this long moves up one level (and again after each further
    /// idle period), the way BFQ re-raises queues that went idle. `"off"` disables it.
    #[serde(with = "crate::units::opt_duration")]
    pub idle_promote_after: Option<Duration>,
    /// Optional MLFQ "priority boost": every period, every managed container goes back to the top. `"off"`
    /// (default) disables it.
    #[serde(with = "crate::units::opt_duration")]
    pub boost_all_every: Option<Duration>,
    /// Fair-share floor, the second starvation rule: at the end of every such window, a managed container below the
    /// top that is still doing I/O but got less than `share_floor_percent` % of the bytes some container whose
    /// weight is the same or lower did at that weight (since its last weight change in the window) is put back at
    /// the top with a fresh allotment. A disk scheduler does not
    /// always turn equal weights into equal service (BFQ's default mode serves a queue-depth-1 reader about one
    /// request per slot of a deep reader in another group), and the time rule alone left such a reader starved
    /// for `boost_after`. `"off"` disables it.
    #[serde(with = "crate::units::opt_duration")]
    pub share_window: Option<Duration>,
    /// See `share_window`: 1..=100.
    pub share_floor_percent: u8,
    /// Headroom at the bottom: a managed container that has read or written at the bottom level for this long
    /// without a pause (no sample without I/O, no gap of more than three quarters of it between samples) is capped
    /// at `bottom_cap_percent` % of the device's whole load over that time, every container's bytes, its own
    /// included (never under that percent of its own rate; split between reads and writes as its bytes were;
    /// [`crate::Cap`]), until it leaves the bottom (a boost, the fair-share floor, an idle promotion, a policy
    /// change): a big reader that keeps a device saturated leaves it a little idle time, and small reads that arrive
    /// are served at once instead of behind its queue. Each stay at the bottom measures the rate afresh. `"off"`
    /// (default) disables it: opt-in, because on the bench's disk it made 100 MiB reads and readers that start
    /// together slower than without it (`crates/bench/results/2026-11-29/bottom-cap-ab-ce4e266/`). A container that
    /// uses up its top allotment lifts every cap and starts the windows afresh: it is a reader the weights serve, and
    /// a cap beside it took its share (`crates/bench/results/2026-11-29/bottom-cap-steady-state-50650cb/`).
    #[serde(with = "crate::units::opt_duration")]
    pub bottom_cap_window: Option<Duration>,
    /// See `bottom_cap_window`: 50..=99.
    pub bottom_cap_percent: u8,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            levels: vec![
                LevelConfig { weight: Weight::MAX, threshold: ByteSize::mib(2) },
                LevelConfig { weight: Weight::new(200).expect("in range"), threshold: ByteSize::mib(8) },
                LevelConfig { weight: Weight::new(40).expect("in range"), threshold: ByteSize::mib(32) },
                LevelConfig { weight: Weight::new(10).expect("in range"), threshold: ByteSize::mib(128) },
            ],
            count: CountMode::Both,
            boost_after: Duration::from_secs(10),
            idle_promote_after: Some(Duration::from_secs(2)),
            boost_all_every: None,
            share_window: Some(Duration::from_secs(1)),
            share_floor_percent: 10,
            bottom_cap_window: None,
            bottom_cap_percent: 95,
        }
    }
}

/// A config value that cannot work. The message names the field and the value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// A field holds a value that violates a rule.
    #[error("invalid config: {field} = {value}: {reason}")]
    Invalid {
        /// Dotted path of the field, e.g. `levels[2].threshold`.
        field: String,
        /// The value as written.
        value: String,
        /// The rule it breaks.
        reason: String,
    },
}

fn invalid(field: impl Into<String>, value: impl ToString, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid { field: field.into(), value: value.to_string(), reason: reason.into() }
}

impl Config {
    /// Checks every rule: at least one and at most [`MAX_LEVELS`] levels, thresholds non-zero and strictly
    /// increasing, weights non-increasing down the levels, durations non-zero and at most [`MAX_DURATION`], the
    /// share floor a percentage.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.levels.is_empty() {
            return Err(invalid("levels", "[]", "at least one level is needed"));
        }
        if self.levels.len() > MAX_LEVELS {
            return Err(invalid("levels", self.levels.len(), format!("at most {MAX_LEVELS} levels are allowed")));
        }
        for (i, pair) in self.levels.windows(2).enumerate() {
            let (upper, lower) = (&pair[0], &pair[1]);
            if lower.threshold <= upper.threshold {
                return Err(invalid(
                    format!("levels[{}].threshold", i + 1),
                    lower.threshold,
                    format!("thresholds must increase down the levels (levels[{i}].threshold = {})", upper.threshold),
                ));
            }
            if lower.weight > upper.weight {
                return Err(invalid(
                    format!("levels[{}].weight", i + 1),
                    lower.weight,
                    format!("weights must not increase down the levels (levels[{i}].weight = {})", upper.weight),
                ));
            }
        }
        for (i, level) in self.levels.iter().enumerate() {
            if level.threshold.0 == 0 {
                return Err(invalid(format!("levels[{i}].threshold"), level.threshold, "must be greater than zero"));
            }
        }
        check_duration("boost_after", self.boost_after)?;
        if let Some(d) = self.idle_promote_after {
            check_duration("idle_promote_after", d)?;
        }
        if let Some(d) = self.boost_all_every {
            check_duration("boost_all_every", d)?;
        }
        if let Some(d) = self.share_window {
            check_duration("share_window", d)?;
        }
        if !(1..=100).contains(&self.share_floor_percent) {
            return Err(invalid("share_floor_percent", self.share_floor_percent, "must be 1..=100 (a percentage)"));
        }
        if let Some(d) = self.bottom_cap_window {
            check_duration("bottom_cap_window", d)?;
        }
        if !(50..=99).contains(&self.bottom_cap_percent) {
            return Err(invalid(
                "bottom_cap_percent",
                self.bottom_cap_percent,
                "must be 50..=99 (a percentage of the load a container at the bottom is held under; bottom_cap_window = \"off\" disables the cap)",
            ));
        }
        Ok(())
    }

    /// Index of the bottom level.
    pub fn bottom(&self) -> usize {
        self.levels.len().saturating_sub(1)
    }
}

fn check_duration(field: &str, d: Duration) -> Result<(), ConfigError> {
    if d.is_zero() {
        return Err(invalid(field, format_duration(d), "must be greater than zero"));
    }
    if d > MAX_DURATION {
        return Err(invalid(field, format_duration(d), "must be at most one year"));
    }
    Ok(())
}
