//! The cgroup-dir runtime: every child directory of one cgroup is a container (`runtime = "cgroup-dir"`).
//!
//! - `discovery.rs`: [`CgroupDirDiscovery`], the children of `[cgroup] parent`, watched with inotify.
//!
//! Its counters and writer are the files layer's ([`crate::files::FileCounters`], [`crate::files::FileWriter`]),
//! which every runtime uses on its containers' cgroup directories.

mod discovery;

pub use discovery::CgroupDirDiscovery;
