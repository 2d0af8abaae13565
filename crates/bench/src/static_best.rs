//! The static-best variant (issue 25): the background at the engine's bottom weight and every reader at its top
//! weight, each set once by hand when its container is created, the agent writing nothing (it is in its dry run,
//! as in Original blocks). The weights are set the way an operator sets them through the runtime in use:
//!
//! - Docker: `--blkio-weight` at `docker run` / `docker create` ([`docker_args`]; Docker takes 10..=1000 and may
//!   clamp or map it elsewhere, e.g. to `io.weight` through systemd on cgroup v2);
//! - the cgroup-dir runtime: the cgroup's weight file, written when the bench creates the cgroup, before its first
//!   process;
//! - CRI pods: the pod cgroup's weight file (the kubelet's level, where the agent writes too), written before the
//!   reader reads (the background's right after its pod started).
//!
//! Every weight is then read back from the file that governs the test device ([`crate::agent::WeightProbe`]): a
//! weight that does not read as set fails the run ([`StaticError`], naming the cgroup, the file and the value), so
//! no figure is reported for weights that were not in force.

use std::ops::RangeInclusive;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use qos_agent::cgroup::CgroupDir;
use qos_core::Weight;

use crate::agent::{WeightProbe, WeightRead};

/// The weights Docker's `--blkio-weight` accepts (0 means "unset").
pub const DOCKER_BLKIO_WEIGHT: RangeInclusive<u32> = 10..=1000;

/// How long a weight set at a container's creation may take to show in its file (runc and systemd write it after
/// the cgroup appears); stretched by [`crate::sys::patience`].
const APPEAR_TIMEOUT: Duration = Duration::from_secs(5);

/// A static weight that cannot be set or did not read back as set.
#[derive(Debug)]
pub enum StaticError {
    /// The engine configuration has no level to take the weights from.
    NoLevels,
    /// Docker would refuse (or clamp) this `--blkio-weight`.
    DockerRange {
        /// What the container was to get (`reader`, `background`).
        role: &'static str,
        /// The weight.
        weight: u32,
    },
    /// The governing file reads another value than the one set.
    Mismatch {
        /// The container's (or pod's) cgroup.
        cgroup: PathBuf,
        /// The file read.
        file: PathBuf,
        /// The value the static weight has in that file.
        want: u32,
        /// What it read.
        read: u32,
    },
    /// The cgroup was gone before its file read the value set.
    Vanished {
        /// The cgroup.
        cgroup: PathBuf,
        /// The value the static weight has in the governing file.
        want: u32,
        /// The last value read, if any.
        last: Option<u32>,
    },
}

impl std::fmt::Display for StaticError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StaticError::NoLevels => {
                write!(f, "static best: the engine configuration has no levels to take weights from")
            }
            StaticError::DockerRange { role, weight } => write!(
                f,
                "static best: the {role}'s weight {weight} is outside Docker's --blkio-weight range {}..={}; Docker \
                 would refuse or clamp it",
                DOCKER_BLKIO_WEIGHT.start(),
                DOCKER_BLKIO_WEIGHT.end()
            ),
            StaticError::Mismatch { cgroup, file, want, read } => write!(
                f,
                "static best: cgroup {}: {} reads {read}, not the {want} set at the container's creation; the static \
                 weights are not in force, no figure is reported",
                cgroup.display(),
                file.display()
            ),
            StaticError::Vanished { cgroup, want, last } => write!(
                f,
                "static best: cgroup {} was gone before its weight file read the {want} set at its creation (last \
                 read: {})",
                cgroup.display(),
                last.map_or_else(|| "none".to_string(), |v| v.to_string())
            ),
        }
    }
}

impl std::error::Error for StaticError {}

/// The static-best weights, from the engine configuration the agent runs with: the top level's weight for readers
/// (where the agent puts new containers), the bottom level's for the background (where it sinks).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StaticWeights {
    /// Every reader's.
    pub reader: Weight,
    /// The background's.
    pub background: Weight,
}

impl StaticWeights {
    /// The top and bottom levels' weights of `engine`.
    pub fn of(engine: &qos_core::Config) -> Result<Self, StaticError> {
        let (Some(top), Some(bottom)) = (engine.levels.first(), engine.levels.last()) else {
            return Err(StaticError::NoLevels);
        };
        Ok(Self { reader: top.weight, background: bottom.weight })
    }
}

/// A weight set once, when a container is created, and the file it must then read in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StaticWeight {
    /// The weight (engine scale: Docker's `--blkio-weight` and the BFQ files take it as is).
    pub weight: Weight,
    /// The file that governs the test device, and how it is read.
    pub probe: WeightProbe,
}

impl StaticWeight {
    /// The value the weight has in the governing file.
    pub fn file_value(&self) -> u32 {
        self.probe.file_value(self.weight)
    }

    /// Writes the weight into the governing file of `dir` (runtimes whose cgroups the bench makes or whose pod
    /// cgroups it manages as the kubelet does).
    pub fn write(&self, dir: &CgroupDir) -> anyhow::Result<()> {
        use anyhow::Context;
        self.probe
            .write(dir, self.weight)
            .with_context(|| format!("static best: setting weight {} on {}", self.weight, dir.path().display()))
            .map(|_| ())
    }

    /// Reads the governing file of `dir` once; the value set, or [`StaticError::Mismatch`].
    pub fn check(&self, dir: &CgroupDir) -> anyhow::Result<WeightRead> {
        let (read, file) = self.probe.read(dir)?;
        let want = self.file_value();
        if read != want {
            return Err(StaticError::Mismatch { cgroup: dir.path().to_path_buf(), file, want, read }.into());
        }
        Ok(WeightRead { weight: read, waited_ms: 0.0, bytes_before: None, reached: None })
    }

    /// Waits until the governing file of `dir` reads the value set (Docker: runc, or systemd, writes it after the
    /// cgroup appears), at most a few seconds: then [`StaticError::Mismatch`]; a cgroup gone first is
    /// [`StaticError::Vanished`]. `waited_ms` counts from `since`.
    pub fn wait(&self, dir: &CgroupDir, since: Instant) -> anyhow::Result<WeightRead> {
        let want = self.file_value();
        let timeout = crate::sys::patience(APPEAR_TIMEOUT);
        let mut last = None;
        loop {
            match self.probe.read(dir) {
                Ok((read, _)) if read == want => {
                    let waited_ms = since.elapsed().as_secs_f64() * 1e3;
                    return Ok(WeightRead { weight: read, waited_ms, bytes_before: None, reached: None });
                }
                Ok((read, file)) => {
                    last = Some(read);
                    if since.elapsed() > timeout {
                        return Err(StaticError::Mismatch { cgroup: dir.path().to_path_buf(), file, want, read }.into());
                    }
                }
                Err(_) if !dir.path().exists() => {
                    return Err(StaticError::Vanished { cgroup: dir.path().to_path_buf(), want, last }.into());
                }
                Err(e) if since.elapsed() > timeout => return Err(e),
                Err(_) => {}
            }
            std::thread::sleep(Duration::from_micros(100));
        }
    }
}

/// Docker's arguments for a container created with `weight` (`role` names it in the error): `--blkio-weight N`,
/// or an error where Docker would refuse or clamp it.
pub fn docker_args(role: &'static str, weight: Weight) -> Result<Vec<String>, StaticError> {
    let value = weight.to_bfq();
    if !DOCKER_BLKIO_WEIGHT.contains(&value) {
        return Err(StaticError::DockerRange { role, weight: value });
    }
    Ok(vec!["--blkio-weight".into(), value.to_string()])
}

#[cfg(test)]
mod tests {
    use super::*;
    use qos_agent::cgroup::{CgroupRoot, CgroupVersion, WeightFileKind, V1_BFQ_WEIGHT, V2_BFQ_WEIGHT};
    use qos_core::LevelConfig;

    fn weight(w: u64) -> Weight {
        Weight::new(w).unwrap()
    }

    #[test]
    fn the_weights_are_the_engines_top_and_bottom() {
        let w = StaticWeights::of(&qos_core::Config::default()).unwrap();
        assert_eq!((w.reader.get(), w.background.get()), (1000, 10));
        let two = qos_core::Config {
            levels: vec![
                LevelConfig { weight: weight(800), threshold: qos_core::ByteSize::parse("2MiB").unwrap() },
                LevelConfig { weight: weight(50), threshold: qos_core::ByteSize::parse("8MiB").unwrap() },
            ],
            ..qos_core::Config::default()
        };
        assert_eq!(StaticWeights::of(&two).unwrap(), StaticWeights { reader: weight(800), background: weight(50) });
        let none = qos_core::Config { levels: vec![], ..qos_core::Config::default() };
        assert!(matches!(StaticWeights::of(&none), Err(StaticError::NoLevels)));
    }

    #[test]
    fn docker_gets_blkio_weight_in_its_range_only() {
        assert_eq!(docker_args("reader", weight(1000)).unwrap(), ["--blkio-weight", "1000"]);
        assert_eq!(docker_args("background", weight(10)).unwrap(), ["--blkio-weight", "10"]);
        let err = docker_args("background", weight(1)).unwrap_err().to_string();
        assert!(err.contains("background's weight 1") && err.contains("10..=1000"), "{err}");
    }

    /// A v1 (or v2) fixture tree with one cgroup whose weight file reads `content`.
    fn fixture(version: CgroupVersion, file: &str, content: &str) -> (tempfile::TempDir, CgroupDir) {
        let tmp = tempfile::tempdir().unwrap();
        let root = CgroupRoot::from_dir(version, tmp.path()).unwrap();
        std::fs::create_dir_all(tmp.path().join("fg")).unwrap();
        std::fs::write(tmp.path().join("fg").join(file), content).unwrap();
        let dir = root.resolve_relative("fg").unwrap();
        (tmp, dir)
    }

    #[test]
    fn a_weight_written_reads_back_and_another_value_fails_naming_cgroup_file_and_value() {
        let (_tmp, dir) = fixture(CgroupVersion::V1, V1_BFQ_WEIGHT, "100\n");
        let top = StaticWeight { weight: weight(1000), probe: WeightProbe::V1 };
        let err = top.check(&dir).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains(&dir.path().display().to_string()), "{msg}");
        assert!(msg.contains(V1_BFQ_WEIGHT) && msg.contains("reads 100, not the 1000"), "{msg}");
        assert!(matches!(err.downcast_ref::<StaticError>(), Some(StaticError::Mismatch { read: 100, .. })));
        top.write(&dir).unwrap();
        assert_eq!(top.check(&dir).unwrap().weight, 1000);
        assert_eq!(top.wait(&dir, Instant::now()).unwrap().weight, 1000);
        // A value set and then changed (a clamp, a runtime's own mapping) fails even after waiting.
        std::fs::write(dir.path().join(V1_BFQ_WEIGHT), "500\n").unwrap();
        let err = top.wait(&dir, Instant::now() - 2 * crate::sys::patience(APPEAR_TIMEOUT)).unwrap_err();
        assert!(err.to_string().contains("reads 500, not the 1000"), "{err}");
    }

    #[test]
    fn v2_weights_are_the_governing_files_default_line_and_read_as_the_devices_value() {
        let dev: qos_agent::blockdev::DevNum = "7:0".parse().unwrap();
        let (_tmp, dir) = fixture(CgroupVersion::V2, V2_BFQ_WEIGHT, "default 100\n");
        let bottom = StaticWeight { weight: weight(10), probe: WeightProbe::V2 { kind: WeightFileKind::V2Bfq, dev } };
        bottom.write(&dir).unwrap();
        assert_eq!(std::fs::read_to_string(dir.path().join(V2_BFQ_WEIGHT)).unwrap(), "default 10\n");
        assert_eq!(bottom.check(&dir).unwrap().weight, 10);
        // An override of the test device wins over the default: what acts on the device is what is checked.
        std::fs::write(dir.path().join(V2_BFQ_WEIGHT), "default 10\n7:0 100\n").unwrap();
        assert!(bottom.check(&dir).unwrap_err().to_string().contains("reads 100, not the 10"));
    }

    #[test]
    fn a_cgroup_gone_before_its_weight_read_as_set_fails() {
        let (tmp, dir) = fixture(CgroupVersion::V1, V1_BFQ_WEIGHT, "100\n");
        std::fs::remove_dir_all(tmp.path().join("fg")).unwrap();
        let top = StaticWeight { weight: weight(1000), probe: WeightProbe::V1 };
        let err = top.wait(&dir, Instant::now()).unwrap_err().to_string();
        assert!(err.contains("was gone before") && err.contains("1000"), "{err}");
    }
}
