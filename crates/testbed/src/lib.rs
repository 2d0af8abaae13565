//! Test support shared by dDiskQoS's integration tests, benches and examples (a dev-dependency only; never
//! published).
//!
//! # The rule for real tests
//! A test that needs root, cgroup v1 blkio, a loop device or Docker is `#[ignore = "needs …: run
//! ./scripts/test.sh"]`, so a plain `cargo test` lists it as ignored. `./scripts/test.sh` runs every test with
//! `--include-ignored` and `DDISKQOS_REQUIRE_REAL=1`. Inside, the test first calls [`require()`]: with `CI=true` or
//! `DDISKQOS_REQUIRE_REAL=1` a missing prerequisite fails the test, naming it; otherwise (someone ran
//! `--include-ignored` by hand without root) it prints `SKIPPED <test>: <reason>` and the test returns.
//!
//! ```no_run
//! use testbed::{require, Need};
//!
//! #[test]
//! #[ignore = "needs root and cgroup v1 blkio: run ./scripts/test.sh"]
//! fn reads_real_counters() {
//!     if !require("reads_real_counters", &[Need::Root, Need::BlkioV1]) {
//!         return;
//!     }
//!     let _machine = testbed::exclusive();
//!     // ...
//! }
//! ```
//!
//! Real tests also hold [`exclusive()`] while they run: in one test binary, tests run in parallel threads of one
//! process, and real tests measure time, load both cores of the test machine or restart daemons.
//!
//! # Layout
//! - [`require`](mod@require): the skip-or-fail rule and what a test can need ([`Need`]).
//! - [`exclusive`](mod@exclusive): the lock that keeps real tests of one process from overlapping.
//! - [`blkio`]: real cgroup v1 blkio cgroups: a guard that removes them, running a command in one, BFQ weights.
//! - [`loopdev`]: a file-backed loop device with BFQ, detached on drop.
//! - [`fixture`]: fake cgroup trees in temp dirs, in the v1 and v2 layouts (no root needed).
//! - [`agent`]: the `ddiskqos-agent` binary run with a config, killed on drop.
//! - [`probe`]: looking at a running agent from outside: log, CPU and memory from `/proc`, metrics, status.
//! - [`docker`]: the host's Docker through its CLI: containers removed on drop, their cgroups.
//! - [`dockerd`]: a private, throw-away dockerd for tests that restart, kill or flood the daemon; a proxy socket
//!   that counts API requests.
//! - [`containerd`]: a private containerd serving CRI v1, and pods made through CRI as a kubelet would (no kubelet
//!   here); pods, their cgroups in every hierarchy and containerd itself removed on drop.
//! - [`process`]: a child process killed on drop, and polling until something holds.
//!
//! Everything a helper sets up is torn down on drop, also when the test panics.

pub mod agent;
pub mod blkio;
pub mod containerd;
pub mod docker;
pub mod dockerd;
pub mod exclusive;
pub mod fixture;
pub mod loopdev;
pub mod probe;
pub mod process;
pub mod require;

pub use exclusive::exclusive;
pub use require::{require, Need};
