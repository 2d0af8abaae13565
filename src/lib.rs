//! Umbrella crate for dDiskQoS: re-exports the library crates so the top-level `examples/` and `benches/` can use
//! them through one name. The tests live with the crates they test (`crates/*/tests`).
//!
//! - [`core`]: the multi-level feedback queue as a pure, deterministic state machine ([`qos_core`]).
//! - [`agent`]: the sidecar library: discovery, counters, weight writing, the daemon loop ([`qos_agent`]).

pub use qos_agent as agent;
pub use qos_core as core;
