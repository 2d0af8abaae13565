//! The cgroup-file backend as its own layer, used by every runtime: a container's counters read from its cgroup
//! files and its weight written into them and read back. Nothing here knows a container runtime: a runtime
//! brings its discovery (and, like Docker, its own API paths) and uses these on its containers' cgroups.
//!
//! ## Layout
//! - `counters.rs`: [`FileCounters`], each container's counter file kept open and read behind a parent gate;
//! - `writer.rs`: [`FileWriter`], the weight file(s) written, read back and restored;
//! - `devices.rs`: [`FileDevices`], the devices the writer plans with (cgroup v2: what governs each, each
//!   container's devices and weights in force, the io.cost rate watch); the daemon ticks it on its clock and shows
//!   it in status, as its [`crate::backend::DeviceMonitor`];
//! - `v2_plan.rs`: [`V2Plan`], the pure cgroup-v2 rule (which file acts on which device, the lines that set or
//!   restore a weight, the values expected back); the writer and the bench's weight probe both use it.

mod counters;
mod devices;
pub mod v2_plan;
mod writer;

pub use counters::{FileCounters, ACTIVE_ROUNDS, FULL_READ_EVERY};
pub use devices::FileDevices;
pub use v2_plan::{check_restored, governs, restore_lines, Line, Mismatch, V2Plan, V2_FILES};
pub use writer::FileWriter;
