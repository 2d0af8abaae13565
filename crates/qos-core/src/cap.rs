//! [`Cap`]: the throughput cap the engine puts on a container that has settled at the bottom level, and
//! [`CapChange`], the engine's output that sets or lifts one.
//!
//! Why a cap besides the weight: on a device that one big reader keeps saturated, a small read that arrives waits
//! behind the device's queue whatever its weight (the weight decides who goes next, not how long the queue in front
//! of the scheduler is). Held a few percent under what the device did (its load), the big reader leaves the device a little idle time,
//! and a small read is served at once (on the bench's throttled disk, cgroup v1, BFQ: a 1 MiB read beside a QD32
//! reader capped at 95 % of its rate took 1.29 ms mean against 15.4 uncapped and 1.16 alone;
//! `crates/bench/results/2026-11-29/headroom-ab-fio/`). Opt-in (`bottom_cap_window`): with the agent on the same
//! disk it slowed 100 MiB reads and readers that start together
//! (`crates/bench/results/2026-11-29/bottom-cap-ab-ce4e266/`). A container that uses up its top allotment lifts
//! every cap (the engine's `lift_other_caps`): with it, a cap in force for 3 s before a 1 MiB read took it from 14.4
//! to 5.3 ms mean and a 100 MiB read lost 2 % instead of 9 % (two runs each,
//! `crates/bench/results/2026-11-29/bottom-cap-steady-state-50650cb/`).

use serde::{Deserialize, Serialize};

use crate::id::ContainerId;

/// Bytes per second a container may read and write (`None`: that direction is not capped).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Cap {
    /// Read bytes per second.
    pub read_bps: Option<u64>,
    /// Written bytes per second.
    pub write_bps: Option<u64>,
}

/// One decision about a container's cap: set it (`Some`) or lift it (`None`: put back what the container had).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CapChange {
    /// The container.
    pub id: ContainerId,
    /// The cap to apply, or `None` to lift the one applied.
    pub cap: Option<Cap>,
}
