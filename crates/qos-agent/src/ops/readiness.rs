//! Readiness that means something: `GET /readyz` on the metrics listener answers 200 only while the container
//! runtime answers and at least one checked device is one where a cgroup weight acts (BFQ, or io.cost on v2);
//! otherwise 503. The body says why, one line for the runtime and one per device: what governs it and, where no
//! weight acts, the fix. The devices are `[devices] check`, or with `runtime = "cri"` and an empty list the disks
//! holding `[cri] state_dirs` (the kubelet's and the runtime's state directories, where pods' writable layers,
//! emptyDirs and logs live), see [`state_dir_disks`].
//!
//! Each probe reads every device's scheduler and the v2 root's `io.cost.qos` afresh (two small sysfs/cgroupfs
//! reads per device), so a device fixed by hand turns the node ready without a restart. The metrics listener's
//! bounds ([`crate::ops::limits::METRICS`]) bound the probes too.

use std::path::PathBuf;
use std::sync::atomic::AtomicI64;
use std::sync::Mutex;
use std::time::Instant;

use prometheus_client::metrics::gauge::Gauge;

use crate::blockdev::{disk_of_path, DeviceTable};
use crate::cgroup::{CgroupRoot, CgroupVersion};

/// A device whose governor decides readiness, and why it is checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckedDevice {
    /// The disk's name in `/sys/block` (e.g. `sda`).
    pub name: String,
    /// Why it is checked: `[devices] check`, or the state directories it holds.
    pub why: String,
}

/// The disks holding `dirs` (those that exist here), each with the directories it holds, in order of first
/// mention. A directory that does not exist (not mounted into the agent's pod, another runtime's) is skipped.
pub fn state_dir_disks(dirs: &[PathBuf]) -> Vec<CheckedDevice> {
    let mut out: Vec<CheckedDevice> = Vec::new();
    for dir in dirs {
        let Ok(name) = disk_of_path(dir) else { continue };
        match out.iter_mut().find(|d| d.name == name) {
            Some(d) => d.why.push_str(&format!(", {}", dir.display())),
            None => out.push(CheckedDevice { name, why: format!("holds {}", dir.display()) }),
        }
    }
    out
}

/// What `/readyz` looks at (see the module doc).
#[derive(Debug)]
pub struct Readiness {
    runtime_up: Gauge<i64, AtomicI64>,
    devices: Vec<CheckedDevice>,
    table: Mutex<DeviceTable>,
    /// cgroup v1: only BFQ can act (io.cost is v2's), so the fix names BFQ alone.
    v1: bool,
}

/// One probe's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadinessReport {
    /// Ready: the runtime answers and a weight acts on at least one checked device.
    pub ready: bool,
    /// One line for the runtime, one per device, then the verdict.
    pub lines: Vec<String>,
}

impl Readiness {
    /// Readiness from the daemon's `runtime_up` gauge (a clone shares the value) and the checked devices; device
    /// facts are read from the real `/sys` and the cgroup root (its `io.cost.qos` on v2).
    pub fn new(runtime_up: Gauge<i64, AtomicI64>, devices: Vec<CheckedDevice>, root: &CgroupRoot) -> Self {
        let mut r = Self::with_table(runtime_up, devices, DeviceTable::new(root.path()));
        r.v1 = root.version() == CgroupVersion::V1;
        r
    }

    /// [`Readiness::new`] over a device table of the caller's (tests: a fixture `/sys`), for cgroup v2.
    pub fn with_table(runtime_up: Gauge<i64, AtomicI64>, devices: Vec<CheckedDevice>, table: DeviceTable) -> Self {
        Self { runtime_up, devices, table: Mutex::new(table), v1: false }
    }

    /// The same on cgroup v1 (the fix names BFQ only).
    pub fn on_v1(mut self) -> Self {
        self.v1 = true;
        self
    }

    /// The checked devices.
    pub fn devices(&self) -> &[CheckedDevice] {
        &self.devices
    }

    /// Reads every device's facts now and says whether the node is ready, and why.
    pub fn check(&self) -> ReadinessReport {
        let mut lines = Vec::new();
        let runtime_ok = self.runtime_up.get() == 1;
        lines.push(if runtime_ok {
            "runtime: answers".to_string()
        } else {
            "runtime: UNREACHABLE (weights are kept as they are; the agent retries)".to_string()
        });
        let mut acting = 0;
        let mut table = self.table.lock().unwrap_or_else(|p| p.into_inner());
        for d in &self.devices {
            let line = match table.dev_of_name(&d.name) {
                Err(e) => format!("device {} ({}): cannot be read: {e}", d.name, d.why),
                Ok(dev) => {
                    let (facts, _) = table.refresh(dev, Instant::now());
                    let scheduler = facts.scheduler.as_deref().unwrap_or("unknown");
                    if facts.governor.is_effective() {
                        acting += 1;
                        format!(
                            "device {} {} ({}): {}: weights act (scheduler {scheduler})",
                            d.name, facts.dev, d.why, facts.governor
                        )
                    } else {
                        let fix = if self.v1 {
                            format!(
                                "`echo bfq > /sys/block/{0}/queue/scheduler` (or [devices] switch_to_bfq = \
                                 [\"{0}\"]); io.cost needs cgroup v2",
                                d.name
                            )
                        } else {
                            facts.fix()
                        };
                        let off = if self.v1 { "" } else { ", io.cost off" };
                        format!(
                            "device {} {} ({}): none: NO WEIGHT ACTS (scheduler {scheduler}{off}). Fix: {fix}",
                            d.name, facts.dev, d.why
                        )
                    }
                }
            };
            lines.push(line);
        }
        let devices_ok = acting > 0;
        if self.devices.is_empty() {
            lines.push(
                "no device is checked: name the node's disks in [devices] check (with runtime = \"cri\" the disks \
                 holding [cri] state_dirs are checked when they are visible to the agent)"
                    .into(),
            );
        } else if !devices_ok {
            lines.push("no checked device can act on weights".into());
        }
        let ready = runtime_ok && devices_ok;
        lines.push(if ready { "ready".into() } else { "not ready".into() });
        ReadinessReport { ready, lines }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake `/sys` with `devices` (name, `MAJ:MIN`, scheduler line) and a v2 root with `io.cost.qos`.
    fn fixture(devices: &[(&str, &str, &str)], io_cost_qos: &str) -> (tempfile::TempDir, DeviceTable) {
        let tmp = tempfile::tempdir().unwrap();
        for (name, dev, sched) in devices {
            let block = tmp.path().join("sys/block").join(name);
            std::fs::create_dir_all(block.join("queue")).unwrap();
            std::fs::write(block.join("dev"), format!("{dev}\n")).unwrap();
            std::fs::write(block.join("queue/scheduler"), format!("{sched}\n")).unwrap();
            let devlink = tmp.path().join("sys/dev/block");
            std::fs::create_dir_all(&devlink).unwrap();
            std::os::unix::fs::symlink(&block, devlink.join(dev)).unwrap();
        }
        std::fs::create_dir_all(tmp.path().join("cg")).unwrap();
        std::fs::write(tmp.path().join("cg/io.cost.qos"), io_cost_qos).unwrap();
        let table = DeviceTable::with_sys(&tmp.path().join("sys"), &tmp.path().join("cg"));
        (tmp, table)
    }

    fn dev(name: &str) -> CheckedDevice {
        CheckedDevice { name: name.into(), why: "holds /var/lib/kubelet".into() }
    }

    #[test]
    fn ready_only_with_the_runtime_up_and_a_device_where_weights_act() {
        let (_tmp, table) =
            fixture(&[("sda", "8:0", "mq-deadline [bfq] none"), ("vdb", "254:16", "[mq-deadline] none")], "");
        let up = Gauge::<i64, AtomicI64>::default();
        let r = Readiness::with_table(up.clone(), vec![dev("sda"), dev("vdb")], table);
        // The daemon has not said the runtime answers yet.
        let rep = r.check();
        assert!(!rep.ready);
        assert!(rep.lines[0].contains("UNREACHABLE"), "{:?}", rep.lines);
        up.set(1);
        let rep = r.check();
        assert!(rep.ready, "{:?}", rep.lines);
        assert_eq!(rep.lines[1], "device sda 8:0 (holds /var/lib/kubelet): bfq: weights act (scheduler bfq)");
        assert!(rep.lines[2].starts_with("device vdb 254:16 (holds /var/lib/kubelet): none: NO WEIGHT ACTS"));
        assert!(rep.lines[2].contains("echo bfq > /sys/block/vdb/queue/scheduler"), "{}", rep.lines[2]);
        assert_eq!(rep.lines.last().unwrap(), "ready");
        // On v1 the fix names BFQ only.
        let (_t, table) = fixture(&[("vdb", "254:16", "[mq-deadline] none")], "");
        let rep = Readiness::with_table(up.clone(), vec![dev("vdb")], table).on_v1().check();
        assert_eq!(
            rep.lines[1],
            "device vdb 254:16 (holds /var/lib/kubelet): none: NO WEIGHT ACTS (scheduler mq-deadline). Fix: `echo bfq \
             > /sys/block/vdb/queue/scheduler` (or [devices] switch_to_bfq = [\"vdb\"]); io.cost needs cgroup v2"
        );
    }

    #[test]
    fn not_ready_when_no_device_can_act_and_ready_once_one_is_fixed() {
        let (tmp, table) = fixture(&[("vdb", "254:16", "[mq-deadline] none")], "");
        let up = Gauge::<i64, AtomicI64>::default();
        up.set(1);
        let r = Readiness::with_table(up, vec![dev("vdb")], table.with_max_age(std::time::Duration::ZERO));
        let rep = r.check();
        assert!(!rep.ready);
        assert!(rep.lines.iter().any(|l| l == "no checked device can act on weights"), "{:?}", rep.lines);
        // io.cost enabled for it by hand: ready at the next probe, no restart.
        std::fs::write(tmp.path().join("cg/io.cost.qos"), "254:16 enable=1 ctrl=user rpct=95.00\n").unwrap();
        let rep = r.check();
        assert!(rep.ready, "{:?}", rep.lines);
        assert!(rep.lines[1].contains(": io-cost: weights act"), "{:?}", rep.lines);
        // No device at all: not ready, and it says what to set.
        let (_t, table) = fixture(&[], "");
        let up = Gauge::<i64, AtomicI64>::default();
        up.set(1);
        let rep = Readiness::with_table(up, vec![], table).check();
        assert!(!rep.ready && rep.lines[1].contains("[devices] check"), "{:?}", rep.lines);
    }

    #[test]
    fn state_dirs_map_to_their_disks_and_missing_ones_are_skipped() {
        let here = std::env::temp_dir();
        let got = state_dir_disks(&[here.clone(), PathBuf::from("/nonexistent/var/lib/kubelet"), here.join(".")]);
        // The temp dir is on some disk in a normal test environment (not in every container: then nothing).
        if let Some(d) = got.first() {
            assert_eq!(got.len(), 1, "{got:?}");
            assert!(d.why.starts_with(&format!("holds {}", here.display())) && d.why.contains(", "), "{d:?}");
        }
        assert!(state_dir_disks(&[PathBuf::from("/nonexistent")]).is_empty());
    }
}
