//! `--runtime cri` for real: a private containerd (`testbed::containerd`, as the agent's `cri_real` starts it),
//! the bench making its readers and background as Burstable pods through CRI, the shipped daemon on the agent's CRI
//! backends finding them and weighting their pod cgroups. Tiny files, one BFQ mode: it checks where the weights
//! landed (read back from the pod cgroups), that the kernel charged the pods, and that no pod, pod cgroup, kubepods
//! level, loop device, mount or file is left; never how fast anything is.

use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;
use testbed::containerd::Containerd;
use testbed::{require, Need};

use super::{leftovers, wait_with_deadline, BIN};

/// Every `kubepods` directory in any hierarchy (the run must leave none that was not there before).
fn kubepods_dirs() -> Vec<String> {
    let mut out = Vec::new();
    for h in std::fs::read_dir("/sys/fs/cgroup").into_iter().flatten().flatten() {
        let dir = h.path().join("kubepods");
        if h.file_type().is_ok_and(|t| t.is_dir()) && dir.is_dir() {
            out.push(dir.display().to_string());
        }
    }
    out
}

/// What a real run with `--runtime cri` needs: a v1 run's needs, the host's Docker (it builds the sandbox image
/// once) and containerd with runc.
fn cri_run_needs() -> Vec<Need> {
    [&testbed::containerd::NEEDS_V1[..], &[Need::Program("mkfs.ext4")]].concat()
}

#[test]
#[ignore = "needs root, cgroup v1 blkio, loop devices and containerd: run ./scripts/test.sh"]
fn cri_run_weights_pod_cgroups_and_leaves_nothing() {
    if !require("cri_run_weights_pod_cgroups_and_leaves_nothing", &cri_run_needs()) {
        return;
    }
    let _machine = testbed::exclusive();
    let kubepods_before = kubepods_dirs();
    let containerd = Containerd::start();
    let work = tempfile::tempdir_in("/var/tmp").expect("work dir");
    let out = work.path().join("out");
    let child = Command::new(BIN)
        .args(["run", "--disk", "loop", "--runtime", "cri", "--cri-socket"])
        .arg(containerd.socket())
        .arg("--work-dir")
        .arg(work.path())
        .arg("--out")
        .arg(&out)
        // No starvation boost during the run, so the background's weight in dDiskQoS blocks is a demoted one.
        .args(["--bg-size-mib", "64", "--sample-interval", "20ms", "--gap", "20ms", "--boost-after", "1h"])
        .args(["--modes", "strict", "--sizes", "1,2", "--reps", "2", "--no-exp2"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the bench");
    let pid = child.id();
    let output = wait_with_deadline(child, Duration::from_secs(120));
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "bench failed\nstdout:\n{stdout}\nstderr:\n{stderr}");

    // Nothing of the run is left: no pod in containerd, no pod cgroup or kubepods level it made, no loop device,
    // mount or work directory.
    let mut cri = containerd.cri();
    assert_eq!(cri.sandbox_ids().expect("ListPodSandbox"), Vec::<String>::new(), "pods left in containerd");
    assert_eq!(kubepods_dirs(), kubepods_before, "kubepods cgroups left behind");
    assert_eq!(leftovers(pid, work.path()), Vec::<String>::new(), "the run left things behind");

    let json: Value = serde_json::from_str(&std::fs::read_to_string(out.join("results.json")).expect("results.json"))
        .expect("valid JSON");
    let meta = &json["meta"];
    assert_eq!(meta["runtime"], "cri");
    assert!(meta["runtime_reason"].as_str().is_some_and(|r| r.contains("containerd")), "{meta}");
    assert!(meta["cgroup_layout"].as_str().is_some_and(|l| l.contains("kubepods/burstable")), "{meta}");
    // The agent as the binary assembles it for `runtime = "cri"` (named so since the assembly moved to
    // `qos_agent::agent`).
    assert!(meta["agent"].as_str().is_some_and(|a| a.contains("AgentBuilder::assemble, runtime cri")), "{meta}");
    let mode = &json["modes"][0];
    let mut readers = std::collections::HashSet::new();
    let mut dq_bg = Vec::new();
    for row in mode["exp1"].as_array().expect("exp1") {
        let size = row["size_mib"].as_u64().unwrap() << 20;
        for v in row["variants"].as_array().expect("variants") {
            let variant = v["variant"].as_str().unwrap();
            let samples = v["samples"].as_array().unwrap();
            assert_eq!(samples.len(), 2, "{variant}: {row}");
            for s in samples {
                assert_eq!(s["bytes"].as_u64(), Some(size), "{s}");
                // The pod cgroup's recursive counter: the kernel charged the pod for what its reader read.
                assert!(s["charged_bytes"].as_u64().unwrap_or(0) >= size, "pod not charged: {s}");
                // Every read a new pod (its uid is the agent's id of it).
                assert!(readers.insert(s["id"].as_str().unwrap().to_string()), "pod reused: {s}");
                // Read back from the pod cgroups' weight files: a new pod at the agent's top weight before its
                // first I/O and the background's pod demoted in dDiskQoS blocks; nothing written in the others.
                let (reader, bg) = (s["weight"]["weight"].as_u64().unwrap(), s["bg_weight"].as_u64().unwrap());
                if variant == "ddiskqos" {
                    assert_eq!(reader, 1000, "{s}");
                    assert!(bg < 1000, "background pod not demoted: {s}");
                    dq_bg.push(bg);
                } else {
                    assert_eq!((reader, bg), (100, 100), "{variant}: {s}");
                }
            }
        }
    }
    assert_eq!(readers.len(), 2 * 2 * 3);
    assert_eq!(dq_bg.len(), 4);
    let agent = &mode["agent"];
    assert_eq!(agent["metrics"]["write_failures"].as_u64(), Some(0), "{agent}");
    assert_eq!(agent["metrics"]["runtime_outages"].as_u64(), Some(0), "{agent}");
    assert_eq!(agent["restore_failures"].as_u64(), Some(0), "{agent}");
    assert!(agent["metrics"]["decisions"]["demoted"].as_u64().unwrap_or(0) >= 1, "{agent}");
    // The daemon found the pods itself through CRI: the 12 reader pods and the background entered as new.
    assert!(agent["metrics"]["decisions"]["new"].as_u64().unwrap_or(0) > 2 * 2 * 3, "{agent}");
}

#[test]
#[ignore = "needs root, cgroup v1 blkio, loop devices and containerd: run ./scripts/test.sh"]
fn interrupted_cri_run_removes_its_pods() {
    if !require("interrupted_cri_run_removes_its_pods", &cri_run_needs()) {
        return;
    }
    let _machine = testbed::exclusive();
    let kubepods_before = kubepods_dirs();
    let containerd = Containerd::start();
    let work = tempfile::tempdir_in("/var/tmp").expect("work dir");
    let child = Command::new(BIN)
        .args(["run", "--disk", "loop", "--runtime", "cri", "--cri-socket"])
        .arg(containerd.socket())
        .arg("--work-dir")
        .arg(work.path())
        .arg("--out")
        .arg(work.path().join("out"))
        // Six 1000 MiB reads (a second or more each): it is surely measuring when interrupted.
        .args(["--bg-size-mib", "64", "--modes", "strict", "--sizes", "1000", "--reps", "2", "--no-exp2"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the bench");
    let pid = child.id();
    // Wait until the six reader pods and the background pod run, then a little longer, then Ctrl-C.
    let mut cri = containerd.cri();
    let start = std::time::Instant::now();
    while cri.sandbox_ids().map_or(0, |ids| ids.len()) < 7 {
        assert!(start.elapsed() < Duration::from_secs(60), "the run never started its pods");
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_secs(2));
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), nix::sys::signal::SIGINT).expect("SIGINT");
    let output = wait_with_deadline(child, Duration::from_secs(60));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(130), "stderr: {stderr}");
    assert_eq!(cri.sandbox_ids().expect("ListPodSandbox"), Vec::<String>::new(), "Ctrl-C left pods; {stderr}");
    assert_eq!(kubepods_dirs(), kubepods_before, "Ctrl-C left kubepods cgroups; stderr: {stderr}");
    assert_eq!(leftovers(pid, work.path()), Vec::<String>::new(), "Ctrl-C left things behind");
}
