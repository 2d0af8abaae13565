//! The bottom of the agent: the kernel's own names for devices and mounts, which the `cgroup` and `blockdev`
//! modules both need and neither owns. Nothing here imports another module of this crate.
//!
//! ## Layout
//! - `devnum.rs`: [`DevNum`], a block device's `MAJ:MIN` (from text, a file's `st_dev` or a node's `st_rdev`),
//!   and [`DevNumError`];
//! - `mountinfo.rs`: parsing `/proc/self/mountinfo` lines (octal escapes undone) and the device mounted on `/`.

mod devnum;
pub(crate) mod mountinfo;

pub use devnum::{DevNum, DevNumError};
