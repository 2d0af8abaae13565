//! io.cost set-up (cgroup v2), opt-in: measure a device and write its `io.cost.model` and `io.cost.qos` lines.
//!
//! io.cost divides a device by weight (`io.weight`) according to a linear cost model of the device: bytes per
//! second and I/Os per second, sequential and random, read and write. The kernel's automatic model can be far from
//! the device (on this project's test machine it said 174 MB/s for a device reading 1.8-3.0 GB/s, throttling
//! everyone to a tenth); a model that overstates the device stops weights from acting. So, as the kernel's
//! `tools/cgroup/iocost_coef_gen.py` does, the device is measured where it is used: sequential reads of 1 MiB,
//! sequential and random reads of 4 KiB, at a queue depth deep enough to saturate it (`jobs` threads doing
//! `O_DIRECT` `pread`s). Writes are measured only on a file the operator names (never on the raw device: that
//! would destroy its data); without one, the write coefficients are taken equal to the read ones, and the report
//! says so.
//!
//! `ddiskqos-agent iocost DEVICE --apply` writes, prints what it wrote, and how to undo it. The running agent
//! enables io.cost only through protection by default ([`super::protect`]: a managed device on cgroup v2 whose
//! scheduler is not BFQ, with a short measurement at start), and turns it off again at stop.

use std::fmt;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{DevNum, DeviceError, Result};

/// The root-cgroup file holding each device's cost model.
pub const IO_COST_MODEL: &str = "io.cost.model";
/// The root-cgroup file enabling io.cost per device, with its latency targets.
pub const IO_COST_QOS: &str = "io.cost.qos";

/// A linear io.cost model: the device's throughput by I/O kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CostModel {
    /// Sequential read bandwidth, bytes per second.
    pub rbps: u64,
    /// Sequential 4 KiB reads per second.
    pub rseqiops: u64,
    /// Random 4 KiB reads per second.
    pub rrandiops: u64,
    /// Sequential write bandwidth, bytes per second.
    pub wbps: u64,
    /// Sequential 4 KiB writes per second.
    pub wseqiops: u64,
    /// Random 4 KiB writes per second.
    pub wrandiops: u64,
}

impl CostModel {
    /// The `io.cost.model` line for `dev` (`ctrl=user`: the kernel keeps these values instead of its own).
    pub fn line(&self, dev: DevNum) -> String {
        format!(
            "{dev} ctrl=user model=linear rbps={} rseqiops={} rrandiops={} wbps={} wseqiops={} wrandiops={}",
            self.rbps, self.rseqiops, self.rrandiops, self.wbps, self.wseqiops, self.wrandiops
        )
    }
}

/// What `io.cost.qos` is given: enable, and optionally a read-latency target.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct QosTarget {
    /// The read-latency percentile the target applies to (e.g. 95).
    pub rpct: f64,
    /// The target, microseconds.
    pub rlat_us: u64,
    /// The lowest the kernel may scale the model's rates down to, percent.
    pub min_pct: f64,
}

impl QosTarget {
    /// The `io.cost.qos` line enabling io.cost on `dev` with this target.
    pub fn line(&self, dev: DevNum) -> String {
        format!(
            "{dev} enable=1 ctrl=user rpct={:.2} rlat={} wpct={:.2} wlat={} min={:.2} max=100.00",
            self.rpct, self.rlat_us, self.rpct, self.rlat_us, self.min_pct
        )
    }

    /// A target from the device's own latency: `rpct` 95 at five times its median 4 KiB random read at queue depth
    /// one, and never below 2 ms (what gave the best isolation on the test machine: TESTBED.md), `min` 10 %.
    pub fn from_latency(median_4k_qd1: Duration) -> Self {
        let rlat = (median_4k_qd1 * 5).max(Duration::from_millis(2));
        Self { rpct: 95.0, rlat_us: rlat.as_micros().min(u128::from(u64::MAX)) as u64, min_pct: 10.0 }
    }
}

/// The lines that turn io.cost off again for `dev` and hand its latency targets and model back to the kernel
/// (`enable=0` alone leaves the written targets in `io.cost.qos`).
pub fn undo_lines(dev: DevNum) -> [(String, &'static str); 2] {
    [(format!("{dev} enable=0 ctrl=auto"), IO_COST_QOS), (format!("{dev} ctrl=auto"), IO_COST_MODEL)]
}

/// What `ddiskqos-agent iocost` asks for: the device, how to measure it, and whether to apply the result.
#[derive(Debug, Clone)]
pub struct SetUp {
    /// The block device node (e.g. `/dev/vda`).
    pub device: PathBuf,
    /// How it is measured.
    pub calibration: Calibration,
    /// The latency target (`rlat`) to set; `None`: derived from the measured lone 4 KiB read.
    pub rlat: Option<Duration>,
    /// Whether the lines are written (then the device must not back the root filesystem).
    pub apply: bool,
}

/// Why an io.cost set-up was refused or failed; each names the option, device or file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SetUpError {
    /// `--seconds` out of range.
    #[error("--seconds {0}: must be 1..=600")]
    Seconds(u64),
    /// `--jobs` out of range.
    #[error("--jobs {0}: must be 1..=256")]
    Jobs(usize),
    /// The device backs the root filesystem, and `--apply` would change it.
    #[error("{} is on {disk}, which backs the root filesystem: not changing its io.cost", device.display())]
    RootDisk {
        /// The device node.
        device: PathBuf,
        /// Its disk.
        disk: String,
    },
    /// The device could not be read, measured or set.
    #[error(transparent)]
    Device(#[from] DeviceError),
}

/// A checked [`SetUp`]: the device's number and disk.
#[derive(Debug, Clone)]
pub struct Prepared {
    /// The request.
    pub setup: SetUp,
    /// The device's number.
    pub dev: DevNum,
    /// The disk it is (or is on).
    pub disk: String,
}

/// What a set-up measured and the lines it sets (or would set).
#[derive(Debug, Clone)]
pub struct SetUpResult {
    /// The measurement.
    pub measured: Measured,
    /// The `io.cost.qos` target.
    pub qos: QosTarget,
    /// The `io.cost.model` line.
    pub model_line: String,
    /// The `io.cost.qos` line.
    pub qos_line: String,
}

impl SetUp {
    /// Checks the options and the device (a device backing the root filesystem is refused when applying).
    pub fn prepare(self) -> std::result::Result<Prepared, SetUpError> {
        let secs = self.calibration.duration.as_secs();
        if !(1..=600).contains(&secs) {
            return Err(SetUpError::Seconds(secs));
        }
        if !(1..=256).contains(&self.calibration.jobs) {
            return Err(SetUpError::Jobs(self.calibration.jobs));
        }
        let dev = DevNum::of_node(&self.device).map_err(DeviceError::from)?;
        let disk = super::disk_of_dev(dev)?;
        if self.apply && super::protected_disks()?.contains(&disk) {
            return Err(SetUpError::RootDisk { device: self.device, disk });
        }
        Ok(Prepared { setup: self, dev, disk })
    }
}

impl Prepared {
    /// About how long [`Prepared::measure`] takes: three read loads (six with a write file) of the set duration
    /// each, then at most a second of lone reads.
    pub fn about(&self) -> Duration {
        let cal = &self.setup.calibration;
        let loads = if cal.write_file.is_some() { 6 } else { 3 };
        cal.duration * loads + Duration::from_secs(1)
    }

    /// Measures the device and chooses the latency target.
    pub fn measure(&self) -> std::result::Result<SetUpResult, SetUpError> {
        let measured = measure(&self.setup.device, &self.setup.calibration)?;
        let qos = match self.setup.rlat {
            Some(r) => QosTarget { rpct: 95.0, rlat_us: r.as_micros() as u64, min_pct: 10.0 },
            None => QosTarget::from_latency(Duration::from_micros(measured.median_4k_qd1_us)),
        };
        let (model_line, qos_line) = (measured.model.line(self.dev), qos.line(self.dev));
        Ok(SetUpResult { measured, qos, model_line, qos_line })
    }

    /// Writes the result's lines under the cgroup v2 root `v2_root`.
    pub fn apply(&self, v2_root: &Path, result: &SetUpResult) -> std::result::Result<(), SetUpError> {
        Ok(apply(v2_root, self.dev, &result.measured.model, &result.qos)?)
    }
}

/// How a calibration measures.
#[derive(Debug, Clone)]
pub struct Calibration {
    /// Seconds per measurement (six of them, or three without a write file).
    pub duration: Duration,
    /// Threads issuing I/O at once (the queue depth).
    pub jobs: usize,
    /// A file on the same device for the write measurements (overwritten, up to its current size); `None`: write
    /// coefficients equal to the read ones.
    pub write_file: Option<PathBuf>,
}

impl Default for Calibration {
    fn default() -> Self {
        Self { duration: Duration::from_secs(3), jobs: 16, write_file: None }
    }
}

/// What a calibration measured.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Measured {
    /// The model.
    pub model: CostModel,
    /// Median latency of a lone 4 KiB random read.
    pub median_4k_qd1_us: u64,
    /// Whether the write coefficients were measured (else copied from the reads).
    pub writes_measured: bool,
}

/// Measures the block device `node` (e.g. `/dev/loop3`) by reading it; see [`Calibration`].
pub fn measure(node: &Path, cal: &Calibration) -> Result<Measured> {
    let io = |op, source| DeviceError::Io { op, path: node.to_owned(), source };
    let (file, size) = open_direct(node)?;
    if size < 64 << 20 {
        return Err(DeviceError::Refused { device: node.display().to_string(), reason: "smaller than 64 MiB".into() });
    }
    let file = Arc::new(file);
    let read = |pattern| run_load(&file, size, pattern, false, cal).map_err(|e| io("read", e));
    let rbps = read(Pattern::Sequential(MIB))?.bytes_per_sec();
    let rseqiops = read(Pattern::Sequential(PAGE))?.ops_per_sec();
    let rrandiops = read(Pattern::Random(PAGE))?.ops_per_sec();
    let median = median_qd1(&file, size, cal.duration.min(Duration::from_secs(1))).map_err(|e| io("read", e))?;
    let (wbps, wseqiops, wrandiops, writes_measured) = match &cal.write_file {
        None => (rbps, rseqiops, rrandiops, false),
        Some(path) => {
            let wio = |op, source| DeviceError::Io { op, path: path.clone(), source };
            let wf = OpenOptions::new()
                .write(true)
                .custom_flags(libc::O_DIRECT | libc::O_NOFOLLOW)
                .open(path)
                .map_err(|e| wio("open", e))?;
            let wsize = wf.metadata().map_err(|e| wio("stat", e))?.len();
            if wsize < 64 << 20 {
                return Err(DeviceError::Refused {
                    device: path.display().to_string(),
                    reason: "the write file must already hold at least 64 MiB (it is overwritten in place)".into(),
                });
            }
            let wf = Arc::new(wf);
            let write = |pattern| run_load(&wf, wsize, pattern, true, cal).map_err(|e| wio("write", e));
            let w = (
                write(Pattern::Sequential(MIB))?.bytes_per_sec(),
                write(Pattern::Sequential(PAGE))?.ops_per_sec(),
                write(Pattern::Random(PAGE))?.ops_per_sec(),
            );
            (w.0, w.1, w.2, true)
        }
    };
    Ok(Measured {
        model: CostModel { rbps, rseqiops, rrandiops, wbps, wseqiops, wrandiops },
        median_4k_qd1_us: median.as_micros() as u64,
        writes_measured,
    })
}

/// The median time of lone 4 KiB random reads of the block device `node` over about `duration` (at least 16;
/// `O_DIRECT`, reads only): what [`super::protect`] measures on a device that reports it rotates.
pub fn lone_read_median(node: &Path, duration: Duration) -> Result<Duration> {
    let (file, size) = open_direct(node)?;
    if size < PAGE as u64 {
        return Err(DeviceError::Refused { device: node.display().to_string(), reason: "smaller than 4 KiB".into() });
    }
    median_qd1(&file, size, duration).map_err(|source| DeviceError::Io { op: "read", path: node.to_owned(), source })
}

/// `node` opened for `O_DIRECT` reads, and its size in bytes.
fn open_direct(node: &Path) -> Result<(File, u64)> {
    let io = |op, source| DeviceError::Io { op, path: node.to_owned(), source };
    let file = OpenOptions::new().read(true).custom_flags(libc::O_DIRECT).open(node).map_err(|e| io("open", e))?;
    let size = device_size(&file).map_err(|e| io("size", e))?;
    Ok((file, size))
}

/// Writes the model, then the qos line, into the v2 root `v2_root`, and reads both back.
pub fn apply(v2_root: &Path, dev: DevNum, model: &CostModel, qos: &QosTarget) -> Result<()> {
    write_line(&v2_root.join(IO_COST_MODEL), &model.line(dev), dev)?;
    write_line(&v2_root.join(IO_COST_QOS), &qos.line(dev), dev)?;
    let enabled = super::io_cost_enabled(v2_root, dev)?;
    if !enabled {
        return Err(DeviceError::Refused {
            device: dev.to_string(),
            reason: format!("wrote {} but it does not read enable=1", v2_root.join(IO_COST_QOS).display()),
        });
    }
    Ok(())
}

/// The device's line in an io.cost root file (`io.cost.model` or `io.cost.qos`).
pub fn read_line(file: &Path, dev: DevNum) -> Result<Option<String>> {
    let text =
        std::fs::read_to_string(file).map_err(|source| DeviceError::Io { op: "read", path: file.into(), source })?;
    let wanted = dev.to_string();
    Ok(text.lines().find(|l| l.split_whitespace().next() == Some(wanted.as_str())).map(str::to_owned))
}

/// Writes one line into an io.cost root file, as `echo LINE > FILE` does (`O_TRUNC`, which cgroupfs ignores and
/// which keeps a fixture file to the line written), and checks the file has a line for the device.
pub(super) fn write_line(file: &Path, line: &str, dev: DevNum) -> Result<()> {
    let mut f = OpenOptions::new()
        .write(true)
        .create(false)
        .truncate(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(file)
        .map_err(|source| DeviceError::Io { op: "open", path: file.into(), source })?;
    std::io::Write::write_all(&mut f, line.as_bytes()).map_err(|source| DeviceError::Write {
        path: file.into(),
        data: line.into(),
        source,
    })?;
    match read_line(file, dev)? {
        Some(_) => Ok(()),
        None => Err(DeviceError::Refused {
            device: dev.to_string(),
            reason: format!("wrote {line:?} to {} but it has no line for the device", file.display()),
        }),
    }
}

const PAGE: usize = 4096;
const MIB: usize = 1 << 20;

#[derive(Debug, Clone, Copy)]
enum Pattern {
    /// Each job reads its own stripe in order, in blocks of this size.
    Sequential(usize),
    /// Each job reads blocks of this size at random aligned offsets.
    Random(usize),
}

#[derive(Debug)]
struct Load {
    ops: u64,
    bytes: u64,
    elapsed: Duration,
}

impl Load {
    fn bytes_per_sec(&self) -> u64 {
        (self.bytes as f64 / self.elapsed.as_secs_f64().max(1e-9)) as u64
    }

    fn ops_per_sec(&self) -> u64 {
        (self.ops as f64 / self.elapsed.as_secs_f64().max(1e-9)) as u64
    }
}

/// `cal.jobs` threads issuing `pattern` I/O on `file` (of `size` bytes) for `cal.duration`.
fn run_load(file: &Arc<File>, size: u64, pattern: Pattern, write: bool, cal: &Calibration) -> std::io::Result<Load> {
    let stop = Arc::new(AtomicBool::new(false));
    let (ops, bytes) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let jobs = cal.jobs.max(1);
    // The clock starts once every worker runs: on a busy host a thread may start late, and a window it missed
    // would read as a slow device (or as zero operations).
    let started = Arc::new(std::sync::Barrier::new(jobs + 1));
    let handles: Vec<_> = (0..jobs)
        .map(|job| {
            let (file, stop, ops, bytes) = (file.clone(), stop.clone(), ops.clone(), bytes.clone());
            let started = started.clone();
            std::thread::spawn(move || -> std::io::Result<()> {
                started.wait();
                let block = match pattern {
                    Pattern::Sequential(b) | Pattern::Random(b) => b,
                };
                let mut buf = Aligned::new(block);
                let blocks = size / block as u64;
                let stripe = (blocks / jobs as u64).max(1);
                let mut next = stripe * job as u64;
                let mut rng = 0x9e37_79b9_7f4a_7c15u64 ^ (job as u64 + 1).wrapping_mul(0xbf58_476d_1ce4_e5b9);
                // At least one operation each, even past the window: a figure from none would be no figure.
                let mut done = 0u64;
                while done == 0 || !stop.load(Ordering::Relaxed) {
                    let index = match pattern {
                        Pattern::Sequential(_) => {
                            next += 1;
                            if next >= stripe * (job as u64 + 1) || next >= blocks {
                                next = stripe * job as u64;
                            }
                            next
                        }
                        Pattern::Random(_) => {
                            rng ^= rng << 13;
                            rng ^= rng >> 7;
                            rng ^= rng << 17;
                            rng % blocks
                        }
                    };
                    let offset = index * block as u64;
                    let n = if write {
                        file.write_at(buf.as_slice(), offset)?
                    } else {
                        file.read_at(buf.as_mut_slice(), offset)?
                    };
                    ops.fetch_add(1, Ordering::Relaxed);
                    bytes.fetch_add(n as u64, Ordering::Relaxed);
                    done += 1;
                }
                Ok(())
            })
        })
        .collect();
    started.wait();
    let start = Instant::now();
    std::thread::sleep(cal.duration);
    stop.store(true, Ordering::Relaxed);
    for h in handles {
        h.join().map_err(|_| std::io::Error::other("a measuring thread panicked"))??;
    }
    // Operations still running at the stop are counted, so is the time they took.
    let elapsed = start.elapsed();
    Ok(Load { ops: ops.load(Ordering::Relaxed), bytes: bytes.load(Ordering::Relaxed), elapsed })
}

/// The median time of lone 4 KiB random reads over `duration`.
fn median_qd1(file: &File, size: u64, duration: Duration) -> std::io::Result<Duration> {
    let mut buf = Aligned::new(PAGE);
    let blocks = size / PAGE as u64;
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    let mut times = Vec::new();
    let start = Instant::now();
    while start.elapsed() < duration || times.len() < 16 {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let t = Instant::now();
        file.read_at(buf.as_mut_slice(), (rng % blocks) * PAGE as u64)?;
        times.push(t.elapsed());
        if times.len() >= 100_000 {
            break;
        }
    }
    times.sort();
    Ok(times[times.len() / 2])
}

fn device_size(file: &File) -> std::io::Result<u64> {
    use std::io::{Seek, SeekFrom};
    let mut f = file;
    let size = f.seek(SeekFrom::End(0))?;
    f.seek(SeekFrom::Start(0))?;
    Ok(size)
}

/// A page-aligned buffer (O_DIRECT needs one), without unsafe code: over-allocate and slice.
struct Aligned {
    storage: Vec<u8>,
    offset: usize,
    len: usize,
}

impl Aligned {
    fn new(len: usize) -> Self {
        let storage = vec![0x5a; len + PAGE];
        let offset = (PAGE - storage.as_ptr() as usize % PAGE) % PAGE;
        Self { storage, offset, len }
    }

    fn as_slice(&self) -> &[u8] {
        &self.storage[self.offset..self.offset + self.len]
    }

    fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.storage[self.offset..self.offset + self.len]
    }
}

impl fmt::Display for Measured {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let m = &self.model;
        write!(
            f,
            "sequential read {:.0} MB/s, 4 KiB sequential reads {}/s, 4 KiB random reads {}/s, lone 4 KiB read {} µs (median)",
            m.rbps as f64 / 1e6,
            m.rseqiops,
            m.rrandiops,
            self.median_4k_qd1_us
        )?;
        if self.writes_measured {
            write!(f, "; writes {:.0} MB/s, {}/s sequential, {}/s random", m.wbps as f64 / 1e6, m.wseqiops, m.wrandiops)
        } else {
            write!(f, "; writes not measured (no write file): taken equal to the reads")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEV: DevNum = DevNum { major: 7, minor: 3 };

    #[test]
    fn lines_have_the_kernels_format() {
        let m =
            CostModel { rbps: 3_000_000_000, rseqiops: 83_000, rrandiops: 100_000, wbps: 1, wseqiops: 2, wrandiops: 3 };
        assert_eq!(
            m.line(DEV),
            "7:3 ctrl=user model=linear rbps=3000000000 rseqiops=83000 rrandiops=100000 wbps=1 wseqiops=2 wrandiops=3"
        );
        let q = QosTarget::from_latency(Duration::from_micros(100));
        assert_eq!(q.rlat_us, 2000, "never below 2 ms");
        assert_eq!(
            q.line(DEV),
            "7:3 enable=1 ctrl=user rpct=95.00 rlat=2000 wpct=95.00 wlat=2000 min=10.00 max=100.00"
        );
        assert_eq!(QosTarget::from_latency(Duration::from_millis(3)).rlat_us, 15_000, "five times a slow device's");
        let undo = undo_lines(DEV);
        assert_eq!(undo[0], ("7:3 enable=0 ctrl=auto".to_string(), IO_COST_QOS));
        assert_eq!(undo[1], ("7:3 ctrl=auto".to_string(), IO_COST_MODEL));
    }

    #[test]
    fn apply_writes_both_files_and_checks_the_result() {
        let tmp = tempfile::tempdir().unwrap();
        // A regular file stands in for the kernel's: the write replaces its content, as a fixture can.
        std::fs::write(tmp.path().join(IO_COST_MODEL), "").unwrap();
        std::fs::write(tmp.path().join(IO_COST_QOS), "").unwrap();
        let m = CostModel { rbps: 10, rseqiops: 20, rrandiops: 30, wbps: 40, wseqiops: 50, wrandiops: 60 };
        let q = QosTarget::from_latency(Duration::ZERO);
        apply(tmp.path(), DEV, &m, &q).unwrap();
        assert_eq!(read_line(&tmp.path().join(IO_COST_MODEL), DEV).unwrap().unwrap(), m.line(DEV));
        assert!(crate::blockdev::io_cost_enabled(tmp.path(), DEV).unwrap());
        // A qos file that does not say enable=1 afterwards is an error, not success.
        std::fs::remove_file(tmp.path().join(IO_COST_QOS)).unwrap();
        std::os::unix::fs::symlink("/dev/null", tmp.path().join(IO_COST_QOS)).unwrap();
        assert!(apply(tmp.path(), DEV, &m, &q).is_err(), "a symlinked file is refused (O_NOFOLLOW)");
    }

    #[test]
    fn measuring_a_file_gives_plausible_figures() {
        // O_DIRECT on tmpfs fails; a file on a disk works anywhere the tests run as on the test machine.
        let dir = tempfile::tempdir_in(std::env::current_dir().unwrap()).unwrap();
        let path = dir.path().join("dev.img");
        let f = File::create(&path).unwrap();
        f.set_len(64 << 20).unwrap();
        drop(f);
        let cal = Calibration { duration: Duration::from_millis(200), jobs: 2, write_file: Some(path.clone()) };
        let got = match measure(&path, &cal) {
            Ok(got) => got,
            Err(DeviceError::Io { source, .. }) if source.raw_os_error() == Some(libc::EINVAL) => {
                eprintln!("SKIPPED measuring_a_file_gives_plausible_figures: no O_DIRECT on this file system");
                return;
            }
            Err(e) => panic!("{e}"),
        };
        let m = got.model;
        assert!(m.rbps > 1 << 20 && m.rseqiops > 100 && m.rrandiops > 100, "{got}");
        assert!(m.wbps > 0 && m.wseqiops > 0 && m.wrandiops > 0 && got.writes_measured, "{got}");
        assert!(m.rbps > m.rrandiops * PAGE as u64 / 4, "1 MiB reads move more bytes than 4 KiB ones: {got}");
        let lone = lone_read_median(&path, Duration::from_millis(50)).unwrap();
        assert!(lone > Duration::ZERO && lone < Duration::from_secs(1), "{lone:?}");
        let tiny = dir.path().join("tiny.img");
        std::fs::write(&tiny, b"x").unwrap();
        let e = lone_read_median(&tiny, Duration::from_millis(50)).unwrap_err().to_string();
        assert!(e.contains("tiny.img") && e.contains("smaller than 4 KiB"), "{e}");
    }
}
