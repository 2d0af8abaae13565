//! Finding the block-I/O cgroup hierarchy once, from `/proc/self/mountinfo`.

use std::fmt;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use super::error::{CgroupError, Result};
use super::fs::{CgroupFs, FsHandle};
use crate::kernel::mountinfo::{MountLine, MOUNTINFO};

/// Which cgroup interface the block-I/O files follow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CgroupVersion {
    /// A v1 `blkio` hierarchy: `blkio.bfq.*`, `blkio.throttle.*`, `blkio.weight`.
    V1,
    /// The v2 unified hierarchy with the `io` controller: `io.stat`, `io.weight`, `io.bfq.weight`.
    V2,
}

impl fmt::Display for CgroupVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CgroupVersion::V1 => "v1",
            CgroupVersion::V2 => "v2",
        })
    }
}

/// The mounted hierarchy that all cgroup paths are resolved in, and confined to.
///
/// Detect it once at start-up with [`CgroupRoot::detect`] (or build one on a fixture directory with
/// [`CgroupRoot::from_dir`]); resolving a container's cgroup never parses mountinfo again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupRoot {
    pub(crate) version: CgroupVersion,
    /// Where the hierarchy is mounted, e.g. `/sys/fs/cgroup/blkio`.
    pub(crate) path: PathBuf,
    /// Which cgroup of the hierarchy the mount shows (mountinfo's 4th field): "/" on the host; a container's own
    /// cgroup when the agent runs in a container without a cgroup namespace. Paths from `/proc/PID/cgroup` are
    /// relative to the hierarchy's real root, so this prefix is stripped from them.
    pub(crate) mount_root: String,
    /// What the weight files of its directories are written through.
    pub(crate) fs: FsHandle,
}

impl CgroupRoot {
    /// The same root whose directories' weight files are written through `fs` (tests: a fixture kernel on
    /// regular files) instead of [`crate::cgroup::RealFs`].
    pub fn with_fs(mut self, fs: std::sync::Arc<dyn CgroupFs>) -> Self {
        self.fs = FsHandle(fs);
        self
    }

    /// Finds the hierarchy where block-I/O weights act: the v1 `blkio` hierarchy if one is mounted (on hybrid
    /// hosts the `blkio` controller lives there, and the v2 tree has no `io`), else the v2 unified hierarchy,
    /// which must offer the `io` controller in its `cgroup.controllers`.
    pub fn detect() -> Result<Self> {
        let text = fs::read_to_string(MOUNTINFO).map_err(|source| CgroupError::Io {
            op: "read",
            path: MOUNTINFO.into(),
            source,
        })?;
        let root = Self::from_mountinfo(&text, |dir| fs::read_to_string(dir.join("cgroup.controllers")))?;
        tracing::info!(version = %root.version, path = %root.path.display(), mount_root = %root.mount_root,
            "cgroup hierarchy for block I/O");
        Ok(root)
    }

    /// A root on an existing directory, for tests and for hosts where the hierarchy is mounted somewhere that
    /// mountinfo detection should not decide. The path is canonicalized, so it contains no symlinks.
    pub fn from_dir(version: CgroupVersion, path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let canonical =
            fs::canonicalize(path).map_err(|source| CgroupError::Io { op: "resolve", path: path.into(), source })?;
        if !canonical.is_dir() {
            let source = io::Error::new(io::ErrorKind::NotADirectory, "cgroup root is not a directory");
            return Err(CgroupError::Io { op: "use", path: canonical, source });
        }
        Ok(Self { version, path: canonical, mount_root: "/".into(), fs: FsHandle::default() })
    }

    /// The cgroup interface of this hierarchy.
    pub fn version(&self) -> CgroupVersion {
        self.version
    }

    /// The mount point of the hierarchy.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Pure part of [`CgroupRoot::detect`]: chooses from mountinfo text; `controllers` reads a v2 mount's
    /// `cgroup.controllers` (only called when no v1 `blkio` hierarchy exists).
    pub(crate) fn from_mountinfo(text: &str, controllers: impl FnOnce(&Path) -> io::Result<String>) -> Result<Self> {
        let mut v1 = None;
        let mut v2 = None;
        for line in text.lines() {
            let Some(m) = MountLine::parse(line) else { continue };
            match m.fstype {
                "cgroup" if v1.is_none() && m.super_options.split(',').any(|o| o == "blkio") => v1 = Some(m),
                "cgroup2" if v2.is_none() => v2 = Some(m),
                _ => {}
            }
        }
        if let Some(m) = v1 {
            return Ok(Self {
                version: CgroupVersion::V1,
                path: m.mount_point.into(),
                mount_root: m.root,
                fs: FsHandle::default(),
            });
        }
        let Some(m) = v2 else {
            return Err(CgroupError::NoController {
                reason: "mountinfo shows neither a cgroup v1 blkio hierarchy nor a cgroup2 mount".into(),
            });
        };
        let path = PathBuf::from(m.mount_point);
        let list = controllers(&path).map_err(|source| CgroupError::Io {
            op: "read",
            path: path.join("cgroup.controllers"),
            source,
        })?;
        if !list.split_whitespace().any(|c| c == "io") {
            return Err(CgroupError::NoController {
                reason: format!(
                    "cgroup2 at {} lacks the io controller (cgroup.controllers: {:?}) and no v1 blkio is mounted",
                    path.display(),
                    list.trim()
                ),
            });
        }
        Ok(Self { version: CgroupVersion::V2, path, mount_root: m.root, fs: FsHandle::default() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This machine: v1 controllers each on their own mount, cgroup2 at /sys/fs/cgroup/unified.
    const HYBRID: &str = "\
27 1 254:0 / / rw,relatime - ext4 /dev/vda rw,discard
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
38 31 0:35 / /sys/fs/cgroup/blkio rw,relatime shared:9 - cgroup cgroup rw,blkio
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

    const PURE_V2: &str = "\
24 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
30 25 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate
";

    const COMOUNTED: &str = "\
22 1 8:2 / / rw - xfs /dev/sda2 rw
35 31 0:31 / /sys/fs/cgroup/cpu,cpuacct,blkio rw,nosuid - cgroup cgroup rw,cpu,cpuacct,blkio
36 31 0:32 /docker/abc /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory
";

    fn no_read(_: &Path) -> io::Result<String> {
        panic!("cgroup.controllers must not be read when v1 blkio exists")
    }

    #[test]
    fn hybrid_prefers_v1_blkio() {
        let root = CgroupRoot::from_mountinfo(HYBRID, no_read).unwrap();
        assert_eq!(root.version(), CgroupVersion::V1);
        assert_eq!(root.path(), Path::new("/sys/fs/cgroup/blkio"));
        assert_eq!(root.mount_root, "/");
    }

    #[test]
    fn comounted_blkio_is_found_by_super_options() {
        let root = CgroupRoot::from_mountinfo(COMOUNTED, no_read).unwrap();
        assert_eq!(root.version(), CgroupVersion::V1);
        assert_eq!(root.path(), Path::new("/sys/fs/cgroup/cpu,cpuacct,blkio"));
    }

    #[test]
    fn pure_v2_needs_io_controller() {
        let root = CgroupRoot::from_mountinfo(PURE_V2, |p| {
            assert_eq!(p, Path::new("/sys/fs/cgroup"));
            Ok("cpuset cpu io memory pids\n".into())
        })
        .unwrap();
        assert_eq!(root.version(), CgroupVersion::V2);
        assert_eq!(root.path(), Path::new("/sys/fs/cgroup"));

        let err = CgroupRoot::from_mountinfo(PURE_V2, |_| Ok("cpu memory iox\n".into())).unwrap_err();
        assert!(matches!(err, CgroupError::NoController { ref reason } if reason.contains("lacks the io")), "{err}");
    }

    #[test]
    fn v2_controllers_read_error_names_the_file() {
        let err = CgroupRoot::from_mountinfo(PURE_V2, |_| Err(io::ErrorKind::PermissionDenied.into())).unwrap_err();
        assert!(err.to_string().contains("/sys/fs/cgroup/cgroup.controllers"), "{err}");
    }

    #[test]
    fn hybrid_without_blkio_falls_back_to_v2_and_reports_missing_io() {
        let text = HYBRID.replace("rw,blkio", "rw,pids");
        let err = CgroupRoot::from_mountinfo(&text, |_| Ok(String::new())).unwrap_err();
        assert!(err.to_string().contains("/sys/fs/cgroup/unified"), "{err}");
    }

    #[test]
    fn nothing_mounted() {
        let err = CgroupRoot::from_mountinfo("", no_read).unwrap_err();
        assert!(matches!(err, CgroupError::NoController { .. }));
        let err = CgroupRoot::from_mountinfo("garbage\n1 2 3\n", no_read).unwrap_err();
        assert!(matches!(err, CgroupError::NoController { .. }));
    }

    #[test]
    fn blkio_must_be_a_whole_option() {
        let text = "38 31 0:35 / /x rw - cgroup cgroup rw,blkio2\n";
        assert!(CgroupRoot::from_mountinfo(text, no_read).is_err());
    }

    #[test]
    fn escapes_and_mount_root() {
        let text = "38 31 0:35 /docker/a\\040b /sys/fs/cgroup/my\\040blkio rw - cgroup cgroup rw,blkio\n";
        let root = CgroupRoot::from_mountinfo(text, no_read).unwrap();
        assert_eq!(root.path(), Path::new("/sys/fs/cgroup/my blkio"));
        assert_eq!(root.mount_root, "/docker/a b");
    }
}
