//! The disk under test: by default (`--disk throttled`) a throttled device that does not touch the root disk: an
//! image in a private tmpfs served by qemu-storage-daemon's throttle over FUSE ([`crate::throttled`]); or
//! (`--disk loop`) a sparse file on the host disk. Either is attached as a loop device with direct I/O (so reads
//! reach the device below, not the page cache), BFQ as its scheduler, and an ext4 file system mounted under the
//! work directory. An existing block device (formatted only with `--format`) or an existing directory also works.
//! Every step registers its undo in the [`Cleanup`] stack.
//!
//! Device facts and the writes to a device's queue come from the agent's library (`qos_agent::blockdev`): which
//! disk a node or a path is on, its scheduler, the guarded scheduler switch and BFQ tunable writes (allowed for the
//! test disk only; the disk backing `/` is always refused). What stays here is the bench's own: the sparse file,
//! losetup, mkfs, mount and the undo stack.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use qos_agent::blockdev::{self, iocost, DevNum};
use qos_agent::cgroup::{CgroupRoot, CgroupVersion};
use serde::{Deserialize, Serialize};

use crate::cleanup::{Cleanup, Token};
use crate::sys;
use crate::throttled::{self, ThrottleModel};
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
    /// An image of `size` bytes in a private tmpfs under `dir`, served through `model`'s throttle by
    /// qemu-storage-daemon over FUSE, attached as a loop device.
    Throttled {
        /// Directory where the tmpfs is mounted (and the daemon's log goes).
        dir: PathBuf,
        /// Size of the image.
        size: u64,
        /// The throttle: bytes/s and IOPS.
        model: ThrottleModel,
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

/// The disk as the report records it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiskInfo {
    /// `throttled`, `loop`, `device` or `dir`.
    pub kind: String,
    /// The block device the files live on, e.g. `/dev/loop3`.
    pub dev: PathBuf,
    /// The whole disk whose queue carries the scheduler, e.g. `loop3`.
    pub disk_name: String,
    /// `major:minor` of `dev`, as cgroup counter files name devices.
    pub maj_min: String,
    /// Directory holding the test files.
    pub files_dir: PathBuf,
    /// The backing file of a loop device (of a throttled disk: the FUSE export).
    pub backing: Option<PathBuf>,
    /// Size of the device in bytes.
    pub size: u64,
    /// The device model of a throttled disk (absent in results before 2026-11-27).
    #[serde(default)]
    pub model: Option<ThrottleModel>,
}

impl DiskInfo {
    /// What the disk is, in words, for the logs and the report.
    pub fn describe(&self) -> String {
        let what = match (&self.model, &self.backing) {
            (Some(model), _) => model.to_string(),
            (None, Some(backing)) => format!("sparse file {}", backing.display()),
            (None, None) => String::new(),
        };
        format!("{} {} ({what})", self.kind, self.dev.display())
    }
}

/// The prepared disk.
#[derive(Debug, Clone)]
pub struct Disk {
    /// What the report records.
    pub info: DiskInfo,
    /// BFQ's `low_latency` before the first mode changed it.
    low_latency_base: Arc<Mutex<Option<String>>>,
    /// The first value of every BFQ tunable the bench changed, restored by one cleanup action.
    originals: Arc<Mutex<BTreeMap<String, String>>>,
    /// `--bfq-set` assignments, applied again when BFQ comes back after an io.cost mode (a new BFQ instance starts
    /// from its defaults).
    extra: Arc<Mutex<Vec<(String, String)>>>,
    /// The qemu-storage-daemon serving a throttled disk.
    pub daemon_pid: Option<u32>,
}

/// io.cost as an io.cost mode set it, read back from the v2 root's files.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct IoCostSetting {
    /// The device's line of `io.cost.model`, read back after the set-up.
    pub model: String,
    /// The device's line of `io.cost.qos`, read back after the set-up.
    pub qos: String,
    /// For `iocost-calibrated`: what `qos_agent::blockdev::iocost::measure` measured (model, median 4 KiB read at
    /// queue depth 1), as the agent's `iocost` subcommand prints it; for `iocost-protect`: who set it (the agent's
    /// protection at its start: the model and qos lines are what it measured).
    #[serde(default)]
    pub calibration: Option<String>,
}

/// How long each of the calibration's measurements runs (three of them, plus one second of lone reads): the
/// agent's `iocost` subcommand defaults to 3 s; 2 s keeps a mode's set-up under 10 s.
const CALIBRATION_SECS: u64 = 2;

impl Disk {
    fn new(info: DiskInfo, cleanup: &Cleanup) -> Self {
        let originals: Arc<Mutex<BTreeMap<String, String>>> = Arc::default();
        let (o, name) = (originals.clone(), info.disk_name.clone());
        cleanup.push(format!("restore BFQ tunables of {name}"), move || {
            let mut first_err = None;
            for (key, old) in std::mem::take(&mut *o.lock().unwrap_or_else(|p| p.into_inner())) {
                if let Err(e) = blockdev::set_bfq_tunable(&name, &key, &old, std::slice::from_ref(&name)) {
                    first_err.get_or_insert(e);
                }
            }
            first_err.map_or(Ok(()), |e| Err(e.into()))
        });
        Self { info, low_latency_base: Default::default(), originals, extra: Default::default(), daemon_pid: None }
    }

    fn queue(&self) -> PathBuf {
        Path::new("/sys/block").join(&self.info.disk_name).join("queue")
    }

    /// Sets a BFQ tunable through the agent's guarded write (this disk only); the first old value of each key is
    /// kept for the final restore. Returns the value it had.
    fn set(&self, key: &str, value: &str) -> Result<String> {
        let name = &self.info.disk_name;
        let old = blockdev::set_bfq_tunable(name, key, value, std::slice::from_ref(name))
            .with_context(|| format!("setting BFQ {key}={value} on {name}"))?;
        self.originals.lock().unwrap_or_else(|p| p.into_inner()).entry(key.to_string()).or_insert(old.clone());
        Ok(old)
    }

    /// Puts the device in `mode`. BFQ modes: BFQ as the scheduler (again, after an io.cost mode), `--bfq-set`
    /// applied, `strict_guarantees` (and, for [`BfqMode::StrictNoLowLatency`], `low_latency`); other modes keep
    /// the `low_latency` the device had when the first BFQ mode started (after `--bfq-set`). io.cost modes (cgroup
    /// v2 only): scheduler `none` and io.cost enabled in `root`'s `io.cost.qos`, with the kernel's model or the
    /// one the agent's calibration measures now; their undo (io.cost off, model back to the kernel's, the
    /// scheduler back) is on `cleanup` and its token returned, so the mode's end can run it early.
    pub fn set_mode(
        &self,
        mode: BfqMode,
        root: &CgroupRoot,
        cleanup: &Cleanup,
    ) -> Result<(Option<Token>, Option<IoCostSetting>)> {
        if mode.is_iocost() {
            return self.set_iocost(mode, root, cleanup).map(|(t, s)| (Some(t), s));
        }
        let name = &self.info.disk_name;
        if blockdev::scheduler(name)?.active != "bfq" {
            blockdev::switch_scheduler(name, "bfq", std::slice::from_ref(name))?;
        }
        for (key, value) in self.extra.lock().unwrap_or_else(|p| p.into_inner()).clone() {
            self.set(&key, &value)?;
        }
        let base = {
            let mut base = self.low_latency_base.lock().unwrap_or_else(|p| p.into_inner());
            if base.is_none() {
                *base = Some(sys::read_trim(&self.queue().join("iosched/low_latency"))?);
            }
            base.clone().unwrap_or_default()
        };
        let (strict, low_latency) = match mode {
            BfqMode::Default | BfqMode::Protect => ("0", base.as_str()),
            BfqMode::Strict | BfqMode::StrictTuned => ("1", base.as_str()),
            BfqMode::StrictNoLowLatency => ("1", "0"),
            BfqMode::IocostKernel | BfqMode::IocostCalibrated | BfqMode::IocostProtect => unreachable!("handled above"),
        };
        self.set("strict_guarantees", strict)?;
        self.set("low_latency", low_latency)?;
        Ok((None, None))
    }

    /// `iocost-protect` leaves io.cost off (the agent's protection enables it at its start): no setting to return
    /// yet ([`Disk::iocost_setting`] reads it back once the agent runs), and the undo turns io.cost off too in
    /// case the agent could not.
    fn set_iocost(
        &self,
        mode: BfqMode,
        root: &CgroupRoot,
        cleanup: &Cleanup,
    ) -> Result<(Token, Option<IoCostSetting>)> {
        ensure_iocost_possible(mode, root)?;
        let name = self.info.disk_name.clone();
        let dev: DevNum = self.info.maj_min.parse().with_context(|| format!("device number {}", self.info.maj_min))?;
        let v2 = root.path().to_path_buf();
        let before = blockdev::scheduler(&name)?.active;
        // The undo goes on the stack before anything changes; it is safe to run whatever was done by then.
        let token = cleanup.push(format!("io.cost off for {dev}, scheduler {before} on {name}"), {
            let (name, v2) = (name.clone(), v2.clone());
            move || {
                let mut first_err: Option<anyhow::Error> = None;
                for (line, file) in iocost::undo_lines(dev) {
                    if let Err(e) = sys::write_existing(&v2.join(file), &line) {
                        first_err.get_or_insert(e);
                    }
                }
                if let Err(e) = blockdev::switch_scheduler(&name, &before, std::slice::from_ref(&name)) {
                    first_err.get_or_insert(e.into());
                }
                first_err.map_or(Ok(()), Err)
            }
        });
        blockdev::switch_scheduler(&name, "none", std::slice::from_ref(&name))?;
        let model_file = v2.join(iocost::IO_COST_MODEL);
        let qos_file = v2.join(iocost::IO_COST_QOS);
        if mode == BfqMode::IocostProtect {
            if blockdev::io_cost_enabled(&v2, dev)? {
                bail!(
                    "{}: io.cost is enabled for {dev} before the agent's start, so its protection would leave it as \
                     found: the mode would not measure what the agent sets",
                    mode.name()
                );
            }
            return Ok((token, None));
        }
        let calibration = match mode {
            BfqMode::IocostKernel => {
                sys::write_existing(&model_file, &format!("{dev} ctrl=auto"))?;
                sys::write_existing(&qos_file, &format!("{dev} enable=1"))?;
                None
            }
            _ => {
                // What `ddiskqos-agent iocost DEV --apply` does: measure the device (reads only; write coefficients
                // equal to the read ones), a latency target from its median 4 KiB read, then write model and qos.
                let cal = iocost::Calibration {
                    duration: std::time::Duration::from_secs(CALIBRATION_SECS),
                    ..Default::default()
                };
                eprintln!(
                    "{}: calibrating io.cost on {} (about {} s)",
                    mode.name(),
                    self.info.dev.display(),
                    CALIBRATION_SECS * 3 + 1
                );
                let measured = iocost::measure(&self.info.dev, &cal)
                    .with_context(|| format!("calibrating io.cost on {}", self.info.dev.display()))?;
                let qos = iocost::QosTarget::from_latency(std::time::Duration::from_micros(measured.median_4k_qd1_us));
                iocost::apply(&v2, dev, &measured.model, &qos)?;
                Some(format!("{measured}"))
            }
        };
        Ok((token, Some(self.iocost_setting(mode, root, calibration)?)))
    }

    /// io.cost as it is in force on the device now (model and qos lines read back from `root`), failing unless
    /// enabled: after an io.cost mode's set-up, or after the agent's start in `iocost-protect`.
    pub fn iocost_setting(
        &self,
        mode: BfqMode,
        root: &CgroupRoot,
        calibration: Option<String>,
    ) -> Result<IoCostSetting> {
        let dev: DevNum = self.info.maj_min.parse().with_context(|| format!("device number {}", self.info.maj_min))?;
        let (model_file, qos_file) = (root.path().join(iocost::IO_COST_MODEL), root.path().join(iocost::IO_COST_QOS));
        if !blockdev::io_cost_enabled(root.path(), dev)? {
            bail!("{} does not read enable=1 for {dev} after the set-up of {}", qos_file.display(), mode.name());
        }
        let line = |f: &Path| -> Result<String> {
            iocost::read_line(f, dev)?.with_context(|| format!("{} has no line for {dev}", f.display()))
        };
        Ok(IoCostSetting { model: line(&model_file)?, qos: line(&qos_file)?, calibration })
    }

    /// Sets a BFQ tunable given as `KEY=VALUE` (`low_latency=0`, `slice_idle=0`, ...); the returned token puts the
    /// old value back early (the run's end restores it in any case).
    pub fn set_tunable(&self, assignment: &str, cleanup: &Cleanup) -> Result<Token> {
        let Some((key, value)) = assignment.split_once('=') else {
            bail!("--bfq-set wants KEY=VALUE, got {assignment:?}");
        };
        if key == "strict_guarantees" {
            bail!("--bfq-set {key}: not a tunable the bench lets you set (strict_guarantees comes from --modes)");
        }
        let old = self.set(key, value)?;
        self.extra.lock().unwrap_or_else(|p| p.into_inner()).push((key.to_string(), value.to_string()));
        let (name, key) = (self.info.disk_name.clone(), key.to_string());
        Ok(cleanup.push(format!("restore {key}={old} on {name}"), move || {
            blockdev::set_bfq_tunable(&name, &key, &old, std::slice::from_ref(&name))?;
            Ok(())
        }))
    }

    /// Requests the device has in flight now (reads and writes: `/sys/block/NAME/inflight`), queued in the
    /// scheduler or in the device (under qemu, in its throttle's queue too).
    pub fn inflight(&self) -> Result<u64> {
        let path = Path::new("/sys/block").join(&self.info.disk_name).join("inflight");
        let text = sys::read_trim(&path)?;
        parse_inflight(&text).with_context(|| format!("{}: {text:?}", path.display()))
    }

    /// Waits until the device has no request in flight (polling every millisecond), at most `limit`; returns how
    /// long it waited. An Alone read starts on an idle device: a frozen background's requests still in flight
    /// would otherwise be served first (under qemu's throttle, up to a few hundred ms).
    pub fn wait_idle(&self, limit: Duration) -> Result<Duration> {
        let t0 = std::time::Instant::now();
        loop {
            let n = self.inflight()?;
            if n == 0 {
                return Ok(t0.elapsed());
            }
            if t0.elapsed() > limit {
                bail!("{}: {n} request(s) still in flight after {limit:?}", self.info.disk_name);
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// The active scheduler and every BFQ tunable, for the report.
    pub fn iosched(&self) -> BTreeMap<String, String> {
        let mut out = BTreeMap::new();
        if let Ok(s) = sys::read_trim(&self.queue().join(blockdev::protect::SCHEDULER)) {
            out.insert(blockdev::protect::SCHEDULER.into(), s);
        }
        if let Ok(entries) = std::fs::read_dir(self.queue().join("iosched")) {
            for entry in entries.flatten() {
                if let Ok(v) = sys::read_trim(&entry.path()) {
                    out.insert(entry.file_name().to_string_lossy().into_owned(), v);
                }
            }
        }
        // The queue files protection writes, and the flag that decides its slot.
        for extra in blockdev::protect::QUEUE_FILES.into_iter().chain([blockdev::protect::ROTATIONAL]) {
            if let Ok(v) = sys::read_trim(&self.queue().join(extra)) {
                out.insert(extra.into(), v);
            }
        }
        out
    }
}

/// Fails unless `mode` can run on `root`: io.cost modes need cgroup v2 with `io.cost.qos` in the root.
pub fn ensure_iocost_possible(mode: BfqMode, root: &CgroupRoot) -> Result<()> {
    if !mode.is_iocost() {
        return Ok(());
    }
    if root.version() != CgroupVersion::V2 {
        bail!(
            "mode {}: io.cost exists on cgroup v2 only, and the block-I/O hierarchy here is cgroup v1 ({}); run the \
             bench inside scripts/cgroup-v2.sh, or choose a BFQ mode",
            mode.name(),
            root.path().display()
        );
    }
    let qos = root.path().join(iocost::IO_COST_QOS);
    if !qos.exists() {
        bail!("mode {}: {} is missing (kernel without CONFIG_BLK_CGROUP_IOCOST?)", mode.name(), qos.display());
    }
    Ok(())
}

/// Sets up the disk described by `source` under `work` (a directory the caller owns and removes), and has `fill`
/// write the test files into its (mounted) files directory.
pub fn prepare<T>(
    source: &DiskSource,
    work: &Path,
    cleanup: &Cleanup,
    fill: impl FnOnce(&Path) -> Result<T>,
) -> Result<(Disk, T)> {
    let disk = match source {
        DiskSource::Throttled { dir, size, model } => return prepare_throttled(dir, *size, model, work, cleanup, fill),
        DiskSource::Loop { dir, size } => prepare_loop(dir, *size, work, cleanup)?,
        DiskSource::Device { path, format } => prepare_device(path, *format, work, cleanup)?,
        DiskSource::Dir(dir) => prepare_dir(dir, cleanup)?,
    };
    let filled = fill(&disk.info.files_dir)?;
    Ok((disk, filled))
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
    let attached = attach_direct(&backing, false, cleanup)?;
    mkfs(&attached.dev)?;
    let files_dir = work.join("mnt");
    mount(&attached.dev, &files_dir, "noatime", cleanup)?;
    Ok(Disk::new(attached.info("loop", files_dir, &backing, size), cleanup))
}

/// The throttled disk, in two steps: the image is formatted and filled through a plain loop device on the tmpfs
/// file (no qemu: see [`crate::throttled`] on why writes must not go through its FUSE export), then served read-only
/// by qemu-storage-daemon's throttle, attached read-only with direct I/O and mounted read-only where it was filled.
fn prepare_throttled<T>(
    dir: &Path,
    size: u64,
    model: &ThrottleModel,
    work: &Path,
    cleanup: &Cleanup,
    fill: impl FnOnce(&Path) -> Result<T>,
) -> Result<(Disk, T)> {
    eprintln!("disk: an image of {} MiB in RAM (tmpfs, filled as files are written), throttled to {model}", size >> 20);
    let image = throttled::make_image(dir, size, cleanup)?;
    let files_dir = work.join("mnt");
    let filled = {
        let path = image.path.to_string_lossy();
        let dev = sys::run("losetup", &["--find", "--show", &path])?.trim().to_string();
        if dev.is_empty() {
            bail!("losetup printed no device for {path}");
        }
        let d = dev.clone();
        let detach = cleanup.push(format!("detach {dev} (filling {path})"), move || detach_loop(&d));
        let dev = PathBuf::from(dev);
        mkfs(&dev)?;
        let unmount = mount(&dev, &files_dir, "noatime", cleanup)?;
        let filled = fill(&files_dir)?;
        cleanup.run(unmount)?;
        cleanup.run(detach)?;
        filled
    };
    let served = throttled::serve(&image, model, dir, cleanup)?;
    let attached = attach_direct(&served.export, true, cleanup)?;
    mount(&attached.dev, &files_dir, "ro,noatime", cleanup)?;
    let mut info = attached.info("throttled", files_dir, &served.export, size);
    info.model = Some(*model);
    let mut disk = Disk::new(info, cleanup);
    disk.daemon_pid = Some(served.daemon_pid);
    Ok((disk, filled))
}

/// A loop device attached by [`attach_direct`].
struct Attached {
    dev: PathBuf,
    num: DevNum,
    disk_name: String,
}

impl Attached {
    fn info(self, kind: &str, files_dir: PathBuf, backing: &Path, size: u64) -> DiskInfo {
        DiskInfo {
            kind: kind.into(),
            maj_min: self.num.to_string(),
            dev: self.dev,
            disk_name: self.disk_name,
            files_dir,
            backing: Some(backing.to_path_buf()),
            size,
            model: None,
        }
    }
}

/// Attaches `backing` as a loop device with direct I/O (checked: reads reach the device below, not the page
/// cache), read-only if asked, and selects BFQ on it; each step's undo on `cleanup`.
fn attach_direct(backing: &Path, read_only: bool, cleanup: &Cleanup) -> Result<Attached> {
    let backing_str = backing.to_string_lossy().into_owned();
    let mut args = vec!["--find", "--show", "--direct-io=on"];
    if read_only {
        args.push("--read-only");
    }
    args.push(&backing_str);
    let dev = sys::run("losetup", &args)?.trim().to_string();
    if dev.is_empty() {
        bail!("losetup printed no device for {backing_str}");
    }
    let d = dev.clone();
    cleanup.push(format!("detach {dev}"), move || detach_loop(&d));
    let dev = PathBuf::from(dev);
    let num = DevNum::of_node(&dev)?;
    let disk_name = blockdev::disk_of_dev(num)?;
    ensure_not_root_disk(&disk_name)?;
    let dio = sys::read_trim(&Path::new("/sys/block").join(&disk_name).join("loop/dio")).unwrap_or_default();
    if dio != "1" {
        bail!("{} did not enable direct I/O (loop/dio = {dio:?}): reads would hit the page cache", dev.display());
    }
    use_bfq(&disk_name, cleanup)?;
    Ok(Attached { dev, num, disk_name })
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
    let num = DevNum::of_node(path)?;
    let disk_name = blockdev::disk_of_dev(num)?;
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
    let files_dir = work.join("mnt");
    mount(path, &files_dir, "noatime", cleanup)?;
    let size = sys::run("blockdev", &["--getsize64", &path.to_string_lossy()])?.trim().parse().unwrap_or(0);
    let info = DiskInfo {
        kind: "device".into(),
        maj_min: num.to_string(),
        dev: path.to_path_buf(),
        disk_name,
        files_dir,
        backing: None,
        size,
        model: None,
    };
    Ok(Disk::new(info, cleanup))
}

fn prepare_dir(dir: &Path, cleanup: &Cleanup) -> Result<Disk> {
    let num = DevNum::of_path(dir)?;
    let disk_name = blockdev::disk_of_path(dir)
        .with_context(|| format!("{} is not on a block device ({num}): BFQ weights cannot act there", dir.display()))?;
    ensure_not_root_disk(&disk_name)?;
    use_bfq(&disk_name, cleanup)?;
    let files_dir = dir.join(format!("ddiskqos-bench-{}", std::process::id()));
    std::fs::create_dir(&files_dir).with_context(|| format!("cannot create {}", files_dir.display()))?;
    let f = files_dir.clone();
    cleanup.push(format!("remove {}", files_dir.display()), move || {
        std::fs::remove_dir_all(&f).with_context(|| format!("cannot remove {}", f.display()))
    });
    let name = sys::read_trim(&PathBuf::from(format!("/sys/dev/block/{num}/uevent")))?
        .lines()
        .find_map(|l| l.strip_prefix("DEVNAME=").map(str::to_string))
        .unwrap_or_else(|| disk_name.clone());
    let info = DiskInfo {
        kind: "dir".into(),
        dev: Path::new("/dev").join(name),
        disk_name,
        maj_min: num.to_string(),
        files_dir,
        backing: None,
        size: 0,
        model: None,
    };
    Ok(Disk::new(info, cleanup))
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

/// Mounts `dev` at `mnt` (created if missing) with `options`; returns the token of its unmount on `cleanup`.
fn mount(dev: &Path, mnt: &Path, options: &str, cleanup: &Cleanup) -> Result<Token> {
    std::fs::create_dir_all(mnt).with_context(|| format!("cannot create {}", mnt.display()))?;
    sys::run("mount", &["-o", options, &dev.to_string_lossy(), &mnt.to_string_lossy()])?;
    let m = mnt.to_path_buf();
    Ok(cleanup.push(format!("unmount {}", mnt.display()), move || sys::unmount(&m)))
}

/// Size of the loop device for `total_mib` of files: 25 % and 512 MiB spare, whole GiB, at least 1 GiB.
pub fn loop_size(total_mib: u64) -> u64 {
    let mib = total_mib + total_mib / 4 + 512;
    mib.div_ceil(1024).max(1) * (1 << 30)
}

/// Refuses to touch a disk the agent's library protects (the one backing `/`, and the disks under it), before
/// anything is set up on it.
pub fn ensure_not_root_disk(disk_name: &str) -> Result<()> {
    let protected = blockdev::protected_disks().context("cannot tell which disk backs /")?;
    if protected.iter().any(|p| p == disk_name) {
        bail!(
            "{disk_name} holds the root file system: the bench never changes its scheduler \
             (use the default loop device)"
        );
    }
    Ok(())
}

/// Makes BFQ the scheduler of `disk_name` (the agent's guarded switch, this disk only), with BFQ's default tunables,
/// registering the restore of the previous scheduler.
fn use_bfq(disk_name: &str, cleanup: &Cleanup) -> Result<()> {
    let allowed = [disk_name.to_string()];
    if !blockdev::scheduler(disk_name)?.available.iter().any(|s| s == "bfq") {
        // BFQ may be a module that is not loaded yet.
        let _ = sys::run("modprobe", &["bfq"]);
    }
    if blockdev::scheduler(disk_name)?.active == "bfq" {
        // A loop device keeps its queue when detached: BFQ's tunables are what its last user left (seen: a
        // max_budget and timeout_sync of an earlier run). Selecting BFQ anew gives the kernel's defaults; the
        // device is left on bfq at the end, as found.
        blockdev::switch_scheduler(disk_name, "none", &allowed)?;
        blockdev::switch_scheduler(disk_name, "bfq", &allowed)?;
        eprintln!("{disk_name} already had bfq: selected it anew for BFQ's default tunables");
        return Ok(());
    }
    let old = blockdev::switch_scheduler(disk_name, "bfq", &allowed)?;
    if old != "bfq" {
        cleanup.push(format!("restore scheduler {old} on {disk_name}"), move || {
            blockdev::switch_scheduler(&allowed[0], &old, &allowed)?;
            Ok(())
        });
    }
    Ok(())
}

/// The sum of `/sys/block/NAME/inflight`'s two counts (reads, writes).
fn parse_inflight(text: &str) -> Result<u64> {
    let counts: Vec<u64> = text.split_whitespace().map(str::parse).collect::<Result<_, _>>()?;
    match counts[..] {
        [reads, writes] => Ok(reads + writes),
        _ => bail!("expected two counts (reads, writes), got {}", counts.len()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loop_size_holds_the_files_with_room() {
        assert_eq!(loop_size(0), 1 << 30);
        let quick = crate::workload::Plan::quick().files().iter().map(|(_, s)| s).sum::<u64>() + 2048;
        let size = loop_size(quick);
        assert!(size >= (quick + quick / 4) << 20, "{size}");
        assert_eq!(size % (1 << 30), 0);
    }

    #[test]
    fn inflight_is_the_sum_of_reads_and_writes() {
        assert_eq!(parse_inflight("       0        0").unwrap(), 0);
        assert_eq!(parse_inflight("3 1").unwrap(), 4);
        assert!(parse_inflight("3").is_err());
        assert!(parse_inflight("x 1").is_err());
    }

    #[test]
    fn root_disk_is_refused() {
        if let Some(root) = blockdev::protected_disks().ok().and_then(|p| p.into_iter().next()) {
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
        assert!(prepare(&DiskSource::Dir(dir.path().to_path_buf()), dir.path(), &stack, |_| Ok(())).is_err());
        assert_eq!(stack.pending(), 0, "nothing may be registered when refusing");
    }

    #[test]
    fn iocost_modes_are_refused_on_v1_with_the_reason() {
        let dir = tempfile::tempdir().unwrap();
        let v1 = CgroupRoot::from_dir(CgroupVersion::V1, dir.path()).unwrap();
        let err = ensure_iocost_possible(BfqMode::IocostCalibrated, &v1).unwrap_err().to_string();
        assert!(err.contains("iocost-calibrated") && err.contains("cgroup v1"), "{err}");
        ensure_iocost_possible(BfqMode::Strict, &v1).unwrap();
        let v2 = CgroupRoot::from_dir(CgroupVersion::V2, dir.path()).unwrap();
        let err = ensure_iocost_possible(BfqMode::IocostKernel, &v2).unwrap_err().to_string();
        assert!(err.contains("io.cost.qos is missing"), "{err}");
        std::fs::write(dir.path().join("io.cost.qos"), "").unwrap();
        ensure_iocost_possible(BfqMode::IocostKernel, &v2).unwrap();
        // The agent's own io.cost set-up is an io.cost mode too: refused on v1 by name.
        let err = ensure_iocost_possible(BfqMode::IocostProtect, &v1).unwrap_err().to_string();
        assert!(err.contains("iocost-protect") && err.contains("cgroup v1"), "{err}");
    }

    #[test]
    fn a_device_needs_format_permission() {
        let stack = Cleanup::new();
        let source = DiskSource::Device { path: "/dev/null".into(), format: false };
        let err = prepare(&source, Path::new("/tmp"), &stack, |_| Ok(()));
        assert!(err.unwrap_err().to_string().contains("not a block device"));
    }
}
