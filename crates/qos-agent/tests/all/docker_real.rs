//! The agent against a real dockerd, real cgroup v1 blkio files and a BFQ loop device: demotion level by level,
//! the event path (< 100 ms from start event to top weight), the starvation boost, labels (exclude, pin),
//! the `auto` actuator writing the files and never Docker's configuration, and SIGTERM restoring every original
//! weight.
//! Needs root, a loop device and the host's dockerd with the test image (scripts/setup-host.sh); `#[ignore]`d, see
//! `testbed::require`.

use std::time::Duration;

use testbed::agent::Agent;
use testbed::blkio::{bfq_weight, record_weights};
use testbed::docker::{cgroup as docker_cgroup, cli, Containers, StartTiming, IMAGE};
use testbed::loopdev::LoopDevice;
use testbed::process::wait_for;
use testbed::{require, Need};

use crate::AGENT;

fn config(dev: &str) -> String {
    format!(
        r#"
sample_interval = "100ms"
actuator = "auto"
state_file = "{{dir}}/state.json"
control_socket = "{{dir}}/agent.sock"
[devices]
protect = "off"
check = ["{dev}"]
[mlfq]
boost_after = "3s"
idle_promote_after = "off"
"#
    )
}

/// Index of `wanted` as a subsequence of `seen` values, or None.
fn subsequence(seen: &[(Duration, u32)], wanted: &[u32]) -> bool {
    let mut it = seen.iter().map(|(_, w)| *w);
    wanted.iter().all(|w| it.any(|x| x == *w))
}

#[test]
#[ignore = "needs root, cgroup v1 blkio, a BFQ loop device and the host's dockerd: run ./scripts/test.sh"]
fn agent_manages_real_docker_containers() {
    let needs = [Need::Root, Need::BlkioV1, Need::LoopDevices, Need::Bfq, Need::HostDocker];
    if !require("agent_manages_real_docker_containers", &needs) {
        return;
    }
    let _machine = testbed::exclusive();
    let disk = LoopDevice::with_bfq(1024);
    let dev = disk.dev_str().to_string();
    let mut cs = Containers::default();

    // A container running before the agent, with a weight someone set: adopted at the top, restored at the end.
    let pre = cs.run(&[IMAGE, "sleep", "120"]);
    std::fs::write(docker_cgroup(&pre).join("blkio.bfq.weight"), "250").unwrap();
    assert_eq!(bfq_weight(&docker_cgroup(&pre)), Some(250));

    let mut agent = Agent::start(AGENT, &config(&disk.name));
    let pre_top = wait_for(Duration::from_secs(3), Duration::from_millis(10), || {
        (bfq_weight(&docker_cgroup(&pre)) == Some(1000)).then_some(())
    });
    assert!(pre_top.is_some(), "adopted container not at the top; log:\n{}", agent.log_text());

    // Labelled containers: excluded is never touched, pinned stays at its pin, even while reading.
    let excl = cs.run(&[
        "--label",
        "ddiskqos.exclude=true",
        "--device",
        &dev,
        IMAGE,
        "sh",
        "-c",
        &format!("dd if={dev} of=/dev/null bs=1M count=60 iflag=direct; sleep 120"),
    ]);
    let pinned = cs.run(&[
        "--label",
        "ddiskqos.weight=300",
        "--device",
        &dev,
        IMAGE,
        "sh",
        "-c",
        &format!("dd if={dev} of=/dev/null bs=1M count=60 skip=100 iflag=direct; sleep 120"),
    ]);
    let bad_label = cs.run(&["--label", "ddiskqos.weight=5000", IMAGE, "sleep", "120"]);

    // The big reader, throttled to 30 MB/s so every level is visible in the weight file.
    let reader = cs.run(&[
        "--device",
        &dev,
        "--device-read-bps",
        &format!("{dev}:30mb"),
        IMAGE,
        "sh",
        "-c",
        &format!("dd if={dev} of=/dev/null bs=1M count=900 iflag=direct; sleep 120"),
    ]);
    let reader_dir = docker_cgroup(&reader);
    let recorder =
        std::thread::spawn(move || record_weights(&reader_dir, Duration::from_secs(7), Duration::from_millis(10)));

    // The event path: a container created now and started while the reader runs gets 1000 within 100 ms.
    std::thread::sleep(Duration::from_millis(1500));
    let late = cli(&["create", IMAGE, "sleep", "120"]);
    cs.0.push(late.clone());
    // When its cgroup appears (runc create), then when the top weight is in its file, against the start event.
    let timing = StartTiming::watch(&late, docker_cgroup(&late), |dir| bfq_weight(dir) == Some(1000));
    cli(&["start", &late]);
    let times = timing.finish().expect("late container never reached weight 1000");
    let (latency_ms, reaction_ms) = (times.after_start_event_ms(), times.reaction_ms());
    eprintln!(
        "late container: cgroup created -> weight 1000 in {reaction_ms:.1} ms; start event -> weight 1000: \
         {latency_ms:.1} ms (negative: before Docker reported the start)"
    );
    // Seen by its cgroup's creation (the agent watches Docker's cgroup parents), not by the start event, which
    // dockerd sends after the container's process has started.
    assert!(
        latency_ms < 0.0,
        "late container got the top weight {latency_ms:.1} ms after its start event, not before: \
         the cgroup watch did not announce it\n{}",
        agent.log_text()
    );

    let seen = recorder.join().unwrap();
    eprintln!("reader weight trajectory: {seen:?}");
    assert!(subsequence(&seen, &[1000, 200, 40, 10]), "not demoted level by level: {seen:?}\n{}", agent.log_text());
    // Boost: back to 1000 after leaving the top for boost_after (3 s), within a sampling interval plus slack.
    let left_top = seen.iter().find(|(_, w)| *w != 1000 && *w != 100).map(|(t, _)| *t).expect("left the top");
    let bottom = seen.iter().position(|(_, w)| *w == 10).expect("reached the bottom");
    let boosted = seen[bottom..].iter().find(|(_, w)| *w == 1000).map(|(t, _)| *t).expect("boost back to 1000");
    let after = (boosted - left_top).as_secs_f64();
    assert!((2.8..=3.6).contains(&after), "boost {after:.2} s after leaving the top (boost_after = 3 s): {seen:?}");

    assert_eq!(bfq_weight(&docker_cgroup(&excl)), Some(100), "excluded container was touched");
    assert_eq!(bfq_weight(&docker_cgroup(&pinned)), Some(300), "pinned container not at its pin");
    assert_eq!(bfq_weight(&docker_cgroup(&bad_label)), Some(1000), "bad label must fall back to managed");

    let log = agent.log_text();
    // `auto` writes the files and never asks Docker (issue 28, defect 3: `docker update` would persist the
    // agent's weight in the container's configuration, and a container restarted after an agent crash would come
    // back demoted).
    assert!(!log.contains("docker update"), "auto went through Docker's API:\n{log}");
    for id in [&reader, &late, &pinned] {
        let persisted = cli(&["inspect", "-f", "{{.HostConfig.BlkioWeight}}", id]);
        assert_eq!(persisted, "0", "container {}: Docker's BlkioWeight is not the container's own", &id[..12]);
    }
    assert!(log.contains("bad policy label") && log.contains("5000"), "bad label not reported:\n{log}");
    assert_eq!(log.matches("containers sit below a parent cgroup").count(), 1, "nested-layout advice once:\n{log}");
    let status = agent.status().expect("status");
    assert!(status.contains("actuator: files"), "{status}");
    assert!(status.contains(&reader[..12]) && status.contains("pinned") && status.contains("excluded"), "{status}");

    let code = agent.stop();
    assert!(code.success(), "agent exit status {code:?}\n{}", agent.log_text());
    for (id, want) in [(&pre, 250), (&reader, 100), (&late, 100), (&pinned, 100), (&excl, 100), (&bad_label, 100)] {
        assert_eq!(bfq_weight(&docker_cgroup(id)), Some(want), "container {} not restored", &id[..12]);
    }
    let state = std::fs::read_to_string(agent.state_file()).unwrap_or_default();
    assert!(!state.contains(&pre), "state file still lists restored containers: {state}");
}

/// The harness's own hygiene: a `docker run -d` whose start fails (the container is created, its command does not
/// exist) must not leave a `Created` container behind for later tests to trip over.
#[test]
#[ignore = "needs the host's dockerd with the test image: run ./scripts/test.sh"]
fn a_failed_docker_run_leaves_no_container() {
    if !require("a_failed_docker_run_leaves_no_container", &[Need::Root, Need::HostDocker]) {
        return;
    }
    let name = format!("ddq-failed-run-{}", std::process::id());
    let mut cs = Containers::default();
    let failed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        cs.run(&["--name", &name, IMAGE, "/no/such/command"]);
    }));
    assert!(failed.is_err(), "starting /no/such/command should fail");
    assert!(cs.0.is_empty(), "{:?}", cs.0);
    let left = cli(&["ps", "-aq", "--filter", &format!("name=^/{name}$")]);
    assert_eq!(left, "", "the container created by the failed run is still there");
}

/// Review finding of 2026-11-29: a stopped container created without `--blkio-weight` (its configuration holds 0:
/// the kernel's default applies) got its original back as `docker update --blkio-weight 100`, an explicit weight
/// Docker can never unset (0 in an update means "unchanged"); where Docker discards weights (no `blkio.weight`, as
/// on BFQ-only v1 kernels) that update left 0 and the restore failed its check every round. Now a configuration
/// without a weight is left so. Where this dockerd keeps weights, the other side too: one holding the agent's
/// weight gets the original, and an update with 0 would have left the agent's weight there.
#[test]
#[ignore = "needs the host's dockerd with the test image: run ./scripts/test.sh"]
fn docker_restore_of_a_stopped_container_leaves_an_unset_weight_unset() {
    use qos_agent::backend::AppliedVia;
    use qos_agent::runtime::docker::DockerApiWriter;
    use qos_core::{ContainerId, Weight};

    let needs = [Need::Root, Need::HostDocker];
    if !require("docker_restore_of_a_stopped_container_leaves_an_unset_weight_unset", &needs) {
        return;
    }
    let mut cs = Containers::default();
    let id = cli(&["create", IMAGE, "sleep", "1"]);
    cs.0.push(id.clone());
    let configured = || cli(&["inspect", "-f", "{{.HostConfig.BlkioWeight}}", &id]);
    assert_eq!(configured(), "0");
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let docker = bollard::Docker::connect_with_unix(testbed::docker::HOST_SOCKET, 30, bollard::API_DEFAULT_VERSION)
        .expect("the host's dockerd");
    let mut writer = DockerApiWriter::new(docker.clone());
    let cid = ContainerId::new(&id);
    let restored = rt.block_on(writer.restore_exited(&cid, Weight::new(100).unwrap()));
    assert_eq!(restored.expect("restore of an unset configuration"), AppliedVia::DockerApi);
    assert_eq!(configured(), "0", "the restore made the kernel's default an explicit weight");

    cli(&["update", "--blkio-weight", "10", &id]);
    if configured() == "0" {
        eprintln!("this dockerd discards block-I/O weights (no blkio.weight here): the configured side is not run");
        return;
    }
    let zero = bollard::models::ContainerUpdateBody { blkio_weight: Some(0), ..Default::default() };
    rt.block_on(docker.update_container(&id, zero)).expect("docker update with BlkioWeight 0");
    assert_eq!(configured(), "10", "Docker's update with 0 should leave the weight as it is");
    let restored = rt.block_on(writer.restore_exited(&cid, Weight::new(100).unwrap()));
    assert_eq!(restored.expect("restore of the agent's weight"), AppliedVia::DockerApi);
    assert_eq!(configured(), "100");
}
