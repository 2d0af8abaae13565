//! [`CounterReader`]: a cgroup's cumulative read/write bytes for one `pread` per sample.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use qos_core::IoCounters;

use super::dir::CgroupDir;
use super::error::{CgroupError, Result};
use super::mount::CgroupVersion;
use super::stat::{parse_blkio_stat, parse_io_stat};

/// v1 counters of BFQ: the devices where BFQ weights act.
pub const V1_BFQ_BYTES: &str = "blkio.bfq.io_service_bytes_recursive";
/// v1 counters of the throttling policy: on current kernels they only count I/O to devices the cgroup has a
/// throttle limit on.
pub const V1_THROTTLE_BYTES: &str = "blkio.throttle.io_service_bytes_recursive";
/// v2 counters: every device.
pub const V2_IO_STAT: &str = "io.stat";

const V1_CANDIDATES: &[&str] = &[V1_BFQ_BYTES, V1_THROTTLE_BYTES];
const V2_CANDIDATES: &[&str] = &[V2_IO_STAT];

/// First read buffer; a file that fills it is read again with a doubled buffer (once, then kept).
const INITIAL_BUFFER: usize = 4096;
/// A counter file larger than this is refused rather than grown into (thousands of devices).
const MAX_BUFFER: usize = 16 << 20;

/// Which file a [`CounterReader`] reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum CounterFileKind {
    /// v1 `blkio.bfq.io_service_bytes_recursive`.
    V1Bfq,
    /// v1 `blkio.throttle.io_service_bytes_recursive` (when BFQ is not available).
    V1Throttle,
    /// v2 `io.stat`.
    V2IoStat,
}

impl CounterFileKind {
    /// The file name inside the cgroup directory.
    pub fn file_name(self) -> &'static str {
        match self {
            Self::V1Bfq => V1_BFQ_BYTES,
            Self::V1Throttle => V1_THROTTLE_BYTES,
            Self::V2IoStat => V2_IO_STAT,
        }
    }

    fn from_file_name(name: &str) -> Self {
        match name {
            V1_BFQ_BYTES => Self::V1Bfq,
            V1_THROTTLE_BYTES => Self::V1Throttle,
            _ => Self::V2IoStat,
        }
    }
}

/// Reads one cgroup's cumulative I/O byte counters.
///
/// The file is chosen once, at [`CounterReader::open`] (v1: BFQ's counters if the kernel offers them, else the
/// throttle policy's; v2: `io.stat`), and kept open. Cgroup files are seq_files that regenerate their content on a
/// read at offset 0 (verified on kernel 6.18 by `tests/cgroup_real.rs`), so each [`CounterReader::read`] is one
/// `pread(fd, buf, 0)` into a buffer owned by the reader: one syscall and no allocation per sample.
#[derive(Debug)]
pub struct CounterReader {
    file: File,
    path: PathBuf,
    dir: PathBuf,
    kind: CounterFileKind,
    buf: Vec<u8>,
}

impl CounterReader {
    /// Picks the counter file of `dir` and opens it.
    ///
    /// Errors: [`CgroupError::MissingFile`] if none of the candidate files exists, [`CgroupError::Vanished`] if
    /// the cgroup is gone.
    pub fn open(dir: &CgroupDir) -> Result<Self> {
        let candidates = match dir.version() {
            CgroupVersion::V1 => V1_CANDIDATES,
            CgroupVersion::V2 => V2_CANDIDATES,
        };
        for name in candidates {
            let path = dir.path().join(name);
            let file = match OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW).open(&path) {
                Ok(file) => file,
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) && dir.path().is_dir() => continue,
                Err(e) => return Err(CgroupError::on_cgroup_file("open", &path, dir.path(), e)),
            };
            let kind = CounterFileKind::from_file_name(name);
            match kind {
                CounterFileKind::V1Throttle => tracing::debug!(path = %path.display(),
                    "no BFQ counters (BFQ not loaded?): using throttle counters, which only count devices with a \
                     throttle limit"),
                _ => tracing::debug!(path = %path.display(), "counter file"),
            }
            return Ok(Self { file, path, dir: dir.path().to_owned(), kind, buf: vec![0; INITIAL_BUFFER] });
        }
        if !dir.path().is_dir() {
            let source = std::io::Error::from_raw_os_error(libc::ENOENT);
            return Err(CgroupError::Vanished { path: dir.path().to_owned(), source });
        }
        Err(CgroupError::MissingFile { dir: dir.path().to_owned(), candidates })
    }

    /// The cumulative counters now. [`CgroupError::Vanished`] once the cgroup has been removed.
    pub fn read(&mut self) -> Result<IoCounters> {
        let len = loop {
            match self.file.read_at(&mut self.buf, 0) {
                // A full buffer may mean a truncated read: grow and read again from the start.
                Ok(n) if n == self.buf.len() && n < MAX_BUFFER => self.buf.resize(n * 2, 0),
                Ok(n) if n == self.buf.len() => {
                    let text = format!("more than {MAX_BUFFER} bytes");
                    return Err(CgroupError::parse(&self.path, 0, text.as_bytes(), "counter file too large"));
                }
                Ok(n) => break n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(CgroupError::on_cgroup_file("read", &self.path, &self.dir, e)),
            }
        };
        let bytes = &self.buf[..len];
        match self.kind {
            CounterFileKind::V2IoStat => parse_io_stat(&self.path, bytes),
            CounterFileKind::V1Bfq | CounterFileKind::V1Throttle => parse_blkio_stat(&self.path, bytes),
        }
    }

    /// The full path of the file being read.
    pub fn source_file(&self) -> &Path {
        &self.path
    }

    /// Which of the known counter files is being read.
    pub fn kind(&self) -> CounterFileKind {
        self.kind
    }
}
