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
//!
//! **Where the runtime's own way does not reach the governing file, the bench writes it**, as an operator would
//! ([`StaticWeight::settle_set_up`], [`StaticWeight::settle_starting`]). Docker 20.10 on a cgroup-v1 host whose test
//! device runs BFQ accepts `--blkio-weight` and discards it (it looks for `blkio.weight`, which BFQ does not have;
//! the governing file is `blkio.bfq.weight`). `--blkio-weight` stays on the command line; the mode's static
//! background, whose runtime set-up is complete when its cgroup is first looked at, shows whether it took
//! ([`Delivery`]). Where it did not, each reader's governing file is read as soon as its cgroup appears and, unless
//! it already holds the weight, written then (through the agent's [`qos_agent::cgroup::WeightFile`], inside the
//! [`CgroupDir`] resolved under the cgroup root the agent found) and read back. Every weight records who set it
//! ([`SetBy`]) and how long after its cgroup appeared its file read it (`samples[].weight.{set_by,waited_ms}`,
//! `modes[].static_background` in the JSON; one line of the report). **Cgroup v2, Docker 26.1 with the systemd
//! driver** (Debian 13 guest under emulation, 2026-11-27): `--blkio-weight` reaches `io.bfq.weight` as given (10 and
//! 1000 read back), set by the runtime, but 1.3-2.5 s after the reader's scope appeared (`waited_ms`); what the reader
//! had read by then is recorded (`bytes_before`, the report's static-best line). Writing the file as the scope appears does not hold there: systemd put
//! 100 back before the bench's read-back (the run failed with [`StaticError::Mismatch`]), as it does to the agent's
//! early write, which the agent writes again after runc's put-back; the bench does not repeat that dance.

use std::ops::RangeInclusive;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use qos_agent::cgroup::CgroupDir;
use qos_core::Weight;

use crate::agent::{bytes_read, SetBy, WeightProbe, WeightRead};

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
    /// The bench could not write the value into the governing file (the runtime's own way had not put it there).
    Write {
        /// The container's (or pod's) cgroup.
        cgroup: PathBuf,
        /// The file written.
        file: PathBuf,
        /// The value written.
        value: u32,
        /// Why the write failed (the cgroup layer's error chain).
        reason: String,
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
            StaticError::Write { cgroup, file, value, reason } => write!(
                f,
                "static best: cgroup {}: cannot write {value} into {} (the runtime had not put it there): {reason}",
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
        Ok(WeightRead { weight: read, waited_ms: 0.0, bytes_before: None, reached: None, set_by: None })
    }

    /// Waits until the governing file of `dir` reads the value set (Docker: runc, or systemd, writes it after the
    /// cgroup appears), at most a few seconds: then [`StaticError::Mismatch`]; a cgroup gone first is
    /// [`StaticError::Vanished`]. `waited_ms` counts from `since`; set by [`SetBy::Runtime`].
    pub fn wait(&self, dir: &CgroupDir, since: Instant) -> anyhow::Result<WeightRead> {
        let want = self.file_value();
        let timeout = crate::sys::patience(APPEAR_TIMEOUT);
        let mut last = None;
        loop {
            match self.probe.read(dir) {
                Ok((read, _)) if read == want => {
                    let waited_ms = since.elapsed().as_secs_f64() * 1e3;
                    let set_by = Some(SetBy::Runtime);
                    let bytes_before = bytes_read(dir);
                    return Ok(WeightRead { weight: read, waited_ms, bytes_before, reached: None, set_by });
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

    /// A container whose runtime set-up is complete (the mode's static background: `docker run -d` has returned,
    /// the cgroup-dir and CRI runtimes wrote its file before): its governing file read once; where it does not hold
    /// the value, the runtime's way did not take and the bench writes it ([`Self::put`]). `delivery` learns the
    /// outcome for the mode's readers. `waited_ms` counts from `since`, when the cgroup was found.
    pub fn settle_set_up(&self, dir: &CgroupDir, since: Instant, delivery: &Delivery) -> anyhow::Result<WeightRead> {
        let read = self.put(dir, since)?;
        delivery.learn(read);
        Ok(read)
    }

    /// A reader whose cgroup just appeared (`since`) and whose runtime may still be setting it up. Where the mode's
    /// background showed that the runtime's way does not take ([`Delivery::runtime_delivers`] `Some(false)`), the
    /// governing file is read at once and written unless it holds the value ([`Self::put`]): the reader may be
    /// reading already. Otherwise the runtime's write is awaited ([`Self::wait`]).
    pub fn settle_starting(&self, dir: &CgroupDir, since: Instant, delivery: &Delivery) -> anyhow::Result<WeightRead> {
        match delivery.runtime_delivers() {
            Some(false) => self.put(dir, since),
            Some(true) | None => self.wait(dir, since),
        }
    }

    /// Reads the governing file of `dir` once: the value set → [`SetBy::Runtime`], nothing written; another value →
    /// the bench writes the value ([`WeightProbe::write`]: the agent's `WeightFile`, confined to the cgroup root) and
    /// reads it back → [`SetBy::Bench`]. Fails with [`StaticError::Write`] where the write fails,
    /// [`StaticError::Mismatch`] where the file still reads another value after it, and [`StaticError::Vanished`]
    /// where the cgroup is gone. `waited_ms` is from `since` to the read that found the value.
    fn put(&self, dir: &CgroupDir, since: Instant) -> anyhow::Result<WeightRead> {
        let want = self.file_value();
        let vanished = |last| StaticError::Vanished { cgroup: dir.path().to_path_buf(), want, last };
        let (found, file) = match self.probe.read(dir) {
            Ok(read) => read,
            Err(_) if !dir.path().exists() => return Err(vanished(None).into()),
            Err(e) => return Err(e),
        };
        let set_by = if found == want {
            SetBy::Runtime
        } else {
            if let Err(e) = self.probe.write(dir, self.weight) {
                if !dir.path().exists() {
                    return Err(vanished(Some(found)).into());
                }
                return Err(self.write_error(dir, &file, e).into());
            }
            SetBy::Bench
        };
        let mut read = match self.check(dir) {
            Err(_) if !dir.path().exists() => return Err(vanished(Some(found)).into()),
            other => other?,
        };
        read.waited_ms = since.elapsed().as_secs_f64() * 1e3;
        read.set_by = Some(set_by);
        read.bytes_before = bytes_read(dir);
        Ok(read)
    }

    fn write_error(&self, dir: &CgroupDir, file: &Path, e: anyhow::Error) -> StaticError {
        StaticError::Write {
            cgroup: dir.path().to_path_buf(),
            file: file.to_path_buf(),
            value: self.file_value(),
            reason: format!("{e:#}"),
        }
    }
}

/// Whether the runtime's own way of setting a static weight reaches the governing file in this mode, learnt from
/// the first container whose set-up was complete when its file was read ([`StaticWeight::settle_set_up`]: the static
/// background, started before any static reader); that container's weight as settled is kept for the report.
#[derive(Debug, Default)]
pub struct Delivery {
    first: OnceLock<WeightRead>,
}

impl Delivery {
    /// `Some(true)` where the runtime set the first container's weight, `Some(false)` where the bench had to,
    /// `None` before any was learnt.
    pub fn runtime_delivers(&self) -> Option<bool> {
        self.first.get().and_then(|r| r.set_by).map(|s| s == SetBy::Runtime)
    }

    /// The weight of the container it was learnt from (the static background), as settled.
    pub fn first(&self) -> Option<WeightRead> {
        self.first.get().copied()
    }

    fn learn(&self, read: WeightRead) {
        // The first container decides; a later one (none in a mode) changes nothing.
        let _ = self.first.set(read);
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

    /// A v1 kernel on fixture files (`testbed`'s) that counts weight writes and, with `keeps`, puts that content
    /// back after each (a kernel or runtime that does not let the value stand); with `refuses`, rejects them.
    #[derive(Debug, Default)]
    struct Kernel {
        writes: std::sync::atomic::AtomicUsize,
        keeps: Option<&'static str>,
        refuses: bool,
    }

    impl qos_agent::cgroup::CgroupFs for Kernel {
        fn write(&self, path: &Path, data: &[u8]) -> std::io::Result<usize> {
            self.writes.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            if self.refuses {
                return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
            }
            let n = testbed::fixture::FixtureKernel.write(path, data)?;
            if let Some(content) = self.keeps {
                std::fs::write(path, content)?;
            }
            Ok(n)
        }
    }

    impl Kernel {
        fn writes(&self) -> usize {
            self.writes.load(std::sync::atomic::Ordering::Relaxed)
        }
    }

    /// A v1 root written through `kernel`, with a cgroup per `(name, blkio.bfq.weight content)`.
    fn v1_root(kernel: &std::sync::Arc<Kernel>, cgroups: &[(&str, &str)]) -> (tempfile::TempDir, CgroupRoot) {
        let tmp = tempfile::tempdir().unwrap();
        for (name, content) in cgroups {
            std::fs::create_dir_all(tmp.path().join(name)).unwrap();
            std::fs::write(tmp.path().join(name).join(V1_BFQ_WEIGHT), content).unwrap();
        }
        let root = CgroupRoot::from_dir(CgroupVersion::V1, tmp.path()).unwrap().with_fs(kernel.clone());
        (tmp, root)
    }

    fn statics() -> (StaticWeight, StaticWeight) {
        let w = StaticWeights::of(&qos_core::Config::default()).unwrap();
        (
            StaticWeight { weight: w.reader, probe: WeightProbe::V1 },
            StaticWeight { weight: w.background, probe: WeightProbe::V1 },
        )
    }

    fn content(dir: &CgroupDir) -> String {
        std::fs::read_to_string(dir.path().join(V1_BFQ_WEIGHT)).unwrap()
    }

    #[test]
    fn a_weight_the_runtime_discarded_is_written_by_the_bench_and_readers_follow_at_once() {
        // Docker on a v1 BFQ host: `--blkio-weight` accepted, the governing file left at BFQ's default.
        let kernel = std::sync::Arc::new(Kernel::default());
        let (_tmp, root) = v1_root(&kernel, &[("bg", "100\n"), ("fg", "100\n"), ("fg2", "1000\n")]);
        let (reader, background) = statics();
        let delivery = Delivery::default();
        assert_eq!((delivery.runtime_delivers(), delivery.first()), (None, None));
        let bg = root.resolve_relative("bg").unwrap();
        let since = Instant::now();
        let read = background.settle_set_up(&bg, since, &delivery).unwrap();
        assert_eq!((read.weight, read.set_by, kernel.writes()), (10, Some(SetBy::Bench), 1));
        assert_eq!(content(&bg), "10\n");
        assert!(read.waited_ms >= 0.0 && read.waited_ms <= since.elapsed().as_secs_f64() * 1e3, "{read:?}");
        assert_eq!((delivery.runtime_delivers(), delivery.first()), (Some(false), Some(read)));
        // A reader is written as soon as its cgroup is seen, without waiting for a runtime known not to deliver.
        let fg = root.resolve_relative("fg").unwrap();
        let read = reader.settle_starting(&fg, Instant::now(), &delivery).unwrap();
        assert_eq!((read.weight, read.set_by, kernel.writes()), (1000, Some(SetBy::Bench), 2));
        assert_eq!(content(&fg), "1000\n");
        // One whose file already holds the weight is left alone: nothing written, the runtime's.
        let fg2 = root.resolve_relative("fg2").unwrap();
        let read = reader.settle_starting(&fg2, Instant::now(), &delivery).unwrap();
        assert_eq!((read.weight, read.set_by, kernel.writes()), (1000, Some(SetBy::Runtime), 2));
        // The JSON says who set it; reads from before this was recorded (no `set_by`) still load.
        let json = serde_json::to_value(read).unwrap();
        assert_eq!(json["set_by"], "runtime");
        let mut old = serde_json::to_value(WeightRead { set_by: Some(SetBy::Bench), ..read }).unwrap();
        assert_eq!(old["set_by"], "bench");
        old.as_object_mut().unwrap().remove("set_by");
        assert_eq!(serde_json::from_value::<WeightRead>(old).unwrap().set_by, None);
    }

    #[test]
    fn where_the_runtime_delivers_nothing_is_written_and_readers_wait_for_it() {
        let kernel = std::sync::Arc::new(Kernel::default());
        let (_tmp, root) = v1_root(&kernel, &[("bg", "10\n"), ("fg", "100\n")]);
        let (reader, background) = statics();
        let delivery = Delivery::default();
        let read = background.settle_set_up(&root.resolve_relative("bg").unwrap(), Instant::now(), &delivery).unwrap();
        assert_eq!((read.weight, read.set_by, kernel.writes()), (10, Some(SetBy::Runtime), 0));
        assert_eq!(delivery.runtime_delivers(), Some(true));
        // A reader whose runtime never delivers then fails as before, and the bench has not written it.
        let fg = root.resolve_relative("fg").unwrap();
        let long_ago = Instant::now() - 2 * crate::sys::patience(APPEAR_TIMEOUT);
        let err = reader.settle_starting(&fg, long_ago, &delivery).unwrap_err().to_string();
        assert!(err.contains("reads 100, not the 1000"), "{err}");
        assert_eq!((kernel.writes(), content(&fg)), (0, "100\n".to_string()));
        std::fs::write(fg.path().join(V1_BFQ_WEIGHT), "1000\n").unwrap();
        let read = reader.settle_starting(&fg, Instant::now(), &delivery).unwrap();
        assert_eq!((read.weight, read.set_by, kernel.writes()), (1000, Some(SetBy::Runtime), 0));
    }

    #[test]
    fn a_value_that_does_not_hold_after_the_bench_wrote_it_fails_naming_cgroup_file_and_value() {
        let kernel = std::sync::Arc::new(Kernel { keeps: Some("100\n"), ..Kernel::default() });
        let (_tmp, root) = v1_root(&kernel, &[("bg", "100\n")]);
        let bg = root.resolve_relative("bg").unwrap();
        let delivery = Delivery::default();
        let err = statics().1.settle_set_up(&bg, Instant::now(), &delivery).unwrap_err();
        assert_eq!(kernel.writes(), 1);
        let msg = err.to_string();
        assert!(msg.contains(&bg.path().join(V1_BFQ_WEIGHT).display().to_string()), "{msg}");
        assert!(msg.contains("reads 100, not the 10"), "{msg}");
        assert!(matches!(err.downcast_ref::<StaticError>(), Some(StaticError::Mismatch { want: 10, read: 100, .. })));
        assert_eq!(delivery.runtime_delivers(), None, "nothing learnt from a failure");
    }

    #[test]
    fn a_refused_write_and_a_vanished_cgroup_fail_with_their_errors() {
        let kernel = std::sync::Arc::new(Kernel { refuses: true, ..Kernel::default() });
        let (tmp, root) = v1_root(&kernel, &[("bg", "100\n"), ("fg", "100\n")]);
        let bg = root.resolve_relative("bg").unwrap();
        let (reader, background) = statics();
        let err = background.settle_set_up(&bg, Instant::now(), &Delivery::default()).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains(&format!("cannot write 10 into {}", bg.path().join(V1_BFQ_WEIGHT).display())), "{msg}");
        assert!(matches!(err.downcast_ref::<StaticError>(), Some(StaticError::Write { value: 10, .. })), "{msg}");
        // A reader gone before the bench saw its file (it finished at once) is `Vanished`, not a write error.
        let delivery = Delivery::default();
        delivery.learn(WeightRead {
            weight: 10,
            waited_ms: 0.0,
            bytes_before: None,
            reached: None,
            set_by: Some(SetBy::Bench),
        });
        let fg = root.resolve_relative("fg").unwrap();
        std::fs::remove_dir_all(tmp.path().join("fg")).unwrap();
        let err = reader.settle_starting(&fg, Instant::now(), &delivery).unwrap_err();
        assert!(matches!(err.downcast_ref::<StaticError>(), Some(StaticError::Vanished { want: 1000, .. })), "{err}");
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
