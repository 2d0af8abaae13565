//! The three small traits a runtime implements to be driven by the daemon, and the types they exchange.
//!
//! Data flows one way: [`Discovery`] says which containers exist → [`CounterSource`] samples their counters →
//! the engine decides → [`WeightWriter`] applies and verifies. Beside them, a [`DeviceMonitor`] tells the daemon
//! about the block devices the weights act on.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};

use qos_core::{ContainerId, IoCounters, Weight};

use crate::cgroup::{CgroupDir, CgroupError};

/// What discovery knows about one container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerInfo {
    /// Stable identifier (Docker: the 64-hex id; plain mode: the directory name).
    pub id: ContainerId,
    /// Human-readable name, for logs and the status table.
    pub name: String,
    /// Labels (Docker labels; plain mode: none). Policy labels are read from here.
    pub labels: BTreeMap<String, String>,
    /// Its blkio/io cgroup, confined under the cgroup root; `None` if it could not be found (counters then come
    /// from a fallback, if the runtime has one).
    pub cgroup: Option<CgroupDir>,
}

impl ContainerInfo {
    /// Its cgroup directory, if it has one.
    pub fn cgroup_path(&self) -> Option<&std::path::Path> {
        self.cgroup.as_ref().map(|c| c.path())
    }
}

/// A change in the set of containers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DiscoveryEvent {
    /// A container started (or was created running). Enters the top level at once.
    Started(ContainerInfo),
    /// A container's configuration changed (e.g. someone ran `docker update`): its weight is re-verified.
    Updated(ContainerId),
    /// A container announced while its runtime was still starting it (seen by its cgroup's creation, see
    /// [`Starting`]) has started: its weight, written to its cgroup files meanwhile, is written again the
    /// writer's own way (a systemd unit's properties, which systemd keeps over its own re-applies).
    Settled(ContainerId),
    /// Containers announced early that their runtime is still starting (sent every few milliseconds while there
    /// are any): their weights are read again and written again where the runtime's manager put the files back
    /// (systemd does, at runc's own `SetUnitProperties`).
    StillStarting(Vec<ContainerId>),
    /// A container stopped (its cgroup is gone; the container may still exist, stopped): its state is dropped,
    /// except that a writer whose weights outlive the cgroup ([`WeightWriter::persists`]) first puts the original
    /// back into the container's configuration.
    Stopped(ContainerId),
    /// A container no longer exists (Docker's `destroy`): nothing of it is left to restore, its state is dropped.
    Removed(ContainerId),
    /// The event stream was lost and re-established: this is the full list of running containers now. Containers
    /// not in it are dropped; new ones are adopted.
    Resync(Vec<ContainerInfo>),
    /// The runtime is unreachable (e.g. dockerd restarting); discovery retries with backoff and sends
    /// [`DiscoveryEvent::Resync`] when it is back. Weights stay as they are meanwhile.
    Lost(String),
}

/// The containers a runtime announced before it finished starting them (their cgroup seen at its creation), shared
/// by discovery (which adds and removes them) and the writer: while a container is in it, its runtime or its
/// runtime's manager is still setting the cgroup up (dockerd holds the container's lock; runc configures a systemd
/// scope through systemd), so a weight goes straight into the cgroup files, never through them.
#[derive(Debug, Clone, Default)]
pub struct Starting(Arc<Mutex<BTreeSet<ContainerId>>>);

impl Starting {
    /// Whether `id` was announced before its runtime reported it started (or gone).
    pub fn contains(&self, id: &ContainerId) -> bool {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).contains(id)
    }

    /// Adds `id` (discovery announced it early).
    pub fn insert(&self, id: &ContainerId) {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).insert(id.clone());
    }

    /// Removes `id`; whether it was there.
    pub fn remove(&self, id: &ContainerId) -> bool {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).remove(id)
    }

    /// The containers in it now.
    pub fn ids(&self) -> Vec<ContainerId> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).iter().cloned().collect()
    }
}

/// A discovery failure the daemon cannot recover from by waiting (e.g. the socket path does not exist at start).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DiscoveryError {
    /// The runtime could not be reached or answered with an error.
    #[error("{what}: {detail}")]
    Runtime {
        /// What was being done (names the socket or the call).
        what: String,
        /// The runtime's answer.
        detail: String,
    },
    /// A cgroup directory could not be listed.
    #[error(transparent)]
    Cgroup(#[from] CgroupError),
}

/// Finds containers. Implementations subscribe to changes *before* listing, so nothing is missed in between.
pub trait Discovery: Send {
    /// Subscribes to events, then lists the running containers and returns them.
    fn start(&mut self) -> impl Future<Output = Result<Vec<ContainerInfo>, DiscoveryError>> + Send;
    /// Waits for the next change. Transient failures are handled inside (retry with backoff) and reported as
    /// [`DiscoveryEvent::Lost`] / [`DiscoveryEvent::Resync`]; an `Err` is permanent.
    fn next_event(&mut self) -> impl Future<Output = Result<DiscoveryEvent, DiscoveryError>> + Send;
}

/// Where a sample or a write went wrong for one container.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BackendError {
    /// A cgroup file operation failed (the error names the file).
    #[error(transparent)]
    Cgroup(#[from] CgroupError),
    /// The runtime's API failed.
    #[error("{what} for container {id}: {detail}")]
    Runtime {
        /// The container.
        id: ContainerId,
        /// The call.
        what: &'static str,
        /// The answer.
        detail: String,
    },
    /// The container has no cgroup directory this backend can use.
    #[error("container {0} has no reachable cgroup directory")]
    NoCgroup(ContainerId),
    /// The runtime no longer knows the container (it was removed).
    #[error("container {id} no longer exists: {detail}")]
    NoContainer {
        /// The container.
        id: ContainerId,
        /// The runtime's answer.
        detail: String,
    },
    /// A cap of 0 bytes/s, which no throttle file can hold (v1 reads 0 as "remove the limit", v2 refuses it).
    #[error("cannot cap container {id} at 0 {what}: the throttle files have no zero limit")]
    ZeroCap {
        /// The container.
        id: ContainerId,
        /// Which limit: "read bytes/s" or "write bytes/s".
        what: &'static str,
    },
}

impl BackendError {
    /// The container's cgroup disappeared (it stopped), or the runtime no longer knows it (removed): not a fault,
    /// treat as removal.
    pub fn is_vanished(&self) -> bool {
        match self {
            BackendError::Cgroup(e) => e.is_vanished(),
            BackendError::NoContainer { .. } => true,
            BackendError::Runtime { .. } | BackendError::NoCgroup(_) | BackendError::ZeroCap { .. } => false,
        }
    }
}

/// Reads cumulative I/O counters. Holds per-container handles between rounds (e.g. open files), so a round costs
/// at most one read per container and no runtime API call. A round may leave out containers that cannot have done
/// I/O since the previous one (no entry in `out`): the daemon treats that like unchanged counters.
pub trait CounterSource: Send {
    /// Starts sampling a container. Called once per container, before its first sample.
    fn attach(&mut self, info: &ContainerInfo) -> impl Future<Output = Result<(), BackendError>> + Send;
    /// Stops sampling a container and frees its handles.
    fn detach(&mut self, id: &ContainerId);
    /// One sampling round over every attached container; results are appended to `out`.
    fn sample(
        &mut self,
        out: &mut Vec<(ContainerId, Result<IoCounters, BackendError>)>,
    ) -> impl Future<Output = ()> + Send;
}

/// How a weight reached the kernel. Serialized (status protocol) as [`AppliedVia::as_str`] says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum AppliedVia {
    /// Through Docker's API (`docker update --blkio-weight`), confirmed in the cgroup file. (Named for what it
    /// is: only the Docker runtime has an API actuator.)
    #[serde(rename = "docker")]
    DockerApi,
    /// By writing the cgroup weight file directly, confirmed by reading it back. Named `files` like the actuator
    /// mode; `cgroupfs` (its first name, an older agent's answer) still reads.
    #[serde(rename = "files", alias = "cgroupfs")]
    CgroupFile,
    /// As properties of the container's systemd unit (`SetUnitProperties`), confirmed in the cgroup files.
    #[serde(rename = "systemd")]
    Systemd,
}

impl AppliedVia {
    /// The actuator's name in logs and status: `docker`, `files` or `systemd`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::DockerApi => "docker",
            Self::CgroupFile => "files",
            Self::Systemd => "systemd",
        }
    }
}

/// What a [`WeightWriter::cap`] did, for logs and status.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum CapApplied {
    /// This writer does not cap (the trait's default): nothing was written.
    Unsupported,
    /// Written into the cgroup's throttle files and read back (see [`crate::files::FileWriter::write_cap`]): each
    /// device the write covered and the limits in force on it now. Empty: no device to cap (none where BFQ
    /// decides yet), or a lift of a container that was not capped.
    Files(Vec<DeviceCap>),
}

/// The byte-rate limits in force on one device of a container after a cap or its lift (`None`: no limit). Below
/// the cap where the container had a lower limit of its own, which a cap never loosens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceCap {
    /// The device.
    pub dev: crate::kernel::DevNum,
    /// Read bytes per second.
    pub read_bps: Option<u64>,
    /// Written bytes per second.
    pub write_bps: Option<u64>,
}

/// Applies weights and proves they arrived by reading the cgroup file back.
pub trait WeightWriter: Send {
    /// The weight the container has now, read from its cgroup (used to restore it later).
    fn read(&mut self, info: &ContainerInfo) -> impl Future<Output = Result<Weight, BackendError>> + Send;
    /// Sets the weight and verifies it by reading the cgroup file back. Always a write of `weight`, even when it
    /// equals the original: a pinned weight must be in force, whatever the files held before.
    fn write(
        &mut self,
        info: &ContainerInfo,
        weight: Weight,
    ) -> impl Future<Output = Result<AppliedVia, BackendError>> + Send;
    /// Puts the container's original weight back (release, shutdown, entering dry run) and verifies it. Its own
    /// operation, never inferred from a value: a writer that kept the files as `read` found them (cgroup v2:
    /// per-device overrides) puts them back so; one that did not writes `original`.
    fn restore(
        &mut self,
        info: &ContainerInfo,
        original: Weight,
    ) -> impl Future<Output = Result<AppliedVia, BackendError>> + Send;
    /// Whether a weight this writer sets outlives the container's cgroup: kept in the runtime's own configuration of
    /// the container, which gives it to the container again at its next start (`docker update` keeps it in the
    /// container's `hostconfig.json`). A container such a writer may have changed that stops gets its original put
    /// back there ([`WeightWriter::restore_exited`]) before the original is forgotten. The files' writers: no.
    fn persists(&self) -> bool {
        false
    }
    /// Puts the original weight back into the configuration of a container that stopped (its cgroup is gone) and
    /// verifies it there, not in the files, which are gone with the cgroup. Called only if
    /// [`WeightWriter::persists`]. An error for which [`BackendError::is_vanished`] holds means that the runtime no
    /// longer knows the container: nothing is left to restore. The default, for a writer that keeps nothing beyond
    /// the cgroup, answers so.
    fn restore_exited(
        &mut self,
        id: &ContainerId,
        _original: Weight,
    ) -> impl Future<Output = Result<AppliedVia, BackendError>> + Send {
        let detail = "this writer keeps nothing of a container beyond its cgroup".to_string();
        std::future::ready(Err(BackendError::NoContainer { id: id.clone(), detail }))
    }
    /// Holds the container's throughput at most `cap` (`Some`) on the devices where BFQ decides, or lifts the cap
    /// (`None`), putting back exactly the limits the container had before its first cap; verified by reading the
    /// files back. A cap never loosens a limit the container already had. The default, for a writer that does not
    /// cap, writes nothing and answers [`CapApplied::Unsupported`].
    fn cap(
        &mut self,
        _info: &ContainerInfo,
        _cap: Option<qos_core::Cap>,
    ) -> impl Future<Output = Result<CapApplied, BackendError>> + Send {
        std::future::ready(Ok(CapApplied::Unsupported))
    }
    /// Tries again to put back what a previous agent left in force and this writer could not put back at start
    /// (the file writer: the throttle limits of its caps, [`crate::files::FileWriter::retry_leftover_caps`]), and
    /// says what it did. The daemon calls it every round, in dry run too (putting back is not steering). The
    /// default has nothing to do.
    fn retry_leftovers(&mut self) -> impl Future<Output = ()> + Send {
        std::future::ready(())
    }
    /// Drops what the writer keeps about a container that is gone (a restore snapshot, a unit's own properties),
    /// so what it keeps does not grow with every container ever seen. The daemon calls it when it drops one.
    fn forget(&mut self, _id: &ContainerId) {}
}

/// The block devices as the weights see them, for the daemon: what governs each (cgroup v2: BFQ, io.cost or
/// nothing), each container's devices and the weight in force on them, and a health watch. The daemon ticks it
/// once a sampling round with its own clock and shows it in status; a daemon without one shows no devices (cgroup
/// v1, or a runtime that does not track them). [`crate::files::FileDevices`] is the files layer's.
pub trait DeviceMonitor: Send + std::fmt::Debug {
    /// Every device looked at so far and what governs it.
    fn device_table(&self) -> Vec<crate::blockdev::DeviceFacts>;
    /// The devices of a container's last weight read or write, what governed each and the effective weight read
    /// back from the file(s) that act on it.
    fn container_devices(&self, id: &ContainerId) -> Vec<DeviceWeight>;
    /// A sampling round at `now` (the daemon's clock): periodic checks (cgroup v2: io.cost pinned at its minimum
    /// rate, see [`crate::blockdev::vrate`]) run when their period is up.
    fn tick(&mut self, now: std::time::Instant);
}

/// One device of a container's cgroup (cgroup v2): what governs it and the weight in force on it, as the last
/// read or write of the container's weight files read it back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceWeight {
    /// The device.
    pub dev: crate::kernel::DevNum,
    /// What acts on it (BFQ, io.cost, both, nothing).
    pub governor: crate::blockdev::Governor,
    /// For each file that acts on the device (`io.bfq.weight` for BFQ, `io.weight` for io.cost), the effective
    /// value read back (its `MAJ:MIN` override, else its default), in that file's scale; empty when nothing acts,
    /// or before the first read-back.
    pub effective: Vec<(crate::cgroup::WeightFileKind, u32)>,
}

/// A runtime's backends as the agent assembles them (`runtime::<name>::backends`, called by the binary and the
/// bench alike), with the devices its writer plans with.
#[derive(Debug)]
pub struct RuntimeBackends<D, C, W, M> {
    /// Finds the containers.
    pub discovery: D,
    /// Samples their counters.
    pub counters: C,
    /// Applies their weights.
    pub writer: W,
    /// The devices the writer plans with ([`DeviceMonitor`]; the agent's runtimes share the files layer's table,
    /// `crate::files::FileDevices`): ticked and shown by the daemon.
    pub devices: M,
    /// The containers discovery announced while their runtime was still starting them (empty for runtimes that
    /// announce none early): a writer wrapped around `writer` writes their cgroup files directly.
    pub starting: Starting,
}
