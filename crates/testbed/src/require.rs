//! The one rule deciding whether a real test runs, fails or is skipped; see the crate docs.

use std::io::Write;
use std::path::Path;

use crate::blkio::BLKIO;
use crate::{docker, dockerd};

/// Something a real test needs from the machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Need {
    /// Effective uid 0.
    Root,
    /// The cgroup v1 blkio hierarchy at `/sys/fs/cgroup/blkio`.
    BlkioV1,
    /// Loop devices: `/dev/loop-control` and `losetup`.
    LoopDevices,
    /// The BFQ I/O scheduler (built in, loaded, or available as a module).
    Bfq,
    /// The host's dockerd answering on its default socket, with the test image `ddiskqos-test:latest`
    /// (`scripts/setup-host.sh` builds it).
    HostDocker,
    /// What a private dockerd ([`crate::dockerd::Dockerd`]) needs: dockerd, the Docker CLI, `unshare` and a static
    /// busybox for the test image.
    PrivateDockerd,
    /// The cgroup-v2 test bed (the systemd guest, `scripts/guest.sh run --dockerd`): `/sys/fs/cgroup` is cgroup2
    /// with the io controller and io.cost, and a dockerd on it answers at `$DOCKER_HOST` with the test image.
    V2TestBed,
    /// The cpu controller on the cgroup2 tree at `/sys/fs/cgroup` (the systemd guest has it): runc gives a CRI pod
    /// sandbox CPU shares (`cpu.weight`) and fails to start it without.
    V2Cpu,
    /// A systemd host on cgroup v2 (the systemd guest): systemd is PID 1 (`/run/systemd/system`) and
    /// `/sys/fs/cgroup` is cgroup2 with the io controller, and the guest's `docker.service` is installed.
    SystemdV2Host,
    /// A kernel that schedules each session as one group (autogroup: `/proc/self/autogroup` there and
    /// `kernel.sched_autogroup_enabled` = 1).
    Autogroup,
    /// A program on `PATH`.
    Program(&'static str),
    /// An image in the host's Docker (e.g. the agent's, `deploy/kubernetes/build-image.sh`).
    DockerImage(&'static str),
    /// A file named by this environment variable (e.g. `DDISKQOS_DEB`, the package `scripts/build-deb.sh` built).
    FileIn(&'static str),
}

impl Need {
    /// `None` if the machine has it, otherwise what is missing, in words.
    pub fn missing(self) -> Option<String> {
        let ok = match self {
            Self::Root => nix::unistd::Uid::effective().is_root(),
            Self::BlkioV1 => Path::new(BLKIO).join("cgroup.procs").exists(),
            Self::LoopDevices => Path::new("/dev/loop-control").exists() && on_path("losetup"),
            Self::Bfq => bfq_available(),
            Self::HostDocker => docker::image_ready(),
            Self::PrivateDockerd => dockerd::can_run(),
            Self::V2TestBed => v2_test_bed(),
            Self::V2Cpu => std::fs::read_to_string("/sys/fs/cgroup/cgroup.controllers")
                .is_ok_and(|c| c.split_whitespace().any(|w| w == "cpu")),
            Self::SystemdV2Host => {
                Path::new("/run/systemd/system").is_dir()
                    && std::fs::read_to_string("/sys/fs/cgroup/cgroup.controllers")
                        .is_ok_and(|c| c.split_whitespace().any(|w| w == "io"))
                    && Path::new("/lib/systemd/system/docker.service").exists()
            }
            Self::Autogroup => {
                Path::new("/proc/self/autogroup").exists()
                    && std::fs::read_to_string("/proc/sys/kernel/sched_autogroup_enabled")
                        .is_ok_and(|v| v.trim() == "1")
            }
            Self::Program(name) => on_path(name),
            Self::DockerImage(image) => docker::image_exists(image) || docker::image_exists_on_host(image),
            Self::FileIn(var) => std::env::var_os(var).is_some_and(|f| Path::new(&f).is_file()),
        };
        (!ok).then(|| self.to_string())
    }
}

impl std::fmt::Display for Need {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Root => f.write_str("root"),
            Self::BlkioV1 => write!(f, "the cgroup v1 blkio hierarchy at {BLKIO}"),
            Self::LoopDevices => f.write_str("loop devices (/dev/loop-control and losetup)"),
            Self::Bfq => f.write_str("the BFQ I/O scheduler"),
            Self::HostDocker => write!(f, "a running dockerd with the image {}", docker::IMAGE),
            Self::PrivateDockerd => f.write_str("dockerd, the docker CLI, unshare and busybox-static"),
            Self::V2TestBed => f.write_str(
                "the cgroup-v2 test bed (cgroup2 with io and io.cost at /sys/fs/cgroup, a dockerd on it at \
                 $DOCKER_HOST with the test image: run inside the systemd guest, scripts/guest.sh run --dockerd)",
            ),
            Self::V2Cpu => f.write_str(
                "the cpu controller on cgroup2 at /sys/fs/cgroup (run inside the systemd guest, scripts/guest.sh run)",
            ),
            Self::SystemdV2Host => f.write_str(
                "a systemd host on cgroup v2 with docker.service (run inside the systemd guest, scripts/guest.sh run)",
            ),
            Self::Autogroup => {
                f.write_str("a kernel that groups sessions (autogroup, kernel.sched_autogroup_enabled = 1)")
            }
            Self::Program(name) => write!(f, "{name} on PATH"),
            Self::DockerImage(image) => write!(f, "the image {image} in the host's Docker"),
            Self::FileIn(var) => match std::env::var(var) {
                Ok(file) => write!(f, "the file ${var} names ({file:?}: not a file)"),
                Err(_) => write!(f, "a file named by ${var} (not set)"),
            },
        }
    }
}

/// Whether real tests must run: `CI=true` (CI) or `DDISKQOS_REQUIRE_REAL=1` (`./scripts/test.sh`). Then a missing
/// prerequisite is a failure, never a skip.
pub fn must_run() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true") || std::env::var("DDISKQOS_REQUIRE_REAL").is_ok_and(|v| v == "1")
}

/// Every need of `needs` this machine lacks, in words (empty: the test can run).
pub fn missing(needs: &[Need]) -> Vec<String> {
    needs.iter().filter_map(|n| n.missing()).collect()
}

/// The skip-or-fail rule: `true` if `test` can run here. If something of `needs` is missing: panics naming it
/// when [`must_run`], otherwise prints `SKIPPED <test>: needs <what>` to stderr (uncaptured, so it shows in the
/// test run's output) and returns `false`, and the test returns at once.
pub fn require(test: &str, needs: &[Need]) -> bool {
    match verdict(test, &missing(needs), must_run()) {
        Verdict::Run => true,
        Verdict::Fail(message) => panic!("{message}"),
        Verdict::Skip(line) => {
            // Straight to the process's stderr, not through `eprintln!`, which the test harness captures and shows
            // only for failing tests: a skip must be seen. One write, so that parallel tests do not interleave
            // within a line.
            let _ = std::io::stderr().write_all(format!("{line}\n").as_bytes());
            false
        }
    }
}

/// What [`require`] does.
#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    Run,
    /// Panic with this message.
    Fail(String),
    /// Print this line and return.
    Skip(String),
}

fn verdict(test: &str, missing: &[String], must_run: bool) -> Verdict {
    if missing.is_empty() {
        return Verdict::Run;
    }
    let what = missing.join(", ");
    if must_run {
        Verdict::Fail(format!(
            "{test}: cannot run, missing {what} (CI=true or DDISKQOS_REQUIRE_REAL=1: a missing prerequisite is a failure)"
        ))
    } else {
        Verdict::Skip(format!("SKIPPED {test}: needs {what} (./scripts/test.sh as root sets them up)"))
    }
}

fn on_path(program: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(program).is_file()))
}

/// BFQ is offered by some block device, or loaded, or installed as a module (selecting it loads it).
fn bfq_available() -> bool {
    let offered = std::fs::read_dir("/sys/block").into_iter().flatten().flatten().any(|d| {
        std::fs::read_to_string(d.path().join("queue/scheduler"))
            .is_ok_and(|s| s.split_whitespace().any(|w| w.trim_matches(['[', ']']) == "bfq"))
    });
    offered || Path::new("/sys/module/bfq").exists() || bfq_module_installed()
}

fn bfq_module_installed() -> bool {
    let Ok(release) = std::fs::read_to_string("/proc/sys/kernel/osrelease") else { return false };
    let dir = Path::new("/lib/modules").join(release.trim()).join("kernel/block");
    std::fs::read_dir(dir).into_iter().flatten().flatten().any(|e| e.file_name().to_string_lossy().starts_with("bfq."))
}

/// See [`Need::V2TestBed`].
fn v2_test_bed() -> bool {
    let cgroup = Path::new("/sys/fs/cgroup");
    let io = std::fs::read_to_string(cgroup.join("cgroup.controllers"))
        .is_ok_and(|c| c.split_whitespace().any(|c| c == "io"));
    let socket =
        std::env::var("DOCKER_HOST").ok().and_then(|h| h.strip_prefix("unix://").map(std::path::PathBuf::from));
    io && cgroup.join("io.cost.qos").exists()
        && socket.is_some_and(|s| s.exists())
        && std::process::Command::new("/usr/bin/docker")
            .args(["image", "inspect", docker::IMAGE])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_missing_runs_whatever_the_mode() {
        assert_eq!(verdict("t", &[], true), Verdict::Run);
        assert_eq!(verdict("t", &[], false), Verdict::Run);
        assert!(require("t", &[]));
    }

    #[test]
    fn something_missing_fails_when_real_tests_must_run_and_skips_otherwise() {
        let missing = vec!["root".to_string(), "lsblk on PATH".to_string()];
        let Verdict::Fail(message) = verdict("detect", &missing, true) else { panic!("must fail") };
        assert!(message.starts_with("detect: cannot run, missing root, lsblk on PATH"), "{message}");
        let Verdict::Skip(line) = verdict("detect", &missing, false) else { panic!("must skip") };
        assert!(line.starts_with("SKIPPED detect: needs root, lsblk on PATH"), "{line}");
    }

    #[test]
    fn a_missing_program_is_named() {
        let need = Need::Program("ddiskqos-no-such-program");
        assert_eq!(need.missing().as_deref(), Some("ddiskqos-no-such-program on PATH"));
        assert_eq!(missing(&[need, need]).len(), 2);
        assert_eq!(Need::Program("sh").missing(), None);
    }
}
