//! The DaemonSet for real, without a cluster: the image `deploy/kubernetes/build-image.sh` builds (`scripts/test.sh`
//! builds it first), run as a pod through the tests' containerd the way a kubelet runs `03-daemonset.yaml`: its args,
//! its volume mounts (the ConfigMap's `agent.toml`, the host's cgroup tree, the runtime's socket directory, the
//! state directory), its security context (no capabilities, read-only root filesystem, no privilege escalation,
//! uid 0, the runtime's default seccomp profile), host network instead of a pod network (no CNI here). Everything is
//! taken from the parsed manifests, so a change there is tested here. Checked: readiness (the probe's path
//! answers), the agent process's capabilities, the node's other pods weighted at their pod cgroups (the agent's own
//! pod excluded by its annotation), the liveness probe's exec (the status command), `/healthz`, and a kubelet's
//! stop (SIGTERM with the grace period) putting every pod's weight back. Needs root, cgroup v1 blkio, loop devices, containerd and the agent's image;
//! the same on cgroup v2 runs in the v2 test bed (`v2_real::the_daemonset_on_cgroup_v2`, with the ConfigMap's
//! documented v2 root).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_cri::v1 as cri;
use testbed::blkio::BLKIO;
use testbed::containerd::{host_network, Containerd, PodMeta, Qos};
use testbed::loopdev::LoopDevice;
use testbed::probe::{free_port, scrape};
use testbed::process::wait_for;
use testbed::{require, Need};

/// The image the DaemonSet names (and `build-image.sh` builds by default): the workspace's version, never `:latest`.
pub(crate) const IMAGE: &str = concat!("ddiskqos-agent:", env!("CARGO_PKG_VERSION"));

/// Which cgroup tree the node has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Tree {
    /// cgroup v1: pod cgroups in the blkio hierarchy, `blkio.bfq.weight`.
    V1,
    /// cgroup v2 (inside the test bed): pod cgroups in the unified tree, `io.bfq.weight` (`default N`).
    V2,
}

impl Tree {
    fn pod_dir(self, qos: Qos, uid: &str) -> PathBuf {
        match self {
            Self::V1 => Path::new(BLKIO).join(qos.pod_rel(uid)),
            Self::V2 => Path::new("/sys/fs/cgroup").join(qos.pod_rel(uid)),
        }
    }

    /// The pod's BFQ weight (the default of the file; the test device has no override line).
    fn weight(self, dir: &Path) -> Option<u32> {
        let file = match self {
            Self::V1 => "blkio.bfq.weight",
            Self::V2 => "io.bfq.weight",
        };
        let text = std::fs::read_to_string(dir.join(file)).ok()?;
        let t = text.lines().next()?.trim();
        t.strip_prefix("default ").unwrap_or(t).parse().ok()
    }
}

/// Whether the agent's JSON log says `pod` is a system pod it never touches.
fn text_has_system_pod(log: &str, pod: &str) -> bool {
    log.lines().any(|l| l.contains("system pod: never touched") && l.contains(&format!("\"pod\":\"{pod}\"")))
}

/// The capability sets of a process (`CapEff`, `CapPrm`, `CapBnd`) and its `NoNewPrivs`, from /proc.
fn privileges(pid: u32) -> Vec<String> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .filter(|l| ["CapEff", "CapPrm", "CapBnd", "NoNewPrivs"].iter().any(|k| l.starts_with(k)))
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect()
}

#[test]
#[ignore = "needs root, cgroup v1 blkio, containerd and the agent's image: run ./scripts/test.sh"]
fn the_daemonset_runs_the_image_as_a_pod_without_capabilities_and_manages_the_nodes_pods() {
    let needs = [&testbed::containerd::NEEDS_V1[..], &[Need::DockerImage(IMAGE)]].concat();
    if !require("deploy_real::the_daemonset_runs_the_image_as_a_pod", &needs) {
        return;
    }
    run_daemonset(Tree::V1);
}

/// The DaemonSet's pod on a node with cgroup tree `tree` (see the module doc); the caller has checked the needs.
pub(crate) fn run_daemonset(tree: Tree) {
    let _machine = testbed::exclusive();
    let manifests = crate::k8s_manifests::load();
    let ds = &manifests.daemonsets[0];
    let template = &ds.spec.as_ref().unwrap().template;
    let pod_spec = template.spec.as_ref().unwrap();
    let agent = crate::k8s_manifests::agent_container(ds);
    assert_eq!(agent.image.as_deref(), Some(IMAGE), "the DaemonSet runs another image than build-image.sh builds");

    let disk = LoopDevice::with_bfq(1024);
    let mut containerd = Containerd::start();
    containerd.import_image(IMAGE);

    // The ConfigMap's agent.toml with what differs on this node: the test pods' device, and metrics on loopback
    // (the pod shares the host's network here; in a cluster it has its own namespace and listens on 0.0.0.0).
    let port = free_port();
    // On v2 the cgroup-v2 overlay's config (deploy/kubernetes-overlays/cgroup-v2), the ConfigMap's otherwise.
    let shipped = match tree {
        Tree::V1 => manifests.configmaps[0].data.as_ref().unwrap()["agent.toml"].clone(),
        Tree::V2 => {
            let overlay = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/kubernetes-overlays/cgroup-v2");
            std::fs::read_to_string(overlay.join("agent.toml")).unwrap()
        }
    };
    let toml = shipped
        .replace("check = []", &format!("check = [\"{}\"]", disk.name))
        .replace("listen = \"0.0.0.0:9477\"", &format!("listen = \"127.0.0.1:{port}\""));
    assert!(toml.contains(&disk.name) && toml.contains(&port.to_string()), "ConfigMap changed shape:\n{shipped}");
    let want_root =
        if tree == Tree::V2 { "root = \"/host/sys/fs/cgroup\"\n" } else { "root = \"/host/sys/fs/cgroup/blkio\"\n" };
    assert!(toml.contains(want_root), "config for {tree:?} has another cgroup root:\n{shipped}");

    // The volumes, as the kubelet would provide them on this node.
    let host = tempfile::Builder::new().prefix("ddiskqos-deploy-").tempdir_in("/var/tmp").unwrap();
    let (config_dir, state_dir) = (host.path().join("config"), host.path().join("state"));
    std::fs::create_dir_all(&config_dir).unwrap();
    std::fs::create_dir_all(&state_dir).unwrap();
    std::fs::write(config_dir.join("agent.toml"), &toml).unwrap();
    let runtime_dir = containerd.socket().parent().unwrap().to_path_buf();
    let mut mounts = Vec::new();
    for vm in agent.volume_mounts.as_deref().unwrap_or_default() {
        let volume = pod_spec.volumes.as_deref().unwrap_or_default().iter().find(|v| v.name == vm.name).unwrap();
        let host_path = if volume.config_map.is_some() {
            config_dir.clone()
        } else {
            match volume.host_path.as_ref().map(|h| h.path.as_str()) {
                Some("/sys/fs/cgroup") => PathBuf::from("/sys/fs/cgroup"),
                Some("/run/containerd") => runtime_dir.clone(),
                Some("/run/ddiskqos") => state_dir.clone(),
                other => panic!("volume {} ({other:?}): unknown to this test, teach it", vm.name),
            }
        };
        mounts.push(cri::Mount {
            container_path: vm.mount_path.clone(),
            host_path: host_path.to_string_lossy().into_owned(),
            readonly: vm.read_only.unwrap_or(false),
            ..Default::default()
        });
    }
    let sc = agent.security_context.as_ref().unwrap();
    let drop = sc.capabilities.as_ref().and_then(|c| c.drop.clone()).unwrap_or_default();
    assert_eq!(drop, ["ALL"], "the DaemonSet no longer drops every capability");
    let seccomp = pod_spec
        .security_context
        .as_ref()
        .and_then(|s| s.seccomp_profile.as_ref())
        .map(|p| p.type_.as_str())
        .unwrap_or_default();
    assert_eq!(seccomp, "RuntimeDefault");
    let security = cri::LinuxContainerSecurityContext {
        capabilities: Some(cri::Capability { drop_capabilities: drop, ..Default::default() }),
        privileged: sc.privileged.unwrap_or(false),
        namespace_options: Some(host_network()),
        run_as_user: sc.run_as_user.map(|value| cri::Int64Value { value }),
        run_as_group: sc.run_as_group.map(|value| cri::Int64Value { value }),
        readonly_rootfs: sc.read_only_root_filesystem.unwrap_or(false),
        no_new_privs: !sc.allow_privilege_escalation.unwrap_or(true),
        seccomp: Some(cri::SecurityProfile {
            profile_type: cri::security_profile::ProfileType::RuntimeDefault as i32,
            ..Default::default()
        }),
        ..Default::default()
    };
    let container = cri::ContainerConfig {
        metadata: Some(cri::ContainerMetadata { name: agent.name.clone(), attempt: 0 }),
        image: Some(cri::ImageSpec { image: IMAGE.into(), ..Default::default() }),
        // No command: the image's entrypoint, as the DaemonSet sets none.
        args: agent.args.clone().unwrap_or_default(),
        log_path: format!("{}.log", agent.name),
        mounts,
        linux: Some(cri::LinuxContainerConfig { security_context: Some(security), ..Default::default() }),
        ..Default::default()
    };
    let annotations: HashMap<String, String> =
        template.metadata.as_ref().and_then(|m| m.annotations.clone()).unwrap_or_default().into_iter().collect();
    assert_eq!(annotations.get("ddiskqos.io/exclude").map(String::as_str), Some("true"), "agent pod not excluded");
    let annotations: Vec<(&str, &str)> = annotations.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();

    // The node's other pods first (the agent finds them at its start), then the agent's pod.
    let (reader, idle, agent_uid) = (crate::cri_real::uid(21), crate::cri_real::uid(22), crate::cri_real::uid(23));
    let read = format!(
        "sleep 1; i=0; while [ $i -lt 900 ]; do dd if={} of=/dev/null bs=1M count=2 skip=$i iflag=direct 2>/dev/null; \
         i=$((i+2)); sleep 0.1; done; exec sleep 100000",
        disk.dev.display()
    );
    containerd.run_pod("reader", &reader, Qos::Burstable, &[], &read, &[&disk.dev]);
    containerd.run_pod("idle", &idle, Qos::BestEffort, &[], "exec sleep 100000", &[]);
    // In the DaemonSet's namespace, which the ConfigMap's [policy] excludes (as it excludes kube-system).
    let own_namespace = ds.metadata.namespace.clone().unwrap();
    let meta = PodMeta { namespace: &own_namespace, labels: &[] };
    let (_sandbox, agent_id) =
        containerd.run_pod_as(meta, "ddiskqos-agent", &agent_uid, Qos::Burstable, &annotations, container);
    let log = containerd.container_log(&agent_uid, &agent.name);
    let log_text = || std::fs::read_to_string(&log).unwrap_or_default();

    // Readiness: the probe's path answers 200 (the runtime answers, the loop device of [devices] check runs BFQ),
    // and the metrics endpoint answers too.
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let probe_path = agent.readiness_probe.as_ref().and_then(|p| p.http_get.as_ref()).and_then(|h| h.path.clone());
    let probe_path = probe_path.expect("readinessProbe.httpGet.path");
    let ready = wait_for(Duration::from_secs(20), Duration::from_millis(100), || {
        testbed::probe::http_get(addr, &probe_path).filter(|(code, _)| *code == 200)
    });
    let (_, body) = ready.unwrap_or_else(|| {
        panic!(
            "{probe_path} never answered 200 on {addr}: {:?}; the agent's log:\n{}",
            testbed::probe::http_get(addr, &probe_path),
            log_text()
        )
    });
    assert!(body.contains(&format!("device {} ", disk.name)) && body.contains("bfq: weights act"), "{body}");
    assert!(scrape(addr).is_some_and(|m| m.contains("ddiskqos_runtime_up 1")), "metrics do not answer");
    let mut cri = containerd.cri();
    let (state, _, pid) = cri.container_state(&agent_id).unwrap();
    assert_eq!(state, cri::ContainerState::ContainerRunning);
    let pid = pid.expect("the agent container's pid");
    let privs = privileges(pid);
    eprintln!("the agent in its pod (pid {pid}): {privs:?}");
    for want in ["CapEff: 0000000000000000", "CapPrm: 0000000000000000", "CapBnd: 0000000000000000", "NoNewPrivs: 1"] {
        assert!(privs.iter().any(|p| p == want), "agent process lacks {want:?}: {privs:?}");
    }

    // The node's pods, weighted at their pod cgroups; the agent's own pod left alone.
    let weight_is = |dir: PathBuf, want: u32, limit: u64| {
        wait_for(Duration::from_secs(limit), Duration::from_millis(20), || {
            (tree.weight(&dir) == Some(want)).then_some(())
        })
        .is_some()
    };
    assert!(weight_is(tree.pod_dir(Qos::BestEffort, &idle), 1000, 10), "idle pod not at 1000; log:\n{}", log_text());
    assert!(
        weight_is(tree.pod_dir(Qos::Burstable, &reader), 10, 30),
        "reader pod not demoted to 10; log:\n{}",
        log_text()
    );
    assert_eq!(tree.weight(&tree.pod_dir(Qos::Burstable, &agent_uid)), Some(100), "the agent's own pod was weighted");

    // Liveness: the probe's command, executed in the container as the kubelet would (the status table, through the
    // agent's control socket); and /healthz answers.
    let probe: Vec<String> =
        agent.liveness_probe.as_ref().and_then(|p| p.exec.as_ref()).and_then(|e| e.command.clone()).unwrap();
    let probe: Vec<&str> = probe.iter().map(String::as_str).collect();
    let (code, out, err) = cri.exec_sync(&agent_id, &probe, Duration::from_secs(5)).unwrap();
    assert_eq!(code, 0, "liveness probe {probe:?} failed: {out}{err}");
    let health = testbed::probe::http_get(addr, "/healthz");
    assert!(health.as_ref().is_some_and(|(code, _)| *code == 200), "GET /healthz: {health:?}; log:\n{}", log_text());
    assert!(out.contains("ddiskqos-test/reader") && out.contains("ddiskqos-test/idle"), "status:\n{out}");
    // Its own pod: listed as excluded (the status table's name column is 24 wide, enough for this name).
    let own_row = out.lines().find(|l| l.contains(&format!("{own_namespace}/ddiskqos-agent")));
    assert!(own_row.is_some_and(|r| r.contains("excluded")), "the agent's own pod not excluded:\n{out}");
    assert!(text_has_system_pod(&log_text(), &format!("{own_namespace}/ddiskqos-agent")), "{}", log_text());

    // The kubelet stops the pod: SIGTERM with the grace period; every pod's weight back to 100.
    let grace = Duration::from_secs(pod_spec.termination_grace_period_seconds.unwrap_or(30) as u64);
    cri.stop_container(&agent_id, grace).unwrap();
    let (state, exit, _) = cri.container_state(&agent_id).unwrap();
    assert_eq!((state, exit), (cri::ContainerState::ContainerExited, 0), "agent's log:\n{}", log_text());
    for (qos, uid) in [(Qos::Burstable, &reader), (Qos::BestEffort, &idle)] {
        assert_eq!(tree.weight(&tree.pod_dir(qos, uid)), Some(100), "pod {uid} not restored; log:\n{}", log_text());
    }
    let text = log_text();
    assert!(text.contains("\"level\":\"INFO\"") || text.contains("\"level\":\"info\""), "not JSON logs:\n{text}");
    eprintln!("agent pod ({tree:?}): ready, weighted 2 pods, probe ok, stopped with exit 0, weights restored");
}
