//! The systemd actuator. On a host whose PID 1 is systemd, a container's cgroup that is a systemd unit (Docker's
//! systemd driver: `system.slice/docker-<id>.scope`; the kubelet's: `kubepods-…-pod<uid>.slice`) belongs to
//! systemd: a weight written straight into its files is put back at the next `systemctl daemon-reload` (measured
//! in the systemd guest: `io.weight` 50 and `io.bfq.weight` 60 back to `default 100`). So the weight goes in as
//! unit properties over D-Bus (`SetUnitProperties`, runtime), which systemd writes and keeps, and the agent reads
//! the governing files back as it does for its own writes.
//!
//! - [`mapping`]: which `IOWeight`/`IODeviceWeight` yield a weight in the file that governs each device (pure).
//! - `unit.rs`: [`UnitName`], the unit a cgroup directory is, if any.
//! - [`bus`]: the one D-Bus call, with a timeout and typed errors.
//! - `units.rs`: [`UnitWriter`], the way of applying weights as unit properties, read back through the agent's
//!   file writer; [`crate::writer::AgentWriter`] sends it the cgroups that are units.

pub mod bus;
pub mod mapping;
pub(crate) mod unit;
pub(crate) mod units;

pub use bus::{BusAddress, BusError, SystemdBus};
pub use mapping::UnitIoWeights;
pub use unit::UnitName;
pub use units::UnitWriter;

/// Whether PID 1 is systemd (`sd_booted()`'s test: `/run/systemd/system` is a directory).
pub fn is_systemd_host() -> bool {
    std::path::Path::new("/run/systemd/system").is_dir()
}
