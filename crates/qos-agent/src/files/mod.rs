//! The cgroup-file backend as its own layer, for every runtime: what to write into a cgroup's weight files and
//! how to check it.
//!
//! ## Layout
//! - `v2_plan.rs`: [`V2Plan`], the pure cgroup-v2 rule (which file acts on which device, the lines that set or
//!   restore a weight, the values expected back); the writer and the bench's weight probe both use it.

pub mod v2_plan;

pub use v2_plan::{check_restored, governs, restore_lines, Line, Mismatch, V2Plan, V2_FILES};
