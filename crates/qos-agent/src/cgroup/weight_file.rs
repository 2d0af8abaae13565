//! [`WeightFile`]: a cgroup's block-I/O weight, read and written on the engine's [`Weight`] scale and verified.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use qos_core::{Weight, WeightError};

use super::dir::CgroupDir;
use super::error::{CgroupError, Result};
use super::fs::FsHandle;
use super::mount::CgroupVersion;
use crate::kernel::DevNum;

/// v1 BFQ weight, 1..=1000. Reads `100\n`; accepts a plain number only ("default N" is EINVAL, checked on 6.18).
pub const V1_BFQ_WEIGHT: &str = "blkio.bfq.weight";
/// v1 BFQ per-device weights (Linux 5.4 on). Reads like v2's `io.bfq.weight` (`default 100\n` plus `MAJ:MIN N`
/// overrides, which win over the default on their device) and takes the same lines: `MAJ:MIN N` sets an override,
/// `MAJ:MIN default` removes one, `default N` (or `N`) sets the default, which `blkio.bfq.weight` then reads, and
/// removes every override (checked on Linux 6.18).
pub const V1_BFQ_WEIGHT_DEVICE: &str = "blkio.bfq.weight_device";
/// v1 CFQ weight, 10..=1000 (kernels before 5.0). Plain number.
pub const V1_BLKIO_WEIGHT: &str = "blkio.weight";
/// v2 BFQ weight, 1..=1000. Reads `default 100\n` plus `MAJ:MIN N` overrides; accepts `default N`.
pub const V2_BFQ_WEIGHT: &str = "io.bfq.weight";
/// v2 io.cost weight, 1..=10000. Reads `default 100\n` plus `MAJ:MIN N` overrides; accepts `default N`.
pub const V2_IO_WEIGHT: &str = "io.weight";

/// Which weight file a [`WeightFile`] manages; each has its own range and write format. Serialized as its file name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub enum WeightFileKind {
    /// v1 `blkio.bfq.weight`.
    #[serde(rename = "blkio.bfq.weight")]
    V1Bfq,
    /// v1 `blkio.bfq.weight_device`: BFQ's default and per-device weights, in v2's format.
    #[serde(rename = "blkio.bfq.weight_device")]
    V1BfqDevice,
    /// v1 `blkio.weight` (CFQ).
    #[serde(rename = "blkio.weight")]
    V1Blkio,
    /// v2 `io.bfq.weight`.
    #[serde(rename = "io.bfq.weight")]
    V2Bfq,
    /// v2 `io.weight` (io.cost).
    #[serde(rename = "io.weight")]
    V2Io,
}

impl WeightFileKind {
    /// The file name inside the cgroup directory.
    pub fn file_name(self) -> &'static str {
        match self {
            Self::V1Bfq => V1_BFQ_WEIGHT,
            Self::V1BfqDevice => V1_BFQ_WEIGHT_DEVICE,
            Self::V1Blkio => V1_BLKIO_WEIGHT,
            Self::V2Bfq => V2_BFQ_WEIGHT,
            Self::V2Io => V2_IO_WEIGHT,
        }
    }

    /// The value this file takes for `weight`.
    pub fn file_value(self, weight: Weight) -> u32 {
        match self {
            Self::V1Bfq | Self::V1BfqDevice | Self::V2Bfq => weight.to_bfq(),
            Self::V1Blkio => weight.to_v1_blkio_weight(),
            Self::V2Io => weight.to_io_weight(),
        }
    }

    /// The weight a value of this file stands for.
    pub fn weight_of(self, value: u64) -> Result<Weight, WeightError> {
        match self {
            Self::V1Bfq | Self::V1BfqDevice | Self::V2Bfq | Self::V1Blkio => Weight::new(value),
            Self::V2Io => {
                let value = u32::try_from(value).map_err(|_| WeightError::OutOfRange { value, min: 1, max: 10_000 })?;
                Weight::from_io_weight(value)
            }
        }
    }

    /// Whether writing this file's default also removes its per-device overrides. BFQ's files do: the kernel
    /// parses `default N` (and a plain `N`) in `io.bfq.weight` and `blkio.bfq.weight_device`, and the plain number
    /// of `blkio.bfq.weight`, as one "set the cgroup's weight", which resets every device of the cgroup to it (seen
    /// on Linux 6.18 on v1: `default 40` after `7:0 250` reads back `default 40` alone). io.cost's `io.weight` keeps
    /// its overrides.
    pub fn default_clears_overrides(self) -> bool {
        matches!(self, Self::V1Bfq | Self::V1BfqDevice | Self::V2Bfq)
    }

    /// Exactly what is written for file value `value`: the plain v1 files take a plain number, the files with
    /// per-device lines the documented `default N` form.
    fn data(self, value: u32) -> String {
        match self {
            Self::V1Bfq | Self::V1Blkio => format!("{value}\n"),
            Self::V1BfqDevice | Self::V2Bfq | Self::V2Io => format!("default {value}\n"),
        }
    }

    fn candidates(version: CgroupVersion) -> &'static [Self] {
        match version {
            CgroupVersion::V1 => &[Self::V1Bfq, Self::V1Blkio],
            CgroupVersion::V2 => &[Self::V2Bfq, Self::V2Io],
        }
    }
}

const V1_NAMES: &[&str] = &[V1_BFQ_WEIGHT, V1_BLKIO_WEIGHT];
const V2_NAMES: &[&str] = &[V2_BFQ_WEIGHT, V2_IO_WEIGHT];

/// A cgroup's weight file: BFQ's if the kernel offers it (the weights that act on BFQ devices), else the legacy
/// v1 `blkio.weight` or v2 `io.weight`.
///
/// Only these file names (and v1's `blkio.bfq.weight_device`, through [`WeightFile::open_kind`]) are ever written,
/// and only inside a [`CgroupDir`] (which is confined to the cgroup root). Files are opened per operation with `O_NOFOLLOW` and never created: a missing file is an error. Writes
/// go through the directory's [`crate::cgroup::CgroupFs`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WeightFile {
    path: PathBuf,
    dir: PathBuf,
    kind: WeightFileKind,
    fs: FsHandle,
}

impl WeightFile {
    /// Finds the weight file of `dir`. [`CgroupError::MissingFile`] if there is none (e.g. v1 without BFQ and
    /// CFQ, or the root cgroup), [`CgroupError::Vanished`] if the cgroup is gone.
    pub fn open(dir: &CgroupDir) -> Result<Self> {
        for &kind in WeightFileKind::candidates(dir.version()) {
            let path = dir.path().join(kind.file_name());
            match std::fs::symlink_metadata(&path) {
                Ok(meta) if meta.is_file() => {
                    tracing::debug!(path = %path.display(), ?kind, "weight file");
                    return Ok(Self { path, dir: dir.path().to_owned(), kind, fs: dir.fs().clone() });
                }
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
                Err(e) => return Err(CgroupError::on_cgroup_file("stat", &path, dir.path(), e)),
            }
        }
        if !dir.path().is_dir() {
            let source = std::io::Error::from_raw_os_error(libc::ENOENT);
            return Err(CgroupError::Vanished { path: dir.path().to_owned(), source });
        }
        let candidates = match dir.version() {
            CgroupVersion::V1 => V1_NAMES,
            CgroupVersion::V2 => V2_NAMES,
        };
        Err(CgroupError::MissingFile { dir: dir.path().to_owned(), candidates })
    }

    /// The full path of the weight file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Which weight file this is.
    pub fn kind(&self) -> WeightFileKind {
        self.kind
    }

    /// The cgroup's weight (its default weight; per-device overrides are not ours), on the engine's scale.
    pub fn read(&self) -> Result<Weight> {
        let value = self.read_file_value()?;
        self.kind.weight_of(value.into()).map_err(|source| CgroupError::WeightRange {
            path: self.path.clone(),
            value: value.into(),
            source,
        })
    }

    /// Writes `weight` (converted to this file's scale). Does not read back; see [`WeightFile::write_verified`].
    pub fn write(&self, weight: Weight) -> Result<()> {
        let value = self.kind.file_value(weight);
        self.write_data(&self.kind.data(value))?;
        tracing::debug!(path = %self.path.display(), %weight, value, "wrote weight");
        Ok(())
    }

    /// Opens the file of `kind` in `dir` if the cgroup has it (`None` if not: e.g. `io.bfq.weight` without the
    /// BFQ module); [`CgroupError::Vanished`] if the cgroup is gone.
    pub fn open_kind(dir: &CgroupDir, kind: WeightFileKind) -> Result<Option<Self>> {
        let path = dir.path().join(kind.file_name());
        match std::fs::symlink_metadata(&path) {
            Ok(meta) if meta.is_file() => {
                Ok(Some(Self { path, dir: dir.path().to_owned(), kind, fs: dir.fs().clone() }))
            }
            Ok(_) => Ok(None),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) && dir.path().is_dir() => Ok(None),
            Err(e) => Err(CgroupError::on_cgroup_file("stat", &path, dir.path(), e)),
        }
    }

    /// The whole file: the default and every `MAJ:MIN N` override (v2's files, v1's `blkio.bfq.weight_device`), on
    /// the file's own scale.
    pub fn read_lines(&self) -> Result<WeightLines> {
        parse_weight_lines(&self.path, &self.read_bytes()?)
    }

    /// Writes `default VALUE` (files with per-device lines; VALUE on the file's own scale). The kernel leaves the
    /// overrides alone in `io.weight` and removes them in BFQ's files ([`WeightFileKind::default_clears_overrides`]).
    pub fn write_default_value(&self, value: u32) -> Result<()> {
        self.write_data(&format!("default {value}\n"))
    }

    /// Writes the override of one device: `MAJ:MIN VALUE`, or with `None` `MAJ:MIN default`, which removes the
    /// override (`io.weight`, `io.bfq.weight` and v1's `blkio.bfq.weight_device`, checked on Linux 6.18; a removal
    /// where there is no override is accepted and changes nothing).
    pub fn write_device(&self, dev: DevNum, value: Option<u32>) -> Result<()> {
        match value {
            Some(v) => self.write_data(&format!("{dev} {v}\n")),
            None => self.write_data(&format!("{dev} default\n")),
        }
    }

    /// One `write(2)` of `data` (see [`crate::cgroup::RealFs`]): a cgroup file parses each write call on its own.
    fn write_data(&self, data: &str) -> Result<()> {
        self.fs.write_file(&self.path, &self.dir, data)
    }

    /// Checks that the file holds what writing `weight` puts there. [`CgroupError::Mismatch`] (with both values
    /// on the file's scale) if not; useful on its own to notice someone else changing the weight.
    pub fn verify(&self, weight: Weight) -> Result<()> {
        let wrote = self.kind.file_value(weight);
        let read = self.read_file_value()?;
        if read == wrote {
            Ok(())
        } else {
            Err(CgroupError::Mismatch { path: self.path.clone(), wrote, read })
        }
    }

    /// [`WeightFile::write`], then [`WeightFile::verify`]: the kernel accepting a write is not proof it applies it
    /// (Docker, for one, reports success and discards weights on some kernels).
    pub fn write_verified(&self, weight: Weight) -> Result<()> {
        self.write(weight)?;
        self.verify(weight)
    }

    /// The default weight as the file states it, on the file's own scale.
    fn read_file_value(&self) -> Result<u32> {
        parse_default_weight(&self.path, &self.read_bytes()?)
    }

    fn read_bytes(&self) -> Result<Vec<u8>> {
        super::fs::read_file(&self.path, &self.dir)
    }
}

/// The content of a weight file with per-device lines (v2's, v1's `blkio.bfq.weight_device`): `default N` and the per-device `MAJ:MIN N` overrides (file scale).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WeightLines {
    /// The `default` line.
    pub default: u32,
    /// Per-device overrides, which win over the default on their device.
    pub devices: BTreeMap<DevNum, u32>,
}

impl WeightLines {
    /// The weight that acts on `dev` in this file: its override, else the default.
    pub fn effective(&self, dev: DevNum) -> u32 {
        self.devices.get(&dev).copied().unwrap_or(self.default)
    }
}

/// Parses a whole v2 weight file (or a v1 plain number, which has no overrides); `file` names it in errors.
pub fn parse_weight_lines(file: &Path, bytes: &[u8]) -> Result<WeightLines> {
    let default = parse_default_weight(file, bytes)?;
    let mut devices = BTreeMap::new();
    for (index, line) in bytes.split(|b| *b == b'\n').enumerate() {
        let mut fields = line.split(u8::is_ascii_whitespace).filter(|f| !f.is_empty());
        let (Some(device), Some(value)) = (fields.next(), fields.next()) else { continue };
        if device == b"default" {
            continue;
        }
        let err = |reason: &str| CgroupError::parse(file, index + 1, line, reason);
        let dev: DevNum =
            std::str::from_utf8(device).ok().and_then(|d| d.parse().ok()).ok_or_else(|| err("bad device number"))?;
        let value = parse_u32(value).ok_or_else(|| err("bad per-device weight"))?;
        if devices.insert(dev, value).is_some() {
            return Err(err("second line for the same device"));
        }
    }
    Ok(WeightLines { default, devices })
}

/// The default weight in a weight file: `N` (v1) or a `default N` line (v2), possibly among `MAJ:MIN N`
/// per-device lines, which are skipped.
pub(crate) fn parse_default_weight(file: &Path, bytes: &[u8]) -> Result<u32> {
    let mut found = None;
    for (index, line) in bytes.split(|b| *b == b'\n').enumerate() {
        let err = |reason: &str| CgroupError::parse(file, index + 1, line, reason);
        let fields: [Option<&[u8]>; 3] = {
            let mut it = line.split(u8::is_ascii_whitespace).filter(|f| !f.is_empty());
            [it.next(), it.next(), it.next()]
        };
        let value = match fields {
            [None, ..] => continue,
            [Some(v), None, None] => v,
            [Some(b"default"), Some(v), None] => v,
            [Some(device), Some(v), None] if device.contains(&b':') => {
                parse_u32(v).ok_or_else(|| err("bad per-device weight"))?;
                continue;
            }
            _ => return Err(err("expected \"N\", \"default N\" or \"MAJ:MIN N\"")),
        };
        if found.is_some() {
            return Err(err("second default weight"));
        }
        found = Some(parse_u32(value).ok_or_else(|| err("bad weight"))?);
    }
    found.ok_or_else(|| CgroupError::parse(file, 0, bytes, "no default weight"))
}

fn parse_u32(field: &[u8]) -> Option<u32> {
    std::str::from_utf8(field).ok().filter(|s| s.bytes().all(|b| b.is_ascii_digit()))?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &[u8]) -> Result<u32> {
        parse_default_weight(Path::new("w"), text)
    }

    #[test]
    fn default_weight_formats() {
        assert_eq!(parse(b"100\n").unwrap(), 100);
        assert_eq!(parse(b"default 100\n").unwrap(), 100);
        assert_eq!(parse(b"default 100\n8:0 200\n8:16 300\n").unwrap(), 100);
        assert_eq!(parse(b"8:0 200\ndefault 7").unwrap(), 7);
        assert_eq!(parse(b"  500  \n").unwrap(), 500);
    }

    #[test]
    fn default_weight_garbage() {
        for (bad, line) in [
            (&b""[..], 0),
            (b"\n", 0),
            (b"8:0 200\n", 0),
            (b"default\n", 1),
            (b"default x\n", 1),
            (b"-5\n", 1),
            (b"100\n200\n", 2),
            (b"default 1 2\n", 1),
            (b"8:0 x\n", 1),
            (b"99999999999\n", 1),
            (b"\xff\n", 1),
            (b"dflt 10\n", 1),
        ] {
            match parse(bad) {
                Err(CgroupError::Parse { line: l, .. }) => assert_eq!(l, line, "{:?}", String::from_utf8_lossy(bad)),
                other => panic!("{:?} gave {other:?}", String::from_utf8_lossy(bad)),
            }
        }
    }

    #[test]
    fn conversions_per_kind() {
        let w = |v| Weight::new(v).unwrap();
        assert_eq!(WeightFileKind::V1Bfq.file_value(w(1)), 1);
        assert_eq!(WeightFileKind::V1Blkio.file_value(w(1)), 10);
        assert_eq!(WeightFileKind::V2Io.file_value(w(1000)), 1000);
        assert_eq!(WeightFileKind::V2Io.weight_of(10_000).unwrap(), Weight::MAX);
        assert!(WeightFileKind::V2Io.weight_of(10_001).is_err());
        assert!(WeightFileKind::V2Io.weight_of(u64::MAX).is_err());
        assert!(WeightFileKind::V1Bfq.weight_of(0).is_err());
        assert_eq!(WeightFileKind::V2Bfq.data(500), "default 500\n");
        assert_eq!(WeightFileKind::V1Bfq.data(500), "500\n");
        for kind in [WeightFileKind::V1Bfq, WeightFileKind::V1Blkio, WeightFileKind::V2Bfq, WeightFileKind::V2Io] {
            for v in [1, 9, 10, 100, 999, 1000] {
                let back = kind.weight_of(kind.file_value(w(v)).into()).unwrap();
                let expect = if kind == WeightFileKind::V1Blkio { v.max(10) } else { v };
                assert_eq!(u64::from(back.get()), expect, "{kind:?} {v}");
            }
        }
    }
}
