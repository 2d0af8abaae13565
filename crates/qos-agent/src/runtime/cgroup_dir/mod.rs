//! The cgroup-dir runtime: every child directory of one cgroup is a container (`runtime = "cgroup-dir"`).
//!
//! - `discovery.rs`: [`CgroupDirDiscovery`], the children of `[cgroup] parent`, watched with inotify;
//! - `counters.rs`: [`CgroupDirCounters`], each container's counter file kept open and read behind a parent gate;
//! - `writer.rs`: [`CgroupDirWriter`], the weight file written and read back.
//!
//! The counters and the writer work on any [`ContainerInfo`](crate::backend::ContainerInfo) that has a cgroup
//! directory, so the Docker runtime (and an embedding runtime) reuses them and adds only its own discovery and
//! API paths.

mod counters;
mod discovery;
mod writer;

pub use counters::{CgroupDirCounters, ACTIVE_ROUNDS, FULL_READ_EVERY};
pub use discovery::CgroupDirDiscovery;
pub use writer::CgroupDirWriter;
