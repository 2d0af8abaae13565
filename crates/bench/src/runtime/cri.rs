//! The CRI runtime: every reader, and the background, is a Kubernetes pod (a sandbox and one container) made
//! through a CRI v1 socket (`--cri-socket`: containerd's by default), the way a kubelet with the cgroupfs driver
//! makes them. There is no kubelet: the bench makes the kubelet's calls (`RunPodSandbox`, `CreateContainer`,
//! `StartContainer`; `StopPodSandbox`, `RemovePodSandbox`) and removes the pod-level cgroups afterwards, as the
//! kubelet would (the runtime removes only its containers' cgroups).
//!
//! **Where the pods are.** Every pod gets the kubelet's cgroup parent of a *Burstable* pod under the cgroup driver
//! the runtime uses (read from its verbose `Status`: runc's `SystemdCgroup`, which a kubelet must match):
//! `/kubepods/burstable/pod<uid>` (cgroupfs) or the slice `kubepods-burstable-pod<uid_>.slice`, whose cgroup is
//! `kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid_>.slice` (systemd): the readers (a pod that asks for some CPU or memory and sets no equal limits is Burstable, the most
//! common class) and also the background. The background is Burstable so that it competes with the readers the way
//! pods compete, through their pod cgroups as siblings, which is where the agent's weights act. As a BestEffort
//! pod it would sit under `kubepods/besteffort`: the readers' and its pod weights would then divide nothing
//! between them, because the two class cgroups (which the agent leaves at 100) would meet first. On cgroup v1
//! these pod cgroups are three levels down, never top-level groups: BFQ's preemption of the group in service
//! happens only between top-level groups (bench README, "Findings" 1), which the measurements show.
//!
//! **Pods need no image of their own.** Containers run the runtime's own sandbox image (read from its verbose
//! `Status`), with the bench's binary, the host's `/usr` (and `/lib*`, for its shared libraries and fio), the test
//! files (read-only, at `/data`) and the bench's control directory (`/ctl`) bind-mounted: the bench imports,
//! pulls and removes no image. Host network (no CNI needed), as the test harness runs pods.
//!
//! **Readers are started ahead**, as in the Docker runtime ([`Runtime::prepare`], before the background runs),
//! each blocked on its FIFO in `/ctl`: pod start-up (runc, containerd's metadata on the root disk) stays out of
//! the measurements. A read takes the next pod, calls the hooks (the agent has found the pod itself through CRI and,
//! in dDiskQoS blocks, the bench waits until the pod cgroup's weight file reads the top weight), then writes the
//! file's path into the FIFO; the reader reports its own read time in `/ctl/result-<n>`. Reader pods are removed at
//! the end of each mode, the background's when it stops.
//!
//! The bench writes no weight for the agent: the agent's daemon runs on `qos_agent::runtime::cri::backends` (see
//! `crate::agent`). The static-best variant's weights are written by hand into the pod cgroups
//! (`crate::static_best`): a reader's before it is told what to read, the static background's right after its pod
//! started.
//! Every recorded weight is a read of the pod cgroup's weight file, and every reader's pod cgroup is checked to
//! have been charged for the bytes read.
//!
//! Undo: every pod made is stopped and removed through CRI and its pod cgroups removed in every hierarchy (systemd
//! driver: the pod's slice stopped, as the kubelet does), and the `kubepods` levels that did not exist before are
//! removed (rmdir only; systemd: their slices stopped), on return, on error and on signals (the cleanup stack); pods
//! of this run left by anything else are found by their label.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use k8s_cri::v1 as cri;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use qos_agent::cgroup::{CgroupDir, CgroupRoot, CounterReader};
use qos_core::ContainerId;
use tonic::transport::Channel;

use super::{parse_report, procs, Background, BackgroundKind, PlannedRead, ReadOutcome, ReaderHooks, Runtime};
use crate::agent::container_info;
use crate::cleanup::Cleanup;
use crate::static_best::StaticWeight;

/// containerd's CRI socket (the default of `--cri-socket` and of the agent's `[cri] socket`).
pub const DEFAULT_SOCKET: &str = "/run/containerd/containerd.sock";
/// The namespace of the bench's pods.
const NAMESPACE: &str = "ddiskqos-bench";
/// The label naming the bench process that made a pod.
const LABEL: &str = "ddiskqos-bench";
/// The cgroup hierarchies' mount point (runc makes a pod's cgroup in every v1 hierarchy).
const CGROUP_MOUNTS: &str = "/sys/fs/cgroup";
/// The kubelet's cgroup driver, as the runtime's runc is configured (`SystemdCgroup`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Driver {
    /// Pod cgroups are plain directories, `/kubepods/burstable/pod<uid>`.
    Cgroupfs,
    /// Pod cgroups are systemd slices, containers scopes (`cri-containerd-<id>.scope`).
    Systemd,
}

impl Driver {
    /// The Burstable pod's cgroup parent as the kubelet passes it in `RunPodSandbox`.
    fn pod_parent(self, uid: &str) -> String {
        match self {
            Self::Cgroupfs => format!("/{}", self.pod_rel(uid)),
            Self::Systemd => format!("kubepods-burstable-pod{}.slice", uid.replace('-', "_")),
        }
    }

    /// The Burstable pod's cgroup, relative to a hierarchy's root.
    fn pod_rel(self, uid: &str) -> String {
        match self {
            Self::Cgroupfs => format!("kubepods/burstable/pod{uid}"),
            Self::Systemd => format!("kubepods.slice/kubepods-burstable.slice/{}", self.pod_parent(uid)),
        }
    }

    /// A container's cgroup below its pod's.
    fn container_rel(self, pod_rel: &str, id: &str) -> String {
        match self {
            Self::Cgroupfs => format!("{pod_rel}/{id}"),
            Self::Systemd => format!("{pod_rel}/cri-containerd-{id}.scope"),
        }
    }

    /// The kubelet's QoS-class levels that pod start-up may create, top first.
    fn levels(self) -> [&'static str; 2] {
        match self {
            Self::Cgroupfs => ["kubepods", "kubepods/burstable"],
            Self::Systemd => ["kubepods.slice", "kubepods.slice/kubepods-burstable.slice"],
        }
    }

    /// For the report.
    fn describe(self) -> &'static str {
        match self {
            Self::Cgroupfs => "kubepods/burstable/pod<uid> (kubelet, cgroupfs driver)",
            Self::Systemd => {
                "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid>.slice (kubelet, systemd driver)"
            }
        }
    }
}

/// Stops a systemd unit the pods' driver made (a pod's slice, a kubepods level); one already gone is no error.
fn stop_unit(unit: &str) -> Result<()> {
    let out = std::process::Command::new("systemctl")
        .args(["stop", unit])
        .output()
        .with_context(|| format!("cannot run systemctl stop {unit}"))?;
    let text = String::from_utf8_lossy(&out.stderr);
    if out.status.success() || text.contains("not loaded") {
        Ok(())
    } else {
        bail!("systemctl stop {unit}: {}", text.trim())
    }
}
/// Deadline of one CRI call: pod start-up runs runc and writes containerd's metadata to a busy disk.
const CALL_TIMEOUT: Duration = Duration::from_secs(60);

/// How long a pod's removal is tried again while the runtime says a container is still running (see
/// `remove_sandbox`).
const REMOVE_PATIENCE: Duration = Duration::from_secs(30);

/// A blocking client of the CRI `RuntimeService` (the calls a kubelet makes for the bench's pods).
#[derive(Debug)]
struct PodClient {
    rt: tokio::runtime::Runtime,
    svc: RuntimeServiceClient<Channel>,
    socket: PathBuf,
}

impl PodClient {
    /// A client of the runtime on `socket`; fails if it does not answer `Version`. Returns the client and the
    /// runtime's name and version.
    fn connect(socket: &Path) -> Result<(Self, String)> {
        // A runtime of its own (one worker): every bench thread may call at once, and the cleanup stack's signal
        // thread too while another call is in flight.
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("cri-client")
            .enable_all()
            .build()
            .context("cannot start the CRI client's runtime")?;
        // Inside the runtime: the lazy channel's connection task runs on it.
        let channel = rt.block_on(async {
            qos_agent::runtime::cri::unix_channel(socket, Duration::from_secs(5), Some(CALL_TIMEOUT))
        });
        let this = Self { rt, svc: RuntimeServiceClient::new(channel), socket: socket.to_path_buf() };
        let v =
            this.call("Version", |mut s| async move { s.version(cri::VersionRequest { version: "v1".into() }).await })?;
        Ok((this, format!("{} {}", v.runtime_name, v.runtime_version)))
    }

    /// One call; an error names the call and the socket.
    fn call<T, F, Fut>(&self, what: &str, f: F) -> Result<T>
    where
        F: FnOnce(RuntimeServiceClient<Channel>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        self.rt
            .block_on(f(self.svc.clone()))
            .map(tonic::Response::into_inner)
            .map_err(|s| anyhow::anyhow!("CRI {what} on {}: {:?}: {}", self.socket.display(), s.code(), s.message()))
    }

    /// The runtime's configuration as its verbose `Status` reports it (`info.config`, JSON).
    fn status_config(&self) -> Result<serde_json::Value> {
        let status =
            self.call("Status", |mut s| async move { s.status(cri::StatusRequest { verbose: true }).await })?;
        let config = status.info.get("config").map(String::as_str).unwrap_or("{}");
        serde_json::from_str(config)
            .with_context(|| format!("CRI Status on {}: info.config is not JSON", self.socket.display()))
    }

    /// The image the runtime runs pod sandboxes with (containerd: verbose `Status`, `config.sandboxImage`).
    fn sandbox_image(&self) -> Result<String> {
        let json = self.status_config()?;
        match json.get("sandboxImage").and_then(|v| v.as_str()) {
            Some(image) if !image.is_empty() => Ok(image.to_string()),
            _ => bail!(
                "the CRI runtime on {} does not name its sandbox image (verbose Status: info.config.sandboxImage), \
                 which the bench runs its pods' containers with",
                self.socket.display()
            ),
        }
    }

    /// The cgroup driver the runtime's runc uses (verbose `Status`: `info.config`'s default runtime's
    /// `options.SystemdCgroup`), which a kubelet must match; cgroupfs when it says nothing.
    fn driver(&self) -> Result<Driver> {
        let json = self.status_config()?;
        let runtimes = &json["containerd"]["runtimes"];
        let default = json["containerd"]["defaultRuntimeName"].as_str().unwrap_or("runc");
        let systemd = runtimes[default]["options"]["SystemdCgroup"].as_bool().unwrap_or(false)
            || json["systemdCgroup"].as_bool().unwrap_or(false);
        Ok(if systemd { Driver::Systemd } else { Driver::Cgroupfs })
    }

    /// Stops and removes a pod sandbox (its containers too); a sandbox already gone is no error. A removal the
    /// runtime refuses because a container "is still running" right after the stop answered (containerd 1.7 with
    /// runc's systemd driver, under emulation: the container's exit is recorded after StopPodSandbox returns) is
    /// tried again, stop and removal, as a kubelet does, for up to [`REMOVE_PATIENCE`].
    fn remove_sandbox(&self, id: &str) -> Result<()> {
        let gone = |e: &anyhow::Error| e.to_string().contains("NotFound");
        let started = std::time::Instant::now();
        loop {
            let stop = self.call("StopPodSandbox", |mut s| async move {
                s.stop_pod_sandbox(cri::StopPodSandboxRequest { pod_sandbox_id: id.into() }).await
            });
            match stop {
                Err(e) if !gone(&e) => return Err(e),
                _ => {}
            }
            let removed = self.call("RemovePodSandbox", |mut s| async move {
                s.remove_pod_sandbox(cri::RemovePodSandboxRequest { pod_sandbox_id: id.into() }).await
            });
            match removed {
                Err(e) if e.to_string().contains("still running") && started.elapsed() < REMOVE_PATIENCE => {
                    std::thread::sleep(Duration::from_millis(200));
                }
                Err(e) if !gone(&e) => return Err(e),
                _ => return Ok(()),
            }
        }
    }

    /// The sandboxes labelled as made by the bench process `pid`: (sandbox id, pod uid).
    fn sandboxes_of(&self, pid: u32) -> Result<Vec<(String, String)>> {
        let filter = cri::PodSandboxFilter {
            label_selector: HashMap::from([(LABEL.to_string(), pid.to_string())]),
            ..Default::default()
        };
        let list = self.call("ListPodSandbox", |mut s| async move {
            s.list_pod_sandbox(cri::ListPodSandboxRequest { filter: Some(filter) }).await
        })?;
        Ok(list.items.into_iter().map(|sb| (sb.id, sb.metadata.map(|m| m.uid).unwrap_or_default())).collect())
    }
}

/// A pod the bench made, as far as its removal needs to know.
#[derive(Debug, Clone, PartialEq, Eq)]
struct PodRef {
    sandbox: String,
    uid: String,
}

/// The cgroup-v1 hierarchies (and the hybrid layout's cgroup2 tree): real directories, not the `cpu` →
/// `cpu,cpuacct` links; on cgroup v2 (the mount point is itself a cgroup2 root) the one unified hierarchy.
fn hierarchies() -> Vec<PathBuf> {
    if Path::new(CGROUP_MOUNTS).join("cgroup.controllers").exists() {
        return vec![PathBuf::from(CGROUP_MOUNTS)];
    }
    let Ok(rd) = std::fs::read_dir(CGROUP_MOUNTS) else { return Vec::new() };
    rd.flatten().filter(|e| e.file_type().is_ok_and(|t| t.is_dir())).map(|e| e.path()).collect()
}

/// Removes an empty cgroup tree, deepest first (rmdir only: a cgroup with processes left is an error naming it).
fn remove_empty_tree(dir: &Path) -> Result<()> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Ok(()) };
    for e in entries.flatten() {
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            remove_empty_tree(&e.path())?;
        }
    }
    // The runtime's last container exit may still be settling (a killed reader finishing its in-flight direct I/O
    // under a busy BFQ queue): retry for ten seconds.
    let mut attempts = 0;
    loop {
        match std::fs::remove_dir(dir) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) if attempts == 500 => {
                let pids = procs::pids(dir);
                return Err(e)
                    .with_context(|| format!("cannot remove pod cgroup {} (processes: {pids:?})", dir.display()));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
        attempts += 1;
    }
}

/// What the runtime made and has not removed yet, shared with the cleanup stack.
#[derive(Debug)]
struct Pods {
    client: PodClient,
    driver: Driver,
    live: Mutex<Vec<PodRef>>,
    /// The kubepods levels that existed before the first pod (never removed).
    levels_before: Vec<PathBuf>,
    /// Removals of single pods share it; the teardown of everything ([`Pods::remove_all`], run by the cleanup
    /// stack, maybe on the signal thread while a failing run removes its pods on the main thread) holds it alone,
    /// so the two never race for the same pod and the kubepods levels go last.
    teardown: std::sync::RwLock<()>,
}

impl Pods {
    /// Stops and removes `pod` through CRI, then its pod cgroup in every hierarchy.
    fn remove(&self, pod: &PodRef) -> Result<()> {
        let _shared = self.teardown.read().unwrap_or_else(|p| p.into_inner());
        self.remove_unguarded(pod)
    }

    fn remove_unguarded(&self, pod: &PodRef) -> Result<()> {
        self.client.remove_sandbox(&pod.sandbox)?;
        self.live.lock().unwrap_or_else(|p| p.into_inner()).retain(|p| p != pod);
        if self.driver == Driver::Systemd {
            // The pod's slice is systemd's unit: the kubelet stops it, which removes its cgroup.
            stop_unit(&self.driver.pod_parent(&pod.uid))?;
        }
        for h in hierarchies() {
            remove_empty_tree(&h.join(self.driver.pod_rel(&pod.uid)))?;
        }
        Ok(())
    }

    /// Removes several pods, four at a time (each removal stops runc containers: a few hundred ms). A pod that
    /// cannot be removed does not stop the others; the first error is returned at the end.
    fn remove_many(&self, pods: Vec<PodRef>) -> Result<()> {
        let _shared = self.teardown.read().unwrap_or_else(|p| p.into_inner());
        self.remove_many_unguarded(pods)
    }

    fn remove_many_unguarded(&self, pods: Vec<PodRef>) -> Result<()> {
        let queue = Mutex::new(pods);
        let next = || queue.lock().unwrap_or_else(|p| p.into_inner()).pop();
        let errors: Mutex<Vec<anyhow::Error>> = Mutex::new(Vec::new());
        std::thread::scope(|scope| {
            for _ in 0..4 {
                scope.spawn(|| {
                    while let Some(pod) = next() {
                        if let Err(e) = self.remove_unguarded(&pod) {
                            errors.lock().unwrap_or_else(|p| p.into_inner()).push(e);
                        }
                    }
                });
            }
        });
        match errors.into_inner().unwrap_or_else(|p| p.into_inner()).into_iter().next() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Everything: the pods made (and any other pod labelled with this process), then the kubepods levels the
    /// pods created.
    fn remove_all(&self) -> Result<()> {
        let _alone = self.teardown.write().unwrap_or_else(|p| p.into_inner());
        let mut pods = self.live.lock().unwrap_or_else(|p| p.into_inner()).clone();
        // Pods labelled as this process's that the list misses (a start cut short); a failed listing does not stop
        // the removal of the known ones.
        let listed = self.client.sandboxes_of(std::process::id());
        for (sandbox, uid) in listed.as_ref().cloned().unwrap_or_default() {
            let pod = PodRef { sandbox, uid };
            if !pods.contains(&pod) {
                pods.push(pod);
            }
        }
        let removed = self.remove_many_unguarded(pods);
        for h in hierarchies() {
            for rel in self.driver.levels().iter().rev() {
                let level = h.join(rel);
                if level.is_dir() && !self.levels_before.contains(&level) {
                    match self.driver {
                        // Its slice (the last path element): stopped only if it holds no pod by now.
                        Driver::Systemd => {
                            let empty = std::fs::read_dir(&level)
                                .map(|d| d.flatten().all(|e| !e.file_type().is_ok_and(|t| t.is_dir())))
                                .unwrap_or(false);
                            if empty {
                                let unit = rel.rsplit('/').next().unwrap_or(rel);
                                let _ = stop_unit(unit);
                            }
                        }
                        // rmdir only: a level holding someone else's pod by now stays.
                        Driver::Cgroupfs => {
                            let _ = std::fs::remove_dir(&level);
                        }
                    }
                }
            }
        }
        removed.and(listed.map(|_| ()))
    }
}

/// Readers and the background as pods through CRI.
#[derive(Debug)]
pub struct CriRuntime {
    pods: Arc<Pods>,
    /// The runtime's sandbox image, which the containers run too.
    image: String,
    /// What answered, for the report.
    runtime: String,
    exe: PathBuf,
    files_dir: PathBuf,
    ctl_dir: PathBuf,
    log_dir: PathBuf,
    /// Host directories bind-mounted read-only at the same path: shared libraries and fio.
    lib_mounts: Vec<(PathBuf, String)>,
    root: Arc<CgroupRoot>,
    next: AtomicU64,
    /// Makes pod uids unique across runs.
    epoch: u64,
    pool: Mutex<VecDeque<Pooled>>,
    /// The background pods (the static-best variant's beside the first).
    bg: Mutex<Vec<Pooled>>,
}

/// A started pod: its reader (or the background) blocked or running.
#[derive(Debug, Clone)]
struct Pooled {
    pod: PodRef,
    container: String,
    /// The pod cgroup: the agent's unit, its weight and (recursively) its counters.
    pod_dir: CgroupDir,
    /// The container's own cgroup: its processes.
    ctr_dir: CgroupDir,
    go: PathBuf,
    result: PathBuf,
    log: PathBuf,
}

impl CriRuntime {
    /// Connects to the CRI runtime on `socket` and registers the removal of everything it will make.
    pub fn new(
        socket: &Path,
        exe: &Path,
        files_dir: &Path,
        work: &Path,
        root: Arc<CgroupRoot>,
        cleanup: &'static Cleanup,
    ) -> Result<Self> {
        let (client, runtime) = PodClient::connect(socket).with_context(|| {
            format!(
                "no CRI runtime answers on {} (start containerd with its CRI plugin, or see --cri-socket)",
                socket.display()
            )
        })?;
        let image = client.sandbox_image()?;
        let driver = client.driver()?;
        let levels_before =
            hierarchies().iter().flat_map(|h| driver.levels().map(move |l| h.join(l))).filter(|p| p.is_dir()).collect();
        let pods = Arc::new(Pods {
            client,
            driver,
            live: Mutex::new(Vec::new()),
            levels_before,
            teardown: Default::default(),
        });
        let p = pods.clone();
        cleanup.push(format!("stop and remove the bench's pods on {}", socket.display()), move || p.remove_all());
        let ctl_dir = work.join("ctl");
        let log_dir = work.join("pod-logs");
        for d in [&ctl_dir, &log_dir] {
            std::fs::create_dir_all(d).with_context(|| format!("cannot create {}", d.display()))?;
        }
        // The binary and fio need the host's shared libraries: /usr, and /lib and /lib64 as what they are (on a
        // merged-/usr host, links into /usr: the image cannot have those links, so their targets are mounted).
        let mut lib_mounts = vec![(PathBuf::from("/usr"), "/usr".to_string())];
        for dir in ["/lib", "/lib64"] {
            if let Ok(real) = std::fs::canonicalize(dir) {
                lib_mounts.push((real, dir.to_string()));
            }
        }
        let epoch =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
        Ok(Self {
            pods,
            image,
            runtime,
            exe: exe.to_path_buf(),
            files_dir: files_dir.to_path_buf(),
            ctl_dir,
            log_dir,
            lib_mounts,
            root,
            next: AtomicU64::new(0),
            epoch,
            pool: Mutex::new(VecDeque::new()),
            bg: Mutex::new(Vec::new()),
        })
    }

    /// The runtime that answered and the image its pods run, for the report.
    pub fn describe(&self) -> String {
        format!("{} on {}, containers of image {}", self.runtime, self.pods.client.socket.display(), self.image)
    }

    /// The path of a file on the test file system as containers see it.
    fn in_container(&self, file: &Path) -> Result<String> {
        let rel = file
            .strip_prefix(&self.files_dir)
            .with_context(|| format!("{} is not under {}", file.display(), self.files_dir.display()))?;
        Ok(format!("/data/{}", rel.display()))
    }

    /// Runs pod number `n` as the kubelet would (Burstable, host network) whose container runs `command`; waits until its
    /// container's cgroup exists.
    fn run_pod(&self, n: u64, role: &str, command: Vec<String>) -> Result<Pooled> {
        let pid = std::process::id();
        // A UUID's shape (lowercase hex and '-'), as the agent's naming check expects of a pod uid.
        let uid = format!("{pid:08x}-dd15-b3c0-{:04x}-{:012x}", n & 0xffff, self.epoch & 0xffff_ffff_ffff);
        let name = format!("ddqb-{pid}-{role}-{n}");
        let log_dir = self.log_dir.join(&uid);
        std::fs::create_dir_all(&log_dir).with_context(|| format!("cannot create {}", log_dir.display()))?;
        let namespaces = cri::NamespaceOption {
            network: cri::NamespaceMode::Node as i32,
            pid: cri::NamespaceMode::Container as i32,
            ipc: cri::NamespaceMode::Pod as i32,
            ..Default::default()
        };
        let sandbox_config = cri::PodSandboxConfig {
            metadata: Some(cri::PodSandboxMetadata {
                name: name.clone(),
                uid: uid.clone(),
                namespace: NAMESPACE.into(),
                attempt: 0,
            }),
            log_directory: log_dir.to_string_lossy().into_owned(),
            labels: HashMap::from([(LABEL.to_string(), pid.to_string())]),
            linux: Some(cri::LinuxPodSandboxConfig {
                cgroup_parent: self.pods.driver.pod_parent(&uid),
                security_context: Some(cri::LinuxSandboxSecurityContext {
                    namespace_options: Some(namespaces.clone()),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let client = &self.pods.client;
        let config = sandbox_config.clone();
        let sandbox = client
            .call("RunPodSandbox", |mut s| async move {
                s.run_pod_sandbox(cri::RunPodSandboxRequest { config: Some(config), runtime_handler: String::new() })
                    .await
            })?
            .pod_sandbox_id;
        let pod = PodRef { sandbox: sandbox.clone(), uid: uid.clone() };
        self.pods.live.lock().unwrap_or_else(|p| p.into_inner()).push(pod.clone());
        let mount = |host: &Path, inside: &str, readonly: bool| cri::Mount {
            container_path: inside.into(),
            host_path: host.to_string_lossy().into_owned(),
            readonly,
            ..Default::default()
        };
        let mut mounts = vec![
            mount(&self.exe, "/bench/ddiskqos-bench", true),
            mount(&self.files_dir, "/data", true),
            mount(&self.ctl_dir, "/ctl", false),
        ];
        mounts.extend(self.lib_mounts.iter().map(|(host, inside)| mount(host, inside, true)));
        let config = cri::ContainerConfig {
            metadata: Some(cri::ContainerMetadata { name: role.into(), attempt: 0 }),
            image: Some(cri::ImageSpec { image: self.image.clone(), ..Default::default() }),
            command,
            mounts,
            log_path: format!("{role}.log"),
            linux: Some(cri::LinuxContainerConfig {
                security_context: Some(cri::LinuxContainerSecurityContext {
                    namespace_options: Some(namespaces),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let sb = sandbox.clone();
        let container = client
            .call("CreateContainer", |mut s| async move {
                s.create_container(cri::CreateContainerRequest {
                    pod_sandbox_id: sb,
                    config: Some(config),
                    sandbox_config: Some(sandbox_config),
                })
                .await
            })?
            .container_id;
        let id = container.clone();
        client.call("StartContainer", |mut s| async move {
            s.start_container(cri::StartContainerRequest { container_id: id }).await
        })?;
        let rel = self.pods.driver.pod_rel(&uid);
        let pod_dir = self.root.resolve_relative(&rel).with_context(|| format!("pod {name}: no pod cgroup {rel}"))?;
        let ctr_rel = self.pods.driver.container_rel(&rel, &container);
        let ctr_dir = self
            .root
            .resolve_relative(&ctr_rel)
            .with_context(|| format!("pod {name}: no container cgroup {ctr_rel} after StartContainer"))?;
        let go = self.ctl_dir.join(format!("go-{n}"));
        let result = self.ctl_dir.join(format!("result-{n}"));
        Ok(Pooled { pod, container, pod_dir, ctr_dir, go, result, log: log_dir.join(format!("{role}.log")) })
    }

    /// Starts one reader pod that waits (blocked, no CPU) for a file path on its FIFO.
    fn start_pooled(&self) -> Result<Pooled> {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let go = self.ctl_dir.join(format!("go-{n}"));
        let _ = std::fs::remove_file(&go);
        nix::unistd::mkfifo(&go, nix::sys::stat::Mode::from_bits_truncate(0o600))
            .with_context(|| format!("cannot create FIFO {}", go.display()))?;
        let command = ["/bench/ddiskqos-bench", "read-file", "--go-fifo", &format!("/ctl/go-{n}"), "--result"]
            .iter()
            .map(|s| s.to_string())
            .chain([format!("/ctl/result-{n}")])
            .collect();
        self.run_pod(n, "fg", command)
    }

    /// The last lines of a pod container's log (CRI log format), for an error.
    fn log_tail(p: &Pooled) -> String {
        let text = std::fs::read_to_string(&p.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }
}

impl Runtime for CriRuntime {
    fn name(&self) -> &'static str {
        "cri"
    }

    /// The kubelet's layout under the runtime's cgroup driver.
    fn cgroup_layout(&self) -> Option<&'static str> {
        Some(self.pods.driver.describe())
    }

    fn start_background(
        &self,
        file: &Path,
        kind: BackgroundKind,
        weight: Option<StaticWeight>,
        hooks: &dyn ReaderHooks,
    ) -> Result<Background> {
        let file_c = self.in_container(file)?;
        let command = kind.container_command(&file_c);
        let role = if weight.is_some() { "bg-static" } else { "bg" };
        let p = self.run_pod(self.next.fetch_add(1, Ordering::Relaxed), role, command.clone())?;
        self.bg.lock().unwrap_or_else(|e| e.into_inner()).push(p.clone());
        if let Some(w) = weight {
            // The pod cgroup's weight, as the kubelet's level is set by hand: right after the pod started (its
            // container may have read for a few milliseconds at the default; the bench freezes it before measuring).
            w.write(&p.pod_dir)?;
        }
        hooks.created(&container_info(&p.pod.uid, p.pod_dir.clone()), Instant::now())?;
        // Its processes and bytes are its container's cgroup's; its weight is its pod's (`background_weight_dir`).
        let bg = Background { id: p.pod.uid.clone(), cgroup: p.ctr_dir.clone(), command: command.join(" ") };
        bg.wait_reading(|| Self::log_tail(&p))?;
        Ok(bg)
    }

    fn background_weight_dir(&self, bg: &Background) -> CgroupDir {
        match self.bg.lock().unwrap_or_else(|e| e.into_inner()).iter().find(|p| p.pod.uid == bg.id) {
            Some(p) => p.pod_dir.clone(),
            None => bg.cgroup.clone(),
        }
    }

    fn stop_background(&self, bg: &Background) -> Result<()> {
        bg.thaw();
        let p = {
            let mut bgs = self.bg.lock().unwrap_or_else(|e| e.into_inner());
            bgs.iter().position(|p| p.pod.uid == bg.id).map(|i| bgs.remove(i))
        };
        match p {
            Some(p) => self.pods.remove(&p.pod),
            None => Ok(()),
        }
    }

    fn prepare(&self, reads: &[PlannedRead]) -> Result<()> {
        // Reader pods are alike: a static weight is written into the pod cgroup when the read is due.
        let readers = reads.len();
        // Every reader pod of the mode now, before the background runs (see the module doc).
        let started = super::start_all(readers, "pod", || self.start_pooled())?;
        self.pool.lock().unwrap_or_else(|e| e.into_inner()).extend(started);
        Ok(())
    }

    fn end_mode(&self) -> Result<()> {
        // Finished readers' pods were kept so that no pod removal (root-disk I/O) overlapped a measurement.
        self.pool.lock().unwrap_or_else(|e| e.into_inner()).clear();
        let bgs: Vec<PodRef> =
            self.bg.lock().unwrap_or_else(|e| e.into_inner()).iter().map(|p| p.pod.clone()).collect();
        let readers: Vec<PodRef> = self
            .pods
            .live
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|p| !bgs.contains(p))
            .cloned()
            .collect();
        self.pods.remove_many(readers)
    }

    fn run_reader(&self, file: &Path, weight: Option<StaticWeight>, hooks: &dyn ReaderHooks) -> Result<ReadOutcome> {
        let pooled = self.pool.lock().unwrap_or_else(|e| e.into_inner()).pop_front();
        let p = match pooled {
            Some(p) => p,
            None => self.start_pooled()?,
        };
        let t0 = Instant::now();
        let cid = ContainerId::new(&p.pod.uid);
        let result = (|| -> Result<ReadOutcome> {
            if let Some(w) = weight {
                // The pod cgroup's weight by hand, before the reader is told what to read.
                w.write(&p.pod_dir)?;
            }
            let weight = hooks.created(&container_info(&p.pod.uid, p.pod_dir.clone()), t0)?;
            // Opening the FIFO for writing completes once the reader has it open for reading (it does at start).
            let mut go = std::fs::OpenOptions::new()
                .write(true)
                .open(&p.go)
                .with_context(|| format!("cannot open {}", p.go.display()))?;
            use std::io::Write;
            writeln!(go, "{}", self.in_container(file)?).with_context(|| format!("cannot write {}", p.go.display()))?;
            drop(go);
            let deadline = Duration::from_secs(600);
            let mut last_check = Instant::now();
            while !p.result.exists() {
                if t0.elapsed() > deadline {
                    bail!("reader pod {} gave no result within {deadline:?}", p.pod.uid);
                }
                if last_check.elapsed() > Duration::from_millis(50) {
                    last_check = Instant::now();
                    if procs::pids(p.ctr_dir.path()).is_empty() {
                        // Exited without a result (or about to write it): its log says why.
                        std::thread::sleep(Duration::from_millis(100));
                        if !p.result.exists() {
                            bail!(
                                "reader pod {} (container {}) exited without a result: {}",
                                p.pod.uid,
                                p.container,
                                Self::log_tail(&p)
                            );
                        }
                    }
                }
                std::thread::sleep(Duration::from_micros(500));
            }
            let wall = t0.elapsed();
            let text =
                std::fs::read_to_string(&p.result).with_context(|| format!("cannot read {}", p.result.display()))?;
            let report = parse_report(&text)?;
            // The pod cgroup's recursive counter: what the kernel charged the pod (its reader) for.
            let charged = CounterReader::open(&p.pod_dir)
                .and_then(|mut r| r.read())
                .with_context(|| format!("pod cgroup {}: counters", p.pod_dir.path().display()))?
                .read;
            Ok(ReadOutcome { id: p.pod.uid.clone(), report, wall, charged_bytes: Some(charged), weight })
        })();
        hooks.finished(&cid);
        let _ = std::fs::remove_file(&p.go);
        let _ = std::fs::remove_file(&p.result);
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use qos_agent::runtime::cri::naming::{pod_cgroup_path, QosClass};

    #[test]
    fn pod_cgroups_are_where_the_kubelet_puts_burstable_pods() {
        let uid = "0001e240-dd15-b3c0-0007-00000000abcd";
        // The agent's own check of a runtime-reported parent accepts it, as a Burstable pod of either driver.
        for driver in [Driver::Cgroupfs, Driver::Systemd] {
            let parent = driver.pod_parent(uid);
            let path = pod_cgroup_path(&parent, uid).unwrap();
            assert_eq!(path.qos, QosClass::Burstable, "{driver:?}");
            assert_eq!(path.rel, driver.pod_rel(uid), "{driver:?}");
        }
        assert_eq!(
            Driver::Systemd.pod_rel(uid),
            "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod0001e240_dd15_b3c0_0007_00000000abcd.slice"
        );
        assert_eq!(Driver::Systemd.container_rel("p", "abc"), "p/cri-containerd-abc.scope");
    }

    #[test]
    fn an_empty_tree_is_removed_deepest_first() {
        let tmp = tempfile::tempdir().unwrap();
        let pod = tmp.path().join("pod");
        std::fs::create_dir_all(pod.join("sandbox")).unwrap();
        std::fs::create_dir_all(pod.join("container")).unwrap();
        remove_empty_tree(&pod).unwrap();
        assert!(!pod.exists());
        remove_empty_tree(&pod).unwrap();
    }
}
