//! The attacks of issue 12, replayed against the real agent binary: a metrics flood by an unprivileged user, two
//! agents on one state file, a container that moves its process into another cgroup, a read-only state directory,
//! a symlink planted where the state file is written, and a status client that reads nothing. Each checks that no
//! cgroup is left at a wrong weight after a clean stop. Needs root, cgroup v1 blkio, a BFQ loop device, and for
//! some the host's dockerd with the test image (`#[ignore]`d; see `testbed::require`). Containers run with
//! `--network none`: nothing here needs a network, and the tests then do not depend on Docker's bridge.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use testbed::agent::Agent;
use testbed::blkio::{bfq_weight, CgroupGuard};
use testbed::docker::{cgroup as docker_cgroup, Containers, IMAGE};
use testbed::loopdev::LoopDevice;
use testbed::probe::{cpu_stat_secs, free_port};
use testbed::process::{wait_for, ChildGuard};
use testbed::{require, Need};

use crate::AGENT;

/// A cgroup-dir agent over the children of `parent`, with its state file at `state` (or `{dir}/state.json`).
fn cgroup_dir_config(parent: &str, disk: &str, state: Option<&Path>) -> String {
    let state = state.map_or("{dir}/state.json".to_string(), |p| p.display().to_string());
    format!(
        r#"
runtime = "cgroup-dir"
sample_interval = "100ms"
state_file = "{state}"
control_socket = "{{dir}}/agent.sock"
[cgroup]
parent = "{parent}"
[devices]
protect = "off"
check = [{disk}]
[mlfq]
boost_after = "60s"
idle_promote_after = "off"
"#
    )
}

/// Reads `mib` MiB of `dev` with direct I/O from inside the blkio cgroup `dir`, and waits.
fn read_in(dir: &Path, dev: &str, mib: u32, skip: u32) {
    testbed::blkio::run_in_cgroup(dir, &format!("dd if={dev} of=/dev/null bs=1M count={mib} skip={skip} iflag=direct"));
}

fn weight(dir: &Path) -> u32 {
    bfq_weight(dir).unwrap_or_else(|| panic!("no weight in {}", dir.display()))
}

fn wait_weight(dir: &Path, pred: impl Fn(u32) -> bool, limit: Duration) -> Option<u32> {
    wait_for(limit, Duration::from_millis(10), || bfq_weight(dir).filter(|w| pred(*w)))
}

/// Open descriptors of a process.
fn fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map(|d| d.count()).unwrap_or(0)
}

/// `sh` as user nobody (uid 65534), group nogroup, no supplementary groups.
fn as_nobody(script: &str) -> Child {
    Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "bash", "-c", script])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("setpriv")
}

/// A read-only bind mount of a directory over itself, undone on drop.
struct ReadOnly(PathBuf);

impl ReadOnly {
    fn new(dir: &Path) -> Self {
        let run = |args: &[&str]| {
            let st = Command::new("mount").args(args).arg(dir).arg(dir).status().unwrap();
            assert!(st.success(), "mount {args:?} {}", dir.display());
        };
        run(&["--bind"]);
        let guard = Self(dir.to_path_buf());
        run(&["-o", "remount,bind,ro"]);
        guard
    }
}

impl Drop for ReadOnly {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

#[test]
#[ignore = "needs root, cgroup v1 blkio, a BFQ loop device, setpriv and the host's dockerd: run ./scripts/test.sh"]
fn metrics_flood_by_nobody_neither_stops_management_nor_restores() {
    let needs = [Need::Root, Need::BlkioV1, Need::LoopDevices, Need::Bfq, Need::HostDocker, Need::Program("setpriv")];
    if !require("metrics_flood_by_nobody_neither_stops_management_nor_restores", &needs) {
        return;
    }
    let _machine = testbed::exclusive();
    let disk = LoopDevice::with_bfq(512);
    let dev = disk.dev_str().to_string();
    let mut cs = Containers::default();
    let before: Vec<String> = (0..5).map(|_| cs.run(&["--network", "none", IMAGE, "sleep", "300"])).collect();
    for id in &before {
        assert_eq!(bfq_weight(&docker_cgroup(id)), Some(100));
    }
    let port = free_port();
    let mut agent = Agent::start(
        AGENT,
        &format!(
            r#"
sample_interval = "100ms"
actuator = "cgroupfs"
state_file = "{{dir}}/state.json"
control_socket = "{{dir}}/agent.sock"
[devices]
protect = "off"
check = ["{}"]
[metrics]
enabled = true
listen = "127.0.0.1:{port}"
[mlfq]
boost_after = "60s"
idle_promote_after = "off"
"#,
            disk.name
        ),
    );
    let pid = agent.pid();
    for id in &before {
        assert!(
            wait_weight(&docker_cgroup(id), |w| w == 1000, Duration::from_secs(5)).is_some(),
            "{}",
            agent.log_text()
        );
    }
    let fds_before = fds(pid);

    // nobody opens 1,100 connections and holds them; another nobody process reconnects in a loop meanwhile.
    let held = ChildGuard(as_nobody(&format!(
        "ulimit -n 4096; n=0; for i in $(seq 1100); do exec {{fd}}<>/dev/tcp/127.0.0.1/{port} 2>/dev/null && n=$((n+1)); \
         done; echo $n; sleep 120"
    )));
    let churn = ChildGuard(as_nobody(&format!(
        "ulimit -n 4096; while :; do exec 3<>/dev/tcp/127.0.0.1/{port} 2>/dev/null; exec 3>&- ; done"
    )));
    let mut held = held;
    let mut line = String::new();
    {
        // The count comes once every connect returned.
        let mut out = held.0.stdout.take().unwrap();
        let mut buf = [0u8; 16];
        let t = Instant::now();
        while !line.ends_with('\n') && t.elapsed() < Duration::from_secs(60) {
            let n = out.read(&mut buf).unwrap();
            if n == 0 {
                break;
            }
            line.push_str(&String::from_utf8_lossy(&buf[..n]));
        }
    }
    let connected: usize = line.trim().parse().unwrap_or_else(|_| panic!("flooder said {line:?}"));
    let flooder_fds = fds(held.0.id());
    eprintln!("flood: {connected} of 1100 connects succeeded; the flooder holds {flooder_fds} descriptors");
    assert!(connected >= 1000, "the flood did not happen: {connected} connections");

    // CPU over 10 s of flood, from /proc/<pid>/stat.
    let cpu0 = cpu_stat_secs(pid);
    let t0 = Instant::now();
    // A container started during the flood that reads 120 MiB is demoted to the bottom (past 2 + 8 + 32 MiB: 10).
    let reader = cs.run(&[
        "--network",
        "none",
        "--device",
        &dev,
        IMAGE,
        "sh",
        "-c",
        &format!("dd if={dev} of=/dev/null bs=1M count=120 iflag=direct; sleep 300"),
    ]);
    let demoted = wait_weight(&docker_cgroup(&reader), |w| w == 10, Duration::from_secs(8));
    let agent_fds = fds(pid);
    std::thread::sleep(Duration::from_secs(10).saturating_sub(t0.elapsed()));
    let cpu = (cpu_stat_secs(pid) - cpu0) / t0.elapsed().as_secs_f64() * 100.0;
    eprintln!(
        "agent during the flood: {cpu:.2} % of a core over {:.1} s; {agent_fds} descriptors (before: {fds_before})",
        t0.elapsed().as_secs_f64()
    );
    assert_eq!(demoted, Some(10), "container started during the flood not demoted; log:\n{}", agent.log_text());
    assert!(cpu < 5.0, "agent CPU {cpu:.2} % of a core under the flood");
    assert!(agent_fds < fds_before + 64 + 16 + 8, "the flood took descriptors: {agent_fds} (before {fds_before})");

    // SIGTERM during the flood: every original back.
    let code = agent.stop();
    drop(churn);
    drop(held);
    let log = agent.log_text();
    assert!(code.success(), "exit {code:?}\n{log}");
    for id in before.iter().chain([&reader]) {
        assert_eq!(bfq_weight(&docker_cgroup(id)), Some(100), "{} not restored\n{log}", &id[..12]);
    }
    assert!(!log.contains("using the Docker stats API"), "counters fell back to the stats API:\n{log}");
    assert!(!log.contains("cannot restore"), "{log}");
    assert!(log.contains("too many connections"), "the refusals were not logged:\n{log}");
}

#[test]
#[ignore = "needs root, cgroup v1 blkio and a BFQ loop device: run ./scripts/test.sh"]
fn a_second_agent_on_the_same_state_file_is_refused_and_sigkill_strands_nothing() {
    let needs = [Need::Root, Need::BlkioV1, Need::LoopDevices, Need::Bfq];
    if !require("a_second_agent_on_the_same_state_file_is_refused_and_sigkill_strands_nothing", &needs) {
        return;
    }
    let _machine = testbed::exclusive();
    let disk = LoopDevice::with_bfq(256);
    let parent = CgroupGuard::new("ddiskqos-two");
    let cgs: Vec<PathBuf> = ["a", "b", "c"].iter().map(|c| parent.child(c)).collect();
    let shared = tempfile::tempdir().unwrap();
    let state = shared.path().join("state.json");
    let cfg = cgroup_dir_config(&parent.rel, &format!("\"{}\"", disk.name), Some(&state));
    let first = Agent::start(AGENT, &cfg);
    for c in &cgs {
        assert!(wait_weight(c, |w| w == 1000, Duration::from_secs(5)).is_some(), "{}", first.log_text());
    }
    read_in(&cgs[0], disk.dev_str(), 12, 0);
    assert!(wait_weight(&cgs[0], |w| w == 40, Duration::from_secs(3)).is_some(), "{}", first.log_text());

    // The second agent, same state file and same socket: refused at once, naming the first one's pid.
    let second_cfg = first.dir.path().join("second.toml");
    std::fs::write(&second_cfg, cfg.replace("{dir}", &first.dir.path().display().to_string())).unwrap();
    let t = Instant::now();
    let out = Command::new(AGENT).arg("-c").arg(&second_cfg).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    eprintln!(
        "second agent: exit {:?} after {:?}: {}",
        out.status.code(),
        t.elapsed(),
        err.lines().last().unwrap_or("")
    );
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains(&format!("in use by another agent (pid {})", first.pid())), "{err}");
    assert!(first.status().is_some(), "the first agent's socket was taken over");
    assert_eq!(weight(&cgs[0]), 40, "the second agent touched a weight");

    // SIGKILL the first; a new agent on the file restores at its clean stop.
    let mut first = first;
    first.signal(nix::sys::signal::Signal::SIGKILL);
    let _ = first.wait(Duration::from_secs(5));
    assert_eq!(weight(&cgs[0]), 40, "left behind by SIGKILL");
    let mut again = Agent::start(AGENT, &cfg);
    std::thread::sleep(Duration::from_millis(500));
    let code = again.stop();
    assert!(code.success(), "{}", again.log_text());
    for c in &cgs {
        assert_eq!(weight(c), 100, "{} at a wrong weight\n{}", c.display(), again.log_text());
    }
    let left = std::fs::read_to_string(&state).unwrap();
    assert!(!left.contains("\"a\""), "state file still owes: {left}");
}

#[test]
#[ignore = "needs root, cgroup v1 blkio and the host's dockerd: run ./scripts/test.sh"]
fn a_container_that_moves_its_process_into_another_cgroup_is_refused() {
    let needs = [Need::Root, Need::BlkioV1, Need::HostDocker];
    if !require("a_container_that_moves_its_process_into_another_cgroup_is_refused", &needs) {
        return;
    }
    let _machine = testbed::exclusive();
    let victim = CgroupGuard::new("ddiskqos-victim");
    std::fs::write(victim.path.join("blkio.bfq.weight"), "300").unwrap();
    let mut cs = Containers::default(); // dropped before `victim`: the moved processes go first
    let mover = |cs: &mut Containers| {
        cs.run(&[
            "--network",
            "none",
            "-v",
            "/sys/fs/cgroup/blkio:/host-blkio",
            IMAGE,
            "sh",
            "-c",
            &format!("echo $$ > /host-blkio/{}/cgroup.procs && sleep 300", victim.rel),
        ])
    };
    let early = mover(&mut cs);
    let moved = wait_for(Duration::from_secs(5), Duration::from_millis(20), || {
        let procs = std::fs::read_to_string(victim.path.join("cgroup.procs")).unwrap_or_default();
        (!procs.trim().is_empty()).then_some(())
    });
    assert!(moved.is_some(), "the container did not manage to move itself");

    let mut agent = Agent::start(
        AGENT,
        "sample_interval = \"100ms\"\nactuator = \"cgroupfs\"\nstate_file = \"{dir}/state.json\"\n\
         control_socket = \"{dir}/agent.sock\"\n[devices]\ncheck = []\n",
    );
    // And one that moves itself while the agent runs.
    let late = mover(&mut cs);
    let normal = cs.run(&["--network", "none", IMAGE, "sleep", "300"]);
    assert!(
        wait_weight(&docker_cgroup(&normal), |w| w == 1000, Duration::from_secs(5)).is_some(),
        "{}",
        agent.log_text()
    );
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(weight(&victim.path), 300, "the victim's weight was changed\n{}", agent.log_text());
    let status = agent.status().unwrap();
    let init = testbed::docker::cli(&["inspect", "-f", "{{.State.Pid}}", &early]);
    let seen = std::fs::read_to_string(format!("/proc/{init}/cgroup")).unwrap_or_default();
    let blkio_line = seen.lines().find(|l| l.contains(":blkio:")).unwrap_or("").to_string();
    eprintln!("the moved container's init ({init}) as the host sees it: {blkio_line}");
    assert!(
        !status.contains(&early[..12]),
        "a moved container is managed:\n{status}\ninit {init}: {blkio_line}\n{}",
        agent.log_text()
    );
    let log = agent.log_text();
    assert!(log.contains("outside the one Docker made for it") && log.contains(&early[..12]), "{log}");
    let code = agent.stop();
    assert!(code.success());
    assert_eq!(weight(&victim.path), 300, "victim's weight after stop");
    assert_eq!(weight(&docker_cgroup(&normal)), 100);
    let _ = late;
}

#[test]
#[ignore = "needs root, cgroup v1 blkio and a BFQ loop device: run ./scripts/test.sh"]
fn a_read_only_state_directory_stops_weight_changes_and_strands_nothing() {
    let needs = [Need::Root, Need::BlkioV1, Need::LoopDevices, Need::Bfq, Need::Program("mount")];
    if !require("a_read_only_state_directory_stops_weight_changes_and_strands_nothing", &needs) {
        return;
    }
    let _machine = testbed::exclusive();
    let disk = LoopDevice::with_bfq(256);
    let parent = CgroupGuard::new("ddiskqos-rostate");
    let a = parent.child("a");
    let b = parent.child("b");
    let shared = tempfile::tempdir().unwrap();
    let state_dir = shared.path().join("state");
    std::fs::create_dir(&state_dir).unwrap();
    let state = state_dir.join("state.json");
    let cfg = cgroup_dir_config(&parent.rel, &format!("\"{}\"", disk.name), Some(&state));
    let mut agent = Agent::start(AGENT, &cfg);
    read_in(&a, disk.dev_str(), 12, 0);
    assert!(wait_weight(&a, |w| w == 40, Duration::from_secs(3)).is_some(), "{}", agent.log_text());
    assert_eq!(weight(&b), 1000);

    // The state directory turns read-only: a new cgroup's original cannot be saved.
    let ro = ReadOnly::new(&state_dir);
    let c = parent.child("c");
    let back = wait_weight(&a, |w| w == 100, Duration::from_secs(3));
    std::thread::sleep(Duration::from_millis(500));
    let log = agent.log_text();
    assert_eq!(weight(&c), 100, "written without a saved original\n{log}");
    assert_eq!(back, Some(100), "what the agent changed is not put back\n{log}");
    assert_eq!(weight(&b), 100);
    read_in(&b, disk.dev_str(), 12, 100);
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!((weight(&b), weight(&c)), (100, 100), "weights changed while the state cannot be saved");
    let log = agent.log_text();
    assert_eq!(log.matches("cannot save the state file").count(), 1, "said once:\n{log}");

    // SIGKILL, restart on the still read-only directory, clean stop: nothing stranded.
    agent.signal(nix::sys::signal::Signal::SIGKILL);
    let _ = agent.wait(Duration::from_secs(5));
    let mut again = Agent::start(AGENT, &cfg);
    std::thread::sleep(Duration::from_millis(800));
    let code = again.stop();
    let log = again.log_text();
    assert!(code.success(), "{log}");
    for dir in [&a, &b, &c] {
        assert_eq!(weight(dir), 100, "{} stranded\n{log}", dir.display());
    }
    drop(ro);
    // Writable again: an agent manages again, and its clean stop leaves nothing owed.
    let mut last = Agent::start(AGENT, &cfg);
    assert!(wait_weight(&c, |w| w == 1000, Duration::from_secs(5)).is_some(), "{}", last.log_text());
    assert!(last.stop().success());
    for dir in [&a, &b, &c] {
        assert_eq!(weight(dir), 100, "{} stranded", dir.display());
    }
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&state).unwrap()).unwrap();
    assert_eq!(v["originals"], serde_json::json!({}));
}

#[test]
#[ignore = "needs root, cgroup v1 blkio and a BFQ loop device: run ./scripts/test.sh"]
fn a_symlink_planted_in_a_shared_state_directory_is_never_followed() {
    let needs = [Need::Root, Need::BlkioV1, Need::LoopDevices, Need::Bfq];
    if !require("a_symlink_planted_in_a_shared_state_directory_is_never_followed", &needs) {
        return;
    }
    let _machine = testbed::exclusive();
    use std::os::unix::fs::PermissionsExt;
    let disk = LoopDevice::with_bfq(256);
    let parent = CgroupGuard::new("ddiskqos-symlink");
    let a = parent.child("a");
    // A shared, world-writable directory (like /tmp), and a root file a local user wants overwritten.
    let shared = tempfile::tempdir().unwrap();
    std::fs::set_permissions(shared.path(), std::fs::Permissions::from_mode(0o1777)).unwrap();
    let private = tempfile::tempdir().unwrap();
    let precious = private.path().join("precious");
    std::fs::write(&precious, "root's data\n").unwrap();
    std::fs::set_permissions(&precious, std::fs::Permissions::from_mode(0o600)).unwrap();
    let state = shared.path().join("state.json");
    let cfg = cgroup_dir_config(&parent.rel, &format!("\"{}\"", disk.name), Some(&state));
    let mut agent = Agent::start(AGENT, &cfg);
    assert!(wait_weight(&a, |w| w == 1000, Duration::from_secs(5)).is_some());
    // nobody plants symlinks at the temporary names the next saves would use, and at the old fixed name.
    let pid = agent.pid();
    let mut names: Vec<String> = (0..4).map(|n| format!(".state.json.{pid}.{n}.tmp")).collect();
    names.push("state.json.tmp".into());
    let plant = names
        .iter()
        .map(|n| format!("ln -s {} {}/{n}", precious.display(), shared.path().display()))
        .collect::<Vec<_>>()
        .join(" && ");
    let st = as_nobody(&plant).wait().unwrap();
    assert!(st.success(), "planting failed");
    let b = parent.child("b");
    assert!(wait_weight(&b, |w| w == 1000, Duration::from_secs(5)).is_some(), "{}", agent.log_text());
    let code = agent.stop();
    assert!(code.success(), "{}", agent.log_text());
    assert_eq!(std::fs::read_to_string(&precious).unwrap(), "root's data\n", "the planted symlink was followed");
    for n in &names {
        assert!(std::fs::symlink_metadata(shared.path().join(n)).unwrap().file_type().is_symlink());
    }
    let meta = std::fs::symlink_metadata(&state).unwrap();
    assert!(meta.file_type().is_file() && meta.permissions().mode() & 0o777 == 0o600);
    assert_eq!((weight(&a), weight(&b)), (100, 100));
}

#[test]
#[ignore = "needs root and cgroup v1 blkio: run ./scripts/test.sh"]
fn a_status_client_that_reads_nothing_delays_no_other() {
    if !require("a_status_client_that_reads_nothing_delays_no_other", &[Need::Root, Need::BlkioV1]) {
        return;
    }
    let _machine = testbed::exclusive();
    // Enough long-named cgroups that the status answer (about 1 MB of JSON) far exceeds a socket buffer.
    let parent = CgroupGuard::new("ddiskqos-idle");
    for i in 0..1500 {
        parent.child(&format!("{i:04}-{}", "n".repeat(200)));
    }
    let mut agent = Agent::start(AGENT, &cgroup_dir_config(&parent.rel, "", None));
    let idle = std::os::unix::net::UnixStream::connect(agent.socket()).unwrap(); // reads nothing
    std::thread::sleep(Duration::from_millis(300));
    let t = Instant::now();
    let status = agent.status().expect("a second status answers");
    let took = t.elapsed();
    eprintln!("status with an idle client connected: {} bytes in {took:?}", status.len());
    assert!(status.lines().count() > 1500, "{} lines", status.lines().count());
    assert!(took < Duration::from_secs(3), "status took {took:?}");
    drop(idle);
    assert!(agent.stop().success());
}
