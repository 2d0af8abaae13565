//! Protection by default (`[devices] protect = "auto"`): every device the agent manages is made one where
//! weights decide latency, chosen per device from what the agent finds there, and put back at stop.
//!
//! **Which devices are managed**: `[devices] check` when the operator names devices, else the disk holding the
//! runtime's data (Docker's data root; the kubelet's and the runtime's state directories, `[cri] state_dirs`);
//! none for `runtime = "cgroup-dir"` without `check`. Never the disk holding `/` (nor the disks under it): that one
//! is reported, with the commands to make the change by hand, and left alone. `[devices] opt_out = ["sdb"]` leaves
//! a managed device as it is; `protect = "off"` leaves every device.
//!
//! **What is set** ([`plan_in`]):
//! - the scheduler is BFQ: a shallow request queue of small requests and, on a device that pays nothing for seeks,
//!   short slots ([`bfq_settings_for`]: `queue/nr_requests = 4`, `queue/max_sectors_kb` at most [`MAX_REQUEST_KB`]
//!   and BFQ's `timeout_sync` at most [`SLOT_MS`]; BFQ's other tunables left as they are). A big reader then holds
//!   at most four requests of at most 128 KiB in the device, so a small reader's request waits behind about
//!   512 KiB, not behind the big reader's 32 or 256 requests of up to 1.25 MiB, and BFQ's weights pick it next.
//!   Measured (2026-11-26, loop device, v1; `crates/bench/results/2026-11-26/slots-*`): `nr_requests = 4` alone
//!   took a 1 MiB read every 50 ms beside a QD32 sequential reader from 61-69 ms as found to 3.3 ms, the big reader
//!   keeping its throughput (92-105 %); BFQ's `strict_guarantees` protected as well but cost the big reader
//!   14-42 %, and the short slots without it (`max_budget=256 timeout_sync=8`) made the small reader wait 380 ms.
//!   On a device whose requests take longer (2026-11-27, the bench's throttled disk, 150 MiB/s: a 1.25 MiB request
//!   costs 8 ms there; `crates/bench/results/2026-11-27/depth-*`), four requests of the found 1280 KiB still left a
//!   new container's 1 MiB read 28-42 ms (mean of 30; Docker's nested layout) and requests of at most 128 KiB
//!   brought it to 17-19 ms (p50 13), the big reader at the same 152 MiB/s (128 KiB requests need 1,200 IOPS at
//!   150 MiB/s). The slot: a container's cgroup under a common parent (Docker's `docker/<id>`) cannot preempt the
//!   queue BFQ is serving, so a small read that arrives as the big reader's slot begins waits for all of it, up to
//!   `timeout_sync` (125 ms as found): on the same disk (2026-11-28, 150 new containers' 1 MiB reads each,
//!   `crates/bench/results/2026-11-28/slot-*`) the slowest read was 94.7 ms as found, 40.5 ms at 32 ms slots and
//!   28.5 ms at 16 (at 8 ms 40.3, the median worse too: probably a 1 MiB read, eight requests of 128 KiB, no longer
//!   fits in one slot; not traced), the big reader at 147 MiB/s in all. Protection sets 32 ms, not 16: readers that
//!   start together need a slot that holds a 2-4 MiB read ([`SLOT_MS`]). A disk with moving heads keeps BFQ's long
//!   slots (a short one there costs seeks; no such disk on this machine kind). Many virtual disks report
//!   `rotational` 1 whatever backs them (virtio-blk does unless the host says otherwise), so a device that reports
//!   it rotates is measured at start ([`measure_lone_read`]: lone 4 KiB random reads, reads only, about
//!   [`LONE_READ_PROBE_MS`] ms): a median under [`SEEK_FREE_US`] comes from no disk with moving heads, and the
//!   device gets the short slots too;
//! - cgroup v2, another scheduler: io.cost enabled with a model measured from the device at start
//!   ([`super::iocost::measure`], reads only, about 4 s) and a latency target from its lone-read latency; a
//!   device with io.cost already enabled (the operator's model) is left as it is;
//! - a device the operator's `bfq_tunables` names: the operator's tunables, nothing of protection's.
//!
//! Every setting goes through the guarded writes of `switch.rs` (allow-list, root disk, read back), is logged with
//! its old and new value, recorded before it is written in `<state_file>.bfq-tunables.json` (so an agent after a
//! SIGKILL restores the first originals), shown in `status` and metrics, and put back at stop
//! ([`super::tune::TunedDevices`]).

use std::path::Path;

use super::iocost::{self, IO_COST_MODEL, IO_COST_QOS};
use super::setting::devnum_in;
use super::setting::read_tunable;
pub use super::setting::{line_has_all, queue_file, Setting, MAX_SECTORS_KB, NR_REQUESTS, QUEUE_FILES, SCHEDULER};
use super::{scheduler_in, validate_name, DevNum, Result};
use crate::config::{DevicesConfig, ProtectMode};

/// The request queue's depth protection gives a BFQ device (`queue/nr_requests`; 4 is the kernel's least).
pub const QUEUE_DEPTH: u32 = 4;
/// The largest request protection leaves a BFQ device, in KiB (`queue/max_sectors_kb`): a device whose requests
/// are already at most this big keeps its value.
pub const MAX_REQUEST_KB: u32 = 128;
/// BFQ's tunable that bounds how long one queue keeps the device once BFQ has given it a slot (ms).
pub const TIMEOUT_SYNC: &str = "timeout_sync";
/// The longest slot protection leaves a BFQ device that pays nothing for seeks, in ms ([`TIMEOUT_SYNC`]; BFQ's
/// default is 125): a device whose slots are already at most this long keeps its value, one with moving heads
/// keeps BFQ's. 32, not 16: on the bench's disk (150 MiB/s) a 2-4 MiB read of a container that starts beside
/// others takes 13-27 ms of the device, and at 16 ms it spans slots and waits for the others' between them
/// (session 27's A/B, 48 rounds an arm: Experiment 2's slowest 2 MiB and 4 MiB reads 492 and 582 ms at 16, three
/// of them STARVED, against 208 and 268 ms and none at 32; a 1 MiB read 11.2 against 12.2 ms mean, 18.9 against
/// 19.1 slowest; `crates/bench/results/2026-11-28/slot-ab-*`).
pub const SLOT_MS: u32 = 32;
/// The queue's file that says whether the device rotates (`queue/rotational`: 1 or 0; read only).
pub const ROTATIONAL: &str = "rotational";
/// A device reporting it rotates whose lone 4 KiB random read takes less than this (median, µs) has no moving
/// heads to pay for: half a turn of a 15,000 rpm disk alone is 2 ms, and a seek comes on top.
pub const SEEK_FREE_US: u64 = 2_000;
/// How long protection reads a device that reports it rotates, at start (at least 16 reads).
pub const LONE_READ_PROBE_MS: u64 = 250;

/// What protection reads from a device before it plans the device's BFQ settings.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueueFound {
    /// `queue/max_sectors_kb` (KiB); `None` if it does not read as a number.
    pub max_sectors_kb: Option<u32>,
    /// `queue/rotational`; `None` if it does not read as 0 or 1.
    pub rotational: Option<bool>,
    /// BFQ's [`TIMEOUT_SYNC`] (ms); `None` where BFQ is not the scheduler yet (selected, it starts at its default)
    /// or the value does not read as a number.
    pub timeout_sync_ms: Option<u32>,
    /// The median lone 4 KiB random read measured at start (µs; [`measure_lone_read`]); `None`: not measured.
    pub lone_read_us: Option<u64>,
}

impl QueueFound {
    /// From the values of a device's files, by name ([`MAX_SECTORS_KB`], [`ROTATIONAL`], [`TIMEOUT_SYNC`]); `get`
    /// answers `None` for a file it could not read.
    pub fn from_values(get: impl Fn(&str) -> Option<String>) -> Self {
        let num = |key: &str| get(key).and_then(|v| v.trim().parse::<u32>().ok());
        Self {
            max_sectors_kb: num(MAX_SECTORS_KB),
            rotational: num(ROTATIONAL).and_then(|r| match r {
                0 => Some(false),
                1 => Some(true),
                _ => None,
            }),
            timeout_sync_ms: num(TIMEOUT_SYNC),
            lone_read_us: None,
        }
    }

    /// Whether the device pays nothing for seeks: it reports it does not rotate, or its lone read was measured
    /// under [`SEEK_FREE_US`].
    pub fn seek_free(&self) -> bool {
        self.rotational == Some(false) || self.lone_read_us.is_some_and(|us| us < SEEK_FREE_US)
    }

    /// Whether BFQ's slots on the device may be longer than [`SLOT_MS`] (BFQ's default where it is not the
    /// scheduler yet).
    fn slots_may_be_longer(&self) -> bool {
        self.timeout_sync_ms.is_none_or(|ms| ms > SLOT_MS)
    }

    /// Device `name` of the fake or real `sys` as it reads now (BFQ's tunable only where BFQ is its scheduler).
    pub fn read_in(sys: &Path, name: &str) -> Self {
        let bfq = scheduler_in(sys, name).is_ok_and(|s| s.active == "bfq");
        Self::from_values(|key| match key {
            ROTATIONAL => {
                std::fs::read_to_string(super::queue_dir(sys, name).join(ROTATIONAL)).ok().map(|v| v.trim().into())
            }
            TIMEOUT_SYNC if !bfq => None,
            _ => read_tunable(sys, name, key).ok(),
        })
    }
}

/// The settings protection makes on a BFQ device that reads as `found`, in the order written (and put back in
/// reverse): [`NR_REQUESTS`] = [`QUEUE_DEPTH`]; [`MAX_SECTORS_KB`] = [`MAX_REQUEST_KB`] where the device's
/// requests may be bigger (an unreadable value is left as it is); [`TIMEOUT_SYNC`] = [`SLOT_MS`] where the device
/// pays nothing for seeks ([`QueueFound::seek_free`]) and its slots may be longer (BFQ's default after a switch).
pub fn bfq_settings_for(found: QueueFound) -> Vec<(&'static str, String)> {
    let mut out = vec![(NR_REQUESTS, QUEUE_DEPTH.to_string())];
    if found.max_sectors_kb.is_some_and(|kb| kb > MAX_REQUEST_KB) {
        out.push((MAX_SECTORS_KB, MAX_REQUEST_KB.to_string()));
    }
    if found.seek_free() && found.slots_may_be_longer() {
        out.push((TIMEOUT_SYNC, SLOT_MS.to_string()));
    }
    out
}

/// [`bfq_settings_for`] device `name` of the fake or real `sys` as it reads now.
pub fn bfq_settings_in(sys: &Path, name: &str) -> Vec<(&'static str, String)> {
    bfq_settings_for(QueueFound::read_in(sys, name))
}

/// How long each of the io.cost calibration's three loads runs at start (and the lone-read latency up to this).
pub const IOCOST_SECONDS: u64 = 1;
/// Threads of the io.cost calibration at start.
pub const IOCOST_JOBS: usize = 4;

/// A managed device and why it is one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Managed {
    /// Its name in /sys/block.
    pub name: String,
    /// Why it is managed: `[devices] check`, `Docker's data root /var/lib/docker`, ...
    pub why: String,
}

/// The managed devices: `[devices] check` when the operator names devices, else `runtime_disks` (the disks
/// holding the runtime's data, each with why).
pub fn managed(cfg: &DevicesConfig, runtime_disks: impl Iterator<Item = (String, String)>) -> Vec<Managed> {
    if cfg.check.is_empty() {
        runtime_disks.map(|(name, why)| Managed { name, why }).collect()
    } else {
        cfg.check.iter().map(|name| Managed { name: name.clone(), why: "[devices] check".into() }).collect()
    }
}

/// What protection does to one managed device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// BFQ with a shallow request queue of small requests ([`bfq_settings_for`]), after switching the scheduler
    /// from the one named, if any.
    Bfq {
        /// The scheduler it had, when it is switched to BFQ first (cgroup v1).
        switch_from: Option<String>,
        /// What the settings were planned from.
        found: QueueFound,
        /// The queue settings, in the order written.
        settings: Vec<(&'static str, String)>,
    },
    /// io.cost with a model measured from the device (cgroup v2, BFQ not the scheduler).
    IoCost {
        /// The device's number, as in the io.cost files.
        dev: DevNum,
    },
    /// Nothing changed, and why.
    Leave(String),
}

/// One device's plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Planned {
    /// The device.
    pub device: String,
    /// Why it is managed.
    pub why: String,
    /// What protection does.
    pub decision: Decision,
}

impl Planned {
    /// The settings of a [`Decision::Bfq`] (none for the others: io.cost's need the measurement first).
    pub fn bfq_settings(&self) -> Vec<Setting> {
        let Decision::Bfq { switch_from, settings, .. } = &self.decision else { return Vec::new() };
        let setting =
            |key: &str, value: &str| Setting { device: self.device.clone(), key: key.into(), value: value.into() };
        let mut out = Vec::new();
        if switch_from.is_some() {
            out.push(setting(SCHEDULER, "bfq"));
        }
        out.extend(settings.iter().map(|(k, v)| setting(k, v)));
        out
    }

    /// Whether the device's lone read is measured before its settings are final ([`Self::with_lone_read`]): a
    /// BFQ plan for a device that does not report that it does not rotate, and whose slots may be longer than
    /// [`SLOT_MS`].
    pub fn wants_lone_read(&self) -> bool {
        matches!(&self.decision, Decision::Bfq { found, .. }
            if found.rotational != Some(false) && found.lone_read_us.is_none() && found.slots_may_be_longer())
    }

    /// This plan once the device's lone read was measured (`median`, [`measure_lone_read`]): its settings planned
    /// again with it (the short slots where it is under [`SEEK_FREE_US`]). Other plans are returned as they are.
    pub fn with_lone_read(mut self, median: std::time::Duration) -> Self {
        if let Decision::Bfq { found, settings, .. } = &mut self.decision {
            found.lone_read_us = Some(median.as_micros().min(u128::from(u64::MAX)) as u64);
            *settings = bfq_settings_for(*found);
        }
        self
    }

    /// One line for the log and `check-config`.
    pub fn describe(&self) -> String {
        let words = |settings: &[(&str, String)]| {
            settings.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(" ")
        };
        let slots = |found: &QueueFound| {
            let says = match found.rotational {
                Some(true) => "it reports it rotates",
                _ => "its rotational flag does not read",
            };
            match (found.rotational, found.lone_read_us) {
                (Some(false), _) => String::new(),
                (_, Some(us)) if us < SEEK_FREE_US => {
                    format!("; {says}, but a lone read took {us} µs (no moving heads): short slots")
                }
                (_, Some(us)) => format!("; a lone read took {us} µs (a disk with moving heads): BFQ's slots kept"),
                (_, None) if self.wants_lone_read() => format!(
                    "; {says}: its lone reads are measured at start, short slots if under {} ms",
                    SEEK_FREE_US / 1000
                ),
                (_, None) => String::new(),
            }
        };
        match &self.decision {
            Decision::Bfq { switch_from: None, found, settings } => {
                let settings = words(settings);
                format!(
                    "{}: BFQ with {settings}{} (protect; restored at stop) [{}]",
                    self.device,
                    slots(found),
                    self.why
                )
            }
            Decision::Bfq { switch_from: Some(from), found, settings } => format!(
                "{}: scheduler {from} -> bfq, then BFQ with {}{} (protect; restored at stop) [{}]",
                self.device,
                words(settings),
                slots(found),
                self.why
            ),
            Decision::IoCost { dev } => format!(
                "{}: io.cost enabled for {dev} with a model measured at start (protect; restored at stop) [{}]",
                self.device, self.why
            ),
            Decision::Leave(why) => format!("{}: left as it is: {why} [{}]", self.device, self.why),
        }
    }
}

/// Decides, per managed device, what protection sets, from the config, the fake or real `sys`, the disks that are
/// never changed (`protected`: the root disk and the disks under it; an error: none is changed) and the cgroup v2
/// root (`None` on v1). Reads only.
pub fn plan_in(
    sys: &Path,
    protected: &std::result::Result<Vec<String>, String>,
    v2_root: Option<&Path>,
    cfg: &DevicesConfig,
    managed: &[Managed],
) -> Vec<Planned> {
    let mut out: Vec<Planned> = Vec::new();
    for m in managed {
        if out.iter().any(|p| p.device == m.name) {
            continue;
        }
        let decision = decide(sys, protected, v2_root, cfg, &m.name);
        out.push(Planned { device: m.name.clone(), why: m.why.clone(), decision });
    }
    out
}

fn decide(
    sys: &Path,
    protected: &std::result::Result<Vec<String>, String>,
    v2_root: Option<&Path>,
    cfg: &DevicesConfig,
    name: &str,
) -> Decision {
    let leave = |why: String| Decision::Leave(why);
    let opted_out = if cfg.protect == ProtectMode::Off {
        Some("[devices] protect = \"off\"")
    } else {
        cfg.opt_out.iter().any(|d| d == name).then_some("opted out ([devices] opt_out)")
    };
    if let Some(why) = opted_out {
        return leave(format!("{why}{}", long_slots_note(sys, name)));
    }
    match protected {
        Err(e) => return leave(format!("cannot tell which disk backs /, so no device is changed: {e}")),
        Ok(p) if p.iter().any(|d| d == name) => {
            let settings = bfq_settings_in(sys, name)
                .iter()
                .map(|(k, v)| format!("echo {v} > /sys/block/{name}/queue/{}", queue_file(k).display()))
                .collect::<Vec<_>>()
                .join("; ");
            return leave(format!(
                "it backs the root filesystem, which the agent never changes. Weights act on it only if you make \
                 them: with bfq as its scheduler, `{settings}` (cgroup v2 without bfq: `ddiskqos-agent iocost \
                 /dev/{name} --apply`), or put the runtime's data on another disk"
            ));
        }
        Ok(_) => {}
    }
    if cfg.bfq_tunables.get(name).is_some_and(|t| !t.is_empty()) {
        return leave("the operator's [devices] bfq_tunables decide".into());
    }
    let s = match scheduler_in(sys, name) {
        Ok(s) => s,
        Err(e) => return leave(format!("cannot read its scheduler: {e}")),
    };
    if s.active == "bfq" {
        let found = QueueFound::read_in(sys, name);
        return Decision::Bfq { switch_from: None, found, settings: bfq_settings_for(found) };
    }
    if let Some(v2) = v2_root {
        let dev = match devnum_in(sys, name) {
            Ok(dev) => dev,
            Err(e) => return leave(format!("cannot read its device number: {e}")),
        };
        return match super::io_cost_enabled(v2, dev) {
            Ok(true) => {
                leave("io.cost is enabled already (the operator's model): weights act through io.weight".into())
            }
            Ok(false) if !v2.join(IO_COST_QOS).exists() => {
                leave(format!("the kernel has no io.cost ({} missing) and the scheduler is {}", IO_COST_QOS, s.active))
            }
            Ok(false) => Decision::IoCost { dev },
            Err(e) => leave(format!("cannot read io.cost.qos: {e}")),
        };
    }
    if s.available.iter().any(|a| a == "bfq") {
        let found = QueueFound::read_in(sys, name);
        return Decision::Bfq { switch_from: Some(s.active), found, settings: bfq_settings_for(found) };
    }
    leave(format!("its scheduler is {} and bfq is not available (`modprobe bfq`, then restart the agent)", s.active))
}

/// What an operator who opts a BFQ device out of protection keeps (empty where BFQ is not the scheduler or its slots
/// are short already): BFQ's own slots, during which a new container cannot take the device from a big reader.
fn long_slots_note(sys: &Path, name: &str) -> String {
    if !scheduler_in(sys, name).is_ok_and(|s| s.active == "bfq") {
        return String::new();
    }
    // The scheduler is read once above: of the queue's files only the slot is needed here.
    let found =
        QueueFound::from_values(|key| if key == TIMEOUT_SYNC { read_tunable(sys, name, key).ok() } else { None });
    if !found.slots_may_be_longer() {
        return String::new();
    }
    let slot = found.timeout_sync_ms.map_or_else(|| "unread".to_string(), |ms| format!("{ms} ms"));
    format!(
        "; BFQ keeps its own slots there ({TIMEOUT_SYNC} {slot}): a new container's small read can wait for a big \
         reader's whole slot, so weights alone do not bound a read"
    )
}

/// The settings of io.cost for `device` from a measurement: the model line, then the qos line.
pub fn io_cost_settings(device: &str, dev: DevNum, measured: &iocost::Measured) -> [Setting; 2] {
    let qos = iocost::QosTarget::from_latency(std::time::Duration::from_micros(measured.median_4k_qd1_us));
    [
        Setting { device: device.into(), key: IO_COST_MODEL.into(), value: measured.model.line(dev) },
        Setting { device: device.into(), key: IO_COST_QOS.into(), value: qos.line(dev) },
    ]
}

/// Measures `/dev/<device>`'s lone 4 KiB random reads for [`LONE_READ_PROBE_MS`] (reads only; the median).
pub fn measure_lone_read(device: &str) -> Result<std::time::Duration> {
    validate_name(device)?;
    let probe = std::time::Duration::from_millis(LONE_READ_PROBE_MS);
    iocost::lone_read_median(&Path::new("/dev").join(device), probe)
}

/// Measures `/dev/<device>` for io.cost (reads only; [`IOCOST_SECONDS`], [`IOCOST_JOBS`]).
pub fn measure_for_io_cost(device: &str) -> Result<iocost::Measured> {
    validate_name(device)?;
    let cal = iocost::Calibration {
        duration: std::time::Duration::from_secs(IOCOST_SECONDS),
        jobs: IOCOST_JOBS,
        write_file: None,
    };
    iocost::measure(&Path::new("/dev").join(device), &cal)
}
