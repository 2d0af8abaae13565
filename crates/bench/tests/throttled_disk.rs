//! The default disk of the bench for real: `ddiskqos-bench hold-disk --disk throttled` prepares the tmpfs image,
//! qemu-storage-daemon's throttled FUSE export, the read-only loop device with direct I/O, BFQ and the mount; the
//! test reads the device with O_DIRECT to see the throttle act, interrupts the bench as Ctrl-C would, and checks
//! that nothing is left. Needs root, loop devices, BFQ and qemu-storage-daemon, so it is ignored by default
//! (`./scripts/test.sh` runs it with `--include-ignored`); where it cannot run it prints `SKIPPED` and passes, except
//! in CI (`CI=true` or `DDISKQOS_REQUIRE_REAL=1`), where it fails.

use std::io::{BufRead, BufReader, Read};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use testbed::{require, Need};

const BIN: &str = env!("CARGO_BIN_EXE_ddiskqos-bench");
const MIB: usize = 1024 * 1024;
/// The guest disk's model, the throttled disk's default: 150 MiB/s.
const BPS: u64 = 157_286_400;

/// Reads `mib` MiB from the start of `dev` with O_DIRECT in 1 MiB requests; returns how long it took.
fn read_direct(dev: &Path, mib: usize) -> Duration {
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(dev)
        .unwrap_or_else(|e| panic!("open {} with O_DIRECT: {e}", dev.display()));
    // O_DIRECT wants an aligned buffer: a 4 KiB-aligned window of a larger allocation.
    let mut storage = vec![0u8; MIB + 4096];
    let skip = storage.as_ptr().align_offset(4096);
    let buf = &mut storage[skip..skip + MIB];
    let t0 = Instant::now();
    for i in 0..mib {
        f.read_exact(buf).unwrap_or_else(|e| panic!("O_DIRECT read of MiB {i} of {}: {e}", dev.display()));
    }
    t0.elapsed()
}

fn process_name(pid: u64) -> Option<String> {
    std::fs::read_to_string(format!("/proc/{pid}/comm")).ok().map(|s| s.trim().to_string())
}

#[test]
#[ignore = "needs root, loop devices, BFQ and qemu-storage-daemon: run ./scripts/test.sh"]
fn throttled_disk_is_throttled_and_leaves_nothing_behind() {
    let needs = [
        Need::Root,
        Need::LoopDevices,
        Need::Bfq,
        Need::Program("qemu-storage-daemon"),
        Need::Program("mkfs.ext4"),
        Need::Program("mount"),
    ];
    if !require("throttled_disk_is_throttled_and_leaves_nothing_behind", &needs) {
        return;
    }
    let _machine = testbed::exclusive();
    let work = tempfile::tempdir_in("/var/tmp").expect("work dir");
    let mut child = Command::new(BIN)
        .args(["hold-disk", "--disk", "throttled", "--size-mib", "64", "--work-dir"])
        .arg(work.path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start ddiskqos-bench hold-disk");
    let pid = child.id();
    let tag = format!("ddiskqos-bench-{pid}");

    // The disk's description, one line, once it is ready.
    let stdout = child.stdout.take().expect("stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(stdout).read_line(&mut line);
        let _ = tx.send(line);
    });
    let line = rx.recv_timeout(Duration::from_secs(60)).unwrap_or_default();
    let held: Value = match serde_json::from_str(&line) {
        Ok(v) => v,
        Err(e) => {
            let _ = child.kill();
            let out = child.wait_with_output().expect("output");
            panic!("no disk description ({e}): {line:?}\nstderr:\n{}", String::from_utf8_lossy(&out.stderr));
        }
    };
    let disk = &held["disk"];
    let dev = Path::new(disk["dev"].as_str().expect("disk.dev"));
    let name = disk["disk_name"].as_str().expect("disk.disk_name");
    let files_dir = disk["files_dir"].as_str().expect("disk.files_dir");
    let daemon = held["daemon_pid"].as_u64().expect("daemon_pid");
    assert_eq!(disk["kind"], "throttled", "{held}");
    assert_eq!(disk["model"]["bytes_per_sec"], BPS, "{held}");
    assert_eq!(disk["model"]["iops"], 1500, "{held}");
    assert!(disk["backing"].as_str().is_some_and(|b| b.contains(&tag)), "the export is in the work dir: {held}");
    let sys = Path::new("/sys/block").join(name);
    let dio = std::fs::read_to_string(sys.join("loop/dio")).expect("loop/dio");
    assert_eq!(dio.trim(), "1", "{name}: the loop device reads the export with direct I/O");
    let sched = std::fs::read_to_string(sys.join("queue/scheduler")).expect("scheduler");
    assert!(sched.contains("[bfq]"), "{name}: scheduler {sched:?}");
    let mounts = std::fs::read_to_string("/proc/mounts").expect("/proc/mounts");
    let mount = mounts.lines().find(|l| l.split(' ').nth(1) == Some(files_dir));
    assert!(mount.is_some_and(|l| l.contains(" ext4 ro,")), "{files_dir} mounted read-only: {mount:?}");
    let export = mounts.lines().find(|l| l.contains(&tag) && l.contains(" fuse "));
    assert!(export.is_some(), "the FUSE export is mounted:\n{mounts}");
    assert!(process_name(daemon).is_some_and(|n| n.starts_with("qemu-storage")), "daemon pid {daemon}");

    // qemu lets an idle device burst a tenth of a second's worth (15 MiB): spent first, so the timed read sees the
    // model's rate. 64 MiB at 150 MiB/s take 0.43 s; the tmpfs behind the throttle serves them in a few ms.
    read_direct(dev, 16);
    let took = read_direct(dev, 64);
    println!("64 MiB O_DIRECT from {} in {took:?} ({:.0} MiB/s)", dev.display(), 64.0 / took.as_secs_f64());
    assert!(took >= Duration::from_millis(350), "64 MiB in {took:?}: faster than the 150 MiB/s throttle allows");

    // Ctrl-C, as a user would: the bench's cleanup runs and it exits with 130.
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), nix::sys::signal::SIGINT).expect("SIGINT");
    let t0 = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if t0.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            panic!("hold-disk did not exit within 60 s of SIGINT");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut stderr = String::new();
    child.stderr.take().expect("stderr").read_to_string(&mut stderr).expect("stderr");
    assert_eq!(status.code(), Some(130), "exit after SIGINT; stderr:\n{stderr}");
    assert!(!stderr.contains("cleanup:"), "a cleanup action failed:\n{stderr}");

    let mut left = Vec::new();
    let loops = Command::new("losetup").arg("-a").output().expect("losetup -a");
    left.extend(
        String::from_utf8_lossy(&loops.stdout).lines().filter(|l| l.contains(&tag)).map(|l| format!("loop {l}")),
    );
    let mounts = std::fs::read_to_string("/proc/mounts").expect("/proc/mounts");
    left.extend(mounts.lines().filter(|l| l.contains(&tag)).map(|l| format!("mount {l}")));
    if let Some(name) = process_name(daemon).filter(|n| n.starts_with("qemu-storage")) {
        left.push(format!("process {daemon} ({name})"));
    }
    let dir = work.path().join(&tag);
    if dir.exists() {
        left.push(format!("work dir {}", dir.display()));
    }
    assert!(left.is_empty(), "left behind: {left:#?}\nstderr:\n{stderr}");
}
