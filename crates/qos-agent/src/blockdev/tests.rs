//! Tests of the block-device layer on a fake /sys.

use super::switch::{set_bfq_tunable_in, switch_scheduler_in};
use super::*;
use std::os::unix::fs::symlink;

/// A fake /sys: vda (254:0) with partition vda2 (254:2), loop3 (7:3), dm-0 (253:0) over vda2.
fn fake_sys() -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    let sys = tmp.path();
    for (name, sched) in
        [("vda", "[mq-deadline] kyber bfq none\n"), ("loop3", "[none] mq-deadline kyber bfq\n"), ("dm-0", "none\n")]
    {
        fs::create_dir_all(sys.join("devices/block").join(name).join("queue")).unwrap();
        fs::write(sys.join("devices/block").join(name).join("queue/scheduler"), sched).unwrap();
    }
    fs::create_dir_all(sys.join("devices/block/vda/vda2")).unwrap();
    fs::write(sys.join("devices/block/vda/vda2/partition"), "2\n").unwrap();
    fs::create_dir_all(sys.join("devices/block/dm-0/slaves")).unwrap();
    symlink("../../vda/vda2", sys.join("devices/block/dm-0/slaves/vda2")).unwrap();
    for dir in ["block", "dev/block", "class/block"] {
        fs::create_dir_all(sys.join(dir)).unwrap();
    }
    for (name, target, num) in
        [("vda", "vda", "254:0"), ("vda2", "vda/vda2", "254:2"), ("loop3", "loop3", "7:3"), ("dm-0", "dm-0", "253:0")]
    {
        if !target.contains('/') {
            symlink(format!("../devices/block/{target}"), sys.join("block").join(name)).unwrap();
        }
        symlink(format!("../../devices/block/{target}"), sys.join("dev/block").join(num)).unwrap();
        symlink(format!("../../devices/block/{target}"), sys.join("class/block").join(name)).unwrap();
    }
    tmp
}

const ROOT_ON_VDA: &str = "27 1 254:0 / / rw,relatime - ext4 /dev/vda rw\n";
const ROOT_ON_VDA2: &str = "27 1 254:2 / / rw,relatime - ext4 /dev/vda2 rw\n";
const ROOT_ON_DM: &str = "27 1 253:0 / / rw,relatime - ext4 /dev/mapper/root rw\n";
const ROOT_ON_BTRFS: &str = "27 1 0:31 / / rw,relatime - btrfs /dev/vda2 rw\n";
const ROOT_ON_OVERLAY: &str = "27 1 0:31 / / rw,relatime - overlay overlay rw\n";

fn allowed(names: &[&str]) -> Vec<String> {
    names.iter().map(|s| s.to_string()).collect()
}

#[test]
fn schedulers() {
    let sys = fake_sys();
    assert_eq!(scheduler_in(sys.path(), "vda").unwrap().active, "mq-deadline");
    assert_eq!(scheduler_in(sys.path(), "loop3").unwrap().active, "none");
    assert_eq!(scheduler_in(sys.path(), "dm-0").unwrap().active, "none");
    assert!(matches!(scheduler_in(sys.path(), "sdz").unwrap_err(), DeviceError::Io { .. }));
    assert!(matches!(scheduler_in(sys.path(), "../vda").unwrap_err(), DeviceError::InvalidName { .. }));
    assert_eq!(parse_scheduler(b"mq-deadline bfq\n"), None);
    assert_eq!(
        parse_scheduler(b"none [mq-deadline] kyber bfq\n").unwrap().available,
        ["none", "mq-deadline", "kyber", "bfq"]
    );
    assert_eq!(parse_scheduler(b"\xff"), None);
}

#[test]
fn names_of_device_numbers() {
    let sys = fake_sys();
    assert_eq!(disk_of_dev_in(sys.path(), "254:0".parse().unwrap()).unwrap().as_deref(), Some("vda"));
    assert_eq!(disk_of_dev_in(sys.path(), "254:2".parse().unwrap()).unwrap().as_deref(), Some("vda"));
    assert_eq!(disk_of_dev_in(sys.path(), "7:3".parse().unwrap()).unwrap().as_deref(), Some("loop3"));
    assert_eq!(disk_of_dev_in(sys.path(), "8:0".parse().unwrap()).unwrap(), None);
    assert!("8".parse::<DevNum>().is_err());
    assert!("8:-1".parse::<DevNum>().is_err());
    assert!("+8:1".parse::<DevNum>().is_err());
    assert_eq!("8:16".parse::<DevNum>().unwrap(), DevNum { major: 8, minor: 16 });
}

#[test]
fn switch_only_named_non_root_devices() {
    let sys = fake_sys();
    let err = switch_scheduler_in(sys.path(), ROOT_ON_VDA, "loop3", "bfq", &allowed(&["loop4"])).unwrap_err();
    assert!(matches!(err, DeviceError::Refused { ref device, .. } if device == "loop3"), "{err}");
    assert_eq!(scheduler_in(sys.path(), "loop3").unwrap().active, "none", "refused switch must not write");

    for mountinfo in [ROOT_ON_VDA, ROOT_ON_VDA2, ROOT_ON_DM, ROOT_ON_BTRFS] {
        let err = switch_scheduler_in(sys.path(), mountinfo, "vda", "bfq", &allowed(&["vda"])).unwrap_err();
        assert!(err.to_string().contains("device vda: backs the root filesystem"), "{mountinfo}: {err}");
    }
    let err = switch_scheduler_in(sys.path(), ROOT_ON_DM, "dm-0", "bfq", &allowed(&["dm-0"])).unwrap_err();
    assert!(err.to_string().contains("backs the root"), "{err}");
    let err = switch_scheduler_in(sys.path(), ROOT_ON_OVERLAY, "loop3", "bfq", &allowed(&["loop3"])).unwrap_err();
    assert!(err.to_string().contains("cannot tell which block device backs /"), "{err}");
    assert_eq!(
        fs::read_to_string(sys.path().join("block/vda/queue/scheduler")).unwrap(),
        "[mq-deadline] kyber bfq none\n"
    );

    // An allowed device is written; a regular file does not turn "bfq" into a bracketed list, so the
    // read-back check fails, which is the point.
    let err = switch_scheduler_in(sys.path(), ROOT_ON_VDA, "loop3", "bfq", &allowed(&["loop3"])).unwrap_err();
    assert!(matches!(err, DeviceError::Parse { .. }), "{err}");
    assert_eq!(fs::read_to_string(sys.path().join("block/loop3/queue/scheduler")).unwrap(), "bfq");
    fs::write(sys.path().join("block/loop3/queue/scheduler"), "none [bfq]\n").unwrap();
    switch_scheduler_in(sys.path(), ROOT_ON_VDA, "loop3", "bfq", &allowed(&["loop3"])).unwrap();
}

#[test]
fn io_cost_lines() {
    let text = b"8:16 enable=1 ctrl=auto rpct=0.00 rlat=250000\n8:0 enable=0 ctrl=auto\n";
    assert!(io_cost_enabled_in(text, DevNum { major: 8, minor: 16 }));
    assert!(!io_cost_enabled_in(text, DevNum { major: 8, minor: 0 }));
    assert!(!io_cost_enabled_in(text, DevNum { major: 8, minor: 1 }));
    let tmp = tempfile::tempdir().unwrap();
    assert!(!io_cost_enabled(tmp.path(), DevNum { major: 8, minor: 16 }).unwrap());
    fs::write(tmp.path().join("io.cost.qos"), text).unwrap();
    assert!(io_cost_enabled(tmp.path(), DevNum { major: 8, minor: 16 }).unwrap());
}

#[test]
fn tunables_are_guarded_and_read_back() {
    let sys = fake_sys();
    let iosched = sys.path().join("devices/block/loop3/queue/iosched");
    fs::create_dir_all(&iosched).unwrap();
    fs::write(iosched.join("low_latency"), "1\n").unwrap();
    let err = set_bfq_tunable_in(sys.path(), ROOT_ON_VDA, "loop3", "low_latency", "0", &allowed(&[])).unwrap_err();
    assert!(matches!(err, DeviceError::Refused { .. }), "{err}");
    let err = set_bfq_tunable_in(sys.path(), ROOT_ON_VDA, "loop3", "../x", "0", &allowed(&["loop3"])).unwrap_err();
    assert!(matches!(err, DeviceError::InvalidName { .. }), "{err}");
    assert_eq!(fs::read_to_string(iosched.join("low_latency")).unwrap(), "1\n");
    let old = set_bfq_tunable_in(sys.path(), ROOT_ON_VDA, "loop3", "low_latency", "0", &allowed(&["loop3"])).unwrap();
    assert_eq!(old, "1");
    assert_eq!(fs::read_to_string(iosched.join("low_latency")).unwrap(), "0");
    let err = set_bfq_tunable_in(sys.path(), ROOT_ON_VDA, "vda", "low_latency", "0", &allowed(&["vda"])).unwrap_err();
    assert!(err.to_string().contains("backs the root filesystem"), "{err}");
}

#[test]
fn device_table_governors_and_cache() {
    use std::time::{Duration, Instant};
    let sys = fake_sys();
    let cg = tempfile::tempdir().unwrap();
    fs::write(sys.path().join("devices/block/loop3/dev"), "7:3\n").unwrap();
    let loop3 = DevNum { major: 7, minor: 3 };
    let mut table = DeviceTable::with_sys(sys.path(), cg.path()).with_max_age(Duration::from_secs(5));
    assert_eq!(table.dev_of_name("loop3").unwrap(), loop3);
    assert!(matches!(table.dev_of_name("sdz").unwrap_err(), DeviceError::Io { .. }));
    assert!(matches!(table.dev_of_name("../x").unwrap_err(), DeviceError::InvalidName { .. }));

    // No io.cost.qos (v1 host), scheduler none: nothing acts; first sight reports "new" (Some(None)).
    let t0 = Instant::now();
    let (facts, changed) = table.get(loop3, t0);
    assert_eq!((facts.governor, changed), (Governor::NONE, Some(None)));
    assert_eq!(facts.disk.as_deref(), Some("loop3"));
    assert!(facts.fix().contains("/sys/block/loop3/queue/scheduler") && facts.fix().contains("7:3 enable=1"));

    // io.cost switched on: not seen while the facts are fresh, seen once they are stale or refreshed.
    fs::write(cg.path().join("io.cost.qos"), "7:3 enable=1 ctrl=auto\n254:0 enable=0\n").unwrap();
    let (facts, changed) = table.get(loop3, t0 + Duration::from_secs(4));
    assert_eq!((facts.governor, changed), (Governor::NONE, None));
    let (facts, changed) = table.get(loop3, t0 + Duration::from_secs(5));
    assert_eq!((facts.governor.as_str(), changed), ("io-cost", Some(Some(Governor::NONE))));

    // BFQ too: both act. A refresh reads at once; an unchanged refresh reports no change.
    fs::write(sys.path().join("block/loop3/queue/scheduler"), "none [bfq]\n").unwrap();
    let (facts, changed) = table.refresh(loop3, t0 + Duration::from_secs(6));
    assert_eq!(facts.governor, Governor { bfq: true, io_cost: true });
    assert_eq!(facts.governor.as_str(), "bfq+io-cost");
    assert!(changed.is_some());
    assert_eq!(table.refresh(loop3, t0 + Duration::from_secs(6)).1, None);

    // A device sysfs does not know: ineffective, with the reason.
    let (facts, _) = table.get(DevNum { major: 8, minor: 0 }, t0);
    assert_eq!(facts.governor, Governor::NONE);
    assert!(facts.error.as_deref().unwrap_or("").contains("no block device 8:0"), "{facts:?}");
    assert_eq!(table.snapshot().iter().map(|f| f.dev.to_string()).collect::<Vec<_>>(), ["7:3", "8:0"]);
}

/// loop3 on BFQ with the tunables of this kernel's defaults; vda (the root disk) on BFQ too.
fn fake_sys_bfq() -> tempfile::TempDir {
    let sys = fake_sys();
    for dev in ["loop3", "vda"] {
        let queue = sys.path().join("devices/block").join(dev).join("queue");
        fs::write(queue.join("scheduler"), "mq-deadline kyber [bfq] none\n").unwrap();
        fs::create_dir_all(queue.join("iosched")).unwrap();
        for (key, value) in [("max_budget", "0"), ("timeout_sync", "124"), ("slice_idle", "8"), ("low_latency", "1")] {
            fs::write(queue.join("iosched").join(key), format!("{value}\n")).unwrap();
        }
    }
    sys
}

fn tunable_map(entries: &[(&str, &str, tune::TunableValue)]) -> tune::TunableMap {
    let mut map = tune::TunableMap::new();
    for (dev, key, value) in entries {
        map.entry(dev.to_string()).or_default().insert(key.to_string(), value.clone());
    }
    map
}

fn iosched_value(sys: &Path, dev: &str, key: &str) -> String {
    fs::read_to_string(sys.join("devices/block").join(dev).join("queue/iosched").join(key)).unwrap().trim().into()
}

#[test]
fn bfq_tunables_set_logged_and_restored() {
    use tune::TunableValue::{Int, Text};
    let sys = fake_sys_bfq();
    let state = tempfile::tempdir().unwrap();
    let file = tune::originals_path(&state.path().join("state.json"));
    assert_eq!(file, state.path().join("state.json.bfq-tunables.json"));
    let map = tunable_map(&[("loop3", "max_budget", Int(256)), ("loop3", "timeout_sync", Text("8".into()))]);
    let mut tuned = tune::TunedDevices::apply_in(sys.path(), ROOT_ON_VDA, &map, Some(&file)).unwrap();
    assert_eq!(iosched_value(sys.path(), "loop3", "max_budget"), "256");
    assert_eq!(iosched_value(sys.path(), "loop3", "timeout_sync"), "8");
    let originals: Vec<(&str, &str)> = tuned.tuned().iter().map(|t| (t.key.as_str(), t.original.as_str())).collect();
    assert_eq!(originals, [("max_budget", "0"), ("timeout_sync", "124")]);
    let on_disk: serde_json::Value = serde_json::from_str(&fs::read_to_string(&file).unwrap()).unwrap();
    assert_eq!(on_disk["loop3"]["timeout_sync"], "124", "{on_disk}");
    assert_eq!(tuned.restore(), 0);
    assert_eq!(iosched_value(sys.path(), "loop3", "max_budget"), "0");
    assert_eq!(iosched_value(sys.path(), "loop3", "timeout_sync"), "124");
    assert!(!file.exists(), "the originals file goes once everything is back");
    assert_eq!(iosched_value(sys.path(), "vda", "max_budget"), "0", "no other device touched");

    // Dropping restores too (an error path of the agent after start-up).
    let tuned = tune::TunedDevices::apply_in(sys.path(), ROOT_ON_VDA, &map, Some(&file)).unwrap();
    assert_eq!(iosched_value(sys.path(), "loop3", "max_budget"), "256");
    drop(tuned);
    assert_eq!(iosched_value(sys.path(), "loop3", "max_budget"), "0");

    // Dry run: nothing written, nothing to restore.
    let mut tuned = tune::TunedDevices::apply_in(sys.path(), ROOT_ON_VDA, &map, None).unwrap();
    assert_eq!(iosched_value(sys.path(), "loop3", "max_budget"), "0");
    assert!(tuned.tuned().is_empty());
    assert_eq!(tuned.restore(), 0);
    assert!(!file.exists());
}

#[test]
fn bfq_tunables_after_a_kill_restore_the_first_originals() {
    use tune::TunableValue::Int;
    let sys = fake_sys_bfq();
    let state = tempfile::tempdir().unwrap();
    let file = tune::originals_path(&state.path().join("state.json"));
    let map = tunable_map(&[("loop3", "timeout_sync", Int(8))]);
    let tuned = tune::TunedDevices::apply_in(sys.path(), ROOT_ON_VDA, &map, Some(&file)).unwrap();
    std::mem::forget(tuned); // SIGKILL: no restore, the originals file stays
    assert_eq!(iosched_value(sys.path(), "loop3", "timeout_sync"), "8");
    assert!(file.exists());
    let mut again = tune::TunedDevices::apply_in(sys.path(), ROOT_ON_VDA, &map, Some(&file)).unwrap();
    assert_eq!(again.tuned()[0].original, "124", "the killed agent's 8 is not the original");
    assert_eq!(again.restore(), 0);
    assert_eq!(iosched_value(sys.path(), "loop3", "timeout_sync"), "124");
    assert!(!file.exists());
}

#[test]
fn bad_bfq_tunables_name_the_key_and_value_and_write_nothing() {
    use tune::TunableValue::{Int, Text};
    let sys = fake_sys_bfq();
    let state = tempfile::tempdir().unwrap();
    let file = tune::originals_path(&state.path().join("state.json"));
    let cases: Vec<(tune::TunableMap, &str, &str)> = vec![
        (
            tunable_map(&[("loop3", "back_seek_max", Int(1))]),
            "devices.bfq_tunables.loop3.back_seek_max = 1",
            "not a BFQ tunable",
        ),
        (
            tunable_map(&[("loop3", "timeout_sync", Text("8ms".into()))]),
            "devices.bfq_tunables.loop3.timeout_sync = 8ms",
            "whole number",
        ),
        (
            tunable_map(&[("loop3", "timeout_sync", Int(-1))]),
            "devices.bfq_tunables.loop3.timeout_sync = -1",
            "negative",
        ),
        (
            tunable_map(&[("loop3", "timeout_sync", Int(0))]),
            "devices.bfq_tunables.loop3.timeout_sync = 0",
            "must be 1..=1000",
        ),
        (tunable_map(&[("loop3", "low_latency", Int(2))]), "devices.bfq_tunables.loop3.low_latency = 2", "0..=1"),
        (
            tunable_map(&[("vda", "timeout_sync", Int(8))]),
            "devices.bfq_tunables.vda.timeout_sync = 8",
            "backs the root filesystem",
        ),
        (
            tunable_map(&[("../vda", "timeout_sync", Int(8))]),
            "devices.bfq_tunables.../vda.timeout_sync = 8",
            "invalid device name",
        ),
    ];
    for (map, key_value, reason) in cases {
        let err = tune::TunedDevices::apply_in(sys.path(), ROOT_ON_VDA, &map, Some(&file)).unwrap_err().to_string();
        assert!(err.starts_with(key_value) && err.contains(reason), "{err}");
    }
    // A device whose scheduler is not bfq is refused, naming the fix.
    fs::write(sys.path().join("devices/block/loop3/queue/scheduler"), "[none] bfq\n").unwrap();
    let map = tunable_map(&[("loop3", "timeout_sync", Int(8))]);
    let err = tune::TunedDevices::apply_in(sys.path(), ROOT_ON_VDA, &map, Some(&file)).unwrap_err().to_string();
    assert!(err.contains("not bfq: add it to devices.switch_to_bfq"), "{err}");
    for dev in ["loop3", "vda"] {
        assert_eq!(iosched_value(sys.path(), dev, "timeout_sync"), "124");
        assert_eq!(iosched_value(sys.path(), dev, "max_budget"), "0");
    }
}

#[test]
fn device_number_errors_keep_their_words() {
    let e: DeviceError = "8".parse::<DevNum>().unwrap_err().into();
    assert!(matches!(e, DeviceError::InvalidName { what: "device number", .. }), "{e:?}");
    assert_eq!(e.to_string(), "invalid device number \"8\": expected MAJ:MIN");
    let e = disk_of_path(Path::new("/nonexistent/x")).unwrap_err();
    assert!(matches!(e, DeviceError::Io { op: "stat", .. }), "{e:?}");
    let dir = tempfile::tempdir().unwrap();
    let e: DeviceError = DevNum::of_node(dir.path()).unwrap_err().into();
    assert!(matches!(e, DeviceError::Refused { ref reason, .. } if reason == "not a block device"), "{e:?}");
}
