//! [`CgroupDir`]: a cgroup directory resolved from a relative path or a pid, confined to the [`CgroupRoot`].
//!
//! ## How confinement is checked, and why that is enough
//! A relative path is first checked lexically (only plain components: no `..`, no leading `/`), then walked
//! component by component with `symlink_metadata` (lstat): every component must exist and be a real directory,
//! never a symlink. The root itself is trusted (it comes from mountinfo, or is canonicalized by
//! [`CgroupRoot::from_dir`]).
//!
//! This check happens at resolution time only, and later opens use the path again. That leaves no window on a
//! real cgroup filesystem: cgroupfs (kernfs) has no `symlink` operation, so nobody, root included, can put a
//! symlink inside the hierarchy after the check; all that can happen is a directory being removed (seen later as
//! ENOENT/ENODEV: [`CgroupError::Vanished`]), or removed and recreated under the same name, which is the same
//! cgroup name and as far as the kernel is concerned a legitimate cgroup. Files are additionally opened with
//! `O_NOFOLLOW`. On ordinary filesystems (test fixtures) a symlink could be swapped in after the check; that is a
//! test environment, not a trust boundary. `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)` would close that gap
//! too, but needs a directory fd per cgroup kept open (or a root fd and per-open resolution) for no gain on cgroupfs.

use std::fs;
use std::path::{Component, Path, PathBuf};

use super::error::{CgroupError, InvalidName, Result};
use super::fs::FsHandle;
use super::mount::{CgroupRoot, CgroupVersion};

/// A cgroup directory that existed, as a real directory reached without symlinks, under its [`CgroupRoot`] when
/// it was resolved. Only the `resolve_*` methods of [`CgroupRoot`] make one.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CgroupDir {
    path: PathBuf,
    version: CgroupVersion,
    fs: FsHandle,
    /// The root it was resolved under: [`CgroupDir::resolve_other`] confines to it too.
    root: PathBuf,
}

impl CgroupDir {
    /// The absolute path of the directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The cgroup interface of the hierarchy the directory is in.
    pub fn version(&self) -> CgroupVersion {
        self.version
    }

    /// What its weight files are written through (its root's).
    pub(crate) fn fs(&self) -> &FsHandle {
        &self.fs
    }

    /// Another directory of the same hierarchy by its absolute path (e.g. the cgroup a container had before this
    /// one), resolved and confined like [`CgroupRoot::resolve_relative`] under the root this one was resolved under.
    pub fn resolve_other(&self, path: &Path) -> Result<CgroupDir> {
        resolve_absolute_in(&self.root, self.version, &self.fs, path)
    }
}

impl CgroupRoot {
    /// The cgroup directory `rel` below the root, e.g. `docker/<id>` or `system.slice/docker-<id>.scope`.
    ///
    /// `rel` must be relative: plain components only (no `..`, no leading `/`); the empty string is the root
    /// itself. Every component must exist and be a real directory, not a symlink. A missing directory is
    /// reported as [`CgroupError::Vanished`].
    pub fn resolve_relative(&self, rel: &str) -> Result<CgroupDir> {
        resolve_in(&self.path, self.version, &self.fs, rel)
    }

    /// The cgroup directory at the absolute `path` (one a record kept), resolved and confined like
    /// [`Self::resolve_relative`]: a path not below the root is [`CgroupError::OutsideRoot`].
    pub fn resolve_absolute(&self, path: &Path) -> Result<CgroupDir> {
        resolve_absolute_in(&self.path, self.version, &self.fs, path)
    }

    /// The cgroup of process `pid` in this hierarchy, from `/proc/PID/cgroup`. A process that is gone gives
    /// [`CgroupError::Vanished`].
    pub fn resolve_pid(&self, pid: u32) -> Result<CgroupDir> {
        if pid == 0 {
            return Err(CgroupError::InvalidName(InvalidName {
                what: "pid",
                value: "0".into(),
                reason: "not a process",
            }));
        }
        let file = PathBuf::from(format!("/proc/{pid}/cgroup"));
        let text = fs::read(&file).map_err(|source| match source.raw_os_error() {
            Some(libc::ENOENT | libc::ESRCH) => CgroupError::Vanished { path: file.clone(), source },
            _ => CgroupError::Io { op: "read", path: file.clone(), source },
        })?;
        self.resolve_proc_cgroup(&file, &text)
    }

    /// [`CgroupRoot::resolve_pid`] on the text of a `/proc/PID/cgroup` file (`file` names it in errors).
    pub fn resolve_proc_cgroup(&self, file: &Path, text: &[u8]) -> Result<CgroupDir> {
        let hierarchy_path = proc_cgroup_path(file, text, self.version)?;
        let rel = self.strip_mount_root(hierarchy_path)?;
        self.resolve_relative(rel)
    }

    /// Makes a path of the hierarchy (as /proc shows it) relative to what this mount shows.
    fn strip_mount_root<'a>(&self, hierarchy_path: &'a str) -> Result<&'a str> {
        let root = self.mount_root.trim_end_matches('/');
        let rest = hierarchy_path.strip_prefix(root).filter(|rest| rest.is_empty() || rest.starts_with('/'));
        match rest {
            Some(rest) => Ok(rest.trim_start_matches('/')),
            None => Err(CgroupError::OutsideRoot {
                path: hierarchy_path.into(),
                root: self.path.clone(),
                reason: "the process's cgroup is not below the mounted part of the hierarchy",
            }),
        }
    }
}

/// [`CgroupRoot::resolve_absolute`] under `root` (the root's path, version and file system).
fn resolve_absolute_in(root: &Path, version: CgroupVersion, fs: &FsHandle, path: &Path) -> Result<CgroupDir> {
    let outside = |reason| CgroupError::OutsideRoot { path: path.display().to_string(), root: root.to_owned(), reason };
    let rel = path.strip_prefix(root).map_err(|_| outside("not below the cgroup root"))?;
    let rel = rel.to_str().ok_or_else(|| outside("not UTF-8"))?;
    resolve_in(root, version, fs, rel)
}

/// [`CgroupRoot::resolve_relative`] under `root` (the root's path, version and file system).
fn resolve_in(root: &Path, version: CgroupVersion, fs: &FsHandle, rel: &str) -> Result<CgroupDir> {
    let outside = |reason| CgroupError::OutsideRoot { path: rel.into(), root: root.to_owned(), reason };
    if rel.contains('\0') {
        return Err(CgroupError::InvalidName(InvalidName {
            what: "cgroup path",
            value: rel.into(),
            reason: "contains NUL",
        }));
    }
    let mut parts = Vec::new();
    for component in Path::new(rel).components() {
        match component {
            Component::Normal(part) => parts.push(part),
            Component::CurDir => {}
            Component::ParentDir => return Err(outside("contains a `..` component")),
            Component::RootDir | Component::Prefix(_) => return Err(outside("is absolute")),
        }
    }
    let mut path = root.to_owned();
    for part in parts {
        path.push(part);
        match fs::symlink_metadata(&path) {
            Ok(meta) if meta.file_type().is_symlink() => return Err(outside("a component is a symlink")),
            Ok(meta) if meta.is_dir() => {}
            Ok(_) => {
                let source = std::io::Error::new(std::io::ErrorKind::NotADirectory, "not a cgroup directory");
                return Err(CgroupError::Io { op: "use", path, source });
            }
            Err(source) if source.kind() == std::io::ErrorKind::NotFound => {
                return Err(CgroupError::Vanished { path, source })
            }
            Err(source) => return Err(CgroupError::Io { op: "stat", path, source }),
        }
    }
    tracing::trace!(path = %path.display(), "resolved cgroup");
    Ok(CgroupDir { path, version, fs: fs.clone(), root: root.to_owned() })
}

/// The path of the block-I/O hierarchy in `/proc/PID/cgroup` text: for v1 the line whose controller list
/// contains `blkio` (`7:blkio:/docker/<id>`, `4:cpu,cpuacct,blkio:/x`); for v2 the `0::/path` line.
pub(crate) fn proc_cgroup_path<'a>(file: &Path, text: &'a [u8], version: CgroupVersion) -> Result<&'a str> {
    for (index, line) in text.split(|b| *b == b'\n').enumerate() {
        if line.is_empty() {
            continue;
        }
        let line_text =
            std::str::from_utf8(line).map_err(|_| CgroupError::parse(file, index + 1, line, "not UTF-8"))?;
        let mut fields = line_text.splitn(3, ':');
        let (Some(_id), Some(controllers), Some(path)) = (fields.next(), fields.next(), fields.next()) else {
            return Err(CgroupError::parse(file, index + 1, line, "expected ID:CONTROLLERS:PATH"));
        };
        let wanted = match version {
            CgroupVersion::V1 => controllers.split(',').any(|c| c == "blkio"),
            CgroupVersion::V2 => controllers.is_empty() && line_text.starts_with("0::"),
        };
        if wanted {
            if !path.starts_with('/') {
                return Err(CgroupError::parse(file, index + 1, line, "cgroup path is not absolute"));
            }
            return Ok(path);
        }
    }
    let what = match version {
        CgroupVersion::V1 => "no blkio line",
        CgroupVersion::V2 => "no 0:: line",
    };
    Err(CgroupError::parse(file, 0, b"", what))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str, version: CgroupVersion) -> Result<&str> {
        proc_cgroup_path(Path::new("/proc/1/cgroup"), text.as_bytes(), version)
    }

    #[test]
    fn proc_cgroup_v1_blkio_line() {
        let text = "9:name=systemd:/\n8:pids:/\n7:blkio:/docker/abc\n0::/\n";
        assert_eq!(parse(text, CgroupVersion::V1).unwrap(), "/docker/abc");
        let text = "4:cpu,cpuacct,blkio:/system.slice/docker-x.scope\n";
        assert_eq!(parse(text, CgroupVersion::V1).unwrap(), "/system.slice/docker-x.scope");
        // A path may contain ':'.
        assert_eq!(parse("7:blkio:/a:b\n", CgroupVersion::V1).unwrap(), "/a:b");
        assert!(parse("7:blkio2:/a\n0::/\n", CgroupVersion::V1).is_err());
    }

    #[test]
    fn proc_cgroup_v2_line() {
        assert_eq!(parse("0::/user.slice/x.scope\n", CgroupVersion::V2).unwrap(), "/user.slice/x.scope");
        assert_eq!(parse("7:blkio:/d\n0::/\n", CgroupVersion::V2).unwrap(), "/");
        let err = parse("7:blkio:/d\n", CgroupVersion::V2).unwrap_err();
        assert!(matches!(err, CgroupError::Parse { line: 0, .. }), "{err}");
    }

    #[test]
    fn proc_cgroup_garbage() {
        let err = parse("7:blkio:/d\nnonsense\n", CgroupVersion::V2).unwrap_err();
        assert!(matches!(err, CgroupError::Parse { line: 2, ref text, .. } if text == "nonsense"), "{err}");
        let err = proc_cgroup_path(Path::new("f"), b"7:blkio:/\xff\n", CgroupVersion::V1).unwrap_err();
        assert!(matches!(err, CgroupError::Parse { line: 1, .. }), "{err}");
        assert!(parse("", CgroupVersion::V1).is_err());
        assert!(parse("7:blkio:relative\n", CgroupVersion::V1).is_err());
    }

    #[test]
    fn mount_root_is_stripped() {
        let root = CgroupRoot {
            version: CgroupVersion::V1,
            path: "/r".into(),
            mount_root: "/docker/a".into(),
            fs: Default::default(),
        };
        assert_eq!(root.strip_mount_root("/docker/a").unwrap(), "");
        assert_eq!(root.strip_mount_root("/docker/a/b").unwrap(), "b");
        assert!(root.strip_mount_root("/docker/ab").is_err());
        assert!(root.strip_mount_root("/").is_err());
        let host = CgroupRoot { mount_root: "/".into(), ..root };
        assert_eq!(host.strip_mount_root("/docker/x").unwrap(), "docker/x");
        assert_eq!(host.strip_mount_root("/").unwrap(), "");
    }
}
