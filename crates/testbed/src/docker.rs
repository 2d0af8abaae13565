//! The host's Docker (`/var/run/docker.sock`) through Debian's CLI: containers removed on drop, the blkio cgroup
//! of a container in Docker's default layout.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The Docker CLI matching Debian's dockerd 20.10 (another client earlier on `PATH` may not).
pub const DOCKER_CLI: &str = "/usr/bin/docker";
/// The test image: busybox-static, built locally by `scripts/setup-host.sh` (no registry is reachable).
pub const IMAGE: &str = "ddiskqos-test:latest";

/// Whether the host's dockerd answers and has [`IMAGE`].
pub fn image_ready() -> bool {
    image_exists(IMAGE)
}

/// The host's dockerd, whatever `$DOCKER_HOST` says (inside the v2 test bed it names the throw-away dockerd).
pub const HOST_SOCKET: &str = "unix:///var/run/docker.sock";

/// Whether the dockerd at `$DOCKER_HOST` (else the host's) answers and has `image`.
pub fn image_exists(image: &str) -> bool {
    inspect(image, None)
}

/// Whether the host's dockerd answers and has `image`.
pub fn image_exists_on_host(image: &str) -> bool {
    inspect(image, Some(HOST_SOCKET))
}

fn inspect(image: &str, host: Option<&str>) -> bool {
    Command::new(DOCKER_CLI)
        .envs(host.map(|h| ("DOCKER_HOST", h)))
        .args(["image", "inspect", image])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// `docker ARGS` against the host's dockerd; its trimmed stdout. Panics with stderr on failure.
pub fn cli(args: &[&str]) -> String {
    let out = Command::new(DOCKER_CLI).args(args).output().unwrap_or_else(|e| panic!("docker {args:?}: {e}"));
    assert!(out.status.success(), "docker {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// The blkio cgroup of a host container in Docker's default (cgroupfs) layout.
pub fn cgroup(id: &str) -> PathBuf {
    PathBuf::from(format!("/sys/fs/cgroup/blkio/docker/{id}"))
}

/// Containers started by a test on the host's dockerd, removed (`rm -f`) on drop.
#[derive(Debug, Default)]
pub struct Containers(pub Vec<String>);

/// Label put on every container [`Containers::run`] starts, unique per call, so a `docker run -d` that created the
/// container but failed to start it (its id never printed) can still be found and removed.
pub const RUN_LABEL: &str = "testbed.run";

impl Containers {
    /// `docker run -d ARGS...`; returns the full id. On failure the container it may have created is removed before
    /// the panic, so a failed start leaves nothing behind.
    pub fn run(&mut self, args: &[&str]) -> String {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let tag = format!("{RUN_LABEL}={}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed));
        let mut full = vec!["run", "-d", "--label", &tag];
        full.extend_from_slice(args);
        let out = Command::new(DOCKER_CLI).args(&full).output().unwrap_or_else(|e| panic!("docker {full:?}: {e}"));
        if !out.status.success() {
            let filter = format!("label={tag}");
            let left = Command::new(DOCKER_CLI).args(["ps", "-aq", "--filter", &filter]).output();
            let left = left.map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string()).unwrap_or_default();
            for id in left.lines() {
                let _ = Command::new(DOCKER_CLI)
                    .args(["rm", "-f", id])
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status();
            }
            panic!("docker {full:?} failed: {}", String::from_utf8_lossy(&out.stderr));
        }
        let id = String::from_utf8_lossy(&out.stdout).trim().to_string();
        self.0.push(id.clone());
        id
    }
}

impl Drop for Containers {
    fn drop(&mut self) {
        if !self.0.is_empty() {
            let mut args = vec!["rm", "-f"];
            args.extend(self.0.iter().map(String::as_str));
            let _ = Command::new(DOCKER_CLI).args(&args).stdout(Stdio::null()).stderr(Stdio::null()).status();
        }
    }
}

/// A container's start timed against its cgroup: Docker's `start` event (subscribed before the start), the cgroup
/// directory appearing, and a condition on it (e.g. the agent's top weight in its file) holding.
#[derive(Debug)]
pub struct StartTiming {
    events: std::process::Child,
    watcher: std::thread::JoinHandle<Option<(Duration, Duration)>>,
}

/// What [`StartTiming::finish`] measured, as times since the Unix epoch.
#[derive(Debug, Clone, Copy)]
pub struct StartTimes {
    /// The cgroup directory appeared.
    pub appeared: Duration,
    /// The condition held.
    pub reached: Duration,
    /// Docker's `start` event (`TimeNano`).
    pub start_event_ns: i128,
}

impl StartTimes {
    /// From the cgroup's appearance to the condition, ms.
    pub fn reaction_ms(&self) -> f64 {
        (self.reached - self.appeared).as_secs_f64() * 1e3
    }

    /// From the start event to the condition, ms (negative: before Docker reported the start).
    pub fn after_start_event_ms(&self) -> f64 {
        (self.reached.as_nanos() as i128 - self.start_event_ns) as f64 / 1e6
    }
}

impl StartTiming {
    /// Subscribes to `id`'s start event (and gives the client a moment to subscribe), then watches from another
    /// thread, every 200 µs: `cgroup` appearing, then `reached(cgroup)`. Call before `docker start`.
    pub fn watch(id: &str, cgroup: PathBuf, reached: impl Fn(&Path) -> bool + Send + 'static) -> Self {
        let events = Command::new(DOCKER_CLI)
            .args(["events", "--filter", &format!("container={id}"), "--filter", "event=start"])
            .args(["--format", "{{.TimeNano}}"])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("docker events: {e}"));
        std::thread::sleep(crate::process::patience(Duration::from_millis(300)));
        let watcher = std::thread::spawn(move || {
            let now = || SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
            let (limit, every) = (crate::process::patience(Duration::from_secs(10)), Duration::from_micros(200));
            let appeared = crate::process::wait_for(limit, every, || cgroup.exists().then(now));
            let reached = crate::process::wait_for(limit, every, || reached(&cgroup).then(now));
            appeared.zip(reached)
        });
        Self { events, watcher }
    }

    /// After `docker start`: the times, or `None` if the cgroup never appeared or the condition never held.
    pub fn finish(mut self) -> Option<StartTimes> {
        let mut line = String::new();
        let out = self.events.stdout.take().expect("piped");
        std::io::BufRead::read_line(&mut std::io::BufReader::new(out), &mut line).expect("docker events output");
        let _ = self.events.kill();
        let _ = self.events.wait();
        let start_event_ns: i128 = line.trim().parse().unwrap_or_else(|e| panic!("start event time {line:?}: {e}"));
        let (appeared, reached) = self.watcher.join().expect("watcher thread")?;
        Some(StartTimes { appeared, reached, start_event_ns })
    }
}
