//! The bottom of the agent: the kernel's own names for devices and mounts, which the `cgroup` and `blockdev`
//! modules both need and neither owns. Nothing here imports another module of this crate.
//!
//! ## Layout
//! - `devnum.rs`: [`DevNum`], a block device's `MAJ:MIN` (from text, a file's `st_dev` or a node's `st_rdev`),
//!   and [`DevNumError`];
//! - [`InvalidName`]: a name or number that cannot be right, the error both layers give for one;
//! - `mountinfo.rs`: parsing `/proc/self/mountinfo` lines (octal escapes undone) and the device mounted on `/`.

mod devnum;
pub(crate) mod mountinfo;

pub use devnum::{DevNum, DevNumError};

/// A name or number that cannot be right: a device name or number, a BFQ tunable, a container id, a cgroup path or
/// parent, a pid. Both the cgroup layer's and the devices' errors carry it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {what} {value:?}: {reason}")]
pub struct InvalidName {
    /// What kind of name: "device name", "container id", "cgroup parent", "pid", ...
    pub what: &'static str,
    /// The rejected value.
    pub value: String,
    /// Why.
    pub reason: &'static str,
}
