//! The agent's CRI runtime against a real containerd (Debian's 1.6, started privately by `testbed::containerd`),
//! with pods made through CRI as a kubelet with the cgroupfs driver would make them (there is no kubelet here), in
//! all three QoS classes, doing real I/O on a BFQ loop device. Weights are read from the pod cgroups
//! (`blkio/kubepods/…/pod<uid>/blkio.bfq.weight`). Needs root, cgroup v1 blkio, loop devices, containerd and the
//! host's Docker (to build the sandbox image) (`#[ignore]`d; see `testbed::require`).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use testbed::agent::Agent;
use testbed::blkio::{bfq_weight, record_weights, unique_suffix, BLKIO};
use testbed::containerd::{Containerd, Qos};
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
[devices]
check = ["{}"]
[mlfq]
boost_after = "60s"
idle_promote_after = "off"
"#,
            containerd.socket().display(),
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
