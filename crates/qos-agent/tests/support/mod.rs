//! Shared scaffolding of the real-kernel / real-Docker integration tests: the skip-or-fail rule, a BFQ loop
//! device, the agent process, Docker CLI helpers. Everything set up is torn down on drop, also on failure.
#![allow(dead_code)]

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

#[path = "../fixtures/mod.rs"]
mod fixtures;

#[allow(unused_imports)] // not every test binary uses it
pub use fixtures::{remove_cgroup_tree, run_in_cgroup, CgroupGuard};

/// Whether real tests must run (CI, or the README's test command): then a missing prerequisite fails the test.
pub fn must_run() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true") || std::env::var("DDISKQOS_REQUIRE_REAL").is_ok_and(|v| v == "1")
}

/// `Ok` if the test can run here; otherwise fails (CI) or says clearly what is skipped and why.
pub fn require(test: &str, needs: &[(&str, bool)]) -> bool {
    let missing: Vec<&str> = needs.iter().filter(|(_, ok)| !ok).map(|(n, _)| *n).collect();
    if missing.is_empty() {
        return true;
    }
    if must_run() {
        panic!("{test}: cannot run, missing: {} (CI / DDISKQOS_REQUIRE_REAL=1 forbid skipping)", missing.join(", "));
    }
    eprintln!("SKIPPED {test}: needs {} (run scripts/test.sh as root to set them up)", missing.join(", "));
    false
}

pub fn is_root() -> bool {
    nix::unistd::Uid::effective().is_root()
}

pub fn has_blkio_v1() -> bool {
    Path::new("/sys/fs/cgroup/blkio/cgroup.procs").exists()
}

pub const DOCKER: &str = "/usr/bin/docker";
pub const IMAGE: &str = "ddiskqos-test:latest";

pub fn docker_ready() -> bool {
    Command::new(DOCKER)
        .args(["image", "inspect", IMAGE])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

pub fn sh(cmd: &str, args: &[&str]) -> String {
    let out = Command::new(cmd).args(args).output().unwrap_or_else(|e| panic!("{cmd} {args:?}: {e}"));
    assert!(out.status.success(), "{cmd} {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// A file-backed loop device with direct I/O and the BFQ scheduler: the fixtures' guard (which also checks BFQ is
/// really active and detaches on drop), seen with the device path as text.
pub struct LoopDevice {
    inner: fixtures::LoopDevice,
    pub dev: String,
}

impl LoopDevice {
    pub fn new(size_mb: u64) -> Self {
        let inner = fixtures::LoopDevice::with_bfq(size_mb);
        let dev = inner.dev.display().to_string();
        Self { inner, dev }
    }

    pub fn name(&self) -> &str {
        &self.inner.name
    }
}

/// The agent binary running with a config file; killed on drop.
pub struct Agent {
    pub child: Option<Child>,
    pub dir: tempfile::TempDir,
    pub log: PathBuf,
}

impl Agent {
    /// Starts `ddiskqos-agent -c <dir>/agent.toml`; `config` may use `{dir}` for the temp directory.
    pub fn start(config: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        Self::start_in(dir, config)
    }

    pub fn start_in(dir: tempfile::TempDir, config: &str) -> Self {
        let d = dir.path().display().to_string();
        let text = config.replace("{dir}", &d);
        let cfg = dir.path().join("agent.toml");
        std::fs::write(&cfg, text).unwrap();
        let log = dir.path().join("agent.log");
        let child = Command::new(env!("CARGO_BIN_EXE_ddiskqos-agent"))
            .arg("-c")
            .arg(&cfg)
            .env("DDISKQOS_LOG", "info,qos_agent=debug")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("spawn agent");
        let agent = Self { child: Some(child), dir, log };
        agent.wait_ready();
        agent
    }

    pub fn socket(&self) -> PathBuf {
        self.dir.path().join("agent.sock")
    }

    pub fn state_file(&self) -> PathBuf {
        self.dir.path().join("state.json")
    }

    fn wait_ready(&self) {
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(20) {
            if self.status().is_some() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("agent not ready after 20 s; log:\n{}", self.log_text());
    }

    /// The status table as printed by `ddiskqos-agent status`.
    pub fn status(&self) -> Option<String> {
        let out = Command::new(env!("CARGO_BIN_EXE_ddiskqos-agent"))
            .args(["status", "--socket"])
            .arg(self.socket())
            .output()
            .ok()?;
        out.status.success().then(|| String::from_utf8_lossy(&out.stdout).to_string())
    }

    pub fn log_text(&self) -> String {
        let mut s = String::new();
        if let Ok(mut f) = std::fs::File::open(&self.log) {
            let _ = f.read_to_string(&mut s);
        }
        s
    }

    pub fn signal(&self, sig: nix::sys::signal::Signal) {
        let pid = self.child.as_ref().expect("running").id();
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), sig).unwrap();
    }

    /// Sends SIGTERM and waits for the exit status.
    pub fn stop(&mut self) -> std::process::ExitStatus {
        self.signal(nix::sys::signal::Signal::SIGTERM);
        self.wait(Duration::from_secs(15))
    }

    pub fn wait(&mut self, limit: Duration) -> std::process::ExitStatus {
        let mut child = self.child.take().expect("running");
        let t = Instant::now();
        loop {
            if let Some(st) = child.try_wait().unwrap() {
                return st;
            }
            if t.elapsed() > limit {
                let _ = child.kill();
                panic!("agent did not exit within {limit:?}; log:\n{}", self.log_text());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Containers started by a test, removed on drop.
#[derive(Default)]
pub struct Containers(pub Vec<String>);

impl Containers {
    /// `docker run -d ARGS...`; returns the full id.
    pub fn run(&mut self, args: &[&str]) -> String {
        let mut full = vec!["run", "-d"];
        full.extend_from_slice(args);
        let id = sh(DOCKER, &full);
        self.0.push(id.clone());
        id
    }
}

impl Drop for Containers {
    fn drop(&mut self) {
        if !self.0.is_empty() {
            let mut args = vec!["rm", "-f"];
            args.extend(self.0.iter().map(String::as_str));
            let _ = Command::new(DOCKER).args(&args).stdout(Stdio::null()).stderr(Stdio::null()).status();
        }
    }
}

/// The BFQ weight of a v1 blkio cgroup directory, if readable.
pub fn bfq_weight(dir: &Path) -> Option<u32> {
    let text = std::fs::read_to_string(dir.join("blkio.bfq.weight")).ok()?;
    let t = text.trim();
    t.strip_prefix("default ").unwrap_or(t).split_whitespace().next()?.parse().ok()
}

pub fn docker_cgroup(id: &str) -> PathBuf {
    PathBuf::from(format!("/sys/fs/cgroup/blkio/docker/{id}"))
}

/// Polls `f` every `every` until it returns `Some` or `limit` passes.
pub fn wait_for<T>(limit: Duration, every: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let t = Instant::now();
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if t.elapsed() > limit {
            return None;
        }
        std::thread::sleep(every);
    }
}

/// Records the distinct successive values of a weight file, with the time each was first seen.
pub fn record_weights(dir: &Path, for_how_long: Duration, every: Duration) -> Vec<(Duration, u32)> {
    let t = Instant::now();
    let mut seen: Vec<(Duration, u32)> = Vec::new();
    while t.elapsed() < for_how_long {
        if let Some(w) = bfq_weight(dir) {
            if seen.last().map(|(_, l)| *l) != Some(w) {
                seen.push((t.elapsed(), w));
            }
        }
        std::thread::sleep(every);
    }
    seen
}
