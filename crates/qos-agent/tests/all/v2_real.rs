//! The agent on real cgroup v2, against a real dockerd, with one BFQ loop device and one io.cost loop device.
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
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const CGROUP: &str = "/sys/fs/cgroup";
const DOCKER: &str = "/usr/bin/docker";
const IMAGE: &str = "ddiskqos-test:latest";
/// The agent under test; `DDISKQOS_V2_AGENT` names another build (e.g. to see an older agent fail this test).
fn agent_binary() -> PathBuf {
    std::env::var_os("DDISKQOS_V2_AGENT")
        .map_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_ddiskqos-agent")), PathBuf::from)
}

/// A heavy reader is demoted within this long of the agent starting (it reads 128 MiB a pass).
const DEMOTE_WITHIN: Duration = Duration::from_secs(10);
/// A new container has the top weight on both devices within this long of `docker run` returning.
const TOP_WITHIN: Duration = Duration::from_secs(1);

fn run(cmd: &str, args: &[&str]) -> String {
    let out = Command::new(cmd).args(args).output().unwrap_or_else(|e| panic!("{cmd} {args:?}: {e}"));
    assert!(out.status.success(), "{cmd} {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn write(path: &str, data: &str) {
    std::fs::write(path, data).unwrap_or_else(|e| panic!("writing {data:?} to {path}: {e}"));
}

/// A file-backed loop device with direct I/O; detached (scheduler back to none first, so it pins no cgroups,
/// and io.cost off for it) on drop.
struct Loop {
    dev: String,
    name: String,
    num: String,
    file: PathBuf,
    io_cost: bool,
}

impl Loop {
    fn new(file: PathBuf, scheduler: &str) -> Self {
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

    fn enable_io_cost(&mut self) {
        write(&format!("{CGROUP}/io.cost.qos"), &format!("{} enable=1", self.num));
        self.io_cost = true;
        let qos = std::fs::read_to_string(format!("{CGROUP}/io.cost.qos")).unwrap();
        assert!(qos.lines().any(|l| l.starts_with(&format!("{} enable=1", self.num))), "io.cost.qos: {qos}");
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        if self.io_cost {
            let _ = std::fs::write(format!("{CGROUP}/io.cost.qos"), format!("{} enable=0", self.num));
        }
        let _ = std::fs::write(format!("/sys/block/{}/queue/scheduler", self.name), "none");
        let _ = Command::new("losetup").args(["-d", &self.dev]).status();
        let _ = std::fs::remove_file(&self.file);
    }
}

/// The test's scratch directory (config, log, state, backing files), removed on drop, also after a failure (the
/// agent's log is printed in every failure message).
struct TmpDir(PathBuf);

impl TmpDir {
    fn new() -> Self {
        let dir = std::env::temp_dir().join(format!("ddiskqos-v2-real-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }
}

impl Drop for TmpDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Containers of the test bed's dockerd, removed on drop.
#[derive(Default)]
struct Containers(Vec<String>);

impl Containers {
    fn run(&mut self, args: &[&str]) -> String {
        let mut all = vec!["run", "-d"];
        all.extend_from_slice(args);
        let id = run(DOCKER, &all);
        self.0.push(id.clone());
        id
    }
}

impl Drop for Containers {
    fn drop(&mut self) {
        if !self.0.is_empty() {
            let mut args = vec!["rm", "-f"];
            args.extend(self.0.iter().map(String::as_str));
            let _ = Command::new(DOCKER).args(&args).stdout(Stdio::null()).stderr(Stdio::null()).status();
        }
    }
}

/// The agent process; killed on drop (if the test did not stop it).
struct Agent {
    child: Child,
    log: PathBuf,
}

impl Agent {
    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn sigterm_and_wait(&mut self, limit: Duration) -> std::process::ExitStatus {
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
fn effective(file: &Path, num: &str) -> Option<u32> {
    let text = std::fs::read_to_string(file).ok()?;
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

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn poll<T>(limit: Duration, mut f: impl FnMut() -> Option<T>) -> Option<(T, Duration)> {
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

fn scrape(port: u16) -> String {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else { return String::new() };
    let _ = s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n");
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

#[test]
#[ignore = "needs the cgroup-v2 test bed: scripts/cgroup-v2.sh"]
fn agent_on_v2_weights_each_device_through_the_file_that_governs_it() {
    let test = "v2_real::agent_on_v2_weights_each_device_through_the_file_that_governs_it";
    if !testbed::require(test, &[testbed::Need::Root, testbed::Need::V2TestBed]) {
        return;
    }
    let docker_host = std::env::var("DOCKER_HOST").unwrap_or_default();
    let socket = PathBuf::from(docker_host.strip_prefix("unix://").expect("checked by the test bed need"));
    let version = run(DOCKER, &["info", "--format", "{{.CgroupVersion}}"]);
    assert_eq!(version, "2", "the dockerd at {docker_host} is not on cgroup v2");

    let tmp_dir = TmpDir::new();
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
             [devices]\ncheck = [\"{2}\", \"{3}\", \"{4}\"]\n[metrics]\nenabled = true\nlisten = \"127.0.0.1:{5}\"\n\
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
    let started = Instant::now();
    let child = Command::new(agent_binary())
        .args(["-c", config.to_str().unwrap()])
        .env("DDISKQOS_LOG", "info")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .expect("starting the agent");
    let mut agent = Agent { child, log };

    // The heavy reader is demoted on both devices, each in the file that governs it.
    let heavy_bfq = heavy_dir.join("io.bfq.weight");
    let heavy_io = heavy_dir.join("io.weight");
    let demoted = poll(DEMOTE_WITHIN + Duration::from_secs(20), || {
        let (b, i) = (effective(&heavy_bfq, &bfq.num)?, effective(&heavy_io, &cost.num)?);
        (b < 100 && i < 100).then_some((b, i))
    });
    let Some(((heavy_b, heavy_i), took)) = demoted else {
        panic!(
            "heavy reader not demoted below 100 on both devices: io.bfq.weight {:?}, io.weight {:?}, io.stat {:?}\n{}",
            std::fs::read_to_string(&heavy_bfq),
            std::fs::read_to_string(&heavy_io),
            std::fs::read_to_string(heavy_dir.join("io.stat")),
            agent.log_text()
        )
    };
    let since_start = started.elapsed();
    eprintln!(
        "heavy demoted: io.bfq.weight on {} = {heavy_b}, io.weight on {} = {heavy_i}, {:.2} s after the agent started",
        bfq.num,
        cost.num,
        took.as_secs_f64()
    );
    assert!(since_start <= DEMOTE_WITHIN, "demotion took {since_start:?}:\n{}", agent.log_text());
    // Let it reach the bottom (10) before the comparison with a new container.
    let bottom = poll(Duration::from_secs(15), || {
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
    let fresh_dir = Path::new(CGROUP).join("docker").join(&fresh);
    let (fresh_bfq, fresh_io) = (fresh_dir.join("io.bfq.weight"), fresh_dir.join("io.weight"));
    let top = poll(TOP_WITHIN + Duration::from_secs(5), || {
        let (b, i) = (effective(&fresh_bfq, &bfq.num)?, effective(&fresh_io, &cost.num)?);
        (b == 1000 && i >= 1000).then_some((b, i))
    });
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
         {heavy_i_now}), {:.3} s after docker run returned ({:.3} s after it was invoked)",
        bfq.num,
        cost.num,
        fresh_i / heavy_i_now.max(1),
        top_took.as_secs_f64(),
        since_invoked.as_secs_f64()
    );
    assert!(top_took <= TOP_WITHIN, "the new container's top weight took {top_took:?}:\n{}", agent.log_text());
    assert!(fresh_i >= 50 * heavy_i_now, "io.weight {fresh_i} vs heavy {heavy_i_now}: less than 50x");

    // The agent said what acts where: metric per device, one warning for the device nothing governs, and the
    // Docker fallback once.
    let metrics = scrape(port);
    for (num, governor, value) in [(&bfq.num, "bfq", 1), (&cost.num, "io-cost", 1), (&plain.num, "none", 0)] {
        let series = format!("ddiskqos_device_weight_effective{{device=\"{num}\",governor=\"{governor}\"}} {value}");
        assert!(metrics.contains(&series), "metrics lack {series:?}:\n{metrics}");
    }
    let log_text = agent.log_text();
    let warned = format!("HAVE NO EFFECT ON DEVICE {}", plain.num);
    assert_eq!(log_text.matches(&warned).count(), 1, "one warning for {}:\n{log_text}", plain.dev);
    assert_eq!(log_text.matches("writes io.bfq.weight only").count(), 1, "one fallback notice:\n{log_text}");

    // SIGTERM: both files of both containers back to what Docker made them.
    let status = agent.sigterm_and_wait(Duration::from_secs(10));
    assert!(status.success(), "agent exit {status}:\n{}", agent.log_text());
    for (what, dir) in [("heavy", &heavy_dir), ("new", &fresh_dir)] {
        assert_eq!(read(&dir.join("io.bfq.weight")), bfq_before, "{what}: io.bfq.weight not restored");
        assert_eq!(read(&dir.join("io.weight")), io_before, "{what}: io.weight not restored");
    }
    eprintln!("after SIGTERM both containers read io.bfq.weight {bfq_before:?}, io.weight {io_before:?} again");
    drop(containers);
    drop((bfq, cost, plain));
}
