//! The container runtimes the agent can manage, one folder each; every runtime implements the three traits of
//! [`crate::backend`] (its discovery, counters and weight writer) and knows how it names its cgroups.
//!
//! - [`docker`]: Docker through its API socket (`runtime = "docker"`, the default);
//! - [`cri`]: the pods of a Kubernetes node through the CRI socket (`runtime = "cri"`), one entry per pod cgroup;
//! - [`cgroup_dir`]: every child directory of one cgroup is a container (`runtime = "cgroup-dir"`).
//!
//! Counters and weights go through the files layer ([`crate::files`]), which every runtime shares; what their
//! discoveries share (the reconnect backoff, the inotify watch) is in `support.rs`; no runtime imports another's
//! internals.

pub mod cgroup_dir;
pub mod cri;
pub mod docker;
pub(crate) mod support;
