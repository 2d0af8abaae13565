//! Protection by default (`[devices] protect = "auto"`, the embedded default) on the kernel, cgroup v1: a managed
//! loop device whose scheduler is `none` is switched to BFQ and given the short slots at start (logged with old
//! and new values, read back in `status` and the metrics), and put back exactly on SIGTERM; `opt_out` leaves it
//! alone; after a SIGKILL `ddiskqos-agent devices restore` puts the first originals back, or the next agent does at
//! its stop (the scheduler the killed agent switched included). Needs root, cgroup v1 blkio and a loop device of
//! its own (`#[ignore]`d; see `testbed::require`). A few seconds.
//!
//! Never points the agent at the machine's own disks: only at the loop device it creates.

use std::path::Path;
use std::process::Command;

use testbed::agent::Agent;
use testbed::blkio::CgroupGuard;
use testbed::loopdev::LoopDevice;
use testbed::{require, Need};

use crate::AGENT;

fn read(dev: &str, file: &str) -> String {
    std::fs::read_to_string(Path::new("/sys/block").join(dev).join("queue").join(file)).unwrap().trim().into()
}

fn active_scheduler(dev: &str) -> String {
    let text = read(dev, "scheduler");
    text.split_whitespace()
        .find_map(|w| w.strip_prefix('[').and_then(|w| w.strip_suffix(']')))
        .unwrap_or(text.as_str())
        .to_string()
}

fn select(dev: &str, scheduler: &str) {
    std::fs::write(Path::new("/sys/block").join(dev).join("queue/scheduler"), scheduler).unwrap();
    assert_eq!(active_scheduler(dev), scheduler);
}

/// Puts the loop device's `rotational` flag back however the test ends (the test sets it to stand for a virtual
/// disk that reports it rotates).
struct FlagOnDrop(String, String);

impl Drop for FlagOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::write(Path::new("/sys/block").join(&self.0).join("queue/rotational"), &self.1);
    }
}

/// Leaves the loop device's queue with `none` however the test ends (a detached loop device keeps its queue).
struct NoneOnDrop(String);

impl Drop for NoneOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::write(Path::new("/sys/block").join(&self.0).join("queue/scheduler"), "none");
    }
}

#[test]
#[ignore = "needs root, cgroup v1 blkio and a loop device: run ./scripts/test.sh"]
fn protection_by_default_switches_tunes_reports_and_puts_back_a_managed_device() {
    if !require(
        "protection_by_default_switches_tunes_reports_and_puts_back_a_managed_device",
        &[Need::Root, Need::BlkioV1, Need::LoopDevices, Need::Bfq],
    ) {
        return;
    }
    let _machine = testbed::exclusive();
    let disk = LoopDevice::with_bfq(64);
    let dev = disk.name.clone();
    let _none = NoneOnDrop(dev.clone());
    select(&dev, "none");
    let parent = CgroupGuard::new("ddiskqos-protect");
    let port = testbed::probe::free_port();
    // The embedded defaults but for what a test must set: no `protect` line, so this is the shipped default.
    let config = format!(
        r#"
runtime = "cgroup-dir"
sample_interval = "100ms"
state_file = "{{dir}}/state.json"
control_socket = "{{dir}}/agent.sock"
[cgroup]
parent = "{rel}"
[devices]
check = ["{dev}"]
[metrics]
enabled = true
listen = "127.0.0.1:{port}"
"#,
        rel = parent.rel
    );

    // check-config says what protection will do, and changes nothing.
    let cfg_file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(cfg_file.path(), config.replace("{dir}", "/run/ddiskqos-protect-test")).unwrap();
    let out = Command::new(AGENT).arg("check-config").arg(cfg_file.path()).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        stdout.contains(&format!("at start: {dev}: scheduler none -> bfq, then BFQ with nr_requests=4")),
        "{stdout}"
    );
    assert_eq!(active_scheduler(&dev), "none", "check-config wrote");

    // What BFQ's queue depth is on this device when BFQ is selected anew (the original protection records).
    select(&dev, "bfq");
    let depth0 = read(&dev, "nr_requests");
    select(&dev, "none");
    // Its largest request as found: capped at 128 KiB where it is bigger (a loop device: 1280), else left.
    let size0 = read(&dev, "max_sectors_kb");
    let capped = size0.parse::<u32>().unwrap() > 128;
    let size_set = if capped { "128" } else { size0.as_str() };
    // Its slots: shortened to 32 ms where the device reports it does not rotate, or reports it does and answers a
    // lone read in under 2 ms (a loop device over a sparse file answers in microseconds; this machine's loop
    // devices report they rotate, as its virtio root disk does).
    let rotates = read(&dev, "rotational") != "0";
    // Start: switched to bfq, the queue made shallow and the slots short, each change logged with old and new
    // value; BFQ's other tunables left as they are.
    let mut agent = Agent::start(AGENT, &config);
    assert_eq!(active_scheduler(&dev), "bfq");
    assert_eq!(read(&dev, "nr_requests"), "4");
    assert_eq!(read(&dev, "max_sectors_kb"), size_set);
    assert_eq!(read(&dev, "iosched/timeout_sync"), "32", "rotational {rotates}: {}", agent.log_text());
    for (key, value) in [("strict_guarantees", "0"), ("max_budget", "0")] {
        assert_eq!(read(&dev, &format!("iosched/{key}")), value, "{key} left as BFQ has it");
    }
    let log = testbed::probe::strip_ansi(&agent.log_text());
    for (key, old, new) in [("scheduler", "none", "bfq"), ("nr_requests", depth0.as_str(), "4")] {
        assert!(
            log.lines().any(|l| l.contains("protect: set device setting")
                && l.contains(&format!("setting={key}"))
                && l.contains(&format!("old={old}"))
                && l.contains(&format!("new={new}"))),
            "{key}: {log}"
        );
    }
    // Read back in status and metrics.
    let status = agent.status().unwrap();
    assert!(status.contains("DEVICE SETTINGS"), "{status}");
    let row =
        |setting: &str| status.lines().find(|l| l.contains(&dev) && l.contains(setting)).unwrap_or("").to_string();
    assert!(
        row("nr_requests").split_whitespace().collect::<Vec<_>>().ends_with(&[depth0.as_str(), "4", "4", "protect"]),
        "{status}"
    );
    assert!(
        row("scheduler").split_whitespace().collect::<Vec<_>>().ends_with(&["none", "bfq", "bfq", "protect"]),
        "{status}"
    );
    assert!(
        row("timeout_sync").split_whitespace().collect::<Vec<_>>().ends_with(&["124", "32", "32", "protect"]),
        "{status}"
    );
    assert!(
        !capped
            || row("max_sectors_kb").split_whitespace().collect::<Vec<_>>().ends_with(&[
                size0.as_str(),
                "128",
                "128",
                "protect"
            ]),
        "{status}"
    );
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let (code, metrics) = testbed::probe::http_get(addr, "/metrics").expect("metrics answer");
    assert_eq!(code, 200);
    assert!(
        metrics.contains(&format!("ddiskqos_device_setting{{device=\"{dev}\",setting=\"nr_requests\"}} 4")),
        "{metrics}"
    );
    assert!(
        metrics.contains(&format!("ddiskqos_device_setting_as_set{{device=\"{dev}\",setting=\"scheduler\"}} 1")),
        "{metrics}"
    );
    // Someone changes a setting behind the agent's back: status and metrics say so.
    std::fs::write(Path::new("/sys/block").join(&dev).join("queue/nr_requests"), "20").unwrap();
    let status = agent.status().unwrap();
    assert!(status.contains("20 (CHANGED)"), "{status}");
    let (_, metrics) = testbed::probe::http_get(addr, "/metrics").unwrap();
    assert!(
        metrics.contains(&format!("ddiskqos_device_setting_as_set{{device=\"{dev}\",setting=\"nr_requests\"}} 0")),
        "{metrics}"
    );
    let originals = agent.dir.path().join("state.json.bfq-tunables.json");
    assert!(originals.exists());
    // SIGTERM: every setting back, the scheduler last (none again), the originals file gone.
    assert!(agent.stop().success(), "{}", agent.log_text());
    assert_eq!(active_scheduler(&dev), "none");
    assert_eq!(read(&dev, "max_sectors_kb"), size0, "the request size put back");
    assert!(!originals.exists(), "originals file left after a clean stop");
    let log = testbed::probe::strip_ansi(&agent.log_text());
    assert!(log.contains("restored device setting"), "{log}");

    // A device that reports it rotates, as many virtual disks do whatever backs them (virtio-blk: this machine's
    // own root disk reads 1): check-config says it is measured at start; the agent measures its lone reads, and
    // this loop device (a sparse file, direct I/O) answers in well under 2 ms, so it gets the short slots too.
    // The log says what was measured; status reads the slot back; stop puts it back.
    let flag0 = read(&dev, "rotational");
    let flag_back = FlagOnDrop(dev.clone(), flag0.clone());
    std::fs::write(Path::new("/sys/block").join(&dev).join("queue/rotational"), "1").unwrap();
    assert_eq!(read(&dev, "rotational"), "1");
    let out = Command::new(AGENT).arg("check-config").arg(cfg_file.path()).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("it reports it rotates: its lone reads are measured at start"), "{stdout}");
    assert!(!stdout.contains("timeout_sync=32"), "check-config measures nothing: {stdout}");
    let mut agent = Agent::start(AGENT, &config);
    assert_eq!(read(&dev, "iosched/timeout_sync"), "32", "{}", agent.log_text());
    let log = testbed::probe::strip_ansi(&agent.log_text());
    let line = log.lines().find(|l| l.contains("measured a device that reports it rotates")).unwrap_or_else(|| {
        panic!("no measurement logged: {log}");
    });
    let us: u64 = line
        .split_whitespace()
        .find_map(|w| w.strip_prefix("lone_read_us="))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no lone_read_us in {line:?}"));
    assert!(us < 2_000, "{line}");
    assert!(log.contains(&format!("a lone read took {us} µs (no moving heads): short slots")), "{log}");
    let status = agent.status().unwrap();
    let row = status.lines().find(|l| l.contains(&dev) && l.contains("timeout_sync")).unwrap_or("");
    assert!(row.split_whitespace().collect::<Vec<_>>().ends_with(&["124", "32", "32", "protect"]), "{status}");
    assert!(agent.stop().success(), "{}", agent.log_text());
    assert_eq!(active_scheduler(&dev), "none");
    drop(flag_back);
    assert_eq!(read(&dev, "rotational"), flag0, "the flag put back");

    // One line opts the device out: nothing changed, and status says why.
    select(&dev, "bfq");
    assert_eq!(read(&dev, "nr_requests"), depth0);
    let opted = config.replace(&format!("check = [\"{dev}\"]"), &format!("check = [\"{dev}\"]\nopt_out = [\"{dev}\"]"));
    let mut agent = Agent::start(AGENT, &opted);
    assert_eq!(read(&dev, "nr_requests"), depth0, "opted out, yet changed");
    let status = agent.status().unwrap();
    assert!(status.contains("left as it is: opted out ([devices] opt_out)"), "{status}");
    assert!(agent.stop().success());

    // SIGKILL: the settings stay; uninstalling, `devices restore` puts the first originals back.
    let mut killed = Agent::start(AGENT, &config);
    assert_eq!(read(&dev, "nr_requests"), "4");
    let state = killed.state_file();
    let cfg = killed.dir.path().join("agent.toml");
    killed.signal(nix::sys::signal::Signal::SIGKILL);
    let _ = killed.wait(std::time::Duration::from_secs(5));
    assert_eq!(read(&dev, "nr_requests"), "4", "nothing restores after SIGKILL");
    let out = Command::new(AGENT)
        .arg("-c")
        .arg(&cfg)
        .args(["devices", "restore", "--state-file"])
        .arg(&state)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    let count = 2 + usize::from(capped);
    assert!(stdout.contains(&format!("{count} of {count} device setting(s) put back")), "{stdout}");
    assert_eq!(read(&dev, "nr_requests"), depth0);
    assert_eq!(read(&dev, "max_sectors_kb"), size0);
    assert_eq!(read(&dev, "iosched/timeout_sync"), "124", "the slot put back");
    drop(killed);

    // SIGKILL of an agent that switched the scheduler: the next agent on its state file finds bfq (so plans no
    // switch), adopts the killed agent's original scheduler, and puts it back at its own stop.
    select(&dev, "none");
    let mut killed = Agent::start(AGENT, &config);
    assert_eq!(active_scheduler(&dev), "bfq");
    let dir = killed.dir.path().to_path_buf();
    killed.signal(nix::sys::signal::Signal::SIGKILL);
    let _ = killed.wait(std::time::Duration::from_secs(5));
    assert_eq!(active_scheduler(&dev), "bfq", "nothing restores after SIGKILL");
    let config2 = config.replace("{dir}/state.json", &dir.join("state.json").display().to_string());
    let mut next = Agent::start(AGENT, &config2);
    let log = testbed::probe::strip_ansi(&next.log_text());
    assert!(log.lines().any(|l| l.contains("did not stop cleanly") && l.contains("setting=scheduler")), "{log}");
    assert!(next.stop().success(), "{}", next.log_text());
    assert_eq!(active_scheduler(&dev), "none", "the first original scheduler is back");
    assert!(!dir.join("state.json.bfq-tunables.json").exists());
    drop(killed);
}
