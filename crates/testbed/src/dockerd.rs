//! A private, throw-away dockerd for tests that restart, kill or flood the daemon: its own socket, data root,
//! exec root, pid file and network namespace, no bridge and no iptables rules, `--live-restore` on, and the test
//! image imported from the host's `busybox-static`. The host's dockerd (`/var/run/docker.sock`) is never touched,
//! and other tests' containers never show up in this daemon, nor this daemon's in theirs.
//!
//! Containers land where Docker's default layout puts them, `/sys/fs/cgroup/blkio/docker/<id>` (beside the host
//! daemon's, ids never collide), so the agent's usual path (cgroup from the start event) is the one exercised.
//! Everything is torn down on drop, also when a test panics: containers removed, daemon stopped, data root
//! unmounted and deleted.
//!
//! Also here: [`CountingProxy`], a socket in front of a daemon that records the API requests going through it.

use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::docker::{DOCKER_CLI, IMAGE};
use crate::process::wait_for;

/// The daemon binary.
pub const DOCKERD: &str = "/usr/sbin/dockerd";
/// util-linux `unshare`, to give the daemon its own network namespace.
pub const UNSHARE: &str = "/usr/bin/unshare";
/// Whether this machine has the programs a private dockerd needs (root and cgroups are separate [`crate::Need`]s).
pub fn can_run() -> bool {
    [DOCKERD, DOCKER_CLI, UNSHARE, "/bin/busybox"].iter().all(|p| Path::new(p).exists())
}

/// A dockerd of our own. See the module docs.
#[derive(Debug)]
pub struct Dockerd {
    /// Directory holding the socket, data root, exec root, pid file and log (short path: socket names are
    /// limited to 107 bytes).
    pub base: PathBuf,
    /// The API socket.
    pub socket: PathBuf,
    /// dockerd's own log.
    pub log: PathBuf,
    child: Option<Child>,
    /// Whether the host had a `docker0` bridge when this daemon started.
    host_bridge: bool,
}

impl Dockerd {
    /// Starts the daemon and imports the test image; panics (with the daemon's log) if it does not come up.
    pub fn start(tag: &str) -> Self {
        let unique = format!("{tag}-{}-{}", std::process::id(), nanos() % 1_000_000);
        let base = PathBuf::from(format!("/tmp/ddq-{unique}"));
        std::fs::create_dir_all(&base).unwrap();
        let mut d = Self {
            socket: base.join("d.sock"),
            log: base.join("dockerd.log"),
            base,
            child: None,
            host_bridge: Path::new("/sys/class/net/docker0").exists(),
        };
        d.spawn();
        d.import_image();
        d
    }

    /// The daemon's command line (the same for every start, as a restart must be).
    fn args(&self) -> Vec<String> {
        let b = self.base.display();
        vec![
            format!("--host=unix://{}", self.socket.display()),
            format!("--data-root={b}/data"),
            format!("--exec-root={b}/exec"),
            format!("--pidfile={b}/dockerd.pid"),
            "--bridge=none".into(),
            "--iptables=false".into(),
            "--ip-masq=false".into(),
            "--live-restore".into(),
        ]
    }

    /// `unshare --net -- dockerd ARGS`: in a network namespace of its own, because dockerd with `--bridge=none`
    /// deletes any `docker0` interface it sees, which in the host's namespace is the host dockerd's bridge (found
    /// the hard way: the host dockerd then fails every `docker run` with "could not find bridge docker0").
    /// `unshare` execs dockerd, so the child's pid is dockerd's.
    fn command(&self) -> Command {
        let mut c = Command::new(UNSHARE);
        c.args(["--net", "--", DOCKERD]).args(self.args());
        c
    }

    /// Starts dockerd (again) with the same flags and waits until it answers.
    pub fn spawn(&mut self) {
        assert!(self.child.is_none(), "dockerd already running");
        let log = std::fs::OpenOptions::new().create(true).append(true).open(&self.log).unwrap();
        let child = self
            .command()
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("spawn dockerd");
        self.child = Some(child);
        let up = wait_until(Duration::from_secs(60), || self.try_cli(&["version"]).status.success());
        assert!(up, "dedicated dockerd did not come up; log:\n{}", self.log_tail());
    }

    /// Whether the host's `docker0` bridge is still there if it was before this daemon started (the host's
    /// dockerd needs it; that is why the daemon runs in a network namespace of its own).
    pub fn host_bridge_intact(&self) -> bool {
        !self.host_bridge || Path::new("/sys/class/net/docker0").exists()
    }

    /// The daemon's pid, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Stops the daemon with SIGTERM (as `systemctl restart docker` does) and waits for it to exit. With
    /// `--live-restore`, containers keep running.
    pub fn stop(&mut self) {
        let Some(mut child) = self.child.take() else { return };
        let pid = nix::unistd::Pid::from_raw(child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(30) {
            if child.try_wait().ok().flatten().is_some() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
    }

    /// `docker -H <socket> ARGS`; panics with stderr on failure.
    pub fn cli(&self, args: &[&str]) -> String {
        let out = self.try_cli(args);
        assert!(out.status.success(), "docker {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// `docker -H <socket> ARGS`, whatever the outcome.
    pub fn try_cli(&self, args: &[&str]) -> Output {
        Command::new(DOCKER_CLI)
            .arg("-H")
            .arg(format!("unix://{}", self.socket.display()))
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("run docker CLI")
    }

    /// `docker run -d --network none ARGS...`; returns the full id.
    pub fn run(&self, args: &[&str]) -> String {
        let mut full = vec!["run", "-d", "--network", "none"];
        full.extend_from_slice(args);
        self.cli(&full)
    }

    /// Starts `n` containers running `sleep SECONDS` (no log driver), four `docker run`s at a time; their full ids.
    pub fn run_sleepers(&self, n: usize, seconds: u32) -> Vec<String> {
        let ids = std::sync::Mutex::new(Vec::with_capacity(n));
        let secs = seconds.to_string();
        std::thread::scope(|s| {
            for w in 0..4 {
                let (ids, secs) = (&ids, &secs);
                s.spawn(move || {
                    for _ in (w..n).step_by(4) {
                        let id = self.run(&["--log-driver", "none", IMAGE, "sleep", secs]);
                        ids.lock().unwrap().push(id);
                    }
                });
            }
        });
        ids.into_inner().unwrap()
    }

    /// The container's blkio cgroup directory.
    pub fn cgroup(&self, id: &str) -> PathBuf {
        Path::new("/sys/fs/cgroup/blkio/docker").join(id)
    }

    /// Full ids of the running containers.
    pub fn running(&self) -> Vec<String> {
        self.cli(&["ps", "-q", "--no-trunc"]).lines().map(str::to_string).collect()
    }

    /// Removes every container, in batches.
    pub fn remove_all(&self) {
        let ids: Vec<String> =
            self.cli(&["ps", "-aq", "--no-trunc"]).lines().map(str::to_string).filter(|s| !s.is_empty()).collect();
        for chunk in ids.chunks(50) {
            let mut args = vec!["rm", "-f"];
            args.extend(chunk.iter().map(String::as_str));
            let _ = self.try_cli(&args);
        }
    }

    /// The last 30 lines of the daemon's log.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    fn import_image(&self) {
        let root = self.base.join("rootfs");
        std::fs::create_dir_all(root.join("bin")).unwrap();
        for d in ["tmp", "dev", "proc", "sys"] {
            std::fs::create_dir_all(root.join(d)).unwrap();
        }
        std::fs::copy("/bin/busybox", root.join("bin/busybox")).unwrap();
        for applet in ["sh", "dd", "cat", "sleep", "echo", "seq", "true", "ls", "head"] {
            std::os::unix::fs::symlink("busybox", root.join("bin").join(applet)).unwrap();
        }
        let tar = Command::new("tar").arg("-C").arg(&root).args(["-c", "."]).output().expect("tar");
        assert!(tar.status.success(), "tar: {}", String::from_utf8_lossy(&tar.stderr));
        let mut import = Command::new(DOCKER_CLI)
            .arg("-H")
            .arg(format!("unix://{}", self.socket.display()))
            .args(["import", "-c", "ENV PATH=/bin", "-c", "CMD [\"/bin/sh\"]", "-", IMAGE])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .expect("docker import");
        import.stdin.take().unwrap().write_all(&tar.stdout).unwrap();
        assert!(import.wait().unwrap().success(), "docker import failed");
        let _ = std::fs::remove_dir_all(&root);
    }
}

impl Drop for Dockerd {
    fn drop(&mut self) {
        if self.child.is_none() {
            // Stopped by the test (e.g. panicked mid-restart): bring it back just to remove the containers.
            let log = std::fs::OpenOptions::new().create(true).append(true).open(&self.log);
            if let Ok(log) = log {
                if let Ok(child) = self.command().stdout(log.try_clone().unwrap()).stderr(log).spawn() {
                    self.child = Some(child);
                    wait_until(Duration::from_secs(30), || self.try_cli(&["version"]).status.success());
                }
            }
        }
        self.remove_all();
        self.stop();
        let data = self.base.join("data");
        // dockerd bind-mounts its data root on itself and leaves it mounted.
        for _ in 0..3 {
            let mounted = std::fs::read_to_string("/proc/self/mounts")
                .unwrap_or_default()
                .lines()
                .filter_map(|l| l.split(' ').nth(1).map(str::to_string))
                .filter(|mp| mp.starts_with(self.base.to_str().unwrap()))
                .collect::<Vec<_>>();
            if mounted.is_empty() {
                break;
            }
            for mp in mounted.iter().rev() {
                let _ = Command::new("umount").arg("-l").arg(mp).status();
            }
        }
        let _ = std::fs::remove_dir_all(&data);
        let _ = std::fs::remove_dir_all(&self.base);
    }
}

fn nanos() -> u128 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos()
}

/// Polls `f` every 50 ms until it holds or `limit` has passed.
fn wait_until(limit: Duration, mut f: impl FnMut() -> bool) -> bool {
    wait_for(limit, Duration::from_millis(50), || f().then_some(())).is_some()
}

/// Request lines with the time they were seen.
type RequestLog = Arc<Mutex<Vec<(Instant, String)>>>;

/// A Unix-socket proxy in front of a Docker socket that records every HTTP request line going through it, so a
/// test can prove how many API calls the agent makes (and when).
#[derive(Debug)]
pub struct CountingProxy {
    /// Where clients connect.
    pub socket: PathBuf,
    requests: RequestLog,
    stop: Arc<AtomicBool>,
}

impl CountingProxy {
    /// Listens on `socket` and forwards every connection to `upstream`.
    pub fn start(socket: PathBuf, upstream: PathBuf) -> Self {
        let _ = std::fs::remove_file(&socket);
        let listener = UnixListener::bind(&socket).expect("bind proxy socket");
        let requests = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (reqs, stopped) = (requests.clone(), stop.clone());
        std::thread::spawn(move || {
            for client in listener.incoming() {
                if stopped.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(client) = client else { continue };
                let Ok(server) = UnixStream::connect(&upstream) else { continue };
                let (c2, s2) = (client.try_clone().unwrap(), server.try_clone().unwrap());
                let reqs = reqs.clone();
                std::thread::spawn(move || pump(client, server, Some(reqs)));
                std::thread::spawn(move || pump(s2, c2, None));
            }
        });
        Self { socket, requests, stop }
    }

    /// Every request line seen so far (`GET /v1.41/containers/json?...`), with the time it was seen.
    pub fn requests(&self) -> Vec<(Instant, String)> {
        self.requests.lock().unwrap().clone()
    }

    /// Requests seen at or after `since`.
    pub fn requests_since(&self, since: Instant) -> Vec<String> {
        self.requests().into_iter().filter(|(t, _)| *t >= since).map(|(_, r)| r).collect()
    }
}

impl Drop for CountingProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = UnixStream::connect(&self.socket); // wake the accept loop
        let _ = std::fs::remove_file(&self.socket);
    }
}

/// Copies `from` to `to`; when `log` is given, records each HTTP request line (client to server direction).
fn pump(mut from: UnixStream, mut to: UnixStream, log: Option<RequestLog>) {
    let mut buf = [0u8; 16 << 10];
    let mut line: Vec<u8> = Vec::new();
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if let Some(log) = &log {
            for &b in &buf[..n] {
                if b == b'\n' {
                    let text = String::from_utf8_lossy(&line).trim_end().to_string();
                    let is_request =
                        ["GET /", "POST /", "PUT /", "DELETE /", "HEAD /"].iter().any(|m| text.starts_with(m))
                            && text.ends_with(" HTTP/1.1");
                    if is_request {
                        log.lock().unwrap().push((Instant::now(), text));
                    }
                    line.clear();
                } else if line.len() < 8192 {
                    line.push(b);
                }
            }
        }
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(std::net::Shutdown::Both);
    let _ = from.shutdown(std::net::Shutdown::Both);
}
