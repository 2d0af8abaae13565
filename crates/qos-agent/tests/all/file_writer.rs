//! The file writer ([`FileWriter`]) on cgroup v2 and v1 BFQ fixture files written through testbed's [`FixtureKernel`],
//! which applies each line written as the kernel does (a `default N` leaves `io.weight`'s overrides alone and removes
//! BFQ's, `MAJ:MIN default` removes one): per-device overrides written, beaten and restored exactly, also after a
//! crash (from the records file). The throughput cap on the same fixtures, the throttle files written through the
//! fixture kernel's own model of blk-throttle: v1's `blkio.throttle.*_bps_device` and v2's `io.max`.
//! Moved here from the writer's unit tests (issue 28) when the fixture kernel left the production write path for
//! the [`qos_agent::cgroup::CgroupFs`] seam; the rest of the writer's tests need no kernel and stay beside it.

use std::fs;
use std::os::unix::fs::symlink;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use qos_agent::agent::with_writer;
use qos_agent::backend::{
    AppliedVia, BackendError, CapApplied, ContainerInfo, DeviceCap, DeviceMonitor, RuntimeBackends, Starting,
    WeightWriter,
};
use qos_agent::blockdev::DeviceTable;
use qos_agent::cgroup::{CgroupError, CgroupFs, CgroupRoot, CgroupVersion};
use qos_agent::config::{ActuatorMode, AgentConfig};
use qos_agent::files::restore_records::records_path;
use qos_agent::files::{FileWriter, LeftoverCap};
use qos_agent::ops::metrics::DeviceWeightEffective;
use qos_agent::state::OriginalWeights;
use qos_agent::writer::{AgentWriter, Way};
use qos_core::{Cap, ContainerId, Weight};
use testbed::fixture::FixtureKernel;

/// A fake /sys with loop3 (7:3, BFQ), loop4 (7:4, scheduler none, io.cost on) and vda (254:0, mq-deadline,
/// nothing acts), and a v2 root (written through the fixture kernel) with container `docker/c1` that did I/O on
/// loop3 and vda; loop4 comes from `[devices] check`. (The same fake as the writer's unit tests.)
struct Fixture {
    tmp: tempfile::TempDir,
    writer: FileWriter,
    info: ContainerInfo,
}

fn fixture(bfq: &str, io: &str) -> Fixture {
    let tmp = tempfile::tempdir().unwrap();
    let sys = tmp.path().join("sys");
    for (name, num, sched) in [
        ("loop3", "7:3", "none [bfq]\n"),
        ("loop4", "7:4", "[none] bfq\n"),
        ("vda", "254:0", "[mq-deadline] bfq none\n"),
    ] {
        let dev = sys.join("devices/virtual/block").join(name);
        fs::create_dir_all(dev.join("queue")).unwrap();
        fs::write(dev.join("queue/scheduler"), sched).unwrap();
        fs::write(dev.join("dev"), format!("{num}\n")).unwrap();
        fs::create_dir_all(sys.join("block")).unwrap();
        fs::create_dir_all(sys.join("dev/block")).unwrap();
        symlink(format!("../devices/virtual/block/{name}"), sys.join("block").join(name)).unwrap();
        symlink(format!("../../devices/virtual/block/{name}"), sys.join("dev/block").join(num)).unwrap();
    }
    let cg = tmp.path().join("cg");
    let c1 = cg.join("docker/c1");
    fs::create_dir_all(&c1).unwrap();
    fs::write(cg.join("io.cost.qos"), "7:4 enable=1 ctrl=auto rpct=0.00\n254:0 enable=0 ctrl=auto\n").unwrap();
    fs::write(
        c1.join("io.stat"),
        "7:3 rbytes=4096 wbytes=0 rios=1 wios=0 dbytes=0 dios=0\n\
         254:0 rbytes=8192 wbytes=0 rios=2 wios=0 dbytes=0 dios=0\n",
    )
    .unwrap();
    fs::write(c1.join("io.bfq.weight"), bfq).unwrap();
    fs::write(c1.join("io.weight"), io).unwrap();
    let root = CgroupRoot::from_dir(CgroupVersion::V2, &cg).unwrap().with_fs(Arc::new(FixtureKernel));
    let info = ContainerInfo {
        id: ContainerId::new("c1"),
        name: "c1".into(),
        labels: Default::default(),
        cgroup: Some(root.resolve_relative("docker/c1").unwrap()),
    };
    let writer = FileWriter::with_table(DeviceTable::with_sys(&sys, &cg))
        .with_devices(vec!["loop4".into()])
        .with_metric(DeviceWeightEffective::default());
    Fixture { tmp, writer, info }
}

impl Fixture {
    fn file(&self, name: &str) -> String {
        fs::read_to_string(self.tmp.path().join("cg/docker/c1").join(name)).unwrap()
    }
    fn put(&self, name: &str, text: &str) {
        fs::write(self.tmp.path().join("cg/docker/c1").join(name), text).unwrap();
    }
}

fn w(v: u64) -> Weight {
    Weight::new(v).unwrap()
}

/// `DEV=GOVERNOR FILE:EFFECTIVE...` for each device of the fixture's container, as status shows them.
fn devices_of(f: &Fixture) -> Vec<String> {
    f.writer
        .devices()
        .container_devices(&f.info.id)
        .iter()
        .map(|d| {
            let mut s = format!("{}={}", d.dev, d.governor);
            for (kind, v) in &d.effective {
                s.push_str(&format!(" {}:{v}", kind.file_name()));
            }
            s
        })
        .collect()
}

#[test]
fn an_override_that_would_win_is_overwritten_and_restored() {
    // loop3 has an io.bfq.weight override; io.weight has one for a device the container does not use.
    let mut f = fixture("default 100\n7:3 500\n", "default 100\n8:0 300\n");
    // Effective on loop3 is 500 and on loop4 100: read gives the lowest.
    assert_eq!(f.writer.read_weight(&f.info).unwrap(), w(100));
    f.writer.write_weight(&f.info, w(1000)).unwrap();
    assert_eq!(f.file("io.bfq.weight"), "default 1000\n7:3 1000\n");
    assert_eq!(f.file("io.weight"), "default 1000\n8:0 300\n", "8:0 is not governed for this container");
    f.writer.write_weight(&f.info, w(10)).unwrap();
    assert_eq!(f.file("io.bfq.weight"), "default 10\n7:3 10\n");

    // Someone adds an io.weight override on loop4 meanwhile; the next write beats it, the restore removes it.
    f.put("io.weight", "default 10\n7:4 900\n8:0 300\n");
    f.writer.write_weight(&f.info, w(40)).unwrap();
    assert_eq!(f.file("io.weight"), "default 40\n7:4 40\n8:0 300\n");
    f.writer.restore_weight(&f.info, w(100)).unwrap();
    assert_eq!(f.file("io.bfq.weight"), "default 100\n7:3 500\n");
    assert_eq!(f.file("io.weight"), "default 100\n8:0 300\n");
}

#[test]
fn a_pinned_weight_equal_to_the_original_is_in_force_on_every_device() {
    // loop3 has an io.bfq.weight override of 500, loop4 reads 100: `read` gives the lowest, 100.
    let mut f = fixture("default 100\n7:3 500\n", "default 100\n");
    assert_eq!(f.writer.read_weight(&f.info).unwrap(), w(100));
    f.writer.write_weight(&f.info, w(1000)).unwrap();
    // Pinned at 100, the original's value: a write like any other, so loop3 gets 100 too (not its old 500).
    f.writer.write_weight(&f.info, w(100)).unwrap();
    assert_eq!(f.file("io.bfq.weight"), "default 100\n7:3 100\n");
    assert_eq!(devices_of(&f), ["7:3=bfq io.bfq.weight:100", "7:4=io-cost io.weight:100", "254:0=none"]);
    // The restore, its own operation, puts loop3's override back.
    f.writer.restore_weight(&f.info, w(100)).unwrap();
    assert_eq!(f.file("io.bfq.weight"), "default 100\n7:3 500\n");
    // A restore to another original (one a crashed agent left on file) writes it like any weight.
    f.writer.restore_weight(&f.info, w(40)).unwrap();
    assert_eq!(f.file("io.bfq.weight"), "default 40\n7:3 40\n");
}

/// Issue 28, defect 5: an `io.weight` above 1000 reads as 1000 (the engine's scale ends there), and an agent
/// restarted after a crash used to put back 1000, the state file's weight. With the records file the new agent
/// puts back the files exactly, overrides included; a container it reads afresh replaces an old record.
#[test]
fn after_a_crash_the_files_come_back_exactly_from_the_records_file() {
    let mut f = fixture("default 100\n7:3 500\n", "default 5000\n");
    let records = f.tmp.path().join("state/state.json.v2-files.jsonl");
    let sys = f.tmp.path().join("sys");
    let cg = f.tmp.path().join("cg");
    let writer = |path: &Path| {
        FileWriter::with_table(DeviceTable::with_sys(&sys, &cg))
            .with_devices(vec!["loop4".into()])
            .with_records_file(path.to_owned())
    };
    f.writer = writer(&records);
    // The engine sees 500 (the lowest in force: loop3's override; loop4's 5000 reads as 1000).
    assert_eq!(f.writer.read_weight(&f.info).unwrap(), w(500));
    f.writer.write_weight(&f.info, w(10)).unwrap();
    // The crash: nothing is put back, the writer is gone.
    f.writer = writer(&records);
    assert_eq!(f.file("io.weight"), "default 10\n");
    // The state file owes the container 500; the new agent does not read it again, and restores.
    f.writer.restore_weight(&f.info, w(500)).unwrap();
    assert_eq!(f.file("io.weight"), "default 5000\n");
    assert_eq!(f.file("io.bfq.weight"), "default 100\n7:3 500\n");
    assert!(!records.exists(), "a record put back is dropped, and an empty records file removed");

    // Without the file (the agent before the fix, or a dry run) the state file's weight is all there is.
    let mut plain = FileWriter::with_table(DeviceTable::with_sys(&sys, &cg)).with_devices(vec!["loop4".into()]);
    plain.read_weight(&f.info).unwrap();
    plain.write_weight(&f.info, w(10)).unwrap();
    let mut plain = FileWriter::with_table(DeviceTable::with_sys(&sys, &cg)).with_devices(vec!["loop4".into()]);
    plain.restore_weight(&f.info, w(500)).unwrap();
    assert_eq!(f.file("io.weight"), "default 500\n", "the defect this records file fixes");
    f.put("io.bfq.weight", "default 100\n7:3 500\n");

    // The daemon re-verifies the weights it wrote by reading them: such a read after the crash finds the
    // agent's own weight and must not take the place of the crashed agent's snapshot.
    f.put("io.weight", "default 7000\n");
    f.put("io.bfq.weight", "default 100\n");
    f.writer = writer(&records);
    f.writer.read_weight(&f.info).unwrap();
    f.writer.write_weight(&f.info, w(10)).unwrap();
    f.writer = writer(&records); // crash
    assert_eq!(f.writer.read_weight(&f.info).unwrap(), w(10), "the re-verifying read sees the agent's weight");
    f.writer.restore_weight(&f.info, w(100)).unwrap();
    assert_eq!(f.file("io.weight"), "default 7000\n");
}

/// A records file as the agent wrote it before v1's per-device file was planned (one v2 snapshot) still loads and
/// puts the files back exactly.
#[test]
fn a_records_file_of_the_earlier_agent_still_restores() {
    let mut f = fixture("default 10\n", "default 10\n");
    let records = f.tmp.path().join("state.json.v2-files.jsonl");
    let dir = f.tmp.path().join("cg/docker/c1");
    let line = format!(
        "{{\"id\":\"c1\",\"record\":{{\"weight\":500,\"dir\":\"{}\",\"files\":[[\"io.bfq.weight\",{{\"default\":100,\
         \"devices\":{{\"7:3\":500}}}}],[\"io.weight\",{{\"default\":5000,\"devices\":{{}}}}]]}}}}\n",
        dir.display()
    );
    fs::write(&records, line).unwrap();
    let (sys, cg) = (f.tmp.path().join("sys"), f.tmp.path().join("cg"));
    f.writer = FileWriter::with_table(DeviceTable::with_sys(&sys, &cg))
        .with_devices(vec!["loop4".into()])
        .with_records_file(records.clone());
    f.writer.restore_weight(&f.info, w(500)).unwrap();
    assert_eq!(f.file("io.bfq.weight"), "default 100\n7:3 500\n");
    assert_eq!(f.file("io.weight"), "default 5000\n");
    assert!(!records.exists(), "the record was used and dropped");
}

/// A v1 cgroup with BFQ's per-device file (loop3 BFQ, vda mq-deadline, both in its BFQ counters) written through
/// the fixture kernel; `blkio.bfq.weight` stays as made (the kernel mirrors the default there; nothing reads it).
fn v1_fixture(weight_device: &str, records: Option<&Path>) -> Fixture {
    let mut f = fixture("default 100\n", "default 100\n");
    let (sys, v1) = (f.tmp.path().join("sys"), f.tmp.path().join("blkio"));
    let c1 = v1.join("docker/c1");
    fs::create_dir_all(&c1).unwrap();
    fs::write(c1.join("blkio.bfq.weight"), "100\n").unwrap();
    fs::write(c1.join("blkio.bfq.weight_device"), weight_device).unwrap();
    fs::write(
        c1.join("blkio.bfq.io_service_bytes_recursive"),
        "7:3 Read 4096\n7:3 Write 0\n7:3 Sync 4096\n7:3 Async 0\n7:3 Discard 0\n7:3 Total 4096\n\
         254:0 Read 8192\n254:0 Write 0\n254:0 Total 8192\nTotal 12288\n",
    )
    .unwrap();
    let root = CgroupRoot::from_dir(CgroupVersion::V1, &v1).unwrap().with_fs(Arc::new(FixtureKernel));
    f.info.cgroup = Some(root.resolve_relative("docker/c1").unwrap());
    let writer = FileWriter::with_table(DeviceTable::with_sys(&sys, &v1));
    f.writer = match records {
        Some(path) => writer.with_records_file(path.to_owned()),
        None => writer,
    };
    f
}

impl Fixture {
    fn v1_file(&self) -> String {
        fs::read_to_string(self.tmp.path().join("blkio/docker/c1/blkio.bfq.weight_device")).unwrap()
    }
}

/// cgroup v1: an override in `blkio.bfq.weight_device` (Docker's `--blkio-weight-device`) wins over
/// `blkio.bfq.weight` on its device, so the writer writes, checks and restores through the per-device file, also
/// after a crash (the v1 records file); an override someone added after the first read is removed at the restore.
#[test]
fn v1_a_weight_device_override_is_beaten_and_restored_exactly() {
    let mut f = v1_fixture("default 100\n7:3 300\n", None);
    assert_eq!(f.writer.read_weight(&f.info).unwrap(), w(300), "loop3's override is what acts there");
    f.writer.write_weight(&f.info, w(10)).unwrap();
    assert_eq!(f.v1_file(), "default 10\n7:3 10\n");
    assert_eq!(devices_of(&f), ["7:3=bfq blkio.bfq.weight_device:10", "254:0=none"]);
    f.writer.verify_weight(&f.info, w(10)).unwrap();
    f.writer.restore_weight(&f.info, w(300)).unwrap();
    assert_eq!(f.v1_file(), "default 100\n7:3 300\n");

    // A check of the plain file alone would pass here; the per-device file says the demotion is not in force.
    fs::write(f.tmp.path().join("blkio/docker/c1/blkio.bfq.weight_device"), "default 10\n7:3 300\n").unwrap();
    let err = f.writer.verify_weight(&f.info, w(10)).unwrap_err().to_string();
    assert!(err.contains("blkio.bfq.weight_device") && err.contains("7:3") && err.contains("300"), "{err}");

    let dir = tempfile::tempdir().unwrap();
    let records = dir.path().join("state.json.v1-files.jsonl");
    let mut f = v1_fixture("default 100\n", Some(&records));
    assert_eq!(f.writer.read_weight(&f.info).unwrap(), w(100));
    fs::write(f.tmp.path().join("blkio/docker/c1/blkio.bfq.weight_device"), "default 100\n7:3 500\n").unwrap();
    f.writer.write_weight(&f.info, w(10)).unwrap();
    assert_eq!(f.v1_file(), "default 10\n7:3 10\n", "the later override is beaten too");
    // The crash: a new writer restores from the records file.
    let sys = f.tmp.path().join("sys");
    f.writer = FileWriter::with_table(DeviceTable::with_sys(&sys, &f.tmp.path().join("blkio")))
        .with_records_file(records.clone());
    f.writer.restore_weight(&f.info, w(100)).unwrap();
    assert_eq!(f.v1_file(), "default 100\n", "the override the agent wrote is removed");
    assert!(!records.exists());
}

// The throughput cap ([`FileWriter::write_cap`]) on the same fixtures: the throttle files written through the
// fixture kernel's model of blk-throttle (its own parser, not the agent's).

const MIB: u64 = 1 << 20;

fn cap(read: Option<u64>, write: Option<u64>) -> Option<Cap> {
    Some(Cap { read_bps: read, write_bps: write })
}

fn dc(dev: &str, read: Option<u64>, write: Option<u64>) -> DeviceCap {
    DeviceCap { dev: dev.parse().unwrap(), read_bps: read, write_bps: write }
}

/// v2: the cap goes into `io.max` on loop3 only (BFQ decides there; loop4 is io.cost's, vda nobody's), changing
/// only the keys it caps; another device's line and the IOPS keys are left alone; a lift gives back the file as it
/// was, byte for byte.
#[test]
fn v2_cap_on_the_bfq_device_only_and_lifted_exactly() {
    let mut f = fixture("default 100\n", "default 100\n");
    let original = "254:0 rbps=100 wbps=max riops=max wiops=max\n";
    f.put("io.max", original);
    let done = f.writer.write_cap(&f.info, cap(Some(4 * MIB), None)).unwrap();
    assert_eq!(done, [dc("7:3", Some(4 * MIB), None)]);
    assert_eq!(
        f.file("io.max"),
        "7:3 rbps=4194304 wbps=max riops=max wiops=max\n254:0 rbps=100 wbps=max riops=max wiops=max\n"
    );
    // A tighter cap, both directions, replaces the agent's own.
    let done = f.writer.write_cap(&f.info, cap(Some(MIB), Some(2 * MIB))).unwrap();
    assert_eq!(done, [dc("7:3", Some(MIB), Some(2 * MIB))]);
    assert_eq!(
        f.file("io.max"),
        "7:3 rbps=1048576 wbps=2097152 riops=max wiops=max\n254:0 rbps=100 wbps=max riops=max wiops=max\n"
    );
    let done = f.writer.write_cap(&f.info, None).unwrap();
    assert_eq!(done, [dc("7:3", None, None)]);
    assert_eq!(f.file("io.max"), original);
    // Nothing left to lift: a second lift writes nothing.
    assert_eq!(f.writer.write_cap(&f.info, None).unwrap(), []);
    assert_eq!(f.file("io.max"), original);
}

/// v2: a limit the container had is never loosened (a lower read limit stays, the write limit above the cap comes
/// down to it), its IOPS limit untouched, and the lift puts every one of them back.
#[test]
fn v2_a_lower_existing_limit_is_kept_and_everything_restored() {
    let mut f = fixture("default 100\n", "default 100\n");
    let original = "7:3 rbps=1000 wbps=8388608 riops=max wiops=50\n";
    f.put("io.max", original);
    let done = f.writer.write_cap(&f.info, cap(Some(4 * MIB), Some(4 * MIB))).unwrap();
    assert_eq!(done, [dc("7:3", Some(1000), Some(4 * MIB))]);
    assert_eq!(f.file("io.max"), "7:3 rbps=1000 wbps=4194304 riops=max wiops=50\n");
    // A looser cap later: the agent's own write cap loosens up to the container's 8 MiB, not beyond.
    let done = f.writer.write_cap(&f.info, cap(Some(64 * MIB), Some(64 * MIB))).unwrap();
    assert_eq!(done, [dc("7:3", Some(1000), Some(8 * MIB))]);
    f.writer.write_cap(&f.info, cap(None, Some(MIB))).unwrap();
    assert_eq!(f.file("io.max"), "7:3 rbps=1000 wbps=1048576 riops=max wiops=50\n");
    f.writer.write_cap(&f.info, None).unwrap();
    assert_eq!(f.file("io.max"), original);
}

/// A v1 fixture with the throttle files, each holding `read` and `write`.
fn v1_cap_fixture(read: &str, write: &str, records: Option<&Path>) -> Fixture {
    let mut f = v1_fixture("default 100\n", None);
    f.put_v1("blkio.throttle.read_bps_device", read);
    f.put_v1("blkio.throttle.write_bps_device", write);
    if let Some(path) = records {
        f.writer = std::mem::take(&mut f.writer).with_cap_records_file(path.to_owned());
    }
    f
}

impl Fixture {
    fn v1(&self, name: &str) -> String {
        fs::read_to_string(self.tmp.path().join("blkio/docker/c1").join(name)).unwrap()
    }
    fn put_v1(&self, name: &str, text: &str) {
        fs::write(self.tmp.path().join("blkio/docker/c1").join(name), text).unwrap();
    }
    fn throttle(&self) -> (String, String) {
        (self.v1("blkio.throttle.read_bps_device"), self.v1("blkio.throttle.write_bps_device"))
    }
}

/// v1: `blkio.throttle.read_bps_device` and `write_bps_device`: the cap on loop3 (BFQ; vda is mq-deadline's) in
/// each, a lower limit kept, and the lift gives back both files exactly (a limit removed with `MAJ:MIN 0`).
#[test]
fn v1_cap_kept_under_an_existing_limit_and_lifted_exactly() {
    let (read, write) = ("7:3 1000\n254:0 777\n", "");
    let mut f = v1_cap_fixture(read, write, None);
    let done = f.writer.write_cap(&f.info, cap(Some(4 * MIB), Some(2 * MIB))).unwrap();
    assert_eq!(done, [dc("7:3", Some(1000), Some(2 * MIB))], "the read limit of 1000 B/s is lower: kept");
    assert_eq!(f.throttle(), ("7:3 1000\n254:0 777\n".into(), "7:3 2097152\n".into()));
    f.writer.write_cap(&f.info, None).unwrap();
    assert_eq!(f.throttle(), (read.into(), write.into()));

    // No limit before: both set, both removed.
    let mut f = v1_cap_fixture("", "", None);
    f.writer.write_cap(&f.info, cap(Some(4 * MIB), Some(2 * MIB))).unwrap();
    assert_eq!(f.throttle(), ("7:3 4194304\n".into(), "7:3 2097152\n".into()));
    f.writer.write_cap(&f.info, None).unwrap();
    assert_eq!(f.throttle(), (String::new(), String::new()));
}

/// v1 without `blkio.bfq.weight_device` (BFQ before 5.4): the devices of the BFQ counters that BFQ schedules;
/// without BFQ counters, nothing is capped (and nothing written).
#[test]
fn v1_without_the_per_device_file_caps_the_bfq_counters_devices() {
    let mut f = v1_cap_fixture("", "", None);
    fs::remove_file(f.tmp.path().join("blkio/docker/c1/blkio.bfq.weight_device")).unwrap();
    let done = f.writer.write_cap(&f.info, cap(Some(MIB), None)).unwrap();
    assert_eq!(done, [dc("7:3", Some(MIB), None)]);
    assert_eq!(f.throttle(), ("7:3 1048576\n".into(), String::new()));
    f.writer.write_cap(&f.info, None).unwrap();
    assert_eq!(f.throttle(), (String::new(), String::new()));
    fs::remove_file(f.tmp.path().join("blkio/docker/c1/blkio.bfq.io_service_bytes_recursive")).unwrap();
    assert_eq!(f.writer.write_cap(&f.info, cap(Some(MIB), None)).unwrap(), []);
    assert_eq!(f.throttle(), (String::new(), String::new()));
}

/// A crash with a cap in force: the next agent, from the records file, puts the limits back exactly (a start-up
/// restore), drops the record of a cgroup that is gone, and a cap it sets before any restore still lifts to the
/// limits from before the crashed agent's cap.
#[test]
fn v1_caps_left_by_a_crashed_agent_are_put_back_from_the_records_file() {
    let state = tempfile::tempdir().unwrap();
    let records = records_path(&state.path().join("state.json"), "caps");
    let (read, write) = ("7:3 1000\n", "254:0 5\n");
    let mut f = v1_cap_fixture(read, write, Some(&records));
    f.writer.write_cap(&f.info, cap(Some(4 * MIB), Some(4 * MIB))).unwrap();
    assert_eq!(f.throttle(), ("7:3 1000\n".into(), "7:3 4194304\n254:0 5\n".into()));
    assert!(records.is_file(), "recorded before the write");
    // A second container whose cgroup goes away with the cap.
    let v1 = f.tmp.path().join("blkio");
    fs::create_dir_all(v1.join("docker/c2")).unwrap();
    for (name, text) in [
        ("blkio.bfq.weight_device", "default 100\n"),
        ("blkio.bfq.io_service_bytes_recursive", "7:3 Read 1\nTotal 1\n"),
        ("blkio.throttle.read_bps_device", ""),
        ("blkio.throttle.write_bps_device", ""),
    ] {
        fs::write(v1.join("docker/c2").join(name), text).unwrap();
    }
    let root = CgroupRoot::from_dir(CgroupVersion::V1, &v1).unwrap().with_fs(Arc::new(FixtureKernel));
    let c2 = ContainerInfo {
        id: ContainerId::new("c2"),
        name: "c2".into(),
        labels: Default::default(),
        cgroup: Some(root.resolve_relative("docker/c2").unwrap()),
    };
    f.writer.write_cap(&c2, cap(Some(MIB), None)).unwrap();
    fs::remove_dir_all(v1.join("docker/c2")).unwrap();

    // The crash: a new writer on the same records.
    let sys = f.tmp.path().join("sys");
    let new_writer = || FileWriter::with_table(DeviceTable::with_sys(&sys, &v1)).with_cap_records_file(records.clone());
    f.writer = new_writer();
    let mut done: Vec<String> = f
        .writer
        .restore_leftover_caps(&root)
        .into_iter()
        .map(|o| match o {
            LeftoverCap::Restored { id, devices, .. } => format!("{id} restored {devices:?}"),
            LeftoverCap::Gone { id, .. } => format!("{id} gone"),
            other => panic!("{other:?}"),
        })
        .collect();
    done.sort();
    assert_eq!(done, [format!("c1 restored {:?}", [dc("7:3", Some(1000), None)]), "c2 gone".to_string()]);
    assert_eq!(f.throttle(), (read.into(), write.into()));
    assert!(!records.exists(), "both records dropped, the empty file removed");
    assert!(f.writer.restore_leftover_caps(&root).is_empty());

    // A cap, a crash, and a cap again before any restore: the lift still gives back the limits from before.
    f.writer = new_writer();
    f.writer.write_cap(&f.info, cap(Some(MIB), Some(MIB))).unwrap();
    f.writer = new_writer();
    f.writer.write_cap(&f.info, cap(Some(2 * MIB), Some(2 * MIB))).unwrap();
    assert_eq!(f.throttle(), ("7:3 1000\n".into(), "7:3 2097152\n254:0 5\n".into()));
    f.writer.write_cap(&f.info, None).unwrap();
    assert_eq!(f.throttle(), (read.into(), write.into()));
    assert!(!records.exists());
}

/// A write the files do not take (here a seam that drops every `io.max` write) fails naming the file, the device,
/// the limit written and the one read back; a cap of 0 and bad file content are refused, named.
#[test]
fn a_cap_not_read_back_fails_naming_file_device_and_values() {
    #[derive(Debug)]
    struct DropsIoMax;
    impl CgroupFs for DropsIoMax {
        fn write(&self, path: &Path, data: &[u8]) -> std::io::Result<usize> {
            if path.ends_with("io.max") {
                Ok(data.len())
            } else {
                FixtureKernel.write(path, data)
            }
        }
    }
    let mut f = fixture("default 100\n", "default 100\n");
    f.put("io.max", "");
    let root = CgroupRoot::from_dir(CgroupVersion::V2, f.tmp.path().join("cg")).unwrap().with_fs(Arc::new(DropsIoMax));
    let info = ContainerInfo { cgroup: Some(root.resolve_relative("docker/c1").unwrap()), ..f.info.clone() };
    let err = f.writer.write_cap(&info, cap(Some(4 * MIB), None)).unwrap_err();
    match &err {
        BackendError::Cgroup(CgroupError::LimitMismatch { path, device, what, wrote, read }) => {
            assert!(path.ends_with("docker/c1/io.max"), "{}", path.display());
            assert_eq!((device.as_str(), *what, *wrote, *read), ("7:3", "read bytes/s", Some(4 * MIB), None));
        }
        other => panic!("{other}"),
    }
    let text = err.to_string();
    assert!(
        text.contains("io.max") && text.contains("7:3") && text.contains("4194304") && text.contains("no limit"),
        "{text}"
    );

    let err = f.writer.write_cap(&f.info, cap(Some(MIB), Some(0))).unwrap_err();
    assert!(matches!(err, BackendError::ZeroCap { what: "write bytes/s", .. }), "{err}");
    assert_eq!(f.file("io.max"), "", "nothing written");
    f.put("io.max", "7:3 rbps=fast\n");
    let err = f.writer.write_cap(&f.info, cap(Some(MIB), None)).unwrap_err().to_string();
    assert!(err.contains("io.max:1") && err.contains("rbps=fast"), "{err}");
}

/// The trait's default for a writer that does not cap: nothing written, `Unsupported`; the file writer caps.
#[tokio::test]
async fn weight_writer_cap_defaults_to_unsupported() {
    struct NoCaps;
    impl WeightWriter for NoCaps {
        async fn read(&mut self, _: &ContainerInfo) -> Result<Weight, BackendError> {
            Ok(Weight::new(100).unwrap())
        }
        async fn write(&mut self, _: &ContainerInfo, _: Weight) -> Result<AppliedVia, BackendError> {
            Ok(AppliedVia::CgroupFile)
        }
        async fn restore(&mut self, _: &ContainerInfo, _: Weight) -> Result<AppliedVia, BackendError> {
            Ok(AppliedVia::CgroupFile)
        }
    }
    let mut f = fixture("default 100\n", "default 100\n");
    f.put("io.max", "");
    assert_eq!(NoCaps.cap(&f.info, cap(Some(MIB), None)).await.unwrap(), CapApplied::Unsupported);
    let applied = WeightWriter::cap(&mut f.writer, &f.info, cap(Some(MIB), None)).await.unwrap();
    assert_eq!(applied, CapApplied::Files(vec![dc("7:3", Some(MIB), None)]));
}

/// A disk that went away while capped: the kernel forgets its limits (its lines go) and answers ENODEV to a line
/// about it. Its lines gone, the lift finds no limit there, writes nothing for it and drops the record; a disk
/// that goes between the lift's read and its write answers ENODEV, and the lift leaves it out.
#[test]
fn a_lift_after_the_disk_went_away_skips_it() {
    #[derive(Debug)]
    struct Unplugged;
    impl CgroupFs for Unplugged {
        fn write(&self, path: &Path, data: &[u8]) -> std::io::Result<usize> {
            if data.starts_with(b"7:3 ") {
                Err(std::io::Error::from_raw_os_error(19)) // ENODEV
            } else {
                FixtureKernel.write(path, data)
            }
        }
    }
    let mut f = v1_cap_fixture("7:3 1000\n", "254:0 5\n", None);
    f.writer.write_cap(&f.info, cap(Some(MIB), Some(MIB))).unwrap();
    assert_eq!(f.throttle(), ("7:3 1000\n".into(), "7:3 1048576\n254:0 5\n".into()));
    // loop3 is gone: its lines with it.
    f.put_v1("blkio.throttle.read_bps_device", "");
    f.put_v1("blkio.throttle.write_bps_device", "254:0 5\n");
    let root =
        CgroupRoot::from_dir(CgroupVersion::V1, f.tmp.path().join("blkio")).unwrap().with_fs(Arc::new(Unplugged));
    let info = ContainerInfo { cgroup: Some(root.resolve_relative("docker/c1").unwrap()), ..f.info.clone() };
    assert_eq!(f.writer.write_cap(&info, None).unwrap(), [dc("7:3", None, None)], "no limit left on it");
    assert_eq!(f.throttle(), (String::new(), "254:0 5\n".into()));
    // The record is gone: a later lift writes nothing, even with the device back.
    assert_eq!(f.writer.write_cap(&f.info, None).unwrap(), []);

    // Gone after the lift read the files (their lines still there): the writes about it fail with ENODEV.
    let mut f = v1_cap_fixture("7:3 1000\n", "254:0 5\n", None);
    f.writer.write_cap(&f.info, cap(Some(MIB), Some(MIB))).unwrap();
    let root =
        CgroupRoot::from_dir(CgroupVersion::V1, f.tmp.path().join("blkio")).unwrap().with_fs(Arc::new(Unplugged));
    let info = ContainerInfo { cgroup: Some(root.resolve_relative("docker/c1").unwrap()), ..f.info.clone() };
    assert_eq!(f.writer.write_cap(&info, None).unwrap(), [], "nothing in force to report");
    // The record is gone.
    assert_eq!(f.writer.write_cap(&f.info, None).unwrap(), []);
}

/// The agent's writer caps through its file writer (the way chosen for weights plays no part), and puts back a
/// crashed agent's caps through it.
#[tokio::test]
async fn the_agent_writer_caps_through_the_files() {
    let mut f = fixture("default 100\n", "default 100\n");
    f.put("io.max", "");
    let files = std::mem::take(&mut f.writer);
    let mut agent = AgentWriter::new(files, Way::Files);
    let applied = agent.cap(&f.info, cap(Some(MIB), Some(2 * MIB))).await.unwrap();
    assert_eq!(applied, CapApplied::Files(vec![dc("7:3", Some(MIB), Some(2 * MIB))]));
    assert_eq!(f.file("io.max"), "7:3 rbps=1048576 wbps=2097152 riops=max wiops=max\n");
    let root =
        CgroupRoot::from_dir(CgroupVersion::V2, f.tmp.path().join("cg")).unwrap().with_fs(Arc::new(FixtureKernel));
    let done = agent.restore_leftover_caps(&root);
    assert!(matches!(done.as_slice(), [LeftoverCap::Restored { .. }]), "{done:?}");
    assert_eq!(f.file("io.max"), "");
    assert_eq!(agent.cap(&f.info, None).await.unwrap(), CapApplied::Files(vec![]), "nothing left to lift");
}

/// A second v1 cgroup `docker/<name>` beside the fixture's c1, doing I/O on loop3, without throttle limits.
fn v1_cgroup(f: &Fixture, name: &str) -> ContainerInfo {
    let v1 = f.tmp.path().join("blkio");
    fs::create_dir_all(v1.join("docker").join(name)).unwrap();
    for (file, text) in [
        ("blkio.bfq.weight_device", "default 100\n"),
        ("blkio.bfq.io_service_bytes_recursive", "7:3 Read 1\nTotal 1\n"),
        ("blkio.throttle.read_bps_device", ""),
        ("blkio.throttle.write_bps_device", ""),
    ] {
        fs::write(v1.join("docker").join(name).join(file), text).unwrap();
    }
    let root = CgroupRoot::from_dir(CgroupVersion::V1, &v1).unwrap().with_fs(Arc::new(FixtureKernel));
    ContainerInfo { cgroup: Some(root.resolve_relative(&format!("docker/{name}")).unwrap()), ..f.info.clone() }
}

/// A limit the operator sets while the cap is in force (`docker update --device-read-bps`, a unit's
/// `IOReadBandwidthMax=`: both write the throttle files) is the container's limit from then on: the lift leaves it
/// (it used to put back the limit from before the cap over it), a cap written after it is never looser, and a
/// leftover cap put back after a crash leaves it too.
#[test]
fn a_limit_set_while_capped_is_kept_by_the_lift_and_never_loosened() {
    // v1: a tighter read limit set while capped; the lift leaves it.
    let mut f = v1_cap_fixture("", "", None);
    f.writer.write_cap(&f.info, cap(Some(4 * MIB), None)).unwrap();
    assert_eq!(f.throttle(), ("7:3 4194304\n".into(), String::new()));
    f.put_v1("blkio.throttle.read_bps_device", "7:3 2097152\n");
    assert_eq!(f.writer.write_cap(&f.info, None).unwrap(), [dc("7:3", Some(2 * MIB), None)]);
    assert_eq!(f.throttle(), ("7:3 2097152\n".into(), String::new()), "the operator's limit was lifted");

    // v2: a looser read limit set while capped (it lifted the agent's cap there); the cap written again (the
    // daemon does so when the container's configuration changed) keeps under it, and the lift leaves it.
    let mut f = fixture("default 100\n", "default 100\n");
    f.put("io.max", "");
    f.writer.write_cap(&f.info, cap(Some(4 * MIB), Some(4 * MIB))).unwrap();
    f.put("io.max", "7:3 rbps=104857600 wbps=4194304 riops=max wiops=max\n");
    let done = f.writer.write_cap(&f.info, cap(Some(4 * MIB), Some(4 * MIB))).unwrap();
    assert_eq!(done, [dc("7:3", Some(4 * MIB), Some(4 * MIB))]);
    let done = f.writer.write_cap(&f.info, cap(Some(200 * MIB), Some(4 * MIB))).unwrap();
    assert_eq!(done, [dc("7:3", Some(100 * MIB), Some(4 * MIB))], "a cap looser than the operator's limit");
    assert_eq!(f.writer.write_cap(&f.info, None).unwrap(), [dc("7:3", Some(100 * MIB), None)]);
    assert_eq!(f.file("io.max"), "7:3 rbps=104857600 wbps=max riops=max wiops=max\n");

    // v1, a crash: the operator sets a write limit while the cap a dead agent left is in force; the next agent's
    // start-up restore leaves it.
    let state = tempfile::tempdir().unwrap();
    let records = records_path(&state.path().join("state.json"), "caps");
    let mut f = v1_cap_fixture("7:3 1000\n", "", Some(&records));
    f.writer.write_cap(&f.info, cap(Some(MIB), Some(MIB))).unwrap();
    f.put_v1("blkio.throttle.write_bps_device", "7:3 524288\n");
    let (sys, v1) = (f.tmp.path().join("sys"), f.tmp.path().join("blkio"));
    f.writer = FileWriter::with_table(DeviceTable::with_sys(&sys, &v1)).with_cap_records_file(records.clone());
    let root = CgroupRoot::from_dir(CgroupVersion::V1, &v1).unwrap().with_fs(Arc::new(FixtureKernel));
    let done = f.writer.restore_leftover_caps(&root);
    assert!(matches!(done.as_slice(), [LeftoverCap::Restored { .. }]), "{done:?}");
    assert_eq!(f.throttle(), ("7:3 1000\n".into(), "7:3 524288\n".into()));
    assert!(!records.exists());
}

/// A cap write that failed half-way (the read limit written, the write limit not) leaves lines of two of the
/// agent's caps; neither is taken for an operator's, and the lift puts both files back.
#[test]
fn a_cap_write_that_failed_half_way_is_still_the_agents_own() {
    #[derive(Debug)]
    struct NoWrites(Arc<AtomicBool>);
    impl CgroupFs for NoWrites {
        fn write(&self, path: &Path, data: &[u8]) -> std::io::Result<usize> {
            if self.0.load(Ordering::SeqCst) && path.ends_with("blkio.throttle.write_bps_device") {
                Err(std::io::Error::from_raw_os_error(libc::EIO))
            } else {
                FixtureKernel.write(path, data)
            }
        }
    }
    let mut f = v1_cap_fixture("", "", None);
    let broken = Arc::new(AtomicBool::new(false));
    let root = CgroupRoot::from_dir(CgroupVersion::V1, f.tmp.path().join("blkio"))
        .unwrap()
        .with_fs(Arc::new(NoWrites(broken.clone())));
    let info = ContainerInfo { cgroup: Some(root.resolve_relative("docker/c1").unwrap()), ..f.info.clone() };
    f.writer.write_cap(&info, cap(Some(MIB), Some(MIB))).unwrap();
    broken.store(true, Ordering::SeqCst);
    f.writer.write_cap(&info, cap(Some(2 * MIB), Some(2 * MIB))).unwrap_err();
    assert_eq!(f.throttle(), ("7:3 2097152\n".into(), "7:3 1048576\n".into()));
    broken.store(false, Ordering::SeqCst);
    f.writer.write_cap(&info, None).unwrap();
    assert_eq!(f.throttle(), (String::new(), String::new()));
}

/// A container whose cgroup changed while capped (the old one still there): the lift puts back the limits in the
/// cgroup the cap was written to (it used to answer "nothing to lift" and leave it capped), and a cap in the new
/// cgroup first lifts the old one's (it used to drop the old snapshot, leaving the old cgroup capped for good).
#[test]
fn a_lift_acts_on_the_cgroup_the_cap_was_written_to() {
    let mut f = v1_cap_fixture("7:3 1000\n", "", None);
    let moved = v1_cgroup(&f, "c1-new");
    f.writer.write_cap(&f.info, cap(Some(4 * MIB), Some(4 * MIB))).unwrap();
    assert_eq!(f.throttle(), ("7:3 1000\n".into(), "7:3 4194304\n".into()));
    assert_eq!(f.writer.write_cap(&moved, None).unwrap(), [dc("7:3", Some(1000), None)]);
    assert_eq!(f.throttle(), ("7:3 1000\n".into(), String::new()), "the old cgroup stayed capped");
    assert_eq!(f.writer.write_cap(&moved, None).unwrap(), [], "lifted once");

    f.writer.write_cap(&f.info, cap(Some(4 * MIB), Some(4 * MIB))).unwrap();
    f.writer.write_cap(&moved, cap(Some(MIB), None)).unwrap();
    assert_eq!(f.throttle(), ("7:3 1000\n".into(), String::new()), "the old cgroup stayed capped");
    let new_read = f.tmp.path().join("blkio/docker/c1-new/blkio.throttle.read_bps_device");
    assert_eq!(fs::read_to_string(&new_read).unwrap(), "7:3 1048576\n");
    f.writer.write_cap(&moved, None).unwrap();
    assert_eq!(fs::read_to_string(&new_read).unwrap(), "");
}

/// A container the daemon forgets while the cgroup its cap was written to still exists (it moved to another one
/// while capped, or lingers): the writer puts that cap back at its next retry; nothing else would lift it.
#[test]
fn a_cap_on_a_cgroup_that_outlived_its_forgotten_container_is_put_back() {
    let state = tempfile::tempdir().unwrap();
    let records = records_path(&state.path().join("state.json"), "caps");
    let (read, write) = ("7:3 1000\n", "");
    let mut f = v1_cap_fixture(read, write, Some(&records));
    let v1 = f.tmp.path().join("blkio");
    let root = CgroupRoot::from_dir(CgroupVersion::V1, &v1).unwrap().with_fs(Arc::new(FixtureKernel));
    assert!(f.writer.restore_leftover_caps(&root).is_empty(), "nothing left at start");
    f.writer.write_cap(&f.info, cap(Some(MIB), Some(MIB))).unwrap();
    WeightWriter::forget(&mut f.writer, &f.info.id);
    assert_eq!(f.throttle(), ("7:3 1000\n".into(), "7:3 1048576\n".into()), "forgetting writes nothing");
    let done = f.writer.retry_leftover_caps();
    assert!(matches!(done.as_slice(), [LeftoverCap::Restored { .. }]), "{done:?}");
    assert_eq!(f.throttle(), (read.into(), write.into()));
    assert!(f.writer.retry_leftover_caps().is_empty(), "put back once");
}

/// A leftover cap whose start-up restore fails (here EIO on the throttle files) is tried again
/// ([`FileWriter::retry_leftover_caps`], which the daemon calls every round): once the files take the write, the
/// limits from before the dead agent's cap are back and the record is gone.
#[test]
fn a_leftover_cap_that_could_not_be_put_back_at_start_is_tried_again() {
    #[derive(Debug)]
    struct Eio(Arc<AtomicBool>);
    impl CgroupFs for Eio {
        fn write(&self, path: &Path, data: &[u8]) -> std::io::Result<usize> {
            let throttle = path.file_name().is_some_and(|n| n.to_string_lossy().starts_with("blkio.throttle."));
            if self.0.load(Ordering::SeqCst) && throttle {
                Err(std::io::Error::from_raw_os_error(libc::EIO))
            } else {
                FixtureKernel.write(path, data)
            }
        }
    }
    let state = tempfile::tempdir().unwrap();
    let records = records_path(&state.path().join("state.json"), "caps");
    let (read, write) = ("7:3 1000\n", "254:0 5\n");
    let mut f = v1_cap_fixture(read, write, Some(&records));
    f.writer.write_cap(&f.info, cap(Some(MIB), Some(MIB))).unwrap();
    // The crash, and a start whose restore fails.
    let (sys, v1) = (f.tmp.path().join("sys"), f.tmp.path().join("blkio"));
    f.writer = FileWriter::with_table(DeviceTable::with_sys(&sys, &v1)).with_cap_records_file(records.clone());
    let broken = Arc::new(AtomicBool::new(true));
    let root = CgroupRoot::from_dir(CgroupVersion::V1, &v1).unwrap().with_fs(Arc::new(Eio(broken.clone())));
    let done = f.writer.restore_leftover_caps(&root);
    assert!(matches!(done.as_slice(), [LeftoverCap::Failed { kept: true, .. }]), "{done:?}");
    let done = f.writer.retry_leftover_caps();
    assert!(matches!(done.as_slice(), [LeftoverCap::Failed { kept: true, .. }]), "{done:?}");
    assert!(records.is_file());
    broken.store(false, Ordering::SeqCst);
    let done = f.writer.retry_leftover_caps();
    assert!(matches!(done.as_slice(), [LeftoverCap::Restored { .. }]), "{done:?}");
    assert_eq!(f.throttle(), (read.into(), write.into()));
    assert!(!records.exists(), "the record is gone");
    assert!(f.writer.retry_leftover_caps().is_empty(), "nothing left to try");
}

/// A discovery that finds nothing and waits forever: an embedder's, for assembling an agent on the files.
struct NoContainers;

impl qos_agent::backend::Discovery for NoContainers {
    async fn start(&mut self) -> Result<Vec<ContainerInfo>, qos_agent::backend::DiscoveryError> {
        Ok(Vec::new())
    }
    async fn next_event(&mut self) -> Result<qos_agent::backend::DiscoveryEvent, qos_agent::backend::DiscoveryError> {
        std::future::pending().await
    }
}

/// The cgroup-dir runtime and an embedder assemble on the files' writer without `with_writer`: the caps a killed
/// agent left are put back there too (they were not: only Docker's and the CRI's assembly did it).
#[test]
fn an_agent_assembled_on_the_files_puts_back_the_caps_a_killed_agent_left() {
    let state = tempfile::tempdir().unwrap();
    let state_file = state.path().join("state.json");
    let records = records_path(&state_file, "caps");
    let (read, write) = ("7:3 1000\n", "");
    let mut f = v1_cap_fixture(read, write, Some(&records));
    let v1 = f.tmp.path().join("blkio");
    let root = Arc::new(CgroupRoot::from_dir(CgroupVersion::V1, &v1).unwrap().with_fs(Arc::new(FixtureKernel)));
    // The killed agent's cap, recorded beside its state file.
    f.writer.write_cap(&f.info, cap(Some(MIB), Some(MIB))).unwrap();
    f.writer = FileWriter::default();
    assert_eq!(f.throttle(), ("7:3 1000\n".into(), "7:3 1048576\n".into()));
    let cfg = AgentConfig { state_file, actuator: ActuatorMode::Files, ..Default::default() };
    let _agent = qos_agent::agent::AgentBuilder::new(cfg, root)
        .write_devices(false)
        .assemble_on_files(NoContainers)
        .expect("assembled");
    assert_eq!(f.throttle(), (read.into(), write.into()), "the killed agent's cap stayed");
    assert!(!records.exists(), "the record is gone");
}

/// An agent started in dry run after one that was SIGKILLed with a cap in force puts that cap back (the dead
/// agent's own write; putting it back is not steering: it used to be skipped in dry run), and drops its record;
/// while another agent holds the state file, the caps recorded beside it are that agent's, and are left alone.
#[test]
fn a_dry_run_agent_puts_back_the_caps_a_killed_agent_left() {
    let state = tempfile::tempdir().unwrap();
    let state_file = state.path().join("state.json");
    let records = records_path(&state_file, "caps");
    let (read, write) = ("7:3 1000\n", "");
    let mut f = v1_cap_fixture(read, write, Some(&records));
    let (sys, v1) = (f.tmp.path().join("sys"), f.tmp.path().join("blkio"));
    let root = CgroupRoot::from_dir(CgroupVersion::V1, &v1).unwrap().with_fs(Arc::new(FixtureKernel));
    let cfg = AgentConfig {
        dry_run: true,
        state_file: state_file.clone(),
        actuator: ActuatorMode::Files,
        ..Default::default()
    };
    // A dry run's file writer keeps no records of its own (`files::cap_records_file` is none).
    let dry_run_start = || {
        let writer = FileWriter::with_table(DeviceTable::with_sys(&sys, &v1));
        let devices = writer.devices();
        let backends = RuntimeBackends { discovery: (), counters: (), writer, devices, starting: Starting::default() };
        with_writer(&cfg, &root, backends, None).expect("assembled");
    };

    // Another agent runs on the state file: its cap is its own.
    let live = OriginalWeights::load(Some(&state_file)).unwrap();
    f.writer.write_cap(&f.info, cap(Some(MIB), Some(MIB))).unwrap();
    dry_run_start();
    assert_eq!(f.throttle(), ("7:3 1000\n".into(), "7:3 1048576\n".into()), "a live agent's cap was put back");
    assert!(records.is_file());

    // It is killed (its lock goes with it): the dry-run agent puts its cap back.
    drop(live);
    f.writer = FileWriter::default();
    dry_run_start();
    assert_eq!(f.throttle(), (read.into(), write.into()), "the dead agent's cap stayed");
    assert!(!records.exists(), "the record is gone");
}
