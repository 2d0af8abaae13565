//! # qos-agent
//!
//! The dDiskQoS sidecar as a library: discovers containers, samples their cgroup I/O counters, drives
//! [`qos_core::Engine`] and applies block-I/O weights, never believing a write it did not read back.
//!
//! ## Layout
//! - [`backend`]: the three small traits a runtime implements ([`backend::Discovery`],
//!   [`backend::CounterSource`], [`backend::WeightWriter`]) and the types they exchange.
//! - [`daemon`]: the loop, generic over those traits: discover → sample → decide → apply → verify;
//!   [`pacing`]: when the next round starts (the interval, stretched to a CPU budget).
//! - [`cgroup`]: cgroup v1/v2 files: mount detection (once), confined paths, counters, weight files, devices.
//! - [`cgroupfs`]: backends over plain cgroup files; [`plain`]: discovery of child cgroups of one cgroup;
//!   [`docker`]: Docker discovery, counters and actuator through `bollard`.
//! - [`config`], [`labels`], [`state`], [`metrics`], [`control`], [`devices`], [`app`]: configuration,
//!   per-container policy labels, the originals file, Prometheus, the status socket, start-up device checks,
//!   and the wiring used by the binary.
//!
//! ## Embedding
//! Another runtime implements [`backend::Discovery`] (and, if its containers are not plain cgroups, the other two
//! traits), then runs `Daemon::new(cfg, discovery, CgroupfsCounters::new(), CgroupfsWriter, ..).run(commands)`.
//! See `examples/slice_runtime.rs`.

pub mod app;
pub mod backend;
pub mod cgroup;
pub mod cgroupfs;
pub mod config;
pub mod control;
pub mod daemon;
pub mod devices;
pub mod docker;
pub mod labels;
pub mod metrics;
pub mod pacing;
pub mod plain;
pub mod reconcile;
pub mod state;

pub use backend::{AppliedVia, BackendError, ContainerInfo, CounterSource, Discovery, DiscoveryEvent, WeightWriter};
pub use config::AgentConfig;
pub use daemon::{Command, Daemon, Status, Summary};
