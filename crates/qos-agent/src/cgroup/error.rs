//! [`CgroupError`]: every failure of the cgroup layer, each naming the file or device it concerns.

use std::io;
use std::path::{Path, PathBuf};

use qos_core::WeightError;

pub use crate::kernel::InvalidName;

/// Result of the cgroup layer.
pub type Result<T, E = CgroupError> = std::result::Result<T, E>;

/// A failure of the cgroup layer.
///
/// File errors carry the path (and, for writes, the data written); parse errors carry the file, the line and the
/// offending text. [`CgroupError::is_vanished`] tells a cgroup that went away (a container that stopped) from a
/// real fault.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CgroupError {
    /// Opening, reading or inspecting a file failed.
    #[error("cannot {op} {path}: {source}")]
    Io {
        /// What was attempted: "open", "read", "stat", "read link of".
        op: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// Writing a file failed (the kernel rejected the value, or the write was short).
    #[error("cannot write {data:?} to {path}: {source}")]
    Write {
        /// The file.
        path: PathBuf,
        /// Exactly what was written.
        data: String,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The cgroup (or process) is gone: ENOENT with its directory gone too, or ENODEV on an open cgroup file.
    /// Treat it as a removal, not as a fault.
    #[error("{path} vanished: {source}")]
    Vanished {
        /// The file or directory that was being accessed.
        path: PathBuf,
        /// The OS error that showed it.
        #[source]
        source: io::Error,
    },
    /// A file's content is not in the expected format.
    #[error("{file}:{line}: {reason}: {text:?}")]
    Parse {
        /// The file.
        file: PathBuf,
        /// 1-based line number; 0 when the complaint is about the whole file (e.g. a missing line).
        line: usize,
        /// The offending text (lossily decoded if it was not UTF-8).
        text: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A path that would leave the cgroup root (`..`, absolute, or a symlink on the way), or a process whose
    /// cgroup is outside the mounted hierarchy.
    #[error("cgroup path {path:?} is outside the cgroup root {root}: {reason}")]
    OutsideRoot {
        /// The path as given (or as read from /proc).
        path: String,
        /// The cgroup root it must stay under.
        root: PathBuf,
        /// Why it was refused.
        reason: &'static str,
    },
    /// An identifier that cannot be right: a container id, a systemd slice, a pid.
    #[error(transparent)]
    InvalidName(#[from] InvalidName),
    /// None of the files this layer knows how to use exists in the cgroup directory.
    #[error("none of {candidates:?} exists in {dir}")]
    MissingFile {
        /// The cgroup directory.
        dir: PathBuf,
        /// The file names looked for, in order of preference.
        candidates: &'static [&'static str],
    },
    /// A weight file read back a different value than was just written (values on the file's own scale).
    #[error("wrote {wrote} to {path} but read back {read}")]
    Mismatch {
        /// The weight file.
        path: PathBuf,
        /// The value written, on the file's scale.
        wrote: u32,
        /// The value read back, on the file's scale.
        read: u32,
    },
    /// On cgroup v2: a device's effective weight in the file that governs it (its `MAJ:MIN` override if there is
    /// one, else the default) is not what was written (values on the file's own scale).
    #[error("wrote weight {wrote} to {path} but device {device} reads back {read} there ({what})")]
    DeviceMismatch {
        /// The weight file that governs the device.
        path: PathBuf,
        /// The device, `MAJ:MIN`.
        device: String,
        /// The value written.
        wrote: u32,
        /// The device's effective value read back.
        read: u32,
        /// Which line it came from: "its MAJ:MIN override" or "the default".
        what: &'static str,
    },
    /// A throttle file (v1 `blkio.throttle.{read,write}_bps_device`, v2 `io.max`) does not read back, on a
    /// device, the byte-rate limit just written (`None`: no limit).
    #[error("wrote {what} limit {} to {path} but device {device} reads back {}", show_limit(.wrote), show_limit(.read))]
    LimitMismatch {
        /// The throttle file.
        path: PathBuf,
        /// The device, `MAJ:MIN`.
        device: String,
        /// Which limit: "read bytes/s" or "write bytes/s".
        what: &'static str,
        /// The limit written.
        wrote: Option<u64>,
        /// The limit read back.
        read: Option<u64>,
    },
    /// A weight file holds a value that is not a valid weight for that file.
    #[error("{path} holds weight {value} outside the file's range: {source}")]
    WeightRange {
        /// The weight file.
        path: PathBuf,
        /// The value read.
        value: u64,
        /// The range violation.
        #[source]
        source: WeightError,
    },
    /// No usable block-I/O cgroup controller on this host (no v1 `blkio` hierarchy, no v2 `io` controller).
    #[error("no usable block-I/O cgroup controller: {reason}")]
    NoController {
        /// What was found instead.
        reason: String,
    },
}

impl CgroupError {
    /// True when the cgroup or process went away; the caller should treat the container as removed.
    pub fn is_vanished(&self) -> bool {
        matches!(self, CgroupError::Vanished { .. })
    }

    /// Classifies an error on a file inside a cgroup directory: ENODEV, or ENOENT while the directory itself is
    /// gone, means the cgroup vanished. ENOENT with the directory still present is a plain I/O error (a missing
    /// file is a configuration problem, not a removal).
    pub(crate) fn on_cgroup_file(op: &'static str, path: &Path, dir: &Path, source: io::Error) -> Self {
        let vanished = match source.raw_os_error() {
            Some(libc::ENODEV) => true,
            Some(libc::ENOENT) => !dir_exists(dir),
            _ => false,
        };
        if vanished {
            CgroupError::Vanished { path: path.to_owned(), source }
        } else {
            CgroupError::Io { op, path: path.to_owned(), source }
        }
    }

    /// Like [`CgroupError::on_cgroup_file`] for a write: a rejected value keeps the data in the error.
    pub(crate) fn on_cgroup_write(path: &Path, dir: &Path, data: &str, source: io::Error) -> Self {
        match Self::on_cgroup_file("write", path, dir, source) {
            CgroupError::Io { path, source, .. } => CgroupError::Write { path, data: data.to_owned(), source },
            vanished => vanished,
        }
    }

    /// A parse error; `text` is decoded lossily so non-UTF-8 input can still be shown.
    pub(crate) fn parse(file: &Path, line: usize, text: &[u8], reason: impl Into<String>) -> Self {
        CgroupError::Parse {
            file: file.to_owned(),
            line,
            text: String::from_utf8_lossy(text).into_owned(),
            reason: reason.into(),
        }
    }
}

/// A byte-rate limit as the errors show it: the number, or "no limit".
fn show_limit(limit: &Option<u64>) -> String {
    match limit {
        Some(v) => v.to_string(),
        None => "no limit".into(),
    }
}

fn dir_exists(dir: &Path) -> bool {
    std::fs::symlink_metadata(dir).map(|m| m.is_dir()).unwrap_or(false)
}
