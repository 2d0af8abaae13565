//! A private containerd serving CRI v1, and pods made through CRI the way a kubelet (cgroupfs driver) would.
//!
//! [`Containerd::start`] runs Debian's `containerd` with its own config, root, state and sockets in a temp dir
//! (never `/run/containerd/containerd.sock`, which Docker's containerd uses): the CRI plugin with the cgroupfs
//! driver, `restrict_oom_score_adj = true` (root here lacks CAP_SYS_RESOURCE), and as `sandbox_image` a local
//! busybox image that only sleeps ([`PAUSE_IMAGE`], built with the host's Docker and imported with
//! `ctr -n k8s.io images import`). Pods run with host network, so no CNI is needed. There is no kubelet: the test
//! is the kubelet, making the calls it would make ([`Cri`]).
//!
//! On drop: every pod sandbox is stopped and removed through CRI, containerd is stopped, the pod cgroups runc made
//! in every cgroup hierarchy are removed (the kubelet would do that; containerd does not), and so are the
//! `kubepods` levels the test created (never ones that existed before), then the temp dir.

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use k8s_cri::v1 as cri;
use k8s_cri::v1::image_service_client::ImageServiceClient;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use tonic::transport::Channel;

use crate::docker::DOCKER_CLI;
use crate::process::wait_for;

/// The sandbox ("pause") image: busybox-static whose command only sleeps; the test containers use it too, with
/// their own command.
pub const PAUSE_IMAGE: &str = "ddiskqos-pause:latest";
/// The cgroup hierarchies' mount point.
const CGROUP_MOUNTS: &str = "/sys/fs/cgroup";
/// The namespace of the test pods.
pub const NAMESPACE: &str = "ddiskqos-test";
/// What pods through this containerd need on cgroup v1 (a test adds its own): root, blkio, a BFQ loop device,
/// the host's Docker (it builds [`PAUSE_IMAGE`] once), containerd with `ctr` and runc.
pub const NEEDS_V1: [crate::Need; 8] = [
    crate::Need::Root,
    crate::Need::BlkioV1,
    crate::Need::LoopDevices,
    crate::Need::Bfq,
    crate::Need::HostDocker,
    crate::Need::Program("containerd"),
    crate::Need::Program("ctr"),
    crate::Need::Program("runc"),
];

/// A Kubernetes QoS class, deciding the pod's cgroup parent as the kubelet (cgroupfs driver) names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Qos {
    /// `/kubepods/pod<uid>`.
    Guaranteed,
    /// `/kubepods/burstable/pod<uid>`.
    Burstable,
    /// `/kubepods/besteffort/pod<uid>`.
    BestEffort,
}

impl Qos {
    /// The pod's cgroup relative to the cgroup root under `driver`'s naming.
    pub fn pod_rel_for(self, uid: &str, driver: Driver) -> String {
        match driver {
            Driver::Cgroupfs => self.pod_rel(uid),
            Driver::Systemd => {
                let slice = self.pod_slice(uid);
                match self {
                    Self::Guaranteed => format!("kubepods.slice/{slice}"),
                    Self::Burstable => format!("kubepods.slice/kubepods-burstable.slice/{slice}"),
                    Self::BestEffort => format!("kubepods.slice/kubepods-besteffort.slice/{slice}"),
                }
            }
        }
    }

    /// The pod's slice as the kubelet's systemd driver names it (`kubepods-burstable-pod<uid_>.slice`: dashes of
    /// the uid become underscores, as unit names need).
    pub fn pod_slice(self, uid: &str) -> String {
        let uid = uid.replace('-', "_");
        match self {
            Self::Guaranteed => format!("kubepods-pod{uid}.slice"),
            Self::Burstable => format!("kubepods-burstable-pod{uid}.slice"),
            Self::BestEffort => format!("kubepods-besteffort-pod{uid}.slice"),
        }
    }

    /// The pod's cgroup relative to a hierarchy's root (`kubepods/burstable/pod<uid>`).
    pub fn pod_rel(self, uid: &str) -> String {
        match self {
            Self::Guaranteed => format!("kubepods/pod{uid}"),
            Self::Burstable => format!("kubepods/burstable/pod{uid}"),
            Self::BestEffort => format!("kubepods/besteffort/pod{uid}"),
        }
    }
}

/// The kubelet's cgroup driver the tests' containerd (runc's `SystemdCgroup`) and pods use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Driver {
    /// Pod cgroups as plain paths (`/kubepods/burstable/pod<uid>`), made by runc.
    Cgroupfs,
    /// Pod cgroups as slices (`kubepods-burstable-pod<uid_>.slice`) and containers as scopes, made by systemd
    /// at runc's request: needs systemd as PID 1 (the systemd guest).
    Systemd,
}

/// The cgroup-v1 hierarchies (real mount points, not the `cpu` → `cpu,cpuacct` symlinks); on cgroup v2 (the mount
/// point is itself a cgroup2 root, as inside `scripts/cgroup-v2.sh`) the one unified hierarchy.
fn hierarchies() -> Vec<PathBuf> {
    if Path::new(CGROUP_MOUNTS).join("cgroup.controllers").exists() {
        return vec![PathBuf::from(CGROUP_MOUNTS)];
    }
    let Ok(rd) = fs::read_dir(CGROUP_MOUNTS) else { return Vec::new() };
    rd.flatten().filter(|e| e.file_type().is_ok_and(|t| t.is_dir())).map(|e| e.path()).collect()
}

/// The levels above pod cgroups below a kubelet cgroup root (`""` for `/`, `"kubelet"` for `/kubelet`), deepest
/// first: `kubelet/kubepods/burstable`, ..., `kubelet`.
fn levels(cgroup_root: &str) -> Vec<String> {
    let prefix = if cgroup_root.is_empty() { String::new() } else { format!("{cgroup_root}/") };
    let mut out: Vec<String> =
        ["kubepods/burstable", "kubepods/besteffort", "kubepods"].iter().map(|l| format!("{prefix}{l}")).collect();
    let mut root = cgroup_root.to_string();
    while !root.is_empty() {
        out.push(root.clone());
        root = root.rsplit_once('/').map(|(a, _)| a.to_string()).unwrap_or_default();
    }
    out
}

/// The kubepods levels (below `cgroup_root`) that exist in any hierarchy now (so teardown removes only the ones
/// the test made).
fn kubepods_levels_present(cgroup_root: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for h in hierarchies() {
        let mut rels = levels(cgroup_root);
        if cgroup_root.is_empty() {
            // The systemd driver's levels (only under the default root here).
            rels.extend(
                [
                    "kubepods.slice",
                    "kubepods.slice/kubepods-burstable.slice",
                    "kubepods.slice/kubepods-besteffort.slice",
                ]
                .map(String::from),
            );
        }
        for rel in rels {
            let p = h.join(rel);
            if p.is_dir() {
                out.push(p);
            }
        }
    }
    out
}

/// Who a pod is, beyond its name, uid and QoS class: its namespace and labels (what [`Containerd::run_pod`] leaves
/// at [`NAMESPACE`] and none).
#[derive(Debug, Clone, Copy)]
pub struct PodMeta<'a> {
    /// The pod's namespace.
    pub namespace: &'a str,
    /// The pod's labels (the kubelet passes them to the sandbox).
    pub labels: &'a [(&'a str, &'a str)],
}

impl Default for PodMeta<'_> {
    fn default() -> Self {
        Self { namespace: NAMESPACE, labels: &[] }
    }
}

/// Whether the pause image exists in the host's Docker (built by [`Containerd::start`] if not).
fn ensure_pause_image() {
    let ok =
        Command::new(DOCKER_CLI).args(["image", "inspect", PAUSE_IMAGE]).output().is_ok_and(|o| o.status.success());
    if ok {
        return;
    }
    let root = tempfile::tempdir().unwrap();
    fs::create_dir_all(root.path().join("bin")).unwrap();
    for d in ["tmp", "dev", "proc", "sys", "etc"] {
        fs::create_dir_all(root.path().join(d)).unwrap();
    }
    fs::copy("/bin/busybox", root.path().join("bin/busybox")).expect("busybox-static at /bin/busybox");
    for applet in ["sh", "dd", "cat", "sleep", "echo", "true", "ls"] {
        std::os::unix::fs::symlink("busybox", root.path().join("bin").join(applet)).unwrap();
    }
    let status = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "tar -C {} -c . | {DOCKER_CLI} import -c 'ENV PATH=/bin' -c 'CMD [\"/bin/sleep\", \"2000000000\"]' - {PAUSE_IMAGE}",
            root.path().display()
        ))
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success(), "building {PAUSE_IMAGE} failed");
}

/// A private containerd with the CRI plugin; everything torn down on drop (see the module doc).
#[derive(Debug)]
pub struct Containerd {
    dir: tempfile::TempDir,
    child: Option<Child>,
    kubepods_before: Vec<PathBuf>,
    /// The kubelet's `--cgroup-root` the pods are made under, without the leading `/` (`""`: `/`).
    cgroup_root: String,
    pods: Vec<(String, Qos)>,
    driver: Driver,
}

impl Containerd {
    /// Starts containerd and imports [`PAUSE_IMAGE`] (built with the host's Docker first if missing).
    pub fn start() -> Self {
        Self::start_with(Driver::Cgroupfs)
    }

    /// [`Containerd::start`] with pods made under `driver`'s naming (runc's `SystemdCgroup = true` for
    /// [`Driver::Systemd`], as a kubelet with the systemd cgroup driver needs).
    pub fn start_with(driver: Driver) -> Self {
        ensure_pause_image();
        let dir = tempfile::Builder::new().prefix("ddiskqos-containerd-").tempdir_in("/var/tmp").unwrap();
        let d = dir.path();
        for sub in ["root", "state", "cni-bin", "cni-conf", "logs"] {
            fs::create_dir_all(d.join(sub)).unwrap();
        }
        let config = format!(
            r#"version = 2
root = "{d}/root"
state = "{d}/state"
[grpc]
  address = "{d}/containerd.sock"
[ttrpc]
  address = "{d}/containerd.sock.ttrpc"
[debug]
  address = "{d}/debug.sock"
[metrics]
  address = ""
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  restrict_oom_score_adj = true
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = {systemd_cgroup}
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{d}/cni-bin"
    conf_dir = "{d}/cni-conf"
"#,
            d = d.display(),
            systemd_cgroup = driver == Driver::Systemd
        );
        fs::write(d.join("config.toml"), config).unwrap();
        let mut this = Self {
            dir,
            child: None,
            kubepods_before: kubepods_levels_present(""),
            cgroup_root: String::new(),
            pods: Vec::new(),
            driver,
        };
        this.spawn();
        this.import_image(PAUSE_IMAGE);
        this
    }

    /// Makes the pods from now on as a kubelet with `--cgroup-root=<root>` would (kind's: `/kubelet`): below
    /// `<root>/kubepods/...`. Teardown removes the levels of that root the test made.
    pub fn set_kubelet_cgroup_root(&mut self, root: &str) {
        assert!(
            self.driver == Driver::Cgroupfs && self.pods.is_empty(),
            "a cgroup root: cgroupfs driver, before any pod"
        );
        self.cgroup_root = root.trim_matches('/').to_string();
        self.kubepods_before.extend(kubepods_levels_present(&self.cgroup_root));
    }

    /// A pod's cgroup relative to a hierarchy's root, under the driver and kubelet cgroup root in use
    /// (`kubelet/kubepods/burstable/pod<uid>`).
    pub fn pod_rel(&self, qos: Qos, uid: &str) -> String {
        if self.cgroup_root.is_empty() {
            qos.pod_rel_for(uid, self.driver)
        } else {
            format!("{}/{}", self.cgroup_root, qos.pod_rel(uid))
        }
    }

    /// Imports `image` from Docker into this containerd's `k8s.io` namespace (as an operator loads an image on a
    /// node without a registry): from the dockerd at `$DOCKER_HOST` (the v2 test bed's) if it has the image, else
    /// from the host's.
    pub fn import_image(&self, image: &str) {
        let from_host = !crate::docker::image_exists(image) && crate::docker::image_exists_on_host(image);
        let status = Command::new("sh")
            .envs(from_host.then_some(("DOCKER_HOST", crate::docker::HOST_SOCKET)))
            .arg("-c")
            .arg(format!(
                "{DOCKER_CLI} save {image} | ctr --address {} -n k8s.io images import -",
                self.socket().display()
            ))
            .stdout(Stdio::null())
            .status()
            .unwrap();
        assert!(status.success(), "importing {image} into containerd failed");
    }

    /// The file a pod's container logs to (CRI log format), for a container created with `log_path:
    /// "<name>.log"` in the pod `uid` (what [`Containerd::run_pod`] and [`Containerd::run_pod_with`] do).
    pub fn container_log(&self, uid: &str, name: &str) -> PathBuf {
        self.dir.path().join("logs").join(uid).join(format!("{name}.log"))
    }

    /// containerd's CRI (and containerd API) socket.
    pub fn socket(&self) -> PathBuf {
        self.dir.path().join("containerd.sock")
    }

    /// (Re)starts the containerd process and waits until CRI answers.
    pub fn spawn(&mut self) {
        assert!(self.child.is_none(), "containerd already running");
        let log =
            fs::OpenOptions::new().create(true).append(true).open(self.dir.path().join("containerd.log")).unwrap();
        let child = Command::new("containerd")
            .arg("--config")
            .arg(self.dir.path().join("config.toml"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("containerd must be installed");
        self.child = Some(child);
        let sock = self.socket();
        let up = wait_for(Duration::from_secs(20), Duration::from_millis(100), || {
            Cri::connect(&sock).and_then(|mut c| c.version().ok()).map(|_| ())
        });
        assert!(up.is_some(), "containerd's CRI did not answer on {}; log:\n{}", sock.display(), self.log_tail());
    }

    /// Stops containerd (SIGTERM, then SIGKILL after 10 s); running pods' shims stay, as on a real node.
    pub fn stop(&mut self) {
        let Some(mut child) = self.child.take() else { return };
        let pid = nix::unistd::Pid::from_raw(child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(10) {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        let _ = child.wait();
    }

    /// A CRI client of this containerd.
    pub fn cri(&self) -> Cri {
        Cri::connect(&self.socket()).expect("containerd's CRI socket")
    }

    /// The last lines of containerd's log.
    pub fn log_tail(&self) -> String {
        let text = fs::read_to_string(self.dir.path().join("containerd.log")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    /// Runs a pod as a kubelet would: sandbox with the cgroup parent of `qos`, host network, `annotations`; then
    /// one container running `script` (busybox sh) with `devices` (host paths, read-only) visible at the same
    /// path. Returns the sandbox id. The pod's cgroup is removed on drop.
    pub fn run_pod(
        &mut self,
        name: &str,
        uid: &str,
        qos: Qos,
        annotations: &[(&str, &str)],
        script: &str,
        devices: &[&Path],
    ) -> String {
        self.run_pod_with(name, uid, qos, annotations, script_container(name, script, devices)).0
    }

    /// Runs a pod as a kubelet would (see [`Containerd::run_pod`]) with a container of the caller's making (its
    /// `log_path` should be `"<name>.log"`, see [`Containerd::container_log`]). Returns the sandbox and container
    /// ids.
    pub fn run_pod_with(
        &mut self,
        name: &str,
        uid: &str,
        qos: Qos,
        annotations: &[(&str, &str)],
        container: cri::ContainerConfig,
    ) -> (String, String) {
        self.run_pod_as(PodMeta::default(), name, uid, qos, annotations, container)
    }

    /// [`Containerd::run_pod_with`] for a pod of namespace and labels `meta`.
    pub fn run_pod_as(
        &mut self,
        meta: PodMeta<'_>,
        name: &str,
        uid: &str,
        qos: Qos,
        annotations: &[(&str, &str)],
        container: cri::ContainerConfig,
    ) -> (String, String) {
        let (sandbox, ids) = self.run_pod_containers(meta, name, uid, qos, annotations, vec![container]);
        (sandbox, ids.into_iter().next().unwrap())
    }

    /// [`Containerd::run_pod_as`] with several containers (created and started in order). Returns the sandbox
    /// and the container ids.
    pub fn run_pod_containers(
        &mut self,
        meta: PodMeta<'_>,
        name: &str,
        uid: &str,
        qos: Qos,
        annotations: &[(&str, &str)],
        containers: Vec<cri::ContainerConfig>,
    ) -> (String, Vec<String>) {
        self.pods.push((uid.to_string(), qos));
        let mut cri = self.cri();
        let parent = match self.driver {
            Driver::Cgroupfs => format!("/{}", self.pod_rel(qos, uid)),
            Driver::Systemd => qos.pod_slice(uid),
        };
        let log_dir = self.dir.path().join("logs").join(uid);
        let config = sandbox_config(meta, name, uid, &parent, annotations, &log_dir);
        let sandbox = cri
            .run_sandbox(config.clone())
            .unwrap_or_else(|e| panic!("RunPodSandbox {name}: {e}\n{}", self.log_tail()));
        let mut ids = Vec::new();
        for container in containers {
            let id = cri
                .create_container_from(&sandbox, config.clone(), container)
                .unwrap_or_else(|e| panic!("CreateContainer {name}: {e}\n{}", self.log_tail()));
            cri.start_container(&id).unwrap_or_else(|e| panic!("StartContainer {name}: {e}\n{}", self.log_tail()));
            ids.push(id);
        }
        (sandbox, ids)
    }

    /// Stops and removes every pod sandbox (and its containers) through CRI.
    pub fn remove_all_pods(&self) {
        let Some(mut cri) = Cri::connect(&self.socket()) else { return };
        for id in cri.sandbox_ids().unwrap_or_default() {
            let _ = cri.stop_sandbox(&id);
            let _ = cri.remove_sandbox(&id);
        }
    }

    /// Removes the pod cgroups of the pods run here, in every hierarchy, and the kubepods levels that did not exist
    /// before (rmdir only: a level still holding someone else's pod stays).
    fn remove_pod_cgroups(&self) {
        if self.driver == Driver::Systemd {
            // The slices are systemd's units: stopping them removes their cgroups. The levels above are the kubelet's
            // (here: made by systemd on the way); stopped only if this test made them.
            let mut units: Vec<String> = self.pods.iter().map(|(uid, qos)| qos.pod_slice(uid)).collect();
            for (level, rel) in [
                ("kubepods-burstable.slice", "kubepods.slice/kubepods-burstable.slice"),
                ("kubepods-besteffort.slice", "kubepods.slice/kubepods-besteffort.slice"),
                ("kubepods.slice", "kubepods.slice"),
            ] {
                if !self.kubepods_before.contains(&Path::new(CGROUP_MOUNTS).join(rel)) {
                    units.push(level.to_string());
                }
            }
            let _ = Command::new("systemctl").arg("stop").args(&units).status();
            return;
        }
        for h in hierarchies() {
            for (uid, qos) in &self.pods {
                crate::blkio::remove_cgroup_tree(&h.join(self.pod_rel(*qos, uid)));
            }
            let mut roots = vec![String::new()];
            roots.extend((!self.cgroup_root.is_empty()).then(|| self.cgroup_root.clone()));
            for rel in roots.iter().flat_map(|r| levels(r)) {
                let p = h.join(rel);
                if p.is_dir() && !self.kubepods_before.contains(&p) {
                    let _ = fs::remove_dir(&p);
                }
            }
        }
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        if self.child.is_none() {
            // Stopped by the test: pods can only be removed through a running containerd.
            self.spawn_quietly();
        }
        self.remove_all_pods();
        self.stop();
        self.remove_pod_cgroups();
        // Anything containerd left mounted under its root (snapshots of pods that could not be removed).
        let root = self.dir.path().to_string_lossy().into_owned();
        if let Ok(mounts) = fs::read_to_string("/proc/self/mounts") {
            let mut targets: Vec<&str> =
                mounts.lines().filter_map(|l| l.split(' ').nth(1)).filter(|t| t.starts_with(&root)).collect();
            targets.sort_by_key(|t| std::cmp::Reverse(t.len()));
            for t in targets {
                let _ = Command::new("umount").arg("-l").arg(t).status();
            }
        }
    }
}

impl Containerd {
    fn spawn_quietly(&mut self) {
        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.spawn())).is_err() {
            eprintln!("warning: containerd did not restart for teardown; pods may be left");
        }
    }
}

fn sandbox_config(
    meta: PodMeta<'_>,
    name: &str,
    uid: &str,
    cgroup_parent: &str,
    annotations: &[(&str, &str)],
    log_dir: &Path,
) -> cri::PodSandboxConfig {
    fs::create_dir_all(log_dir).unwrap();
    cri::PodSandboxConfig {
        metadata: Some(cri::PodSandboxMetadata {
            name: name.into(),
            uid: uid.into(),
            namespace: meta.namespace.into(),
            attempt: 0,
        }),
        labels: meta.labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<HashMap<_, _>>(),
        // No hostname: a host-network pod shares the node's UTS namespace, and runc refuses to set one there.
        log_directory: log_dir.to_string_lossy().into_owned(),
        annotations: annotations.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<HashMap<_, _>>(),
        linux: Some(cri::LinuxPodSandboxConfig {
            cgroup_parent: cgroup_parent.to_string(),
            security_context: Some(cri::LinuxSandboxSecurityContext {
                namespace_options: Some(host_network()),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A container running `script` (busybox sh, in [`PAUSE_IMAGE`]) with `devices` (read-only, same path inside),
/// host network, logging to `<name>.log`.
pub fn script_container(name: &str, script: &str, devices: &[&Path]) -> cri::ContainerConfig {
    cri::ContainerConfig {
        metadata: Some(cri::ContainerMetadata { name: name.into(), attempt: 0 }),
        image: Some(cri::ImageSpec { image: PAUSE_IMAGE.into(), ..Default::default() }),
        command: vec!["/bin/sh".into(), "-c".into(), script.into()],
        log_path: format!("{name}.log"),
        devices: devices
            .iter()
            .map(|d| cri::Device {
                container_path: d.to_string_lossy().into_owned(),
                host_path: d.to_string_lossy().into_owned(),
                permissions: "r".into(),
            })
            .collect(),
        linux: Some(cri::LinuxContainerConfig {
            security_context: Some(cri::LinuxContainerSecurityContext {
                namespace_options: Some(host_network()),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The namespaces of a host-network pod (what every test pod uses: no CNI here).
pub fn host_network() -> cri::NamespaceOption {
    cri::NamespaceOption {
        network: cri::NamespaceMode::Node as i32,
        pid: cri::NamespaceMode::Container as i32,
        ipc: cri::NamespaceMode::Pod as i32,
        ..Default::default()
    }
}

/// A blocking CRI v1 client (its own single-threaded tokio runtime), for tests.
#[derive(Debug)]
pub struct Cri {
    rt: tokio::runtime::Runtime,
    runtime: RuntimeServiceClient<Channel>,
    _images: ImageServiceClient<Channel>,
}

impl Cri {
    /// Connects to `socket`; `None` if nothing listens there.
    pub fn connect(socket: &Path) -> Option<Self> {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        // Connected now: `None` when nothing listens. Connecting is not bounded but by the socket (as before).
        let channel = rt
            .block_on(qos_agent::runtime::cri::unix_channel_connected(
                socket,
                Duration::from_secs(60),
                Some(Duration::from_secs(60)),
            ))
            .ok()?;
        Some(Self {
            rt,
            runtime: RuntimeServiceClient::new(channel.clone()),
            _images: ImageServiceClient::new(channel),
        })
    }

    /// `Version`.
    pub fn version(&mut self) -> Result<String, tonic::Status> {
        let r = self.rt.block_on(self.runtime.version(cri::VersionRequest { version: "v1".into() }))?;
        Ok(format!("{} {}", r.get_ref().runtime_name, r.get_ref().runtime_version))
    }

    /// `RunPodSandbox`; the sandbox id.
    pub fn run_sandbox(&mut self, config: cri::PodSandboxConfig) -> Result<String, tonic::Status> {
        let req = cri::RunPodSandboxRequest { config: Some(config), runtime_handler: String::new() };
        Ok(self.rt.block_on(self.runtime.run_pod_sandbox(req))?.into_inner().pod_sandbox_id)
    }

    /// `CreateContainer` in `sandbox` with a container config of the caller's making.
    pub fn create_container_from(
        &mut self,
        sandbox: &str,
        sandbox_config: cri::PodSandboxConfig,
        config: cri::ContainerConfig,
    ) -> Result<String, tonic::Status> {
        let req = cri::CreateContainerRequest {
            pod_sandbox_id: sandbox.into(),
            config: Some(config),
            sandbox_config: Some(sandbox_config),
        };
        Ok(self.rt.block_on(self.runtime.create_container(req))?.into_inner().container_id)
    }

    /// `ExecSync` of `cmd` in container `id` (what a kubelet's exec probe does): exit code, stdout, stderr.
    pub fn exec_sync(
        &mut self,
        id: &str,
        cmd: &[&str],
        timeout: Duration,
    ) -> Result<(i32, String, String), tonic::Status> {
        let req = cri::ExecSyncRequest {
            container_id: id.into(),
            cmd: cmd.iter().map(|c| c.to_string()).collect(),
            timeout: timeout.as_secs() as i64,
        };
        let r = self.rt.block_on(self.runtime.exec_sync(req))?.into_inner();
        Ok((
            r.exit_code,
            String::from_utf8_lossy(&r.stdout).into_owned(),
            String::from_utf8_lossy(&r.stderr).into_owned(),
        ))
    }

    /// `StopContainer` with a grace period (SIGTERM, then SIGKILL after `timeout`), as a kubelet stops a pod.
    pub fn stop_container(&mut self, id: &str, timeout: Duration) -> Result<(), tonic::Status> {
        let req = cri::StopContainerRequest { container_id: id.into(), timeout: timeout.as_secs() as i64 };
        self.rt.block_on(self.runtime.stop_container(req))?;
        Ok(())
    }

    /// The state and exit code of container `id`, and its host pid while it runs (from containerd's verbose
    /// `ContainerStatus` info).
    pub fn container_state(&mut self, id: &str) -> Result<(cri::ContainerState, i32, Option<u32>), tonic::Status> {
        let req = cri::ContainerStatusRequest { container_id: id.into(), verbose: true };
        let r = self.rt.block_on(self.runtime.container_status(req))?.into_inner();
        let status = r.status.unwrap_or_default();
        let pid = r
            .info
            .get("info")
            .and_then(|j| serde_json::from_str::<serde_json::Value>(j).ok())
            .and_then(|v| v.get("pid")?.as_u64())
            .filter(|p| *p > 0)
            .map(|p| p as u32);
        Ok((status.state(), status.exit_code, pid))
    }

    /// `StartContainer`.
    pub fn start_container(&mut self, id: &str) -> Result<(), tonic::Status> {
        self.rt.block_on(self.runtime.start_container(cri::StartContainerRequest { container_id: id.into() }))?;
        Ok(())
    }

    /// Ids of every pod sandbox, whatever its state.
    pub fn sandbox_ids(&mut self) -> Result<Vec<String>, tonic::Status> {
        let r = self.rt.block_on(self.runtime.list_pod_sandbox(cri::ListPodSandboxRequest { filter: None }))?;
        Ok(r.into_inner().items.into_iter().map(|s| s.id).collect())
    }

    /// `StopPodSandbox` (its containers too).
    pub fn stop_sandbox(&mut self, id: &str) -> Result<(), tonic::Status> {
        self.rt.block_on(self.runtime.stop_pod_sandbox(cri::StopPodSandboxRequest { pod_sandbox_id: id.into() }))?;
        Ok(())
    }

    /// `RemovePodSandbox`.
    pub fn remove_sandbox(&mut self, id: &str) -> Result<(), tonic::Status> {
        self.rt
            .block_on(self.runtime.remove_pod_sandbox(cri::RemovePodSandboxRequest { pod_sandbox_id: id.into() }))?;
        Ok(())
    }
}
