//! The disk under test: by default a sparse file on the host disk, attached as a loop device with direct I/O (so
//! reads reach the real disk), BFQ as its scheduler, and an ext4 file system mounted under the work directory.
//! An existing block device (formatted only with `--format`) or an existing directory also works. Every step
//! registers its undo in the [`Cleanup`] stack. The disk that holds `/` is never touched.

use std::collections::BTreeMap;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use anyhow::{bail, Context, Result};
use serde::Serialize;

use crate::cleanup::{Cleanup, Token};
use crate::sys;
use crate::workload::BfqMode;

/// Where the test files go.
#[derive(Debug, Clone)]
pub enum DiskSource {
    /// A new sparse file of `size` bytes in `dir`, attached as a loop device.
    Loop {
        /// Directory for the backing file.
        dir: PathBuf,
        /// Size of the (sparse) backing file.
        size: u64,
    },
    /// An existing, unmounted block device; formatted (ext4) only if `format` is set.
    Device {
        /// e.g. `/dev/sdb`.
        path: PathBuf,
        /// Permission to destroy its contents.
        format: bool,
    },
    /// An existing directory on a block device other than the root disk.
    Dir(PathBuf),
}

/// The prepared disk.
#[derive(Debug, Clone, Serialize)]
pub struct Disk {
    /// `loop`, `device` or `dir`.
    pub kind: &'static str,
    /// The block device the files live on, e.g. `/dev/loop3`.
    pub dev: PathBuf,
    /// The whole disk whose queue carries the scheduler, e.g. `loop3`.
    pub disk_name: String,
    /// `major:minor` of `dev`, as cgroup counter files name devices.
    pub maj_min: String,
    /// Directory holding the test files.
    pub files_dir: PathBuf,
    /// The backing file of a loop device.
    pub backing: Option<PathBuf>,
    /// Size of the device in bytes.
    pub size: u64,
    /// BFQ's `low_latency` before the first mode changed it.
    #[serde(skip)]
    low_latency_base: Arc<Mutex<Option<String>>>,
}

impl Disk {
    fn queue(&self) -> PathBuf {
        Path::new("/sys/block").join(&self.disk_name).join("queue")
    }

    /// Switches BFQ's `strict_guarantees` (and, for [`BfqMode::StrictNoLowLatency`], `low_latency`) for `mode`.
    /// Other modes keep the `low_latency` the device had when the first mode started (after `--bfq-set`).
    pub fn set_mode(&self, mode: BfqMode) -> Result<()> {
        let iosched = self.queue().join("iosched");
        let base = {
            let mut base = self.low_latency_base.lock().unwrap_or_else(|p| p.into_inner());
            if base.is_none() {
                *base = Some(sys::read_trim(&iosched.join("low_latency"))?);
            }
            base.clone().unwrap_or_default()
        };
        let (strict, low_latency) = match mode {
            BfqMode::Default => ("0", base.as_str()),
            BfqMode::Strict => ("1", base.as_str()),
            BfqMode::StrictNoLowLatency => ("1", "0"),
        };
        for (name, value) in [("strict_guarantees", strict), ("low_latency", low_latency)] {
            let file = iosched.join(name);
            sys::write_existing(&file, value)?;
            let back = sys::read_trim(&file)?;
            if back != value {
                bail!("{} reads {back:?} after writing {value:?}", file.display());
            }
        }
        Ok(())
    }

    /// Writes a BFQ tunable given as `KEY=VALUE` and returns its old value (the caller restores it).
    fn write_tunable(&self, assignment: &str) -> Result<(String, String)> {
        let Some((key, value)) = assignment.split_once('=') else {
            bail!("--bfq-set wants KEY=VALUE, got {assignment:?}");
        };
        if key.is_empty() || key.contains('/') || key.contains("..") || key == "strict_guarantees" {
            bail!("--bfq-set {key}: not a tunable the bench lets you set (strict_guarantees comes from --modes)");
        }
        let file = self.queue().join("iosched").join(key);
        let old = sys::read_trim(&file)?;
        sys::write_existing(&file, value)?;
        Ok((key.to_string(), old))
    }

    /// Sets a BFQ tunable (`low_latency=0`, `slice_idle=0`, ...), registering the restore of its old value; run
    /// the returned token to restore it early.
    pub fn set_tunable(&self, assignment: &str, cleanup: &Cleanup) -> Result<Token> {
        let (key, old) = self.write_tunable(assignment)?;
        let f = self.queue().join("iosched").join(&key);
        Ok(cleanup.push(format!("restore {key}={old} on {}", self.disk_name), move || {
            if f.exists() {
                sys::write_existing(&f, &old)?;
            }
            Ok(())
        }))
    }

    /// The active scheduler and every BFQ tunable, for the report.
    pub fn iosched(&self) -> BTreeMap<String, String> {
        let mut out = BTreeMap::new();
        if let Ok(s) = sys::read_trim(&self.queue().join("scheduler")) {
            out.insert("scheduler".into(), s);
        }
        if let Ok(entries) = std::fs::read_dir(self.queue().join("iosched")) {
            for entry in entries.flatten() {
                if let Ok(v) = sys::read_trim(&entry.path()) {
                    out.insert(entry.file_name().to_string_lossy().into_owned(), v);
                }
            }
        }
        for extra in ["nr_requests", "max_sectors_kb", "rotational"] {
            if let Ok(v) = sys::read_trim(&self.queue().join(extra)) {
                out.insert(extra.into(), v);
            }
        }
        out
    }
}

/// Sets up the disk described by `source` under `work` (a directory the caller owns and removes).
pub fn prepare(source: &DiskSource, work: &Path, cleanup: &Cleanup) -> Result<Disk> {
    match source {
        DiskSource::Loop { dir, size } => prepare_loop(dir, *size, work, cleanup),
        DiskSource::Device { path, format } => prepare_device(path, *format, work, cleanup),
        DiskSource::Dir(dir) => prepare_dir(dir, cleanup),
    }
}

fn prepare_loop(dir: &Path, size: u64, work: &Path, cleanup: &Cleanup) -> Result<Disk> {
    let backing = dir.join(format!("ddiskqos-bench-{}.img", std::process::id()));
    let f = std::fs::File::create(&backing).with_context(|| format!("cannot create {}", backing.display()))?;
    let b = backing.clone();
    cleanup.push(format!("remove {}", backing.display()), move || {
        std::fs::remove_file(&b).with_context(|| format!("cannot remove {}", b.display()))
    });
    f.set_len(size).with_context(|| format!("cannot size {} to {size} bytes", backing.display()))?;
    drop(f);
    let backing_str = backing.to_string_lossy().into_owned();
    let dev = sys::run("losetup", &["--find", "--show", "--direct-io=on", &backing_str])?.trim().to_string();
    if dev.is_empty() {
        bail!("losetup printed no device for {backing_str}");
    }
    let d = dev.clone();
    cleanup.push(format!("detach {dev}"), move || detach_loop(&d));
    let dev = PathBuf::from(dev);
    let disk_name = whole_disk_name(&dev)?;
    ensure_not_root_disk(&disk_name)?;
    let dio = sys::read_trim(&Path::new("/sys/block").join(&disk_name).join("loop/dio")).unwrap_or_default();
    if dio != "1" {
        bail!("{} did not enable direct I/O (loop/dio = {dio:?}): reads would hit the page cache", dev.display());
    }
    use_bfq(&disk_name, cleanup)?;
    mkfs(&dev)?;
    let files_dir = mount(&dev, work, cleanup)?;
    Ok(Disk {
        kind: "loop",
        maj_min: maj_min(&dev)?,
        dev,
        disk_name,
        files_dir,
        backing: Some(backing),
        size,
        low_latency_base: Default::default(),
    })
}

fn detach_loop(dev: &str) -> Result<()> {
    // The kernel may still hold the device for a moment after the unmount.
    let mut last = None;
    for _ in 0..20 {
        match sys::run("losetup", &["-d", dev]) {
            Ok(_) => return Ok(()),
            Err(e) => last = Some(e),
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    Err(last.expect("at least one attempt"))
}

fn prepare_device(path: &Path, format: bool, work: &Path, cleanup: &Cleanup) -> Result<Disk> {
    let meta = std::fs::metadata(path).with_context(|| format!("cannot stat {}", path.display()))?;
    if !meta.file_type().is_block_device() {
        bail!("{} is not a block device", path.display());
    }
    let disk_name = whole_disk_name(path)?;
    ensure_not_root_disk(&disk_name)?;
    let canonical = path.canonicalize()?;
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
    if mounts.lines().any(|l| l.split_whitespace().next().map(Path::new) == Some(canonical.as_path())) {
        bail!("{} is mounted; unmount it or pass a directory on it with --dir", path.display());
    }
    if !format {
        bail!(
            "using {} needs --format: the bench creates an ext4 file system on it (destroying its data)",
            path.display()
        );
    }
    use_bfq(&disk_name, cleanup)?;
    mkfs(path)?;
    let files_dir = mount(path, work, cleanup)?;
    let size = sys::run("blockdev", &["--getsize64", &path.to_string_lossy()])?.trim().parse().unwrap_or(0);
    Ok(Disk {
        kind: "device",
        maj_min: maj_min(path)?,
        dev: path.to_path_buf(),
        disk_name,
        files_dir,
        backing: None,
        size,
        low_latency_base: Default::default(),
    })
}

fn prepare_dir(dir: &Path, cleanup: &Cleanup) -> Result<Disk> {
    let st = nix::sys::stat::stat(dir).with_context(|| format!("cannot stat {}", dir.display()))?;
    let (major, minor) = (nix::sys::stat::major(st.st_dev), nix::sys::stat::minor(st.st_dev));
    let sys_dev = PathBuf::from(format!("/sys/dev/block/{major}:{minor}"));
    if !sys_dev.exists() {
        bail!("{} is not on a block device ({major}:{minor}): BFQ weights cannot act there", dir.display());
    }
    let disk_name = disk_of_sysfs(&sys_dev)?;
    ensure_not_root_disk(&disk_name)?;
    use_bfq(&disk_name, cleanup)?;
    let files_dir = dir.join(format!("ddiskqos-bench-{}", std::process::id()));
    std::fs::create_dir(&files_dir).with_context(|| format!("cannot create {}", files_dir.display()))?;
    let f = files_dir.clone();
    cleanup.push(format!("remove {}", files_dir.display()), move || {
        std::fs::remove_dir_all(&f).with_context(|| format!("cannot remove {}", f.display()))
    });
    let name = sys::read_trim(&sys_dev.join("uevent"))?
        .lines()
        .find_map(|l| l.strip_prefix("DEVNAME=").map(str::to_string))
        .unwrap_or_else(|| disk_name.clone());
    Ok(Disk {
        kind: "dir",
        dev: Path::new("/dev").join(name),
        disk_name,
        maj_min: format!("{major}:{minor}"),
        files_dir,
        backing: None,
        size: 0,
        low_latency_base: Default::default(),
    })
}

fn mkfs(dev: &Path) -> Result<()> {
    // No journal (the files are written once, then only read) and eager inode tables: no lazy-init thread
    // writing in the background during the measurements.
    sys::run(
        "mkfs.ext4",
        &[
            "-F",
            "-q",
            "-O",
            "^has_journal",
            "-T",
            "largefile4",
            "-m",
            "0",
            "-E",
            "lazy_itable_init=0",
            &dev.to_string_lossy(),
        ],
    )?;
    Ok(())
}

fn mount(dev: &Path, work: &Path, cleanup: &Cleanup) -> Result<PathBuf> {
    let mnt = work.join("mnt");
    std::fs::create_dir_all(&mnt).with_context(|| format!("cannot create {}", mnt.display()))?;
    sys::run("mount", &["-o", "noatime", &dev.to_string_lossy(), &mnt.to_string_lossy()])?;
    let m = mnt.clone();
    cleanup.push(format!("unmount {}", mnt.display()), move || unmount(&m));
    Ok(mnt)
}

fn unmount(mnt: &Path) -> Result<()> {
    let m = mnt.to_string_lossy();
    for _ in 0..20 {
        if sys::run("umount", &[&m]).is_ok() {
            return Ok(());
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    // Still busy (a straggler process): detach it lazily so the loop device can go.
    sys::run("umount", &["-l", &m]).map(|_| ())
}

/// `major:minor` of a block device node.
pub fn maj_min(dev: &Path) -> Result<String> {
    let st = nix::sys::stat::stat(dev).with_context(|| format!("cannot stat {}", dev.display()))?;
    Ok(format!("{}:{}", nix::sys::stat::major(st.st_rdev), nix::sys::stat::minor(st.st_rdev)))
}

/// The whole disk (the one with a scheduler) of a block device node: `sda` for `/dev/sda2`, `loop3` for itself.
fn whole_disk_name(dev: &Path) -> Result<String> {
    let st = nix::sys::stat::stat(dev).with_context(|| format!("cannot stat {}", dev.display()))?;
    let sys_dev = format!("/sys/dev/block/{}:{}", nix::sys::stat::major(st.st_rdev), nix::sys::stat::minor(st.st_rdev));
    disk_of_sysfs(Path::new(&sys_dev))
}

/// Resolves `/sys/dev/block/M:m` to the name of its whole disk.
fn disk_of_sysfs(sys_dev: &Path) -> Result<String> {
    let real = sys_dev.canonicalize().with_context(|| format!("cannot resolve {}", sys_dev.display()))?;
    let node = if real.join("partition").exists() { real.parent().map(Path::to_path_buf) } else { Some(real.clone()) };
    let name = node
        .and_then(|n| n.file_name().map(|s| s.to_string_lossy().into_owned()))
        .with_context(|| format!("no disk name in {}", real.display()))?;
    if !Path::new("/sys/block").join(&name).join("queue").exists() {
        bail!("{name} has no request queue (device-mapper or similar?): pick a plain disk or the loop device");
    }
    Ok(name)
}

/// The disk holding `/`, if `/` is on a block device.
pub fn root_disk() -> Option<String> {
    let st = nix::sys::stat::stat("/").ok()?;
    let sys_dev = format!("/sys/dev/block/{}:{}", nix::sys::stat::major(st.st_dev), nix::sys::stat::minor(st.st_dev));
    disk_of_sysfs(Path::new(&sys_dev)).ok()
}

/// Refuses to touch the root disk.
pub fn ensure_not_root_disk(disk_name: &str) -> Result<()> {
    if root_disk().as_deref() == Some(disk_name) {
        bail!(
            "{disk_name} holds the root file system: the bench never changes its scheduler \
             (use the default loop device)"
        );
    }
    Ok(())
}

/// Parses the scheduler file (`none mq-deadline [bfq]`) into (available, active).
pub fn parse_scheduler(text: &str) -> (Vec<String>, Option<String>) {
    let mut available = Vec::new();
    let mut active = None;
    for word in text.split_whitespace() {
        if let Some(name) = word.strip_prefix('[').and_then(|w| w.strip_suffix(']')) {
            active = Some(name.to_string());
            available.push(name.to_string());
        } else {
            available.push(word.to_string());
        }
    }
    (available, active)
}

/// Makes BFQ the scheduler of `disk_name`, registering the restore of the previous scheduler and tunables.
fn use_bfq(disk_name: &str, cleanup: &Cleanup) -> Result<()> {
    let queue = Path::new("/sys/block").join(disk_name).join("queue");
    let sched_file = queue.join("scheduler");
    let (available, active) = parse_scheduler(&sys::read_trim(&sched_file)?);
    if !available.iter().any(|s| s == "bfq") {
        // BFQ may be a module that is not loaded yet.
        let _ = sys::run("modprobe", &["bfq"]);
    }
    if active.as_deref() != Some("bfq") {
        sys::write_existing(&sched_file, "bfq")?;
        let (_, now) = parse_scheduler(&sys::read_trim(&sched_file)?);
        if now.as_deref() != Some("bfq") {
            bail!("{} did not switch to bfq (active: {now:?})", sched_file.display());
        }
        let old = active.unwrap_or_else(|| "none".into());
        let f = sched_file.clone();
        cleanup.push(format!("restore scheduler {old} on {disk_name}"), move || {
            if f.exists() {
                sys::write_existing(&f, &old)?;
            }
            Ok(())
        });
    }
    // BFQ may have been active already (a device we did not create): put back the tunables the modes change.
    for name in ["strict_guarantees", "low_latency"] {
        let file = queue.join("iosched").join(name);
        let old = sys::read_trim(&file)?;
        cleanup.push(format!("restore {name}={old} on {disk_name}"), move || {
            if file.exists() {
                sys::write_existing(&file, &old)?;
            }
            Ok(())
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scheduler_parsing() {
        let (avail, active) = parse_scheduler("none [mq-deadline] kyber bfq\n");
        assert_eq!(avail, vec!["none", "mq-deadline", "kyber", "bfq"]);
        assert_eq!(active.as_deref(), Some("mq-deadline"));
        assert_eq!(parse_scheduler("none").1, None);
    }

    #[test]
    fn root_disk_is_refused() {
        if let Some(root) = root_disk() {
            let err = ensure_not_root_disk(&root).unwrap_err().to_string();
            assert!(err.contains("root file system"), "{err}");
        }
        ensure_not_root_disk("definitely-not-a-disk").unwrap();
    }

    #[test]
    fn a_directory_on_the_root_disk_is_refused() {
        // /tmp is on the root disk on the test machines; elsewhere (tmpfs) it is not a block device at all.
        let dir = tempfile::tempdir().unwrap();
        let stack = Cleanup::new();
        assert!(prepare(&DiskSource::Dir(dir.path().to_path_buf()), dir.path(), &stack).is_err());
        assert_eq!(stack.pending(), 0, "nothing may be registered when refusing");
    }

    #[test]
    fn a_device_needs_format_permission() {
        let stack = Cleanup::new();
        let err = prepare(&DiskSource::Device { path: "/dev/null".into(), format: false }, Path::new("/tmp"), &stack);
        assert!(err.unwrap_err().to_string().contains("not a block device"));
    }
}
