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
///
/// The throttle files too, as blk-throttle keeps them, modelled here on their own (not with the agent's parser, so
/// a test checks one against the other): v1's `blkio.throttle.{read,write}_bps_device` take `MAJ:MIN BYTES`
/// (0 or u64::MAX removes the device's limit; anything else is EINVAL) and list `MAJ:MIN BYTES` per device with a
/// limit; v2's `io.max` takes `MAJ:MIN key=value...` (keys `rbps wbps riops wiops`, `max` removes, 0 is ERANGE,
/// another key EINVAL) and lists `MAJ:MIN rbps=.. wbps=.. riops=.. wiops=..` per device with some limit. Devices
/// are listed by number.
#[derive(Debug, Clone, Copy, Default)]
pub struct FixtureKernel;

impl CgroupFs for FixtureKernel {
    fn write(&self, path: &Path, data: &[u8]) -> std::io::Result<usize> {
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        if name == "blkio.throttle.read_bps_device" || name == "blkio.throttle.write_bps_device" {
            let merged = throttle_v1(&fs::read_to_string(path)?, data)?;
            return RealFs.write(path, merged.as_bytes()).map(|_| data.len());
        }
        if name == "io.max" {
            let merged = io_max(&fs::read_to_string(path)?, data)?;
            return RealFs.write(path, merged.as_bytes()).map(|_| data.len());
        }
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

/// Linux's EINVAL and ERANGE (testbed has no libc dependency).
const EINVAL: i32 = 22;
const ERANGE: i32 = 34;

fn einval() -> std::io::Error {
    std::io::Error::from_raw_os_error(EINVAL)
}

/// Sorts `MAJ:MIN` keys by number.
fn dev_key(dev: &str) -> std::io::Result<(u32, u32)> {
    let (maj, min) = dev.split_once(':').ok_or_else(einval)?;
    Ok((maj.parse().map_err(|_| einval())?, min.parse().map_err(|_| einval())?))
}

/// A v1 `blkio.throttle.*_bps_device` holding `old` after `data` is written.
fn throttle_v1(old: &str, data: &[u8]) -> std::io::Result<String> {
    let mut limits = std::collections::BTreeMap::new();
    for line in old.lines().filter(|l| !l.trim().is_empty()) {
        let (dev, v) = line.split_once(' ').ok_or_else(einval)?;
        limits.insert(dev_key(dev)?, v.trim().parse::<u64>().map_err(|_| einval())?);
    }
    let text = std::str::from_utf8(data).map_err(|_| einval())?;
    let mut fields = text.split_whitespace();
    let (Some(dev), Some(v)) = (fields.next(), fields.next()) else { return Err(einval()) };
    let v: u64 = v.parse().map_err(|_| einval())?;
    if v == 0 || v == u64::MAX {
        limits.remove(&dev_key(dev)?);
    } else {
        limits.insert(dev_key(dev)?, v);
    }
    Ok(limits.iter().map(|((maj, min), v)| format!("{maj}:{min} {v}\n")).collect())
}

/// A v2 `io.max` holding `old` after `data` is written.
fn io_max(old: &str, data: &[u8]) -> std::io::Result<String> {
    const KEYS: [&str; 4] = ["rbps", "wbps", "riops", "wiops"];
    let parse = |fields: &mut dyn Iterator<Item = &str>, limits: &mut [Option<u64>; 4]| -> std::io::Result<()> {
        for field in fields {
            let (key, value) = field.split_once('=').ok_or_else(einval)?;
            let at = KEYS.iter().position(|k| *k == key).ok_or_else(einval)?;
            limits[at] = match value {
                "max" => None,
                v => match v.parse::<u64>().map_err(|_| einval())? {
                    0 => return Err(std::io::Error::from_raw_os_error(ERANGE)),
                    u64::MAX => None,
                    n => Some(n),
                },
            };
        }
        Ok(())
    };
    let mut devices: std::collections::BTreeMap<(u32, u32), [Option<u64>; 4]> = Default::default();
    for line in old.lines().filter(|l| !l.trim().is_empty()) {
        let mut fields = line.split_whitespace();
        let dev = dev_key(fields.next().ok_or_else(einval)?)?;
        parse(&mut fields, devices.entry(dev).or_default())?;
    }
    let text = std::str::from_utf8(data).map_err(|_| einval())?;
    let mut fields = text.split_whitespace();
    let dev = dev_key(fields.next().ok_or_else(einval)?)?;
    let mut limits = devices.get(&dev).copied().unwrap_or_default();
    parse(&mut fields, &mut limits)?;
    devices.insert(dev, limits);
    let mut out = String::new();
    for ((maj, min), limits) in devices.iter().filter(|(_, l)| l.iter().any(Option::is_some)) {
        out.push_str(&format!("{maj}:{min}"));
        for (key, v) in KEYS.iter().zip(limits) {
            match v {
                Some(n) => out.push_str(&format!(" {key}={n}")),
                None => out.push_str(&format!(" {key}=max")),
            }
        }
        out.push('\n');
    }
    Ok(out)
}
