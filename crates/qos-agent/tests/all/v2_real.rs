//! cgroup v2 for real: the agent against a real dockerd on v2, with one BFQ loop device, one io.cost loop device and
//! one where no weight acts (weights per device, status per container and device, the warning, SIGTERM); the io.cost
//! set-up command on a loop device; and the `io.stat` counters of real containers as the daemon reads them.
//!
//! Runs inside the v2 test bed (it needs /sys/fs/cgroup to be cgroup2 with the io controller, and a dockerd on
//! that hierarchy at `$DOCKER_HOST` with the image ddiskqos-test:latest):
//!
//! ```sh
//! cargo test -p qos-agent --test all --no-run        # prints the binary's path
//! flock /tmp/ddiskqos-real.lock scripts/cgroup-v2.sh run --dockerd -- target/debug/deps/all-HASH --include-ignored v2_real::
//! ```
//!
//! `scripts/test.sh` does exactly that, after the main run that skips this module (`--skip v2_real::`: the machine
//! is on v1 then). Outside the test bed the test says `SKIPPED`, except under `CI=true` or
//! `DDISKQOS_REQUIRE_REAL=1`, where it fails (`testbed::require`, the one rule of every real test).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use testbed::docker::{Containers, StartTiming};
use testbed::process::patience;

const CGROUP: &str = "/sys/fs/cgroup";
const DOCKER: &str = "/usr/bin/docker";
const IMAGE: &str = "ddiskqos-test:latest";
/// The agent under test; `DDISKQOS_V2_AGENT` names another build (e.g. to see an older agent fail this test).
pub(crate) fn agent_binary() -> PathBuf {
    std::env::var_os("DDISKQOS_V2_AGENT")
        .map_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_ddiskqos-agent")), PathBuf::from)
}

/// A heavy reader (128 MiB a pass) is demoted within this many of the agent's sampling rounds. Counted in rounds,
/// not seconds: the same test runs on the host and in the systemd guest under software emulation, where the agent
/// stretches its rounds to its CPU budget.
const DEMOTE_WITHIN_ROUNDS: u64 = 10;
/// A new container has the top weight on both devices within this many rounds of `docker run` returning (the
/// agent weights it on Docker's start event, before its first round).
const TOP_WITHIN_ROUNDS: u64 = 3;

pub(crate) fn run(cmd: &str, args: &[&str]) -> String {
    let out = Command::new(cmd).args(args).output().unwrap_or_else(|e| panic!("{cmd} {args:?}: {e}"));
    assert!(out.status.success(), "{cmd} {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

pub(crate) fn write(path: &str, data: &str) {
    std::fs::write(path, data).unwrap_or_else(|e| panic!("writing {data:?} to {path}: {e}"));
}

/// A file-backed loop device with direct I/O; detached (scheduler back to none first, so it pins no cgroups,
/// and io.cost off for it) on drop.
pub(crate) struct Loop {
    pub(crate) dev: String,
    pub(crate) name: String,
    pub(crate) num: String,
    file: PathBuf,
    io_cost: bool,
}

impl Loop {
    pub(crate) fn new(file: PathBuf, scheduler: &str) -> Self {
        std::fs::File::create(&file).and_then(|f| f.set_len(256 << 20)).expect("backing file");
        let dev = run("losetup", &["--find", "--show", "--direct-io=on", file.to_str().unwrap()]);
        let name = dev.trim_start_matches("/dev/").to_string();
        let num = std::fs::read_to_string(format!("/sys/block/{name}/dev")).unwrap().trim().to_string();
        let this = Self { dev, name, num, file, io_cost: false };
        write(&format!("/sys/block/{}/queue/scheduler", this.name), scheduler);
        let active = std::fs::read_to_string(format!("/sys/block/{}/queue/scheduler", this.name)).unwrap();
        assert!(active.contains(&format!("[{scheduler}]")), "{}: scheduler {active:?}", this.dev);
        this
    }

    pub(crate) fn enable_io_cost(&mut self) {
        write(&format!("{CGROUP}/io.cost.qos"), &format!("{} enable=1", self.num));
        self.io_cost = true;
        let qos = std::fs::read_to_string(format!("{CGROUP}/io.cost.qos")).unwrap();
        assert!(qos.lines().any(|l| l.starts_with(&format!("{} enable=1", self.num))), "io.cost.qos: {qos}");
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        if let (true, Ok(dev)) = (self.io_cost, self.num.parse()) {
            // io.cost off and its targets and model the kernel's again: the agent's own undo lines.
            for (line, file) in qos_agent::blockdev::iocost::undo_lines(dev) {
                let _ = std::fs::write(format!("{CGROUP}/{file}"), line);
            }
        }
        let _ = std::fs::write(format!("/sys/block/{}/queue/scheduler", self.name), "none");
        let _ = Command::new("losetup").args(["-d", &self.dev]).status();
        let _ = std::fs::remove_file(&self.file);
    }
}

/// The test's scratch directory (config, log, state, backing files), removed on drop, also after a failure (the
/// agent's log is printed in every failure message).
pub(crate) struct TmpDir(pub(crate) PathBuf);

impl TmpDir {
    pub(crate) fn new(tag: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("ddiskqos-v2-real-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }
}

impl Drop for TmpDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The agent process; killed on drop (if the test did not stop it).
pub(crate) struct Agent {
    child: Child,
    log: PathBuf,
}

impl Agent {
    /// Starts the agent under test with `config`, its stderr (log level info) into `log`.
    pub(crate) fn spawn(config: &Path, log: PathBuf) -> Self {
        let child = Command::new(agent_binary())
            .args(["-c", config.to_str().unwrap()])
            .env("DDISKQOS_LOG", "info,qos_agent::systemd=debug")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("starting the agent");
        Self { child, log }
    }

    /// Whether the agent process is still running.
    pub(crate) fn child_running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    pub(crate) fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub(crate) fn sigterm_and_wait(&mut self, limit: Duration) -> std::process::ExitStatus {
        run("kill", &["-TERM", &self.child.id().to_string()]);
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(Instant::now() < deadline, "agent did not stop within {limit:?}:\n{}", self.log_text());
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A weight file's effective value for device `num` (its override line, else the default).
pub(crate) fn effective(file: &Path, num: &str) -> Option<u32> {
    effective_in(&std::fs::read_to_string(file).ok()?, num)
}

/// The effective value for device `num` in a weight file's text.
pub(crate) fn effective_in(text: &str, num: &str) -> Option<u32> {
    let mut default = None;
    for line in text.lines() {
        match line.split_once(' ') {
            Some((dev, v)) if dev == num => return v.trim().parse().ok(),
            Some(("default", v)) => default = v.trim().parse().ok(),
            _ => {}
        }
    }
    default
}

pub(crate) fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

pub(crate) fn poll<T>(limit: Duration, mut f: impl FnMut() -> Option<T>) -> Option<(T, Duration)> {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return Some((v, start.elapsed()));
        }
        if start.elapsed() > limit {
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The running agent's status, as the control socket answers it (JSON).
fn status_json(socket: &Path) -> qos_agent::daemon::Status {
    let mut s = std::os::unix::net::UnixStream::connect(socket).unwrap_or_else(|e| panic!("{}: {e}", socket.display()));
    let mut body = String::new();
    s.read_to_string(&mut body).unwrap();
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("status answer {body:?}: {e}"))
}

/// The agent's sampling rounds so far (`ddiskqos_round_duration_seconds_count`), `None` before it serves metrics.
pub(crate) fn rounds(port: u16) -> Option<u64> {
    scrape(port)
        .lines()
        .find_map(|l| l.strip_prefix("ddiskqos_round_duration_seconds_count "))
        .and_then(|v| v.trim().parse().ok())
}

fn scrape(port: u16) -> String {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else { return String::new() };
    let _ = s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n");
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

#[test]
#[ignore = "needs cgroup v2: the systemd guest, scripts/guest.sh"]
fn agent_on_v2_weights_each_device_through_the_file_that_governs_it() {
    let test = "v2_real::agent_on_v2_weights_each_device_through_the_file_that_governs_it";
    if !testbed::require(test, &[testbed::Need::Root, testbed::Need::V2TestBed]) {
        return;
    }
    let docker_host = std::env::var("DOCKER_HOST").unwrap_or_default();
    let socket = PathBuf::from(docker_host.strip_prefix("unix://").expect("checked by the test bed need"));
    let version = run(DOCKER, &["info", "--format", "{{.CgroupVersion}}"]);
    assert_eq!(version, "2", "the dockerd at {docker_host} is not on cgroup v2");

    let _machine = testbed::exclusive();
    let tmp_dir = TmpDir::new("agent");
    let tmp = tmp_dir.0.clone();
    let bfq = Loop::new(tmp.join("bfq.img"), "bfq");
    let mut cost = Loop::new(tmp.join("cost.img"), "none");
    cost.enable_io_cost();
    let plain = Loop::new(tmp.join("plain.img"), "none"); // neither: the agent must say weights do nothing here
    eprintln!(
        "devices: BFQ {} ({}), io.cost {} ({}), neither {} ({})",
        bfq.dev, bfq.num, cost.dev, cost.num, plain.dev, plain.num
    );

    let mut containers = Containers::default();
    // --blkio-weight: Docker writes io.bfq.weight `default 300` (and never io.weight); --blkio-weight-device adds
    // a `MAJ:MIN 500` override on the BFQ device where Docker supports it on v2: the agent must beat it (it wins
    // over the default) and the restore must put both back.
    let override_500 = format!("{}:500", bfq.dev);
    let devices =
        ["--blkio-weight", "300", "--blkio-weight-device", &override_500, "--device", &bfq.dev, "--device", &cost.dev];
    let heavy_cmd = format!(
        "while true; do dd if={} of=/dev/null bs=1M count=64 iflag=direct 2>/dev/null; \
         dd if={} of=/dev/null bs=1M count=64 iflag=direct 2>/dev/null; done",
        bfq.dev, cost.dev
    );
    let mut args = devices.to_vec();
    args.extend_from_slice(&[IMAGE, "sh", "-c", &heavy_cmd]);
    let heavy = containers.run(&args);
    let heavy_dir = Path::new(CGROUP).join("docker").join(&heavy);
    let (bfq_before, io_before) = (read(&heavy_dir.join("io.bfq.weight")), read(&heavy_dir.join("io.weight")));
    let has_override = bfq_before.lines().any(|l| l.starts_with(&format!("{} ", bfq.num)));
    eprintln!(
        "heavy {}: before the agent io.bfq.weight {bfq_before:?}, io.weight {io_before:?} (Docker {} the override)",
        &heavy[..12],
        if has_override { "wrote" } else { "did not write" }
    );

    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let config = tmp.join("agent.toml");
    std::fs::write(
        &config,
        format!(
            "runtime = \"docker\"\nsample_interval = \"100ms\"\nstate_file = \"{0}/state.json\"\n\
             control_socket = \"{0}/agent.sock\"\n[docker]\nsocket = \"{1}\"\n\
             [devices]\nprotect = \"off\"\ncheck = [\"{2}\", \"{3}\", \"{4}\"]\n[metrics]\nenabled = true\nlisten = \"127.0.0.1:{5}\"\n\
             [mlfq]\nboost_after = \"10m\"\n",
            tmp.display(),
            socket.display(),
            bfq.name,
            cost.name,
            plain.name,
            port
        ),
    )
    .unwrap();
    let log = tmp.join("agent.log");
    let mut agent = Agent::spawn(&config, log);

    // The heavy reader is demoted on both devices, each in the file that governs it.
    let heavy_bfq = heavy_dir.join("io.bfq.weight");
    let heavy_io = heavy_dir.join("io.weight");
    let demoted = poll(patience(Duration::from_secs(30)), || {
        let (b, i) = (effective(&heavy_bfq, &bfq.num)?, effective(&heavy_io, &cost.num)?);
        (b < 100 && i < 100).then(|| (b, i, rounds(port)))
    });
    let Some(((heavy_b, heavy_i, demoted_at_round), took)) = demoted else {
        panic!(
            "heavy reader not demoted below 100 on both devices: io.bfq.weight {:?}, io.weight {:?}, io.stat {:?}\n{}",
            std::fs::read_to_string(&heavy_bfq),
            std::fs::read_to_string(&heavy_io),
            std::fs::read_to_string(heavy_dir.join("io.stat")),
            agent.log_text()
        )
    };
    eprintln!(
        "heavy demoted: io.bfq.weight on {} = {heavy_b}, io.weight on {} = {heavy_i}, {:.2} s after the agent \
         started, in its round {demoted_at_round:?}",
        bfq.num,
        cost.num,
        took.as_secs_f64()
    );
    let demoted_at_round = demoted_at_round.expect("the agent serves its round count once it weights containers");
    assert!(
        demoted_at_round <= DEMOTE_WITHIN_ROUNDS,
        "demotion took {demoted_at_round} rounds ({took:?}):\n{}",
        agent.log_text()
    );
    // Let it reach the bottom (10) before the comparison with a new container.
    let bottom = poll(patience(Duration::from_secs(15)), || {
        let (b, i) = (effective(&heavy_bfq, &bfq.num)?, effective(&heavy_io, &cost.num)?);
        (b <= 10 && i <= 10).then_some((b, i))
    });
    assert!(bottom.is_some(), "heavy reader did not reach the bottom weight:\n{}", agent.log_text());

    // A new container: the top weight on both devices within a second.
    let mut args = devices.to_vec();
    args.extend_from_slice(&[IMAGE, "sleep", "600"]);
    let invoked = Instant::now();
    let fresh = containers.run(&args);
    let ran = Instant::now();
    let round_at_run = rounds(port).expect("round count");
    let fresh_dir = Path::new(CGROUP).join("docker").join(&fresh);
    let (fresh_bfq, fresh_io) = (fresh_dir.join("io.bfq.weight"), fresh_dir.join("io.weight"));
    let top = poll(patience(Duration::from_secs(6)), || {
        let (b, i) = (effective(&fresh_bfq, &bfq.num)?, effective(&fresh_io, &cost.num)?);
        (b == 1000 && i >= 1000).then_some((b, i))
    });
    let top_rounds = rounds(port).expect("round count") - round_at_run;
    let Some(((fresh_b, fresh_i), _)) = top else {
        panic!(
            "new container not at the top: io.bfq.weight {:?}, io.weight {:?}\n{}",
            std::fs::read_to_string(&fresh_bfq),
            std::fs::read_to_string(&fresh_io),
            agent.log_text()
        )
    };
    let top_took = ran.elapsed();
    let since_invoked = invoked.elapsed();
    let heavy_i_now = effective(&heavy_io, &cost.num).unwrap();
    eprintln!(
        "new container: io.bfq.weight on {} = {fresh_b}, io.weight on {} = {fresh_i} ({}x the heavy reader's \
         {heavy_i_now}), {:.3} s and {top_rounds} rounds after docker run returned ({:.3} s after it was invoked)",
        bfq.num,
        cost.num,
        fresh_i / heavy_i_now.max(1),
        top_took.as_secs_f64(),
        since_invoked.as_secs_f64()
    );
    assert!(
        top_rounds <= TOP_WITHIN_ROUNDS,
        "the new container's top weight took {top_rounds} rounds ({top_took:?}):\n{}",
        agent.log_text()
    );
    assert!(fresh_i >= 50 * heavy_i_now, "io.weight {fresh_i} vs heavy {heavy_i_now}: less than 50x");

    // The agent said what acts where: metric per device, one warning for the device nothing governs.
    let metrics = scrape(port);
    for (num, governor, value) in [(&bfq.num, "bfq", 1), (&cost.num, "io-cost", 1), (&plain.num, "none", 0)] {
        let series = format!("ddiskqos_device_weight_effective{{device=\"{num}\",governor=\"{governor}\"}} {value}");
        assert!(metrics.contains(&series), "metrics lack {series:?}:\n{metrics}");
    }
    let log_text = agent.log_text();
    let warned = format!("HAVE NO EFFECT ON DEVICE {}", plain.num);
    assert_eq!(log_text.matches(&warned).count(), 1, "one warning for {}:\n{log_text}", plain.dev);
    // Only that one: no second wording (the start-up check of [devices] check used to warn about it too).
    let about_plain =
        log_text.lines().filter(|l| l.contains("NO EFFECT") && (l.contains(&plain.num) || l.contains(&plain.name)));
    assert_eq!(about_plain.count(), 1, "warnings about {}:\n{log_text}", plain.dev);

    // `status`: each device of each container, what governs it and the weight in force there, as read back.
    let status = status_json(&tmp.join("agent.sock"));
    let row = |id: &str| {
        status
            .containers
            .iter()
            .find(|r| id.starts_with(&r.id))
            .unwrap_or_else(|| panic!("no row for {id}: {status:?}"))
    };
    // The three loop devices (a container's own I/O on the root disk, e.g. loading busybox, may add a row).
    let loops = [&bfq.num, &cost.num, &plain.num];
    let devices = |id: &str| -> Vec<String> {
        row(id)
            .devices
            .iter()
            .filter(|d| loops.contains(&&d.device))
            .map(|d| {
                let weights: Vec<String> = d.weights.iter().map(|w| format!("{}={}", w.file, w.effective)).collect();
                format!("{} {} [{}]", d.device, d.governor, weights.join(" "))
            })
            .collect()
    };
    let expect = |bfq_w: u32, io_w: u32| {
        let mut rows = vec![
            format!("{} bfq [io.bfq.weight={bfq_w}]", bfq.num),
            format!("{} io-cost [io.weight={io_w}]", cost.num),
            format!("{} none []", plain.num),
        ];
        rows.sort_by_key(|r| r.split(' ').next().unwrap().parse::<qos_agent::blockdev::DevNum>().unwrap());
        rows
    };
    // The heavy reader sits at the bottom (boost_after is 10 minutes), the new one at the top: the rows must say
    // what the files say now.
    let heavy_now = (effective(&heavy_bfq, &bfq.num).unwrap(), effective(&heavy_io, &cost.num).unwrap());
    assert_eq!(devices(&heavy), expect(heavy_now.0, heavy_now.1), "heavy's devices in {status:?}");
    assert_eq!(devices(&fresh), expect(1000, fresh_i), "the new container's devices in {status:?}");
    let summary: Vec<(String, Option<String>, bool)> =
        status.devices.iter().map(|d| (d.device.clone(), d.disk.clone(), d.fix.is_some())).collect();
    for (num, name, ineffective) in
        [(&bfq.num, &bfq.name, false), (&cost.num, &cost.name, false), (&plain.num, &plain.name, true)]
    {
        assert!(
            summary.contains(&(num.clone(), Some(name.clone()), ineffective)),
            "devices table lacks {num} ({name}, fix shown: {ineffective}): {summary:?}"
        );
    }
    let text = run(agent_binary().to_str().unwrap(), &["status", "--socket", tmp.join("agent.sock").to_str().unwrap()]);
    for line in [
        format!("device {} ({})", bfq.num, bfq.name),
        format!("io.bfq.weight {}", heavy_now.0),
        format!("io.weight {}", heavy_now.1),
        format!("io.weight {fresh_i}"),
        "no weight acts on this device".to_string(),
        format!(
            "NO WEIGHT ACTS (scheduler none, io.cost off). Fix: `echo bfq > /sys/block/{}/queue/scheduler`",
            plain.name
        ),
    ] {
        assert!(text.contains(&line), "`ddiskqos-agent status` lacks {line:?}:\n{text}");
    }
    eprintln!("ddiskqos-agent status:\n{text}");
    // `auto` never asks Docker (issue 28, defect 3): the agent's weights are not in the containers' Docker
    // configuration, where they would outlive the agent (a restarted container would come back demoted).
    assert!(!log_text.contains("docker update"), "auto went through Docker's API:\n{log_text}");
    for (what, id) in [("heavy", &heavy), ("new", &fresh)] {
        let persisted = run(DOCKER, &["inspect", "-f", "{{.HostConfig.BlkioWeight}}", id]);
        assert_eq!(persisted, "300", "{what}: Docker's BlkioWeight is no longer the container's own --blkio-weight");
    }

    // SIGTERM: both files of both containers back to what Docker made them.
    let status = agent.sigterm_and_wait(patience(Duration::from_secs(10)));
    assert!(status.success(), "agent exit {status}:\n{}", agent.log_text());
    for (what, dir) in [("heavy", &heavy_dir), ("new", &fresh_dir)] {
        assert_eq!(read(&dir.join("io.bfq.weight")), bfq_before, "{what}: io.bfq.weight not restored");
        assert_eq!(read(&dir.join("io.weight")), io_before, "{what}: io.weight not restored");
    }
    eprintln!("after SIGTERM both containers read io.bfq.weight {bfq_before:?}, io.weight {io_before:?} again");
    drop(containers);
    drop((bfq, cost, plain));
}

/// Where Docker does deliver weights (v2, a BFQ device, Docker's cgroupfs driver), `actuator = "docker"` sends
/// them through `docker update`, which dockerd answers only once a starting container's start completed. A
/// container seen at its cgroup's creation must get the top weight before Docker's `start` event all the same: the
/// agent writes a starting container's file directly, and Docker's API from then on.
#[test]
#[ignore = "needs cgroup v2: the systemd guest, scripts/guest.sh"]
fn docker_mode_weights_a_starting_container_before_its_start_event_where_docker_delivers() {
    let test = "v2_real::docker_mode_weights_a_starting_container_before_its_start_event_where_docker_delivers";
    if !testbed::require(test, &[testbed::Need::Root, testbed::Need::V2TestBed]) {
        return;
    }
    let docker_host = std::env::var("DOCKER_HOST").unwrap_or_default();
    let socket = PathBuf::from(docker_host.strip_prefix("unix://").expect("checked by the test bed need"));
    assert_eq!(run(DOCKER, &["info", "--format", "{{.CgroupDriver}}"]), "cgroupfs", "{docker_host}: not cgroupfs");
    let _machine = testbed::exclusive();
    let tmp_dir = TmpDir::new("starting");
    let tmp = tmp_dir.0.clone();
    let bfq = Loop::new(tmp.join("bfq.img"), "bfq");
    let mut containers = Containers::default();
    // Running before the agent: found by its listing, weighted through Docker's API (Docker delivers here).
    let first = containers.run(&["--device", &bfq.dev, IMAGE, "sleep", "600"]);
    let first_bfq = Path::new(CGROUP).join("docker").join(&first).join("io.bfq.weight");
    let before = read(&first_bfq);

    let config = tmp.join("agent.toml");
    std::fs::write(
        &config,
        format!(
            "runtime = \"docker\"\nactuator = \"docker\"\nsample_interval = \"100ms\"\nstate_file = \"{0}/state.json\"\n\
             control_socket = \"{0}/agent.sock\"\n[docker]\nsocket = \"{1}\"\n[devices]\nprotect = \"off\"\ncheck = [\"{2}\"]\n\
             [mlfq]\nboost_after = \"10m\"\n",
            tmp.display(),
            socket.display(),
            bfq.name
        ),
    )
    .unwrap();
    let mut agent = Agent::spawn(&config, tmp.join("agent.log"));
    let blkio_weight = |id: &str| run(DOCKER, &["inspect", "-f", "{{.HostConfig.BlkioWeight}}", id]);
    let through_docker = poll(patience(Duration::from_secs(30)), || {
        (effective(&first_bfq, &bfq.num) == Some(1000) && blkio_weight(&first) == "1000").then_some(())
    });
    assert!(
        through_docker.is_some(),
        "the listed container's top weight did not come through Docker: io.bfq.weight {:?}, BlkioWeight {}\n{}",
        std::fs::read_to_string(&first_bfq),
        blkio_weight(&first),
        agent.log_text()
    );

    // Created now, started while the agent runs: the top weight before Docker reports the start.
    let late = testbed::docker::cli(&["create", "--device", &bfq.dev, IMAGE, "sleep", "600"]);
    containers.0.push(late.clone());
    let late_bfq = Path::new(CGROUP).join("docker").join(&late).join("io.bfq.weight");
    let num = bfq.num.clone();
    let timing = StartTiming::watch(&late, Path::new(CGROUP).join("docker").join(&late), move |dir| {
        effective(&dir.join("io.bfq.weight"), &num) == Some(1000)
    });
    testbed::docker::cli(&["start", &late]);
    let Some(times) = timing.finish() else {
        panic!("the late container never reached 1000 on {}\n{}", bfq.dev, agent.log_text())
    };
    let before_event_ms = -times.after_start_event_ms();
    eprintln!(
        "late container: cgroup created -> io.bfq.weight 1000 in {:.1} ms, {before_event_ms:.1} ms before Docker's \
         start event; its BlkioWeight in Docker: {}",
        times.reaction_ms(),
        blkio_weight(&late)
    );
    assert!(
        before_event_ms > 0.0,
        "the late container got its top weight {:.1} ms after Docker's start event\n{}",
        -before_event_ms,
        agent.log_text()
    );
    // A reader demoted through Docker, then stopped: Docker keeps the demotion in its configuration, so its
    // original goes back there (a container that starts again must not come back demoted).
    let reader_cmd = format!("dd if={} of=/dev/null bs=1M count=16 iflag=direct; sleep 600", bfq.dev);
    let reader = containers.run(&["--device", &bfq.dev, IMAGE, "sh", "-c", &reader_cmd]);
    let demoted = poll(patience(Duration::from_secs(30)), || {
        let w: u32 = blkio_weight(&reader).parse().ok()?;
        (w > 0 && w < 1000).then_some(w)
    });
    let Some((demoted, _)) = demoted else {
        panic!("the reader was not demoted through Docker: BlkioWeight {}\n{}", blkio_weight(&reader), agent.log_text())
    };
    run(DOCKER, &["stop", "-t", "1", &reader]);
    let original = before.trim().strip_prefix("default ").unwrap_or(before.trim()).to_string();
    let put_back = poll(patience(Duration::from_secs(30)), || (blkio_weight(&reader) == original).then_some(()));
    assert!(
        put_back.is_some(),
        "the stopped reader's configuration holds BlkioWeight {} (demoted to {demoted}), not its original {original}\n{}",
        blkio_weight(&reader),
        agent.log_text()
    );
    eprintln!("reader demoted to {demoted} through Docker, stopped: its configuration holds {original} again");

    let log = agent.log_text();
    assert!(!log.contains("not in force"), "a weight sent through Docker was not in force:\n{log}");

    // SIGTERM: both back to what Docker made them.
    let status = agent.sigterm_and_wait(patience(Duration::from_secs(10)));
    assert!(status.success(), "agent exit {status}:\n{}", agent.log_text());
    assert_eq!(read(&first_bfq), before, "the listed container's io.bfq.weight not restored");
    assert_eq!(read(&late_bfq), before, "the late container's io.bfq.weight not restored");
    drop(containers);
    drop(bfq);
}

/// The line of device `num` in an io.cost root file (`io.cost.model`, `io.cost.qos`).
fn root_line(file: &str, num: &str) -> Option<String> {
    let text = std::fs::read_to_string(Path::new(CGROUP).join(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
    text.lines().find(|l| l.split_whitespace().next() == Some(num)).map(str::to_owned)
}

/// The device's io.cost governor as the agent's own device table reads it.
fn io_cost_on(num: &str) -> bool {
    let dev: qos_agent::blockdev::DevNum = num.parse().unwrap();
    let mut table = qos_agent::blockdev::DeviceTable::new(Path::new(CGROUP));
    table.get(dev, Instant::now()).0.governor.io_cost
}

#[test]
#[ignore = "needs cgroup v2: the systemd guest, scripts/guest.sh"]
fn iocost_set_up_measures_applies_reads_back_and_undoes_and_refuses_the_root_disk() {
    let test = "v2_real::iocost_set_up_measures_applies_reads_back_and_undoes_and_refuses_the_root_disk";
    if !testbed::require(test, &[testbed::Need::Root, testbed::Need::V2TestBed]) {
        return;
    }
    let _machine = testbed::exclusive();
    let tmp_dir = TmpDir::new("iocost");
    let mut dev = Loop::new(tmp_dir.0.join("cost.img"), "none");
    dev.io_cost = true; // whatever happens below, the drop turns io.cost off for it again
    assert!(!io_cost_on(&dev.num), "io.cost already on for the fresh {}", dev.dev);

    // The short measurement: 1 s per load, 4 threads (about 4 s; reads only, no write file).
    let started = Instant::now();
    let out = Command::new(agent_binary())
        .args(["iocost", &dev.dev, "--seconds", "1", "--jobs", "4", "--apply"])
        .output()
        .expect("running ddiskqos-agent iocost");
    let took = started.elapsed();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "iocost {} --apply failed: {stderr}\n{stdout}", dev.dev);
    eprintln!(
        "ddiskqos-agent iocost {} --seconds 1 --jobs 4 --apply ({:.1} s):\n{stdout}",
        dev.dev,
        took.as_secs_f64()
    );
    assert!(took < Duration::from_secs(15), "the short measurement took {took:?}");

    // What it printed it wrote is what the kernel's files hold for the device.
    let printed = |file: &str| {
        let prefix = format!("wrote {CGROUP}/{file}: ");
        stdout.lines().find_map(|l| l.strip_prefix(&prefix)).unwrap_or_else(|| panic!("no {prefix:?} in:\n{stdout}"))
    };
    let (model, qos) = (printed("io.cost.model"), printed("io.cost.qos"));
    assert!(model.starts_with(&format!("{} ctrl=user model=linear rbps=", dev.num)), "{model}");
    assert!(qos.starts_with(&format!("{} enable=1 ctrl=user rpct=95.00 rlat=", dev.num)), "{qos}");
    let field = |line: &str, key: &str| -> u64 {
        let v = line.split_whitespace().find_map(|f| f.strip_prefix(&format!("{key}="))).unwrap();
        v.parse().unwrap_or_else(|_| panic!("{key} in {line}"))
    };
    for key in ["rbps", "rseqiops", "rrandiops", "wbps", "wseqiops", "wrandiops"] {
        assert!(field(model, key) > 0, "{key} = 0 in {model}");
    }
    assert!(field(qos, "rlat") >= 2000, "the latency target is at least 2 ms: {qos}");
    assert_eq!(root_line("io.cost.model", &dev.num).as_deref(), Some(model), "io.cost.model does not read back");
    assert_eq!(root_line("io.cost.qos", &dev.num).as_deref(), Some(qos), "io.cost.qos does not read back");
    assert!(io_cost_on(&dev.num), "the agent's device table does not see io.cost on {}", dev.dev);

    // The undo it printed works: io.cost off, the model back to the kernel's.
    let undo: Vec<(String, String)> = stdout
        .lines()
        .filter_map(|l| {
            let rest = l.trim().strip_prefix("echo \"")?;
            let (line, file) = rest.split_once("\" > ")?;
            Some((line.to_string(), file.to_string()))
        })
        .collect();
    let files: Vec<&str> = undo.iter().map(|(_, f)| f.as_str()).collect();
    assert_eq!(files, [format!("{CGROUP}/io.cost.qos"), format!("{CGROUP}/io.cost.model")], "{stdout}");
    for (line, file) in &undo {
        write(file, line);
    }
    let qos_after = root_line("io.cost.qos", &dev.num).unwrap_or_default();
    let model_after = root_line("io.cost.model", &dev.num).unwrap_or_default();
    assert!(qos_after.contains("enable=0 ctrl=auto"), "after the undo: {qos_after}");
    assert!(model_after.contains("ctrl=auto"), "after the undo: {model_after}");
    assert!(!io_cost_on(&dev.num), "io.cost still on for {} after the undo", dev.dev);
    eprintln!("after the undo: {qos_after} | {model_after}");

    // The disk holding / is refused before anything is measured or written.
    let root_source = run("findmnt", &["-n", "-o", "SOURCE", "/"]);
    let root_dev =
        qos_agent::blockdev::DevNum::of_node(Path::new(&root_source)).expect("the root file system's device");
    let root_num = root_dev.to_string();
    let (qos_before, model_before) = (root_line("io.cost.qos", &root_num), root_line("io.cost.model", &root_num));
    let started = Instant::now();
    let out = Command::new(agent_binary()).args(["iocost", &root_source, "--apply"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "iocost {root_source} --apply succeeded");
    assert!(stderr.contains("backs the root filesystem"), "{stderr}");
    // Refused at once, not after a measurement (seconds on the host); stretched under emulation, where starting
    // the binary alone takes seconds.
    assert!(started.elapsed() < patience(Duration::from_secs(2)), "refused only after {:?}", started.elapsed());
    assert_eq!(root_line("io.cost.qos", &root_num), qos_before);
    assert_eq!(root_line("io.cost.model", &root_num), model_before);
    eprintln!("iocost {root_source} --apply refused: {}", stderr.trim());
    drop(dev);
}

/// Each `MAJ:MIN` line of a v2 `io.stat`, parsed by the agent's own parser (read + write bytes per device).
fn io_stat_per_device(dir: &Path) -> std::collections::BTreeMap<String, qos_core::IoCounters> {
    let path = dir.join("io.stat");
    let text = read(&path);
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let dev = l.split_whitespace().next().unwrap().to_string();
            (dev, qos_agent::cgroup::parse_io_stat(&path, l.as_bytes()).unwrap())
        })
        .collect()
}

#[test]
#[ignore = "needs cgroup v2: the systemd guest, scripts/guest.sh"]
fn io_stat_counters_of_real_containers_hold_their_own_bytes_only() {
    use qos_agent::backend::{ContainerInfo, CounterSource};
    use qos_agent::cgroup::CgroupRoot;
    use qos_core::{ContainerId, IoCounters};

    let test = "v2_real::io_stat_counters_of_real_containers_hold_their_own_bytes_only";
    if !testbed::require(test, &[testbed::Need::Root, testbed::Need::V2TestBed]) {
        return;
    }
    let _machine = testbed::exclusive();
    const MIB: u64 = 1 << 20;
    let (n_a, n_b, n_own) = (24, 40, 16); // MiB read by the A container, the B container, the test's own cgroup
    let tmp_dir = TmpDir::new("iostat");
    let a = Loop::new(tmp_dir.0.join("a.img"), "none");
    let b = Loop::new(tmp_dir.0.join("b.img"), "none");
    let mut containers = Containers::default();
    let ca = containers.run(&["--device", &a.dev, IMAGE, "sleep", "600"]);
    let cb = containers.run(&["--device", &b.dev, IMAGE, "sleep", "600"]);
    // A cgroup of the test's own, made with cgroups-rs (testbed), reads the A device too: none of it is ca's.
    let own = testbed::blkio::CgroupGuard::new_v2("ddiskqos-iostat");

    // The counters exactly as the daemon builds them for the Docker runtime: cgroup files behind the parent gate.
    let root = std::sync::Arc::new(CgroupRoot::detect().expect("the v2 root"));
    assert_eq!(root.version(), qos_agent::cgroup::CgroupVersion::V2, "{}", root.path().display());
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let host = std::env::var("DOCKER_HOST").unwrap();
    let docker =
        rt.block_on(qos_agent::runtime::docker::connect(Path::new(host.trim_start_matches("unix://")))).unwrap();
    let mut counters = qos_agent::runtime::docker::DockerCounters::with_root(docker, root.clone());
    let info = |id: &str| ContainerInfo {
        id: ContainerId::new(id),
        name: id[..12].to_string(),
        labels: Default::default(),
        cgroup: Some(root.resolve_relative(&format!("docker/{id}")).unwrap()),
    };
    for id in [&ca, &cb] {
        rt.block_on(counters.attach(&info(id))).unwrap();
    }
    let mut last: std::collections::HashMap<String, IoCounters> = Default::default();
    let mut rounds = 0;
    let mut round = |last: &mut std::collections::HashMap<String, IoCounters>| {
        let mut out = Vec::new();
        rt.block_on(counters.sample(&mut out));
        rounds += 1;
        for (id, r) in out {
            last.insert(id.to_string(), r.unwrap_or_else(|e| panic!("sampling {id}: {e}")));
        }
    };
    // Past the sampler's active window, so the I/O below is found through the parent's counters as the daemon
    // finds a container that wakes up.
    for _ in 0..6 {
        round(&mut last);
    }
    let before = last.clone();
    let (ca_dir, cb_dir) = (info(&ca).cgroup.unwrap().path().to_owned(), info(&cb).cgroup.unwrap().path().to_owned());
    let (ca_stat0, cb_stat0) = (io_stat_per_device(&ca_dir), io_stat_per_device(&cb_dir));

    let dd = |dev: &str, mib: u64| format!("if={dev} of=/dev/null bs=1M count={mib} iflag=direct");
    let dd_args = |dev: &str, mib: u64| dd(dev, mib).split(' ').map(str::to_owned).collect::<Vec<_>>();
    let exec = |id: &str, dev: &str, mib: u64| {
        let mut args = vec!["exec".to_string(), id.to_string(), "dd".to_string()];
        args.extend(dd_args(dev, mib));
        run(DOCKER, &args.iter().map(String::as_str).collect::<Vec<_>>());
    };
    exec(&ca, &a.dev, n_a);
    exec(&cb, &b.dev, n_b);
    testbed::blkio::run_in_cgroup(&own.path, &format!("dd {} status=none", dd(&a.dev, n_own)));
    for _ in 0..2 {
        round(&mut last);
    }

    let total = |c: &IoCounters| c.read + c.write;
    let delta = |id: &str| total(&last[id]) - total(&before[id]);
    let line_delta =
        |now: &std::collections::BTreeMap<String, IoCounters>,
         then: &std::collections::BTreeMap<String, IoCounters>,
         dev: &str| { now.get(dev).map_or(0, total) - then.get(dev).map_or(0, total) };
    let (ca_stat, cb_stat) = (io_stat_per_device(&ca_dir), io_stat_per_device(&cb_dir));
    let (da, db) = (delta(&ca), delta(&cb));
    let (ca_on_a, ca_on_b) = (line_delta(&ca_stat, &ca_stat0, &a.num), line_delta(&ca_stat, &ca_stat0, &b.num));
    let (cb_on_b, cb_on_a) = (line_delta(&cb_stat, &cb_stat0, &b.num), line_delta(&cb_stat, &cb_stat0, &a.num));
    eprintln!(
        "after {rounds} rounds: A container +{da} bytes (on {}: {ca_on_a}, on {}: {ca_on_b}), B container +{db} bytes \
         (on {}: {cb_on_b}, on {}: {cb_on_a}); io.stat A {ca_stat:?}, B {cb_stat:?}",
        a.num, b.num, b.num, a.num
    );
    // Each container's reader reports at least what it read, on its own device.
    assert!(da >= n_a * MIB, "A container: the reader reports {da} bytes, it read {n_a} MiB");
    assert!(db >= n_b * MIB, "B container: the reader reports {db} bytes, it read {n_b} MiB");
    assert!(ca_on_a >= n_a * MIB && cb_on_b >= n_b * MIB, "per-device lines: {ca_on_a}, {cb_on_b}");
    // Nothing of the other container's device, nor of the other cgroup on the same device.
    assert_eq!(ca_on_b, 0, "the A container was charged for the B device");
    assert_eq!(cb_on_a, 0, "the B container was charged for the A device");
    assert!(ca_on_a < (n_a + n_own) * MIB, "the A container was charged for the other cgroup's reads of A: {ca_on_a}");
    assert!(da < (n_a + n_own) * MIB, "the A container's total holds others' bytes: {da}");
    // The reader's total is the file's lines summed, no more, no less.
    for (id, stat) in [(&ca, &ca_stat), (&cb, &cb_stat)] {
        assert_eq!(total(&last[id.as_str()]), stat.values().map(total).sum::<u64>(), "{id}: {stat:?}");
    }
    assert_eq!(counters.via_stats(), 0, "every sample came from the cgroup files");

    // The test's own cgroup, read by the agent's counter reader: its bytes, on A only.
    let own_dir = root.resolve_relative(&own.rel).unwrap();
    let own_total = qos_agent::cgroup::CounterReader::open(&own_dir).unwrap().read().unwrap();
    let own_stat = io_stat_per_device(&own.path);
    assert!(total(&own_total) >= n_own * MIB, "own cgroup: {own_total:?}");
    assert!(own_stat.get(&a.num).map_or(0, total) >= n_own * MIB && !own_stat.contains_key(&b.num), "{own_stat:?}");
    drop(containers);
    drop(own);
    drop((a, b));
}

/// Effective weights of a pod cgroup on the BFQ device (`io.bfq.weight`) and the io.cost device (`io.weight`).
/// (io.bfq.weight on the BFQ device, io.weight on the io.cost device) of a cgroup.
pub(crate) fn pod_weights(dir: &Path, bfq: &Loop, cost: &Loop) -> Option<(u32, u32)> {
    Some((effective(&dir.join("io.bfq.weight"), &bfq.num)?, effective(&dir.join("io.weight"), &cost.num)?))
}

/// The agent's CRI runtime on cgroup v2, as a Kubernetes node on v2 with the cgroupfs driver runs it: the tests'
/// private containerd started inside the test bed (so it and runc use cgroup2; `--cpu` gives runc the cpu
/// controller a sandbox's CPU shares need), pods of all three QoS classes made through CRI with the kubelet's
/// parents (there is no kubelet here), real I/O on a BFQ device, a second device under io.cost. Checked in the pod
/// cgroups' files: each pod at the top on both devices, each in the file that governs it; the reader demoted level
/// by level; annotations (pinned weight, exclusion, a bad value); a new pod at the top; a containerd restart under
/// the agent; every pod's two files as they were after SIGTERM.
#[test]
#[ignore = "needs cgroup v2 with the cpu controller and containerd: the systemd guest, scripts/guest.sh"]
fn agent_on_v2_weights_pod_cgroups_through_cri() {
    use testbed::containerd::{Containerd, Qos};
    let test = "v2_real::agent_on_v2_weights_pod_cgroups_through_cri";
    let needs = [
        testbed::Need::Root,
        testbed::Need::V2TestBed,
        testbed::Need::V2Cpu,
        testbed::Need::Program("containerd"),
        testbed::Need::Program("ctr"),
        testbed::Need::Program("runc"),
    ];
    if !testbed::require(test, &needs) {
        return;
    }
    let _machine = testbed::exclusive();
    let tmp_dir = TmpDir::new("cri");
    let tmp = tmp_dir.0.clone();
    let bfq = Loop::new(tmp.join("cri-bfq.img"), "bfq");
    let mut cost = Loop::new(tmp.join("cri-cost.img"), "none");
    cost.enable_io_cost();
    let t0 = Instant::now();
    let mut containerd = Containerd::start();
    eprintln!("containerd on cgroup v2 up with the sandbox image: {:.1} s", t0.elapsed().as_secs_f64());
    let uid = crate::cri_real::uid;
    let pod_dir = |qos: Qos, uid: &str| Path::new(CGROUP).join(qos.pod_rel(uid));

    let (reader, idle, pinned, excluded, bad) = (uid(11), uid(12), uid(13), uid(14), uid(15));
    let sleep = "exec sleep 100000";
    // About 20 MB/s on the host (2 MiB direct reads, 0.1 s apart), so every level shows in the pod cgroup's files;
    // slower by the time scale under emulation, where the agent's rounds are that much longer too.
    let read_script = format!(
        "sleep 1; i=0; while [ $i -lt 250 ]; do dd if={} of=/dev/null bs=1M count=2 skip=$i iflag=direct 2>/dev/null; \
         i=$((i+2)); sleep {:.1}; done; exec sleep 100000",
        bfq.dev,
        0.1 * f64::from(testbed::process::time_scale())
    );
    let dev = PathBuf::from(&bfq.dev);
    containerd.run_pod("reader", &reader, Qos::Burstable, &[], &read_script, &[&dev]);
    containerd.run_pod("idle", &idle, Qos::BestEffort, &[], sleep, &[]);
    containerd.run_pod("pinned", &pinned, Qos::Guaranteed, &[("ddiskqos.io/weight", "300")], sleep, &[]);
    containerd.run_pod("excluded", &excluded, Qos::Burstable, &[("ddiskqos.io/exclude", "true")], sleep, &[]);
    containerd.run_pod("bad", &bad, Qos::BestEffort, &[("ddiskqos.io/weight", "abc")], sleep, &[]);
    let excluded_dir = pod_dir(Qos::Burstable, &excluded);
    write(excluded_dir.join("io.bfq.weight").to_str().unwrap(), "123");
    write(excluded_dir.join("io.weight").to_str().unwrap(), "default 123");
    let excluded_before = (read(&excluded_dir.join("io.bfq.weight")), read(&excluded_dir.join("io.weight")));
    let reader_dir = pod_dir(Qos::Burstable, &reader);
    let before = (read(&reader_dir.join("io.bfq.weight")), read(&reader_dir.join("io.weight")));
    eprintln!("pod cgroups on v2, before the agent: io.bfq.weight {:?}, io.weight {:?}", before.0, before.1);
    // Why the test bed needs --cpu: runc wrote the containers' CPU shares (the sandbox's 2 shares -> cpu.weight 1).
    let cpu_weights: Vec<String> = std::fs::read_dir(&reader_dir)
        .unwrap()
        .flatten()
        .filter(|e| e.path().is_dir())
        .map(|e| read(&e.path().join("cpu.weight")).trim().to_string())
        .collect();
    eprintln!("cpu.weight of the reader pod's sandbox and container cgroups: {cpu_weights:?}");

    let config = tmp.join("cri-agent.toml");
    std::fs::write(
        &config,
        format!(
            "runtime = \"cri\"\nsample_interval = \"100ms\"\nstate_file = \"{0}/cri-state.json\"\n\
             control_socket = \"{0}/cri-agent.sock\"\n[cri]\nsocket = \"{1}\"\n\
             [policy]\ntrusted_namespaces = [\"ddiskqos-test\"]\n[devices]\nprotect = \"off\"\ncheck = [\"{2}\", \"{3}\"]\n\
             [mlfq]\nboost_after = \"10m\"\nidle_promote_after = \"off\"\n",
            tmp.display(),
            containerd.socket().display(),
            bfq.name,
            cost.name
        ),
    )
    .unwrap();
    let log = tmp.join("cri-agent.log");
    let started = Instant::now();
    let mut agent = Agent::spawn(&config, log);

    // The reader's trajectory on the BFQ device, recorded while the other pods are checked.
    let recorder = {
        let file = reader_dir.join("io.bfq.weight");
        let num = bfq.num.clone();
        std::thread::spawn(move || {
            let (mut seen, t) = (Vec::<(f64, u32)>::new(), Instant::now());
            while t.elapsed() < patience(Duration::from_secs(15)) {
                if let Some(w) = effective(&file, &num) {
                    if seen.last().is_none_or(|(_, last)| *last != w) {
                        seen.push((t.elapsed().as_secs_f64(), w));
                    }
                    if w == 10 {
                        break;
                    }
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            seen
        })
    };
    for (what, dir, want) in [
        ("idle BestEffort pod at the top", pod_dir(Qos::BestEffort, &idle), 1000),
        ("pinned Guaranteed pod at its annotation's weight", pod_dir(Qos::Guaranteed, &pinned), 300),
        ("pod with a bad annotation managed, at the top", pod_dir(Qos::BestEffort, &bad), 1000),
    ] {
        let got =
            poll(patience(Duration::from_secs(5)), || (pod_weights(&dir, &bfq, &cost)? == (want, want)).then_some(()));
        assert!(
            got.is_some(),
            "{what}: io.bfq.weight {:?}, io.weight {:?} in {}; log:\n{}",
            std::fs::read_to_string(dir.join("io.bfq.weight")),
            std::fs::read_to_string(dir.join("io.weight")),
            dir.display(),
            agent.log_text()
        );
    }
    eprintln!(
        "existing pods weighted on both devices {:.2} s after the agent started",
        started.elapsed().as_secs_f64()
    );
    let log_text = agent.log_text();
    assert!(
        log_text.contains("ddiskqos.io/weight") && log_text.contains("abc"),
        "bad annotation not reported:\n{log_text}"
    );

    let seen = recorder.join().unwrap();
    eprintln!("reader pod's io.bfq.weight on {}: {seen:?}", bfq.num);
    let mut it = seen.iter().map(|(_, w)| *w);
    assert!(
        [1000, 200, 40, 10].iter().all(|w| it.any(|x| x == *w)),
        "reader pod not demoted level by level at its pod cgroup: {seen:?}\n{}",
        agent.log_text()
    );
    assert_eq!(pod_weights(&reader_dir, &bfq, &cost), Some((10, 10)), "reader pod's io.weight not at the bottom too");
    assert_eq!(
        (read(&excluded_dir.join("io.bfq.weight")), read(&excluded_dir.join("io.weight"))),
        excluded_before,
        "excluded pod touched"
    );

    // A new pod while the agent runs: at the top on both devices.
    let fresh = uid(16);
    let t = Instant::now();
    containerd.run_pod("fresh", &fresh, Qos::Burstable, &[], sleep, &[]);
    let created = t.elapsed();
    let fresh_dir = pod_dir(Qos::Burstable, &fresh);
    let Some((_, took)) = poll(patience(Duration::from_secs(5)), || {
        (pod_weights(&fresh_dir, &bfq, &cost)? == (1000, 1000)).then_some(())
    }) else {
        panic!("new pod not at 1000: {:?}\n{}", pod_weights(&fresh_dir, &bfq, &cost), agent.log_text())
    };
    eprintln!(
        "new pod: RunPodSandbox+CreateContainer+StartContainer {:.0} ms, then 1000 on both devices after {:.0} ms",
        created.as_secs_f64() * 1e3,
        took.as_secs_f64() * 1e3
    );

    // containerd restarts under the agent: it notices, keeps the weights, and manages pods made afterwards.
    containerd.stop();
    let lost =
        poll(patience(Duration::from_secs(10)), || agent.log_text().contains("CRI runtime unreachable").then_some(()));
    assert!(lost.is_some(), "agent did not notice containerd stopping; log:\n{}", agent.log_text());
    containerd.spawn();
    let back = poll(patience(Duration::from_secs(15)), || {
        agent.log_text().contains("CRI runtime answers again").then_some(())
    });
    assert!(back.is_some(), "agent did not reconnect; log:\n{}", agent.log_text());
    assert_eq!(
        pod_weights(&pod_dir(Qos::Guaranteed, &pinned), &bfq, &cost),
        Some((300, 300)),
        "pinned pod changed over the restart"
    );
    let after = uid(17);
    containerd.run_pod("restarted", &after, Qos::Guaranteed, &[], sleep, &[]);
    let after_dir = pod_dir(Qos::Guaranteed, &after);
    assert!(
        poll(patience(Duration::from_secs(5)), || (pod_weights(&after_dir, &bfq, &cost)? == (1000, 1000))
            .then_some(()))
        .is_some(),
        "pod made after the containerd restart not managed: {:?}\n{}",
        pod_weights(&after_dir, &bfq, &cost),
        agent.log_text()
    );

    // SIGTERM: both files of every managed pod as they were; the excluded pod never touched.
    let status = agent.sigterm_and_wait(patience(Duration::from_secs(10)));
    assert!(status.success(), "agent exit {status}:\n{}", agent.log_text());
    for (qos, u) in [
        (Qos::Burstable, &reader),
        (Qos::BestEffort, &idle),
        (Qos::Guaranteed, &pinned),
        (Qos::BestEffort, &bad),
        (Qos::Burstable, &fresh),
        (Qos::Guaranteed, &after),
    ] {
        let dir = pod_dir(qos, u);
        let now = (read(&dir.join("io.bfq.weight")), read(&dir.join("io.weight")));
        assert_eq!(now, before, "pod {} not restored", dir.display());
    }
    assert_eq!(
        (read(&excluded_dir.join("io.bfq.weight")), read(&excluded_dir.join("io.weight"))),
        excluded_before,
        "excluded pod touched"
    );
    eprintln!("after SIGTERM every managed pod reads io.bfq.weight {:?}, io.weight {:?} again", before.0, before.1);
    drop(containerd);
    for (qos, u) in [(Qos::Burstable, &reader), (Qos::Guaranteed, &after)] {
        assert!(!pod_dir(qos, u).exists(), "pod cgroup {} left behind", pod_dir(qos, u).display());
    }
    drop((bfq, cost));
}

/// The agent's io.cost rate watch: a loop device under io.cost whose model overstates it a thousandfold and whose
/// latency target (10 µs) no read can meet, so io.cost lowers `cost.vrate` to the `min=` of `io.cost.qos` and keeps
/// it there while a reader loads the device. The agent, told to check the device, warns once — naming the device
/// and the fix — after `cost.vrate` has sat at the floor for `blockdev::vrate::HOLD`; the root's files are put back
/// afterwards.
#[test]
#[ignore = "needs cgroup v2: the systemd guest, scripts/guest.sh"]
fn agent_warns_when_io_cost_sits_at_its_minimum_rate() {
    let test = "v2_real::agent_warns_when_io_cost_sits_at_its_minimum_rate";
    if !testbed::require(test, &[testbed::Need::Root, testbed::Need::V2TestBed]) {
        return;
    }
    let _machine = testbed::exclusive();
    let tmp_dir = TmpDir::new("vrate");
    let tmp = tmp_dir.0.clone();
    let mut cost = Loop::new(tmp.join("vrate.img"), "none");
    let model_file = format!("{CGROUP}/io.cost.model");
    let num = cost.num.clone();
    write(
        &model_file,
        &format!(
            "{} ctrl=user model=linear rbps=100000000000 rseqiops=10000000 rrandiops=10000000 \
             wbps=100000000000 wseqiops=10000000 wrandiops=10000000",
            cost.num
        ),
    );
    write(
        &format!("{CGROUP}/io.cost.qos"),
        &format!("{} enable=1 ctrl=user rpct=95 rlat=10 wpct=95 wlat=10 min=10 max=100", cost.num),
    );
    cost.io_cost = true; // the drop turns io.cost off and gives the model back to the kernel

    // Eight direct readers in a cgroup the agent manages (io.cost governs the I/O of non-root cgroups).
    let rel = format!("ddiskqos-vrate-{}", std::process::id());
    let parent = Path::new(CGROUP).join(&rel);
    std::fs::create_dir(&parent).unwrap();
    write(parent.join("cgroup.subtree_control").to_str().unwrap(), "+io");
    let group = parent.join("reader");
    std::fs::create_dir(&group).unwrap();
    let readers = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "echo $$ > {}/cgroup.procs; for i in 1 2 3 4 5 6 7 8; do \
             (while true; do dd if={} of=/dev/null bs=1M count=200 skip=$((i*20 % 56)) iflag=direct 2>/dev/null; done) & \
             done; wait",
            group.display(),
            cost.dev
        ))
        .process_group(0)
        .spawn()
        .expect("starting the readers");
    /// Stops the readers (their process group) and removes their cgroup and its parent.
    struct Readers(Child, [PathBuf; 2]);
    impl Drop for Readers {
        fn drop(&mut self) {
            let _ = Command::new("kill").args(["-KILL", "--", &format!("-{}", self.0.id())]).status();
            let _ = self.0.wait();
            for dir in &self.1 {
                for _ in 0..50 {
                    if std::fs::remove_dir(dir).is_ok() || !dir.exists() {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        }
    }
    let readers = Readers(readers, [group, parent]);

    let config = tmp.join("vrate-agent.toml");
    std::fs::write(
        &config,
        format!(
            "runtime = \"cgroup-dir\"\nsample_interval = \"100ms\"\nstate_file = \"{0}/vrate-state.json\"\n\
             control_socket = \"{0}/vrate-agent.sock\"\n[cgroup]\nparent = \"{1}\"\n[devices]\nprotect = \"off\"\ncheck = [\"{2}\"]\n",
            tmp.display(),
            rel,
            cost.name
        ),
    )
    .unwrap();
    let log = tmp.join("vrate-agent.log");
    let started = Instant::now();
    let mut agent = Agent::spawn(&config, log);
    let vrate_now = || {
        let stat = std::fs::read_to_string(format!("{CGROUP}/io.stat")).unwrap_or_default();
        qos_agent::blockdev::vrate::vrate_of(&stat, cost.num.parse().unwrap())
    };
    let warning = format!("io.cost RUNS AT ITS MINIMUM RATE on device {}", cost.num);
    let limit = qos_agent::blockdev::vrate::HOLD + patience(Duration::from_secs(40));
    let warned = poll(limit, || agent.log_text().contains(&warning).then_some(()));
    let Some((_, took)) = warned else {
        panic!("no warning within {limit:?}; cost.vrate now {:?}\n{}", vrate_now(), agent.log_text())
    };
    eprintln!(
        "warned {:.1} s after the agent started (cost.vrate now {:?}, the floor 10)",
        took.as_secs_f64(),
        vrate_now()
    );
    assert!(started.elapsed() >= qos_agent::blockdev::vrate::HOLD, "warned before the hold was up");
    let text = agent.log_text();
    assert!(text.contains(&format!("ddiskqos-agent iocost /dev/{} --apply", cost.name)), "no fix named:\n{text}");
    std::thread::sleep(Duration::from_secs(6));
    assert_eq!(agent.log_text().matches(&warning).count(), 1, "one warning per stay:\n{}", agent.log_text());
    let status = agent.sigterm_and_wait(patience(Duration::from_secs(10)));
    assert!(status.success(), "agent exit {status}:\n{}", agent.log_text());
    drop(readers);
    drop(cost);
    // The device's lines are gone with it or say io.cost is off and the model is the kernel's again.
    let (qos, model) = (root_line("io.cost.qos", &num), root_line("io.cost.model", &num));
    assert!(qos.as_deref().is_none_or(|l| l.contains("enable=0")), "io.cost.qos left: {qos:?}");
    assert!(model.as_deref().is_none_or(|l| l.contains("ctrl=auto")), "io.cost.model left: {model:?}");
}

/// The DaemonSet's pod on cgroup v2: `deploy_real`'s test with the ConfigMap's documented v2 root
/// (`/host/sys/fs/cgroup`) and pod weights in `io.bfq.weight`; containerd inside the test bed.
#[test]
#[ignore = "needs the cgroup-v2 test bed with the cpu controller, containerd and the agent's image: scripts/test.sh"]
fn the_daemonset_on_cgroup_v2() {
    let needs = [
        testbed::Need::Root,
        testbed::Need::V2TestBed,
        testbed::Need::V2Cpu,
        testbed::Need::LoopDevices,
        testbed::Need::Bfq,
        testbed::Need::Program("containerd"),
        testbed::Need::Program("ctr"),
        testbed::Need::Program("runc"),
        testbed::Need::DockerImage(crate::deploy_real::IMAGE),
    ];
    if !testbed::require("v2_real::the_daemonset_on_cgroup_v2", &needs) {
        return;
    }
    crate::deploy_real::run_daemonset(crate::deploy_real::Tree::V2);
}

/// Protection by default on cgroup v2: a managed device whose scheduler is not BFQ gets io.cost with a model the
/// agent measures at start (status shows both lines as set), a BFQ device gets the short slots, and SIGTERM turns
/// io.cost off again with the kernel's model and puts the BFQ tunables back. Needs the guest pass
/// (`scripts/test.sh`); never run on the v1 host.
#[test]
#[ignore = "needs cgroup v2: the systemd guest, scripts/guest.sh"]
fn protection_by_default_enables_io_cost_where_bfq_is_not_the_scheduler_and_puts_it_back() {
    let test = "v2_real::protection_by_default_enables_io_cost_where_bfq_is_not_the_scheduler_and_puts_it_back";
    if !testbed::require(test, &[testbed::Need::Root, testbed::Need::V2TestBed, testbed::Need::Bfq]) {
        return;
    }
    let _machine = testbed::exclusive();
    let tmp_dir = TmpDir::new("protect");
    let tmp = tmp_dir.0.clone();
    let mut cost = Loop::new(tmp.join("protect-none.img"), "none");
    let bfq = Loop::new(tmp.join("protect-bfq.img"), "bfq");
    // The Loop turns io.cost off on drop and gives the model back to the kernel, whatever happens.
    cost.io_cost = true;
    assert!(!io_cost_on(&cost.num), "io.cost already on for {}", cost.num);
    let qos0 = root_line("io.cost.qos", &cost.num);
    let tunable =
        |key: &str| read(Path::new(&format!("/sys/block/{}/queue/iosched/{key}", bfq.name))).trim().to_string();
    let depth = || read(Path::new(&format!("/sys/block/{}/queue/nr_requests", bfq.name))).trim().to_string();
    let size = || read(Path::new(&format!("/sys/block/{}/queue/max_sectors_kb", bfq.name))).trim().to_string();
    let (budget0, depth0, size0) = (tunable("max_budget"), depth(), size());
    let slot0 = tunable("timeout_sync");
    let rotates = read(Path::new(&format!("/sys/block/{}/queue/rotational", bfq.name))).trim() != "0";
    let rel = format!("ddiskqos-protect-{}", std::process::id());
    let parent = Path::new(CGROUP).join(&rel);
    std::fs::create_dir(&parent).unwrap();
    struct RemoveDir(PathBuf);
    impl Drop for RemoveDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir(&self.0);
        }
    }
    let _parent = RemoveDir(parent);
    let config = tmp.join("protect-agent.toml");
    std::fs::write(
        &config,
        format!(
            "runtime = \"cgroup-dir\"\nsample_interval = \"100ms\"\nstate_file = \"{0}/protect-state.json\"\n\
             control_socket = \"{0}/protect-agent.sock\"\n[cgroup]\nparent = \"{1}\"\n[devices]\n\
             check = [\"{2}\", \"{3}\"]\n",
            tmp.display(),
            rel,
            cost.name,
            bfq.name
        ),
    )
    .unwrap();
    let mut agent = Agent::spawn(&config, tmp.join("protect-agent.log"));
    let socket = tmp.join("protect-agent.sock");
    let ready = poll(patience(Duration::from_secs(60)), || socket.exists().then_some(()));
    assert!(ready.is_some(), "agent not serving:\n{}", agent.log_text());
    assert!(io_cost_on(&cost.num), "io.cost not enabled for {}:\n{}", cost.num, agent.log_text());
    let model = root_line("io.cost.model", &cost.num).unwrap_or_default();
    assert!(model.contains("ctrl=user") && model.contains("model=linear"), "{model}");
    assert_eq!(depth(), "4", "the BFQ device's queue made shallow");
    let size_set: u32 = size().parse().unwrap();
    assert!(
        size_set <= 128 && (size_set == 128 || size_set.to_string() == size0),
        "max_sectors_kb {size_set}, was {size0}"
    );
    assert_eq!(tunable("max_budget"), budget0, "BFQ's other tunables left as they are");
    // Short slots where the device reports it does not rotate, or reports it does (a guest's loop device may) and
    // the lone read the agent measured and logged took under 2 ms; never lengthened.
    let log = agent.log_text();
    let lone_us = log
        .lines()
        .filter(|l| l.contains("measured a device that reports it rotates") && l.contains(&bfq.name))
        .find_map(|l| l.split_whitespace().find_map(|w| w.strip_prefix("lone_read_us=")?.parse::<u64>().ok()));
    assert_eq!(lone_us.is_some(), rotates && slot0.parse::<u32>().unwrap() > 32, "measured iff it rotates:\n{log}");
    let seek_free = !rotates || lone_us.is_some_and(|us| us < 2_000);
    let slot_set = if !seek_free || slot0.parse::<u32>().unwrap() <= 32 { slot0.clone() } else { "32".into() };
    assert_eq!(
        tunable("timeout_sync"),
        slot_set,
        "BFQ's slots (rotational {rotates}, lone read {lone_us:?} µs, was {slot0})"
    );
    let st = status_json(&socket);
    let row =
        |dev: &str, setting: &str| st.device_settings.iter().find(|r| r.device == dev && r.setting == setting).cloned();
    for (dev, setting) in [(&cost.name, "io.cost.model"), (&cost.name, "io.cost.qos"), (&bfq.name, "nr_requests")] {
        let r = row(dev, setting).unwrap_or_else(|| panic!("no {dev} {setting} row: {st:?}"));
        assert!(r.as_set(), "{r:?}");
    }
    let status = agent.sigterm_and_wait(patience(Duration::from_secs(10)));
    assert!(status.success(), "agent exit {status}:\n{}", agent.log_text());
    assert!(!io_cost_on(&cost.num), "io.cost left on:\n{}", agent.log_text());
    // Put back as it was, latency targets included (the kernel's own with ctrl=auto), not only switched off.
    let qos = root_line("io.cost.qos", &cost.num);
    match &qos0 {
        Some(was) => assert_eq!(qos.as_deref(), Some(was.as_str()), "io.cost.qos not put back"),
        None => assert!(qos.as_deref().is_none_or(|l| l.contains("enable=0 ctrl=auto")), "io.cost.qos left: {qos:?}"),
    }
    let model = root_line("io.cost.model", &cost.num);
    assert!(model.as_deref().is_none_or(|l| l.contains("ctrl=auto")), "model left: {model:?}");
    assert_eq!(depth(), depth0);
    assert_eq!(size(), size0, "the request size put back");
    assert_eq!(tunable("max_budget"), budget0);
    assert_eq!(tunable("timeout_sync"), slot0, "the slots put back");
}

/// The bottom level's cap on a real v2 kernel: the file writer writes `io.max` for a BFQ device of a cgroup, the
/// kernel holds reads to it, a lift removes it, and limits of the cgroup's own are kept (the lower one) and put back
/// exactly, also by the next writer from the records a crashed one left.
#[test]
#[ignore = "needs cgroup v2: the systemd guest, scripts/guest.sh"]
fn cap_writer_writes_io_max_the_kernel_enforces_it_and_a_lift_puts_back_exactly() {
    use qos_agent::backend::ContainerInfo;
    use qos_agent::cgroup::CgroupRoot;
    use qos_agent::files::{FileWriter, LeftoverCap};
    use qos_core::{Cap, ContainerId};

    let test = "v2_real::cap_writer_writes_io_max_the_kernel_enforces_it_and_a_lift_puts_back_exactly";
    if !testbed::require(test, &[testbed::Need::Root, testbed::Need::V2TestBed]) {
        return;
    }
    let _machine = testbed::exclusive();
    const MIB: u64 = 1 << 20;
    let tmp_dir = TmpDir::new("cap");
    let disk = Loop::new(tmp_dir.0.join("cap.img"), "bfq");
    let cg = testbed::blkio::CgroupGuard::new_v2("ddiskqos-cap");
    let root = CgroupRoot::detect().expect("the v2 root");
    let io_max = cg.path.join("io.max");
    // The device's line in io.max, if it has one.
    let line = || read(&io_max).lines().find(|l| l.starts_with(&format!("{} ", disk.num))).map(str::to_owned);
    let info = ContainerInfo {
        id: ContainerId::new("cap"),
        name: "cap".into(),
        labels: Default::default(),
        cgroup: Some(root.resolve_relative(&cg.rel).unwrap()),
    };
    let records = qos_agent::files::restore_records::records_path(&tmp_dir.0.join("state.json"), "caps");
    let new_writer =
        || FileWriter::new(root.path()).with_devices(vec![disk.name.clone()]).with_cap_records_file(records.clone());
    let mut writer = new_writer();
    assert_eq!(line(), None, "a new cgroup has no limit on {}", disk.dev);

    let done = writer.write_cap(&info, Some(Cap { read_bps: Some(4 * MIB), write_bps: Some(2 * MIB) })).unwrap();
    eprintln!("after the cap: io.max {:?}", read(&io_max));
    assert_eq!(line().as_deref(), Some(format!("{} rbps=4194304 wbps=2097152 riops=max wiops=max", disk.num).as_str()));
    assert_eq!(done.len(), 1, "{done:?}");
    // Enforced: 16 MiB of direct reads at 4 MiB/s take about 4 s less the first slice.
    let t = Instant::now();
    testbed::blkio::run_in_cgroup(
        &cg.path,
        &format!("dd if={} of=/dev/null bs=1M count=16 iflag=direct status=none", disk.dev),
    );
    let took = t.elapsed();
    eprintln!("16 MiB under a 4 MiB/s read cap: {took:?}");
    assert!(took >= Duration::from_secs(2), "the cap did not hold the reads: {took:?}");
    writer.write_cap(&info, None).unwrap();
    eprintln!("after the lift: io.max {:?}", read(&io_max));
    assert_eq!(line(), None, "no limit again");
    assert!(!records.exists(), "the record is dropped with the lift");

    // Limits of the cgroup's own: reads 1 MiB/s (under the cap), writes 64 MiB/s (over it), IOPS 500.
    write(io_max.to_str().unwrap(), &format!("{} rbps=1048576 wbps=67108864 riops=500", disk.num));
    let before = line();
    assert_eq!(
        before.as_deref(),
        Some(format!("{} rbps=1048576 wbps=67108864 riops=500 wiops=max", disk.num).as_str())
    );
    writer.write_cap(&info, Some(Cap { read_bps: Some(8 * MIB), write_bps: Some(8 * MIB) })).unwrap();
    eprintln!("capped over limits of its own: io.max {:?}", read(&io_max));
    assert_eq!(
        line().as_deref(),
        Some(format!("{} rbps=1048576 wbps=8388608 riops=500 wiops=max", disk.num).as_str()),
        "the lower read limit and the IOPS limit kept"
    );
    writer.write_cap(&info, None).unwrap();
    assert_eq!(line(), before, "put back exactly");

    // A crash with the cap in force: the next writer puts the limits back from the records file.
    writer.write_cap(&info, Some(Cap { read_bps: Some(MIB / 2), write_bps: None })).unwrap();
    assert_eq!(line().as_deref(), Some(format!("{} rbps=524288 wbps=67108864 riops=500 wiops=max", disk.num).as_str()));
    drop(writer);
    let mut writer = new_writer();
    let done = writer.restore_leftover_caps(&root);
    assert!(matches!(done.as_slice(), [LeftoverCap::Restored { .. }]), "{done:?}");
    assert_eq!(line(), before, "put back after the crash");
    assert!(!records.exists());
}
