//! How the agent's cost grows with the number of containers: CPU time per sampling round and per container,
//! memory, and Docker API calls, measured on the real agent binary from outside (`/proc`), at steady state.
//!
//! Two kinds of containers:
//! - `cgroups`: N real v1 blkio cgroups under a test parent, managed with `runtime = "cgroup-dir"`; by default
//!   each has done one 4 KiB O_DIRECT read on a BFQ loop device, so its counter file lists a device like a busy
//!   container's (`--no-io`: empty cgroups);
//! - `docker`: N real `sleep` containers of a dedicated dockerd (`testbed::dockerd`), managed with
//!   `runtime = "docker"` through a proxy socket that counts the agent's API requests.
//!
//! For each N the agent runs with the default sampling interval (500 ms) unless `--interval` says otherwise;
//! after every container is at the top weight (checked in its cgroup file and in the status table) and a
//! warm-up, CPU time (sum of `/proc/PID/task/*/schedstat`) and rounds (the agent's own
//! `ddiskqos_round_duration_seconds_count`) are taken over `--seconds` of steady state.
//!
//! ```text
//! sudo scripts/scale.sh                                  # cgroups 64,256,1024; docker 64,256
//! cargo run --release -p qos-agent --example scale -- --cgroups 64,1024 --docker 64 --seconds 20
//! ```
//! Options: `--cgroups LIST`, `--docker LIST` (empty to skip), `--seconds S` (default 30), `--warmup S`
//! (default 5), `--interval DUR` (default 500ms), `--no-io`, `--busy LIST` (of `one`, `tenth`, `all`: which
//! cgroups do I/O in the rows after the idle one; default all three), `--agent PATH` (default: `ddiskqos-agent` next to
//! the `examples/` directory of this binary). Needs root, cgroup v1 blkio, and for `--docker` dockerd.

use std::fs;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use testbed::blkio::{run_in_cgroup, CgroupGuard, BLKIO};
use testbed::dockerd::{CountingProxy, Dockerd};
use testbed::loopdev::LoopDevice;
use testbed::probe::*;
use testbed::Need;

struct Options {
    cgroups: Vec<usize>,
    docker: Vec<usize>,
    seconds: u64,
    warmup: u64,
    interval: String,
    io: bool,
    busy: Vec<Busy>,
    agent: PathBuf,
}

fn parse_list(s: &str) -> Vec<usize> {
    s.split(',').filter(|x| !x.is_empty()).map(|x| x.trim().parse().expect("a list of numbers")).collect()
}

fn options() -> Options {
    let exe = std::env::current_exe().unwrap();
    let mut o = Options {
        cgroups: vec![64, 256, 1024],
        docker: vec![64, 256],
        seconds: 30,
        warmup: 5,
        interval: "500ms".into(),
        io: true,
        busy: vec![Busy::One, Busy::Tenth, Busy::All],
        agent: exe.parent().and_then(Path::parent).unwrap().join("ddiskqos-agent"),
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = || args.next().unwrap_or_else(|| panic!("{a} needs a value"));
        match a.as_str() {
            "--cgroups" => o.cgroups = parse_list(&value()),
            "--docker" => o.docker = parse_list(&value()),
            "--seconds" => o.seconds = value().parse().unwrap(),
            "--warmup" => o.warmup = value().parse().unwrap(),
            "--interval" => o.interval = value(),
            "--no-io" => o.io = false,
            "--busy" => {
                o.busy = value()
                    .split(',')
                    .filter(|x| !x.is_empty())
                    .map(|x| match x.trim() {
                        "one" => Busy::One,
                        "tenth" => Busy::Tenth,
                        "all" => Busy::All,
                        other => panic!("--busy takes one,tenth,all; got {other:?}"),
                    })
                    .collect()
            }
            "--agent" => o.agent = PathBuf::from(value()),
            "-h" | "--help" => {
                println!("see the doc comment of crates/qos-agent/examples/scale.rs");
                std::process::exit(0);
            }
            other => panic!("unknown option {other}"),
        }
    }
    o
}

/// The agent binary under test, killed on drop.
struct AgentProc {
    child: Child,
    dir: tempfile::TempDir,
    metrics: SocketAddr,
}

impl AgentProc {
    fn start(agent: &Path, runtime_part: &str, interval: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let metrics = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let cfg = format!(
            "sample_interval = \"{interval}\"\nactuator = \"auto\"\nstate_file = \"{d}/state.json\"\n\
             control_socket = \"{d}/agent.sock\"\n{runtime_part}\n[metrics]\nenabled = true\nlisten = \"{metrics}\"\n\
             [mlfq]\nboost_after = \"1h\"\nidle_promote_after = \"off\"\n",
            d = dir.path().display()
        );
        fs::write(dir.path().join("agent.toml"), cfg).unwrap();
        let child = Command::new(agent)
            .arg("-c")
            .arg(dir.path().join("agent.toml"))
            .env("DDISKQOS_LOG", "info")
            .stdout(Stdio::null())
            .stderr(fs::File::create(dir.path().join("agent.log")).unwrap())
            .spawn()
            .unwrap_or_else(|e| panic!("{}: {e} (build it: cargo build --release -p qos-agent)", agent.display()));
        Self { child, dir, metrics }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn socket(&self) -> PathBuf {
        self.dir.path().join("agent.sock")
    }

    fn log(&self) -> String {
        fs::read_to_string(self.dir.path().join("agent.log")).unwrap_or_default()
    }

    fn stop(mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let _ = self.child.wait();
    }
}

impl Drop for AgentProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One measured configuration.
struct Row {
    mode: &'static str,
    n: usize,
    rounds: f64,
    cpu_ns: u64,
    wall: Duration,
    round_mean: f64,
    rss_kib: u64,
    api_calls: Option<usize>,
}

impl Row {
    fn cpu_per_round_us(&self) -> f64 {
        self.cpu_ns as f64 / 1e3 / self.rounds.max(1.0)
    }
    fn cpu_per_container_us(&self) -> f64 {
        self.cpu_per_round_us() / self.n as f64
    }
    fn core_percent(&self) -> f64 {
        self.cpu_ns as f64 / self.wall.as_nanos() as f64 * 100.0
    }
}

/// Waits until the agent manages exactly `dirs` at weight 1000 (cgroup files and status table), then measures.
fn measure(mode: &'static str, agent: &AgentProc, dirs: &[PathBuf], o: &Options, proxy: Option<&CountingProxy>) -> Row {
    let n = dirs.len();
    let t = Instant::now();
    loop {
        let table = status(&agent.socket()).map(|s| s.containers.len()).unwrap_or(0);
        let at_top = dirs.iter().filter(|d| read_weight(d) == Some(1000)).count();
        if table == n && at_top == n {
            break;
        }
        if t.elapsed() > Duration::from_secs(120) {
            panic!("{mode} N={n}: {at_top} at weight 1000, {table} in the table after 120 s\n{}", agent.log());
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    std::thread::sleep(Duration::from_secs(o.warmup));
    let pid = agent.pid();
    let m0 = scrape(agent.metrics).expect("metrics");
    let (cpu0, t0) = (cpu_ns(pid), Instant::now());
    let calls0 = proxy.map(|p| p.requests().len());
    std::thread::sleep(Duration::from_secs(o.seconds));
    let (cpu1, wall) = (cpu_ns(pid), t0.elapsed());
    let m1 = scrape(agent.metrics).expect("metrics");
    let calls = proxy.map(|p| p.requests().len() - calls0.unwrap());
    let count = |m: &str| metric(m, "ddiskqos_round_duration_seconds_count").unwrap_or(0.0);
    let sum = |m: &str| metric(m, "ddiskqos_round_duration_seconds_sum").unwrap_or(0.0);
    let rounds = count(&m1) - count(&m0);
    let still = dirs.iter().filter(|d| read_weight(d) == Some(1000)).count();
    assert_eq!(still, n, "{mode} N={n}: weights changed during the measurement");
    assert_eq!(metric(&m1, "ddiskqos_containers"), Some(n as f64), "{mode} N={n}: container gauge");
    Row {
        mode,
        n,
        rounds,
        cpu_ns: cpu1 - cpu0,
        wall,
        round_mean: (sum(&m1) - sum(&m0)) / rounds.max(1.0),
        rss_kib: vm_rss_kib(pid),
        api_calls: calls,
    }
}

fn read_weight(dir: &Path) -> Option<u32> {
    fs::read_to_string(dir.join("blkio.bfq.weight")).ok()?.trim().parse().ok()
}

/// N real blkio cgroups `c0000`.. under one parent, removed with it.
struct CgroupSet {
    parent: CgroupGuard,
    dirs: Vec<PathBuf>,
}

impl CgroupSet {
    fn new(n: usize, io: Option<&LoopDevice>) -> Self {
        let parent = CgroupGuard::new(&format!("ddq-scale-{n}"));
        let dirs: Vec<PathBuf> = (0..n).map(|i| parent.child(&format!("c{i:04}"))).collect();
        if let Some(lo) = io {
            // One 4 KiB direct read per cgroup, so each counter file lists a device like a busy container's.
            for d in &dirs {
                let dev = lo.dev.display();
                run_in_cgroup(d, &format!("dd if={dev} of=/dev/null bs=4k count=1 iflag=direct status=none"));
            }
        }
        Self { parent, dirs }
    }
}

/// How many of the N cgroups do I/O during a row.
#[derive(Clone, Copy)]
enum Busy {
    /// One cgroup.
    One,
    /// Every tenth.
    Tenth,
    /// Every cgroup, every round: the worst case, nothing to skip.
    All,
}

impl Busy {
    fn mode(self) -> &'static str {
        match self {
            Self::One => "cgroups, 1 busy",
            Self::Tenth => "cgroups, 10 % busy",
            Self::All => "cgroups, all busy",
        }
    }

    fn pick(self, dirs: &[PathBuf]) -> Vec<PathBuf> {
        match self {
            Self::One => dirs[..1].to_vec(),
            Self::Tenth => dirs.iter().step_by(10).cloned().collect(),
            Self::All => dirs.to_vec(),
        }
    }
}

/// A thread that, every 250 ms, moves itself into each busy cgroup in turn (v1 `tasks`) and does one 4 KiB
/// O_DIRECT read there (512 bytes: a whole run stays far below the 2 MiB
/// of the first demotion), so each busy cgroup's counters move twice per 500 ms round; back to the root on drop.
/// One thread instead of a process per cgroup keeps the load generator's own noise small.
struct Walker {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Walker {
    fn start(dirs: Vec<PathBuf>, dev: &Path) -> Self {
        use std::os::unix::fs::{FileExt, OpenOptionsExt};
        use std::sync::atomic::Ordering;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        let dev = dev.to_path_buf();
        let thread = std::thread::spawn(move || {
            let tid = fs::read_link("/proc/thread-self").unwrap();
            let tid = tid.file_name().unwrap().to_str().unwrap().to_string();
            let disk = fs::OpenOptions::new().read(true).custom_flags(libc::O_DIRECT).open(&dev).unwrap();
            let mut buf = vec![0u8; 8192];
            let off = buf.as_ptr().align_offset(4096);
            while !flag.load(Ordering::Relaxed) {
                let t = Instant::now();
                for d in &dirs {
                    fs::write(d.join("tasks"), &tid).unwrap();
                    disk.read_at(&mut buf[off..off + 512], 0).unwrap();
                }
                std::thread::sleep(Duration::from_millis(250).saturating_sub(t.elapsed()));
            }
            fs::write(Path::new(BLKIO).join("tasks"), &tid).unwrap();
        });
        Self { stop, thread: Some(thread) }
    }
}

impl Drop for Walker {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Rows per N: an idle host (no I/O under the parent: the agent's parent gate skips every child), then I/O in
/// one cgroup, in every tenth, and in all of them (each busy cgroup reads 4 KiB every 250 ms).
fn run_cgroups(n: usize, o: &Options, lo: Option<&LoopDevice>) -> Vec<Row> {
    eprintln!("cgroups N={n}: creating");
    let set = CgroupSet::new(n, lo);
    let runtime = format!("runtime = \"cgroup-dir\"\n[cgroup]\nroot = \"auto\"\nparent = \"{}\"", set.parent.rel);
    let agent = AgentProc::start(&o.agent, &runtime, &o.interval);
    eprintln!("cgroups N={n}: measuring {} s idle", o.seconds);
    let idle = measure("cgroups, idle", &agent, &set.dirs, o, None);
    let mut rows = vec![idle];
    if let Some(lo) = lo {
        for busy in o.busy.iter().copied() {
            let walker = Walker::start(busy.pick(&set.dirs), &lo.dev);
            eprintln!("cgroups N={n}: measuring {} s, {}", o.seconds, busy.mode());
            rows.push(measure(busy.mode(), &agent, &set.dirs, o, None));
            drop(walker);
        }
    }
    agent.stop();
    rows
}

fn run_docker(n: usize, o: &Options) -> Row {
    eprintln!("docker N={n}: starting a dedicated dockerd and {n} containers");
    let d = Dockerd::start("scale");
    let dirs: Vec<PathBuf> = d.run_sleepers(n, 86400).iter().map(|id| d.cgroup(id)).collect();
    let proxy = CountingProxy::start(d.base.join("proxy.sock"), d.socket.clone());
    let runtime = format!("runtime = \"docker\"\n[docker]\nsocket = \"{}\"", proxy.socket.display());
    let agent = AgentProc::start(&o.agent, &runtime, &o.interval);
    eprintln!("docker N={n}: measuring {} s", o.seconds);
    let row = measure("docker", &agent, &dirs, o, Some(&proxy));
    agent.stop();
    row
}

fn main() {
    let o = options();
    let mut needs = vec![Need::Root, Need::BlkioV1];
    if o.io {
        needs.extend([Need::LoopDevices, Need::Bfq]);
    }
    if !o.docker.is_empty() {
        needs.push(Need::PrivateDockerd);
    }
    let missing = testbed::require::missing(&needs);
    assert!(missing.is_empty(), "needs {} (scripts/setup-host.sh, as root)", missing.join(", "));
    assert!(o.agent.exists(), "{} missing: cargo build --release -p qos-agent", o.agent.display());
    let lo = o.io.then(|| LoopDevice::with_bfq(64));
    let mut rows = Vec::new();
    for &n in &o.cgroups {
        rows.extend(run_cgroups(n, &o, lo.as_ref()));
    }
    for &n in &o.docker {
        rows.push(run_docker(n, &o));
    }

    println!(
        "\nagent {} | sampling interval {} | {} s of steady state per row | counters: {}\n",
        o.agent.display(),
        o.interval,
        o.seconds,
        if o.io { "one device per cgroup" } else { "empty cgroups" }
    );
    println!(
        "| containers | mode    | rounds | CPU/round (µs) | CPU/container/round (µs) | round (agent's own, µs) \
         | CPU, % of one core | RSS (MiB) | Docker API calls in window |"
    );
    println!("|---:|---|---:|---:|---:|---:|---:|---:|---:|");
    for r in &rows {
        println!(
            "| {} | {} | {:.0} | {:.0} | {:.2} | {:.0} | {:.3} | {:.1} | {} |",
            r.n,
            r.mode,
            r.rounds,
            r.cpu_per_round_us(),
            r.cpu_per_container_us(),
            r.round_mean * 1e6,
            r.core_percent(),
            r.rss_kib as f64 / 1024.0,
            r.api_calls.map_or("-".into(), |c| c.to_string()),
        );
    }
    // The targets of the issue, for the cgroup rows.
    for mode in ["cgroups, idle", Busy::One.mode(), Busy::Tenth.mode(), Busy::All.mode()] {
        let cg: Vec<&Row> = rows.iter().filter(|r| r.mode == mode).collect();
        if let (Some(small), Some(big)) = (cg.first(), cg.last()) {
            if small.n != big.n {
                let ratio = big.cpu_per_container_us() / small.cpu_per_container_us();
                println!(
                    "\n{mode}: per-container CPU per round, N={} vs N={}: x{ratio:.2} (target: within 20 %)",
                    big.n, small.n
                );
            }
            println!("{mode}: CPU at N={}: {:.3} % of one core (target: < 1 %)", big.n, big.core_percent());
        }
    }
    let calls: usize = rows.iter().filter_map(|r| r.api_calls).sum();
    if rows.iter().any(|r| r.api_calls.is_some()) {
        println!("Docker API calls during the steady-state windows: {calls} (target: 0, none per round)");
    }
}
