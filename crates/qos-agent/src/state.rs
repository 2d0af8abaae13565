//! The weights containers had before the agent first changed them, kept in a small JSON file so that an agent
//! restarted after a crash (even SIGKILL) still knows what to restore.

use std::collections::BTreeMap;
use std::io::Write;
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

/// Originals by container, mirrored to disk on every change.
#[derive(Debug)]
pub struct OriginalWeights {
    path: Option<PathBuf>,
    originals: BTreeMap<ContainerId, Weight>,
}

impl OriginalWeights {
    /// Loads the file (a missing file is an empty state). `None` keeps everything in memory (dry runs, tests).
    pub fn load(path: Option<&Path>) -> Result<Self, StateError> {
        let mut originals = BTreeMap::new();
        if let Some(p) = path {
            match std::fs::read_to_string(p) {
                Ok(text) => {
                    let disk: OnDisk = serde_json::from_str(&text)
                        .map_err(|e| StateError::Malformed { path: p.to_path_buf(), message: e.to_string() })?;
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
        Ok(Self { path: path.map(Path::to_path_buf), originals })
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

    /// [`OriginalWeights::record`] for many containers with one save (a save rewrites and fsyncs the whole file:
    /// one per container made adopting 1,024 containers take seconds).
    pub fn record_all<'a>(
        &mut self,
        items: impl IntoIterator<Item = (&'a ContainerId, Weight)>,
    ) -> Result<(), StateError> {
        let mut added = false;
        for (id, weight) in items {
            if !self.originals.contains_key(id) {
                self.originals.insert(id.clone(), weight);
                added = true;
            }
        }
        if added {
            self.save()?;
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
        if self.originals.len() != before {
            self.save()?;
        }
        Ok(())
    }

    fn save(&self) -> Result<(), StateError> {
        let Some(path) = &self.path else { return Ok(()) };
        let io = |source| StateError::Io { path: path.clone(), source };
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(io)?;
        }
        let disk = OnDisk {
            version: 1,
            originals: self.originals.iter().map(|(k, v)| (k.to_string(), v.get() as u16)).collect(),
        };
        let tmp = path.with_extension("json.tmp");
        let mut f = std::fs::File::create(&tmp).map_err(io)?;
        f.write_all(serde_json::to_string_pretty(&disk).expect("serializable").as_bytes()).map_err(io)?;
        f.sync_all().map_err(io)?;
        std::fs::rename(&tmp, path).map_err(io)
    }
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
        assert!(OriginalWeights::load(Some(&path)).unwrap().is_empty());
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
