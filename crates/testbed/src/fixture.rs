//! Fixture cgroups: directories in a temp dir holding the files a real cgroup of a given layout has, with
//! plausible content, and [`FixtureKernel`], which writes their weight files as the kernel does. No root needed.

use std::fs;
use std::path::Path;

use qos_agent::cgroup::{parse_weight_lines, CgroupFs, RealFs};

/// Verbatim `blkio.bfq.io_service_bytes_recursive` of a cgroup that read 64 MiB from loop0 (7:0), kernel 6.18.
pub const V1_STAT_64MIB: &str = "7:0 Read 67108864\n7:0 Write 0\n7:0 Sync 67108864\n7:0 Async 0\n7:0 Discard 0\n\
7:0 Total 67108864\nTotal 67108864\n";

/// Which layout a fixture cgroup imitates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// v1 with BFQ loaded: bfq counters (64 MiB read) and `blkio.bfq.weight` ("100\n"), throttle counters at zero.
    V1Bfq,
    /// v1 without BFQ (CFQ era): throttle counters (4 KiB read, 8 KiB written) and `blkio.weight` (500).
    V1Legacy,
    /// v2 with BFQ: `io.stat` (two devices), `io.bfq.weight` and `io.weight`.
    V2Bfq,
    /// v2 without BFQ: `io.stat` and `io.weight` (with a per-device override) only.
    V2Io,
}

/// Writes the files of `layout` into the directory `dir` (created with its parents).
pub fn make_cgroup(dir: &Path, layout: Layout) {
    fs::create_dir_all(dir).unwrap();
    let files: &[(&str, &str)] = match layout {
        Layout::V1Bfq => &[
            ("blkio.bfq.io_service_bytes_recursive", V1_STAT_64MIB),
            ("blkio.throttle.io_service_bytes_recursive", "Total 0\n"),
            ("blkio.bfq.weight", "100\n"),
            ("blkio.bfq.weight_device", "default 100\n"),
            ("cgroup.procs", ""),
        ],
        Layout::V1Legacy => &[
            (
                "blkio.throttle.io_service_bytes_recursive",
                "8:0 Read 4096\n8:0 Write 8192\n8:0 Sync 12288\n\
8:0 Async 0\n8:0 Discard 0\n8:0 Total 12288\nTotal 12288\n",
            ),
            ("blkio.weight", "500\n"),
            ("cgroup.procs", ""),
        ],
        Layout::V2Bfq => &[
            (
                "io.stat",
                "8:16 rbytes=1000 wbytes=2000 rios=3 wios=4 dbytes=0 dios=0\n\
8:0 rbytes=1 wbytes=2 rios=1 wios=1 dbytes=0 dios=0\n",
            ),
            ("io.bfq.weight", "default 100\n"),
            ("io.weight", "default 100\n"),
            ("cgroup.procs", ""),
        ],
        Layout::V2Io => &[
            ("io.stat", "8:16 rbytes=5 wbytes=7 rios=1 wios=1 dbytes=0 dios=0\n"),
            ("io.weight", "default 100\n8:16 200\n"),
            ("cgroup.procs", ""),
        ],
    };
    for (name, content) in files {
        fs::write(dir.join(name), content).unwrap();
    }
}

/// The kernel's weight-file writes on regular fixture files (give it to a fixture root:
/// `CgroupRoot::from_dir(..)?.with_fs(Arc::new(FixtureKernel))`). A regular file's write replaces its content;
/// the kernel instead applies the one line written (`default N`, `MAJ:MIN N`, `MAJ:MIN default`) to the file's
/// state and shows `default N` first, then the overrides by device. In BFQ's files (`io.bfq.weight`,
/// `blkio.bfq.weight_device`) `default N` also removes every override, as Linux 6.18 does. v1 plain-number files
/// and anything that does not parse are written as they are.
#[derive(Debug, Clone, Copy, Default)]
pub struct FixtureKernel;

impl CgroupFs for FixtureKernel {
    fn write(&self, path: &Path, data: &[u8]) -> std::io::Result<usize> {
        match merge(path, data) {
            Some(merged) => RealFs.write(path, merged.as_bytes()).map(|_| data.len()),
            None => RealFs.write(path, data),
        }
    }
}

/// The content a fixture file with per-device lines has after `data` is written to it, or `None` to write `data` as it is.
fn merge(path: &Path, data: &[u8]) -> Option<String> {
    let old = fs::read(path).ok()?;
    if !old.windows(7).any(|w| w == b"default") {
        return None;
    }
    let mut lines = parse_weight_lines(path, &old).ok()?;
    let mut fields = std::str::from_utf8(data).ok()?.split_whitespace();
    let (Some(key), Some(value), None) = (fields.next(), fields.next(), fields.next()) else { return None };
    match (key, value) {
        ("default", v) => {
            lines.default = v.parse().ok()?;
            if path.file_name().is_some_and(|n| n.to_string_lossy().contains(".bfq.")) {
                lines.devices.clear();
            }
        }
        (dev, "default") => {
            lines.devices.remove(&dev.parse().ok()?);
        }
        (dev, v) => {
            lines.devices.insert(dev.parse().ok()?, v.parse().ok()?);
        }
    }
    let mut out = format!("default {}\n", lines.default);
    for (dev, v) in &lines.devices {
        out.push_str(&format!("{dev} {v}\n"));
    }
    Some(out)
}
