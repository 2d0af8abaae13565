//! The cap plan without files: the formats as Linux 6.18 (v1) and the kernel's documentation (v2) give them, the
//! min-of-existing rule, the lines of a set and of a lift, and bad content named by file and line.

use super::*;

fn dev(s: &str) -> DevNum {
    s.parse().unwrap()
}

fn lim(read: Option<u64>, write: Option<u64>) -> Limits {
    Limits { read_bps: read, write_bps: write }
}

fn limits(entries: &[(&str, Option<u64>, Option<u64>)]) -> DeviceLimits {
    entries.iter().map(|(d, r, w)| (dev(d), lim(*r, *w))).collect()
}

fn cap(read: Option<u64>, write: Option<u64>) -> Option<Cap> {
    Some(Cap { read_bps: read, write_bps: write })
}

const MIB: u64 = 1 << 20;

#[test]
fn v1_files_parse_as_the_kernel_prints_them() {
    let f = Path::new("blkio.throttle.read_bps_device");
    assert_eq!(parse_v1(f, b"").unwrap(), BTreeMap::new(), "no limit anywhere: an empty file");
    let read = parse_v1(f, b"7:1 1048576\n8:0 5000\n").unwrap();
    assert_eq!(read, BTreeMap::from([(dev("7:1"), MIB), (dev("8:0"), 5000)]));
    let write = parse_v1(f, b"7:1 2097152\n").unwrap();
    assert_eq!(join_v1(&read, &write), limits(&[("7:1", Some(MIB), Some(2 * MIB)), ("8:0", Some(5000), None)]));
    // u64::MAX is the kernel's "none".
    assert_eq!(parse_v1(f, b"7:1 18446744073709551615\n").unwrap(), BTreeMap::new());
}

#[test]
fn v2_io_max_parses_rbps_and_wbps() {
    let f = Path::new("io.max");
    let text = b"8:16 rbps=2097152 wbps=max riops=max wiops=120\n7:3 rbps=max wbps=1000 riops=max wiops=max\n";
    assert_eq!(parse_v2(f, text).unwrap(), limits(&[("7:3", None, Some(1000)), ("8:16", Some(2 * MIB), None)]));
    assert_eq!(parse_v2(f, b"").unwrap(), DeviceLimits::new());
    // A key a later kernel might add is skipped.
    assert_eq!(parse_v2(f, b"7:3 rbps=5 future=1\n").unwrap(), limits(&[("7:3", Some(5), None)]));
}

#[test]
fn bad_content_names_the_file_and_the_line() {
    let v1 = Path::new("/cg/c/blkio.throttle.write_bps_device");
    for (bad, line) in [
        (&b"7:1\n"[..], 1),
        (b"7:1 100\nx:y 100\n", 2),
        (b"7:1 ten\n", 1),
        (b"7:1 -1\n", 1),
        (b"7:1 100 200\n", 1),
        (b"7:1 100\n7:1 200\n", 2),
        (b"7:1 0\n", 1),
        (b"7:1 99999999999999999999\n", 1),
    ] {
        match parse_v1(v1, bad) {
            Err(CgroupError::Parse { file, line: l, .. }) => {
                assert_eq!((file.as_path(), l), (v1, line), "{:?}", String::from_utf8_lossy(bad))
            }
            other => panic!("{:?} gave {other:?}", String::from_utf8_lossy(bad)),
        }
    }
    let v2 = Path::new("/cg/c/io.max");
    for (bad, line) in [
        (&b"rbps=1\n"[..], 1),
        (b"7:3 rbps=1\n7:3 wbps=2\n", 2),
        (b"7:3 rbps\n", 1),
        (b"7:3 rbps=lots\n", 1),
        (b"\n7:3 rbps=0\n", 2),
    ] {
        match parse_v2(v2, bad) {
            Err(CgroupError::Parse { file, line: l, .. }) => {
                assert_eq!((file.as_path(), l), (v2, line), "{:?}", String::from_utf8_lossy(bad))
            }
            other => panic!("{:?} gave {other:?}", String::from_utf8_lossy(bad)),
        }
    }
    let text = parse_v2(v2, b"7:3 rbps=lots\n").unwrap_err().to_string();
    assert!(text.contains("/cg/c/io.max:1") && text.contains("rbps=lots"), "{text}");
}

#[test]
fn a_cap_never_loosens_an_existing_limit() {
    // 7:1: read limited to 1 MiB/s before (lower than the cap), write to 8 MiB/s (higher); 7:2: nothing before.
    let before = limits(&[("7:1", Some(MIB), Some(8 * MIB)), ("7:2", None, None)]);
    let target = targets([dev("7:1"), dev("7:2")], &before, cap(Some(4 * MIB), Some(4 * MIB))).unwrap();
    assert_eq!(target, limits(&[("7:1", Some(MIB), Some(4 * MIB)), ("7:2", Some(4 * MIB), Some(4 * MIB))]));
    // A direction the cap leaves alone keeps what it had.
    let target = targets([dev("7:1"), dev("7:2")], &before, cap(Some(4 * MIB), None)).unwrap();
    assert_eq!(target, limits(&[("7:1", Some(MIB), Some(8 * MIB)), ("7:2", Some(4 * MIB), None)]));
    // The lines: nothing for 7:1's read (already lower), the rest set.
    let now = before.clone();
    let target = targets([dev("7:1"), dev("7:2")], &before, cap(Some(4 * MIB), Some(4 * MIB))).unwrap();
    assert_eq!(
        write_lines(CgroupVersion::V1, &target, &now),
        [
            Line::V1(Direction::Write, dev("7:1"), Some(4 * MIB)),
            Line::V1(Direction::Read, dev("7:2"), Some(4 * MIB)),
            Line::V1(Direction::Write, dev("7:2"), Some(4 * MIB)),
        ]
    );
    let lines = write_lines(CgroupVersion::V2, &target, &now);
    assert_eq!(
        lines.iter().map(Line::text).collect::<Vec<_>>(),
        ["7:1 wbps=4194304\n", "7:2 rbps=4194304 wbps=4194304\n"]
    );
    assert!(lines.iter().all(|l| l.file_name() == "io.max"));
}

#[test]
fn a_later_looser_cap_loosens_the_agents_own_cap_but_not_the_snapshot() {
    let before = limits(&[("7:2", None, Some(3 * MIB))]);
    let capped = targets([dev("7:2")], &before, cap(Some(MIB), Some(MIB))).unwrap();
    assert_eq!(capped, limits(&[("7:2", Some(MIB), Some(MIB))]));
    let looser = targets([dev("7:2")], &before, cap(Some(10 * MIB), Some(10 * MIB))).unwrap();
    assert_eq!(looser, limits(&[("7:2", Some(10 * MIB), Some(3 * MIB))]));
    assert_eq!(
        write_lines(CgroupVersion::V1, &looser, &capped),
        [Line::V1(Direction::Read, dev("7:2"), Some(10 * MIB)), Line::V1(Direction::Write, dev("7:2"), Some(3 * MIB))]
    );
}

#[test]
fn a_lift_puts_the_snapshot_back_exactly() {
    let before = limits(&[("7:1", Some(MIB), None), ("7:2", None, None)]);
    let now =
        limits(&[("7:1", Some(MIB), Some(4 * MIB)), ("7:2", Some(4 * MIB), Some(4 * MIB)), ("8:0", Some(7), None)]);
    let target = targets([dev("7:1"), dev("7:2")], &before, None).unwrap();
    assert_eq!(target, before, "a lift: the snapshot, whatever the devices");
    let v1: Vec<String> = write_lines(CgroupVersion::V1, &target, &now).iter().map(Line::text).collect();
    assert_eq!(v1, ["7:1 0\n", "7:2 0\n", "7:2 0\n"]);
    let v1_files: Vec<&str> = write_lines(CgroupVersion::V1, &target, &now).iter().map(Line::file_name).collect();
    assert_eq!(v1_files, [V1_WRITE_BPS, V1_READ_BPS, V1_WRITE_BPS]);
    let v2: Vec<String> = write_lines(CgroupVersion::V2, &target, &now).iter().map(Line::text).collect();
    assert_eq!(v2, ["7:1 wbps=max\n", "7:2 rbps=max wbps=max\n"], "8:0 is not the cap's: left alone");
    // A device the snapshot holds that the cap no longer covers is put back too.
    let target = targets([dev("7:2")], &before, cap(Some(MIB), None)).unwrap();
    assert_eq!(target, limits(&[("7:1", Some(MIB), None), ("7:2", Some(MIB), None)]));
}

#[test]
fn check_names_the_first_device_and_direction_that_disagree() {
    let target = limits(&[("7:1", Some(MIB), None), ("7:2", Some(MIB), Some(MIB))]);
    assert_eq!(check(&target, &target), Ok(()));
    let mut back = target.clone();
    back.insert(dev("8:0"), lim(Some(1), None));
    assert_eq!(check(&target, &back), Ok(()), "other devices do not matter");
    back.insert(dev("7:1"), lim(Some(MIB), Some(5)));
    assert_eq!(
        check(&target, &back),
        Err(CapMismatch { dev: dev("7:1"), dir: Direction::Write, wanted: None, read: Some(5) })
    );
    back.remove(&dev("7:1"));
    assert_eq!(
        check(&target, &back),
        Err(CapMismatch { dev: dev("7:1"), dir: Direction::Read, wanted: Some(MIB), read: None })
    );
}

#[test]
fn a_zero_cap_is_refused() {
    assert_eq!(targets([dev("7:1")], &DeviceLimits::new(), cap(Some(1), Some(0))), Err(ZeroCap(Direction::Write)));
    assert_eq!(targets([dev("7:1")], &DeviceLimits::new(), cap(Some(0), None)), Err(ZeroCap(Direction::Read)));
}

#[test]
fn select_gives_every_device_an_entry() {
    let now = limits(&[("7:1", Some(MIB), None), ("8:0", Some(1), Some(2))]);
    assert_eq!(select(&now, [dev("7:1"), dev("7:2")]), limits(&[("7:1", Some(MIB), None), ("7:2", None, None)]));
}

/// A limit that is neither the snapshot's nor one the agent left is someone else's, newer, and becomes the
/// snapshot's (a tighter one, a looser one, one removed); the agent's own values, the snapshot's and a device
/// the agent knows nothing about are left alone.
#[test]
fn adopt_takes_in_what_someone_else_set_since() {
    let mut before = limits(&[("7:3", None, Some(8 * MIB)), ("7:4", Some(1000), None), ("8:0", None, None)]);
    let wrote = limits(&[("7:3", Some(4 * MIB), Some(4 * MIB)), ("7:4", Some(1000), None)]);
    let unsure = limits(&[("7:3", Some(5 * MIB), None)]);
    // 7:3: read set by the operator to 2 MiB, write still the agent's; 7:4: read removed by the operator; 8:0 (not
    // in `ours`): changed, left alone.
    let now = limits(&[("7:3", Some(2 * MIB), Some(4 * MIB)), ("8:0", Some(7), None)]);
    let taken = adopt(&mut before, &[&wrote, &unsure], &now);
    assert_eq!(taken, [(dev("7:3"), Direction::Read, Some(2 * MIB)), (dev("7:4"), Direction::Read, None)]);
    assert_eq!(before, limits(&[("7:3", Some(2 * MIB), Some(8 * MIB)), ("7:4", None, None), ("8:0", None, None)]));
    // A value the agent may have left (its unsure one) or the snapshot's own: nothing taken in.
    let now = limits(&[("7:3", Some(5 * MIB), Some(8 * MIB))]);
    assert_eq!(adopt(&mut before, &[&wrote, &unsure], &now), []);
}
