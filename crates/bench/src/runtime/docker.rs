//! The Docker runtime: every reader is a real container (`docker run`) from an image the bench builds
//! locally (no pull): busybox plus this binary, with the host's `/usr` mounted read-only for its shared libraries
//! and for fio. The test files are bind-mounted read-only at `/data`.
//!
//! With `--cgroup-layout flat` (the default) containers run with `--cgroup-parent=/`, so their blkio cgroups are
//! top-level groups; `nested` keeps Docker's `docker/<id>`.
//!
//! Reader containers are started ahead of each BFQ mode, before the background runs ([`Runtime::prepare`]): each
//! blocks on its own FIFO in `/ctl`. A read takes the next one, calls the hooks (the engine sees a new container
//! and writes its weight), then writes the file's path into its FIFO; the reader reads the file and leaves its
//! report in `/ctl/result-<n>`. Its first I/O comes after the hooks, as for a container the agent saw start. The
//! read time is the reader's own (first read to last). Starting containers ahead keeps `docker run` (which writes
//! to the root disk, seconds per container while the background loads that disk in BFQ's default mode) out of the
//! measurements; exited readers are removed at the end of the mode for the same reason.
//!
//! The bench writes no weight: the agent's daemon (with the agent binary's Docker backends, see `crate::agent`)
//! discovers the containers from Docker's events and applies weights; the bench finds each container's cgroup with
//! the agent's own naming (`qos_agent::runtime::docker::container_cgroup`) and reads its weight file.

use std::collections::VecDeque;
use std::io::Read;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use qos_agent::cgroup::{CgroupDir, CgroupRoot};
use qos_agent::runtime::docker::CgroupDriver;
use qos_core::ContainerId;

use super::cgroup::CgroupLayout;
use super::{fio_args, parse_report, Background, BackgroundKind, ReadOutcome, ReaderHooks, Runtime};
use crate::agent::container_info;
use crate::cleanup::Cleanup;
use crate::sys;

const SOCKET: &str = "/var/run/docker.sock";

/// Whether a Docker daemon answers on its socket (`GET /_ping`).
pub fn daemon_answers() -> bool {
    let path = crate::agent::docker_host_socket().unwrap_or_else(|| SOCKET.into());
    let Ok(mut s) = UnixStream::connect(path) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    use std::io::Write;
    if s.write_all(b"GET /_ping HTTP/1.0\r\nHost: docker\r\n\r\n").is_err() {
        return false;
    }
    let mut reply = String::new();
    let _ = s.read_to_string(&mut reply);
    reply.starts_with("HTTP/1.") && reply.contains(" 200 ") && sys::have("docker")
}

/// Readers as containers.
#[derive(Debug)]
pub struct DockerRuntime {
    image: String,
    files_dir: PathBuf,
    ctl_dir: PathBuf,
    lib_mounts: Vec<String>,
    layout: CgroupLayout,
    /// The cgroup hierarchy (the agent's detection) and dockerd's cgroup driver: where containers' cgroups are.
    root: Arc<CgroupRoot>,
    driver: CgroupDriver,
    next: AtomicU64,
    cleanup: &'static Cleanup,
    label: String,
    /// Reader containers started ahead of time (see [`Runtime::prepare`]).
    pool: Mutex<VecDeque<Pooled>>,
    /// The background container, kept when exited readers are removed.
    bg_id: Mutex<Option<String>>,
}

impl DockerRuntime {
    /// Builds the image from `exe` and busybox under `work`; registers its removal.
    pub fn new(
        exe: &Path,
        layout: CgroupLayout,
        files_dir: &Path,
        work: &Path,
        root: Arc<CgroupRoot>,
        cleanup: &'static Cleanup,
    ) -> Result<Self> {
        if !daemon_answers() {
            bail!("no Docker daemon answers on {SOCKET} (start dockerd, or use --runtime cgroup)");
        }
        let driver_name = sys::run("docker", &["info", "--format", "{{.CgroupDriver}}"])?;
        let driver: CgroupDriver = driver_name.trim().parse().context("docker info: cgroup driver")?;
        let pid = std::process::id();
        let image = format!("ddiskqos-bench:run-{pid}");
        let image_root = work.join("image-root");
        build_rootfs(&image_root, exe)?;
        let tar = work.join("image.tar");
        sys::run("tar", &["-C", &image_root.to_string_lossy(), "-cf", &tar.to_string_lossy(), "."])?;
        sys::run("docker", &["import", &tar.to_string_lossy(), &image])?;
        let _ = std::fs::remove_file(&tar);
        let img = image.clone();
        cleanup.push(format!("remove image {image}"), move || sys::run("docker", &["rmi", "-f", &img]).map(|_| ()));
        let label = format!("ddiskqos-bench={pid}");
        let l = label.clone();
        cleanup.push("remove leftover containers", move || {
            let ids = sys::run("docker", &["ps", "-aq", "--filter", &format!("label={l}")])?;
            for id in ids.split_whitespace() {
                let _ = sys::run("docker", &["rm", "-f", id]);
            }
            Ok(())
        });
        let ctl_dir = work.join("ctl");
        std::fs::create_dir_all(&ctl_dir)?;
        // The binary and fio need the host's shared libraries; on a merged-/usr host /lib and /lib64 are links
        // into /usr (recreated in the image), otherwise they are mounted too.
        let mut lib_mounts = vec!["/usr:/usr:ro".to_string()];
        for dir in ["/lib", "/lib64"] {
            let meta = std::fs::symlink_metadata(dir);
            if meta.map(|m| m.is_dir()).unwrap_or(false) {
                lib_mounts.push(format!("{dir}:{dir}:ro"));
            }
        }
        Ok(Self {
            image,
            files_dir: files_dir.to_path_buf(),
            ctl_dir,
            lib_mounts,
            layout,
            root,
            driver,
            next: AtomicU64::new(0),
            cleanup,
            label,
            pool: Mutex::new(VecDeque::new()),
            bg_id: Mutex::new(None),
        })
    }

    fn base_args(&self, name: &str) -> Vec<String> {
        let mut args: Vec<String> = vec![
            "--name".into(),
            name.into(),
            "--label".into(),
            self.label.clone(),
            "--network".into(),
            "none".into(),
            "-v".into(),
            format!("{}:/data:ro", self.files_dir.display()),
            "-v".into(),
            format!("{}:/ctl", self.ctl_dir.display()),
        ];
        for m in &self.lib_mounts {
            args.push("-v".into());
            args.push(m.clone());
        }
        if self.layout == CgroupLayout::Flat {
            // /sys/fs/cgroup/blkio/<id> instead of docker/<id>.
            args.push("--cgroup-parent=/".into());
        }
        args
    }

    /// The path of a file on the test file system as containers see it.
    fn in_container(&self, file: &Path) -> Result<String> {
        let rel = file
            .strip_prefix(&self.files_dir)
            .with_context(|| format!("{} is not under {}", file.display(), self.files_dir.display()))?;
        Ok(format!("/data/{}", rel.display()))
    }
}

fn build_rootfs(root: &Path, exe: &Path) -> Result<()> {
    let _ = std::fs::remove_dir_all(root);
    for d in ["bin", "bench", "data", "ctl", "usr", "tmp", "proc", "sys", "dev", "etc"] {
        std::fs::create_dir_all(root.join(d))?;
    }
    let busybox = ["/bin/busybox", "/usr/bin/busybox"].into_iter().find(|p| Path::new(p).exists());
    if let Some(bb) = busybox {
        std::fs::copy(bb, root.join("bin/busybox")).with_context(|| format!("cannot copy {bb}"))?;
        for applet in ["sh", "dd", "cat", "sleep", "ls"] {
            std::os::unix::fs::symlink("busybox", root.join("bin").join(applet))?;
        }
    }
    std::fs::copy(exe, root.join("bench/ddiskqos-bench")).with_context(|| format!("cannot copy {}", exe.display()))?;
    for dir in ["lib", "lib64"] {
        let host = Path::new("/").join(dir);
        if let Ok(target) = std::fs::read_link(&host) {
            std::os::unix::fs::symlink(target, root.join(dir))?;
        } else {
            std::fs::create_dir_all(root.join(dir))?;
        }
    }
    Ok(())
}

impl DockerRuntime {
    /// The blkio cgroup of a container, by the agent's naming for dockerd's driver and the bench's
    /// `--cgroup-parent` (flat: `/`; nested: Docker's default), waiting until it exists (runc creates it when the
    /// container starts).
    fn container_cgroup(&self, id: &str, timeout: Duration) -> Result<CgroupDir> {
        let parent = match self.layout {
            CgroupLayout::Flat => Some("/"),
            CgroupLayout::Nested => None,
        };
        let start = Instant::now();
        loop {
            match qos_agent::runtime::docker::container_cgroup(&self.root, id, self.driver, parent) {
                Ok(dir) => return Ok(dir),
                Err(e) if e.is_vanished() && start.elapsed() <= timeout => {}
                Err(e) => return Err(e).with_context(|| format!("no cgroup of container {id} within {timeout:?}")),
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

impl Runtime for DockerRuntime {
    fn name(&self) -> &'static str {
        "docker"
    }

    fn start_background(&self, file: &Path, kind: BackgroundKind, hooks: &dyn ReaderHooks) -> Result<Background> {
        let name = format!("ddqb-{}-bg", std::process::id());
        let file_c = self.in_container(file)?;
        let mut args: Vec<String> = vec!["run".into(), "-d".into()];
        args.extend(self.base_args(&name));
        args.push(self.image.clone());
        let command: Vec<String> = match kind.resolve() {
            BackgroundKind::Fio => std::iter::once("/usr/bin/fio".to_string()).chain(fio_args(&file_c)).collect(),
            _ => ["/bench/ddiskqos-bench", "stream", "--threads", &super::INTERNAL_THREADS.to_string(), &file_c]
                .iter()
                .map(|s| s.to_string())
                .collect(),
        };
        args.extend(command.iter().cloned());
        let argv: Vec<&str> = args.iter().map(String::as_str).collect();
        let id = sys::run("docker", &argv)?.trim().to_string();
        let i = id.clone();
        self.cleanup
            .push(format!("remove container {name}"), move || sys::run("docker", &["rm", "-f", &i]).map(|_| ()));
        let logs = || sys::run("docker", &["logs", &id]).unwrap_or_default();
        let cgroup = match self.container_cgroup(&id, Duration::from_secs(10)) {
            Ok(dir) => dir,
            Err(e) => {
                let state = sys::run("docker", &["inspect", "-f", "{{.State.Status}} exit={{.State.ExitCode}}", &id]);
                bail!("{e:#}; background container: {} {}", state.unwrap_or_default().trim(), logs());
            }
        };
        hooks.created(&container_info(&id, cgroup.clone()), Instant::now())?;
        *self.bg_id.lock().unwrap_or_else(|e| e.into_inner()) = Some(id.clone());
        let bg = Background { id: id.clone(), cgroup, command: command.join(" ") };
        bg.wait_reading(logs)?;
        Ok(bg)
    }

    fn stop_background(&self, bg: &Background) -> Result<()> {
        bg.thaw();
        sys::run("docker", &["rm", "-f", &bg.id]).map(|_| ())
    }

    fn prepare(&self, readers: usize) -> Result<()> {
        // Start every reader container of the mode now, before the background runs: container start-up writes to
        // the root disk, which the background loads heavily in BFQ's default mode (seconds per `docker run`).
        let started = super::start_all(readers, "container", || self.start_pooled())?;
        self.pool.lock().unwrap_or_else(|e| e.into_inner()).extend(started);
        Ok(())
    }

    fn end_mode(&self) -> Result<()> {
        // Exited readers were kept so that no container removal (root-disk I/O) overlapped a measurement.
        let ids = sys::run("docker", &["ps", "-aq", "--filter", &format!("label={}", self.label)])?;
        let bg = self.bg_id.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let ids: Vec<&str> = ids.split_whitespace().filter(|id| !matches!(&bg, Some(b) if b.starts_with(id))).collect();
        for chunk in ids.chunks(50) {
            let mut args = vec!["rm", "-f"];
            args.extend(chunk);
            sys::run("docker", &args)?;
        }
        self.pool.lock().unwrap_or_else(|e| e.into_inner()).clear();
        Ok(())
    }

    fn run_reader(&self, file: &Path, hooks: &dyn ReaderHooks) -> Result<ReadOutcome> {
        let pooled = self.pool.lock().unwrap_or_else(|e| e.into_inner()).pop_front();
        let p = match pooled {
            Some(p) => p,
            None => self.start_pooled()?,
        };
        let t0 = Instant::now();
        let cid = ContainerId::new(&p.id);
        let result = (|| -> Result<ReadOutcome> {
            let weight = hooks.created(&container_info(&p.id, p.cgroup.clone()), t0)?;
            // Opening the FIFO for writing completes once the reader has it open for reading (it does at start).
            let mut go = std::fs::OpenOptions::new()
                .write(true)
                .open(&p.go)
                .with_context(|| format!("cannot open {}", p.go.display()))?;
            use std::io::Write;
            writeln!(go, "{}", self.in_container(file)?).with_context(|| format!("cannot write {}", p.go.display()))?;
            drop(go);
            let deadline = Duration::from_secs(600);
            while !p.result.exists() {
                if t0.elapsed() > deadline {
                    bail!("reader container {} gave no result within {deadline:?}", p.id);
                }
                if !p.cgroup.path().exists() && !p.result.exists() {
                    // Exited without a result: its logs say why.
                    std::thread::sleep(Duration::from_millis(50));
                    if !p.result.exists() {
                        let logs = sys::run("docker", &["logs", &p.id]).unwrap_or_default();
                        bail!("reader container {} exited without a result: {logs}", p.id);
                    }
                }
                std::thread::sleep(Duration::from_micros(500));
            }
            let wall = t0.elapsed();
            let text =
                std::fs::read_to_string(&p.result).with_context(|| format!("cannot read {}", p.result.display()))?;
            let report = parse_report(&text)?;
            Ok(ReadOutcome { id: p.id.clone(), report, wall, charged_bytes: None, weight })
        })();
        hooks.finished(&cid);
        let _ = std::fs::remove_file(&p.go);
        let _ = std::fs::remove_file(&p.result);
        result
    }
}

/// A reader container started ahead of time, blocked on its go FIFO.
#[derive(Debug)]
struct Pooled {
    id: String,
    cgroup: CgroupDir,
    go: PathBuf,
    result: PathBuf,
}

impl DockerRuntime {
    /// Starts one reader container that waits (blocked, no CPU) for a file path on its FIFO.
    fn start_pooled(&self) -> Result<Pooled> {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let name = format!("ddqb-{}-fg-{n}", std::process::id());
        let go = self.ctl_dir.join(format!("go-{n}"));
        let result = self.ctl_dir.join(format!("result-{n}"));
        let _ = std::fs::remove_file(&go);
        nix::unistd::mkfifo(&go, nix::sys::stat::Mode::from_bits_truncate(0o600))
            .with_context(|| format!("cannot create FIFO {}", go.display()))?;
        let mut args: Vec<String> = vec!["run".into(), "-d".into()];
        args.extend(self.base_args(&name));
        args.push(self.image.clone());
        args.extend(
            [
                "/bench/ddiskqos-bench",
                "read-file",
                "--go-fifo",
                &format!("/ctl/go-{n}"),
                "--result",
                &format!("/ctl/result-{n}"),
            ]
            .iter()
            .map(|s| s.to_string()),
        );
        let argv: Vec<&str> = args.iter().map(String::as_str).collect();
        let id = sys::run("docker", &argv)?.trim().to_string();
        let cgroup = self.container_cgroup(&id, Duration::from_secs(30))?;
        Ok(Pooled { id, cgroup, go, result })
    }
}
