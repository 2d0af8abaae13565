//! The agent's CRI runtime against a real containerd (Debian's 1.6, started privately by `testbed::containerd`),
//! with pods made through CRI as a kubelet with the cgroupfs driver would make them (there is no kubelet here), in
//! all three QoS classes, doing real I/O on a BFQ loop device. Weights are read from the pod cgroups
//! (`blkio/kubepods/…/pod<uid>/blkio.bfq.weight`). Needs root, cgroup v1 blkio, loop devices, containerd and the
//! host's Docker (to build the sandbox image) (`#[ignore]`d; see `testbed::require`).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use testbed::agent::Agent;
use testbed::blkio::{bfq_weight, record_weights, unique_suffix, BLKIO};
use testbed::containerd::{script_container, Containerd, PodMeta, Qos};
use testbed::loopdev::LoopDevice;
use testbed::process::wait_for;
use testbed::{require, Need};

use crate::AGENT;

/// A pod uid (a UUID) unique to this run.
pub(crate) fn uid(n: u32) -> String {
    let s = unique_suffix(); // "<pid>-<nanos>"
    let (pid, nanos) = s.split_once('-').unwrap();
    format!("{:08x}-d15c-4a05-8{n:03x}-{:012x}", pid.parse::<u32>().unwrap(), nanos.parse::<u64>().unwrap())
}

fn pod_dir(qos: Qos, uid: &str) -> PathBuf {
    Path::new(BLKIO).join(qos.pod_rel(uid))
}

fn weight_becomes(dir: &Path, want: u32, limit: Duration) -> Option<Duration> {
    let t = Instant::now();
    wait_for(limit, Duration::from_millis(5), || (bfq_weight(dir) == Some(want)).then(|| t.elapsed()))
}

#[test]
#[ignore = "needs root, cgroup v1 blkio and containerd: run ./scripts/test.sh"]
fn agent_manages_pods_through_containerd() {
    let needs = [&testbed::containerd::NEEDS_V1[..], &[Need::Program("setpriv")]].concat();
    if !require("agent_manages_pods_through_containerd", &needs) {
        return;
    }
    let _machine = testbed::exclusive();
    let disk = LoopDevice::with_bfq(1024);
    let dev = disk.dev.clone();
    let t0 = Instant::now();
    let mut containerd = Containerd::start();
    eprintln!("containerd up with the sandbox image imported: {:.1} s", t0.elapsed().as_secs_f64());

    // Before the agent: a heavy reader (Burstable), an idle pod (BestEffort), a pinned one (Guaranteed), an excluded
    // one whose weight someone set, and one with a bad annotation (managed like any other).
    let (reader, idle, pinned, excluded, bad) = (uid(1), uid(2), uid(3), uid(4), uid(5));
    let sleep = "exec sleep 100000";
    // About 20 MB/s (2 MiB direct reads, 0.1 s apart), so every level shows in the pod cgroup's weight file.
    let read = format!(
        "sleep 1; i=0; while [ $i -lt 900 ]; do dd if={} of=/dev/null bs=1M count=2 skip=$i iflag=direct 2>/dev/null; \
         i=$((i+2)); sleep 0.1; done; exec sleep 100000",
        dev.display()
    );
    containerd.run_pod("reader", &reader, Qos::Burstable, &[], &read, &[&dev]);
    containerd.run_pod("idle", &idle, Qos::BestEffort, &[], sleep, &[]);
    containerd.run_pod("pinned", &pinned, Qos::Guaranteed, &[("ddiskqos.io/weight", "300")], sleep, &[]);
    containerd.run_pod("excluded", &excluded, Qos::Burstable, &[("ddiskqos.io/exclude", "true")], sleep, &[]);
    std::fs::write(pod_dir(Qos::Burstable, &excluded).join("blkio.bfq.weight"), "123").unwrap();
    containerd.run_pod("bad", &bad, Qos::BestEffort, &[("ddiskqos.io/weight", "abc")], sleep, &[]);

    // The agent as the DaemonSet runs it: uid 0 with no capabilities at all (bounding set emptied, so exec gives it
    // none) and no_new_privs.
    let wrapper_dir = tempfile::tempdir().unwrap();
    let wrapper = wrapper_dir.path().join("agent-without-capabilities");
    std::fs::write(
        &wrapper,
        format!("#!/bin/sh\nexec setpriv --bounding-set=-all --inh-caps=-all --no-new-privs {AGENT} \"$@\"\n"),
    )
    .unwrap();
    std::fs::set_permissions(&wrapper, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let mut agent = Agent::start(
        &wrapper,
        &format!(
            r#"
runtime = "cri"
sample_interval = "100ms"
state_file = "{{dir}}/state.json"
control_socket = "{{dir}}/agent.sock"
[cri]
socket = "{}"
[policy]
# The test pods' namespace may pin and exclude (the default trusts none: agent_applies_the_operator_policy_...).
trusted_namespaces = ["{}"]
[devices]
protect = "off"
check = ["{}"]
[mlfq]
boost_after = "60s"
idle_promote_after = "off"
"#,
            containerd.socket().display(),
            testbed::containerd::NAMESPACE,
            disk.name
        ),
    );
    let started = Instant::now();
    let status = std::fs::read_to_string(format!("/proc/{}/status", agent.pid())).unwrap();
    for cap in ["CapEff", "CapPrm", "CapBnd"] {
        let line = status.lines().find(|l| l.starts_with(cap)).unwrap();
        assert!(line.ends_with("0000000000000000"), "agent runs with capabilities: {line}");
    }
    let reader_dir = pod_dir(Qos::Burstable, &reader);
    let recorder = {
        let dir = reader_dir.clone();
        std::thread::spawn(move || record_weights(&dir, Duration::from_secs(12), Duration::from_millis(10)))
    };
    for (what, dir, want) in [
        ("idle BestEffort pod at the top", pod_dir(Qos::BestEffort, &idle), 1000),
        ("pinned Guaranteed pod at its annotation's weight", pod_dir(Qos::Guaranteed, &pinned), 300),
        ("pod with a bad annotation managed, at the top", pod_dir(Qos::BestEffort, &bad), 1000),
    ] {
        let got = weight_becomes(&dir, want, Duration::from_secs(5));
        assert!(
            got.is_some(),
            "{what}: weight {:?} in {}; log:\n{}",
            bfq_weight(&dir),
            dir.display(),
            agent.log_text()
        );
    }
    eprintln!("existing pods weighted {:.2} s after Agent::start returned", started.elapsed().as_secs_f64());
    assert_eq!(bfq_weight(&pod_dir(Qos::Burstable, &excluded)), Some(123), "excluded pod touched");
    let log = agent.log_text();
    assert!(log.contains("ddiskqos.io/weight") && log.contains("abc"), "bad annotation not reported:\n{log}");
    // containerd 1.6 has no CRI event stream: the agent asks once, says so, and relies on re-lists and inotify.
    let no_events = wait_for(Duration::from_secs(5), Duration::from_millis(20), || {
        agent.log_text().contains("CRI runtime has no container event stream").then_some(())
    });
    assert!(no_events.is_some(), "no word on containerd 1.6's missing GetContainerEvents:\n{}", agent.log_text());

    // The heavy reader, demoted level by level at its pod cgroup.
    let seen = recorder.join().unwrap();
    eprintln!("reader pod weight trajectory: {seen:?}");
    let mut it = seen.iter().map(|(_, w)| *w);
    assert!([1000, 200, 40, 10].iter().all(|w| it.any(|x| x == *w)), "reader pod not demoted level by level: {seen:?}");

    // A new pod while the agent runs: at the top at once (inotify on kubepods, then a re-list).
    let fresh = uid(6);
    let t = Instant::now();
    containerd.run_pod("fresh", &fresh, Qos::Burstable, &[], sleep, &[]);
    let created = t.elapsed();
    let got = weight_becomes(&pod_dir(Qos::Burstable, &fresh), 1000, Duration::from_secs(5))
        .unwrap_or_else(|| panic!("new pod never reached 1000; log:\n{}", agent.log_text()));
    eprintln!(
        "new pod: RunPodSandbox+CreateContainer+StartContainer {:.0} ms, then weight 1000 after {:.0} ms",
        created.as_secs_f64() * 1e3,
        got.as_secs_f64() * 1e3
    );
    assert!(got < Duration::from_millis(1500), "new pod reached the top {got:?} after it started");

    // containerd restarts under the agent: it says so, keeps the weights, and sees pods made afterwards.
    let t = Instant::now();
    containerd.stop();
    let lost = wait_for(Duration::from_secs(10), Duration::from_millis(50), || {
        agent.log_text().contains("CRI runtime unreachable").then_some(())
    });
    assert!(lost.is_some(), "agent did not notice containerd stopping; log:\n{}", agent.log_text());
    containerd.spawn();
    let back = wait_for(Duration::from_secs(15), Duration::from_millis(50), || {
        agent.log_text().contains("CRI runtime answers again").then_some(())
    });
    assert!(back.is_some(), "agent did not reconnect; log:\n{}", agent.log_text());
    eprintln!("containerd stop -> restarted -> agent resynced: {:.1} s", t.elapsed().as_secs_f64());
    assert_eq!(bfq_weight(&pod_dir(Qos::Guaranteed, &pinned)), Some(300), "pinned pod changed over the restart");
    let after = uid(7);
    containerd.run_pod("restarted", &after, Qos::Guaranteed, &[], sleep, &[]);
    assert!(
        weight_becomes(&pod_dir(Qos::Guaranteed, &after), 1000, Duration::from_secs(5)).is_some(),
        "pod made after the containerd restart not managed; log:\n{}",
        agent.log_text()
    );
    let status = agent.status().expect("status");
    assert!(status.contains("ddiskqos-test/reader") && status.contains("ddiskqos-test/restarted"), "{status}");

    // SIGTERM: every pod's weight back to what it was (100, the default; the excluded one never changed).
    let code = agent.stop();
    assert!(code.success(), "agent exit status {code:?}\n{}", agent.log_text());
    for (qos, u) in [
        (Qos::Burstable, &reader),
        (Qos::BestEffort, &idle),
        (Qos::Guaranteed, &pinned),
        (Qos::BestEffort, &bad),
        (Qos::Burstable, &fresh),
        (Qos::Guaranteed, &after),
    ] {
        assert_eq!(bfq_weight(&pod_dir(qos, u)), Some(100), "pod {u} not restored");
    }
    assert_eq!(bfq_weight(&pod_dir(Qos::Burstable, &excluded)), Some(123), "excluded pod touched");
    drop(containerd);
    for (qos, u) in [(Qos::Burstable, &reader), (Qos::Guaranteed, &after)] {
        assert!(!pod_dir(qos, u).exists(), "pod cgroup {} left behind", pod_dir(qos, u).display());
    }
}

/// `[policy]` and `[cri] cgroup_root` for real: pods made as a kubelet with `--cgroup-root=/kubelet` (kind's) would
/// make them, in several namespaces, with tenants' annotations, a class, system pods (kube-system, a static pod, an
/// excluded namespace, an excluded label) and a reader. Checked in the pod cgroups' weight files: what a tenant
/// asks for is ignored and said once (pod, annotation, rule), a trusted namespace pins up to the ceiling, a class
/// gives its weight, system pods keep the weight they had, the reader is demoted and a new pod is at the top under
/// `/kubelet`, and SIGTERM puts every pod back.
#[test]
#[ignore = "needs root, cgroup v1 blkio and containerd: run ./scripts/test.sh"]
fn agent_applies_the_operator_policy_and_leaves_system_pods_under_kinds_cgroup_root() {
    if !require("agent_applies_the_operator_policy_and_leaves_system_pods", &testbed::containerd::NEEDS_V1) {
        return;
    }
    let _machine = testbed::exclusive();
    let disk = LoopDevice::with_bfq(1024);
    let dev = disk.dev.clone();
    let mut containerd = Containerd::start();
    containerd.set_kubelet_cgroup_root("/kubelet");
    let dir = |c: &Containerd, qos: Qos, uid: &str| Path::new(BLKIO).join(c.pod_rel(qos, uid));
    assert!(dir(&containerd, Qos::Burstable, "x").starts_with(format!("{BLKIO}/kubelet/kubepods/burstable")));

    let sleep = "exec sleep 100000";
    let read = format!(
        "sleep 1; i=0; while [ $i -lt 900 ]; do dd if={} of=/dev/null bs=1M count=2 skip=$i iflag=direct 2>/dev/null; \
         i=$((i+2)); sleep 0.1; done; exec sleep 100000",
        dev.display()
    );
    // (name, namespace, labels, annotations, qos, script, weight before the agent, weight with the agent)
    type Pod<'a> = (&'a str, &'a str, &'a [(&'a str, &'a str)], &'a [(&'a str, &'a str)], Qos, &'a str, u32, u32);
    let pods: Vec<Pod> = vec![
        ("tenant-pin", "team-a", &[], &[("ddiskqos.io/weight", "7")], Qos::Burstable, sleep, 100, 1000),
        ("tenant-exclude", "team-a", &[], &[("ddiskqos.io/exclude", "true")], Qos::BestEffort, sleep, 123, 1000),
        ("tenant-batch", "team-a", &[], &[("ddiskqos.io/class", "batch")], Qos::Burstable, sleep, 100, 40),
        ("tenant-gold", "team-a", &[], &[("ddiskqos.io/class", "gold")], Qos::Burstable, sleep, 100, 1000),
        ("trusted-high", "trusted", &[], &[("ddiskqos.io/weight", "900")], Qos::Guaranteed, sleep, 100, 500),
        ("trusted-pin", "trusted", &[], &[("ddiskqos.io/weight", "300")], Qos::Burstable, sleep, 100, 300),
        ("coredns", "kube-system", &[], &[], Qos::Burstable, sleep, 123, 123),
        (
            "etcd-node",
            "default",
            &[],
            &[("kubernetes.io/config.source", "file"), ("ddiskqos.io/weight", "1000")],
            Qos::Burstable,
            sleep,
            123,
            123,
        ),
        ("prometheus", "monitoring", &[], &[], Qos::BestEffort, sleep, 123, 123),
        // A label excludes in a trusted namespace only: a tenant that copies it is managed (issue 28, defect 4).
        ("apiserver-ha", "trusted", &[("tier", "control-plane")], &[], Qos::Guaranteed, sleep, 123, 123),
        ("label-copier", "team-a", &[("tier", "control-plane")], &[], Qos::BestEffort, sleep, 123, 1000),
        ("api-pod", "default", &[], &[("kubernetes.io/config.source", "api")], Qos::BestEffort, sleep, 100, 1000),
        ("reader", "team-a", &[], &[], Qos::Burstable, &read, 100, 10),
    ];
    let mut uids = Vec::new();
    for (n, (name, ns, labels, annotations, qos, script, before, _)) in pods.iter().enumerate() {
        let u = uid(100 + n as u32);
        let devices: Vec<&Path> = if name == &"reader" { vec![dev.as_path()] } else { vec![] };
        let meta = PodMeta { namespace: ns, labels };
        containerd.run_pod_as(meta, name, &u, *qos, annotations, script_container(name, script, &devices));
        if *before != 100 {
            std::fs::write(dir(&containerd, *qos, &u).join("blkio.bfq.weight"), before.to_string()).unwrap();
        }
        uids.push(u);
    }

    let mut agent = Agent::start(
        AGENT,
        &format!(
            r#"
runtime = "cri"
sample_interval = "100ms"
state_file = "{{dir}}/state.json"
control_socket = "{{dir}}/agent.sock"
[cri]
socket = "{}"
relist_interval = "300ms"
cgroup_root = "/kubelet"
[policy]
trusted_namespaces = ["trusted"]
max_pinned_weight = 500
classes = {{ batch = {{ weight = 40 }} }}
exclude_namespaces = ["kube-system", "monitoring"]
exclude_pod_labels = {{ tier = "control-plane" }}
[devices]
protect = "off"
check = ["{}"]
[mlfq]
boost_after = "60s"
idle_promote_after = "off"
"#,
            containerd.socket().display(),
            disk.name
        ),
    );
    for ((name, ns, _, _, qos, _, _, want), u) in pods.iter().zip(&uids) {
        let d = dir(&containerd, *qos, u);
        let limit = if *name == "reader" { 20 } else { 5 };
        assert!(
            weight_becomes(&d, *want, Duration::from_secs(limit)).is_some(),
            "{ns}/{name}: weight {:?}, wanted {want}; log:\n{}",
            bfq_weight(&d),
            agent.log_text()
        );
    }
    // Several re-lists later: the system pods were never written and each refusal was said exactly once.
    std::thread::sleep(Duration::from_secs(2));
    for ((name, ns, _, _, qos, _, before, want), u) in pods.iter().zip(&uids) {
        if before == want {
            assert_eq!(bfq_weight(&dir(&containerd, *qos, u)), Some(*before), "{ns}/{name} touched");
        }
    }
    let log = agent.log_text();
    for (pod, annotation, rule) in [
        ("team-a/tenant-pin", "ddiskqos.io/weight", "\"team-a\" is not in policy.trusted_namespaces"),
        ("team-a/tenant-exclude", "ddiskqos.io/exclude", "\"team-a\" is not in policy.trusted_namespaces"),
        ("team-a/tenant-gold", "ddiskqos.io/class", "not a class of policy.classes (defined: batch)"),
        ("trusted/trusted-high", "ddiskqos.io/weight", "above policy.max_pinned_weight = 500: pinned at 500 instead"),
    ] {
        let lines: Vec<&str> = log
            .lines()
            .filter(|l| l.contains("pod annotation not honoured") && l.contains(&format!("pod={pod} ")))
            .collect();
        assert_eq!(lines.len(), 1, "{pod}: not said exactly once:\n{log}");
        assert!(lines[0].contains(annotation) && lines[0].contains(rule), "{pod}: {}", lines[0]);
    }
    for (pod, rule) in [
        ("kube-system/coredns", "namespace \"kube-system\" is in policy.exclude_namespaces"),
        ("default/etcd-node", "static pod"),
        ("monitoring/prometheus", "namespace \"monitoring\" is in policy.exclude_namespaces"),
        ("trusted/apiserver-ha", "pod label tier=\"control-plane\" is in policy.exclude_pod_labels"),
    ] {
        let n = log
            .lines()
            .filter(|l| l.contains("system pod: never touched") && l.contains(&format!("pod={pod} ")))
            .count();
        assert_eq!(n, 1, "{pod}: system pod not said exactly once:\n{log}");
        assert!(log.lines().any(|l| l.contains(&format!("pod={pod} ")) && l.contains(rule)), "{pod}: {rule}\n{log}");
    }

    assert!(
        !log.lines().any(|l| l.contains("system pod") && l.contains("pod=team-a/label-copier ")),
        "a tenant excluded itself with a copied label:\n{log}"
    );

    // A new pod under /kubelet: at the top at once (inotify on /kubelet/kubepods/...).
    let fresh = uid(199);
    containerd.run_pod_as(
        PodMeta { namespace: "team-b", labels: &[] },
        "fresh",
        &fresh,
        Qos::BestEffort,
        &[("ddiskqos.io/weight", "1")],
        script_container("fresh", sleep, &[]),
    );
    let got = weight_becomes(&dir(&containerd, Qos::BestEffort, &fresh), 1000, Duration::from_secs(5))
        .unwrap_or_else(|| panic!("new pod under /kubelet never reached 1000; log:\n{}", agent.log_text()));
    eprintln!("new pod under /kubelet: weight 1000 {:.0} ms after StartContainer returned", got.as_secs_f64() * 1e3);
    assert!(got < Duration::from_millis(1500), "{got:?}");

    let code = agent.stop();
    assert!(code.success(), "agent exit status {code:?}\n{}", agent.log_text());
    for ((name, ns, _, _, qos, _, before, _), u) in pods.iter().zip(&uids) {
        let back = if *name == "tenant-exclude" { 123 } else { *before };
        assert_eq!(bfq_weight(&dir(&containerd, *qos, u)), Some(back), "{ns}/{name} not put back");
    }
    assert_eq!(bfq_weight(&dir(&containerd, Qos::BestEffort, &fresh)), Some(100));
    drop(containerd);
    for l in ["kubelet/kubepods/burstable", "kubelet/kubepods", "kubelet"] {
        assert!(!Path::new(BLKIO).join(l).exists(), "{l} left behind");
    }
}

/// Readiness for real (`GET /readyz`): not ready while no checked device can act on weights (by default the disks
/// holding `[cri] state_dirs`; here containerd's state directory, on the root disk whose scheduler is not BFQ),
/// ready once a checked device runs BFQ (switched by hand while the agent runs: no restart), not ready while
/// containerd is stopped and ready again when it is back. Every answer says per device what governs it.
#[test]
#[ignore = "needs root, cgroup v1 blkio and containerd: run ./scripts/test.sh"]
fn readiness_follows_the_runtime_and_the_devices() {
    if !require("readiness_follows_the_runtime_and_the_devices", &testbed::containerd::NEEDS_V1) {
        return;
    }
    let _machine = testbed::exclusive();
    let disk = LoopDevice::with_bfq(64);
    let mut containerd = Containerd::start();
    let state_dir = containerd.socket().parent().unwrap().to_path_buf();
    let root_disk = qos_agent::blockdev::disk_of_path(&state_dir).unwrap();
    let scheduler = qos_agent::blockdev::scheduler(&root_disk).unwrap().active;
    assert_ne!(scheduler, "bfq", "this test expects {} ({root_disk}) not to run BFQ", state_dir.display());
    let config = |devices: &str, port: u16| {
        format!(
            r#"
runtime = "cri"
sample_interval = "100ms"
state_file = "{{dir}}/state.json"
control_socket = "{{dir}}/agent.sock"
[cri]
socket = "{}"
relist_interval = "300ms"
state_dirs = ["{}", "/nonexistent/var/lib/kubelet"]
[devices]
protect = "off"
check = [{devices}]
[metrics]
enabled = true
listen = "127.0.0.1:{port}"
"#,
            containerd.socket().display(),
            state_dir.display(),
        )
    };
    let readyz = |port: u16| testbed::probe::http_get(std::net::SocketAddr::from(([127, 0, 0, 1], port)), "/readyz");
    let becomes = |port: u16, code: u16, secs: u64| {
        let t = Instant::now();
        wait_for(Duration::from_secs(secs), Duration::from_millis(50), || {
            readyz(port).filter(|(c, _)| *c == code).map(|(_, body)| (body, t.elapsed()))
        })
    };

    // By default (no [devices] check): the disk holding the runtime's state directory, where no weight acts.
    let port = testbed::probe::free_port();
    let mut agent = Agent::start(AGENT, &config("", port));
    let (body, _) =
        becomes(port, 503, 10).unwrap_or_else(|| panic!("not 503: {:?}\n{}", readyz(port), agent.log_text()));
    eprintln!("/readyz with the state directory's disk:\n{body}");
    let line = body.lines().find(|l| l.starts_with(&format!("device {root_disk} "))).expect("its device line");
    assert!(line.contains(&format!("holds {}", state_dir.display())), "{line}");
    assert!(line.contains("NO WEIGHT ACTS") && line.contains(&format!("scheduler {scheduler}")), "{line}");
    assert!(body.contains("runtime: answers") && body.ends_with("not ready\n"), "{body}");
    assert!(!body.contains("nonexistent"), "{body}");
    assert!(agent.log_text().contains("device checked for readiness"), "{}", agent.log_text());
    assert!(agent.stop().success());

    // A device of [devices] check that does not run BFQ yet: not ready; switched to BFQ by hand: ready.
    let sched = format!("/sys/block/{}/queue/scheduler", disk.name);
    std::fs::write(&sched, "none").unwrap();
    let port = testbed::probe::free_port();
    let mut agent = Agent::start(AGENT, &config(&format!("\"{}\"", disk.name), port));
    let (body, _) = becomes(port, 503, 10).unwrap_or_else(|| panic!("not 503: {:?}", readyz(port)));
    assert!(body.contains(&format!("device {} ", disk.name)) && body.contains("NO WEIGHT ACTS"), "{body}");
    std::fs::write(&sched, "bfq").unwrap();
    let (body, took) = becomes(port, 200, 10).unwrap_or_else(|| panic!("not 200 after bfq: {:?}", readyz(port)));
    eprintln!("/readyz after `echo bfq` ({:.0} ms):\n{body}", took.as_secs_f64() * 1e3);
    assert!(body.contains(&format!("device {} ", disk.name)) && body.contains("([devices] check): bfq: weights act"));
    assert!(body.ends_with("\nready\n"), "{body}");

    // The runtime goes away: not ready within a re-list or two; back: ready.
    containerd.stop();
    let (body, took) =
        becomes(port, 503, 10).unwrap_or_else(|| panic!("still 200 without containerd:\n{}", agent.log_text()));
    eprintln!("/readyz {:.0} ms after containerd stopped:\n{body}", took.as_secs_f64() * 1e3);
    assert!(body.contains("runtime: UNREACHABLE"), "{body}");
    containerd.spawn();
    let (_, took) =
        becomes(port, 200, 15).unwrap_or_else(|| panic!("not ready after containerd came back:\n{}", agent.log_text()));
    eprintln!("/readyz ready {:.0} ms after containerd was back", took.as_secs_f64() * 1e3);
    assert!(agent.stop().success());
}
