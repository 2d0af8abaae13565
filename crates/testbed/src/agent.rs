//! The `ddiskqos-agent` binary run by a test with a config file, in a temp dir of its own; killed on drop.
//!
//! The binary's path comes from the caller: an integration test of `qos-agent` passes
//! `env!("CARGO_BIN_EXE_ddiskqos-agent")`, which Cargo sets only there.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// A running agent: its process, its temp dir (config, log, and whatever the config puts under `{dir}`), its log.
#[derive(Debug)]
pub struct Agent {
    /// The process, until [`Agent::stop`] or [`Agent::wait`] reaps it.
    pub child: Option<Child>,
    /// The agent's directory: `agent.toml`, `agent.log`.
    pub dir: tempfile::TempDir,
    /// The agent's stderr (its log, `DDISKQOS_LOG=info,qos_agent=debug`).
    pub log: PathBuf,
    bin: PathBuf,
}

impl Agent {
    /// Starts `<bin> -c <dir>/agent.toml` and waits (up to 20 s) until its control socket answers `status`;
    /// `config` may use `{dir}` for the temp directory.
    pub fn start(bin: impl AsRef<Path>, config: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let bin = bin.as_ref().to_path_buf();
        let d = dir.path().display().to_string();
        let cfg = dir.path().join("agent.toml");
        std::fs::write(&cfg, config.replace("{dir}", &d)).unwrap();
        let log = dir.path().join("agent.log");
        let child = Command::new(&bin)
            .arg("-c")
            .arg(&cfg)
            .env("DDISKQOS_LOG", "info,qos_agent=debug")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {}: {e}", bin.display()));
        let agent = Self { child: Some(child), dir, log, bin };
        agent.wait_ready();
        agent
    }

    /// The control socket, if the config put it at `{dir}/agent.sock`.
    pub fn socket(&self) -> PathBuf {
        self.dir.path().join("agent.sock")
    }

    /// The state file, if the config put it at `{dir}/state.json`.
    pub fn state_file(&self) -> PathBuf {
        self.dir.path().join("state.json")
    }

    /// The process id, while it runs.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("agent running").id()
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

    /// The status table as printed by `ddiskqos-agent status`, or `None` if it does not answer.
    pub fn status(&self) -> Option<String> {
        let out = Command::new(&self.bin).args(["status", "--socket"]).arg(self.socket()).output().ok()?;
        out.status.success().then(|| String::from_utf8_lossy(&out.stdout).to_string())
    }

    /// The whole log so far (with colours; see [`crate::probe::log_lines`] for lines without).
    pub fn log_text(&self) -> String {
        let mut s = String::new();
        if let Ok(mut f) = std::fs::File::open(&self.log) {
            let _ = f.read_to_string(&mut s);
        }
        s
    }

    /// Sends `sig` to the running agent.
    pub fn signal(&self, sig: nix::sys::signal::Signal) {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.pid() as i32), sig).unwrap();
    }

    /// Sends SIGTERM and waits (up to 15 s) for the exit status.
    pub fn stop(&mut self) -> ExitStatus {
        self.signal(nix::sys::signal::Signal::SIGTERM);
        self.wait(Duration::from_secs(15))
    }

    /// Waits for the agent to exit; kills it and panics (with its log) after `limit`.
    pub fn wait(&mut self, limit: Duration) -> ExitStatus {
        let mut child = self.child.take().expect("running");
        let t = Instant::now();
        loop {
            if let Some(st) = child.try_wait().unwrap() {
                return st;
            }
            if t.elapsed() > limit {
                let _ = child.kill();
                let _ = child.wait();
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
