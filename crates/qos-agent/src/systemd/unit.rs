//! The systemd unit a cgroup directory is: its last path component, when that is a unit name of a type that owns
//! a cgroup (`.scope`, `.slice`, `.service`).

use std::fmt;
use std::path::Path;

/// A validated unit name, e.g. `docker-<id>.scope` or `kubepods-burstable-pod<uid>.slice`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct UnitName(String);

/// The unit types whose units have a cgroup of their own.
const SUFFIXES: [&str; 3] = [".scope", ".slice", ".service"];

impl UnitName {
    /// The unit of cgroup directory `dir`, or `None` when its name is not a unit's (a cgroupfs-driver cgroup such
    /// as `docker/<id>`, a plain directory). Names systemd would refuse (characters outside its set, more than 255
    /// bytes) are `None` too: never sent over the bus.
    pub fn of_cgroup(dir: &Path) -> Option<Self> {
        let name = dir.file_name()?.to_str()?;
        Self::parse(name)
    }

    /// `name` if it is a valid unit name of a cgroup-owning type.
    pub fn parse(name: &str) -> Option<Self> {
        let suffix = SUFFIXES.iter().find(|s| name.ends_with(*s))?;
        let prefix = &name[..name.len() - suffix.len()];
        let allowed = |b: u8| b.is_ascii_alphanumeric() || b":-_.\\@".contains(&b);
        (name.len() <= 255 && !prefix.is_empty() && prefix.bytes().all(allowed)).then(|| Self(name.to_owned()))
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for UnitName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_of_the_systemd_drivers() {
        let id = "a".repeat(64);
        let scope = format!("/sys/fs/cgroup/system.slice/docker-{id}.scope");
        assert_eq!(UnitName::of_cgroup(Path::new(&scope)).unwrap().as_str(), format!("docker-{id}.scope"));
        let pod = "/sys/fs/cgroup/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1234_5678.slice";
        assert!(UnitName::of_cgroup(Path::new(pod)).is_some());
        assert!(UnitName::parse("cri-containerd-abc.scope").is_some());
    }

    #[test]
    fn cgroupfs_paths_and_odd_names_are_not_units() {
        assert_eq!(UnitName::of_cgroup(Path::new(&format!("/sys/fs/cgroup/docker/{}", "a".repeat(64)))), None);
        assert_eq!(UnitName::of_cgroup(Path::new("/sys/fs/cgroup/kubepods/burstable/pod1")), None);
        for bad in [".scope", "a b.scope", "x.mount", "x.socket", "x.scope\n", "é.scope"] {
            assert_eq!(UnitName::parse(bad), None, "{bad:?}");
        }
        assert_eq!(UnitName::parse(&format!("{}.scope", "a".repeat(250))), None);
    }
}
