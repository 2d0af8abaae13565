//! The cgroup layer against the real kernel: needs root and a cgroup v1 `blkio` hierarchy (the test machine's
//! hybrid layout), with BFQ available. Each test makes its own loop device (BFQ, direct I/O) and blkio cgroup and
//! removes them on drop, also when it fails. Ignored by a plain `cargo test`; see `testbed::require` for what
//! happens without root.

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use qos_agent::backend::ContainerInfo;
use qos_agent::blockdev;
use qos_agent::cgroup::{CgroupRoot, CgroupVersion, CounterFileKind, CounterReader, WeightFile, WeightFileKind};
use qos_agent::files::{FileCounters, FileWriter, LeftoverCap, FULL_READ_EVERY};
use qos_core::{Cap, ContainerId, IoCounters, Weight};
use testbed::blkio::{kill_cgroup_procs, run_in_cgroup, CgroupGuard, BLKIO};
use testbed::loopdev::LoopDevice;
use testbed::process::ChildGuard;
use testbed::{require, Need};

const MIB: u64 = 1 << 20;

/// What the tests on cgroups alone need.
const CGROUPS: &[Need] = &[Need::Root, Need::BlkioV1];
/// What the tests that also do I/O on a BFQ loop device need.
const WITH_DISK: &[Need] = &[Need::Root, Need::BlkioV1, Need::LoopDevices, Need::Bfq];

#[test]
#[ignore = "needs root and cgroup v1 blkio: run ./scripts/test.sh"]
fn detect_finds_the_v1_blkio_hierarchy() {
    if !require("detect_finds_the_v1_blkio_hierarchy", CGROUPS) {
        return;
    }
    let _machine = testbed::exclusive();
    let root = CgroupRoot::detect().unwrap();
    assert_eq!(root.version(), CgroupVersion::V1);
    assert_eq!(root.path(), Path::new(BLKIO));
}

#[test]
#[ignore = "needs root, cgroup v1 blkio and a BFQ loop device: run ./scripts/test.sh"]
fn counters_see_direct_io_and_pread_regenerates() {
    if !require("counters_see_direct_io_and_pread_regenerates", WITH_DISK) {
        return;
    }
    let _machine = testbed::exclusive();
    let disk = LoopDevice::with_bfq(512);
    let cg = CgroupGuard::new("ddiskqos-test");
    let root = CgroupRoot::detect().unwrap();
    let dir = root.resolve_relative(&cg.rel).unwrap();

    let mut reader = CounterReader::open(&dir).unwrap();
    assert_eq!(reader.kind(), CounterFileKind::V1Bfq, "BFQ is loaded, so its counters must be chosen");
    assert_eq!(reader.read().unwrap(), IoCounters::default());
    assert_eq!(fs::read_to_string(reader.source_file()).unwrap(), "Total 0\n");

    let dev = disk.dev.display();
    run_in_cgroup(&cg.path, &format!("dd if={dev} of=/dev/null bs=1M count=64 iflag=direct status=none"));
    // The same open file, read again at offset 0, shows the new content.
    let after_read = reader.read().unwrap();
    assert!(after_read.read >= 64 * MIB, "{after_read:?}");
    assert!(after_read.write < MIB, "{after_read:?}");

    let raw = fs::read_to_string(reader.source_file()).unwrap();
    eprintln!("{} after 64 MiB read:\n{raw}", reader.source_file().display());
    let devnum = &disk.devnum;
    assert!(raw.contains(&format!("{devnum} Read {}\n", after_read.read)), "{raw}");
    assert!(raw.contains(&format!("{devnum} Sync ")) && raw.ends_with(&format!("Total {}\n", after_read.read)));
    let throttle = fs::read_to_string(cg.path.join("blkio.throttle.io_service_bytes_recursive")).unwrap();
    eprintln!("blkio.throttle.io_service_bytes_recursive (no throttle rule): {throttle:?}");

    run_in_cgroup(&cg.path, &format!("dd if=/dev/zero of={dev} bs=1M count=16 oflag=direct status=none"));
    let after_write = reader.read().unwrap();
    assert_eq!(after_write.read, after_read.read, "{after_write:?}");
    assert!(after_write.write >= 16 * MIB, "{after_write:?}");
    // A fresh open agrees with the long-lived reader, and repeated preads are stable.
    let mut fresh = CounterReader::open(&dir).unwrap();
    assert_eq!(fresh.read().unwrap(), after_write);
    assert_eq!(reader.read().unwrap(), after_write);

    // Counting is recursive: I/O of a child cgroup shows in the parent.
    let child = cg.child("child");
    run_in_cgroup(&child, &format!("dd if={dev} of=/dev/null bs=1M count=8 iflag=direct status=none"));
    assert!(reader.read().unwrap().read >= after_write.read + 8 * MIB);
}

#[test]
#[ignore = "needs root and cgroup v1 blkio: run ./scripts/test.sh"]
fn pid_resolution_finds_the_cgroup() {
    if !require("pid_resolution_finds_the_cgroup", CGROUPS) {
        return;
    }
    let _machine = testbed::exclusive();
    let cg = CgroupGuard::new("ddiskqos-test");
    let root = CgroupRoot::detect().unwrap();
    let procs = cg.path.join("cgroup.procs");
    let child = Command::new("sh")
        .arg("-c")
        .arg(format!("echo $$ > '{}' && exec sleep 30", procs.display()))
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let child = ChildGuard(child);
    let pid = child.0.id();
    let deadline = Instant::now() + Duration::from_secs(5);
    let dir = loop {
        let dir = root.resolve_pid(pid).unwrap();
        if dir.path() == cg.path || Instant::now() > deadline {
            break dir;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    assert_eq!(dir.path(), cg.path);
    assert_eq!(root.resolve_pid(std::process::id()).unwrap().path(), root.path().join(own_blkio_rel()));
    drop(child);
    // pid is reaped now (it could in principle be reused, but not within this test's lifetime in practice).
    assert!(root.resolve_pid(pid).unwrap_err().is_vanished());
}

/// This process's blkio cgroup relative to the root, from /proc/self/cgroup.
fn own_blkio_rel() -> String {
    let text = fs::read_to_string("/proc/self/cgroup").unwrap();
    let line = text.lines().find(|l| l.split(':').nth(1).is_some_and(|c| c.split(',').any(|c| c == "blkio"))).unwrap();
    line.splitn(3, ':').nth(2).unwrap().trim_start_matches('/').to_owned()
}

#[test]
#[ignore = "needs root, cgroup v1 blkio and a BFQ loop device: run ./scripts/test.sh"]
fn weights_are_written_and_read_back() {
    if !require("weights_are_written_and_read_back", WITH_DISK) {
        return;
    }
    let _machine = testbed::exclusive();
    // BFQ must be loaded for blkio.bfq.weight to exist: a loop device on BFQ guarantees that.
    let _disk = LoopDevice::with_bfq(64);
    let cg = CgroupGuard::new("ddiskqos-test");
    let root = CgroupRoot::detect().unwrap();
    let dir = root.resolve_relative(&cg.rel).unwrap();
    let wf = WeightFile::open(&dir).unwrap();
    assert_eq!(wf.kind(), WeightFileKind::V1Bfq);
    assert_eq!(fs::read_to_string(wf.path()).unwrap(), "100\n", "fresh cgroup: plain number format");
    assert_eq!(wf.read().unwrap(), Weight::KERNEL_DEFAULT);

    for v in [1000, 10, 1, 500] {
        let weight = Weight::new(v).unwrap();
        wf.write_verified(weight).unwrap();
        assert_eq!(wf.read().unwrap(), weight);
        assert_eq!(fs::read_to_string(wf.path()).unwrap(), format!("{v}\n"));
    }
    // What the kernel accepts here: a plain number only; the "default N" form is EINVAL on v1 blkio.bfq.weight,
    // which is why WeightFile writes plain numbers to v1 files.
    let err = fs::write(wf.path(), "default 300").unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EINVAL), "{err}");
    assert!(fs::write(wf.path(), "0").is_err() && fs::write(wf.path(), "1001").is_err());
    assert_eq!(wf.read().unwrap(), Weight::new(500).unwrap());
    // The per-device file shows the same default in the "default N" format.
    assert_eq!(fs::read_to_string(dir.path().join("blkio.bfq.weight_device")).unwrap(), "default 500\n");
}

/// cgroup v1 BFQ's per-device file on the kernel: an override in `blkio.bfq.weight_device` (what Docker's
/// `--blkio-weight-device` writes on v1) acts on its device whatever `blkio.bfq.weight` says. The writer reads the
/// weight in force there, writes a demotion that reads back in force on the device, notices an override set after
/// its write, and restores the override exactly; an override someone added after its first read (found through
/// the cgroup's BFQ counters, with no configured device) is removed at the restore. Also pins down the kernel's
/// format: a default line removes every override.
#[test]
#[ignore = "needs root, cgroup v1 blkio and a BFQ loop device: run ./scripts/test.sh"]
fn v1_weight_device_override_is_beaten_and_restored_exactly() {
    if !require("v1_weight_device_override_is_beaten_and_restored_exactly", WITH_DISK) {
        return;
    }
    let _machine = testbed::exclusive();
    let disk = LoopDevice::with_bfq(64);
    let cg = CgroupGuard::new("ddiskqos-wdev");
    let root = CgroupRoot::detect().unwrap();
    let dev = &disk.devnum;
    let per_device = cg.path.join("blkio.bfq.weight_device");
    let read = |name: &str| fs::read_to_string(cg.path.join(name)).unwrap();
    let w = |v: u64| Weight::new(v).unwrap();
    let info = ContainerInfo {
        id: ContainerId::new("wdev"),
        name: "wdev".into(),
        labels: BTreeMap::new(),
        cgroup: Some(root.resolve_relative(&cg.rel).unwrap()),
    };

    // The kernel's format: overrides as `MAJ:MIN N` after the default; a default line removes them all.
    fs::write(&per_device, format!("{dev} 250")).unwrap();
    assert_eq!(read("blkio.bfq.weight_device"), format!("default 100\n{dev} 250\n"));
    fs::write(&per_device, "default 40").unwrap();
    assert_eq!((read("blkio.bfq.weight_device"), read("blkio.bfq.weight")), ("default 40\n".into(), "40\n".into()));
    fs::write(cg.path.join("blkio.bfq.weight"), "100").unwrap();

    // No I/O yet: the loop device comes from `[devices] check`.
    fs::write(&per_device, format!("{dev} 300")).unwrap();
    let mut writer = FileWriter::new(root.path()).with_devices(vec![disk.name.clone()]);
    assert_eq!(writer.read_weight(&info).unwrap(), w(300), "the override is what acts on the device");
    writer.write_weight(&info, w(10)).unwrap();
    assert_eq!(read("blkio.bfq.weight_device"), format!("default 10\n{dev} 10\n"), "the demotion is in force");
    assert_eq!(read("blkio.bfq.weight"), "10\n");
    // An override set after the write: blkio.bfq.weight still reads 10, the device does not.
    fs::write(&per_device, format!("{dev} 300")).unwrap();
    let err = writer.verify_weight(&info, w(10)).unwrap_err().to_string();
    assert!(err.contains("blkio.bfq.weight_device") && err.contains(dev.as_str()) && err.contains("300"), "{err}");
    writer.write_weight(&info, w(10)).unwrap();
    writer.restore_weight(&info, w(300)).unwrap();
    assert_eq!(read("blkio.bfq.weight_device"), format!("default 100\n{dev} 300\n"), "put back exactly");

    // The device as the cgroup's counters list it; the first read finds no override.
    fs::write(&per_device, format!("{dev} default")).unwrap();
    run_in_cgroup(&cg.path, &format!("dd if={} of=/dev/null bs=64k count=16 iflag=direct status=none", disk.dev_str()));
    assert!(read("blkio.bfq.io_service_bytes_recursive").contains(&format!("{dev} Read ")));
    let mut writer = FileWriter::new(root.path());
    assert_eq!(writer.read_weight(&info).unwrap(), w(100));
    fs::write(&per_device, format!("{dev} 500")).unwrap();
    writer.write_weight(&info, w(10)).unwrap();
    assert_eq!(read("blkio.bfq.weight_device"), format!("default 10\n{dev} 10\n"));
    writer.restore_weight(&info, w(100)).unwrap();
    assert_eq!(read("blkio.bfq.weight_device"), "default 100\n", "the override the agent wrote is gone");
    assert_eq!(read("blkio.bfq.weight"), "100\n");
}

/// The throughput cap on the kernel's v1 throttle files (`blkio.throttle.{read,write}_bps_device`) of a cgroup on a
/// BFQ loop device: the cap read back as the kernel prints it and enforced on direct reads, the files empty again
/// after the lift; a limit set before the cap survives it (the lower one kept, the higher one put back); a cap left
/// by a "crashed" writer is put back from its records file.
#[test]
#[ignore = "needs root, cgroup v1 blkio and a BFQ loop device: run ./scripts/test.sh"]
fn v1_throttle_cap_is_written_enforced_and_lifted_exactly() {
    if !require("v1_throttle_cap_is_written_enforced_and_lifted_exactly", WITH_DISK) {
        return;
    }
    let _machine = testbed::exclusive();
    let disk = LoopDevice::with_bfq(64);
    let dev = disk.devnum.clone();
    let cg = CgroupGuard::new("ddiskqos-cap");
    let root = CgroupRoot::detect().unwrap();
    let (read_file, write_file) = ("blkio.throttle.read_bps_device", "blkio.throttle.write_bps_device");
    let files = || {
        (fs::read_to_string(cg.path.join(read_file)).unwrap(), fs::read_to_string(cg.path.join(write_file)).unwrap())
    };
    let info = ContainerInfo {
        id: ContainerId::new("cap"),
        name: "cap".into(),
        labels: BTreeMap::new(),
        cgroup: Some(root.resolve_relative(&cg.rel).unwrap()),
    };
    let cap = |r: u64, w: Option<u64>| Some(Cap { read_bps: Some(r), write_bps: w });
    let state = tempfile::tempdir().unwrap();
    let records = qos_agent::files::restore_records::records_path(&state.path().join("state.json"), "caps");
    let new_writer =
        || FileWriter::new(root.path()).with_devices(vec![disk.name.clone()]).with_cap_records_file(records.clone());
    let mut writer = new_writer();
    assert_eq!(files(), (String::new(), String::new()), "a new cgroup has no limit");

    let done = writer.write_cap(&info, cap(8 * MIB, Some(2 * MIB))).unwrap();
    eprintln!("after the cap: {read_file} {:?}, {write_file} {:?}", files().0, files().1);
    assert_eq!(files(), (format!("{dev} 8388608\n"), format!("{dev} 2097152\n")), "the kernel's own lines");
    assert_eq!(done.len(), 1);
    assert_eq!(
        (done[0].dev.to_string(), done[0].read_bps, done[0].write_bps),
        (dev.clone(), Some(8 * MIB), Some(2 * MIB))
    );
    // Enforced: 24 MiB of direct reads at 8 MiB/s take well over a second (about 3 s less the first slice).
    let t = Instant::now();
    run_in_cgroup(&cg.path, &format!("dd if={} of=/dev/null bs=1M count=24 iflag=direct status=none", disk.dev_str()));
    let took = t.elapsed();
    eprintln!("24 MiB under an 8 MiB/s read cap: {took:?}");
    assert!(took >= Duration::from_millis(1500), "the cap did not hold the reads: {took:?}");
    writer.write_cap(&info, None).unwrap();
    eprintln!("after the lift: {read_file} {:?}, {write_file} {:?}", files().0, files().1);
    assert_eq!(files(), (String::new(), String::new()), "no limit again");
    assert!(!records.exists(), "the record is dropped with the lift");

    // Limits of the container's own: read 1 MiB/s (under the cap), write 64 MiB/s (over it).
    fs::write(cg.path.join(read_file), format!("{dev} 1048576")).unwrap();
    fs::write(cg.path.join(write_file), format!("{dev} 67108864")).unwrap();
    let before = files();
    assert_eq!(before, (format!("{dev} 1048576\n"), format!("{dev} 67108864\n")));
    writer.write_cap(&info, cap(8 * MIB, Some(8 * MIB))).unwrap();
    eprintln!("capped over limits of its own: {read_file} {:?}, {write_file} {:?}", files().0, files().1);
    assert_eq!(files(), (format!("{dev} 1048576\n"), format!("{dev} 8388608\n")), "the lower read limit kept");
    writer.write_cap(&info, None).unwrap();
    assert_eq!(files(), before, "both put back exactly");

    // A crash with the cap in force: the next writer puts the limits back from the records file.
    writer.write_cap(&info, cap(4 * MIB, None)).unwrap();
    assert_eq!(files(), (format!("{dev} 1048576\n"), format!("{dev} 67108864\n")), "4 MiB/s is above 1 MiB/s");
    writer.write_cap(&info, cap(MIB / 2, Some(MIB))).unwrap();
    assert_eq!(files(), (format!("{dev} 524288\n"), format!("{dev} 1048576\n")));
    drop(writer);
    let mut writer = new_writer();
    let done = writer.restore_leftover_caps(&root);
    assert!(matches!(done.as_slice(), [LeftoverCap::Restored { .. }]), "{done:?}");
    assert_eq!(files(), before, "put back after the crash");
    assert!(!records.exists());
}

/// The parent gate of `FileCounters` on the kernel's own aggregation: with one child reading all the time
/// and the others idle, a round reads only the busy child (besides the periodic full read), and an idle child's
/// I/O is seen in the very next round, with its exact bytes.
#[test]
#[ignore = "needs root, cgroup v1 blkio and a BFQ loop device: run ./scripts/test.sh"]
fn parent_gate_reads_busy_children_and_finds_idle_ones_that_wake() {
    if !require("parent_gate_reads_busy_children_and_finds_idle_ones_that_wake", WITH_DISK) {
        return;
    }
    let _machine = testbed::exclusive();
    const N: usize = 16;
    let disk = LoopDevice::with_bfq(256);
    let dev = disk.dev.display().to_string();
    let cg = CgroupGuard::new("ddiskqos-gate");
    let root = Arc::new(CgroupRoot::detect().unwrap());
    let mut counters = FileCounters::with_root(root.clone());
    for i in 0..N {
        let child = cg.child(&format!("c{i}"));
        run_in_cgroup(&child, &format!("dd if={dev} of=/dev/null bs=4k count=1 skip={i} iflag=direct status=none"));
        let info = ContainerInfo {
            id: ContainerId::new(format!("c{i}")),
            name: format!("c{i}"),
            labels: BTreeMap::new(),
            cgroup: Some(root.resolve_relative(&format!("{}/c{i}", cg.rel)).unwrap()),
        };
        counters.attach_now(&info).unwrap();
    }
    let mut round = || {
        let mut out = Vec::new();
        counters.sample_now(&mut out);
        let mut read: BTreeMap<String, IoCounters> =
            out.into_iter().map(|(id, r)| (id.to_string(), r.expect("counters"))).collect();
        std::thread::sleep(Duration::from_millis(30));
        (read.len(), read.remove("c0"), read)
    };
    assert_eq!(round().0, N, "baseline: every child read");
    let busy = cg.path.join("c0");
    // One long-lived reader (a whole-device pass per process), so the busy child rarely pauses between processes.
    let busy_reader = ChildGuard(
        Command::new("sh")
            .arg("-c")
            .arg(format!(
                "echo $$ > '{}/cgroup.procs' && while :; do dd if={dev} of=/dev/null bs=64k iflag=direct status=none; \
                 done",
                busy.display()
            ))
            .spawn()
            .unwrap(),
    );
    // Long enough for every other child to count as idle (unchanged for ACTIVE_ROUNDS reads).
    for _ in 0..2 * FULL_READ_EVERY {
        round();
    }
    let rounds = 3 * FULL_READ_EVERY as usize;
    let (mut busy_read, mut idle_read) = (0, 0);
    for _ in 0..rounds {
        let (_, c0, idle) = round();
        busy_read += usize::from(c0.is_some());
        idle_read += usize::from(!idle.is_empty());
    }
    eprintln!("of {rounds} rounds, {busy_read} read the busy child and {idle_read} read idle ones");
    // Exactly: nothing but the periodic full reads reads a child that did no I/O.
    assert!(idle_read <= rounds / FULL_READ_EVERY as usize, "idle children read outside full reads: {idle_read}");
    // A round whose parent did not move skips the busy child too (a pause between its reads, a descheduled dd on
    // a loaded host); most rounds see it move.
    assert!(busy_read >= rounds / 2, "the busy child was read in {busy_read} of {rounds} rounds");

    // Idle children wake while the busy one reads: each is found with every byte, within the documented bound
    // (FULL_READ_EVERY rounds). Usually the next round, through the parent's unexplained bytes; the busy child's
    // reads between the parent's read and its own can mask them until the next full read.
    let wake = |i: usize, round: &mut dyn FnMut() -> (usize, Option<IoCounters>, BTreeMap<String, IoCounters>)| {
        let name = format!("c{i}");
        let before = counters_of(&cg.path.join(&name));
        run_in_cgroup(
            &cg.path.join(&name),
            &format!("dd if={dev} of=/dev/null bs=1M count=1 skip=8 iflag=direct status=none"),
        );
        for n in 1..=FULL_READ_EVERY {
            let (_, _, idle) = round();
            if let Some(got) = idle.get(&name) {
                assert_eq!(got.read, before + MIB, "{name}: every byte, read once");
                return n;
            }
        }
        panic!("{name} did 1 MiB and was not read within {FULL_READ_EVERY} rounds");
    };
    let found: Vec<u32> = [5, 6, 7].into_iter().map(|i| wake(i, &mut round)).collect();
    eprintln!("woken children found after {found:?} rounds while the busy one read");

    // Once the busy child stops and a full read has re-taken the parent's offset, nothing can mask a waking child:
    // the next round finds it. (Until that full read, bytes the busy child did between a full round's children and
    // its second parent read stay in the offset and can mask as many bytes of a waking child: the documented bound.
    // On a loaded host that window once held over 1 MiB, and c8 was found at the next full read, 3 rounds on.)
    drop(busy_reader);
    kill_cgroup_procs(&busy);
    for _ in 0..FULL_READ_EVERY {
        round();
    }
    assert_eq!(wake(8, &mut round), 1, "a lone waking child is found in the next round");
}

fn counters_of(dir: &Path) -> u64 {
    let text = fs::read_to_string(dir.join("blkio.bfq.io_service_bytes_recursive")).unwrap();
    text.lines().filter(|l| l.contains(" Read ")).map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap()).sum()
}

#[test]
#[ignore = "needs root, cgroup v1 blkio and a BFQ loop device: run ./scripts/test.sh"]
fn removed_cgroup_is_vanished() {
    if !require("removed_cgroup_is_vanished", WITH_DISK) {
        return;
    }
    let _machine = testbed::exclusive();
    let _disk = LoopDevice::with_bfq(64);
    let cg = CgroupGuard::new("ddiskqos-test");
    let root = CgroupRoot::detect().unwrap();
    let dir = root.resolve_relative(&cg.rel).unwrap();
    let mut reader = CounterReader::open(&dir).unwrap();
    let wf = WeightFile::open(&dir).unwrap();
    reader.read().unwrap();
    wf.read().unwrap();
    fs::remove_dir(&cg.path).unwrap();
    // The open counter file now fails with ENODEV; the weight file no longer opens (ENOENT, directory gone).
    let err = reader.read().unwrap_err();
    assert!(err.is_vanished(), "{err}");
    assert!(err.to_string().contains("No such device"), "{err}");
    let err = wf.write_verified(Weight::MAX).unwrap_err();
    assert!(err.is_vanished(), "{err}");
    assert!(root.resolve_relative(&cg.rel).unwrap_err().is_vanished());
    assert!(!cg.path.exists(), "nothing recreated the cgroup");
}

#[test]
#[ignore = "needs root, cgroup v1 blkio and a BFQ loop device: run ./scripts/test.sh"]
fn device_scheduler_and_refusals() {
    if !require("device_scheduler_and_refusals", WITH_DISK) {
        return;
    }
    let _machine = testbed::exclusive();
    let disk = LoopDevice::with_bfq(64);
    assert_eq!(blockdev::scheduler(&disk.name).unwrap().active, "bfq");
    assert_eq!(blockdev::disk_of_dev(disk.devnum.parse().unwrap()).unwrap(), disk.name);
    // Already BFQ and allowed: a no-op success. Not allowed: refused, naming the device.
    blockdev::switch_to_bfq(&disk.name, std::slice::from_ref(&disk.name)).unwrap();
    let err = blockdev::switch_to_bfq(&disk.name, &[]).unwrap_err();
    assert!(err.to_string().contains(&disk.name), "{err}");

    // Back to none, then an allowed switch really switches.
    fs::write(Path::new("/sys/block").join(&disk.name).join("queue/scheduler"), "none").unwrap();
    assert_eq!(blockdev::scheduler(&disk.name).unwrap().active, "none");
    blockdev::switch_to_bfq(&disk.name, std::slice::from_ref(&disk.name)).unwrap();
    assert_eq!(blockdev::scheduler(&disk.name).unwrap().active, "bfq");

    // The disk backing / is refused even when explicitly allowed, and left as it was.
    let root_disk = root_disk_name();
    let before = blockdev::scheduler(&root_disk).unwrap().active;
    let err = blockdev::switch_to_bfq(&root_disk, std::slice::from_ref(&root_disk)).unwrap_err();
    assert!(err.to_string().contains(&format!("device {root_disk}: backs the root filesystem")), "{err}");
    assert_eq!(blockdev::scheduler(&root_disk).unwrap().active, before);
}

/// The disk under `/`, found independently of the library: `stat -c %d` style via /proc/self/mountinfo is what
/// the library does, so use the `st_dev` of `/` here instead.
fn root_disk_name() -> String {
    use std::os::unix::fs::MetadataExt;
    let dev = fs::metadata("/").unwrap().dev();
    let (major, minor) =
        (((dev >> 32) & 0xffff_f000) | ((dev >> 8) & 0xfff), (dev & 0xff) | ((dev >> 12) & 0xffff_ff00));
    let link = fs::read_link(format!("/sys/dev/block/{major}:{minor}")).unwrap();
    let part = Path::new(&format!("/sys/dev/block/{major}:{minor}")).join("partition").exists();
    let disk = if part { link.parent().unwrap().to_path_buf() } else { link };
    disk.file_name().unwrap().to_str().unwrap().to_owned()
}

#[test]
#[ignore = "needs root, cgroup v1 blkio and a loop device: run ./scripts/test.sh"]
fn iocost_apply_is_refused_on_a_v1_host_before_measuring() {
    if !require("iocost_apply_is_refused_on_a_v1_host_before_measuring", WITH_DISK) {
        return;
    }
    let _machine = testbed::exclusive();
    let disk = LoopDevice::with_bfq(64);
    let started = Instant::now();
    let out = Command::new(crate::AGENT).arg("iocost").arg(&disk.dev).arg("--apply").output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "iocost --apply succeeded on a v1 host");
    assert!(stderr.contains("io.cost needs the io controller on cgroup v2; this host has it on v1"), "{stderr}");
    assert!(stderr.contains(BLKIO), "names the v1 hierarchy: {stderr}");
    assert!(started.elapsed() < Duration::from_secs(2), "refused only after {:?}", started.elapsed());
    // Nothing on v2 changed: the io controller is on v1, so the v2 root has no io.cost files at all.
    assert!(!Path::new("/sys/fs/cgroup/unified/io.cost.qos").exists());
}
