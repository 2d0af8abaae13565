//! The bench's own I/O processes, run as hidden subcommands of the same binary: a foreground reader that joins
//! its cgroup, reads a whole file with `O_DIRECT` and reports its own elapsed time (first read to last), an
//! internal background streamer, and `exec-in`, which joins a cgroup and `exec`s another program (fio).
//!
//! The reader joins its cgroup before it opens the file, so every byte it reads is charged to that cgroup, and
//! times only the reads, so process start-up (and `docker run`) stays out of the measurement.

use std::fs::{File, OpenOptions};
use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use crate::files::{AlignedBuf, MIB};

/// What the reader prints (one JSON line on stdout).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReadReport {
    /// Bytes read.
    pub bytes: u64,
    /// Nanoseconds from just before the first read to just after the last one.
    pub elapsed_ns: u64,
    /// Nanoseconds spent waiting for the go file (docker runtime), for the record.
    pub waited_ns: u64,
}

/// Moves the calling process into the cgroup `dir` (v1 or v2: both have `cgroup.procs`).
pub fn join_cgroup(dir: &Path) -> Result<()> {
    crate::sys::write_existing(&dir.join("cgroup.procs"), &std::process::id().to_string())
}

fn open_direct(path: &Path) -> Result<File> {
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
        .with_context(|| format!("cannot open {} with O_DIRECT", path.display()))
}

/// Waits until `path` exists (the bench's signal that the engine has seen this container).
pub fn wait_for(path: &Path, timeout: Duration) -> Result<Duration> {
    let start = Instant::now();
    while !path.exists() {
        if start.elapsed() > timeout {
            bail!("{} did not appear within {timeout:?}", path.display());
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    Ok(start.elapsed())
}

/// Blocks until a path is written into the FIFO `fifo` (the bench's go signal in the Docker runtime).
pub fn path_from_fifo(fifo: &Path) -> Result<(PathBuf, Duration)> {
    let start = Instant::now();
    let mut text = String::new();
    File::open(fifo)
        .and_then(|mut f| f.read_to_string(&mut text))
        .with_context(|| format!("cannot read the go FIFO {}", fifo.display()))?;
    let path = text.trim();
    if path.is_empty() {
        bail!("{} delivered no path", fifo.display());
    }
    Ok((PathBuf::from(path), start.elapsed()))
}

/// Writes the report to `path` atomically (temp file, then rename).
pub fn write_report(report: &ReadReport, path: &Path) -> Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, serde_json::to_string(report)?).with_context(|| format!("cannot write {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("cannot rename {} to {}", tmp.display(), path.display()))
}

/// Reads all of `path` with `O_DIRECT` in blocks of `block` bytes.
pub fn read_file(path: &Path, cgroup: Option<&Path>, wait: Option<&Path>, block: usize) -> Result<ReadReport> {
    if let Some(dir) = cgroup {
        join_cgroup(dir)?;
    }
    let waited = match wait {
        Some(p) => wait_for(p, Duration::from_secs(60))?,
        None => Duration::ZERO,
    };
    read_direct(path, waited, block)
}

/// The read itself, timed from the first read to the last.
pub fn read_direct(path: &Path, waited: Duration, block: usize) -> Result<ReadReport> {
    let mut f = open_direct(path)?;
    let mut buf = AlignedBuf::new(block);
    let mut bytes = 0u64;
    let start = Instant::now();
    loop {
        let n = f.read(buf.as_mut_slice()).with_context(|| format!("cannot read {}", path.display()))?;
        if n == 0 {
            break;
        }
        bytes += n as u64;
    }
    let elapsed = start.elapsed();
    Ok(ReadReport { bytes, elapsed_ns: elapsed.as_nanos() as u64, waited_ns: waited.as_nanos() as u64 })
}

/// Streams `path` forever (until killed) with `threads` threads, each reading every `threads`-th block.
pub fn stream(path: &Path, cgroup: Option<&Path>, threads: usize, block: usize) -> Result<()> {
    if let Some(dir) = cgroup {
        join_cgroup(dir)?;
    }
    let len = std::fs::metadata(path).with_context(|| format!("cannot stat {}", path.display()))?.len();
    let blocks = (len / block as u64).max(1);
    let workers: Vec<_> = (0..threads.max(1))
        .map(|t| {
            let path: PathBuf = path.to_path_buf();
            let threads = threads.max(1) as u64;
            std::thread::spawn(move || -> Result<()> {
                use std::os::unix::fs::FileExt;
                let f = open_direct(&path)?;
                let mut buf = AlignedBuf::new(block);
                let mut i = t as u64;
                loop {
                    f.read_at(buf.as_mut_slice(), (i % blocks) * block as u64)
                        .with_context(|| format!("cannot read {}", path.display()))?;
                    i += threads;
                }
            })
        })
        .collect();
    for w in workers {
        w.join().map_err(|_| anyhow::anyhow!("stream thread panicked"))??;
    }
    Ok(())
}

/// Joins the cgroup and replaces this process with `argv` (returns only on failure).
pub fn exec_in(cgroup: &Path, argv: &[String]) -> Result<()> {
    let Some((program, args)) = argv.split_first() else {
        bail!("exec-in needs a command");
    };
    join_cgroup(cgroup)?;
    let err = std::process::Command::new(program).args(args).exec();
    Err(err).with_context(|| format!("cannot exec {program}"))
}

/// Default block size of the readers.
pub const BLOCK: usize = MIB as usize;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::files::{create_all, FileSpec};

    #[test]
    fn reads_whole_file_and_times_it() {
        let dir = tempfile::tempdir().unwrap();
        let paths = create_all(dir.path(), &[FileSpec { name: "f".into(), size_mib: 3 }], 1, |_| {}).unwrap();
        match read_file(&paths[0], None, None, BLOCK) {
            Ok(r) => {
                assert_eq!(r.bytes, 3 * MIB);
                assert!(r.elapsed_ns > 0);
                assert_eq!(r.waited_ns, 0);
            }
            // A temp dir on tmpfs cannot do O_DIRECT; nothing to test there.
            Err(e) => assert!(format!("{e:#}").contains("O_DIRECT"), "{e:#}"),
        }
    }

    #[test]
    fn wait_for_times_out_and_succeeds() {
        let dir = tempfile::tempdir().unwrap();
        let go = dir.path().join("go");
        assert!(wait_for(&go, Duration::from_millis(5)).is_err());
        std::fs::write(&go, "").unwrap();
        assert!(wait_for(&go, Duration::from_millis(5)).is_ok());
    }
}
