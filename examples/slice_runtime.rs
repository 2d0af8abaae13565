//! A runtime that is not Docker, driven by the agent library: the "containers" are the child directories of one
//! cgroup (a systemd slice such as `machine.slice`, or another runtime's parent cgroup).
//!
//! It shows the two ways to embed the daemon:
//! - its own [`Discovery`]: [`PollingDiscovery`] lists the parent every 100 ms (the agent's own cgroup-dir runtime,
//!   `qos_agent::runtime::cgroup_dir::CgroupDirDiscovery`, uses inotify instead);
//! - a [`WeightWriter`] wrapper: [`PrintingWriter`] prints every weight that reached a cgroup file, around the
//!   library's `FileWriter`; counters come from the library's `FileCounters`.
//!
//! ```text
//! cargo run --example slice_runtime                          # a simulated slice in a temp dir, anywhere
//! sudo cargo run --example slice_runtime -- machine.slice 30s  # a real cgroup, relative to the cgroup root
//! ```
//!
//! Without arguments it builds a fixture cgroup tree (v1 blkio files) in a temp dir with three scopes, makes one of
//! them read heavily by rewriting its counter file, adds one scope and removes another halfway, and runs the daemon
//! for 6 s: the heavy one sinks level by level, is boosted after `boost_after` (4 s here) and sinks again; the new
//! one gets the top weight at once. At the end every original weight is restored. With arguments it manages the
//! real cgroup's children for the given duration (dry run unless run as root).

use std::collections::{BTreeSet, VecDeque};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use ddiskqos::agent::backend::{
    AppliedVia, BackendError, CapApplied, ContainerInfo, Discovery, DiscoveryError, DiscoveryEvent, WeightWriter,
};
use ddiskqos::agent::cgroup::{CgroupRoot, CgroupVersion};
use ddiskqos::agent::config::{AgentConfig, RuntimeKind};
use ddiskqos::agent::daemon::{Command, Daemon};
use ddiskqos::agent::files::{FileCounters, FileWriter};
use ddiskqos::agent::ops::metrics::Metrics;
use ddiskqos::agent::state::OriginalWeights;
use ddiskqos::core::{Cap, ContainerId, Weight};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

const MIB: u64 = 1 << 20;

/// Containers are the child directories of `parent`; a change is seen at the next poll.
#[derive(Debug)]
struct PollingDiscovery {
    root: Arc<CgroupRoot>,
    parent: String,
    known: BTreeSet<String>,
    queue: VecDeque<DiscoveryEvent>,
    /// An interval, not a sleep: the daemon drops `next_event` whenever a round or a command comes first, and an
    /// interval's tick survives that (a fresh sleep would restart the wait every time).
    poll: tokio::time::Interval,
    /// For the printed timestamps.
    started: Instant,
}

impl PollingDiscovery {
    fn new(root: Arc<CgroupRoot>, parent: &str, every: Duration, started: Instant) -> Self {
        let mut poll = tokio::time::interval(every);
        poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let parent = parent.trim_matches('/').to_string();
        Self { root, parent, known: BTreeSet::new(), queue: VecDeque::new(), poll, started }
    }

    fn list(&self) -> Result<BTreeSet<String>, DiscoveryError> {
        let dir = self.root.resolve_relative(&self.parent)?;
        let entries = std::fs::read_dir(dir.path()).map_err(|e| DiscoveryError::Runtime {
            what: format!("list {}", dir.path().display()),
            detail: e.to_string(),
        })?;
        let dirs = entries.flatten().filter(|e| e.file_type().is_ok_and(|t| t.is_dir()));
        Ok(dirs.filter_map(|e| e.file_name().into_string().ok()).collect())
    }

    fn info(&self, name: &str) -> Option<ContainerInfo> {
        // Resolution confines the path to the cgroup root and refuses symlinks; a child that vanished is skipped.
        let cgroup = self.root.resolve_relative(&format!("{}/{name}", self.parent)).ok()?;
        Some(ContainerInfo {
            id: ContainerId::new(name),
            name: name.to_string(),
            labels: Default::default(),
            cgroup: Some(cgroup),
        })
    }
}

impl Discovery for PollingDiscovery {
    async fn start(&mut self) -> Result<Vec<ContainerInfo>, DiscoveryError> {
        self.known = self.list()?;
        self.poll.reset(); // the first poll one period from now
        Ok(self.known.iter().filter_map(|n| self.info(n)).collect())
    }

    async fn next_event(&mut self) -> Result<DiscoveryEvent, DiscoveryError> {
        loop {
            if let Some(ev) = self.queue.pop_front() {
                return Ok(ev);
            }
            self.poll.tick().await;
            let now = self.list()?;
            let at = self.started.elapsed().as_secs_f64();
            for gone in self.known.difference(&now) {
                println!("[{at:5.2}s] {gone:<12} gone (directory removed)");
                self.queue.push_back(DiscoveryEvent::Stopped(ContainerId::new(gone)));
            }
            for new in now.difference(&self.known) {
                println!("[{at:5.2}s] {new:<12} new child cgroup");
                if let Some(info) = self.info(new) {
                    self.queue.push_back(DiscoveryEvent::Started(info));
                }
            }
            self.known = now;
        }
    }
}

/// Prints every write, then passes it on. Any [`WeightWriter`] can be wrapped like this (to audit, to rate-limit,
/// to mirror weights into another system).
#[derive(Debug)]
struct PrintingWriter<W> {
    inner: W,
    started: Instant,
}

impl<W: WeightWriter> WeightWriter for PrintingWriter<W> {
    async fn read(&mut self, info: &ContainerInfo) -> Result<Weight, BackendError> {
        self.inner.read(info).await
    }

    async fn write(&mut self, info: &ContainerInfo, weight: Weight) -> Result<AppliedVia, BackendError> {
        let result = self.inner.write(info, weight).await;
        self.print(info, weight, "written", &result);
        result
    }

    async fn restore(&mut self, info: &ContainerInfo, original: Weight) -> Result<AppliedVia, BackendError> {
        let result = self.inner.restore(info, original).await;
        self.print(info, original, "restored", &result);
        result
    }

    async fn cap(&mut self, info: &ContainerInfo, cap: Option<Cap>) -> Result<CapApplied, BackendError> {
        let result = self.inner.cap(info, cap).await;
        let at = self.started.elapsed().as_secs_f64();
        let what = match cap {
            Some(c) => format!("cap read {:?} write {:?} B/s", c.read_bps, c.write_bps),
            None => "cap lifted".to_string(),
        };
        match &result {
            Ok(applied) => println!("[{at:5.2}s] {:<12} {what}  ({applied:?})", info.name),
            Err(e) => println!("[{at:5.2}s] {:<12} {what}  FAILED: {e}", info.name),
        }
        result
    }

    fn forget(&mut self, id: &ContainerId) {
        self.inner.forget(id);
    }
}

impl<W> PrintingWriter<W> {
    fn print(&self, info: &ContainerInfo, weight: Weight, what: &str, result: &Result<AppliedVia, BackendError>) {
        let at = self.started.elapsed().as_secs_f64();
        match result {
            Ok(_) => println!("[{at:5.2}s] {:<12} weight {:>4}  ({what}, read back)", info.name, weight.get()),
            Err(e) => println!("[{at:5.2}s] {:<12} weight {:>4}  FAILED: {e}", info.name, weight.get()),
        }
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<()> {
    let filter = std::env::var("DDISKQOS_LOG").unwrap_or_else(|_| "warn,qos_agent::daemon=info".into());
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
        .with_target(false)
        .without_time()
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();

    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.as_slice() {
        [] => fixture_demo().await,
        [parent, duration] => {
            let duration = ddiskqos::core::units::parse_duration(duration).map_err(anyhow::Error::msg)?;
            real_cgroup(parent, duration).await
        }
        _ => bail!("usage: slice_runtime [<parent cgroup, relative to the cgroup root> <duration, e.g. 30s>]"),
    }
}

/// Manages the children of a real cgroup.
async fn real_cgroup(parent: &str, duration: Duration) -> Result<()> {
    let root = CgroupRoot::detect().context("no usable block-I/O cgroup hierarchy (v1 blkio or v2 io)")?;
    let dir = root.resolve_relative(parent).with_context(|| format!("parent cgroup {parent:?}"))?;
    let mut cfg = AgentConfig { runtime: RuntimeKind::CgroupDir, ..AgentConfig::default() };
    cfg.cgroup.parent = parent.to_string();
    // Writing weight files needs root; anyone else gets the decisions without the writes.
    cfg.dry_run = std::fs::metadata("/proc/self").map(|m| m.uid() != 0).unwrap_or(true);
    if cfg.dry_run {
        println!("not root: dry run (decisions are logged, no weight is written)");
    }
    println!("managing the children of {} for {duration:?}", dir.path().display());
    run(cfg, Arc::new(root), parent, duration).await
}

/// A simulated slice in a temp dir: three scopes, one heavy reader, one scope added and one removed halfway.
async fn fixture_demo() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let slice = tmp.path().join("demo.slice");
    for name in ["web.scope", "batch.scope", "db.scope"] {
        scope(&slice.join(name), 0)?;
    }
    let root = Arc::new(CgroupRoot::from_dir(CgroupVersion::V1, tmp.path())?);
    let mut cfg = AgentConfig { runtime: RuntimeKind::CgroupDir, ..AgentConfig::default() };
    cfg.cgroup.parent = "demo.slice".into();
    cfg.sample_interval = Duration::from_millis(250);
    cfg.mlfq.boost_after = Duration::from_secs(4); // short, so the 6 s run shows a boost
    println!("fixture slice: {} (v1 blkio files; every scope starts at weight 100)", slice.display());
    println!("batch.scope reads 30 MiB/s, web.scope 160 KiB/s; late.scope appears at 2 s, db.scope goes at 3 s\n");

    // The workload rewrites the counter files. It runs on the same single-threaded runtime as the daemon, so a
    // counter file is never read half-written.
    let started = Instant::now();
    let sim = tokio::spawn(simulate(slice.clone()));
    run(cfg, root, "demo.slice", Duration::from_secs(6)).await?;
    sim.abort();

    println!("\nweight files after shutdown (originals restored):");
    for name in ["web.scope", "batch.scope", "late.scope"] {
        let w = std::fs::read_to_string(slice.join(name).join("blkio.bfq.weight"))?;
        println!("  {name:<12} {}", w.trim());
    }
    println!("(ran {:.1} s)", started.elapsed().as_secs_f64());
    Ok(())
}

/// Runs the daemon for `duration`, then prints the status table, shuts it down (restoring originals) and prints
/// the summary.
async fn run(cfg: AgentConfig, root: Arc<CgroupRoot>, parent: &str, duration: Duration) -> Result<()> {
    cfg.validate()?;
    let started = Instant::now();
    let discovery = PollingDiscovery::new(root, parent, Duration::from_millis(100), started);
    let files = FileWriter::default();
    let devices = files.devices();
    let writer = PrintingWriter { inner: files, started };
    let counters = FileCounters::new();
    // No state file: this example restores everything it changed before it exits.
    let originals = OriginalWeights::load(None)?;
    let daemon = Daemon::new(cfg, discovery, counters, writer, originals, Arc::new(Metrics::new()))?
        .with_device_monitor(devices);
    let (tx, rx) = mpsc::channel(4);
    let handle = tokio::spawn(daemon.run(rx));

    tokio::select! {
        _ = tokio::time::sleep(duration) => {}
        _ = tokio::signal::ctrl_c() => println!("interrupted"),
    }
    let (reply, status) = oneshot::channel();
    if tx.send(Command::Status(reply)).await.is_ok() {
        println!("\n{}", ddiskqos::agent::ops::control::render(&status.await?));
        let _ = tx.send(Command::Shutdown).await;
    }
    // If the daemon stopped early (its discovery failed), this is where its error comes out.
    let summary = handle.await?.context("the daemon failed")?;
    println!("shutdown: {} original weights restored, {} failures", summary.restored, summary.restore_failures);
    Ok(())
}

/// Every 100 ms: batch.scope reads 3 MiB, web.scope 16 KiB; late.scope appears at 2 s, db.scope goes at 3 s.
async fn simulate(slice: PathBuf) {
    let mut every = tokio::time::interval(Duration::from_millis(100));
    let (mut batch, mut web) = (0u64, 0u64);
    for tick in 1u32.. {
        every.tick().await;
        batch += 3 * MIB;
        web += 16 * 1024;
        let step = || -> Result<()> {
            write_counter(&slice.join("batch.scope"), batch)?;
            write_counter(&slice.join("web.scope"), web)?;
            match tick {
                20 => scope(&slice.join("late.scope"), 0)?,
                30 => std::fs::remove_dir_all(slice.join("db.scope"))?,
                _ => {}
            }
            Ok(())
        };
        if let Err(e) = step() {
            eprintln!("workload: {e:#}");
            return;
        }
    }
}

/// A fixture cgroup directory with BFQ weight and counter files, `read` bytes read so far.
fn scope(dir: &Path, read: u64) -> Result<()> {
    std::fs::create_dir_all(dir)?;
    std::fs::write(dir.join("blkio.bfq.weight"), "100\n")?;
    write_counter(dir, read)
}

fn write_counter(dir: &Path, read: u64) -> Result<()> {
    let text = format!("8:0 Read {read}\n8:0 Write 0\n8:0 Sync {read}\n8:0 Async 0\n8:0 Total {read}\nTotal {read}\n");
    let path: PathBuf = dir.join("blkio.bfq.io_service_bytes_recursive");
    std::fs::write(&path, text).with_context(|| format!("write {}", path.display()))
}
