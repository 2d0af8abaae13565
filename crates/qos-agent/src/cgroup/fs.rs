//! [`CgroupFs`]: the seam through which the weight files are written. The agent writes with [`RealFs`]; a test
//! gives a root another implementation ([`CgroupRoot::with_fs`](super::CgroupRoot::with_fs)), e.g. testbed's
//! fixture kernel, which applies a line to a regular file the way the kernel applies it to a weight file. Reads
//! need no seam: a fixture file reads as the kernel's does.

use std::fs::OpenOptions;
use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::Arc;

use super::error::{CgroupError, Result};

/// Writes cgroup files.
pub trait CgroupFs: Send + Sync + std::fmt::Debug {
    /// One `write(2)` of `data` to the existing file `path` (never created); the number of bytes written.
    fn write(&self, path: &Path, data: &[u8]) -> std::io::Result<usize>;
}

/// The kernel's cgroup files: opened with `O_NOFOLLOW`, never created, written with one `write(2)` (a cgroup file
/// parses each write call on its own).
#[derive(Debug, Clone, Copy, Default)]
pub struct RealFs;

impl CgroupFs for RealFs {
    fn write(&self, path: &Path, data: &[u8]) -> std::io::Result<usize> {
        OpenOptions::new()
            .write(true)
            .create(false)
            // O_TRUNC as `echo N > file` and runc's `cgroups.WriteFile` open it; cgroupfs ignores it.
            .truncate(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(path)?
            .write(data)
    }
}

/// The [`CgroupFs`] a root and the directories resolved in it write through ([`RealFs`] unless a test says
/// otherwise). Not part of a directory's identity: two handles always compare equal.
#[derive(Debug, Clone)]
pub(crate) struct FsHandle(pub(crate) Arc<dyn CgroupFs>);

impl Default for FsHandle {
    fn default() -> Self {
        Self(Arc::new(RealFs))
    }
}

impl PartialEq for FsHandle {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for FsHandle {}

impl std::hash::Hash for FsHandle {
    fn hash<H: std::hash::Hasher>(&self, _: &mut H) {}
}

impl FsHandle {
    /// One `write(2)` of `data` to `path`, a file of the cgroup at `dir`: a short write is an error, a cgroup gone
    /// is [`CgroupError::Vanished`], a refused value keeps the data ([`CgroupError::on_cgroup_write`]).
    pub(crate) fn write_file(&self, path: &Path, dir: &Path, data: &str) -> Result<()> {
        match self.0.write(path, data.as_bytes()) {
            Ok(n) if n == data.len() => Ok(()),
            Ok(n) => {
                let source = std::io::Error::new(std::io::ErrorKind::WriteZero, format!("short write: {n} bytes"));
                Err(CgroupError::Write { path: path.to_owned(), data: data.to_owned(), source })
            }
            Err(e) => Err(CgroupError::on_cgroup_write(path, dir, data, e)),
        }
    }
}

/// The whole of `path`, a file of the cgroup at `dir`, never read through a symlink (`O_NOFOLLOW`); a cgroup gone is
/// [`CgroupError::Vanished`] ([`CgroupError::on_cgroup_file`]).
pub(crate) fn read_file(path: &Path, dir: &Path) -> Result<Vec<u8>> {
    let mut buf = Vec::with_capacity(256);
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .and_then(|mut f| f.read_to_end(&mut buf))
        .map_err(|e| CgroupError::on_cgroup_file("read", path, dir, e))?;
    Ok(buf)
}
