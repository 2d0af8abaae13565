//! [`RestoreRecords`]: what a weight writer needs to put a container back *exactly* as it found it, kept on disk
//! beside the state file so that an agent restarted after a crash can still do so.
//!
//! The state file ([`crate::state`]) keeps each container's original weight on the engine's scale (1..=1000). That
//! is not always what the container had: on cgroup v2 `io.weight` goes up to 10000 and both weight files can hold
//! per-device overrides; a systemd unit has its own `IOWeight`/`IODeviceWeight`. A writer records those at its first
//! read; in memory only, a crash lost them, and the next agent put back the weight on the engine's scale instead (an
//! `io.weight` of 5000 came back as 1000: issue 28, defect 5). Here each writer keeps its records in a file of its
//! own (`<state file>.<kind>.jsonl`).
//!
//! The file is a log, one JSON line per change (`{"id":…,"record":…}` or `{"id":…,"gone":true}`), appended with one
//! `write` per change: adopting a thousand containers costs a thousand short appends, not a thousand rewrites of a
//! growing file. Loading replays it (a torn last line, from a crash mid-append, is skipped and said) and rewrites it
//! compacted; it is compacted again whenever it has grown to four times the live records. Written like the state
//! file: directory 0700, file 0600, never through a symlink. A file that cannot be read or written is reported once
//! and the records are kept in memory: the state file's weights still restore.
//!
//! A writer records a container at its first read only: the daemon reads again to re-verify the weights it wrote,
//! and those reads find the agent's own weights. A record stands until the restore (or the container is gone); a
//! restore uses it only when it matches the original the state file owes (the writer checks the weight and the
//! cgroup), so a record the state file no longer backs (after `state reset`) puts nothing wrong back.

use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use qos_core::ContainerId;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use tracing::warn;

/// The records file of writer `kind` beside `state_file`: `<state file>.<kind>.jsonl`.
pub fn records_path(state_file: &Path, kind: &str) -> PathBuf {
    let mut name = state_file.file_name().map(|n| n.to_os_string()).unwrap_or_default();
    name.push(format!(".{kind}.jsonl"));
    state_file.with_file_name(name)
}

/// One line of the log.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry<T> {
    id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    record: Option<T>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    gone: bool,
}

/// A writer's per-container restore records, mirrored to an append-only file (see the module docs).
#[derive(Debug)]
pub struct RestoreRecords<T> {
    path: Option<PathBuf>,
    records: BTreeMap<ContainerId, T>,
    /// Lines in the file now (live records plus superseded ones), for compaction.
    lines: usize,
    /// The file failed once: said once, records kept in memory from then on.
    failed: bool,
    /// Number of records at which [`RestoreRecords::prune_gone`] looks for gone cgroups next.
    prune_at: usize,
}

impl<T> Default for RestoreRecords<T> {
    fn default() -> Self {
        Self { path: None, records: BTreeMap::new(), lines: 0, failed: false, prune_at: 64 }
    }
}

impl<T: Serialize + DeserializeOwned> RestoreRecords<T> {
    /// Records in memory only (dry runs, the bench, tests).
    pub fn in_memory() -> Self {
        Self::default()
    }

    /// The records in `path` (none when missing), compacted on disk; problems are logged, never fatal.
    pub fn load(path: PathBuf) -> Self {
        let mut this = Self { path: Some(path.clone()), ..Self::default() };
        match std::fs::read_to_string(&path) {
            Ok(text) => {
                for (index, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
                    match serde_json::from_str::<Entry<T>>(line) {
                        Ok(Entry { id, record: Some(r), gone: false }) => {
                            this.records.insert(ContainerId::from(id), r);
                        }
                        Ok(Entry { id, gone: true, .. }) => {
                            this.records.remove(&ContainerId::from(id));
                        }
                        Ok(Entry { id, .. }) => warn!(file = %path.display(), line = index + 1, container = %id,
                            "restore records: a line with neither a record nor `gone`; skipped"),
                        Err(e) => warn!(file = %path.display(), line = index + 1, error = %e,
                            "restore records: unreadable line (an agent killed while writing it?); skipped"),
                    }
                }
                this.compact();
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => this.fail("read", &e),
        }
        this
    }

    /// The record of `id`.
    pub fn get(&self, id: &ContainerId) -> Option<&T> {
        self.records.get(id)
    }

    /// Whether `id` has a record.
    pub fn contains(&self, id: &ContainerId) -> bool {
        self.records.contains_key(id)
    }

    /// Every record, by container.
    pub fn iter(&self) -> impl Iterator<Item = (&ContainerId, &T)> {
        self.records.iter()
    }

    /// Number of records.
    pub fn len(&self) -> usize {
        self.records.len()
    }

    /// Whether there is none.
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// Records (or replaces) `id`'s record and appends it to the file.
    pub fn insert(&mut self, id: &ContainerId, record: T) {
        self.append(&Entry { id: id.to_string(), record: Some(&record), gone: false });
        self.records.insert(id.clone(), record);
    }

    /// Drops `id`'s record (restored, or the container is gone).
    pub fn remove(&mut self, id: &ContainerId) {
        if self.records.remove(id).is_some() {
            if self.records.is_empty() && self.path.is_some() && !self.failed {
                // The last one: no file at all (a clean stop leaves nothing behind).
                self.compact();
            } else {
                self.append(&Entry::<&T> { id: id.to_string(), record: None, gone: true });
            }
        }
    }

    /// Drops the records whose cgroup directory (`dir` of a record) is gone, once the records have grown to twice
    /// what the last pruning left (at least 64): containers that vanished unseen do not make them grow without
    /// bound, and a write does not look at every directory.
    pub fn prune_gone(&mut self, dir: impl Fn(&T) -> &std::path::Path) {
        if self.records.len() < self.prune_at {
            return;
        }
        self.retain(|_, r| dir(r).is_dir());
        self.prune_at = (self.records.len() * 2).max(64);
    }

    /// Keeps the records `keep` accepts (pruning containers whose cgroup is gone).
    pub fn retain(&mut self, mut keep: impl FnMut(&ContainerId, &T) -> bool) {
        let gone: Vec<ContainerId> =
            self.records.iter().filter(|(id, r)| !keep(id, r)).map(|(id, _)| id.clone()).collect();
        for id in gone {
            self.remove(&id);
        }
    }

    fn append<R: Serialize>(&mut self, entry: &Entry<R>) {
        let Some(path) = self.path.clone().filter(|_| !self.failed) else { return };
        if self.lines >= 64 && self.lines >= 4 * self.records.len() {
            self.compact();
            if self.failed {
                return;
            }
        }
        let mut line = serde_json::to_vec(entry).expect("restore records serialize");
        line.push(b'\n');
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty() && !d.exists()) {
            if let Err(e) = std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir) {
                return self.fail("create the directory of", &e);
            }
        }
        let appended = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&path)
            .and_then(|mut f| f.write_all(&line));
        match appended {
            Ok(()) => self.lines += 1,
            Err(e) => self.fail("append to", &e),
        }
    }

    /// Rewrites the file with the live records only (removes it when there is none).
    fn compact(&mut self) {
        let Some(path) = self.path.clone() else { return };
        let result = if self.records.is_empty() {
            match std::fs::remove_file(&path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
                _ => Ok(()),
            }
        } else {
            let mut text = Vec::new();
            for (id, record) in &self.records {
                let entry = Entry { id: id.to_string(), record: Some(record), gone: false };
                text.extend(serde_json::to_vec(&entry).expect("restore records serialize"));
                text.push(b'\n');
            }
            crate::state::write_private(&path, &text)
        };
        match result {
            Ok(()) => self.lines = self.records.len(),
            Err(e) => self.fail("rewrite", &e),
        }
    }

    fn fail(&mut self, what: &str, e: &std::io::Error) {
        if !self.failed {
            let path = self.path.as_deref().unwrap_or(Path::new("")).display().to_string();
            warn!(file = %path, error = %e,
                  "restore records: cannot {what} the file; records kept in memory only (after a crash the state \
                   file's weights are put back, not the exact files)");
        }
        self.failed = true;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(s: &str) -> ContainerId {
        ContainerId::new(s)
    }

    #[test]
    fn records_survive_a_crash() {
        let dir = tempfile::tempdir().unwrap();
        let path = records_path(&dir.path().join("state.json"), "v2-files");
        assert_eq!(path, dir.path().join("state.json.v2-files.jsonl"));
        let mut a: RestoreRecords<u32> = RestoreRecords::load(path.clone());
        a.insert(&id("a"), 5000);
        a.insert(&id("b"), 7);
        a.insert(&id("b"), 8);
        a.remove(&id("a"));
        drop(a); // a crash: nothing is written at drop
        let b: RestoreRecords<u32> = RestoreRecords::load(path.clone());
        assert_eq!((b.get(&id("a")), b.get(&id("b"))), (None, Some(&8)));
        // Loading compacted the log to the one live record.
        assert_eq!(std::fs::read_to_string(&path).unwrap().lines().count(), 1);
    }

    #[test]
    fn a_torn_line_is_skipped_and_the_rest_kept() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.jsonl");
        std::fs::write(&path, "{\"id\":\"a\",\"record\":1}\n{\"id\":\"b\",\"rec").unwrap();
        let r: RestoreRecords<u32> = RestoreRecords::load(path.clone());
        assert_eq!((r.get(&id("a")), r.get(&id("b"))), (Some(&1), None));
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "{\"id\":\"a\",\"record\":1}\n");
    }

    #[test]
    fn the_log_is_compacted_and_removed_when_empty() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.jsonl");
        let mut r: RestoreRecords<u32> = RestoreRecords::load(path.clone());
        for n in 0..1000u32 {
            r.insert(&id("x"), n);
        }
        let lines = std::fs::read_to_string(&path).unwrap().lines().count();
        assert!(lines < 100, "{lines} lines for one live record");
        r.remove(&id("x"));
        drop(r);
        let r: RestoreRecords<u32> = RestoreRecords::load(path.clone());
        assert!(r.is_empty());
        assert!(!path.exists(), "an empty log is removed");
    }

    #[test]
    fn a_symlink_is_never_followed_and_a_broken_file_is_not_fatal() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("elsewhere");
        let path = dir.path().join("r.jsonl");
        std::os::unix::fs::symlink(&target, &path).unwrap();
        let mut r: RestoreRecords<u32> = RestoreRecords::load(path.clone());
        r.insert(&id("a"), 1);
        assert!(!target.exists(), "the append followed a planted symlink");
        assert_eq!(r.get(&id("a")), Some(&1), "kept in memory");
    }
}
