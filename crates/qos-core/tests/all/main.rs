//! qos-core's tests, one binary with a module per area (one link instead of seven).
//!
//! - `caps`: the bottom level's throughput cap: when it is set, from what rate, and every way it is lifted.
//! - `rules`: one test (or a few) per rule of the engine, on a hand-stepped clock.
//! - `config`: validation (every error names field and value) and TOML parsing.
//! - `units`: byte sizes and durations as written in config files.
//! - `weight`: the weight scale and its conversions, exhaustively over the whole range.
//! - `ops`: generated operation sequences and the driver that applies them and checks invariants.
//! - `model`: a plain reimplementation of the rules, compared with the engine after every step of random runs.
//! - `props`: invariants over random runs (weights, no-I/O-no-demotion, starvation bound, determinism, no panic).
//! - `sim`: a deterministic disk simulator (virtual clock, proportional-share disk, seeded workloads) driving the
//!   engine the way the agent does; `sim::paper` replays the paper's experiments on it (Tables 3-5).

mod caps;
mod common;
mod config;
mod model;
mod ops;
mod props;
mod rules;
mod sim;
mod units;
mod weight;
