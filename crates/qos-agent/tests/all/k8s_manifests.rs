//! `deploy/kubernetes/`: every manifest parses into the Kubernetes API types (`k8s-openapi`), and the fields the
//! agent depends on are there: the mounts, no capabilities, the probes, the scrape annotations, the config.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{ConfigMap, Container, Namespace, ServiceAccount};
use qos_agent::config::{AgentConfig, RuntimeKind};
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
            match kind.as_str() {
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
    assert_eq!(host_path("/run/containerd"), ("/run/containerd".to_string(), true));
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
    let live = c.liveness_probe.as_ref().expect("livenessProbe").exec.as_ref().expect("exec").command.clone().unwrap();
    assert_eq!(live.last().map(String::as_str), Some("status"), "{live:?}");

    // The ConfigMap's agent.toml is a valid config for the CRI runtime, serving metrics on that port, with the
    // paths the DaemonSet mounts.
    let text = &m.configmaps[0].data.as_ref().unwrap()["agent.toml"];
    let cfg = AgentConfig::from_toml(text, Path::new("configmap.yaml:agent.toml")).unwrap();
    assert_eq!(cfg.runtime, RuntimeKind::Cri);
    assert!(cfg.metrics.enabled);
    assert_eq!(i32::from(cfg.metrics.listen.port()), port.container_port);
    assert!(cfg.cgroup.root.starts_with("/host/sys/fs/cgroup"), "{}", cfg.cgroup.root);
    assert!(cfg.cri.socket.starts_with("/run/containerd"));
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
