//! The weights containers had before the agent first changed them, kept in a small JSON file so that an agent
//! restarted after a crash (even SIGKILL) still knows what to restore.
//!
//! One agent per state file: [`OriginalWeights::load`] takes an exclusive lock (`flock` on `<state file>.lock`,
//! holding the agent's pid) before it reads anything, and keeps it for the agent's life; a second agent on the
//! same file stops with [`StateError::Locked`] naming the holder. The directory is created 0700 and the file
//! written 0600 through a new temporary file (`O_CREAT | O_EXCL | O_NOFOLLOW`, so a symlink planted in a shared
//! directory is never followed) renamed over it.

pub mod reset;

use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use qos_core::{ContainerId, Weight};
use serde::{Deserialize, Serialize};

/// The state file could not be read or written; names the file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StateError {
    /// I/O on the file failed.
    #[error("state file {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// Another agent holds the state file.
    #[error("state file {path} is in use by another agent (pid {holder}); stop it first, or give this agent its own state_file")]
    Locked {
        /// The state file.
        path: PathBuf,
        /// The pid the lock file names (`?` if unreadable).
        holder: String,
    },
    /// The file is not what this agent writes.
    #[error("state file {path} is malformed: {message}")]
    Malformed {
        /// The file.
        path: PathBuf,
        /// The parser's message.
        message: String,
    },
}

#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct OnDisk {
    version: u32,
    /// Container id -> weight before the agent changed it.
    originals: BTreeMap<String, u16>,
}

/// The only state-file format this agent reads and writes.
const VERSION: u32 = 1;

/// Originals by container, mirrored to disk on every change.
#[derive(Debug)]
pub struct OriginalWeights {
    path: Option<PathBuf>,
    originals: BTreeMap<ContainerId, Weight>,
    /// The exclusive lock on `<path>.lock`, held while this value lives.
    _lock: Option<nix::fcntl::Flock<std::fs::File>>,
    /// The last write of the file failed: the next record or forget writes it even with nothing new.
    stale: std::cell::Cell<bool>,
}

impl OriginalWeights {
    /// Loads the file (a missing file is an empty state). `None` keeps everything in memory (dry runs, tests).
    /// Takes the state file's lock first (see the module docs).
    pub fn load(path: Option<&Path>) -> Result<Self, StateError> {
        let mut originals = BTreeMap::new();
        let mut lock = None;
        if let Some(p) = path {
            lock = Some(lock_state(p)?);
            match std::fs::read_to_string(p) {
                Ok(text) => {
                    let disk: OnDisk = serde_json::from_str(&text)
                        .map_err(|e| StateError::Malformed { path: p.to_path_buf(), message: e.to_string() })?;
                    if disk.version != VERSION {
                        return Err(StateError::Malformed {
                            path: p.to_path_buf(),
                            message: format!("version {} is not the one this agent knows ({VERSION})", disk.version),
                        });
                    }
                    for (id, w) in disk.originals {
                        let w = Weight::new(w.into()).map_err(|e| StateError::Malformed {
                            path: p.to_path_buf(),
                            message: format!("container {id}: {e}"),
                        })?;
                        originals.insert(ContainerId::from(id), w);
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(source) => return Err(StateError::Io { path: p.to_path_buf(), source }),
            }
        }
        Ok(Self { path: path.map(Path::to_path_buf), originals, _lock: lock, stale: Default::default() })
    }

    /// Whether the originals are kept in a state file (`false`: a dry run's agent, which opened none).
    pub fn is_kept_in_file(&self) -> bool {
        self.path.is_some()
    }

    /// The original weight recorded for a container.
    pub fn get(&self, id: &ContainerId) -> Option<Weight> {
        self.originals.get(id).copied()
    }

    /// Number of containers recorded.
    pub fn len(&self) -> usize {
        self.originals.len()
    }

    /// Whether nothing is recorded.
    pub fn is_empty(&self) -> bool {
        self.originals.is_empty()
    }

    /// Ids recorded (e.g. containers a crashed agent managed).
    pub fn ids(&self) -> impl Iterator<Item = &ContainerId> {
        self.originals.keys()
    }

    /// Records a container's original weight, if none is recorded yet, and saves.
    pub fn record(&mut self, id: &ContainerId, weight: Weight) -> Result<(), StateError> {
        if self.originals.contains_key(id) {
            return Ok(());
        }
        self.originals.insert(id.clone(), weight);
        self.save()
    }

    /// [`OriginalWeights::record`] for many containers with one save (a save rewrites the whole file:
    /// one per container made adopting 1,024 containers take seconds). The file is written when something is new
    /// or the last write failed; if this write fails, what it added is taken back, so [`OriginalWeights::get`]
    /// never answers an original that is not on disk.
    pub fn record_all<'a>(
        &mut self,
        items: impl IntoIterator<Item = (&'a ContainerId, Weight)>,
    ) -> Result<(), StateError> {
        let mut added = Vec::new();
        for (id, weight) in items {
            if !self.originals.contains_key(id) {
                self.originals.insert(id.clone(), weight);
                added.push(id.clone());
            }
        }
        if !added.is_empty() || self.stale.get() {
            if let Err(e) = self.save() {
                for id in &added {
                    self.originals.remove(id);
                }
                return Err(e);
            }
        }
        Ok(())
    }

    /// Forgets a container (removed, or its weight restored) and saves.
    pub fn forget(&mut self, id: &ContainerId) -> Result<(), StateError> {
        if self.originals.remove(id).is_some() {
            self.save()?;
        }
        Ok(())
    }

    /// [`OriginalWeights::forget`] for many containers with one save.
    pub fn forget_all(&mut self, ids: &[ContainerId]) -> Result<(), StateError> {
        let before = self.originals.len();
        for id in ids {
            self.originals.remove(id);
        }
        if self.originals.len() != before || self.stale.get() {
            self.save()?;
        }
        Ok(())
    }

    /// Writes the file; a failure marks it stale (see [`OriginalWeights::record_all`]).
    fn save(&self) -> Result<(), StateError> {
        let result = self.write_file();
        self.stale.set(result.is_err());
        result
    }

    fn write_file(&self) -> Result<(), StateError> {
        let Some(path) = &self.path else { return Ok(()) };
        let io = |source| StateError::Io { path: path.clone(), source };
        let disk = OnDisk {
            version: VERSION,
            originals: self.originals.iter().map(|(k, v)| (k.to_string(), v.get() as u16)).collect(),
        };
        write_private(path, serde_json::to_string_pretty(&disk).expect("serializable").as_bytes()).map_err(io)
    }
}

/// Replaces `path` with `bytes` as the agent's private files are written: its directory created 0700 if missing,
/// the content put in a new 0600 temporary file beside it ([`create_temp`]: never through a planted symlink) and
/// renamed over `path`, so every reader sees a whole file. The state file and the BFQ tunables' originals use it.
///
/// No fsync: the file must survive the agent's crash (SIGKILL), which the page cache does, not the machine's, after
/// which no cgroup weight survives either (and /run, the default place, is gone). An fsync here blocked the daemon
/// loop for up to 175 ms per save on a loaded disk (the bench's strace, 2026-11-23), delaying new containers' top
/// weight.
pub(crate) fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)?;
    }
    let (tmp, mut f) = create_temp(path)?;
    let written = f.write_all(bytes).and_then(|()| std::fs::rename(&tmp, path));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

/// What a state file holds, read without taking it over: for `ddiskqos-agent state show` and `state reset`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Inspection {
    /// The file exists.
    pub exists: bool,
    /// The pid in the lock file, when an agent holds the lock now.
    pub holder: Option<String>,
    /// Every entry that reads as a container id and a weight 1..=1000 (from a damaged file: those that still do).
    pub originals: BTreeMap<ContainerId, Weight>,
    /// What is wrong with the file; empty when an agent would load it.
    pub problems: Vec<String>,
}

/// Reads the state file at `path` as an operator would want to see it, never failing on its content: a file an
/// agent refuses is described, entry by entry where it can be. Creates nothing.
pub fn inspect(path: &Path) -> Result<Inspection, StateError> {
    let mut out = Inspection { holder: holder(path)?, ..Inspection::default() };
    let text = match std::fs::read(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(source) => return Err(StateError::Io { path: path.to_path_buf(), source }),
    };
    out.exists = true;
    let value: serde_json::Value = match serde_json::from_slice(&text) {
        Ok(v) => v,
        Err(e) => {
            out.problems.push(format!("not JSON ({e}); {} bytes", text.len()));
            return Ok(out);
        }
    };
    let Some(obj) = value.as_object() else {
        out.problems.push("not a JSON object".into());
        return Ok(out);
    };
    match obj.get("version").and_then(serde_json::Value::as_u64) {
        Some(v) if v == u64::from(VERSION) => {}
        Some(v) => out.problems.push(format!("version {v} is not the one this agent knows ({VERSION})")),
        None => out.problems.push("no numeric \"version\"".into()),
    }
    for key in obj.keys().filter(|k| !["version", "originals"].contains(&k.as_str())) {
        out.problems.push(format!("unknown field {key:?}"));
    }
    match obj.get("originals").and_then(serde_json::Value::as_object) {
        None => out.problems.push("no \"originals\" object".into()),
        Some(map) => {
            for (id, w) in map {
                match w.as_u64().map(Weight::new) {
                    Some(Ok(weight)) if !id.is_empty() => {
                        out.originals.insert(ContainerId::from(id.clone()), weight);
                    }
                    Some(Err(e)) => out.problems.push(format!("container {id:?}: {e}")),
                    _ => out.problems.push(format!("container {id:?}: weight {w} is not a number 1..=1000")),
                }
            }
        }
    }
    Ok(out)
}

/// The pid an agent holding `<path>.lock` wrote there, if one holds it now (the lock is tried, never kept).
fn holder(path: &Path) -> Result<Option<String>, StateError> {
    let lock_path = lock_path(path);
    let file = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&lock_path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(StateError::Io { path: lock_path, source }),
    };
    match nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock) {
        Ok(_free) => Ok(None),
        Err((_, nix::errno::Errno::EWOULDBLOCK)) => {
            let pid = std::fs::read_to_string(&lock_path).map(|s| s.trim().to_owned()).unwrap_or_default();
            Ok(Some(if pid.is_empty() { "?".into() } else { pid }))
        }
        Err((_, errno)) => Err(StateError::Io { path: lock_path, source: errno.into() }),
    }
}

impl OriginalWeights {
    /// For `ddiskqos-agent state reset`: takes the state file's lock (so no agent runs on it; [`StateError::Locked`]
    /// otherwise), keeps a copy of the current file as `<path>.bak-<unix seconds>` if there is one, and writes a
    /// fresh file holding `keep`. The returned value holds the lock until dropped.
    pub fn rewrite(path: &Path, keep: BTreeMap<ContainerId, Weight>) -> Result<(Self, Option<PathBuf>), StateError> {
        let lock = lock_state(path)?;
        let backup = match std::fs::symlink_metadata(path) {
            Ok(m) if m.is_file() => {
                let secs = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_secs())
                    .unwrap_or_default();
                let mut name = path.file_name().unwrap_or_default().to_os_string();
                name.push(format!(".bak-{secs}"));
                let backup = path.with_file_name(name);
                std::fs::copy(path, &backup).map_err(|source| StateError::Io { path: backup.clone(), source })?;
                Some(backup)
            }
            Ok(_) => {
                return Err(StateError::Malformed {
                    path: path.to_path_buf(),
                    message: "not a regular file: move it away by hand".into(),
                })
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(source) => return Err(StateError::Io { path: path.to_path_buf(), source }),
        };
        let state =
            Self { path: Some(path.to_path_buf()), originals: keep, _lock: Some(lock), stale: Default::default() };
        state.save()?;
        Ok((state, backup))
    }
}

/// The lock of a state file, held by an agent that does not keep the state file (a dry run) while it puts back
/// what an agent that died left beside it; released when dropped.
#[derive(Debug)]
pub struct StateLock {
    _lock: nix::fcntl::Flock<std::fs::File>,
}

/// Takes the lock of the state file at `path` for a moment (see [`StateLock`]): while it is held no other agent
/// runs on the files beside it. [`StateError::Locked`], naming the holder, when one does.
pub fn lock_for_a_moment(path: &Path) -> Result<StateLock, StateError> {
    lock_state(path).map(|_lock| StateLock { _lock })
}

/// Creates the state directory (0700) if missing, then takes `<path>.lock` exclusively.
fn lock_state(path: &Path) -> Result<nix::fcntl::Flock<std::fs::File>, StateError> {
    let io = |source| StateError::Io { path: path.to_path_buf(), source };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir).map_err(io)?;
    }
    let lock_path = lock_path(path);
    let open = |write: bool| {
        std::fs::OpenOptions::new()
            .read(true)
            .write(write)
            .create(write)
            .truncate(false)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&lock_path)
    };
    // A read-only state directory (a full or read-only file system) still lets an agent start, take the lock
    // on the existing lock file and restore what the file holds; it then changes no weight whose original it
    // cannot save (see `reconcile`).
    let (file, writable) = match open(true) {
        Ok(f) => (f, true),
        Err(e) if e.raw_os_error() == Some(libc::EROFS) => {
            (open(false).map_err(|_| StateError::Io { path: lock_path.clone(), source: e })?, false)
        }
        Err(source) => return Err(StateError::Io { path: lock_path.clone(), source }),
    };
    match nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock) {
        Ok(mut lock) => {
            // The holder's pid, for the error a second agent prints.
            if writable {
                let pid = format!("{}\n", std::process::id());
                let wrote = lock.set_len(0).and_then(|()| lock.write_all(pid.as_bytes()));
                wrote.map_err(|source| StateError::Io { path: lock_path.clone(), source })?;
            }
            Ok(lock)
        }
        Err((_, nix::errno::Errno::EWOULDBLOCK)) => {
            let holder = std::fs::read_to_string(&lock_path).map(|s| s.trim().to_owned()).unwrap_or_default();
            let holder = if holder.is_empty() { "?".into() } else { holder };
            Err(StateError::Locked { path: path.to_path_buf(), holder })
        }
        Err((_, errno)) => Err(StateError::Io { path: lock_path, source: errno.into() }),
    }
}

fn lock_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".lock");
    path.with_file_name(name)
}

/// A new temporary file beside `path`, mode 0600, that did not exist before (`O_EXCL`) and is not reached through a
/// symlink (`O_NOFOLLOW`): a name taken by anyone else is skipped, never opened.
fn create_temp(path: &Path) -> std::io::Result<(PathBuf, std::fs::File)> {
    let base = path.file_name().unwrap_or_default().to_string_lossy().into_owned();
    let mut last = None;
    for attempt in 0..16u32 {
        let tmp = path.with_file_name(format!(".{base}.{}.{attempt}.tmp", std::process::id()));
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&tmp)
        {
            Ok(f) => return Ok((tmp, f)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| std::io::Error::other("no free temporary name")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn survives_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/state.json");
        let a = ContainerId::new("a");
        {
            let mut s = OriginalWeights::load(Some(&path)).unwrap();
            s.record(&a, Weight::new(100).unwrap()).unwrap();
            s.record(&a, Weight::new(500).unwrap()).unwrap(); // first record wins
        }
        let mut s = OriginalWeights::load(Some(&path)).unwrap();
        assert_eq!(s.get(&a), Some(Weight::new(100).unwrap()));
        s.forget(&a).unwrap();
        drop(s); // releases the lock, as the agent's exit does
        assert!(OriginalWeights::load(Some(&path)).unwrap().is_empty());
    }

    #[test]
    fn one_agent_per_state_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json");
        let first = OriginalWeights::load(Some(&path)).unwrap();
        let err = OriginalWeights::load(Some(&path)).unwrap_err();
        match &err {
            StateError::Locked { holder, .. } => assert_eq!(holder, &std::process::id().to_string()),
            other => panic!("{other}"),
        }
        assert!(err.to_string().contains("state.json") && err.to_string().contains("in use"), "{err}");
        drop(first);
        OriginalWeights::load(Some(&path)).expect("free again once the first agent is gone");
    }

    #[test]
    fn files_are_private_and_a_planted_symlink_is_not_followed() {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("run/state.json");
        let mut s = OriginalWeights::load(Some(&path)).unwrap();
        // Someone plants a symlink at the first temporary name, pointing at a file root must not overwrite.
        let victim = dir.path().join("victim");
        std::fs::write(&victim, "precious").unwrap();
        let planted = path.with_file_name(format!(".state.json.{}.0.tmp", std::process::id()));
        std::os::unix::fs::symlink(&victim, &planted).unwrap();
        s.record(&ContainerId::new("a"), Weight::new(100).unwrap()).unwrap();
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
        assert!(std::fs::symlink_metadata(&planted).unwrap().file_type().is_symlink());
        assert_eq!(std::fs::metadata(&path).unwrap().mode() & 0o777, 0o600);
        assert_eq!(std::fs::metadata(path.parent().unwrap()).unwrap().permissions().mode() & 0o777, 0o700);
        assert_eq!(OriginalWeights::load(None).unwrap().len(), 0);
        drop(s);
        assert_eq!(OriginalWeights::load(Some(&path)).unwrap().get(&ContainerId::new("a")), Weight::new(100).ok());
    }

    #[test]
    fn an_unknown_version_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json");
        std::fs::write(&path, "{\"version\":99,\"originals\":{}}").unwrap();
        let err = OriginalWeights::load(Some(&path)).unwrap_err().to_string();
        assert!(err.contains("version 99"), "{err}");
    }

    #[test]
    fn malformed_file_names_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json");
        std::fs::write(&path, "{\"version\":1,\"originals\":{\"a\":0}}").unwrap();
        let err = OriginalWeights::load(Some(&path)).unwrap_err().to_string();
        assert!(err.contains("state.json") && err.contains("container a"), "{err}");
    }
}
