//! The cgroup layer on fixture directories (no root needed): v1 with and without BFQ, v2 with and without
//! `io.bfq.weight`; counters, weights, conversions, verification, missing and vanished cgroups, malformed files,
//! confinement.

use std::fs;
use std::os::unix::fs::symlink;
use std::path::Path;

use qos_agent::cgroup::{
    CgroupError, CgroupRoot, CgroupVersion, CounterFileKind, CounterReader, InvalidName, WeightFile, WeightFileKind,
};
use qos_agent::runtime::docker::{container_cgroup, CgroupDriver};
use qos_core::{IoCounters, Weight};
use testbed::fixture::{make_cgroup, Layout};

const ID: &str = "4f1c0a9be2d3c4b5a697887766554433221100ffeeddccbbaa99887766554433";

fn w(v: u64) -> Weight {
    Weight::new(v).unwrap()
}

/// A temp dir holding a cgroup root with one container cgroup at `docker/<ID>`.
fn setup(version: CgroupVersion, layout: Layout) -> (tempfile::TempDir, CgroupRoot) {
    let tmp = tempfile::tempdir().unwrap();
    fs::create_dir(tmp.path().join("root")).unwrap();
    make_cgroup(&tmp.path().join("root/docker").join(ID), layout);
    let root = CgroupRoot::from_dir(version, tmp.path().join("root")).unwrap();
    (tmp, root)
}

#[test]
fn v1_bfq_counters_and_weights() {
    let (_tmp, root) = setup(CgroupVersion::V1, Layout::V1Bfq);
    assert_eq!(root.version(), CgroupVersion::V1);
    let dir = container_cgroup(&root, ID, CgroupDriver::Cgroupfs, None).unwrap();
    assert_eq!(dir.path(), root.path().join("docker").join(ID));
    assert_eq!(dir, container_cgroup(&root, ID, CgroupDriver::Cgroupfs, Some("/docker/")).unwrap());

    let mut reader = CounterReader::open(&dir).unwrap();
    assert_eq!(reader.kind(), CounterFileKind::V1Bfq);
    assert_eq!(reader.source_file(), dir.path().join("blkio.bfq.io_service_bytes_recursive"));
    assert_eq!(reader.read().unwrap(), IoCounters::new(64 << 20, 0));
    // The same open reader sees new content: it re-reads from offset 0.
    fs::write(reader.source_file(), "7:0 Read 1\n7:0 Write 2\n7:0 Total 3\nTotal 3\n").unwrap();
    assert_eq!(reader.read().unwrap(), IoCounters::new(1, 2));

    let wf = WeightFile::open(&dir).unwrap();
    assert_eq!(wf.kind(), WeightFileKind::V1Bfq);
    assert_eq!(wf.path(), dir.path().join("blkio.bfq.weight"));
    assert_eq!(wf.read().unwrap(), Weight::KERNEL_DEFAULT);
    wf.write_verified(w(1000)).unwrap();
    assert_eq!(fs::read_to_string(wf.path()).unwrap(), "1000\n");
    wf.write_verified(w(1)).unwrap();
    assert_eq!(fs::read_to_string(wf.path()).unwrap(), "1\n");
    assert_eq!(wf.read().unwrap(), Weight::MIN);
    // The weight_device file next to it is never touched.
    assert_eq!(fs::read_to_string(dir.path().join("blkio.bfq.weight_device")).unwrap(), "default 100\n");
}

#[test]
fn v1_without_bfq_uses_throttle_counters_and_blkio_weight() {
    let (_tmp, root) = setup(CgroupVersion::V1, Layout::V1Legacy);
    let dir = root.resolve_relative(&format!("docker/{ID}")).unwrap();
    let mut reader = CounterReader::open(&dir).unwrap();
    assert_eq!(reader.kind(), CounterFileKind::V1Throttle);
    assert_eq!(reader.read().unwrap(), IoCounters::new(4096, 8192));

    let wf = WeightFile::open(&dir).unwrap();
    assert_eq!(wf.kind(), WeightFileKind::V1Blkio);
    assert_eq!(wf.read().unwrap(), w(500));
    // blkio.weight's range starts at 10: weight 5 is written as 10, verified as 10 and reads back as 10.
    wf.write_verified(w(5)).unwrap();
    assert_eq!(fs::read_to_string(wf.path()).unwrap(), "10\n");
    assert_eq!(wf.read().unwrap(), w(10));
}

#[test]
fn v2_prefers_io_bfq_weight() {
    let (_tmp, root) = setup(CgroupVersion::V2, Layout::V2Bfq);
    let dir = container_cgroup(&root, ID, CgroupDriver::Cgroupfs, None).unwrap();
    assert_eq!(dir.version(), CgroupVersion::V2);
    let mut reader = CounterReader::open(&dir).unwrap();
    assert_eq!(reader.kind(), CounterFileKind::V2IoStat);
    assert_eq!(reader.read().unwrap(), IoCounters::new(1001, 2002));

    let wf = WeightFile::open(&dir).unwrap();
    assert_eq!(wf.kind(), WeightFileKind::V2Bfq);
    wf.write_verified(w(700)).unwrap();
    assert_eq!(fs::read_to_string(wf.path()).unwrap(), "default 700\n");
    assert_eq!(wf.read().unwrap(), w(700));
    assert_eq!(fs::read_to_string(dir.path().join("io.weight")).unwrap(), "default 100\n");
}

#[test]
fn v2_io_weight_only() {
    let (_tmp, root) = setup(CgroupVersion::V2, Layout::V2Io);
    let dir = container_cgroup(&root, ID, CgroupDriver::Cgroupfs, None).unwrap();
    assert_eq!(CounterReader::open(&dir).unwrap().read().unwrap(), IoCounters::new(5, 7));
    let wf = WeightFile::open(&dir).unwrap();
    assert_eq!(wf.kind(), WeightFileKind::V2Io);
    // The default line is ours; the per-device override (8:16 200) is not.
    assert_eq!(wf.read().unwrap(), Weight::KERNEL_DEFAULT);
    wf.write_verified(Weight::MAX).unwrap();
    assert_eq!(fs::read_to_string(wf.path()).unwrap(), "default 1000\n");
    // Someone else's value above our scale reads as the top of our scale.
    fs::write(wf.path(), "default 5000\n").unwrap();
    assert_eq!(wf.read().unwrap(), Weight::MAX);
    // ...but verification compares file values, so it is not mistaken for our 1000.
    assert!(matches!(wf.verify(Weight::MAX), Err(CgroupError::Mismatch { wrote: 1000, read: 5000, .. })));
    fs::write(wf.path(), "default 0\n").unwrap();
    let err = wf.read().unwrap_err();
    assert!(matches!(err, CgroupError::WeightRange { value: 0, .. }), "{err}");
    assert!(err.to_string().contains("io.weight"), "{err}");
}

#[test]
fn systemd_driver_paths() {
    let tmp = tempfile::tempdir().unwrap();
    let scope = format!("docker-{ID}.scope");
    make_cgroup(&tmp.path().join("system.slice").join(&scope), Layout::V2Io);
    make_cgroup(&tmp.path().join("my.slice/my-app.slice").join(&scope), Layout::V2Io);
    let root = CgroupRoot::from_dir(CgroupVersion::V2, tmp.path()).unwrap();
    let dir = container_cgroup(&root, ID, CgroupDriver::Systemd, None).unwrap();
    assert_eq!(dir.path(), root.path().join("system.slice").join(&scope));
    let dir = container_cgroup(&root, ID, CgroupDriver::Systemd, Some("my-app.slice")).unwrap();
    assert_eq!(dir.path(), root.path().join("my.slice/my-app.slice").join(&scope));
    for bad in ["/docker", "my.slice/x", "a--b.slice"] {
        let err = container_cgroup(&root, ID, CgroupDriver::Systemd, Some(bad)).unwrap_err();
        assert!(matches!(err, CgroupError::InvalidName(InvalidName { what: "cgroup parent", .. })), "{bad}: {err}");
    }
}

#[test]
fn implausible_container_ids_are_refused() {
    let (_tmp, root) = setup(CgroupVersion::V1, Layout::V1Bfq);
    for bad in [&ID[..12], &ID.to_uppercase(), "..", &format!("../{}", &ID[3..])] {
        let err = container_cgroup(&root, bad, CgroupDriver::Cgroupfs, None).unwrap_err();
        assert!(matches!(err, CgroupError::InvalidName(InvalidName { what: "container id", .. })), "{bad}: {err}");
    }
}

#[test]
fn confinement() {
    let tmp = tempfile::tempdir().unwrap();
    let base = tmp.path();
    fs::create_dir_all(base.join("root/docker")).unwrap();
    make_cgroup(&base.join("outside/victim"), Layout::V1Bfq);
    // A symlink inside the root pointing outside, both as a whole path and as an intermediate component.
    symlink(base.join("outside"), base.join("root/escape")).unwrap();
    symlink(base.join("outside/victim"), base.join("root/docker").join(ID)).unwrap();
    let root = CgroupRoot::from_dir(CgroupVersion::V1, base.join("root")).unwrap();

    let refused = |rel: &str| match root.resolve_relative(rel) {
        Err(CgroupError::OutsideRoot { reason, .. }) => reason,
        other => panic!("{rel:?} gave {other:?}"),
    };
    assert_eq!(refused(".."), "contains a `..` component");
    assert_eq!(refused("docker/../../outside/victim"), "contains a `..` component");
    assert_eq!(refused("/etc"), "is absolute");
    assert_eq!(refused(base.join("outside/victim").to_str().unwrap()), "is absolute");
    assert_eq!(refused("escape/victim"), "a component is a symlink");
    assert_eq!(refused("escape"), "a component is a symlink");
    assert_eq!(refused(&format!("docker/{ID}")), "a component is a symlink");
    let err = container_cgroup(&root, ID, CgroupDriver::Cgroupfs, None).unwrap_err();
    assert!(matches!(err, CgroupError::OutsideRoot { .. }), "{err}");
    let err = container_cgroup(&root, ID, CgroupDriver::Cgroupfs, Some("/../outside")).unwrap_err();
    assert!(matches!(err, CgroupError::OutsideRoot { .. }), "{err}");
    assert!(err.to_string().contains("outside the cgroup root"), "{err}");
    assert!(matches!(root.resolve_relative("a\0b"), Err(CgroupError::InvalidName(_))));

    // The victim was never written.
    assert_eq!(fs::read_to_string(base.join("outside/victim/blkio.bfq.weight")).unwrap(), "100\n");
    // The root itself and plain paths are fine.
    assert_eq!(root.resolve_relative("").unwrap().path(), root.path());
    assert_eq!(root.resolve_relative("./docker").unwrap().path(), root.path().join("docker"));
}

#[test]
fn weight_file_symlink_is_not_followed() {
    let tmp = tempfile::tempdir().unwrap();
    make_cgroup(&tmp.path().join("root/c"), Layout::V2Io);
    fs::write(tmp.path().join("victim"), "default 1\n").unwrap();
    fs::remove_file(tmp.path().join("root/c/io.weight")).unwrap();
    symlink(tmp.path().join("victim"), tmp.path().join("root/c/io.weight")).unwrap();
    let root = CgroupRoot::from_dir(CgroupVersion::V2, tmp.path().join("root")).unwrap();
    let err = WeightFile::open(&root.resolve_relative("c").unwrap()).unwrap_err();
    assert!(matches!(err, CgroupError::MissingFile { .. }), "{err}");
    assert_eq!(fs::read_to_string(tmp.path().join("victim")).unwrap(), "default 1\n");
}

#[test]
fn proc_cgroup_text_resolves() {
    let tmp = tempfile::tempdir().unwrap();
    make_cgroup(&tmp.path().join("docker").join(ID), Layout::V1Bfq);
    let root = CgroupRoot::from_dir(CgroupVersion::V1, tmp.path()).unwrap();
    let text = format!("9:name=systemd:/x\n7:cpu,blkio:/docker/{ID}\n0::/\n");
    let dir = root.resolve_proc_cgroup(Path::new("/proc/42/cgroup"), text.as_bytes()).unwrap();
    assert_eq!(dir.path(), tmp.path().canonicalize().unwrap().join("docker").join(ID));
    let err = root.resolve_proc_cgroup(Path::new("/proc/42/cgroup"), b"7:blkio:/../../etc\n").unwrap_err();
    assert!(matches!(err, CgroupError::OutsideRoot { .. }), "{err}");
    assert!(matches!(root.resolve_pid(0), Err(CgroupError::InvalidName(_))));
}

#[test]
fn missing_files_are_errors_and_never_created() {
    let tmp = tempfile::tempdir().unwrap();
    fs::create_dir_all(tmp.path().join("empty")).unwrap();
    make_cgroup(&tmp.path().join("c"), Layout::V1Bfq);
    let root = CgroupRoot::from_dir(CgroupVersion::V1, tmp.path()).unwrap();
    let empty = root.resolve_relative("empty").unwrap();
    let err = CounterReader::open(&empty).unwrap_err();
    assert!(matches!(err, CgroupError::MissingFile { .. }) && !err.is_vanished(), "{err}");
    assert!(err.to_string().contains("blkio.bfq.io_service_bytes_recursive"), "{err}");
    let err = WeightFile::open(&empty).unwrap_err();
    assert!(matches!(err, CgroupError::MissingFile { .. }), "{err}");
    assert_eq!(fs::read_dir(empty.path()).unwrap().count(), 0, "nothing was created");

    // The file disappears after detection while the cgroup stays: an error naming file and data, not a removal.
    let wf = WeightFile::open(&root.resolve_relative("c").unwrap()).unwrap();
    fs::remove_file(wf.path()).unwrap();
    let err = wf.write_verified(w(300)).unwrap_err();
    match &err {
        CgroupError::Write { path, data, .. } => {
            assert_eq!(path, wf.path());
            assert_eq!(data, "300\n");
        }
        other => panic!("{other}"),
    }
    assert!(!err.is_vanished());
    assert!(!wf.path().exists(), "write must not create the file");
    assert!(matches!(wf.read().unwrap_err(), CgroupError::Io { op: "read", .. }));
}

#[test]
fn cgroup_removed_between_read_and_write_is_vanished() {
    let (_tmp, root) = setup(CgroupVersion::V1, Layout::V1Bfq);
    let dir = container_cgroup(&root, ID, CgroupDriver::Cgroupfs, None).unwrap();
    let wf = WeightFile::open(&dir).unwrap();
    assert_eq!(wf.read().unwrap(), Weight::KERNEL_DEFAULT);
    fs::remove_dir_all(dir.path()).unwrap();
    let err = wf.write_verified(w(500)).unwrap_err();
    assert!(err.is_vanished(), "{err}");
    assert!(wf.read().unwrap_err().is_vanished());
    assert!(!dir.path().exists(), "write must not recreate anything");
    assert!(CounterReader::open(&dir).unwrap_err().is_vanished());
    assert!(WeightFile::open(&dir).unwrap_err().is_vanished());
    assert!(container_cgroup(&root, ID, CgroupDriver::Cgroupfs, None).unwrap_err().is_vanished());
}

#[test]
fn malformed_files_name_file_and_line() {
    let (_tmp, root) = setup(CgroupVersion::V2, Layout::V2Bfq);
    let dir = container_cgroup(&root, ID, CgroupDriver::Cgroupfs, None).unwrap();
    let mut reader = CounterReader::open(&dir).unwrap();
    fs::write(reader.source_file(), b"8:16 rbytes=1 wbytes=2\n8:0 rbytes=oops\n").unwrap();
    match reader.read().unwrap_err() {
        CgroupError::Parse { file, line, text, .. } => {
            assert_eq!(file, dir.path().join("io.stat"));
            assert_eq!(line, 2);
            assert_eq!(text, "8:0 rbytes=oops");
        }
        other => panic!("{other}"),
    }
    fs::write(reader.source_file(), b"8:16 rbytes=\xff\xfe\n").unwrap();
    assert!(matches!(reader.read().unwrap_err(), CgroupError::Parse { line: 1, .. }));

    let wf = WeightFile::open(&dir).unwrap();
    fs::write(wf.path(), "default lots\n").unwrap();
    let err = wf.read().unwrap_err();
    assert!(matches!(err, CgroupError::Parse { line: 1, .. }), "{err}");
    assert!(err.to_string().contains("io.bfq.weight:1"), "{err}");
    fs::write(wf.path(), "").unwrap();
    assert!(matches!(wf.read().unwrap_err(), CgroupError::Parse { line: 0, .. }));
}

#[test]
fn large_counter_files_grow_the_buffer_once() {
    let (_tmp, root) = setup(CgroupVersion::V1, Layout::V1Bfq);
    let dir = container_cgroup(&root, ID, CgroupDriver::Cgroupfs, None).unwrap();
    let mut reader = CounterReader::open(&dir).unwrap();
    let mut text = String::new();
    for minor in 0..500u64 {
        for (op, v) in [("Read", minor), ("Write", 2 * minor), ("Sync", 1), ("Async", 1), ("Discard", 0), ("Total", 9)]
        {
            text.push_str(&format!("8:{minor} {op} {v}\n"));
        }
    }
    text.push_str("Total 0\n");
    assert!(text.len() > 3 * 4096);
    fs::write(reader.source_file(), &text).unwrap();
    let expect = IoCounters::new((0..500).sum(), (0..500).map(|m| 2 * m).sum());
    assert_eq!(reader.read().unwrap(), expect);
    assert_eq!(reader.read().unwrap(), expect);
    fs::write(reader.source_file(), "Total 0\n").unwrap();
    assert_eq!(reader.read().unwrap(), IoCounters::default());
}

#[test]
fn from_dir_needs_a_directory() {
    let tmp = tempfile::tempdir().unwrap();
    assert!(CgroupRoot::from_dir(CgroupVersion::V1, tmp.path().join("nope")).is_err());
    fs::write(tmp.path().join("file"), "").unwrap();
    let err = CgroupRoot::from_dir(CgroupVersion::V1, tmp.path().join("file")).unwrap_err();
    assert!(err.to_string().contains("file"), "{err}");
}

/// A kernel whose weight file someone changes right after each write (the fixture kernel's write, then this).
#[derive(Debug)]
struct Meddled(&'static str);

impl qos_agent::cgroup::CgroupFs for Meddled {
    fn write(&self, path: &Path, data: &[u8]) -> std::io::Result<usize> {
        let n = testbed::fixture::FixtureKernel.write(path, data)?;
        fs::write(path, self.0)?;
        Ok(n)
    }
}

/// Moved from the weight file's unit tests (issue 28: the fixture kernel and the hook between write and read-back
/// left the production write path for the `CgroupFs` seam).
#[test]
fn write_verified_catches_a_change_between_write_and_read_back() {
    let tmp = tempfile::tempdir().unwrap();
    fs::create_dir(tmp.path().join("c")).unwrap();
    fs::write(tmp.path().join("c").join("io.weight"), "default 100\n").unwrap();
    let root = |fs: std::sync::Arc<dyn qos_agent::cgroup::CgroupFs>| {
        CgroupRoot::from_dir(CgroupVersion::V2, tmp.path()).unwrap().with_fs(fs)
    };
    let meddled = root(std::sync::Arc::new(Meddled("default 300\n8:0 700\n")));
    let wf = WeightFile::open(&meddled.resolve_relative("c").unwrap()).unwrap();
    assert_eq!(wf.kind(), WeightFileKind::V2Io);
    match wf.write_verified(w(700)).unwrap_err() {
        CgroupError::Mismatch { path, wrote, read } => {
            assert_eq!(path, wf.path());
            assert_eq!((wrote, read), (700, 300));
        }
        other => panic!("{other}"),
    }
    let kernel = root(std::sync::Arc::new(testbed::fixture::FixtureKernel));
    let wf = WeightFile::open(&kernel.resolve_relative("c").unwrap()).unwrap();
    wf.write_verified(w(700)).unwrap();
    // The fixture stands in for the kernel: `default N` leaves the override alone.
    assert_eq!(fs::read_to_string(wf.path()).unwrap(), "default 700\n8:0 700\n");
}
