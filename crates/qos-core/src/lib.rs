//! # qos-core
//!
//! The dDiskQoS multi-level feedback queue (MLFQ) as a pure, deterministic state machine: no I/O, no clock, no
//! threads, no randomness. The same inputs always give the same outputs, so any container runtime can embed it
//! and tests can replay hours of traffic in milliseconds.
//!
//! ## The algorithm (Sun, "dDiskQoS")
//! Every container enters the top level (weight 1000). A container at level k that has done more than level k's
//! threshold of I/O since it entered level k moves to level k+1 (thresholds 2, 8, 32, 128 MiB by default); a
//! container below the top for `boost_after` goes back to the top, so nothing starves. Optional extras: one level
//! up after a quiet period (`idle_promote_after`), and a periodic boost of everyone (`boost_all_every`).
//!
//! ## Layout
//! - [`engine`]: [`Engine`], the state machine in the handle/poll shape, and its outputs ([`WeightChange`]).
//! - [`cap`]: [`Cap`], the throughput cap of a container settled at the bottom level, and its output [`CapChange`].
//! - [`config`]: [`Config`] with the paper's defaults, and validation.
//! - [`weight`]: [`Weight`] (BFQ scale 1..=1000) and conversions to every kernel file and Docker.
//! - [`units`]: byte sizes, counters, durations as written in config files.
//! - [`id`]: the container identifier, [`ContainerId`].
//!
//! ## Driving it
//! ```
//! use std::time::{Duration, Instant};
//! use qos_core::{Config, ContainerId, Engine, IoCounters};
//!
//! let t0 = Instant::now(); // the driver owns the clock; the engine only sees values
//! let mut engine = Engine::new(Config::default(), t0).unwrap();
//! let web = ContainerId::new("web");
//! engine.handle_started(&web, t0);
//! engine.handle_sample(&web, IoCounters::new(64 << 20, 0), t0 + Duration::from_millis(500));
//! while let Some(change) = engine.poll_change() {
//!     println!("{} -> {:?} ({:?})", change.id, change.weight, change.reason);
//! }
//! let _wake_at = engine.poll_timeout();
//! ```

pub mod cap;
pub mod config;
pub mod engine;
pub mod id;
pub mod units;
pub mod weight;

pub use cap::{Cap, CapChange};
pub use config::{Config, ConfigError, CountMode, LevelConfig, MAX_LEVELS};
pub use engine::{ContainerView, Engine, Policy, Reason, WeightChange};
pub use id::ContainerId;
pub use units::{ByteSize, IoCounters};
pub use weight::{Weight, WeightError};
