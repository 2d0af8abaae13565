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
