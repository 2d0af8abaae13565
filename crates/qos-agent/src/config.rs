//! [`AgentConfig`]: the agent's TOML file. Every field has a documented default, so the agent runs with no file.
//!
//! ```toml
//! runtime = "docker"            # docker | cgroup-dir | cri
//! sample_interval = "500ms"
//! entry_sample_interval = "50ms" # rounds this often for entry_sample_for after a container enters the top ("off")
//! entry_sample_for = "2s"
//! cpu_budget = "0.8%"           # of one core, for sampling rounds; "off" never stretches the interval
//! actuator = "auto"             # auto | docker | files | systemd ("cgroupfs": the old name of files)
//! dry_run = false
//! state_file = "/run/ddiskqos/state.json"
//! control_socket = "/run/ddiskqos/agent.sock"
//! nice = -10                    # the agent's CPU priority, so new containers get their weight on a busy host
//!
//! [docker]
//! socket = "/var/run/docker.sock"
//!
//! [cri]                         # runtime = "cri": the pods of a Kubernetes node
//! socket = "/run/containerd/containerd.sock"   # CRI-O: "/var/run/crio/crio.sock"
//! relist_interval = "2s"
//! cgroup_root = "/"             # the kubelet's --cgroup-root (kind: "/kubelet")
//! state_dirs = ["/var/lib/kubelet", "/var/lib/containerd", "/var/lib/containers"]   # disks checked by default
//!
//! [policy]                      # what pods (and Docker labels) may ask for; system pods left alone
//! trusted_namespaces = []       # whose pods may use ddiskqos.io/weight and ddiskqos.io/exclude ("*": all)
//! max_pinned_weight = 1000
//! classes = {}                  # e.g. { batch = { weight = 40 } }, chosen by ddiskqos.io/class
//! exclude_namespaces = ["kube-system"]
//! exclude_static_pods = true
//! exclude_pod_labels = {}
//! docker_labels = "trusted"     # or "policy"
//!
//! [cgroup]
//! root = "auto"                 # or a mount point, e.g. "/sys/fs/cgroup/blkio"
//! parent = ""                   # cgroup-dir runtime: containers are the child directories of this cgroup
//!
//! [devices]
//! protect = "auto"              # make weights act on every managed device ("off": change no device)
//! opt_out = []                  # managed devices protect leaves as they are, e.g. ["sdb"]
//! check = []                    # the managed devices (default: the disk of Docker's data root / CRI's state dirs)
//! switch_to_bfq = []            # opt-in: set these devices' scheduler to bfq at start
//! bfq_tunables = {}             # opt-in: e.g. { sdb = { max_budget = 256 } }, set at start, restored at stop
//!
//! [metrics]
//! enabled = false
//! listen = "127.0.0.1:9477"
//!
//! [mlfq]                        # qos-core's config; defaults are the paper's
//! boost_after = "10s"
//! ```

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::daemon::pacing::CpuBudget;

/// Which runtime's containers are managed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RuntimeKind {
    /// Docker, through its API socket (default).
    #[default]
    Docker,
    /// Every child directory of `[cgroup] parent` is a container (systemd slices, other runtimes).
    CgroupDir,
    /// The pods of a Kubernetes node, through the CRI socket of its container runtime; one entry per pod cgroup.
    Cri,
}

/// How weights are applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum ActuatorMode {
    /// The cgroup weight files, and on a systemd host with cgroup v2 systemd's runtime unit properties for cgroups
    /// that are units (default). Never Docker's API: `docker update` persists a weight in the container's
    /// configuration, where a crashed or removed agent's demotion would outlive it.
    #[default]
    Auto,
    /// Docker API (`docker update --blkio-weight`), verified in the cgroup file; a container still starting gets
    /// its file written directly. Docker keeps the weight in the container's `hostconfig.json`: the restore at stop
    /// puts the original back there, a crash leaves the last one (the state file keeps the original).
    Docker,
    /// The cgroup weight files only (the files layer, [`crate::files::FileWriter`]). Its first name, `cgroupfs`,
    /// is still accepted in the config and on the command line; it named the cgroup drivers too, and it is no
    /// file system the agent mounts.
    #[serde(alias = "cgroupfs")]
    #[value(alias = "cgroupfs")]
    Files,
    /// Cgroups that are systemd units (Docker's and the kubelet's systemd cgroup driver) through systemd's D-Bus
    /// API, every other cgroup through its file. `auto` does this too on a systemd host with cgroup v2; this mode
    /// makes a host without systemd as PID 1 an error at start.
    Systemd,
}

/// `[docker]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DockerConfig {
    /// Path of dockerd's API socket.
    pub socket: PathBuf,
}

impl Default for DockerConfig {
    fn default() -> Self {
        Self { socket: PathBuf::from("/var/run/docker.sock") }
    }
}

/// `[cri]`: the CRI runtime's section, with its rules (`runtime::cri::config`).
pub use crate::runtime::cri::config::CriConfig;

/// `[cgroup]`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CgroupConfig {
    /// Cgroup mount to use: `"auto"` (empty also means auto) detects it once from /proc/self/mountinfo.
    pub root: String,
    /// For `runtime = "cgroup-dir"`: the cgroup (relative to the root) whose child directories are the
    /// containers.
    pub parent: String,
}

/// `[devices] protect`: whether the agent makes weights act on the devices it manages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProtectMode {
    /// Per managed device, from what the agent finds there (default): BFQ's short slots and `strict_guarantees`
    /// where BFQ is (or, on cgroup v1, can be) the scheduler; on cgroup v2 io.cost with a model measured from
    /// the device where BFQ is not the scheduler. Every setting is logged, read back, shown in status and metrics
    /// and put back at stop ([`crate::blockdev::protect`]).
    #[default]
    Auto,
    /// Change no device (the agent before protection by default; `check` and the opt-ins still work).
    Off,
}

/// `[devices]`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DevicesConfig {
    /// `"auto"` (default): every managed device is made one where weights decide latency; `"off"`: no device is
    /// changed by protection.
    pub protect: ProtectMode,
    /// Managed devices that protection leaves exactly as they are (one line opts a device out).
    pub opt_out: Vec<String>,
    /// The managed devices (names like `sda`, `loop3`): their scheduler is checked at start-up, and protection
    /// acts on them. Empty: the disk holding Docker's data root (`runtime = "docker"`) or the kubelet's and the
    /// runtime's state (`runtime = "cri"`, `[cri] state_dirs`); none for `cgroup-dir`. The disk holding `/` is
    /// never changed.
    pub check: Vec<String>,
    /// Opt-in: block devices switched to the BFQ scheduler at start-up. No other device is ever touched, and the
    /// device holding `/` is refused.
    pub switch_to_bfq: Vec<String>,
    /// Opt-in: BFQ tunables set at start-up, device by device (`{ sdb = { max_budget = 256, timeout_sync = 8 } }`),
    /// and put back on a clean shutdown; only the tunables of [`crate::blockdev::tune::ALLOWED`], only on the
    /// devices named here, whose scheduler must be bfq (or which `switch_to_bfq` names), never the disk holding
    /// `/`. For Docker's default layout on cgroup v1 (docs/devices.md, "Docker's default layout on cgroup v1").
    pub bfq_tunables: crate::blockdev::tune::TunableMap,
}

/// `[metrics]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsConfig {
    /// Serve Prometheus text metrics (off by default).
    pub enabled: bool,
    /// Address to serve on; loopback by default. A non-loopback address must be set explicitly.
    pub listen: SocketAddr,
}

impl Default for MetricsConfig {
    fn default() -> Self {
        Self { enabled: false, listen: SocketAddr::from(([127, 0, 0, 1], 9477)) }
    }
}

/// The agent's whole configuration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AgentConfig {
    /// Which runtime's containers to manage.
    pub runtime: RuntimeKind,
    /// Time between two sampling rounds. 500 ms: a big reader is demoted within half a second. A round reads only
    /// the containers whose parent cgroup shows I/O they may have done: 0.5 % of one core at 1,024 containers
    /// with one of them busy, 1.5 % if every one of them does I/O in every round (docs/testing.md, "Scale").
    #[serde(with = "qos_core::units::duration")]
    pub sample_interval: Duration,
    /// Rounds come this often (instead of every `sample_interval`) for `entry_sample_for` after a managed container
    /// enters the top level: it started, or a boost put it back. All entrants share the device as peers until a
    /// round shows who read past the top allotment; at 500 ms a big reader starting beside small ones (or a
    /// boosted background) read 10-50 MiB at the top weight first, at 50 ms it reads a few. `"off"`: never. Fast
    /// rounds are skipped while the CPU budget stretches rounds, and their cost counts against it.
    #[serde(with = "qos_core::units::opt_duration")]
    pub entry_sample_interval: Option<Duration>,
    /// See `entry_sample_interval`: how long after an entry the fast rounds last. 2 s: a Docker container's
    /// cgroup appears (and enters) up to a second before its first read. Also how long after a container announced
    /// early settles its weight is written again through systemd (the writer's own way), so that systemd's work on
    /// the unit comes after its first reads (`Reconciler::handle_settled`).
    #[serde(with = "qos_core::units::duration")]
    pub entry_sample_for: Duration,
    /// Share of one core the sampling rounds may use: when rounds cost more (many containers all doing I/O), they
    /// are spread out, up to 8 x `sample_interval`. `"off"`: always `sample_interval`.
    #[serde(with = "crate::daemon::pacing::budget_text")]
    pub cpu_budget: Option<CpuBudget>,
    /// How weights are applied.
    pub actuator: ActuatorMode,
    /// Decide and log, write nothing.
    pub dry_run: bool,
    /// Where the weights containers had before the agent changed them are kept, so a restarted agent (even after
    /// SIGKILL) can still restore them.
    pub state_file: PathBuf,
    /// Unix socket answering `ddiskqos-agent status`.
    pub control_socket: PathBuf,
    /// The agent's nice value (-20..=19), set at start ([`crate::priority`]): -10, so that on a busy host its
    /// wake-up for a new container does not wait behind other processes' CPU time. 0 leaves it as started.
    pub nice: i8,
    /// `[docker]`.
    pub docker: DockerConfig,
    /// `[cri]`.
    pub cri: CriConfig,
    /// `[cgroup]`.
    pub cgroup: CgroupConfig,
    /// `[policy]`: what pods (and Docker labels) may ask for, and which pods are never touched.
    pub policy: crate::policy::PolicyConfig,
    /// `[devices]`.
    pub devices: DevicesConfig,
    /// `[metrics]`.
    pub metrics: MetricsConfig,
    /// `[mlfq]`: levels, thresholds, timers (qos-core).
    pub mlfq: qos_core::Config,
}

impl Default for AgentConfig {
    fn default() -> Self {
        Self {
            runtime: RuntimeKind::Docker,
            sample_interval: Duration::from_millis(500),
            entry_sample_interval: Some(Duration::from_millis(50)),
            entry_sample_for: Duration::from_secs(2),
            cpu_budget: Some(CpuBudget::from_ppm(8_000)),
            actuator: ActuatorMode::Auto,
            dry_run: false,
            state_file: PathBuf::from("/run/ddiskqos/state.json"),
            control_socket: PathBuf::from("/run/ddiskqos/agent.sock"),
            nice: crate::priority::DEFAULT_NICE,
            docker: DockerConfig::default(),
            cri: CriConfig::default(),
            cgroup: CgroupConfig::default(),
            policy: crate::policy::PolicyConfig::default(),
            devices: DevicesConfig::default(),
            metrics: MetricsConfig::default(),
            mlfq: qos_core::Config::default(),
        }
    }
}

/// The config file could not be used. Messages name the file, the field and the value.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigFileError {
    /// The file could not be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not valid TOML for this schema (unknown key, wrong type, bad value).
    #[error("config file {path}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The parser's message, with line and column.
        message: String,
    },
    /// A value breaks a rule.
    #[error("config file {path}: {source}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// The rule broken.
        source: qos_core::ConfigError,
    },
}

/// A parser message cut to a readable size: the parser quotes the offending line, which in a garbage file can be
/// megabytes long.
fn bounded(mut message: String) -> String {
    const MAX: usize = 2_000;
    if message.len() > MAX {
        let cut = (0..=MAX).rev().find(|&i| message.is_char_boundary(i)).unwrap_or(0);
        let dropped = message.len() - cut;
        message.truncate(cut);
        message.push_str(&format!("… ({dropped} more bytes of the message left out)"));
    }
    message
}

fn invalid(field: &str, value: impl ToString, reason: &str) -> qos_core::ConfigError {
    qos_core::ConfigError::Invalid { field: field.into(), value: value.to_string(), reason: reason.into() }
}

/// `field` is at least 10 ms and at most `max`; else the error names it, its value and `rule`.
fn within(field: &str, d: Duration, max: Duration, rule: &str) -> Result<(), qos_core::ConfigError> {
    if d < Duration::from_millis(10) || d > max {
        return Err(invalid(field, qos_core::units::format_duration(d), rule));
    }
    Ok(())
}

impl AgentConfig {
    /// Parses TOML text; `origin` names the file in errors.
    pub fn from_toml(text: &str, origin: &Path) -> Result<Self, ConfigFileError> {
        let cfg: AgentConfig = toml::from_str(text)
            .map_err(|e| ConfigFileError::Parse { path: origin.to_path_buf(), message: bounded(e.to_string()) })?;
        cfg.validate().map_err(|source| ConfigFileError::Invalid { path: origin.to_path_buf(), source })?;
        Ok(cfg)
    }

    /// Reads and validates a file.
    pub fn load(path: &Path) -> Result<Self, ConfigFileError> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| ConfigFileError::Read { path: path.to_path_buf(), source })?;
        Self::from_toml(&text, path)
    }

    /// The settings that differ in `new` and that a running agent does not apply (a reload warns about them; they
    /// need a restart), named as in the file: `runtime`, `actuator`, `state_file`, `control_socket`, `nice`,
    /// `[docker]`, `[cri]`, `[cgroup]`, `[devices]`, `[metrics]`, `[policy]`. A reload applies the rest:
    /// `sample_interval`, `entry_sample_interval`, `entry_sample_for`, `cpu_budget`, `dry_run`, `[mlfq]`.
    pub fn needs_restart(&self, new: &AgentConfig) -> Vec<&'static str> {
        // Taken apart field by field, so a new setting does not compile until it is sorted into one group.
        let AgentConfig {
            runtime,
            sample_interval: _,
            entry_sample_interval: _,
            entry_sample_for: _,
            cpu_budget: _,
            actuator,
            dry_run: _,
            state_file,
            control_socket,
            nice,
            docker,
            cri,
            cgroup,
            devices,
            metrics,
            policy,
            mlfq: _,
        } = self;
        let mut changed = Vec::new();
        let mut check = |differs: bool, name: &'static str| {
            if differs {
                changed.push(name);
            }
        };
        check(*runtime != new.runtime, "runtime");
        check(*actuator != new.actuator, "actuator");
        check(*state_file != new.state_file, "state_file");
        check(*control_socket != new.control_socket, "control_socket");
        check(*nice != new.nice, "nice");
        check(*docker != new.docker, "[docker]");
        check(*cri != new.cri, "[cri]");
        check(*cgroup != new.cgroup, "[cgroup]");
        check(*devices != new.devices, "[devices]");
        check(*metrics != new.metrics, "[metrics]");
        check(*policy != new.policy, "[policy]");
        changed
    }

    /// Checks every rule of the agent and of the engine.
    pub fn validate(&self) -> Result<(), qos_core::ConfigError> {
        self.mlfq.validate().map_err(|e| match e {
            qos_core::ConfigError::Invalid { field, value, reason } => {
                qos_core::ConfigError::Invalid { field: format!("mlfq.{field}"), value, reason }
            }
            other => other,
        })?;
        const HOUR: Duration = Duration::from_secs(3600);
        within("sample_interval", self.sample_interval, HOUR, "must be 10ms..=1h")?;
        // At or above sample_interval it changes nothing (a round never comes later than sample_interval).
        if let Some(fast) = self.entry_sample_interval {
            within("entry_sample_interval", fast, HOUR, "must be 10ms..=1h")?;
        }
        within("entry_sample_for", self.entry_sample_for, Duration::from_secs(60), "must be 10ms..=1m")?;
        if self.runtime == RuntimeKind::CgroupDir && self.cgroup.parent.trim_matches('/').is_empty() {
            return Err(invalid(
                "cgroup.parent",
                format!("{:?}", self.cgroup.parent),
                "runtime = \"cgroup-dir\" needs the cgroup whose children are the containers",
            ));
        }
        if self.runtime == RuntimeKind::CgroupDir && self.actuator == ActuatorMode::Docker {
            return Err(invalid("actuator", "docker", "runtime = \"cgroup-dir\" has no Docker API"));
        }
        if self.runtime == RuntimeKind::Cri && self.actuator == ActuatorMode::Docker {
            return Err(invalid("actuator", "docker", "runtime = \"cri\" has no Docker API"));
        }
        if !crate::priority::valid(self.nice) {
            return Err(invalid("nice", self.nice, "must be -20..=19 (Linux nice values; lower runs first)"));
        }
        self.cri.validate()?;
        self.policy.validate()?;
        if self.cgroup.parent.split('/').any(|c| c == "..") {
            return Err(invalid("cgroup.parent", &self.cgroup.parent, "must not contain '..'"));
        }
        for (list, names) in [
            ("check", &self.devices.check),
            ("switch_to_bfq", &self.devices.switch_to_bfq),
            ("opt_out", &self.devices.opt_out),
        ] {
            for (i, d) in names.iter().enumerate() {
                if d.is_empty() || d.contains('/') || d.starts_with('.') {
                    let field = format!("devices.{list}[{i}]");
                    return Err(invalid(&field, d, "must be a block device name such as sda"));
                }
            }
        }
        for (device, tunables) in &self.devices.bfq_tunables {
            if device.is_empty() || device.contains('/') || device.starts_with('.') {
                let field = format!("devices.bfq_tunables.{device}");
                return Err(invalid(&field, device, "must be a block device name such as sda"));
            }
            for (key, value) in tunables {
                crate::blockdev::tune::validate(key, value)
                    .map_err(|reason| invalid(&format!("devices.bfq_tunables.{device}.{key}"), value, &reason))?;
            }
        }
        if self.state_file.as_os_str().is_empty() || !self.state_file.is_absolute() {
            return Err(invalid("state_file", self.state_file.display(), "must be an absolute path"));
        }
        if self.control_socket.as_os_str().is_empty() || !self.control_socket.is_absolute() {
            return Err(invalid("control_socket", self.control_socket.display(), "must be an absolute path"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::AppliedVia;
    use crate::blockdev::tune::TunableValue;

    fn parse(text: &str) -> Result<AgentConfig, String> {
        AgentConfig::from_toml(text, Path::new("agent.toml")).map_err(|e| e.to_string())
    }

    #[test]
    fn files_actuator_keeps_its_first_name_cgroupfs() {
        use clap::ValueEnum;
        assert_eq!(parse("actuator = \"files\"").unwrap().actuator, ActuatorMode::Files);
        assert_eq!(parse("actuator = \"cgroupfs\"").unwrap().actuator, ActuatorMode::Files);
        assert_eq!(ActuatorMode::from_str("cgroupfs", false).unwrap(), ActuatorMode::Files);
        assert_eq!(ActuatorMode::Files.to_possible_value().unwrap().get_name(), "files");
        let written =
            toml::to_string(&AgentConfig { actuator: ActuatorMode::Files, ..AgentConfig::default() }).unwrap();
        assert!(written.contains("actuator = \"files\""), "{written}");
        // The status socket's `in_use`: written as `files`, an older agent's `cgroupfs` still read.
        assert_eq!(serde_json::to_value(AppliedVia::CgroupFile).unwrap(), "files");
        assert_eq!(serde_json::from_value::<AppliedVia>("cgroupfs".into()).unwrap(), AppliedVia::CgroupFile);
    }

    #[test]
    fn entry_sampling_defaults_and_bad_values_name_field_and_value() {
        let cfg = AgentConfig::default();
        assert_eq!(
            (cfg.entry_sample_interval, cfg.entry_sample_for),
            (Some(Duration::from_millis(50)), Duration::from_secs(2))
        );
        assert_eq!(parse("entry_sample_interval = \"off\"").unwrap().entry_sample_interval, None);
        // At or above sample_interval it is allowed and changes nothing, so a shorter sample_interval alone works.
        assert_eq!(parse("sample_interval = \"10ms\"").unwrap().entry_sample_interval, Some(Duration::from_millis(50)));
        assert_eq!(
            parse("entry_sample_interval = \"100ms\"\nentry_sample_for = \"1s\"")
                .map(|c| (c.entry_sample_interval, c.entry_sample_for)),
            Ok((Some(Duration::from_millis(100)), Duration::from_secs(1)))
        );
        for (text, want) in [
            ("entry_sample_interval = \"5ms\"", "entry_sample_interval = 5ms: must be 10ms..=1h"),
            ("entry_sample_interval = \"2h\"", "entry_sample_interval = 7200s: must be 10ms..=1h"),
            ("entry_sample_for = \"2m\"", "entry_sample_for = 120s: must be 10ms..=1m"),
            ("entry_sample_for = \"off\"", "entry_sample_for"),
        ] {
            let err = parse(text).unwrap_err();
            assert!(err.contains(want), "{text}: {err}");
        }
    }

    #[test]
    fn nice_defaults_to_minus_ten_and_bad_values_name_field_and_value() {
        assert_eq!(AgentConfig::default().nice, -10);
        assert_eq!(parse("nice = 0").unwrap().nice, 0);
        assert_eq!(parse("nice = -20").unwrap().nice, -20);
        for (text, want) in [
            ("nice = 20", "nice = 20: must be -20..=19"),
            ("nice = -21", "nice = -21: must be -20..=19"),
            ("nice = 300", "nice"),
            ("nice = \"high\"", "nice"),
        ] {
            let err = parse(text).unwrap_err();
            assert!(err.contains(want), "{text}: {err}");
        }
    }

    #[test]
    fn needs_restart_names_every_section_a_reload_does_not_apply() {
        let old = AgentConfig::default();
        assert!(old.needs_restart(&old).is_empty());
        let one = |change: fn(&mut AgentConfig)| {
            let mut new = old.clone();
            change(&mut new);
            assert_ne!(new, old, "the change changes something");
            old.needs_restart(&new)
        };
        assert_eq!(one(|c| c.runtime = RuntimeKind::Cri), ["runtime"]);
        assert_eq!(one(|c| c.actuator = ActuatorMode::Files), ["actuator"]);
        assert_eq!(one(|c| c.state_file = "/run/other.json".into()), ["state_file"]);
        assert_eq!(one(|c| c.control_socket = "/run/other.sock".into()), ["control_socket"]);
        assert_eq!(one(|c| c.nice = 0), ["nice"]);
        assert_eq!(one(|c| c.docker.socket = "/run/d.sock".into()), ["[docker]"]);
        assert_eq!(one(|c| c.cri.socket = "/run/crio.sock".into()), ["[cri]"]);
        assert_eq!(one(|c| c.cri.relist_interval = Duration::from_secs(9)), ["[cri]"]);
        assert_eq!(one(|c| c.cgroup.parent = "machine.slice".into()), ["[cgroup]"]);
        assert_eq!(one(|c| c.devices.check = vec!["sdb".into()]), ["[devices]"]);
        assert_eq!(one(|c| c.devices.switch_to_bfq = vec!["sdb".into()]), ["[devices]"]);
        assert_eq!(one(|c| c.devices.protect = ProtectMode::Off), ["[devices]"]);
        assert_eq!(one(|c| c.devices.opt_out = vec!["sdb".into()]), ["[devices]"]);
        assert_eq!(one(|c| c.metrics.enabled = true), ["[metrics]"]);
        assert_eq!(one(|c| c.policy.trusted_namespaces = vec!["batch".into()]), ["[policy]"]);
        // What a reload applies.
        assert!(one(|c| c.sample_interval = Duration::from_secs(1)).is_empty());
        assert!(one(|c| c.cpu_budget = None).is_empty());
        assert!(one(|c| c.entry_sample_interval = None).is_empty());
        assert!(one(|c| c.entry_sample_for = Duration::from_secs(1)).is_empty());
        assert!(one(|c| c.dry_run = true).is_empty());
        assert!(one(|c| c.mlfq.boost_after = Duration::from_secs(3)).is_empty());
        // Several at once, in the order the file documents them.
        let mut new = old.clone();
        (new.devices.check, new.cri.relist_interval, new.runtime) =
            (vec!["sdb".into()], Duration::from_secs(9), RuntimeKind::Cri);
        assert_eq!(old.needs_restart(&new), ["runtime", "[cri]", "[devices]"]);
    }

    #[test]
    fn bfq_tunables_parse_and_bad_ones_name_key_and_value() {
        let cfg = parse("[devices]\nbfq_tunables = { sdb = { max_budget = 256, timeout_sync = \"8\" } }\n").unwrap();
        let sdb = &cfg.devices.bfq_tunables["sdb"];
        assert_eq!(sdb["max_budget"], TunableValue::Int(256));
        assert_eq!(sdb["timeout_sync"], TunableValue::Text("8".into()));
        let cfg = parse("[devices.bfq_tunables.loop3]\nslice_idle = 0\n").unwrap();
        assert_eq!(cfg.devices.bfq_tunables["loop3"]["slice_idle"], TunableValue::Int(0));
        assert!(AgentConfig::default().devices.bfq_tunables.is_empty(), "opt-in: nothing by default");

        for (text, want) in [
            ("{ sdb = { back_seek_max = 1 } }", "devices.bfq_tunables.sdb.back_seek_max = 1: not a BFQ tunable"),
            ("{ sdb = { timeout_sync = \"fast\" } }", "devices.bfq_tunables.sdb.timeout_sync = fast: must be a whole"),
            ("{ sdb = { max_budget = -5 } }", "devices.bfq_tunables.sdb.max_budget = -5: must not be negative"),
            ("{ sdb = { timeout_sync = 5000 } }", "devices.bfq_tunables.sdb.timeout_sync = 5000: must be 1..=1000"),
            ("{ \"../sda\" = { max_budget = 1 } }", "devices.bfq_tunables.../sda = ../sda: must be a block device"),
        ] {
            let err = parse(&format!("[devices]\nbfq_tunables = {text}\n")).unwrap_err();
            assert!(err.contains(want), "{text}: {err}");
        }
        // A float or a table is not a value at all: the parser's own message names the key.
        let err = parse("[devices]\nbfq_tunables = { sdb = { max_budget = 1.5 } }\n").unwrap_err();
        assert!(err.contains("bfq_tunables"), "{err}");
    }

    #[test]
    fn protect_defaults_to_auto_opts_out_in_one_line_and_bad_values_name_field_and_value() {
        assert_eq!(AgentConfig::default().devices.protect, ProtectMode::Auto, "protection by default");
        assert!(AgentConfig::default().devices.opt_out.is_empty());
        assert_eq!(parse("[devices]\nprotect = \"off\"\n").unwrap().devices.protect, ProtectMode::Off);
        assert_eq!(parse("[devices]\nprotect = \"auto\"\n").unwrap().devices.protect, ProtectMode::Auto);
        assert_eq!(parse("[devices]\nopt_out = [\"sdb\"]\n").unwrap().devices.opt_out, ["sdb"]);
        for (text, want) in [
            ("protect = \"on\"", "protect"),
            ("protect = true", "protect"),
            ("opt_out = \"sdb\"", "opt_out"),
            ("opt_out = [\"/dev/sdb\"]", "devices.opt_out[0] = /dev/sdb: must be a block device name"),
            ("opt_out = [\"sdb\", \"\"]", "devices.opt_out[1] = : must be a block device name"),
            ("opt_out = [\"..\"]", "devices.opt_out[0] = ..: must be a block device name"),
            ("protekt = \"off\"", "protekt"),
        ] {
            let err = parse(&format!("[devices]\n{text}\n")).unwrap_err();
            assert!(err.contains(want), "{text}: {err}");
        }
        let err = parse("[devices]\nprotect = \"on\"\n").unwrap_err();
        assert!(err.contains("auto") && err.contains("off"), "the message lists the choices: {err}");
    }
}
