//! # qos-agent
//!
//! The dDiskQoS sidecar as a library: discovers containers, samples their cgroup I/O counters, drives
//! [`qos_core::Engine`] and applies block-I/O weights, never believing a write it did not read back.
//!
//! ## Layout
//! - [`agent`]: the one place that assembles the agent ([`agent::AgentBuilder`]): the configured runtime (each
//!   runtime assembles itself), the device settings at start, the writer, the daemon; the binary and the bench
//!   both call it.
//! - [`backend`]: the three small traits a runtime implements ([`backend::Discovery`],
//!   [`backend::CounterSource`], [`backend::WeightWriter`]) and the types they exchange.
//! - [`daemon`]: the loop, generic over those traits: discover → sample → decide → apply → verify; it executes
//!   what [`daemon::reconcile`] (a synchronous state machine in the engine's handle/poll shape: desired, applied
//!   and original weights, retries, the log-once rules) asks for; [`daemon::pacing`]: when the next round starts
//!   (the interval, stretched to a CPU budget).
//! - [`runtime`]: one folder per container runtime, each with its discovery and cgroup naming (and, for Docker,
//!   its API paths): [`runtime::docker`] (through `bollard`), [`runtime::cri`] (Kubernetes pods) and
//!   [`runtime::cgroup_dir`] (the children of one cgroup). No runtime imports another's internals.
//! - [`files`]: the cgroup-file layer every runtime uses: [`files::FileCounters`] (counters read behind a parent
//!   gate), [`files::FileWriter`] (weights written, read back, restored) and [`files::WeightPlan`], the pure
//!   rule (cgroup v2, v1 BFQ's per-device file) of which weight file acts on which device and what to write, check
//!   and restore;
//!   [`files::restore_records`]: the writers' restore log beside the state file.
//! - [`cgroup`]: runtime-agnostic cgroup v1/v2 file primitives: mount detection (once), confined directories,
//!   counter-file parsers and reader, weight files with verified writes, errors naming files.
//! - [`writer`]: [`writer::AgentWriter`], the agent's weight writer: one way of applying weights chosen at assembly
//!   (the files, systemd unit properties, Docker's API) over the one [`files::FileWriter`], which reads every
//!   weight back and owns the device table.
//! - [`systemd`]: the way of applying weights to cgroups that are systemd units (unit properties over D-Bus).
//! - [`blockdev`]: block-device facts (scheduler, io.cost, the disk of a path or device number), the guarded
//!   switch, protection by default and the operator's tunables. The bench uses it too.
//! - `kernel/` (crate-private): the bottom that [`cgroup`] and [`blockdev`] share and neither imports from the
//!   other: device numbers ([`blockdev::DevNum`], re-exported there) and mountinfo parsing.
//! - [`ops`]: operating the agent: the pre-start checks, the status socket, Prometheus metrics and the HTTP
//!   endpoint (`/metrics`, `/readyz`, `/healthz`), the bounds on their connections.
//! - [`config`], [`labels`], [`policy`], [`state`], [`priority`]: configuration, per-container policy labels (and
//!   the namespaces trusted to set them), the originals file (and its repair), the agent's CPU priority. (The
//!   binary's process around the agent, `app.rs`: signals, serving, is the binary's own module.)
//!
//! ## Embedding
//! A program whose containers are plain cgroup directories it knows of implements [`backend::Discovery`] and
//! calls `AgentBuilder::new(cfg, root).assemble_on_files(discovery)?.run(commands)`: the shipped assembly with its
//! device settings. Another runtime implements [`backend::Discovery`] (and, if its containers are not plain
//! cgroups, the other two traits), then runs
//! `Daemon::new(cfg, discovery, FileCounters::new(), FileWriter::default(), ..).run(commands)` with the files
//! layer's counters and writer (`qos_agent::files`).
//! See `examples/slice_runtime.rs`.
//!
//! ## Public surface
//! What an embedder uses: [`agent::AgentBuilder`] and [`agent::Agent`]; the traits and types of [`backend`];
//! [`AgentConfig`]; [`Daemon`], [`Command`], [`Status`] and [`Summary`]; [`files::FileCounters`] and
//! [`files::FileWriter`] (and [`writer::AgentWriter`], the assembled writer); [`cgroup::CgroupRoot`],
//! [`cgroup::CgroupDir`] and the [`cgroup::CgroupFs`] seam. The other public modules are public for this
//! workspace's binary, bench and tests (they measure and test the shipped parts themselves) and may change without
//! notice; what nothing outside the crate uses is crate-private (`kernel`, `files::weight_plan` behind its re-exports,
//! `systemd::unit`/`units` behind theirs, `ops::readiness`, `runtime::support`, `runtime::cri::config`).

pub mod agent;
pub mod backend;
pub mod blockdev;
pub mod cgroup;
pub mod config;
pub mod daemon;
pub mod files;
pub(crate) mod kernel;
pub mod labels;
pub mod ops;
pub mod policy;
pub mod priority;
pub mod runtime;
pub mod state;
pub mod systemd;
pub mod writer;

pub use backend::{
    AppliedVia, BackendError, CapApplied, ContainerInfo, CounterSource, DeviceCap, DeviceMonitor, Discovery,
    DiscoveryEvent, WeightWriter,
};
pub use config::AgentConfig;
pub use daemon::{Command, Daemon, Status, Summary};
