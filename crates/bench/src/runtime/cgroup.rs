//! The cgroup runtime: every reader is a process of this binary (`read-file`) in a fresh blkio cgroup under
//! the blkio root, which the process joins before its first I/O: `ddiskqos-bench-<pid>-fg-<n>` directly under the
//! root (flat layout) or `ddiskqos-bench-<pid>/fg-<n>` (nested). A static weight (the static-best variant) is
//! written into the new cgroup's weight file before its process starts, as an operator sets a cgroup they made.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use qos_agent::cgroup::{CgroupDir, CgroupRoot, CounterReader};
use qos_core::ContainerId;

use super::procs;
use super::{fio_args, parse_report, Background, BackgroundKind, ReadOutcome, ReaderHooks, Runtime, INTERNAL_THREADS};
use crate::agent::container_info;
use crate::cleanup::Cleanup;
use crate::static_best::StaticWeight;

/// Where the bench's cgroups go.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum CgroupLayout {
    /// Directly under the blkio root (`ddiskqos-bench-<pid>-fg-<n>`), siblings of everything else.
    Flat,
    /// Under one parent (`ddiskqos-bench-<pid>/fg-<n>`), like Docker's `docker/<id>`. With the Docker runtime
    /// this is Docker's default layout itself (no `--cgroup-parent`: `docker/<id>` with the cgroupfs driver);
    /// `docker-default` names the same.
    #[value(alias = "docker-default")]
    Nested,
}

impl CgroupLayout {
    /// For the report: the layout and where `runtime`'s cgroups are in it.
    pub fn describe(self, runtime: &str) -> String {
        match (self, runtime) {
            (CgroupLayout::Flat, "docker") => "flat (--cgroup-parent=/: <id> under the root)".into(),
            (CgroupLayout::Nested, "docker") => "nested (Docker's default layout: docker/<id>)".into(),
            (CgroupLayout::Flat, _) => "flat".into(),
            (CgroupLayout::Nested, _) => "nested".into(),
        }
    }
}

/// Readers as processes in bench-made cgroups.
#[derive(Debug)]
pub struct CgroupRuntime {
    /// Directory new cgroups are created in.
    parent: PathBuf,
    /// Prefix of their names.
    prefix: String,
    exe: PathBuf,
    next: AtomicU64,
    root: Arc<CgroupRoot>,
    cleanup: &'static Cleanup,
    log_dir: PathBuf,
    /// Background processes by their background's id, each reaped when its background stops.
    children: std::sync::Mutex<Vec<(String, std::process::Child)>>,
}

impl CgroupRuntime {
    /// Creates the parent cgroup (removed by the cleanup stack, children first).
    pub fn new(
        exe: PathBuf,
        layout: CgroupLayout,
        root: Arc<CgroupRoot>,
        cleanup: &'static Cleanup,
        log_dir: &Path,
    ) -> Result<Self> {
        let name = format!("ddiskqos-bench-{}", std::process::id());
        let (parent, prefix) = match layout {
            CgroupLayout::Nested => {
                let parent = root.path().join(&name);
                procs::create(&parent)?;
                if root.version() == qos_agent::cgroup::CgroupVersion::V2 {
                    // On v2 a child has io.* files only where its parent enables the controller for it.
                    let p = parent.clone();
                    procs::enable_io(&parent).inspect_err(|_| {
                        let _ = procs::kill_and_remove(&p);
                    })?;
                }
                let p = parent.clone();
                cleanup.push(format!("remove cgroup {}", parent.display()), move || remove_tree(&p));
                (parent, String::new())
            }
            CgroupLayout::Flat => {
                let (r, prefix) = (root.path().to_path_buf(), format!("{name}-"));
                cleanup.push(format!("remove cgroups {}/{prefix}*", r.display()), move || remove_prefixed(&r, &prefix));
                (root.path().to_path_buf(), format!("{name}-"))
            }
        };
        Ok(Self {
            parent,
            prefix,
            exe,
            next: AtomicU64::new(0),
            root,
            cleanup,
            log_dir: log_dir.to_path_buf(),
            children: Default::default(),
        })
    }

    fn new_cgroup(&self, prefix: &str) -> Result<(ContainerId, CgroupDir, crate::cleanup::Token)> {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let name = format!("{}{prefix}-{n}", self.prefix);
        let path = self.parent.join(&name);
        procs::create(&path)?;
        let p = path.clone();
        let token = self.cleanup.push(format!("remove cgroup {}", path.display()), move || procs::kill_and_remove(&p));
        let rel = path.strip_prefix(self.root.path()).context("the bench's cgroups are below the root")?;
        let dir = self.root.resolve_relative(&rel.to_string_lossy())?;
        Ok((ContainerId::new(name), dir, token))
    }
}

/// Removes every cgroup in `root` whose name starts with `prefix`.
fn remove_prefixed(root: &Path, prefix: &str) -> Result<()> {
    for e in std::fs::read_dir(root)?.flatten() {
        if e.file_name().to_string_lossy().starts_with(prefix) && e.path().is_dir() {
            remove_tree(&e.path())?;
        }
    }
    Ok(())
}

/// Removes a cgroup and everything below it, killing what still runs there.
fn remove_tree(dir: &Path) -> Result<()> {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                remove_tree(&e.path())?;
            }
        }
    }
    procs::kill_and_remove(dir)
}

impl Runtime for CgroupRuntime {
    fn name(&self) -> &'static str {
        "cgroup"
    }

    fn start_background(
        &self,
        file: &Path,
        kind: BackgroundKind,
        weight: Option<StaticWeight>,
        hooks: &dyn ReaderHooks,
    ) -> Result<Background> {
        let (id, dir, _token) = self.new_cgroup(if weight.is_some() { "bg-static" } else { "bg" })?;
        if let Some(w) = weight {
            w.write(&dir)?;
        }
        hooks.created(&container_info(id.as_str(), dir.clone()), Instant::now())?;
        let dir_s = dir.path().to_string_lossy().into_owned();
        let file_s = file.to_string_lossy().into_owned();
        let mut argv: Vec<String> = vec!["exec-in".into(), "--cgroup".into(), dir_s.clone(), "--".into()];
        match kind.resolve() {
            BackgroundKind::Fio => {
                argv.push("fio".into());
                argv.extend(fio_args(&file_s));
            }
            _ => {
                let exe = self.exe.to_string_lossy().into_owned();
                argv.extend([exe, "stream".into(), "--threads".into(), INTERNAL_THREADS.to_string(), file_s]);
            }
        }
        let log = self.log_dir.join(format!("{id}.log"));
        let log_file = std::fs::File::create(&log).with_context(|| format!("cannot create {}", log.display()))?;
        let child = Command::new(&self.exe)
            .args(&argv)
            .stdin(Stdio::null())
            .stdout(log_file.try_clone()?)
            .stderr(log_file)
            .spawn()
            .with_context(|| format!("cannot start the background: {}", argv.join(" ")))?;
        self.children.lock().unwrap_or_else(|p| p.into_inner()).push((id.to_string(), child));
        let bg = Background { id: id.to_string(), cgroup: dir, command: argv[4..].join(" ") };
        bg.wait_reading(|| std::fs::read_to_string(&log).unwrap_or_default())?;
        Ok(bg)
    }

    fn stop_background(&self, bg: &Background) -> Result<()> {
        let removed = procs::kill_and_remove(bg.cgroup.path());
        let mut children = self.children.lock().unwrap_or_else(|p| p.into_inner());
        let (mine, others): (Vec<_>, Vec<_>) =
            std::mem::take(&mut *children).into_iter().partition(|(id, _)| *id == bg.id);
        *children = others;
        for (_, mut child) in mine {
            let _ = child.kill();
            let _ = child.wait();
        }
        removed
    }

    fn run_reader(&self, file: &Path, weight: Option<StaticWeight>, hooks: &dyn ReaderHooks) -> Result<ReadOutcome> {
        let (id, dir, token) = self.new_cgroup("fg")?;
        let t0 = Instant::now();
        let result = (|| {
            if let Some(w) = weight {
                w.write(&dir)?;
            }
            let weight = hooks.created(&container_info(id.as_str(), dir.clone()), t0)?;
            let out = Command::new(&self.exe)
                .arg("read-file")
                .arg("--cgroup")
                .arg(dir.path())
                .arg(file)
                .stdin(Stdio::null())
                .output()
                .context("cannot run the reader")?;
            let wall = t0.elapsed();
            if !out.status.success() {
                bail!("reader of {} failed ({}): {}", file.display(), out.status, String::from_utf8_lossy(&out.stderr));
            }
            let report = parse_report(&String::from_utf8_lossy(&out.stdout))?;
            let charged = CounterReader::open(&dir).and_then(|mut r| r.read()).ok().map(|c| c.read);
            Ok(ReadOutcome { id: id.to_string(), report, wall, charged_bytes: charged, weight })
        })();
        hooks.finished(&id);
        let removed = self.cleanup.run(token);
        removed?;
        result
    }
}
