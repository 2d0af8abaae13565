//! `deploy/kubernetes/`: every manifest parses into the Kubernetes API types (`k8s-openapi`), and the fields the
//! agent depends on are there: the mounts, no capabilities, the probes, the scrape annotations, the config; the
//! layout applies as written (`kubectl apply -f`: the namespace first; `kubectl apply -k` and the overlays of
//! `deploy/kubernetes-overlays/`), a config change rolls the pods, and every manifest and rendered overlay passes
//! the Kubernetes schema (`kubernetes-validate --strict`, for the oldest and newest Kubernetes supported).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{ConfigMap, Container, Namespace, ServiceAccount};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use qos_agent::config::{ActuatorMode, AgentConfig, RuntimeKind};
use serde::Deserialize;

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/kubernetes")
}

/// Every object of every `*.yaml` file, by kind (documents split with serde_yaml's multi-document reader).
#[derive(Debug, Default)]
pub(crate) struct Manifests {
    pub(crate) daemonsets: Vec<DaemonSet>,
    pub(crate) configmaps: Vec<ConfigMap>,
    accounts: Vec<ServiceAccount>,
    namespaces: Vec<Namespace>,
    policies: Vec<NetworkPolicy>,
    /// Every object's kind, in the order `kubectl apply -f` applies them (files by name).
    kinds: Vec<String>,
}

pub(crate) fn load() -> Manifests {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no manifests in {}", dir().display());
    let mut m = Manifests::default();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        for doc in serde_yaml::Deserializer::from_str(&text) {
            let value = serde_yaml::Value::deserialize(doc).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
            let kind = value.get("kind").and_then(|k| k.as_str()).unwrap_or_default().to_string();
            let what = format!("{} ({kind})", file.display());
            // Typed parsing, then back: the API types skip fields they do not know, so a misspelt or misplaced
            // field shows up as a difference between the file and its round trip.
            fn typed<T: serde::de::DeserializeOwned + serde::Serialize>(v: serde_yaml::Value, what: &str) -> T {
                let original: serde_json::Value = serde_yaml::from_value(v.clone()).unwrap();
                let t: T = serde_yaml::from_value(v).unwrap_or_else(|e| panic!("{what}: {e}"));
                let back = serde_json::to_value(&t).unwrap();
                assert_eq!(back, original, "{what}: fields lost in the API types (misspelt or misplaced?)");
                t
            }
            m.kinds.push(kind.clone());
            match kind.as_str() {
                "NetworkPolicy" => m.policies.push(typed(value, &what)),
                "DaemonSet" => m.daemonsets.push(typed(value, &what)),
                "ConfigMap" => m.configmaps.push(typed(value, &what)),
                "ServiceAccount" => m.accounts.push(typed(value, &what)),
                "Namespace" => m.namespaces.push(typed(value, &what)),
                other => panic!("{what}: unexpected kind {other:?}"),
            }
        }
    }
    m
}

pub(crate) fn agent_container(ds: &DaemonSet) -> &Container {
    let spec = ds.spec.as_ref().unwrap().template.spec.as_ref().unwrap();
    spec.containers.iter().find(|c| c.name == "agent").expect("container `agent`")
}

#[test]
fn manifests_parse_into_api_types() {
    let m = load();
    assert_eq!((m.daemonsets.len(), m.configmaps.len(), m.accounts.len(), m.namespaces.len()), (1, 1, 1, 1));
    let ns = m.namespaces[0].metadata.name.clone().unwrap();
    for meta in [&m.daemonsets[0].metadata, &m.configmaps[0].metadata, &m.accounts[0].metadata] {
        assert_eq!(meta.namespace.as_deref(), Some(ns.as_str()), "{:?} not in namespace {ns}", meta.name);
    }
    // No API access: no token, and no RBAC objects (the loader refuses other kinds).
    assert_eq!(m.accounts[0].automount_service_account_token, Some(false));
}

#[test]
fn daemonset_has_the_least_privilege_that_works() {
    let m = load();
    let ds = &m.daemonsets[0];
    let pod = ds.spec.as_ref().unwrap().template.spec.as_ref().unwrap();
    assert_eq!(pod.service_account_name.as_deref(), m.accounts[0].metadata.name.as_deref());
    assert_eq!(pod.automount_service_account_token, Some(false));
    assert_ne!(pod.host_pid, Some(true), "hostPID is not needed");
    assert_ne!(pod.host_network, Some(true), "hostNetwork is not needed");
    let c = agent_container(ds);
    let sc = c.security_context.as_ref().expect("securityContext");
    assert_eq!(sc.privileged, Some(false));
    assert_eq!(sc.allow_privilege_escalation, Some(false));
    assert_eq!(sc.read_only_root_filesystem, Some(true));
    let caps = sc.capabilities.as_ref().expect("capabilities");
    assert_eq!(caps.drop.as_deref(), Some(&["ALL".to_string()][..]));
    assert!(caps.add.as_ref().is_none_or(|a| a.is_empty()), "no capability is needed: {:?}", caps.add);
    // An explicit version, the one build-image.sh tags by default; never :latest.
    assert_eq!(c.image.as_deref(), Some(crate::deploy_real::IMAGE));
    assert!(!crate::deploy_real::IMAGE.ends_with(":latest"));

    // Mounts: the host's cgroup tree writable at /host/sys/fs/cgroup, the runtime socket's directory read-only,
    // the host's /run/ddiskqos for the originals, the config.
    let volumes: BTreeMap<&str, _> = pod.volumes.as_ref().unwrap().iter().map(|v| (v.name.as_str(), v)).collect();
    let mounts: BTreeMap<&str, _> =
        c.volume_mounts.as_ref().unwrap().iter().map(|v| (v.mount_path.as_str(), v)).collect();
    let host_path = |mount: &str| {
        let vm = mounts.get(mount).unwrap_or_else(|| panic!("no mount at {mount}"));
        let hp = volumes[vm.name.as_str()].host_path.as_ref().unwrap_or_else(|| panic!("{mount}: not a hostPath"));
        (hp.path.clone(), vm.read_only.unwrap_or(false))
    };
    assert_eq!(host_path("/host/sys/fs/cgroup"), ("/sys/fs/cgroup".to_string(), false));
    assert_eq!(host_path("/run/cri"), ("/run/containerd".to_string(), true));
    assert_eq!(host_path("/run/ddiskqos"), ("/run/ddiskqos".to_string(), false));
    let config = mounts["/etc/ddiskqos"];
    assert_eq!(
        volumes[config.name.as_str()].config_map.as_ref().unwrap().name,
        m.configmaps[0].metadata.name.clone().unwrap()
    );
}

#[test]
fn probes_metrics_and_scrape_annotations_agree() {
    let m = load();
    let ds = &m.daemonsets[0];
    let c = agent_container(ds);
    let port = c.ports.as_ref().unwrap().iter().find(|p| p.name.as_deref() == Some("metrics")).expect("metrics port");
    let ann = ds.spec.as_ref().unwrap().template.metadata.as_ref().unwrap().annotations.as_ref().unwrap();
    assert_eq!(ann["prometheus.io/scrape"], "true");
    assert_eq!(ann["prometheus.io/port"], port.container_port.to_string());
    assert_eq!(ann["ddiskqos.io/exclude"], "true", "the agent's own pod is excluded");
    let ready = c.readiness_probe.as_ref().expect("readinessProbe").http_get.as_ref().expect("httpGet");
    assert_eq!(ready.path.as_deref(), Some("/readyz"));
    assert_eq!(ready.port, IntOrString::String("metrics".into()), "readinessProbe: not on the metrics port");
    // Liveness: the daemon loop answers its status socket (/healthz, served by another task, would not show a
    // stuck loop).
    let live = c.liveness_probe.as_ref().expect("livenessProbe").exec.as_ref().expect("exec").command.clone().unwrap();
    assert_eq!(live.last().map(String::as_str), Some("status"), "{live:?}");

    // The ConfigMap's agent.toml is a valid config for the CRI runtime, serving metrics on that port, with the
    // paths the DaemonSet mounts.
    let text = &m.configmaps[0].data.as_ref().unwrap()["agent.toml"];
    let cfg = AgentConfig::from_toml(text, Path::new("02-configmap.yaml:agent.toml")).unwrap();
    assert_eq!(cfg.runtime, RuntimeKind::Cri);
    assert!(cfg.metrics.enabled);
    assert_eq!(i32::from(cfg.metrics.listen.port()), port.container_port);
    assert!(cfg.cgroup.root.starts_with("/host/sys/fs/cgroup"), "{}", cfg.cgroup.root);
    assert!(cfg.cri.socket.starts_with("/run/cri"));
    assert!(cfg.state_file.starts_with("/run/ddiskqos") && cfg.control_socket.starts_with("/run/ddiskqos"));
    let args = c.args.as_ref().unwrap();
    assert!(args.windows(2).any(|w| w[0] == "--config" && w[1] == "/etc/ddiskqos/agent.toml"), "{args:?}");
    // The policy: no tenant namespace trusted, system pods and the agent's own namespace never touched (its pod's
    // own ddiskqos.io/exclude annotation is honoured only in a trusted namespace).
    let own = ds.metadata.namespace.clone().unwrap();
    assert!(cfg.policy.trusted_namespaces.is_empty(), "{:?}", cfg.policy.trusted_namespaces);
    for ns in ["kube-system", own.as_str()] {
        assert!(cfg.policy.exclude_namespaces.iter().any(|n| n == ns), "{ns} not excluded: {:?}", cfg.policy);
    }
    assert!(cfg.policy.exclude_static_pods);
}

#[test]
fn kubectl_apply_f_creates_the_namespace_first_and_the_agent_reaches_only_its_metrics_port() {
    let m = load();
    // `kubectl apply -f DIR` applies the files in name order: the namespace must come before anything in it.
    assert_eq!(m.kinds.first().map(String::as_str), Some("Namespace"), "{:?}", m.kinds);
    let ds = m.kinds.iter().position(|k| k == "DaemonSet").unwrap();
    for k in ["ServiceAccount", "ConfigMap"] {
        assert!(m.kinds.iter().position(|x| x == k).unwrap() < ds, "{k} after the DaemonSet: {:?}", m.kinds);
    }
    // The kustomization is not a .yaml file, so `apply -f` does not read it.
    assert!(dir().join("Kustomization").is_file());
    assert!(!dir().join("kustomization.yaml").exists() && !dir().join("kustomization.yml").exists());
    let np = m.policies[0].spec.as_ref().unwrap();
    assert_eq!(np.policy_types.as_deref(), Some(&["Ingress".to_string(), "Egress".to_string()][..]));
    assert_eq!(np.egress.as_deref().map(<[_]>::len), Some(0), "the agent needs no egress");
    let ports = np.ingress.as_ref().unwrap()[0].ports.as_ref().unwrap();
    assert_eq!(ports.len(), 1);
    let port = agent_container(&m.daemonsets[0]).ports.as_ref().unwrap()[0].container_port;
    assert_eq!(ports[0].port, Some(IntOrString::Int(port)));
}

/// `sha256sum` of a file.
fn sha256(path: &Path) -> String {
    sha256_of(&std::fs::read(path).unwrap())
}

/// `sha256sum` of bytes, as lowercase hex.
pub(crate) fn sha256_of(bytes: &[u8]) -> String {
    use std::io::Write;
    let mut child = std::process::Command::new("sha256sum")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("sha256sum (coreutils)");
    child.stdin.take().unwrap().write_all(bytes).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    String::from_utf8(out.stdout).unwrap().split_whitespace().next().unwrap().to_string()
}

#[test]
fn a_config_change_rolls_the_pods_and_the_overlays_differ_from_the_base_only_where_they_should() {
    let m = load();
    let base = std::fs::read_to_string(dir().join("agent.toml")).unwrap();
    // apply -f: the ConfigMap holds agent.toml verbatim, and the pod template carries its hash.
    assert_eq!(m.configmaps[0].data.as_ref().unwrap()["agent.toml"], base, "02-configmap.yaml differs from agent.toml");
    let ann = m.daemonsets[0].spec.as_ref().unwrap().template.metadata.as_ref().unwrap().annotations.clone().unwrap();
    assert_eq!(
        ann.get("ddiskqos.io/config-sha256").map(String::as_str),
        Some(sha256(&dir().join("agent.toml")).as_str()),
        "update the DaemonSet's ddiskqos.io/config-sha256 to `sha256sum deploy/kubernetes/agent.toml`"
    );
    // Resources: requests and limits for CPU and memory.
    let res = agent_container(&m.daemonsets[0]).resources.clone().unwrap();
    for (what, map) in [("requests", res.requests.unwrap()), ("limits", res.limits.unwrap())] {
        assert!(map.contains_key("cpu") && map.contains_key("memory"), "{what}: {map:?}");
    }
    // The overlays' configs: whole files, each differing from the base in its comments and the lines it is for.
    let overlays = dir().join("../kubernetes-overlays");
    let base_cfg = AgentConfig::from_toml(&base, Path::new("agent.toml")).unwrap();
    let code = |t: &str| t.lines().filter(|l| !l.trim_start().starts_with('#')).map(str::to_string).collect::<Vec<_>>();
    for (overlay, root, socket, actuator) in [
        ("cgroup-v2", "/host/sys/fs/cgroup", "/run/cri/containerd.sock", ActuatorMode::Auto),
        ("cri-o", "/host/sys/fs/cgroup/blkio", "/run/cri/crio.sock", ActuatorMode::Auto),
        ("cri-o-cgroup-v2", "/host/sys/fs/cgroup", "/run/cri/crio.sock", ActuatorMode::Auto),
        ("systemd-driver", "/host/sys/fs/cgroup", "/run/cri/containerd.sock", ActuatorMode::Systemd),
    ] {
        let path = overlays.join(overlay).join("agent.toml");
        let text = std::fs::read_to_string(&path).unwrap();
        let cfg = AgentConfig::from_toml(&text, &path).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((cfg.cgroup.root.as_str(), cfg.cri.socket.to_str().unwrap()), (root, socket), "{overlay}");
        let mut want = base_cfg.clone();
        want.cgroup.root = root.into();
        want.cri.socket = socket.into();
        want.actuator = actuator;
        assert_eq!(cfg, want, "{overlay}: differs from the base elsewhere too");
        // The base leaves `actuator` at its default; an overlay that sets it has that one line more.
        let set_actuator = |t: &str| t.lines().filter(|l| l.starts_with("actuator =")).count();
        assert_eq!(set_actuator(&text), usize::from(actuator != ActuatorMode::Auto), "{overlay}: actuator lines");
        let without = |t: &str| t.lines().filter(|l| !l.starts_with("actuator =")).collect::<Vec<_>>().join("\n");
        let (a, b) = (code(&base), code(&without(&text)));
        let differing = a.iter().zip(&b).filter(|(x, y)| x != y).count();
        assert!(a.len() == b.len() && differing <= 2, "{overlay}: {differing} lines differ from the base");
    }
}

/// The rendered systemd-driver overlay: the agent's container mounts the host's D-Bus socket directory and
/// `/run/systemd/system` read-only from hostPaths, and points the system bus address at the socket; nothing else
/// about its privileges changes (no capability, not privileged).
fn systemd_driver_mounts_the_bus_read_only(rendered: &str) {
    let ds: DaemonSet = serde_yaml::Deserializer::from_str(rendered)
        .map(|d| serde_yaml::Value::deserialize(d).unwrap())
        .find(|v| v["kind"] == "DaemonSet")
        .map(|v| serde_yaml::from_value(v).unwrap())
        .expect("systemd-driver: no DaemonSet rendered");
    let c = agent_container(&ds);
    let pod = ds.spec.as_ref().unwrap().template.spec.as_ref().unwrap();
    for (mount, host) in [("/run/dbus", "/run/dbus"), ("/run/systemd/system", "/run/systemd/system")] {
        let m = c.volume_mounts.iter().flatten().find(|m| m.mount_path == mount);
        let m = m.unwrap_or_else(|| panic!("systemd-driver: no mount at {mount}"));
        assert_eq!(m.read_only, Some(true), "systemd-driver: {mount} not read-only");
        let v = pod.volumes.iter().flatten().find(|v| v.name == m.name).expect("the mount's volume");
        assert_eq!(v.host_path.as_ref().map(|h| h.path.as_str()), Some(host), "systemd-driver: {mount}'s volume");
    }
    let env = c.env.iter().flatten().find(|e| e.name == "DBUS_SYSTEM_BUS_ADDRESS");
    assert_eq!(
        env.and_then(|e| e.value.as_deref()),
        Some("unix:path=/run/dbus/system_bus_socket"),
        "systemd-driver: the system bus address"
    );
    let sc = c.security_context.as_ref().unwrap();
    assert_eq!(sc.privileged, Some(false));
    assert_eq!(sc.capabilities.as_ref().and_then(|c| c.drop.clone()), Some(vec!["ALL".to_string()]));
    assert!(sc.capabilities.as_ref().unwrap().add.is_none(), "systemd-driver adds a capability");
}

/// The program that renders a kustomization here: `kustomize build DIR`, or kubectl's built-in `kubectl kustomize
/// DIR` (scripts/setup-host.sh installs kustomize with `go install` when neither is there).
pub(crate) fn kustomize() -> (&'static str, Vec<&'static str>) {
    if testbed::require::missing(&[testbed::Need::Program("kustomize")]).is_empty() {
        ("kustomize", vec!["build"])
    } else {
        ("kubectl", vec!["kustomize"])
    }
}

#[test]
fn every_manifest_and_overlay_passes_the_kubernetes_schema() {
    let (program, sub) = kustomize();
    let needs = [testbed::Need::Program("kubernetes-validate"), testbed::Need::Program(program)];
    if !testbed::require("k8s_manifests::every_manifest_and_overlay_passes_the_kubernetes_schema", &needs) {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    // Rendered: the base and every overlay. Each names a ConfigMap with a content hash, and its DaemonSet uses it.
    let overlays = dir().join("../kubernetes-overlays");
    let mut targets = vec![("base".to_string(), dir())];
    for e in std::fs::read_dir(&overlays).unwrap() {
        let p = e.unwrap().path();
        targets.push((p.file_name().unwrap().to_string_lossy().into_owned(), p));
    }
    assert!(targets.len() >= 4, "overlays for cgroup v2 and CRI-O: {targets:?}");
    let mut names = BTreeMap::new();
    for (name, path) in &targets {
        let out = std::process::Command::new(program).args(&sub).arg(path).output().unwrap();
        assert!(out.status.success(), "{program} {sub:?} {}: {}", path.display(), String::from_utf8_lossy(&out.stderr));
        let text = String::from_utf8(out.stdout).unwrap();
        let cm = text
            .lines()
            .find_map(|l| l.trim().strip_prefix("name: ddiskqos-agent-"))
            .unwrap_or_else(|| panic!("{name}: no generated ConfigMap with a hash suffix:\n{text}"));
        assert_eq!(text.matches(&format!("name: ddiskqos-agent-{cm}")).count(), 2, "{name}: DaemonSet not using it");
        names.insert(name.clone(), cm.to_string());
        if name == "systemd-driver" {
            systemd_driver_mounts_the_bus_read_only(&text);
        }
        let file = tmp.path().join(format!("rendered-{name}.yaml"));
        std::fs::write(&file, &text).unwrap();
        files.push(file);
    }
    let distinct: std::collections::BTreeSet<&String> = names.values().collect();
    assert_eq!(distinct.len(), names.len(), "configs differ, so must the generated names: {names:?}");
    // The oldest and the newest Kubernetes the manifests are for, strict: an unknown field is an error.
    for version in KUBERNETES_VERSIONS {
        let report = kubernetes_validate(version, &files);
        let passed = report.lines().filter(|l| l.contains(" passed for resource ")).count();
        assert_eq!(passed, 5 + 5 * targets.len(), "{version}: not every object validated:\n{report}");
    }
    // A config change gives the generated ConfigMap another name, so the DaemonSet's template changes: a rollout.
    let copy = tmp.path().join("kubernetes");
    std::fs::create_dir(&copy).unwrap();
    for e in std::fs::read_dir(dir()).unwrap() {
        let p = e.unwrap().path();
        std::fs::copy(&p, copy.join(p.file_name().unwrap())).unwrap();
    }
    let toml = std::fs::read_to_string(copy.join("agent.toml")).unwrap();
    std::fs::write(copy.join("agent.toml"), toml.replace("relist_interval = \"2s\"", "relist_interval = \"3s\""))
        .unwrap();
    let out = std::process::Command::new(program).args(&sub).arg(&copy).output().unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(!text.contains(&format!("ddiskqos-agent-{}", names["base"])), "config changed, name did not:\n{text}");
}

/// The oldest and the newest Kubernetes the manifests and the chart are for.
pub(crate) const KUBERNETES_VERSIONS: [&str; 2] = ["1.28.0", "1.37.0"];

/// `kubernetes-validate --strict` (an unknown field is an error) of `files` for Kubernetes `version`: its report;
/// a failure fails the test with it.
pub(crate) fn kubernetes_validate(version: &str, files: &[impl AsRef<std::ffi::OsStr>]) -> String {
    let out = std::process::Command::new("kubernetes-validate")
        .args(["--strict", "--kubernetes-version", version])
        .args(files)
        .output()
        .unwrap_or_else(|e| panic!("kubernetes-validate: {e}"));
    let report = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "kubernetes-validate {version}:\n{report}");
    report
}
