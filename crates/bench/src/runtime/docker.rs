//! The Docker runtime: every reader is a real container (`docker run --rm`) from an image the bench builds
//! locally (no pull): busybox plus this binary, with the host's `/usr` mounted read-only for its shared libraries
//! and for fio. The test files are bind-mounted read-only at `/data`.
//!
//! With `--cgroup-layout flat` (the default) containers run with `--cgroup-parent=/`, so their blkio cgroups are
//! top-level groups; `nested` keeps Docker's `docker/<id>`.
//!
//! A reader container waits for a "go" file before its first read; the bench creates it once the container's
//! blkio cgroup (`/sys/fs/cgroup/blkio/docker/<id>`) exists and the hooks ran, i.e. once the agent has seen the
//! container start. The read time is the reader's own (first read to last), so `docker run` start-up is not in
//! it. Weights are written to the cgroup file: Docker 20.10 discards `--blkio-weight` on this kernel.

use std::io::Read;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use qos_core::ContainerId;

use super::cgroup::CgroupLayout;
use super::{fio_args, parse_report, Background, BackgroundKind, ReadOutcome, ReaderHooks, Runtime};
use crate::cgroups::{self, CgroupBackend};
use crate::cleanup::Cleanup;
use crate::sys;

const SOCKET: &str = "/var/run/docker.sock";

/// Whether a Docker daemon answers on its socket (`GET /_ping`).
pub fn daemon_answers() -> bool {
    let path = std::env::var("DOCKER_HOST")
        .ok()
        .and_then(|h| h.strip_prefix("unix://").map(str::to_string))
        .unwrap_or_else(|| SOCKET.to_string());
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
    next: AtomicU64,
    cleanup: &'static Cleanup,
    label: String,
}

impl DockerRuntime {
    /// Builds the image from `exe` and busybox under `work`; registers its removal.
    pub fn new(
        exe: &Path,
        layout: CgroupLayout,
        files_dir: &Path,
        work: &Path,
        cleanup: &'static Cleanup,
    ) -> Result<Self> {
        if !daemon_answers() {
            bail!("no Docker daemon answers on {SOCKET} (start dockerd, or use --runtime cgroup)");
        }
        let pid = std::process::id();
        let image = format!("ddiskqos-bench:run-{pid}");
        let root = work.join("image-root");
        build_rootfs(&root, exe)?;
        let tar = work.join("image.tar");
        sys::run("tar", &["-C", &root.to_string_lossy(), "-cf", &tar.to_string_lossy(), "."])?;
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
            next: AtomicU64::new(0),
            cleanup,
            label,
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
            format!("{}:/ctl:ro", self.ctl_dir.display()),
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

/// The blkio cgroup of a container, waiting until it exists (runc creates it when the container starts): flat
/// (`--cgroup-parent=/`), Docker's default `docker/<id>`, or the systemd driver's scope.
fn container_cgroup(id: &str, timeout: Duration) -> Result<PathBuf> {
    let v1 = Path::new(cgroups::V1_BLKIO);
    let candidates =
        [v1.join(id), v1.join("docker").join(id), v1.join("system.slice").join(format!("docker-{id}.scope"))];
    let start = Instant::now();
    loop {
        if let Some(dir) = candidates.iter().find(|d| d.exists()) {
            return Ok(dir.clone());
        }
        if start.elapsed() > timeout {
            bail!("no blkio cgroup of container {id} appeared within {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn read_cidfile(path: &Path, timeout: Duration) -> Result<String> {
    let start = Instant::now();
    loop {
        if let Ok(id) = std::fs::read_to_string(path) {
            let id = id.trim().to_string();
            if id.len() == 64 {
                return Ok(id);
            }
        }
        if start.elapsed() > timeout {
            bail!("docker did not write {} within {timeout:?}", path.display());
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

impl Runtime for DockerRuntime {
    fn name(&self) -> &'static str {
        "docker"
    }

    fn start_background(&self, file: &Path, kind: BackgroundKind) -> Result<Background> {
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
        let cgroup = match container_cgroup(&id, Duration::from_secs(10)) {
            Ok(dir) => dir,
            Err(e) => {
                let state = sys::run("docker", &["inspect", "-f", "{{.State.Status}} exit={{.State.ExitCode}}", &id]);
                let logs = sys::run("docker", &["logs", &id]).unwrap_or_default();
                bail!("{e:#}; background container: {} {logs}", state.unwrap_or_default().trim());
            }
        };
        let bg = Background { id, cgroup, command: command.join(" ") };
        let start = Instant::now();
        while cgroups::V1Bfq.read_counters(&bg.cgroup).map(|c| c.read).unwrap_or(0) == 0 {
            if start.elapsed().as_secs() > 10 {
                let logs = sys::run("docker", &["logs", &bg.id]).unwrap_or_default();
                bail!("the background container did not start reading within 10 s: {}\n{logs}", bg.command);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(bg)
    }

    fn stop_background(&self, bg: &Background) -> Result<()> {
        bg.thaw();
        sys::run("docker", &["rm", "-f", &bg.id]).map(|_| ())
    }

    fn run_reader(&self, file: &Path, hooks: &dyn ReaderHooks) -> Result<ReadOutcome> {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let name = format!("ddqb-{}-fg-{n}", std::process::id());
        let go = self.ctl_dir.join(format!("go-{n}"));
        let cidfile = self.ctl_dir.join(format!("cid-{n}"));
        let _ = std::fs::remove_file(&cidfile);
        let mut args: Vec<String> =
            vec!["run".into(), "--rm".into(), "--cidfile".into(), cidfile.display().to_string()];
        args.extend(self.base_args(&name));
        args.push(self.image.clone());
        args.extend(
            ["/bench/ddiskqos-bench", "read-file", "--wait-for", &format!("/ctl/go-{n}"), &self.in_container(file)?]
                .iter()
                .map(|s| s.to_string()),
        );
        let t0 = Instant::now();
        let child = Command::new("docker")
            .args(&args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .context("cannot run docker")?;
        let token = self.cleanup.push(format!("remove container {name}"), {
            let name = name.clone();
            move || sys::run("docker", &["rm", "-f", &name]).map(|_| ())
        });
        let mut engine_id = None;
        let started = (|| -> Result<()> {
            let id = read_cidfile(&cidfile, Duration::from_secs(30))?;
            let dir = container_cgroup(&id, Duration::from_secs(30))?;
            let cid = ContainerId::new(&id);
            hooks.created(&cid, &dir)?;
            engine_id = Some(cid);
            std::fs::write(&go, "").with_context(|| format!("cannot create {}", go.display()))
        })();
        if started.is_err() {
            // The reader would wait for its go file until it times out: end it now.
            let _ = sys::run("docker", &["rm", "-f", &name]);
        }
        let out = child.wait_with_output().context("waiting for docker run")?;
        let wall = t0.elapsed();
        if let Some(id) = &engine_id {
            hooks.finished(id);
        }
        let _ = std::fs::remove_file(&go);
        let _ = std::fs::remove_file(&cidfile);
        self.cleanup.dismiss(token);
        started?;
        if !out.status.success() {
            bail!(
                "reader container for {} failed ({}): {}",
                file.display(),
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let report = parse_report(&String::from_utf8_lossy(&out.stdout))?;
        let id = engine_id.map(|i| i.to_string()).unwrap_or(name);
        Ok(ReadOutcome { id, report, wall, charged_bytes: None })
    }
}
