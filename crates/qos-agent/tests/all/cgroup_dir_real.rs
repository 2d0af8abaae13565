//! The same scenario as `docker_real.rs` without Docker: the agent's cgroup-dir runtime manages the child
//! cgroups of a blkio cgroup the test creates, with reader processes placed in them, on a BFQ loop device.
//! Needs root, cgroup v1 blkio and a loop device (`#[ignore]`d; see `testbed::require`).

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use testbed::agent::Agent;
use testbed::blkio::{bfq_weight, record_weights, CgroupGuard};
use testbed::loopdev::LoopDevice;
use testbed::process::wait_for;
use testbed::{require, Need};

use crate::AGENT;

/// A blkio cgroup tree made by the test; processes killed and directories removed on drop.
struct TestCgroups {
    parent: CgroupGuard,
    procs: Vec<Child>,
}

impl TestCgroups {
    fn new() -> Self {
        Self { parent: CgroupGuard::new("ddiskqos-plain"), procs: Vec::new() }
    }

    fn child(&self, name: &str) -> PathBuf {
        self.parent.child(name)
    }

    /// Runs `script` inside cgroup `dir` (the shell joins it before exec'ing the work).
    fn spawn_in(&mut self, dir: &Path, script: &str) {
        let procs = dir.join("cgroup.procs");
        let child = Command::new("sh")
            .arg("-c")
            .arg(format!("echo $$ > {} && exec {script}", procs.display()))
            .spawn()
            .unwrap();
        self.procs.push(child);
    }
}

impl Drop for TestCgroups {
    fn drop(&mut self) {
        // The processes first; the cgroups are removed after this, when `parent` drops.
        for p in &mut self.procs {
            let _ = p.kill();
            let _ = p.wait();
        }
    }
}

#[test]
#[ignore = "needs root, cgroup v1 blkio and a BFQ loop device: run ./scripts/test.sh"]
fn agent_manages_child_cgroups() {
    if !require("agent_manages_child_cgroups", &[Need::Root, Need::BlkioV1, Need::LoopDevices, Need::Bfq]) {
        return;
    }
    let _machine = testbed::exclusive();
    let disk = LoopDevice::with_bfq(1024);
    let dev = disk.dev_str();
    let mut cgs = TestCgroups::new();
    let rel = cgs.parent.rel.clone();

    // A cgroup that exists before the agent, with a weight someone set: adopted at the top, restored at the end.
    let pre = cgs.child("pre");
    std::fs::write(pre.join("blkio.bfq.weight"), "250").unwrap();

    let mut agent = Agent::start(
        AGENT,
        &format!(
            r#"
runtime = "cgroup-dir"
sample_interval = "100ms"
state_file = "{{dir}}/state.json"
control_socket = "{{dir}}/agent.sock"
[cgroup]
parent = "{rel}"
[devices]
protect = "off"
check = ["{}"]
[mlfq]
boost_after = "3s"
idle_promote_after = "off"
"#,
            disk.name
        ),
    );
    assert!(
        wait_for(Duration::from_secs(3), Duration::from_millis(10), || (bfq_weight(&pre) == Some(1000)).then_some(()))
            .is_some(),
        "adopted cgroup not at the top; log:\n{}",
        agent.log_text()
    );

    // The big reader, throttled to 30 MB/s by a blkio throttle rule so every level shows in the weight file.
    let reader = cgs.child("reader");
    let devnum = std::fs::read_to_string(format!("/sys/block/{}/dev", disk.name)).unwrap();
    std::fs::write(reader.join("blkio.throttle.read_bps_device"), format!("{} {}", devnum.trim(), 30 << 20)).unwrap();
    cgs.spawn_in(&reader, &format!("dd if={dev} of=/dev/null bs=1M count=900 iflag=direct"));
    let reader_dir = reader.clone();
    let recorder =
        std::thread::spawn(move || record_weights(&reader_dir, Duration::from_secs(7), Duration::from_millis(10)));

    // The event path: a cgroup created while the reader runs gets 1000 within 100 ms (inotify, no tick).
    std::thread::sleep(Duration::from_millis(1500));
    let created = Instant::now();
    let late = cgs.child("late");
    let got = wait_for(Duration::from_secs(5), Duration::from_millis(1), || {
        (bfq_weight(&late) == Some(1000)).then(|| created.elapsed())
    })
    .expect("new cgroup never reached the top weight");
    eprintln!("mkdir -> weight 1000: {:.1} ms", got.as_secs_f64() * 1e3);
    assert!(got < Duration::from_millis(100), "new cgroup got the top weight after {got:?}");

    let seen = recorder.join().unwrap();
    eprintln!("reader weight trajectory: {seen:?}");
    let mut it = seen.iter().map(|(_, w)| *w);
    assert!([1000, 200, 40, 10].iter().all(|w| it.any(|x| x == *w)), "not demoted level by level: {seen:?}");
    let left_top = seen.iter().find(|(_, w)| *w != 1000 && *w != 100).map(|(t, _)| *t).expect("left the top");
    let bottom = seen.iter().position(|(_, w)| *w == 10).expect("reached the bottom");
    let boosted = seen[bottom..].iter().find(|(_, w)| *w == 1000).map(|(t, _)| *t).expect("boosted");
    let after = (boosted - left_top).as_secs_f64();
    assert!((2.8..=3.6).contains(&after), "boost {after:.2} s after leaving the top (boost_after = 3 s)");

    let status = agent.status().expect("status");
    assert!(status.contains("actuator: files") && status.contains("reader") && status.contains("late"), "{status}");

    // A removed cgroup disappears from the table.
    std::fs::remove_dir(&late).unwrap();
    let gone = wait_for(Duration::from_secs(3), Duration::from_millis(20), || {
        agent.status().filter(|s| !s.contains("late")).map(|_| ())
    });
    assert!(gone.is_some(), "removed cgroup still listed:\n{:?}", agent.status());

    let code = agent.stop();
    assert!(code.success(), "agent exit status {code:?}\n{}", agent.log_text());
    assert_eq!(bfq_weight(&pre), Some(250), "pre-existing cgroup not restored");
    assert_eq!(bfq_weight(&reader), Some(100), "reader not restored");
}
