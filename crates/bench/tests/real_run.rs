//! A short real run against the kernel: loop device, BFQ, blkio cgroups, the shipped agent's daemon writing real
//! weights. It checks that the report is complete and consistent, that the weights the bench read back are the
//! agent's, and that everything set up is gone afterwards, never how fast anything is. Needs root, cgroup v1 blkio
//! and loop devices, so the tests are ignored by default (`./scripts/test.sh` runs them with `--include-ignored`);
//! where they cannot run they print `SKIPPED <test>: <reason>` and pass, except in CI (`CI=true` or
//! `DDISKQOS_REQUIRE_REAL=1`), where they fail.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use base64::Engine as _;
use hdrhistogram::serialization::Deserializer;
use hdrhistogram::Histogram;
use qos_agent::priority::SessionGroup;
use serde_json::Value;
use testbed::{require, Need};

const BIN: &str = env!("CARGO_BIN_EXE_ddiskqos-bench");

#[path = "real_run/cri.rs"]
mod cri;

/// What a real run on cgroup v1 needs: root, blkio, a BFQ loop device, an ext4 file system on it.
const V1_RUN: [Need; 6] =
    [Need::Root, Need::BlkioV1, Need::LoopDevices, Need::Bfq, Need::Program("mkfs.ext4"), Need::Program("mount")];

/// Waits for the child with a deadline; kills it (SIGINT first, so it cleans up) if it overstays.
fn wait_with_deadline(mut child: Child, deadline: Duration) -> Output {
    let start = Instant::now();
    loop {
        if child.try_wait().expect("wait").is_some() {
            return child.wait_with_output().expect("output");
        }
        if start.elapsed() > deadline {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), nix::sys::signal::SIGINT);
            std::thread::sleep(Duration::from_secs(5));
            let _ = child.kill();
            let out = child.wait_with_output().expect("output");
            panic!(
                "run exceeded {deadline:?}\nstdout:\n{}\nstderr:\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Everything a run with this pid could have left behind (its cgroups under the v1 blkio root).
fn leftovers(pid: u32, work: &Path) -> Vec<String> {
    leftovers_in(pid, work, Path::new("/sys/fs/cgroup/blkio"))
}

/// Everything a run with this pid could have left behind, its cgroups looked for under `cgroup_root`.
fn leftovers_in(pid: u32, work: &Path, cgroup_root: &Path) -> Vec<String> {
    let tag = format!("ddiskqos-bench-{pid}");
    let mut left = Vec::new();
    for entry in std::fs::read_dir(cgroup_root).expect("cgroup root").flatten() {
        if entry.file_name().to_string_lossy().starts_with(&tag) {
            left.push(format!("cgroup {}", entry.path().display()));
        }
    }
    let loops = Command::new("losetup").arg("-a").output().expect("losetup -a");
    for line in String::from_utf8_lossy(&loops.stdout).lines().filter(|l| l.contains(&tag)) {
        left.push(format!("loop device {line}"));
    }
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
    for line in mounts.lines().filter(|l| l.contains(&tag)) {
        left.push(format!("mount {line}"));
    }
    let dir = work.join(&tag);
    if dir.exists() {
        left.push(format!("work dir {}", dir.display()));
    }
    for base in ["/run", "/dev/shm"] {
        let run_dir = Path::new(base).join(&tag);
        if run_dir.exists() {
            left.push(format!("agent state dir {}", run_dir.display()));
        }
    }
    left
}

fn histogram(b64: &str) -> Histogram<u64> {
    let bytes = base64::engine::general_purpose::STANDARD.decode(b64).expect("base64");
    Deserializer::new().deserialize(&mut bytes.as_slice()).expect("hdrhistogram V2")
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1.0)
}

fn bench(work: &Path, out: &Path, extra: &[&str]) -> Command {
    let mut cmd = Command::new(BIN);
    // The sparse-file loop device these tests were written for (their needs); the default throttled disk has its
    // own test (throttled_disk.rs).
    cmd.args(["run", "--disk", "loop", "--runtime", "cgroup", "--work-dir"])
        .arg(work)
        .arg("--out")
        .arg(out)
        .args(["--bg-size-mib", "64", "--sample-interval", "20ms", "--gap", "20ms"])
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

#[test]
#[ignore = "needs root, cgroup v1 blkio and a loop device: run ./scripts/test.sh"]
fn short_real_run_report_is_complete_and_consistent() {
    if !require("short_real_run_report_is_complete_and_consistent", &V1_RUN) {
        return;
    }
    // One real run at a time in this binary (the CRI tests' too): they share the machine's two cores and its disk.
    let _machine = testbed::exclusive();
    let work = tempfile::tempdir_in("/var/tmp").expect("work dir");
    let out: PathBuf = work.path().join("out");
    let child = bench(
        work.path(),
        &out,
        // No starvation boost during the run, so the background's weight in dDiskQoS blocks is the bottom one.
        &[
            "--modes",
            "strict",
            "--sizes",
            "1,2",
            "--reps",
            "2",
            "--exp2-reps",
            "1",
            "--exp2-time-scale",
            "0.1",
            "--boost-after",
            "1h",
        ],
    )
    .spawn()
    .expect("start the bench");
    let pid = child.id();
    let output = wait_with_deadline(child, Duration::from_secs(100));
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "bench failed\nstdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(stdout.contains("Experiment 1 (paper Table 3)") && stdout.contains("Experiment 2"), "{stdout}");
    assert!(stdout.contains("BFQ strict_guarantees=1"), "{stdout}");
    assert_eq!(leftovers(pid, work.path()), Vec::<String>::new(), "the run left things behind");

    let json: Value = serde_json::from_str(&std::fs::read_to_string(out.join("results.json")).expect("results.json"))
        .expect("valid JSON");
    assert_eq!(json["meta"]["runtime"], "cgroup");
    assert!(json["meta"]["agent"].as_str().is_some_and(|b| b.contains("Daemon")), "{}", json["meta"]["agent"]);
    assert!(json["meta"]["kernel"].as_str().is_some_and(|k| !k.is_empty()));
    assert!(json["meta"]["disk"]["dev"].as_str().is_some_and(|d| d.starts_with("/dev/loop")));
    let modes = json["modes"].as_array().expect("modes");
    assert_eq!(modes.len(), 1);
    let mode = &modes[0];
    assert_eq!(mode["mode"], "strict");
    assert_eq!(mode["iosched"]["strict_guarantees"], "1");
    assert!(mode["iosched"]["scheduler"].as_str().is_some_and(|s| s.contains("[bfq]")));

    let mut dq_bg_weights = Vec::new();
    let exp1 = mode["exp1"].as_array().expect("exp1");
    let exp2 = mode["exp2"].as_array().expect("exp2");
    assert_eq!(exp1.iter().map(|r| r["label"].as_str().unwrap()).collect::<Vec<_>>(), ["1MiB", "2MiB"]);
    assert_eq!(exp2.len(), 5, "the paper's four readers plus the 64 MB one");
    for (row, reps) in exp1.iter().map(|r| (r, 2)).chain(exp2.iter().map(|r| (r, 1))) {
        let label = row["label"].as_str().unwrap();
        let variants = row["variants"].as_array().expect("variants");
        let names: Vec<&str> = variants.iter().map(|v| v["variant"].as_str().unwrap()).collect();
        assert_eq!(names, ["alone", "original", "ddiskqos"], "{label}");
        let mut means = std::collections::HashMap::new();
        for v in variants {
            let h = histogram(v["histogram_v2_base64"].as_str().unwrap());
            let s = &v["summary"];
            assert_eq!(h.len(), reps, "{label}: histogram count");
            assert_eq!(s["n"].as_u64(), Some(reps), "{label}");
            assert_eq!(v["samples"].as_array().unwrap().len() as u64, reps, "{label}");
            assert!(close(s["mean_ms"].as_f64().unwrap(), h.mean() / 1e3), "{label}: mean is the histogram's");
            assert!(close(s["p99_ms"].as_f64().unwrap(), h.value_at_quantile(0.99) as f64 / 1e3), "{label}: p99");
            assert!(close(s["max_ms"].as_f64().unwrap(), h.max() as f64 / 1e3), "{label}: max");
            let size = row["size_mib"].as_u64().unwrap() << 20;
            let variant = v["variant"].as_str().unwrap();
            for sample in v["samples"].as_array().unwrap() {
                assert_eq!(sample["bytes"].as_u64(), Some(size), "{label}: whole file read");
                // The kernel charged the reader's own cgroup: weights can act on it.
                assert!(sample["charged_bytes"].as_u64().unwrap_or(0) >= size, "{label}: {sample}");
                // Weights as the bench read them from the cgroup files: the agent's top weight for a new reader
                // in dDiskQoS blocks (awaited before its first I/O), the background below it; in the dry-run
                // blocks nothing written (BFQ's default 100) and the background's original restored.
                let reader = sample["weight"]["weight"].as_u64().expect("reader's weight read back");
                let bg = sample["bg_weight"].as_u64().expect("background's weight read back");
                if variant == "ddiskqos" {
                    assert_eq!(reader, 1000, "{label}: {sample}");
                    assert!(bg < 1000, "{label}: background at the top in a dDiskQoS block: {sample}");
                    dq_bg_weights.push(bg);
                } else {
                    assert_eq!((reader, bg), (100, 100), "{label} {variant}: {sample}");
                    assert_eq!(sample["weight"]["waited_ms"].as_f64(), Some(0.0), "{label}: {sample}");
                }
            }
            means.insert(v["variant"].as_str().unwrap().to_string(), h.mean());
        }
        let r = row["ddiskqos_over_original"]["mean"].as_f64().expect("ratio present");
        assert!(close(r, means["ddiskqos"] / means["original"]), "{label}: dDiskQoS/Original from histograms");
        let r = row["ddiskqos_over_alone"]["mean"].as_f64().expect("ratio present");
        assert!(close(r, means["ddiskqos"] / means["alone"]), "{label}: dDiskQoS/Alone from histograms");
    }
    let blocks = &mode["background_blocks"];
    assert!(blocks["original"]["mib_per_s"].as_f64().unwrap() > 0.0, "background ran in Original blocks");
    assert!(blocks["ddiskqos"]["mib_per_s"].as_f64().unwrap() > 0.0, "background ran in dDiskQoS blocks");

    assert!(!dq_bg_weights.is_empty());

    // The shipped daemon ran: it wrote and verified weights without a failure, demoted the background, gave the new
    // readers the top weight, and restored every original it changed.
    let agent = &mode["agent"];
    let metrics = &agent["metrics"];
    assert_eq!(metrics["write_failures"].as_u64(), Some(0), "{agent}");
    assert_eq!(metrics["sample_failures"].as_u64(), Some(0), "{agent}");
    assert_eq!(agent["restore_failures"].as_u64(), Some(0), "{agent}");
    assert!(metrics["rounds"].as_u64().unwrap() > 0, "{agent}");
    assert!(metrics["decisions"]["demoted"].as_u64().unwrap_or(0) >= 1, "{agent}");
    // At least the dDiskQoS blocks' readers (2 x 2 reads + 5 readers, each awaited) and the background entered at
    // the top as new containers.
    assert!(metrics["decisions"]["new"].as_u64().unwrap_or(0) > 2 * 2 + 5, "{agent}");
    let switches = agent["switches"].as_array().expect("switches");
    assert!(switches.iter().any(|s| s["dry_run"] == false) && switches.iter().any(|s| s["dry_run"] == true));
    assert!(out.join("report.txt").exists());

    // The report command re-reads the JSON and checks it (every case, summaries, ratios) with the bench's own code.
    let again = Command::new(BIN).arg("report").arg(out.join("results.json")).output().expect("report");
    assert!(again.status.success(), "report: {}", String::from_utf8_lossy(&again.stderr));
}

#[test]
#[ignore = "needs root, cgroup v1 blkio and a loop device: run ./scripts/test.sh"]
fn interrupted_run_cleans_up() {
    if !require("interrupted_run_cleans_up", &V1_RUN) {
        return;
    }
    // One real run at a time in this binary (the CRI tests' too): they share the machine's two cores and its disk.
    let _machine = testbed::exclusive();
    let work = tempfile::tempdir_in("/var/tmp").expect("work dir");
    let out = work.path().join("out");
    // The bench shares this test's session: it gives the session's scheduling group the agent's nice value for the
    // run (where the kernel groups sessions), and must put it back however it ends.
    let group_before = session_group();
    let child = bench(
        work.path(),
        &out,
        &["--modes", "strict", "--sizes", "1", "--reps", "500", "--no-exp2", "--cpu-hogs", "2", "--agent-nice", "-7"],
    )
    .spawn()
    .expect("start the bench");
    let pid = child.id();
    // Wait until it is measuring (its cgroups exist), then Ctrl-C.
    let start = Instant::now();
    while leftovers(pid, work.path()).iter().filter(|l| l.starts_with("cgroup")).count() == 0 {
        assert!(start.elapsed() < Duration::from_secs(60), "the run never started measuring");
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(500));
    // A session's own group takes the agent's value; the kernel's root group (a test run by a PID 1 that never
    // made a session: CI's runner) and a kernel without session groups have none to take, and stay as they are.
    let during = match group_before {
        SessionGroup::Nice(_) => SessionGroup::Nice(-7),
        other => other,
    };
    assert_eq!(session_group(), during, "the session's group during the run (before: {group_before:?})");
    let hogs = busy_processes(pid);
    assert_eq!(hogs.len(), 2, "--cpu-hogs 2: two busy processes, each leading its own session: {hogs:?}");
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), nix::sys::signal::SIGINT).expect("SIGINT");
    let output = wait_with_deadline(child, Duration::from_secs(60));
    assert_eq!(output.status.code(), Some(130), "stderr: {}", String::from_utf8_lossy(&output.stderr));
    assert_eq!(leftovers(pid, work.path()), Vec::<String>::new(), "Ctrl-C left things behind");
    assert_eq!(session_group(), group_before, "the session's group is back as it was");
    let start = Instant::now();
    while hogs.iter().any(|h| Path::new(&format!("/proc/{h}")).exists()) {
        assert!(start.elapsed() < Duration::from_secs(5), "busy processes left running: {hogs:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// This process's session group (`/proc/self/autogroup`), where the kernel groups sessions.
fn session_group() -> SessionGroup {
    qos_agent::priority::session_group().expect("the kernel's autogroup interface")
}

/// The children of `pid` that are busy processes (`ddiskqos-bench spin`), each asserted to lead its own session.
fn busy_processes(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(p) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        let Ok(cmdline) = std::fs::read_to_string(format!("/proc/{p}/cmdline")) else { continue };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{p}/stat")) else { continue };
        // State, ppid, pgrp, session.
        let fields = testbed::probe::stat_fields(&stat);
        if cmdline.split('\0').nth(1) == Some("spin") && fields.get(1) == Some(&pid.to_string().as_str()) {
            assert_eq!(fields.get(3), Some(&p.to_string().as_str()), "busy process {p} leads its session: {stat}");
            out.push(p);
        }
    }
    out
}

/// The main job's path: readers are real containers in Docker's default layout that read as soon as they start;
/// the agent (the shipped Docker backends) finds them by their cgroups' creation, and the bench records its
/// reaction per reader. Checks that every dDiskQoS reader got the top weight while it read (or says it finished
/// first), that the reaction is recorded and reported, that the per-repetition ratios are there, and that no
/// container, image or loop device is left. Never how fast anything is.
#[test]
#[ignore = "needs root, cgroup v1 blkio, a loop device and the host's dockerd: run ./scripts/test.sh"]
fn docker_readers_read_at_once_and_the_agents_reaction_is_recorded() {
    let needs = [V1_RUN.as_slice(), &[Need::HostDocker]].concat();
    if !require("docker_readers_read_at_once_and_the_agents_reaction_is_recorded", &needs) {
        return;
    }
    let _machine = testbed::exclusive();
    let work = tempfile::tempdir_in("/var/tmp").expect("work dir");
    let out: PathBuf = work.path().join("out");
    let mut cmd = Command::new(BIN);
    cmd.args(["run", "--disk", "loop", "--runtime", "docker", "--work-dir"])
        .arg(work.path())
        .arg("--out")
        .arg(&out)
        .args(["--bg-size-mib", "64", "--gap", "20ms", "--modes", "strict", "--sizes", "1,4", "--reps", "3"])
        .args(["--no-exp2", "--boost-after", "1h"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let child = cmd.spawn().expect("start the bench");
    let pid = child.id();
    let output = wait_with_deadline(child, Duration::from_secs(240));
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "bench failed\nstdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(stdout.contains("nested (Docker's default layout: docker/<id>)"), "{stdout}");
    assert!(stdout.contains("agent reaction (reader's cgroup created -> top weight in its file"), "{stdout}");
    assert!(stdout.contains("dDQ/Orig median [min - max]"), "{stdout}");
    let json: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("results.json")).expect("results.json")).unwrap();
    assert_eq!(json["meta"]["runtime"], "docker");
    assert!(json["meta"]["cgroup_layout"].as_str().is_some_and(|l| l.starts_with("nested")), "{}", json["meta"]);
    let mode = &json["modes"][0];
    let mut awaited = 0;
    for row in mode["exp1"].as_array().unwrap() {
        let label = row["label"].as_str().unwrap();
        let spread = &row["reps_over_original"];
        assert_eq!(spread["n"].as_u64(), Some(3), "{label}: one ratio per repetition: {spread}");
        assert!(spread["min"].as_f64().unwrap() <= spread["median"].as_f64().unwrap(), "{label}: {spread}");
        assert!(spread["median"].as_f64().unwrap() <= spread["max"].as_f64().unwrap(), "{label}: {spread}");
        for v in row["variants"].as_array().unwrap() {
            let variant = v["variant"].as_str().unwrap();
            for sample in v["samples"].as_array().unwrap() {
                let id = sample["id"].as_str().unwrap();
                assert_eq!(id.len(), 64, "{label} {variant}: a container id: {sample}");
                let w = &sample["weight"];
                if variant == "ddiskqos" {
                    awaited += 1;
                    let reached = w["reached"].as_bool().expect("awaited");
                    let waited = w["waited_ms"].as_f64().unwrap();
                    assert!((0.0..5000.0).contains(&waited), "{label}: reaction {waited} ms: {sample}");
                    if reached {
                        assert_eq!(w["weight"].as_u64(), Some(1000), "{label}: {sample}");
                        assert!(w["bytes_before"].as_u64().is_some(), "{label}: bytes read by then: {sample}");
                    } else {
                        // The reader finished before the weight came: then it never read at the top weight.
                        assert_ne!(w["weight"].as_u64(), Some(1000), "{label}: {sample}");
                    }
                } else {
                    // Alone and Original: the agent is in dry run; the reader's weight is Docker's default.
                    assert_eq!(w["weight"].as_u64(), Some(100), "{label} {variant}: {sample}");
                    assert!(w["reached"].is_null(), "{label} {variant}: not awaited: {sample}");
                }
            }
        }
    }
    assert_eq!(awaited, 2 * 3, "two sizes, three repetitions of dDiskQoS");
    let agent = &mode["agent"];
    assert_eq!(agent["metrics"]["write_failures"].as_u64(), Some(0), "{agent}");
    assert_eq!(agent["restore_failures"].as_u64(), Some(0), "{agent}");
    let left = std::process::Command::new("docker")
        .args(["ps", "-aq", "--filter", &format!("label=ddiskqos-bench={pid}")])
        .output()
        .expect("docker ps");
    assert!(left.stdout.trim_ascii().is_empty(), "containers left: {}", String::from_utf8_lossy(&left.stdout));
    assert_eq!(leftovers(pid, work.path()), Vec::<String>::new(), "the run left things behind");
}

/// The bench on cgroup v2, run by `scripts/test.sh` inside `scripts/cgroup-v2.sh run --dockerd` (the main pass
/// skips `v2_real::`).
mod v2_real {
    use super::*;

    /// The v2 root of the test bed.
    const V2: &str = "/sys/fs/cgroup";

    /// A tiny run in mode `iocost-kernel` with the cgroup runtime: the weights read back come from `io.weight`
    /// (the file that acts under io.cost), new readers read the top weight there before their first I/O, the
    /// background is below it, Alone and Original blocks read the default, io.cost was on during the mode and is
    /// off again afterwards, and nothing is left behind.
    #[test]
    #[ignore = "needs the cgroup-v2 test bed: run ./scripts/test.sh"]
    fn iocost_run_reads_io_weight_and_cleans_up() {
        let test = "v2_real::iocost_run_reads_io_weight_and_cleans_up";
        if !require(test, &[Need::Root, Need::V2TestBed, Need::LoopDevices, Need::Program("mkfs.ext4")]) {
            return;
        }
        let _machine = testbed::exclusive();
        let work = tempfile::tempdir_in("/var/tmp").expect("work dir");
        let out: PathBuf = work.path().join("out");
        let child = bench(
            work.path(),
            &out,
            &["--modes", "iocost-kernel", "--sizes", "1,2", "--reps", "2", "--no-exp2", "--boost-after", "1h"],
        )
        .spawn()
        .expect("start the bench");
        let pid = child.id();
        let output = wait_with_deadline(child, testbed::process::patience(Duration::from_secs(100)));
        let stdout = String::from_utf8_lossy(&output.stdout);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(output.status.success(), "bench failed\nstdout:\n{stdout}\nstderr:\n{stderr}");
        assert!(stdout.contains("io.cost.qos:"), "{stdout}");
        assert_eq!(leftovers_in(pid, work.path(), Path::new(V2)), Vec::<String>::new(), "the run left things behind");

        let json: Value =
            serde_json::from_str(&std::fs::read_to_string(out.join("results.json")).expect("results.json"))
                .expect("valid JSON");
        assert!(json["meta"]["cgroup"].as_str().is_some_and(|c| c.starts_with("v2 ")), "{}", json["meta"]["cgroup"]);
        let maj_min = json["meta"]["disk"]["maj_min"].as_str().expect("maj_min").to_string();
        let mode = &json["modes"][0];
        assert_eq!(mode["mode"], "iocost-kernel");
        assert!(mode["iosched"]["scheduler"].as_str().is_some_and(|s| s.contains("[none]")), "{}", mode["iosched"]);
        let qos = mode["iocost"]["qos"].as_str().expect("io.cost.qos line read back");
        assert!(qos.starts_with(&format!("{maj_min} enable=1")), "{qos}");
        assert!(mode["iocost"]["model"].as_str().is_some_and(|m| m.contains("ctrl=auto")), "{}", mode["iocost"]);
        let file = mode["weight_file"].as_str().expect("weight_file");
        assert!(file.starts_with("io.weight") && file.contains(&maj_min), "{file}");

        let mut ddq = 0;
        for row in mode["exp1"].as_array().expect("exp1") {
            for v in row["variants"].as_array().expect("variants") {
                let variant = v["variant"].as_str().unwrap();
                for sample in v["samples"].as_array().unwrap() {
                    let reader = sample["weight"]["weight"].as_u64().expect("reader's weight read back");
                    let bg = sample["bg_weight"].as_u64().expect("background's weight read back");
                    let size = row["size_mib"].as_u64().unwrap() << 20;
                    assert!(sample["charged_bytes"].as_u64().unwrap_or(0) >= size, "io.stat charged: {sample}");
                    if variant == "ddiskqos" {
                        ddq += 1;
                        assert_eq!(reader, 1000, "io.weight of a new reader: {sample}");
                        assert!(bg < 1000, "background at the top in a dDiskQoS block: {sample}");
                    } else {
                        assert_eq!((reader, bg), (100, 100), "{variant}: {sample}");
                    }
                }
            }
        }
        assert_eq!(ddq, 4, "two sizes, two repetitions");
        let agent = &mode["agent"];
        assert_eq!(agent["metrics"]["write_failures"].as_u64(), Some(0), "{agent}");
        assert_eq!(agent["restore_failures"].as_u64(), Some(0), "{agent}");
        assert!(agent["metrics"]["decisions"]["demoted"].as_u64().unwrap_or(0) >= 1, "{agent}");

        // io.cost is off again for the device (its line gone with the detached loop device, or enable=0).
        let qos_now = std::fs::read_to_string(Path::new(V2).join("io.cost.qos")).expect("io.cost.qos");
        let line = qos_now.lines().find(|l| l.split_whitespace().next() == Some(maj_min.as_str()));
        assert!(line.is_none_or(|l| l.contains("enable=0")), "io.cost left on: {line:?}");
    }
}
