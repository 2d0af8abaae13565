//! The Docker runtime: every reader is a real container from an image the bench builds locally (no pull):
//! busybox plus this binary, with the host's `/usr` mounted read-only for its shared libraries and for fio. The
//! test files are bind-mounted read-only at `/data`.
//!
//! With `--cgroup-layout nested` (the default) containers keep Docker's own layout, `docker/<id>`; `flat` runs
//! them with `--cgroup-parent=/`, so their blkio cgroups are top-level groups (an operator's choice).
//!
//! **Readers read at once, as real containers do.** Each read is a container created ahead of the mode
//! ([`Runtime::prepare`], before the background runs: `docker create` writes to the root disk) with its file on
//! its command line, and started (`docker start`) when its read is due: its process reads as soon as it runs, at
//! whatever weight its cgroup has then. The bench does not wait for the agent; it watches the reader's cgroup
//! appear and measures how long the agent took to put the top weight in the file that governs the device (the
//! reaction time, reported beside the read times), and how many bytes the reader had read by then. The read time
//! is the reader's own (first read to last). Exited readers are removed at the end of the mode (no container
//! removal overlaps a measurement).
//!
//! The static-best variant's containers are created with `--blkio-weight` (`crate::static_best`), as an operator
//! sets a static weight; where Docker does not put it into the file that governs the test device (Docker 20.10 on a
//! cgroup-v1 BFQ host discards it), the bench's hooks write that file as soon as the cgroup appears (the
//! background's once `docker run -d` returned, a reader's from the watcher, while `docker start` runs). Otherwise
//! the bench writes no weight: the agent's daemon (with the agent binary's Docker backends, see `crate::agent`)
//! discovers the containers itself and applies weights; the bench finds each container's cgroup with the agent's
//! own naming (`qos_agent::runtime::docker::container_cgroup`) and reads its weight file.

use std::collections::{HashMap, VecDeque};
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
use super::{parse_report, Background, BackgroundKind, PlannedRead, ReadOutcome, ReaderHooks, Runtime};
use crate::agent::{container_info, WeightRead};
use crate::cleanup::Cleanup;
use crate::static_best::StaticWeight;
use crate::sys;

const SOCKET: &str = "/var/run/docker.sock";

/// The nice value of the thread that times the agent's reaction: the highest, above the agent's own.
const OBSERVER_NICE: i8 = -20;

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
    /// What every container's `docker run`/`create` line has.
    shared: SharedArgs,
    /// The cgroup hierarchy (the agent's detection) and dockerd's cgroup driver: where containers' cgroups are.
    root: Arc<CgroupRoot>,
    driver: CgroupDriver,
    next: AtomicU64,
    cleanup: &'static Cleanup,
    /// Reader containers created ahead of time, by the file they read and their `--blkio-weight` (see
    /// [`Runtime::prepare`]).
    pool: Mutex<HashMap<PoolKey, VecDeque<Pooled>>>,
    /// The background containers (the static-best variant's beside the first), kept when exited readers are removed.
    bg_ids: Mutex<Vec<String>>,
}

/// What every container of the bench has on its `docker run`/`create` line.
#[derive(Debug, Clone, PartialEq, Eq)]
struct SharedArgs {
    /// `ddiskqos-bench=<pid>`: the bench's containers, for their removal.
    label: String,
    /// The test files, mounted at `/data`.
    files_dir: PathBuf,
    /// The control directory, mounted at `/ctl`.
    ctl_dir: PathBuf,
    /// The host's library directories, read-only.
    lib_mounts: Vec<String>,
    /// `--pin-weights`: readers' and background's `ddiskqos.weight` labels.
    pin: Option<(u32, u32)>,
    /// Where the containers' cgroups go.
    layout: CgroupLayout,
}

impl DockerRuntime {
    /// Builds the image from `exe` and busybox under `work`; registers its removal.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        exe: &Path,
        layout: CgroupLayout,
        pin: Option<(u32, u32)>,
        files_dir: &Path,
        work: &Path,
        root: Arc<CgroupRoot>,
        cleanup: &'static Cleanup,
    ) -> Result<Self> {
        if !daemon_answers() {
            bail!("no Docker daemon answers on {SOCKET} (start dockerd, or use --runtime cgroup-dir)");
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
            shared: SharedArgs { label, files_dir: files_dir.to_path_buf(), ctl_dir, lib_mounts, pin, layout },
            root,
            driver,
            next: AtomicU64::new(0),
            cleanup,
            pool: Mutex::new(HashMap::new()),
            bg_ids: Mutex::new(Vec::new()),
        })
    }

    /// The path of a file on the test file system as containers see it.
    fn in_container(&self, file: &Path) -> Result<String> {
        let rel = file
            .strip_prefix(&self.shared.files_dir)
            .with_context(|| format!("{} is not under {}", file.display(), self.shared.files_dir.display()))?;
        Ok(format!("/data/{}", rel.display()))
    }
}

impl SharedArgs {
    /// `docker run`/`create` arguments of the background (`background`) or a reader named `name`; with `weight`
    /// (the static-best variant) the container is created at that weight (`--blkio-weight`), or not at all where
    /// Docker would refuse or clamp it.
    fn args(&self, name: &str, background: bool, weight: Option<StaticWeight>) -> Result<Vec<String>> {
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
        if let Some((reader, bg)) = self.pin {
            // Static weights: pinned by the agent's own label, the MLFQ out of the way (the reference run).
            args.push("--label".into());
            args.push(format!("ddiskqos.weight={}", if background { bg } else { reader }));
        }
        if let Some(parent) = parent(self.layout) {
            // /sys/fs/cgroup/blkio/<id> instead of docker/<id>.
            args.push(format!("--cgroup-parent={parent}"));
        }
        if let Some(w) = weight {
            // Static weights as an operator sets them: once, at the container's creation; and kept from the agent,
            // which finds Docker's containers by itself (in dDiskQoS blocks it would weight them, and restore their
            // weights when put back in its dry run), as an operator keeps it from containers weighted by hand.
            let role = if background { "background" } else { "reader" };
            args.extend(crate::static_best::docker_args(role, w.weight)?);
            args.push("--label".into());
            args.push(format!("{}=true", qos_agent::labels::EXCLUDE_LABEL));
        }
        Ok(args)
    }
}

/// The `--cgroup-parent` of `layout` (`None`: Docker's default).
fn parent(layout: CgroupLayout) -> Option<&'static str> {
    match layout {
        CgroupLayout::Flat => Some("/"),
        CgroupLayout::Nested => None,
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
        let start = Instant::now();
        loop {
            match qos_agent::runtime::docker::container_cgroup(&self.root, id, self.driver, self.parent()) {
                Ok(dir) => return Ok(dir),
                Err(e) if e.is_vanished() && start.elapsed() <= timeout => {}
                Err(e) => return Err(e).with_context(|| format!("no cgroup of container {id} within {timeout:?}")),
            }
            // Fine-grained: a reader's cgroup is watched for from `docker start` on, and its appearance timed.
            std::thread::sleep(Duration::from_micros(100));
        }
    }

    /// The `--cgroup-parent` of the layout (`None`: Docker's default).
    fn parent(&self) -> Option<&'static str> {
        parent(self.shared.layout)
    }
}

impl Runtime for DockerRuntime {
    fn name(&self) -> &'static str {
        "docker"
    }

    fn cgroup_layout(&self) -> Option<&'static str> {
        // With the systemd driver Docker's default layout is a scope per container, not `docker/<id>`.
        match (self.driver, self.shared.layout) {
            (CgroupDriver::Systemd, CgroupLayout::Nested) => {
                Some("Docker's default layout, systemd cgroup driver: system.slice/docker-<id>.scope")
            }
            _ => None,
        }
    }

    fn start_background(
        &self,
        file: &Path,
        kind: BackgroundKind,
        weight: Option<StaticWeight>,
        hooks: &dyn ReaderHooks,
    ) -> Result<Background> {
        let suffix = if weight.is_some() { "-static" } else { "" };
        let name = format!("ddqb-{}-bg{suffix}", std::process::id());
        let file_c = self.in_container(file)?;
        let mut args: Vec<String> = vec!["run".into(), "-d".into()];
        args.extend(self.shared.args(&name, true, weight)?);
        args.push(self.image.clone());
        let command = kind.container_command(&file_c);
        args.extend(command.iter().cloned());
        let argv: Vec<&str> = args.iter().map(String::as_str).collect();
        let id = sys::run("docker", &argv)?.trim().to_string();
        let i = id.clone();
        self.cleanup
            .push(format!("remove container {name}"), move || sys::run("docker", &["rm", "-f", &i]).map(|_| ()));
        let logs = || sys::run("docker", &["logs", &id]).unwrap_or_default();
        let cgroup = match self.container_cgroup(&id, crate::sys::patience(Duration::from_secs(10))) {
            Ok(dir) => dir,
            Err(e) => {
                let state = sys::run("docker", &["inspect", "-f", "{{.State.Status}} exit={{.State.ExitCode}}", &id]);
                bail!("{e:#}; background container: {} {}", state.unwrap_or_default().trim(), logs());
            }
        };
        hooks.created(&container_info(&id, cgroup.clone()), Instant::now())?;
        self.bg_ids.lock().unwrap_or_else(|e| e.into_inner()).push(id.clone());
        let bg = Background { id: id.clone(), cgroup, command: command.join(" ") };
        bg.wait_reading(logs)?;
        Ok(bg)
    }

    fn stop_background(&self, bg: &Background) -> Result<()> {
        bg.thaw();
        self.bg_ids.lock().unwrap_or_else(|e| e.into_inner()).retain(|id| *id != bg.id);
        sys::run("docker", &["rm", "-f", &bg.id]).map(|_| ())
    }

    fn prepare(&self, reads: &[PlannedRead]) -> Result<()> {
        // Create every reader container of the mode now, before the background runs: `docker create` writes to
        // the root disk, which the background loads heavily in BFQ's default mode (seconds per container).
        let next = std::sync::atomic::AtomicUsize::new(0);
        let created = super::start_all(reads.len(), "container", || {
            let read = &reads[next.fetch_add(1, Ordering::Relaxed)];
            Ok((pool_key(&read.file, read.weight), self.create_reader(&read.file, read.weight)?))
        })?;
        let mut pool = self.pool.lock().unwrap_or_else(|e| e.into_inner());
        for (key, p) in created {
            pool.entry(key).or_default().push_back(p);
        }
        Ok(())
    }

    fn end_mode(&self) -> Result<()> {
        // Exited readers were kept so that no container removal (root-disk I/O) overlapped a measurement.
        let ids = sys::run("docker", &["ps", "-aq", "--filter", &format!("label={}", self.shared.label)])?;
        let bgs = self.bg_ids.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let ids: Vec<&str> = ids.split_whitespace().filter(|id| !bgs.iter().any(|b| b.starts_with(id))).collect();
        for chunk in ids.chunks(50) {
            let mut args = vec!["rm", "-f"];
            args.extend(chunk);
            sys::run("docker", &args)?;
        }
        self.pool.lock().unwrap_or_else(|e| e.into_inner()).clear();
        Ok(())
    }

    fn run_reader(&self, file: &Path, weight: Option<StaticWeight>, hooks: &dyn ReaderHooks) -> Result<ReadOutcome> {
        let key = pool_key(file, weight);
        let pooled = self.pool.lock().unwrap_or_else(|e| e.into_inner()).get_mut(&key).and_then(VecDeque::pop_front);
        let p = match pooled {
            Some(p) => p,
            None => self.create_reader(file, weight)?,
        };
        let cid = ContainerId::new(&p.id);
        let t0 = Instant::now();
        let result = std::thread::scope(|scope| -> Result<ReadOutcome> {
            // From `docker start` on: the cgroup's appearance, then the agent's reaction, timed by the hooks while
            // the reader already reads.
            let watcher = scope.spawn(|| -> Result<(CgroupDir, WeightRead)> {
                // The observer runs before anything else on the host, so the times it takes are when the cgroup
                // appeared and the weight arrived, not when a busy CPU let it look (its polls are a few µs each).
                // Its nice value must not be lowered (no CAP_SYS_NICE): then it says what it measures with.
                if let Err(e) = qos_agent::priority::apply(OBSERVER_NICE) {
                    tracing::warn!(error = %e, "the reaction times include the observer's own waits for a CPU");
                }
                let dir = self.container_cgroup(&p.id, crate::sys::patience(Duration::from_secs(30)))?;
                let weight = hooks.created(&container_info(&p.id, dir.clone()), Instant::now())?;
                Ok((dir, weight))
            });
            let started = sys::run("docker", &["start", &p.id]);
            // The watcher ends when the top weight arrived, or the reader finished first, or (other variants) once
            // the weight was read: before or as the reader ends.
            let watched = watcher.join().map_err(|_| anyhow::anyhow!("reaction watcher panicked"))?;
            started?;
            let (dir, weight) = watched?;
            let (report, wall) = self.wait_result(&p, &dir, t0)?;
            Ok(ReadOutcome { id: p.id.clone(), report, wall, charged_bytes: None, weight })
        });
        hooks.finished(&cid);
        let _ = std::fs::remove_file(&p.result);
        result
    }
}

impl DockerRuntime {
    /// Waits for a reader's result file; its report and the time from `t0`.
    fn wait_result(&self, p: &Pooled, dir: &CgroupDir, t0: Instant) -> Result<(crate::reader::ReadReport, Duration)> {
        let deadline = Duration::from_secs(600);
        while !p.result.exists() {
            if t0.elapsed() > deadline {
                bail!("reader container {} gave no result within {deadline:?}", p.id);
            }
            if !dir.path().exists() {
                // Exited: its result may still be on its way through the bind mount; else its logs say why.
                std::thread::sleep(Duration::from_millis(50));
                if !p.result.exists() {
                    let logs = sys::run("docker", &["logs", &p.id]).unwrap_or_default();
                    bail!("reader container {} exited without a result: {logs}", p.id);
                }
            }
            std::thread::sleep(Duration::from_micros(500));
        }
        let wall = t0.elapsed();
        // The reader writes its report to a temporary name and renames it: an existing result is whole.
        let text = std::fs::read_to_string(&p.result).with_context(|| format!("cannot read {}", p.result.display()))?;
        Ok((parse_report(&text)?, wall))
    }

    /// Creates (does not start) a reader container whose command reads `file` at once and leaves its report in
    /// `/ctl/result-<n>`; with `weight`, at that weight (the static-best variant).
    fn create_reader(&self, file: &Path, weight: Option<StaticWeight>) -> Result<Pooled> {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let name = format!("ddqb-{}-fg-{n}", std::process::id());
        let result = self.shared.ctl_dir.join(format!("result-{n}"));
        let _ = std::fs::remove_file(&result);
        let mut args: Vec<String> = vec!["create".into()];
        args.extend(self.shared.args(&name, false, weight)?);
        args.push(self.image.clone());
        let result_in = format!("/ctl/result-{n}");
        let file_in = self.in_container(file)?;
        args.extend(["/bench/ddiskqos-bench", "read-file", "--result", &result_in, &file_in].map(String::from));
        let argv: Vec<&str> = args.iter().map(String::as_str).collect();
        let id = sys::run("docker", &argv)?.trim().to_string();
        Ok(Pooled { id, result })
    }
}

/// Which reader containers can serve a read: the file they read and the `--blkio-weight` they were created with.
type PoolKey = (PathBuf, Option<u32>);

/// The pool a reader of `file` created with `weight` is kept in: readers of the static-best variant are created at
/// their weight and serve only that variant.
fn pool_key(file: &Path, weight: Option<StaticWeight>) -> PoolKey {
    (file.to_path_buf(), weight.map(|w| w.weight.to_bfq()))
}

/// A reader container created ahead of time, not started.
#[derive(Debug)]
struct Pooled {
    id: String,
    result: PathBuf,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::WeightProbe;
    use qos_core::Weight;

    fn shared(layout: CgroupLayout, pin: Option<(u32, u32)>) -> SharedArgs {
        SharedArgs {
            label: "ddiskqos-bench=42".into(),
            files_dir: "/mnt/files".into(),
            ctl_dir: "/work/ctl".into(),
            lib_mounts: vec!["/usr:/usr:ro".into()],
            pin,
            layout,
        }
    }

    fn weight(w: u64) -> StaticWeight {
        StaticWeight { weight: Weight::new(w).unwrap(), probe: WeightProbe::V1 }
    }

    /// The value following `flag` in `args`, if the flag is there.
    fn value<'a>(args: &'a [String], flag: &str) -> Option<&'a str> {
        args.iter().position(|a| a == flag).map(|i| args[i + 1].as_str())
    }

    #[test]
    fn static_weights_are_set_at_creation_with_blkio_weight() {
        let nested = shared(CgroupLayout::Nested, None);
        let plain = nested.args("ddqb-42-fg-0", false, None).unwrap();
        assert_eq!(value(&plain, "--name"), Some("ddqb-42-fg-0"));
        assert_eq!(value(&plain, "--label"), Some("ddiskqos-bench=42"));
        assert!(value(&plain, "--blkio-weight").is_none(), "{plain:?}");
        assert!(!plain.iter().any(|a| a.starts_with("--cgroup-parent")), "nested: Docker's default: {plain:?}");
        assert!(!plain.iter().any(|a| a == "ddiskqos.exclude=true"), "the agent's to weight: {plain:?}");
        let reader = nested.args("ddqb-42-fg-1", false, Some(weight(1000))).unwrap();
        assert_eq!(value(&reader, "--blkio-weight"), Some("1000"));
        assert!(reader.iter().any(|a| a == "ddiskqos.exclude=true"), "kept from the agent: {reader:?}");
        let bg = shared(CgroupLayout::Flat, None).args("ddqb-42-bg-static", true, Some(weight(10))).unwrap();
        assert_eq!(value(&bg, "--blkio-weight"), Some("10"));
        assert!(bg.iter().any(|a| a == "--cgroup-parent=/"), "{bg:?}");
        // Docker would refuse a weight under 10: no container is made.
        let err = nested.args("ddqb-42-bg-static", true, Some(weight(5))).unwrap_err().to_string();
        assert!(err.contains("background's weight 5") && err.contains("--blkio-weight"), "{err}");
    }

    #[test]
    fn pinned_labels_stay_beside_static_weights_and_pools_are_kept_apart() {
        let pinned = shared(CgroupLayout::Nested, Some((1000, 10))).args("bg", true, Some(weight(10))).unwrap();
        assert!(pinned.iter().any(|a| a == "ddiskqos.weight=10"), "{pinned:?}");
        assert_eq!(value(&pinned, "--blkio-weight"), Some("10"));
        let file = Path::new("/mnt/files/exp1-1MiB.dat");
        assert_ne!(pool_key(file, None), pool_key(file, Some(weight(1000))));
        assert_eq!(pool_key(file, Some(weight(1000))), (file.to_path_buf(), Some(1000)));
    }
}
