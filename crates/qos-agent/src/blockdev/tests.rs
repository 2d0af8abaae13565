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
    assert!(matches!(scheduler_in(sys.path(), "../vda").unwrap_err(), DeviceError::InvalidName(_)));
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
    assert!(matches!(err, DeviceError::InvalidName(_)), "{err}");
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
    assert!(matches!(table.dev_of_name("../x").unwrap_err(), DeviceError::InvalidName(_)));

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
fn after_a_kill_an_original_no_longer_configured_stays_in_the_file_for_devices_restore() {
    use tune::TunableValue::Int;
    let sys = fake_sys_bfq();
    let state = tempfile::tempdir().unwrap();
    let file = tune::originals_path(&state.path().join("state.json"));
    let both = tunable_map(&[("loop3", "timeout_sync", Int(8)), ("loop3", "slice_idle", Int(0))]);
    let tuned = tune::TunedDevices::apply_in(sys.path(), ROOT_ON_VDA, &both, Some(&file)).unwrap();
    std::mem::forget(tuned); // SIGKILL
    assert_eq!(iosched_value(sys.path(), "loop3", "slice_idle"), "0");

    // The next agent manages timeout_sync only: slice_idle is not its to touch, but its original is not lost.
    let one = tunable_map(&[("loop3", "timeout_sync", Int(8))]);
    let mut next = tune::TunedDevices::apply_in(sys.path(), ROOT_ON_VDA, &one, Some(&file)).unwrap();
    let text = fs::read_to_string(&file).unwrap();
    assert!(text.contains("slice_idle") && text.contains("timeout_sync"), "{text}");
    assert_eq!(next.restore(), 0);
    assert_eq!(iosched_value(sys.path(), "loop3", "timeout_sync"), "124");
    assert_eq!(
        iosched_value(sys.path(), "loop3", "slice_idle"),
        "0",
        "not restored by an agent that does not manage it"
    );
    let text = fs::read_to_string(&file).expect("the file stays while it holds an original");
    assert!(text.contains("slice_idle") && !text.contains("timeout_sync"), "{text}");

    // `devices restore` puts it back from the file, and the file goes.
    let mut from_file = tune::TunedDevices::from_originals_file_in(sys.path(), ROOT_ON_VDA, None, &file).unwrap();
    assert_eq!(from_file.restore(), 0);
    assert_eq!(iosched_value(sys.path(), "loop3", "slice_idle"), "8");
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
    assert!(matches!(e, DeviceError::InvalidName(InvalidName { what: "device number", .. })), "{e:?}");
    assert_eq!(e.to_string(), "invalid device number \"8\": expected MAJ:MIN");
    let e = disk_of_path(Path::new("/nonexistent/x")).unwrap_err();
    assert!(matches!(e, DeviceError::Io { op: "stat", .. }), "{e:?}");
    let dir = tempfile::tempdir().unwrap();
    let e: DeviceError = DevNum::of_node(dir.path()).unwrap_err().into();
    assert!(matches!(e, DeviceError::Refused { ref reason, .. } if reason == "not a block device"), "{e:?}");
}

// ----- Protection by default (`[devices] protect`) -----

/// `fake_sys_bfq` with what protection reads too: each disk's `dev` file and `strict_guarantees`.
fn fake_sys_protect() -> tempfile::TempDir {
    let sys = fake_sys_bfq();
    for (dev, num) in [("vda", "254:0"), ("loop3", "7:3"), ("dm-0", "253:0")] {
        fs::write(sys.path().join("devices/block").join(dev).join("dev"), format!("{num}\n")).unwrap();
    }
    for dev in ["loop3", "vda"] {
        fs::write(sys.path().join("devices/block").join(dev).join("queue/iosched/strict_guarantees"), "0\n").unwrap();
        fs::write(sys.path().join("devices/block").join(dev).join("queue/nr_requests"), "256\n").unwrap();
    }
    sys
}

fn nr_requests(sys: &Path, dev: &str) -> String {
    fs::read_to_string(sys.join("devices/block").join(dev).join("queue/nr_requests")).unwrap().trim().to_string()
}

fn managed(names: &[&str]) -> Vec<protect::Managed> {
    names.iter().map(|n| protect::Managed { name: n.to_string(), why: "[devices] check".into() }).collect()
}

fn decisions(plan: &[protect::Planned]) -> Vec<(String, String)> {
    plan.iter()
        .map(|p| {
            let d = match &p.decision {
                protect::Decision::Bfq { switch_from: None, .. } => "bfq".to_string(),
                protect::Decision::Bfq { switch_from: Some(f), .. } => format!("switch from {f}, bfq"),
                protect::Decision::IoCost { dev } => format!("io.cost {dev}"),
                protect::Decision::Leave(why) => format!("leave: {why}"),
            };
            (p.device.clone(), d)
        })
        .collect()
}

#[test]
fn protect_plans_per_device_from_what_it_finds_and_never_the_root_disk() {
    use crate::config::{DevicesConfig, ProtectMode};
    let sys = fake_sys_protect();
    let s = sys.path();
    let root: std::result::Result<Vec<String>, String> = Ok(vec!["vda".into()]);
    let cfg = DevicesConfig::default();
    assert_eq!(cfg.protect, ProtectMode::Auto);
    // v1: loop3 on bfq gets the short slots; vda backs / and is never changed (the fix is named); dm-0 has no bfq.
    let plan = protect::plan_in(s, &root, None, &cfg, &managed(&["loop3", "vda", "dm-0", "loop3"]));
    let d = decisions(&plan);
    assert_eq!(d.len(), 3, "each device once: {d:?}");
    assert_eq!(d[0], ("loop3".into(), "bfq".into()));
    assert!(
        d[1].1.starts_with("leave: it backs the root filesystem")
            && d[1].1.contains("echo 4 > /sys/block/vda/queue/nr_requests"),
        "{d:?}"
    );
    assert!(d[2].1.contains("bfq is not available"), "{d:?}");
    assert_eq!(
        plan[0].bfq_settings().iter().map(|x| (x.key.as_str(), x.value.as_str())).collect::<Vec<_>>(),
        [("nr_requests", "4")]
    );
    assert!(plan[1].bfq_settings().is_empty());
    assert!(plan[0].describe().contains("loop3: BFQ with nr_requests=4"), "{}", plan[0].describe());

    // v1, another scheduler with bfq available: switch first, then the same settings.
    fs::write(s.join("devices/block/loop3/queue/scheduler"), "[none] mq-deadline bfq\n").unwrap();
    let plan = protect::plan_in(s, &root, None, &cfg, &managed(&["loop3"]));
    assert_eq!(decisions(&plan)[0].1, "switch from none, bfq");
    assert_eq!(plan[0].bfq_settings()[0].key, "scheduler");
    assert_eq!(plan[0].bfq_settings().len(), 2);

    // v2, not bfq: io.cost, unless it is on already or the kernel has none.
    let v2 = tempfile::tempdir().unwrap();
    fs::write(v2.path().join("io.cost.qos"), "").unwrap();
    let plan = protect::plan_in(s, &root, Some(v2.path()), &cfg, &managed(&["loop3"]));
    assert_eq!(decisions(&plan)[0].1, "io.cost 7:3");
    fs::write(v2.path().join("io.cost.qos"), "7:3 enable=1 ctrl=user rpct=95.00\n").unwrap();
    let plan = protect::plan_in(s, &root, Some(v2.path()), &cfg, &managed(&["loop3"]));
    assert!(decisions(&plan)[0].1.contains("io.cost is enabled already"), "{plan:?}");
    let no_iocost = tempfile::tempdir().unwrap();
    let plan = protect::plan_in(s, &root, Some(no_iocost.path()), &cfg, &managed(&["loop3"]));
    assert!(decisions(&plan)[0].1.contains("the kernel has no io.cost"), "{plan:?}");
    fs::write(s.join("devices/block/loop3/queue/scheduler"), "mq-deadline kyber [bfq] none\n").unwrap();
    let plan = protect::plan_in(s, &root, Some(v2.path()), &cfg, &managed(&["loop3"]));
    assert_eq!(decisions(&plan)[0].1, "bfq", "v2 with bfq: the short slots too");

    // One line opts a device out, or every device; the operator's bfq_tunables win; no root disk known: nothing.
    let leave = |cfg: &DevicesConfig, root: &std::result::Result<Vec<String>, String>| {
        decisions(&protect::plan_in(s, root, None, cfg, &managed(&["loop3"])))[0].1.clone()
    };
    let opt_out = DevicesConfig { opt_out: vec!["loop3".into()], ..DevicesConfig::default() };
    // An opted-out BFQ device with BFQ's slots: the operator is told what stays (the slot, read back).
    let keeps = "; BFQ keeps its own slots there (timeout_sync 124 ms): a new container's small read can wait for a \
                 big reader's whole slot, so weights alone do not bound a read";
    assert_eq!(leave(&opt_out, &root), format!("leave: opted out ([devices] opt_out){keeps}"));
    let off = DevicesConfig { protect: ProtectMode::Off, ..DevicesConfig::default() };
    assert_eq!(leave(&off, &root), format!("leave: [devices] protect = \"off\"{keeps}"));
    // Short slots already, or not BFQ: nothing to add.
    fs::write(s.join("devices/block/loop3/queue/iosched/timeout_sync"), "32\n").unwrap();
    assert_eq!(leave(&opt_out, &root), "leave: opted out ([devices] opt_out)");
    fs::write(s.join("devices/block/loop3/queue/iosched/timeout_sync"), "124\n").unwrap();
    fs::write(s.join("devices/block/loop3/queue/scheduler"), "[mq-deadline] kyber bfq none\n").unwrap();
    assert_eq!(leave(&off, &root), "leave: [devices] protect = \"off\"");
    fs::write(s.join("devices/block/loop3/queue/scheduler"), "mq-deadline kyber [bfq] none\n").unwrap();
    let mut own = DevicesConfig::default();
    own.bfq_tunables.entry("loop3".into()).or_default().insert("timeout_sync".into(), tune::TunableValue::Int(20));
    assert_eq!(leave(&own, &root), "leave: the operator's [devices] bfq_tunables decide");
    let unknown: std::result::Result<Vec<String>, String> = Err("no mount on /".into());
    assert!(leave(&cfg, &unknown).contains("cannot tell which disk backs /"));
    // A device that does not exist is left, with why.
    assert!(decisions(&protect::plan_in(s, &root, None, &cfg, &managed(&["sdz"])))[0].1.contains("cannot read its"));
}

#[test]
fn protect_caps_the_request_size_where_requests_may_be_bigger_and_puts_it_back() {
    let sys = fake_sys_protect();
    let s = sys.path();
    let max_kb =
        |dev: &str| fs::read_to_string(s.join("devices/block").join(dev).join("queue/max_sectors_kb")).unwrap();
    fs::write(s.join("devices/block/loop3/queue/max_sectors_kb"), "1280\n").unwrap();
    fs::write(s.join("devices/block/vda/queue/max_sectors_kb"), "1280\n").unwrap();
    let root: std::result::Result<Vec<String>, String> = Ok(vec!["vda".into()]);
    let plan = protect::plan_in(s, &root, None, &Default::default(), &managed(&["loop3", "vda"]));
    let settings: Vec<protect::Setting> = plan.iter().flat_map(|p| p.bfq_settings()).collect();
    assert_eq!(
        settings.iter().map(|x| (x.device.as_str(), x.key.as_str(), x.value.as_str())).collect::<Vec<_>>(),
        [("loop3", "nr_requests", "4"), ("loop3", "max_sectors_kb", "128")]
    );
    assert!(plan[0].describe().contains("loop3: BFQ with nr_requests=4 max_sectors_kb=128"), "{}", plan[0].describe());
    assert!(
        decisions(&plan)[1].1.contains("echo 128 > /sys/block/vda/queue/max_sectors_kb"),
        "the root disk's advice names it too: {plan:?}"
    );
    let state = tempfile::tempdir().unwrap();
    let file = tune::originals_path(&state.path().join("state.json"));
    let mut tuned = tune::TunedDevices::apply_all_adopting_in(
        s,
        ROOT_ON_VDA,
        None,
        &Default::default(),
        &settings,
        &[],
        Some(&file),
    )
    .unwrap();
    assert_eq!((nr_requests(s, "loop3").as_str(), max_kb("loop3").trim()), ("4", "128"));
    assert_eq!(max_kb("vda").trim(), "1280", "vda untouched");
    let on_disk: serde_json::Value = serde_json::from_str(&fs::read_to_string(&file).unwrap()).unwrap();
    assert_eq!(on_disk["loop3"]["max_sectors_kb"], "1280", "{on_disk}");
    let rows = tuned.view(Vec::new()).read_back();
    assert!(rows.iter().any(|r| r.setting == "max_sectors_kb" && r.original == "1280" && r.as_set()), "{rows:?}");
    assert_eq!(tuned.restore(), 0, "no restore failure");
    assert_eq!((nr_requests(s, "loop3").as_str(), max_kb("loop3").trim()), ("256", "1280"), "both put back");

    // Requests already at most 128 KiB (or a value that does not read as a number): left as they are.
    for found in ["128", "64", "junk"] {
        fs::write(s.join("devices/block/loop3/queue/max_sectors_kb"), format!("{found}\n")).unwrap();
        let plan = protect::plan_in(s, &root, None, &Default::default(), &managed(&["loop3"]));
        let keys: Vec<String> = plan[0].bfq_settings().into_iter().map(|x| x.key).collect();
        assert_eq!(keys, ["nr_requests"], "max_sectors_kb {found}");
    }
    let found = |kb| protect::QueueFound { max_sectors_kb: kb, ..Default::default() };
    assert_eq!(protect::bfq_settings_for(found(Some(129))).len(), 2);
    assert_eq!(protect::bfq_settings_for(found(None)).len(), 1);
}

#[test]
fn protect_shortens_bfqs_slots_only_where_no_moving_heads_answer() {
    let sys = fake_sys_protect();
    let s = sys.path();
    let root: std::result::Result<Vec<String>, String> = Ok(vec!["vda".into()]);
    let queue = s.join("devices/block/loop3/queue");
    let plan_keys = || -> Vec<(String, String)> {
        let plan = protect::plan_in(s, &root, None, &Default::default(), &managed(&["loop3"]));
        plan[0].bfq_settings().into_iter().map(|x| (x.key, x.value)).collect()
    };
    let has_slot = |keys: &[(String, String)]| keys.iter().any(|(k, v)| k == "timeout_sync" && v == "32");
    // Not rotating, BFQ's default slot (124 ms): shortened, after the queue's settings.
    fs::write(queue.join("rotational"), "0\n").unwrap();
    let keys = plan_keys();
    assert!(has_slot(&keys), "{keys:?}");
    assert_eq!(keys.last().map(|(k, _)| k.as_str()), Some("timeout_sync"), "{keys:?}");
    // Rotating, or a rotational flag that does not read: BFQ's slot left until the device's lone reads are
    // measured; then shortened where no moving heads answer (under 2 ms), left where they do.
    for flag in ["1\n", "junk\n"] {
        fs::write(queue.join("rotational"), flag).unwrap();
        assert!(!has_slot(&plan_keys()), "rotational {flag:?}");
        let plan = protect::plan_in(s, &root, None, &Default::default(), &managed(&["loop3"])).remove(0);
        assert!(plan.wants_lone_read(), "rotational {flag:?}");
        assert!(plan.describe().contains("its lone reads are measured at start"), "{}", plan.describe());
        let slot = |p: &protect::Planned| p.bfq_settings().iter().any(|x| x.key == "timeout_sync" && x.value == "32");
        for (us, short) in [(150, true), (1_999, true), (2_000, false), (8_300, false)] {
            let measured = plan.clone().with_lone_read(std::time::Duration::from_micros(us));
            assert_eq!(slot(&measured), short, "lone read {us} µs: {}", measured.describe());
            assert!(!measured.wants_lone_read(), "measured once");
            assert!(measured.describe().contains(&format!("a lone read took {us} µs")), "{}", measured.describe());
        }
    }
    // A device that reports it does not rotate is not measured.
    fs::write(queue.join("rotational"), "0\n").unwrap();
    let plan = protect::plan_in(s, &root, None, &Default::default(), &managed(&["loop3"])).remove(0);
    assert!(!plan.wants_lone_read());
    // Slots already at most 32 ms: left as they are (protection never lengthens one).
    fs::write(queue.join("rotational"), "0\n").unwrap();
    for short in ["32", "16"] {
        fs::write(queue.join("iosched/timeout_sync"), format!("{short}\n")).unwrap();
        assert!(plan_keys().iter().all(|(k, _)| k != "timeout_sync"), "timeout_sync {short}");
        // Nor measured where the slot is short already, rotating or not.
        fs::write(queue.join("rotational"), "1\n").unwrap();
        let plan = protect::plan_in(s, &root, None, &Default::default(), &managed(&["loop3"])).remove(0);
        assert!(!plan.wants_lone_read(), "timeout_sync {short}");
        fs::write(queue.join("rotational"), "0\n").unwrap();
    }
    // Written through the guard, read back and put back at stop like the queue's settings.
    fs::write(queue.join("iosched/timeout_sync"), "124\n").unwrap();
    let state = tempfile::tempdir().unwrap();
    let plan = protect::plan_in(s, &root, None, &Default::default(), &managed(&["loop3"]));
    let mut tuned = tune::TunedDevices::apply_all_adopting_in(
        s,
        ROOT_ON_VDA,
        None,
        &Default::default(),
        &plan[0].bfq_settings(),
        &[],
        Some(&tune::originals_path(&state.path().join("state.json"))),
    )
    .unwrap();
    assert_eq!(iosched_value(s, "loop3", "timeout_sync"), "32");
    assert_eq!(tuned.restore(), 0, "no restore failure");
    assert_eq!(iosched_value(s, "loop3", "timeout_sync"), "124", "put back");
    // A device BFQ is selected for: its slot read after the switch is BFQ's default, so the plan shortens it.
    let found = protect::QueueFound { rotational: Some(false), ..Default::default() };
    assert!(protect::bfq_settings_for(found).iter().any(|(k, v)| *k == "timeout_sync" && v == "32"));
    let found = protect::QueueFound { rotational: Some(true), lone_read_us: Some(300), ..Default::default() };
    assert!(protect::bfq_settings_for(found).iter().any(|(k, v)| *k == "timeout_sync" && v == "32"));
    // Other plans are not measured, and a measurement leaves them as they are.
    let leave = protect::Planned {
        device: "loop3".into(),
        why: "test".into(),
        decision: protect::Decision::Leave("opted out".into()),
    };
    assert!(!leave.wants_lone_read());
    assert_eq!(leave.clone().with_lone_read(std::time::Duration::from_micros(1)), leave);
}

#[test]
fn protect_sets_reads_back_and_restores_the_queue_depth_and_after_a_kill_the_first_originals() {
    let sys = fake_sys_protect();
    let s = sys.path();
    let state = tempfile::tempdir().unwrap();
    let file = tune::originals_path(&state.path().join("state.json"));
    let root: std::result::Result<Vec<String>, String> = Ok(vec!["vda".into()]);
    let plan = protect::plan_in(s, &root, None, &Default::default(), &managed(&["loop3", "vda"]));
    let settings: Vec<protect::Setting> = plan.iter().flat_map(|p| p.bfq_settings()).collect();
    assert_eq!(settings.len(), 1, "loop3 only: {settings:?}");
    let mut tuned = tune::TunedDevices::apply_all_adopting_in(
        s,
        ROOT_ON_VDA,
        None,
        &Default::default(),
        &settings,
        &[],
        Some(&file),
    )
    .unwrap();
    assert_eq!(nr_requests(s, "loop3"), "4");
    assert_eq!(nr_requests(s, "vda"), "256", "vda untouched");
    for (key, value) in [("strict_guarantees", "0"), ("max_budget", "0"), ("timeout_sync", "124")] {
        assert_eq!(iosched_value(s, "loop3", key), value, "BFQ's tunables are left as they are");
    }
    let on_disk: serde_json::Value = serde_json::from_str(&fs::read_to_string(&file).unwrap()).unwrap();
    assert_eq!(on_disk["loop3"]["nr_requests"], "256", "{on_disk}");

    // Read back for status and metrics: as set; a value someone changed (a scheduler switch resets it) shows, and
    // is flagged.
    let view = tuned.view(vec![("vda".into(), "it backs the root filesystem".into())]);
    let rows = view.read_back();
    assert_eq!(rows.len(), 1);
    assert!(rows.iter().all(|r| r.as_set() && r.by == "protect" && r.device == "loop3"), "{rows:?}");
    assert_eq!(
        (rows[0].setting.as_str(), rows[0].original.as_str(), rows[0].set.as_str()),
        ("nr_requests", "256", "4")
    );
    fs::write(s.join("devices/block/loop3/queue/nr_requests"), "64\n").unwrap();
    let rows = view.read_back();
    assert_eq!(rows[0].now.as_deref(), Some("64"));
    assert!(!rows[0].as_set());
    let metrics = std::sync::Arc::new(crate::ops::metrics::Metrics::new());
    metrics.device_settings.set_view(view.clone());
    let text = metrics.render();
    assert!(text.contains("ddiskqos_device_setting{device=\"loop3\",setting=\"nr_requests\"} 64"), "{text}");
    assert!(text.contains("ddiskqos_device_setting_as_set{device=\"loop3\",setting=\"nr_requests\"} 0"), "{text}");
    fs::write(s.join("devices/block/loop3/queue/nr_requests"), "4\n").unwrap();
    assert!(metrics.render().contains("ddiskqos_device_setting_as_set{device=\"loop3\",setting=\"nr_requests\"} 1"));

    // A clean stop puts the original back and removes the file.
    assert_eq!(tuned.restore(), 0);
    assert_eq!(nr_requests(s, "loop3"), "256");
    assert!(!file.exists());

    // SIGKILL: the next agent records the first original, not the killed agent's value, and restores that.
    let tuned = tune::TunedDevices::apply_all_adopting_in(
        s,
        ROOT_ON_VDA,
        None,
        &Default::default(),
        &settings,
        &[],
        Some(&file),
    )
    .unwrap();
    std::mem::forget(tuned);
    let mut next = tune::TunedDevices::apply_all_adopting_in(
        s,
        ROOT_ON_VDA,
        None,
        &Default::default(),
        &settings,
        &[],
        Some(&file),
    )
    .unwrap();
    assert_eq!(next.tuned().iter().map(|t| t.original.as_str()).collect::<Vec<_>>(), ["256"]);
    assert_eq!(next.restore(), 0);
    assert_eq!(nr_requests(s, "loop3"), "256");

    // Or, when uninstalling after the kill: `devices restore` from the originals file alone.
    let tuned = tune::TunedDevices::apply_all_adopting_in(
        s,
        ROOT_ON_VDA,
        None,
        &Default::default(),
        &settings,
        &[],
        Some(&file),
    )
    .unwrap();
    std::mem::forget(tuned);
    let mut from_file = tune::TunedDevices::from_originals_file_in(s, ROOT_ON_VDA, None, &file).unwrap();
    assert_eq!(from_file.tuned().len(), 1);
    assert_eq!(from_file.restore(), 0);
    assert_eq!(nr_requests(s, "loop3"), "256");
    assert!(!file.exists());
    let mut none = tune::TunedDevices::from_originals_file_in(s, ROOT_ON_VDA, None, &file).unwrap();
    assert_eq!(none.restore(), 0, "no file: nothing to do");
}

#[test]
fn protect_never_writes_the_root_disk_and_a_failing_device_does_not_stop_the_others() {
    let sys = fake_sys_protect();
    let s = sys.path();
    let state = tempfile::tempdir().unwrap();
    let file = tune::originals_path(&state.path().join("state.json"));
    // Settings for the root disk (as if a plan were wrong) are refused by the guard; loop3 still gets its own. A
    // list of three, protection's and two BFQ tunables, shows the order: loop3's second setting fails (its file is
    // gone), the first is kept and restored, the third skipped.
    let setting = |dev: &str, k: &str, v: &str| protect::Setting { device: dev.into(), key: k.into(), value: v.into() };
    let mut settings: Vec<protect::Setting> =
        protect::bfq_settings_for(protect::QueueFound { max_sectors_kb: Some(1280), ..Default::default() })
            .iter()
            .map(|(k, v)| setting("vda", k, v))
            .collect();
    settings.extend([
        setting("loop3", protect::NR_REQUESTS, "4"),
        setting("loop3", "max_budget", "256"),
        setting("loop3", "timeout_sync", "8"),
    ]);
    fs::remove_file(s.join("devices/block/loop3/queue/iosched/max_budget")).unwrap();
    let mut tuned = tune::TunedDevices::apply_all_adopting_in(
        s,
        ROOT_ON_VDA,
        None,
        &Default::default(),
        &settings,
        &[],
        Some(&file),
    )
    .unwrap();
    assert_eq!(nr_requests(s, "vda"), "256", "the root disk is never written");
    assert_eq!(nr_requests(s, "loop3"), "4");
    assert_eq!(iosched_value(s, "loop3", "timeout_sync"), "124", "skipped after the failure");
    assert_eq!(tuned.tuned().len(), 1);
    assert_eq!(tuned.restore(), 0);
    assert_eq!(nr_requests(s, "loop3"), "256");
}

#[test]
fn protect_enables_io_cost_with_the_measured_model_reads_it_back_and_turns_it_off_again() {
    let sys = fake_sys_protect();
    let s = sys.path();
    let v2 = tempfile::tempdir().unwrap();
    let (model, qos) = (v2.path().join("io.cost.model"), v2.path().join("io.cost.qos"));
    fs::write(&model, "7:3 ctrl=auto model=linear rbps=174 rseqiops=1 rrandiops=1 wbps=1 wseqiops=1 wrandiops=1\n")
        .unwrap();
    fs::write(&qos, "7:3 enable=0 ctrl=auto rpct=0.00 rlat=250000 wpct=0.00 wlat=250000 min=1.00 max=10000.00\n")
        .unwrap();
    let state = tempfile::tempdir().unwrap();
    let file = tune::originals_path(&state.path().join("state.json"));
    let measured = iocost::Measured {
        model: iocost::CostModel {
            rbps: 3_000_000_000,
            rseqiops: 83_000,
            rrandiops: 100_000,
            wbps: 3_000_000_000,
            wseqiops: 83_000,
            wrandiops: 100_000,
        },
        median_4k_qd1_us: 100,
        writes_measured: false,
    };
    let dev: DevNum = "7:3".parse().unwrap();
    let settings = protect::io_cost_settings("loop3", dev, &measured);
    assert!(settings[0].value.starts_with("7:3 ctrl=user model=linear rbps=3000000000"), "{settings:?}");
    assert!(settings[1].value.starts_with("7:3 enable=1") && settings[1].value.contains("rlat=2000"), "{settings:?}");
    let mut tuned = tune::TunedDevices::apply_all_adopting_in(
        s,
        ROOT_ON_VDA,
        Some(v2.path()),
        &Default::default(),
        &settings,
        &[],
        Some(&file),
    )
    .unwrap();
    assert!(io_cost_enabled(v2.path(), dev).unwrap());
    assert!(fs::read_to_string(&model).unwrap().contains("rbps=3000000000"));
    let rows = tuned.view(Vec::new()).read_back();
    assert_eq!(rows.iter().map(|r| r.setting.as_str()).collect::<Vec<_>>(), ["io.cost.model", "io.cost.qos"]);
    assert!(rows.iter().all(|r| r.as_set()), "{rows:?}");
    assert!(rows[1].original.contains("enable=0"));
    assert_eq!(tuned.restore(), 0);
    assert_eq!(fs::read_to_string(&qos).unwrap(), "7:3 enable=0 ctrl=auto", "io.cost off, its targets the kernel's");
    assert_eq!(fs::read_to_string(&model).unwrap(), "7:3 ctrl=auto", "the kernel's model again");
    // A line for another device is refused, naming it.
    let wrong = [protect::Setting { device: "loop3".into(), key: "io.cost.qos".into(), value: "8:0 enable=1".into() }];
    let tuned = tune::TunedDevices::apply_all_adopting_in(
        s,
        ROOT_ON_VDA,
        Some(v2.path()),
        &Default::default(),
        &wrong,
        &[],
        Some(&file),
    )
    .unwrap();
    assert!(tuned.tuned().is_empty());
    assert_eq!(fs::read_to_string(&qos).unwrap(), "7:3 enable=0 ctrl=auto");
}

#[test]
fn io_cost_lines_go_back_to_the_kernels_values_or_to_the_operators() {
    let dev: DevNum = "7:3".parse().unwrap();
    let auto_off = "7:3 enable=0 ctrl=auto rpct=0.00 rlat=250000 wpct=0.00 wlat=250000 min=1.00 max=10000.00";
    let user_off = "7:3 enable=0 ctrl=user rpct=90.00 rlat=5000 wpct=90.00 wlat=5000 min=50.00 max=100.00";
    let auto_model = "7:3 ctrl=auto model=linear rbps=174 rseqiops=1 rrandiops=1 wbps=1 wseqiops=1 wrandiops=1";
    let user_model = "7:3 ctrl=user model=linear rbps=9 rseqiops=9 rrandiops=9 wbps=9 wseqiops=9 wrandiops=9";
    for (key, original, want) in [
        ("io.cost.qos", auto_off, "7:3 enable=0 ctrl=auto"),
        ("io.cost.qos", "7:3 enable=1 ctrl=auto rpct=0.00", "7:3 enable=1 ctrl=auto"),
        ("io.cost.qos", "", "7:3 enable=0 ctrl=auto"),
        ("io.cost.qos", user_off, user_off),
        ("io.cost.model", auto_model, "7:3 ctrl=auto"),
        ("io.cost.model", "", "7:3 ctrl=auto"),
        ("io.cost.model", user_model, user_model),
    ] {
        assert_eq!(setting::io_cost_restore_line(dev, key, original), want, "{key} was {original:?}");
    }
}

#[test]
fn protect_after_a_kill_puts_back_the_scheduler_the_killed_agent_switched() {
    let sys = fake_sys_protect();
    let s = sys.path();
    let state = tempfile::tempdir().unwrap();
    let file = tune::originals_path(&state.path().join("state.json"));
    // What a killed agent left: loop3 switched from none to bfq, its queue depth set (and, from an older version,
    // strict_guarantees); its originals on file.
    fs::write(s.join("devices/block/loop3/queue/iosched/strict_guarantees"), "1\n").unwrap();
    fs::write(s.join("devices/block/loop3/queue/nr_requests"), "4\n").unwrap();
    fs::write(&file, r#"{"loop3": {"scheduler": "none", "nr_requests": "256", "strict_guarantees": "0"}}"#).unwrap();
    // This agent finds bfq, so it plans the queue depth only, and adopts the other originals.
    let plan = protect::plan_in(s, &Ok(vec!["vda".into()]), None, &Default::default(), &managed(&["loop3"]));
    let settings: Vec<protect::Setting> = plan.iter().flat_map(|p| p.bfq_settings()).collect();
    assert_eq!(settings.len(), 1);
    let adopt = vec!["loop3".to_string()];
    let mut tuned = tune::TunedDevices::apply_all_adopting_in(
        s,
        ROOT_ON_VDA,
        None,
        &Default::default(),
        &settings,
        &adopt,
        Some(&file),
    )
    .unwrap();
    let mut got: Vec<(&str, &str)> = tuned.tuned().iter().map(|t| (t.key.as_str(), t.original.as_str())).collect();
    got.sort();
    assert_eq!(got, [("nr_requests", "256"), ("scheduler", "none"), ("strict_guarantees", "0")]);
    let on_disk: serde_json::Value = serde_json::from_str(&fs::read_to_string(&file).unwrap()).unwrap();
    assert_eq!(on_disk["loop3"]["scheduler"], "none", "still on file: {on_disk}");
    assert_eq!(tuned.restore(), 0);
    assert_eq!(scheduler_in(s, "loop3").unwrap().active, "none", "the scheduler goes back, last");
    assert_eq!(iosched_value(s, "loop3", "strict_guarantees"), "0");
    assert_eq!(nr_requests(s, "loop3"), "256");
    assert!(!file.exists());
}
