//! `[devices] bfq_tunables` on the kernel: the agent sets the tunables of a BFQ loop device at start, logs the old
//! and new values, puts them back on SIGTERM, and after a SIGKILL the next agent puts back the first originals.
//! Needs root, cgroup v1 blkio and a loop device (`#[ignore]`d; see `testbed::require`). A few seconds.

use std::path::Path;
use std::process::Command;

use testbed::agent::Agent;
use testbed::blkio::CgroupGuard;
use testbed::loopdev::LoopDevice;
use testbed::{require, Need};

use crate::AGENT;

fn tunable(dev: &str, key: &str) -> String {
    std::fs::read_to_string(Path::new("/sys/block").join(dev).join("queue/iosched").join(key)).unwrap().trim().into()
}

/// Puts a device's tunables back however the test ends: a loop device keeps its queue (scheduler and tunables)
/// after it is detached, so a value left here would be the next user's of `loopN`.
struct Restore {
    dev: String,
    originals: Vec<(&'static str, String)>,
}

impl Drop for Restore {
    fn drop(&mut self) {
        for (key, value) in &self.originals {
            let path = Path::new("/sys/block").join(&self.dev).join("queue/iosched").join(key);
            if std::fs::read_to_string(&path).map(|v| v.trim() != value).unwrap_or(false) {
                let _ = std::fs::write(&path, value);
            }
        }
    }
}

#[test]
#[ignore = "needs root, cgroup v1 blkio and a BFQ loop device: run ./scripts/test.sh"]
fn agent_sets_and_restores_bfq_tunables() {
    if !require("agent_sets_and_restores_bfq_tunables", &[Need::Root, Need::BlkioV1, Need::LoopDevices, Need::Bfq]) {
        return;
    }
    let _machine = testbed::exclusive();
    let disk = LoopDevice::with_bfq(64);
    let dev = disk.name.as_str();
    let (budget0, timeout0) = (tunable(dev, "max_budget"), tunable(dev, "timeout_sync"));
    let _restore = Restore {
        dev: dev.to_string(),
        originals: vec![("max_budget", budget0.clone()), ("timeout_sync", timeout0.clone())],
    };
    assert_ne!(budget0, "256", "the test needs a device not already at the value it sets");
    assert_ne!(timeout0, "8");
    let parent = CgroupGuard::new("ddiskqos-tunables");
    let config = format!(
        r#"
runtime = "cgroup-dir"
state_file = "{{dir}}/state.json"
control_socket = "{{dir}}/agent.sock"
[cgroup]
parent = "{rel}"
[devices]
check = ["{dev}"]
bfq_tunables = {{ {dev} = {{ max_budget = 256, timeout_sync = "8" }} }}
"#,
        rel = parent.rel
    );

    // check-config says what the agent will change, and changes nothing.
    let cfg_file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(cfg_file.path(), config.replace("{dir}", "/run/ddiskqos-tunables-test")).unwrap();
    let out = Command::new(AGENT).arg("check-config").arg(cfg_file.path()).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains(&format!("at start: {dev}: BFQ max_budget {budget0} -> 256")), "{stdout}");
    assert!(stdout.contains(&format!("at start: {dev}: BFQ timeout_sync {timeout0} -> 8")), "{stdout}");
    assert_eq!(tunable(dev, "max_budget"), budget0, "check-config wrote");

    // Clean run: set at start, logged with old and new, restored on SIGTERM, originals file removed.
    let mut agent = Agent::start(AGENT, &config);
    assert_eq!((tunable(dev, "max_budget").as_str(), tunable(dev, "timeout_sync").as_str()), ("256", "8"));
    let log = testbed::probe::strip_ansi(&agent.log_text());
    assert!(
        log.lines().any(|l| l.contains("set BFQ tunable")
            && l.contains("max_budget")
            && l.contains(&format!("old={budget0}"))
            && l.contains("new=256")),
        "{log}"
    );
    let originals = agent.dir.path().join("state.json.bfq-tunables.json");
    assert!(originals.exists(), "originals not kept on disk while running");
    assert!(agent.stop().success(), "{}", agent.log_text());
    assert_eq!((tunable(dev, "max_budget"), tunable(dev, "timeout_sync")), (budget0.clone(), timeout0.clone()));
    assert!(!originals.exists(), "originals file left after a clean stop");

    // SIGKILL: the values stay; the next agent on the same state directory restores the first originals.
    let mut killed = Agent::start(AGENT, &config);
    let dir = killed.dir.path().to_path_buf();
    killed.signal(nix::sys::signal::Signal::SIGKILL);
    let _ = killed.wait(std::time::Duration::from_secs(5));
    assert_eq!(tunable(dev, "timeout_sync"), "8", "nothing restores after SIGKILL");
    let left = std::fs::read_to_string(dir.join("state.json.bfq-tunables.json")).unwrap();
    assert!(left.contains(&format!("\"{timeout0}\"")), "{left}");
    // The next agent: its own control socket, the killed agent's state file (and so its originals file).
    let config2 = config.replace("{dir}/state.json", &dir.join("state.json").display().to_string());
    let mut next = Agent::start(AGENT, &config2);
    assert_eq!(tunable(dev, "timeout_sync"), "8");
    assert!(next.stop().success(), "{}", next.log_text());
    assert_eq!((tunable(dev, "max_budget"), tunable(dev, "timeout_sync")), (budget0, timeout0));
    drop(killed);
}
