//! A block device's number, `MAJ:MIN` as the cgroup stat and weight files and `/sys/dev/block` write it.

use std::fmt;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

/// Why a [`DevNum`] could not be had; each variant names the text or the file. (The block-device layer turns these
/// into its own error with the same words.)
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DevNumError {
    /// The text is not `MAJ:MIN` in decimal.
    #[error("invalid device number {value:?}: expected MAJ:MIN")]
    Invalid {
        /// The rejected text.
        value: String,
    },
    /// `stat` of the file failed.
    #[error("cannot stat {path}: {source}")]
    Stat {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The node is not a block device, so it stands for no device number.
    #[error("device {path}: not a block device")]
    NotBlockDevice {
        /// The node.
        path: PathBuf,
    },
}

/// A block device number, `MAJ:MIN` as in the cgroup stat and weight files.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DevNum {
    /// Major number.
    pub major: u32,
    /// Minor number.
    pub minor: u32,
}

impl DevNum {
    /// The device a file or directory lives on (`st_dev`).
    pub fn of_path(path: &Path) -> Result<Self, DevNumError> {
        let meta = fs::metadata(path).map_err(|source| DevNumError::Stat { path: path.into(), source })?;
        Ok(Self::from_raw(meta.dev()))
    }

    /// The device a block-device node stands for (`st_rdev`, e.g. of `/dev/loop3`).
    pub fn of_node(node: &Path) -> Result<Self, DevNumError> {
        let meta = fs::metadata(node).map_err(|source| DevNumError::Stat { path: node.into(), source })?;
        if !std::os::unix::fs::FileTypeExt::is_block_device(&meta.file_type()) {
            return Err(DevNumError::NotBlockDevice { path: node.into() });
        }
        Ok(Self::from_raw(meta.rdev()))
    }

    fn from_raw(dev: u64) -> Self {
        Self { major: nix::sys::stat::major(dev) as u32, minor: nix::sys::stat::minor(dev) as u32 }
    }
}

impl FromStr for DevNum {
    type Err = DevNumError;

    /// Parses `8:16`.
    fn from_str(s: &str) -> Result<Self, DevNumError> {
        let invalid = || DevNumError::Invalid { value: s.into() };
        let (major, minor) = s.split_once(':').ok_or_else(invalid)?;
        let num = |t: &str| t.parse::<u32>().ok().filter(|_| t.bytes().all(|b| b.is_ascii_digit()));
        Ok(Self { major: num(major).ok_or_else(invalid)?, minor: num(minor).ok_or_else(invalid)? })
    }
}

impl fmt::Display for DevNum {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.major, self.minor)
    }
}

/// As `MAJ:MIN` (so it can key a JSON map: the agent's restore records).
impl serde::Serialize for DevNum {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for DevNum {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_only_decimal_maj_min() {
        assert_eq!("8:16".parse::<DevNum>().unwrap(), DevNum { major: 8, minor: 16 });
        assert_eq!(DevNum { major: 254, minor: 0 }.to_string(), "254:0");
        for bad in ["8", "8:-1", "+8:1", "8:1:2", ":1", "a:b"] {
            let err = bad.parse::<DevNum>().unwrap_err();
            assert_eq!(err.to_string(), format!("invalid device number {bad:?}: expected MAJ:MIN"));
        }
    }

    #[test]
    fn errors_name_the_file() {
        let err = DevNum::of_path(Path::new("/nonexistent/x")).unwrap_err();
        assert!(err.to_string().starts_with("cannot stat /nonexistent/x: "), "{err}");
        let dir = tempfile::tempdir().unwrap();
        let err = DevNum::of_node(dir.path()).unwrap_err();
        assert_eq!(err.to_string(), format!("device {}: not a block device", dir.path().display()));
        assert!(DevNum::of_path(dir.path()).is_ok());
    }
}
