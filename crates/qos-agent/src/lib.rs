//! # qos-agent
//!
//! The dDiskQoS sidecar as a library: discovers containers, samples their cgroup I/O counters, drives
//! [`qos_core::Engine`] and applies block-I/O weights, never believing a write it did not read back.
//!
//! ## Layout
//! - [`backend`]: the three small traits a runtime implements ([`backend::Discovery`],
//!   [`backend::CounterSource`], [`backend::WeightWriter`]) and the types they exchange.
//! - [`daemon`]: the loop, generic over those traits: discover → sample → decide → apply → verify; it executes
//!   what [`reconcile`] (a synchronous state machine in the engine's handle/poll shape: desired, applied and
//!   original weights, retries, the log-once rules) asks for; [`pacing`]: when the next round starts (the
//!   interval, stretched to a CPU budget); [`preflight`]: the checks `run` and `check-config` share.
//! - [`runtime`]: one folder per container runtime, each with its discovery and cgroup naming (and, for Docker,
//!   its API paths): [`runtime::docker`] (through `bollard`), [`runtime::cri`] (Kubernetes pods) and
//!   [`runtime::cgroup_dir`] (the children of one cgroup). No runtime imports another's internals.
//! - [`files`]: the cgroup-file layer every runtime uses: [`files::FileCounters`] (counters read behind a parent
//!   gate), [`files::FileWriter`] (weights written, read back, restored) and [`files::V2Plan`], the pure
//!   cgroup-v2 rule of which weight file acts on which device and what to write, check and restore.
//! - [`cgroup`]: runtime-agnostic cgroup v1/v2 file primitives: mount detection (once), confined directories,
//!   counter-file parsers and reader, weight files with verified writes, errors naming files.
//! - [`blockdev`]: block-device facts (scheduler, io.cost, the disk of a path or device number) and the guarded
//!   switch. The bench uses it too.
//! - [`kernel`]: the bottom that [`cgroup`] and [`blockdev`] share and neither imports from the other: device
//!   numbers ([`kernel::DevNum`]) and mountinfo parsing.
//! - [`config`], [`labels`], [`state`], [`metrics`], [`control`], [`limits`], [`app`]: configuration,
//!   per-container policy labels, the originals file, Prometheus, the status socket, the bounds on their
//!   connections, and the wiring used by the binary (with the start-up device check: switch, tune, warn).
//!
//! ## Embedding
//! Another runtime implements [`backend::Discovery`] (and, if its containers are not plain cgroups, the other two
//! traits), then runs
//! `Daemon::new(cfg, discovery, FileCounters::new(), FileWriter::default(), ..).run(commands)` with the files
//! layer's counters and writer (`qos_agent::files`).
//! See `examples/slice_runtime.rs`.

pub mod app;
pub mod backend;
pub mod blockdev;
pub mod cgroup;
pub mod config;
pub mod control;
pub mod daemon;
pub mod files;
pub mod kernel;
pub mod labels;
pub mod limits;
pub mod metrics;
pub mod pacing;
pub mod policy;
pub mod preflight;
pub mod priority;
pub mod readiness;
pub mod reconcile;
pub mod restore_records;
pub mod runtime;
pub mod state;
pub mod systemd;

pub use backend::{
    AppliedVia, BackendError, ContainerInfo, CounterSource, DeviceMonitor, Discovery, DiscoveryEvent, WeightWriter,
};
pub use config::AgentConfig;
pub use daemon::{Command, Daemon, Status, Summary};
