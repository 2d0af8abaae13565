//! Where readers run: as processes in fresh blkio cgroups the bench creates ([`cgroup::CgroupRuntime`]), as
//! real Docker containers from a locally built image ([`docker::DockerRuntime`]), or as Kubernetes pods made
//! through a CRI socket ([`cri::CriRuntime`]).
//!
//! All three start every foreground reader as a *new* cgroup (container, pod) and call [`ReaderHooks::created`] once
//! the cgroup exists (the bench then announces it to the agent where the agent cannot see it by itself, and reads
//! its weight file, in dDiskQoS blocks until the agent's top weight is there), and [`ReaderHooks::finished`] after
//! it exited. Docker readers read at once, while the hooks time the agent's reaction; cgroup and CRI readers wait
//! for the hooks before their first I/O (their reaction time is the bench's announcement, not the agent's).
//!
//! A reader or background made with a [`StaticWeight`] (the static-best variant) gets that weight the way an
//! operator sets it through the runtime: Docker's `--blkio-weight` at creation, the weight file of a cgroup the bench
//! makes (cgroup-dir) or of a pod's cgroup (CRI) before the first read. Where the runtime's way does not reach the
//! file that governs the device, the hooks write it (`crate::static_best`).

pub mod cgroup;
pub mod cri;
pub mod docker;
pub mod procs;

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use nix::sys::signal::Signal;
use qos_agent::backend::ContainerInfo;
use qos_agent::cgroup::{CgroupDir, CounterReader};
use qos_core::ContainerId;
use serde::Serialize;

use crate::agent::WeightRead;
use crate::reader::ReadReport;
use crate::static_best::StaticWeight;

/// Which runtime to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum RuntimeChoice {
    /// Docker if a daemon answers, else cgroup-dir.
    Auto,
    /// Each reader a container (`docker run`).
    Docker,
    /// Each reader a process in its own blkio cgroup, all children of one cgroup: the agent's `cgroup-dir`
    /// runtime, and named so. `cgroup`, the bench's first name for it, is still accepted.
    #[value(name = "cgroup-dir", alias = "cgroup")]
    #[serde(rename = "cgroup-dir")]
    CgroupDir,
    /// Each reader (and the background) a Kubernetes pod made through a CRI socket (`--cri-socket`), in the
    /// kubelet's cgroup layout (`kubepods/burstable/pod<uid>`); never chosen by `auto`.
    Cri,
}

/// What the background reader is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum BackgroundKind {
    /// fio if installed, else internal.
    Auto,
    /// fio: sequential read, 1 MiB, libaio, queue depth 32, O_DIRECT (the TESTBED measurements' shape).
    Fio,
    /// The bench's own streamer: 4 threads, 1 MiB O_DIRECT reads each.
    Internal,
}

impl BackgroundKind {
    /// Resolves `Auto`.
    pub fn resolve(self) -> BackgroundKind {
        match self {
            BackgroundKind::Auto if crate::sys::have("fio") => BackgroundKind::Fio,
            BackgroundKind::Auto => BackgroundKind::Internal,
            other => other,
        }
    }

    /// The command a container runs as this background, reading `file` (a path as the container sees it): fio
    /// from the image's `/usr/bin`, or the bench's own streamer.
    pub fn container_command(self, file: &str) -> Vec<String> {
        match self.resolve() {
            BackgroundKind::Fio => std::iter::once("/usr/bin/fio".to_string()).chain(fio_args(file)).collect(),
            _ => ["/bench/ddiskqos-bench", "stream", "--threads", &INTERNAL_THREADS.to_string(), file]
                .iter()
                .map(|s| s.to_string())
                .collect(),
        }
    }
}

/// Threads of the internal streamer.
pub const INTERNAL_THREADS: usize = 4;

/// fio's arguments for the background reading `file` (a path as the reader sees it).
pub fn fio_args(file: &str) -> Vec<String> {
    [
        "--name=background",
        &format!("--filename={file}"),
        "--rw=read",
        "--bs=1M",
        "--ioengine=libaio",
        "--iodepth=32",
        "--direct=1",
        "--time_based=1",
        "--runtime=86400",
        "--output=/dev/null",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// Notified around each reader's life.
pub trait ReaderHooks: Sync {
    /// The reader's cgroup exists (since `since`). Returns its weight as read from the cgroup's weight file: for
    /// readers held until this returns, just before their first I/O; for readers that read at once (Docker), when
    /// the agent's top weight arrived (or the last value before the reader finished).
    fn created(&self, info: &ContainerInfo, since: Instant) -> Result<WeightRead>;
    /// The reader exited (its cgroup still exists).
    fn finished(&self, id: &ContainerId);
}

/// One finished foreground read.
#[derive(Debug, Clone)]
pub struct ReadOutcome {
    /// Container or cgroup id.
    pub id: String,
    /// The reader's own report (bytes, read time).
    pub report: ReadReport,
    /// From creating the cgroup/container to the reader's exit, as the bench saw it.
    pub wall: Duration,
    /// Bytes the kernel charged to the reader's cgroup (cgroup runtime; the container's cgroup is gone in time
    /// for Docker).
    pub charged_bytes: Option<u64>,
    /// The reader's weight, read from its cgroup file before its first I/O.
    pub weight: WeightRead,
}

/// The long-lived background reader.
#[derive(Debug, Clone)]
pub struct Background {
    /// Its id (cgroup name or container id).
    pub id: String,
    /// Its blkio cgroup.
    pub cgroup: CgroupDir,
    /// What runs there.
    pub command: String,
}

impl Background {
    /// Bytes it has read (its cgroup's counter file, read now).
    pub fn bytes(&self) -> Result<u64> {
        Ok(CounterReader::open(&self.cgroup)?.read()?.read)
    }

    /// Stops its processes (SIGSTOP) and waits until its byte counter stands still (in-flight I/O drained).
    pub fn freeze(&self) -> Result<()> {
        if procs::signal_all(self.cgroup.path(), Signal::SIGSTOP) == 0 {
            bail!("background {} has no process left to stop", self.id);
        }
        let start = Instant::now();
        let mut last = self.bytes()?;
        let mut still = 0;
        while still < 3 && start.elapsed() < Duration::from_secs(2) {
            std::thread::sleep(Duration::from_millis(10));
            let now = self.bytes()?;
            still = if now == last { still + 1 } else { 0 };
            last = now;
        }
        Ok(())
    }

    /// Lets it run again.
    pub fn thaw(&self) {
        procs::signal_all(self.cgroup.path(), Signal::SIGCONT);
    }

    /// Fails if its processes are gone (fio died, container exited).
    pub fn check_alive(&self) -> Result<()> {
        if procs::pids(self.cgroup.path()).is_empty() {
            bail!("the background reader {} is not running any more ({})", self.id, self.command);
        }
        Ok(())
    }

    /// Waits until it has read something (it runs), at most 10 s; `why` explains a failure.
    pub fn wait_reading(&self, why: impl Fn() -> String) -> Result<()> {
        let start = Instant::now();
        while procs::pids(self.cgroup.path()).is_empty() || self.bytes().unwrap_or(0) == 0 {
            if start.elapsed() > Duration::from_secs(10) {
                bail!("the background did not start reading within 10 s: {}\n{}", self.command, why());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(())
    }
}

/// A place to run readers.
pub trait Runtime: Send + Sync + std::fmt::Debug {
    /// `cgroup` or `docker`.
    fn name(&self) -> &'static str;
    /// Where its cgroups are, when the runtime decides it rather than `--cgroup-layout` (the kubelet's layout).
    fn cgroup_layout(&self) -> Option<&'static str> {
        None
    }
    /// Starts the background reader on `file` (a path on the test file system); it runs until stopped. `hooks`
    /// hear of its cgroup before it starts reading, once the runtime has set the container up (a static weight the
    /// runtime puts in place is there by then: the bench reads it once and writes it where it is not). With
    /// `weight`, the background set at that weight when created (the static-best variant's, a second background
    /// beside the first).
    fn start_background(
        &self,
        file: &Path,
        kind: BackgroundKind,
        weight: Option<StaticWeight>,
        hooks: &dyn ReaderHooks,
    ) -> Result<Background>;
    /// The cgroup whose weight governs the background (the bench reads it after every read): its own cgroup, or
    /// for a pod its pod cgroup (where the agent writes) while `Background::cgroup` is its container's.
    fn background_weight_dir(&self, bg: &Background) -> CgroupDir {
        bg.cgroup.clone()
    }
    /// Stops and removes the background.
    fn stop_background(&self, bg: &Background) -> Result<()>;
    /// Runs one foreground reader of `file` as a new cgroup/container (with `weight`: set at that weight when
    /// created, the static-best variant) and waits for it.
    fn run_reader(&self, file: &Path, weight: Option<StaticWeight>, hooks: &dyn ReaderHooks) -> Result<ReadOutcome>;
    /// Called before a mode (before its background starts) with every read it will do, in order.
    fn prepare(&self, _reads: &[PlannedRead]) -> Result<()> {
        Ok(())
    }
    /// Called after a mode (after its background stopped).
    fn end_mode(&self) -> Result<()> {
        Ok(())
    }
}

/// One read a mode will do: its file and the weight its reader is created with, if static.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedRead {
    /// The file (a path on the test file system).
    pub file: std::path::PathBuf,
    /// The static-best variant's reader weight; `None` for the other variants.
    pub weight: Option<StaticWeight>,
}

/// Parses the reader's JSON line out of its output.
pub fn parse_report(stdout: &str) -> Result<ReadReport> {
    let line = stdout.lines().rev().find(|l| l.trim_start().starts_with('{')).context("reader printed no report")?;
    serde_json::from_str(line).with_context(|| format!("bad reader report {line:?}"))
}

/// Starts `n` things (reader containers or pods) with `start` on up to four threads at once; all of them, or the
/// first error (`what` names the thing in a panic's error).
pub(crate) fn start_all<T: Send>(n: usize, what: &str, start: impl Fn() -> Result<T> + Sync) -> Result<Vec<T>> {
    let todo = std::sync::atomic::AtomicUsize::new(n);
    let started = std::sync::Mutex::new(Vec::with_capacity(n));
    std::thread::scope(|scope| -> Result<()> {
        let workers: Vec<_> = (0..4.min(n.max(1)))
            .map(|_| {
                scope.spawn(|| -> Result<()> {
                    let relaxed = std::sync::atomic::Ordering::Relaxed;
                    while todo.fetch_update(relaxed, relaxed, |left| left.checked_sub(1)).is_ok() {
                        let item = start()?;
                        started.lock().unwrap_or_else(|e| e.into_inner()).push(item);
                    }
                    Ok(())
                })
            })
            .collect();
        for w in workers {
            w.join().map_err(|_| anyhow::anyhow!("{what} starter panicked"))??;
        }
        Ok(())
    })?;
    Ok(started.into_inner().unwrap_or_else(|e| e.into_inner()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_all_starts_each_once_or_returns_the_error() {
        let next = std::sync::atomic::AtomicUsize::new(0);
        let mut got = start_all(10, "thing", || Ok(next.fetch_add(1, std::sync::atomic::Ordering::Relaxed))).unwrap();
        got.sort();
        assert_eq!(got, (0..10).collect::<Vec<_>>());
        assert!(start_all(0, "thing", || Ok(1)).unwrap().is_empty());
        let err = start_all(5, "thing", || -> Result<u8> { anyhow::bail!("no room") }).unwrap_err();
        assert_eq!(err.to_string(), "no room");
    }

    #[test]
    fn cgroup_dir_is_the_runtime_name_and_cgroup_still_parses() {
        use clap::ValueEnum;
        for (arg, want) in [("cgroup-dir", RuntimeChoice::CgroupDir), ("cgroup", RuntimeChoice::CgroupDir)] {
            assert_eq!(RuntimeChoice::from_str(arg, false).unwrap(), want, "{arg}");
        }
        let shown = RuntimeChoice::CgroupDir.to_possible_value().unwrap();
        assert_eq!(shown.get_name(), "cgroup-dir");
        assert_eq!(serde_json::to_value(RuntimeChoice::CgroupDir).unwrap(), "cgroup-dir");
    }

    #[test]
    fn report_parsing() {
        let r = parse_report("noise\n{\"bytes\":1048576,\"elapsed_ns\":1000000,\"waited_ns\":0}\n").unwrap();
        assert_eq!(r.bytes, 1 << 20);
        assert!(parse_report("nothing").is_err());
        assert!(parse_report("{broken").is_err());
    }

    #[test]
    fn fio_shape_matches_testbed() {
        let args = fio_args("/data/bg");
        for want in ["--rw=read", "--bs=1M", "--ioengine=libaio", "--iodepth=32", "--direct=1", "--filename=/data/bg"] {
            assert!(args.iter().any(|a| a == want), "{want} missing from {args:?}");
        }
    }
}
