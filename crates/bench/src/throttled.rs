//! The throttled disk (`--disk throttled`, the default): a disk image in a private tmpfs, served by
//! `qemu-storage-daemon` through its throttle filter (bytes/s and IOPS, the model of the project's cgroup-v2 guest
//! disk, `scripts/guest.sh`'s `ssd`) and exported as a file over FUSE; [`crate::disk`] attaches that file as a loop
//! device with direct I/O, selects BFQ, makes the file system and mounts it.
//!
//! Why: the old loop device's backing file is on the machine's root disk, which also carries Docker's data; a
//! background reader saturating it stalls `docker start` (issue 26), and its speed is whatever the cloud host gives.
//! Here no read or write reaches the root disk, and the throttle is the one bottleneck the scheduler must share.
//!
//! What a read costs, from the top: the loop device issues direct I/O (no page cache of the export file: the kernel
//! sends each request to the FUSE server as it comes), qemu-storage-daemon's throttle group delays it to the model's
//! rate (a leaky bucket; qemu lets an idle device burst a tenth of a second's worth, as on the guest disk), then
//! reads or writes the image in tmpfs, which is memory: the throttle, not the medium, sets the device's speed.
//!
//! Only reads go through qemu: Debian 12's qemu-storage-daemon (7.2) corrupts writes through its FUSE export when
//! requests overlap (a write waiting in the throttle lets the next request overwrite its buffer: seen as fio verify
//! errors and an ext4 that does not mount). So the image is formatted and filled first through a plain loop device
//! on the tmpfs file ([`crate::disk`]), then exported read-only (`writable=off`), attached read-only and mounted
//! read-only for the measurements, which only read.
//!
//! This module holds the pure parts (the model, the image's size, the memory check, the daemon's command line) and
//! the daemon's life cycle; every step registers its undo in the [`Cleanup`] stack.

use std::fmt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use crate::cleanup::Cleanup;
use crate::sys;

/// The program serving the image.
pub const DAEMON: &str = "qemu-storage-daemon";
/// The Debian package that ships [`DAEMON`] (`dpkg -S /usr/bin/qemu-storage-daemon`).
pub const DAEMON_PACKAGE: &str = "qemu-system-common";
/// The guest disk's model (`scripts/guest.sh`, `ssd`): 150 MiB/s.
pub const DEFAULT_BPS: u64 = 150 * 1024 * 1024;
/// The guest disk's model (`scripts/guest.sh`, `ssd`): 1500 IOPS.
pub const DEFAULT_IOPS: u64 = 1500;
/// Memory left to everything else (Docker, the bench, the agent, page cache) when the image is in RAM.
pub const MEMORY_RESERVE: u64 = 1 << 30;
/// What the device is, in words, for the report.
pub const DESCRIPTION: &str = "tmpfs image behind qemu-storage-daemon's throttle over FUSE";

const MIB: u64 = 1024 * 1024;
/// How long the daemon gets to mount its export, and to stop and unmount it.
const DAEMON_PATIENCE: Duration = Duration::from_secs(10);

/// The device model: qemu's throttle group limits (`x-bps-total`, `x-iops-total`), reads and writes together.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ThrottleModel {
    /// Bytes per second.
    pub bytes_per_sec: u64,
    /// I/O requests per second.
    pub iops: u64,
}

impl Default for ThrottleModel {
    fn default() -> Self {
        Self { bytes_per_sec: DEFAULT_BPS, iops: DEFAULT_IOPS }
    }
}

impl ThrottleModel {
    /// The model from `--disk-bps` and `--disk-iops` (the guest disk's values where absent), checked.
    pub fn new(bytes_per_sec: Option<u64>, iops: Option<u64>) -> Result<Self> {
        let model = Self { bytes_per_sec: bytes_per_sec.unwrap_or(DEFAULT_BPS), iops: iops.unwrap_or(DEFAULT_IOPS) };
        if !(MIB..=100 * 1024 * MIB).contains(&model.bytes_per_sec) {
            bail!("--disk-bps must be 1 MiB/s (1048576) to 100 GiB/s, got {}", model.bytes_per_sec);
        }
        if !(10..=10_000_000).contains(&model.iops) {
            bail!("--disk-iops must be 10 to 10000000, got {}", model.iops);
        }
        Ok(model)
    }
}

impl fmt::Display for ThrottleModel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:.0} MiB/s ({} B/s) and {} IOPS, reads and writes together: {DESCRIPTION}",
            self.bytes_per_sec as f64 / MIB as f64,
            self.bytes_per_sec,
            self.iops
        )
    }
}

/// Size of the image for `files_mib` of files: 10 % and 256 MiB spare for ext4's own blocks, in whole 64 MiB.
pub fn image_size(files_mib: u64) -> u64 {
    let mib = files_mib + files_mib / 10 + 256;
    mib.div_ceil(64) * 64 * MIB
}

/// Size of the tmpfs holding an image of `image` bytes (and the export's empty mount point): the image and 16 MiB.
/// The RAM it takes is what has been written to the image, at most this.
pub fn tmpfs_size(image: u64) -> u64 {
    image + 16 * MIB
}

/// `MemAvailable` of `/proc/meminfo`, in bytes.
pub fn parse_mem_available(meminfo: &str) -> Result<u64> {
    let line =
        meminfo.lines().find(|l| l.starts_with("MemAvailable:")).context("/proc/meminfo has no MemAvailable line")?;
    let mut words = line.split_whitespace().skip(1);
    let (Some(kib), Some("kB")) = (words.next(), words.next()) else {
        bail!("/proc/meminfo: cannot read {line:?} (expected `MemAvailable: N kB`)");
    };
    let kib: u64 = kib.parse().with_context(|| format!("/proc/meminfo: {line:?}"))?;
    Ok(kib * 1024)
}

/// Fails unless `available` bytes of memory hold a tmpfs of `tmpfs` bytes and leave [`MEMORY_RESERVE`].
pub fn ensure_memory(tmpfs: u64, available: u64) -> Result<()> {
    if available < tmpfs + MEMORY_RESERVE {
        bail!(
            "--disk throttled keeps its disk image in RAM (a tmpfs of up to {} MiB) and leaves {} MiB to the rest, \
             but MemAvailable is {} MiB: use --disk loop, or fewer/smaller files (--bg-size-mib, --sizes)",
            tmpfs / MIB,
            MEMORY_RESERVE / MIB,
            available / MIB
        );
    }
    Ok(())
}

/// A path as one value of a qemu option list (`key=value,...`): commas doubled.
fn qemu_value(path: &Path) -> Result<String> {
    let s = path.to_str().with_context(|| format!("{} is not UTF-8: qemu cannot be given it", path.display()))?;
    Ok(s.replace(',', ",,"))
}

/// The arguments of [`DAEMON`]: the image `backing` (a raw file) behind a throttle group of `model`, exported
/// read-only over FUSE on the existing regular file `export`.
pub fn daemon_args(model: &ThrottleModel, backing: &Path, export: &Path) -> Result<Vec<String>> {
    Ok(vec![
        "--object".into(),
        format!("throttle-group,id=tg0,x-bps-total={},x-iops-total={}", model.bytes_per_sec, model.iops),
        // The image is in tmpfs (memory): the throttle above it is the device's only bottleneck. tmpfs has no
        // O_DIRECT, hence cache.direct=off.
        "--blockdev".into(),
        format!("driver=file,node-name=file0,filename={},aio=threads,cache.direct=off", qemu_value(backing)?),
        "--blockdev".into(),
        "driver=throttle,node-name=thr0,throttle-group=tg0,file=file0".into(),
        "--export".into(),
        format!("type=fuse,id=exp0,node-name=thr0,mountpoint={},writable=off", qemu_value(export)?),
    ])
}

/// Fails, naming what to install or load, unless the daemon and FUSE are there.
pub fn ensure_possible() -> Result<()> {
    if !sys::have(DAEMON) {
        bail!(
            "--disk throttled needs {DAEMON} on PATH (Debian package {DAEMON_PACKAGE}: `apt-get install \
             {DAEMON_PACKAGE}`, or scripts/setup-host.sh); or use --disk loop"
        );
    }
    let fuse = Path::new("/dev/fuse");
    if !fuse.exists() {
        let _ = sys::run("modprobe", &["fuse"]);
        if !fuse.exists() {
            bail!(
                "--disk throttled needs FUSE: {} is missing (modprobe fuse failed); or use --disk loop",
                fuse.display()
            );
        }
    }
    Ok(())
}

/// The image made by [`make_image`].
#[derive(Debug, Clone)]
pub struct Image {
    /// The image file in tmpfs.
    pub path: PathBuf,
    /// The tmpfs mount point (`dir/throttled-disk`).
    pub dir: PathBuf,
}

/// The image served by a running daemon.
#[derive(Debug, Clone)]
pub struct Served {
    /// The FUSE export: the file to attach as a loop device.
    pub export: PathBuf,
    /// The daemon's process id.
    pub daemon_pid: u32,
}

/// Mounts a private tmpfs at `dir/throttled-disk` (after checking that the daemon, FUSE and the memory are there)
/// and creates a sparse image of `size` bytes in it. Undo actions: remove the directory, unmount the tmpfs.
pub fn make_image(dir: &Path, size: u64, cleanup: &Cleanup) -> Result<Image> {
    ensure_possible()?;
    let tmpfs = tmpfs_size(size);
    let meminfo = std::fs::read_to_string("/proc/meminfo").context("cannot read /proc/meminfo")?;
    ensure_memory(tmpfs, parse_mem_available(&meminfo)?)?;

    let mnt = dir.join("throttled-disk");
    std::fs::create_dir(&mnt).with_context(|| format!("cannot create {}", mnt.display()))?;
    let m = mnt.clone();
    cleanup.push(format!("remove {}", mnt.display()), move || {
        std::fs::remove_dir(&m).with_context(|| format!("cannot remove {}", m.display()))
    });
    let m = mnt.to_string_lossy().into_owned();
    sys::run("mount", &["-t", "tmpfs", "-o", &format!("size={tmpfs},mode=0700"), "tmpfs", &m])?;
    let mp = mnt.clone();
    cleanup.push(format!("unmount the tmpfs {}", mnt.display()), move || sys::unmount(&mp));

    let image = mnt.join("image.raw");
    let f = std::fs::File::create(&image).with_context(|| format!("cannot create {}", image.display()))?;
    f.set_len(size).with_context(|| format!("cannot size {} to {size} bytes", image.display()))?;
    Ok(Image { path: image, dir: mnt })
}

/// Starts [`DAEMON`] serving `image` read-only through `model`'s throttle on a FUSE export (`export.img` beside
/// it); returns once the export is mounted. Its log goes to `log_dir`. Undo action: stop the daemon and wait for
/// the export's unmount.
pub fn serve(image: &Image, model: &ThrottleModel, log_dir: &Path, cleanup: &Cleanup) -> Result<Served> {
    let export = image.dir.join("export.img");
    std::fs::File::create(&export).with_context(|| format!("cannot create {}", export.display()))?;
    let log = log_dir.join("qemu-storage-daemon.log");
    let log_file = std::fs::File::create(&log).with_context(|| format!("cannot create {}", log.display()))?;
    let args = daemon_args(model, &image.path, &export)?;
    let child = {
        use std::os::unix::process::CommandExt;
        Command::new(DAEMON)
            .args(&args)
            .stdin(Stdio::null())
            .stdout(log_file.try_clone().with_context(|| format!("cannot reopen {}", log.display()))?)
            .stderr(log_file)
            // Its own process group: a Ctrl-C at the terminal reaches the bench only, whose cleanup stops the
            // daemon after the loop device is gone.
            .process_group(0)
            .spawn()
            .with_context(|| format!("cannot start {DAEMON} {}", args.join(" ")))?
    };
    let daemon_pid = child.id();
    let child = Arc::new(Mutex::new(child));
    let (c, e) = (child.clone(), export.clone());
    cleanup.push(
        format!("stop {DAEMON} (pid {daemon_pid}) and wait for the unmount of {}", export.display()),
        move || stop_daemon(&mut c.lock().unwrap_or_else(|p| p.into_inner()), &e),
    );
    wait_for_export(&child, &export, &log)?;
    Ok(Served { export, daemon_pid })
}

/// Waits until `export` is a FUSE mount; fails with the daemon's log if it exits or takes too long.
fn wait_for_export(child: &Mutex<Child>, export: &Path, log: &Path) -> Result<()> {
    let limit = sys::patience(DAEMON_PATIENCE);
    let t0 = Instant::now();
    loop {
        if is_mounted(export, Some("fuse"))? {
            return Ok(());
        }
        let log_text = || std::fs::read_to_string(log).unwrap_or_default().trim().to_string();
        if let Some(status) = child.lock().unwrap_or_else(|p| p.into_inner()).try_wait()? {
            bail!("{DAEMON} exited ({status}) before mounting its export {}: {}", export.display(), log_text());
        }
        if t0.elapsed() > limit {
            bail!("{DAEMON} did not mount its export {} within {limit:?}: {}", export.display(), log_text());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Stops the daemon (SIGTERM: it unmounts its export and exits; SIGKILL if it does not within the patience) and
/// makes sure the export is unmounted.
fn stop_daemon(child: &mut Child, export: &Path) -> Result<()> {
    use nix::sys::signal::{kill, Signal};
    use nix::unistd::Pid;
    let limit = sys::patience(DAEMON_PATIENCE);
    let pid = child.id();
    if child.try_wait()?.is_none() {
        let _ = kill(Pid::from_raw(pid as i32), Signal::SIGTERM);
        let t0 = Instant::now();
        while child.try_wait()?.is_none() {
            if t0.elapsed() > limit {
                eprintln!("{DAEMON} (pid {pid}) did not stop within {limit:?} of SIGTERM: killing it");
                child.kill().with_context(|| format!("cannot kill {DAEMON} (pid {pid})"))?;
                child.wait()?;
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    // A daemon that stopped cleanly has unmounted the export; a killed one leaves a dead FUSE mount behind.
    let t0 = Instant::now();
    while is_mounted(export, None)? {
        if t0.elapsed() > limit {
            eprintln!("{} still mounted after {DAEMON} exited: unmounting it", export.display());
            return sys::unmount(export);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// Whether `path` is a mount point in this process's mount table (of file system type `fstype`, if given).
pub fn is_mounted(path: &Path, fstype: Option<&str>) -> Result<bool> {
    let table = std::fs::read_to_string("/proc/self/mounts").context("cannot read /proc/self/mounts")?;
    let found = mounts_at(&table, path).any(|t| fstype.is_none_or(|want| t == want));
    Ok(found)
}

/// The file system types mounted at `path` in a `/proc/mounts` text (whose fields escape space, tab, newline and
/// backslash as octal).
fn mounts_at<'a>(table: &'a str, path: &'a Path) -> impl Iterator<Item = &'a str> + 'a {
    table.lines().filter_map(move |line| {
        let mut fields = line.split(' ');
        let (_source, target, fstype) = (fields.next()?, fields.next()?, fields.next()?);
        (Path::new(&unescape_octal(target)) == path).then_some(fstype)
    })
}

fn unescape_octal(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find('\\') {
        out.push_str(&rest[..i]);
        let code = rest.get(i + 1..i + 4).and_then(|d| u8::from_str_radix(d, 8).ok());
        match code {
            Some(c) => {
                out.push(char::from(c));
                rest = &rest[i + 4..];
            }
            None => {
                out.push('\\');
                rest = &rest[i + 1..];
            }
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_model_defaults_to_the_guest_disk_and_checks_its_range() {
        let m = ThrottleModel::new(None, None).unwrap();
        // scripts/guest.sh: throttling.bps-total=157286400, throttling.iops-total=1500.
        assert_eq!(m, ThrottleModel { bytes_per_sec: 157_286_400, iops: 1500 });
        assert_eq!(m, ThrottleModel::default());
        assert_eq!(ThrottleModel::new(Some(200 * MIB), Some(3000)).unwrap().iops, 3000);
        let err = ThrottleModel::new(Some(1000), None).unwrap_err().to_string();
        assert!(err.contains("--disk-bps") && err.contains("1000"), "{err}");
        let err = ThrottleModel::new(None, Some(0)).unwrap_err().to_string();
        assert!(err.contains("--disk-iops") && err.contains("got 0"), "{err}");
        let text = m.to_string();
        assert!(text.starts_with("150 MiB/s (157286400 B/s) and 1500 IOPS"), "{text}");
        assert!(text.contains(DESCRIPTION), "{text}");
    }

    #[test]
    fn the_image_holds_the_files_and_ext4_with_margin() {
        // The main job's quick plan with the default background: 2048 MiB and 1+10+100 MiB and Experiment 2's files.
        assert_eq!(image_size(0), 256 * MIB);
        assert_eq!(image_size(64), 384 * MIB); // 64 + 6 + 256 = 326 -> 384
        let files = 2048 + 111 + 200;
        let image = image_size(files);
        assert!(image >= (files + files / 10 + 256) * MIB && image % (64 * MIB) == 0, "{image}");
        assert!(image < (files + files / 10 + 256 + 64) * MIB, "no more than one 64 MiB step of rounding: {image}");
        assert_eq!(tmpfs_size(image), image + 16 * MIB);
    }

    #[test]
    fn memory_is_read_from_meminfo_and_a_short_machine_is_refused() {
        let meminfo = "MemTotal:       24000000 kB\nMemFree:        1000 kB\nMemAvailable:   2097152 kB\n";
        assert_eq!(parse_mem_available(meminfo).unwrap(), 2 << 30);
        assert!(parse_mem_available("MemTotal: 1 kB\n").unwrap_err().to_string().contains("no MemAvailable"));
        assert!(parse_mem_available("MemAvailable: many kB\n").is_err());
        assert!(parse_mem_available("MemAvailable: 12\n").unwrap_err().to_string().contains("expected"));
        ensure_memory(1 << 30, 2 << 30).unwrap();
        let err = ensure_memory(3 << 30, 2 << 30).unwrap_err().to_string();
        assert!(
            err.contains("up to 3072 MiB") && err.contains("MemAvailable is 2048 MiB") && err.contains("--disk loop"),
            "{err}"
        );
    }

    #[test]
    fn the_daemon_command_line_throttles_the_tmpfs_image_and_exports_it_over_fuse() {
        let model = ThrottleModel { bytes_per_sec: 157_286_400, iops: 1500 };
        let args = daemon_args(&model, Path::new("/w/t/image.raw"), Path::new("/w/t/export.img")).unwrap();
        assert_eq!(
            args,
            vec![
                "--object",
                "throttle-group,id=tg0,x-bps-total=157286400,x-iops-total=1500",
                "--blockdev",
                "driver=file,node-name=file0,filename=/w/t/image.raw,aio=threads,cache.direct=off",
                "--blockdev",
                "driver=throttle,node-name=thr0,throttle-group=tg0,file=file0",
                "--export",
                "type=fuse,id=exp0,node-name=thr0,mountpoint=/w/t/export.img,writable=off",
            ]
        );
        // A comma in a path would end qemu's value: doubled.
        let odd = daemon_args(&model, Path::new("/a,b/image.raw"), Path::new("/a,b/export.img")).unwrap();
        assert!(odd[3].contains("filename=/a,,b/image.raw,aio"), "{}", odd[3]);
        assert!(odd[7].contains("mountpoint=/a,,b/export.img,writable"), "{}", odd[7]);
    }

    #[test]
    fn mount_table_paths_are_unescaped() {
        let table = "tmpfs /tmp/w\\040x/throttled-disk tmpfs rw 0 0\n\
                     /dev/fuse /tmp/w\\040x/throttled-disk/export.img fuse rw,allow_other 0 0\n";
        let export = Path::new("/tmp/w x/throttled-disk/export.img");
        assert_eq!(mounts_at(table, export).collect::<Vec<_>>(), vec!["fuse"]);
        assert_eq!(mounts_at(table, Path::new("/tmp/w x/throttled-disk")).collect::<Vec<_>>(), vec!["tmpfs"]);
        assert_eq!(mounts_at(table, Path::new("/tmp/w")).count(), 0);
        assert_eq!(unescape_octal("a\\134b\\011c\\x"), "a\\b\tc\\x");
    }
}
