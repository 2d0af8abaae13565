//! [`ContainerId`]: the key every other type is indexed by.

use std::fmt;
use std::sync::Arc;

use serde::Deserialize;

/// Opaque identifier of a managed container (a Docker id, a cgroup directory name, ...).
///
/// Cheap to clone (reference-counted) and ordered, so the engine iterates containers in a deterministic order.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ContainerId(Arc<str>);

impl ContainerId {
    /// Wraps any string; the engine attaches no meaning to its content.
    pub fn new(id: impl AsRef<str>) -> Self {
        Self(Arc::from(id.as_ref()))
    }

    /// The identifier as given.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The first 12 characters, as `docker ps` shows an id.
    pub fn short(&self) -> &str {
        let end = self.0.char_indices().nth(12).map_or(self.0.len(), |(i, _)| i);
        &self.0[..end]
    }
}

impl fmt::Debug for ContainerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ContainerId({})", self.0)
    }
}

impl fmt::Display for ContainerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<&str> for ContainerId {
    fn from(s: &str) -> Self {
        Self::new(s)
    }
}

impl From<String> for ContainerId {
    fn from(s: String) -> Self {
        Self(Arc::from(s))
    }
}

impl serde::Serialize for ContainerId {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for ContainerId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        <String as Deserialize>::deserialize(d).map(Self::from)
    }
}
