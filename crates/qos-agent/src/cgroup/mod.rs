//! Runtime-agnostic block-I/O cgroup file primitives for cgroup v1 (`blkio`) and v2 (`io`): mount detection,
//! confined directories, the counter-file parsers and reader, the weight files with verified writes, and their
//! errors. Nothing here knows a container runtime: how a runtime names its cgroups lives with the runtime
//! (`crate::runtime`), block devices in the `blockdev` module, and the mountinfo parser and device numbers both
//! use in `crate::kernel`.
//!
//! ## Use
//! ```no_run
//! use qos_agent::cgroup::{CgroupRoot, CounterReader, WeightFile};
//! use qos_core::Weight;
//!
//! # fn main() -> Result<(), qos_agent::cgroup::CgroupError> {
//! let root = CgroupRoot::detect()?; // once, at start-up
//! let dir = root.resolve_relative("docker/0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef")?;
//! let mut counters = CounterReader::open(&dir)?; // picks and opens the counter file once
//! let weight = WeightFile::open(&dir)?;
//! let sample = counters.read()?; // one pread per sampling round
//! match weight.write_verified(Weight::new(500).unwrap()) {
//!     Err(e) if e.is_vanished() => { /* the container went away: treat as removed */ }
//!     other => other?,
//! }
//! # let _ = sample; Ok(()) }
//! ```
//!
//! ## Layout
//! - `mount.rs`: [`CgroupRoot`] (which hierarchy, where), detected once from `/proc/self/mountinfo`.
//! - `dir.rs`: [`CgroupDir`], resolved from a relative path or a pid, and confined to the root.
//! - `stat.rs`: pure parsers of the counter files (v1 blkio rwstat, v2 `io.stat`).
//! - `counter_file.rs`: [`CounterReader`], one `pread` per sample of one counter file ([`CounterFileKind`]).
//! - `weight_file.rs`: [`WeightFile`], the four weight files, their formats and read-back verification.
//! - `fs.rs`: [`CgroupFs`], the seam the weight files are written through ([`RealFs`]; tests: testbed's fixture
//!   kernel).
//! - `error.rs`: [`CgroupError`].
//!
//! ## Why not cgroups-rs
//! `cgroups-rs` (0.5, the project's first choice) was evaluated and is not a dependency: on v1 it knows only the CFQ file
//! `blkio.weight` (gone since Linux 5.0), not `blkio.bfq.weight`; on v2 only `io.bfq.weight`, not `io.weight`;
//! its blkio statistics read about twenty files per call, allocate, and turn errors into zeros, where we need one
//! `pread` per sample and errors that tell a removed cgroup from a fault; and its mountinfo parsing reads the
//! live file (no fixture input, no octal unescaping, no v2 `io` check). The missing pieces are written here, on
//! the model of youki's libcgroups: file names as constants, every error naming its file, writes that never
//! create files.

mod counter_file;
mod dir;
mod error;
mod fs;
mod mount;
mod stat;
mod weight_file;

pub use counter_file::{CounterFileKind, CounterReader, V1_BFQ_BYTES, V1_THROTTLE_BYTES, V2_IO_STAT};
pub use dir::CgroupDir;
pub use error::{CgroupError, InvalidName, Result};
pub(crate) use fs::read_file;
pub use fs::{CgroupFs, RealFs};
pub use mount::{CgroupRoot, CgroupVersion};
pub use stat::{parse_blkio_stat, parse_io_stat};
pub use weight_file::{
    parse_weight_lines, WeightFile, WeightFileKind, WeightLines, V1_BFQ_WEIGHT, V1_BFQ_WEIGHT_DEVICE, V1_BLKIO_WEIGHT,
    V2_BFQ_WEIGHT, V2_IO_WEIGHT,
};
