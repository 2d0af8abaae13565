//! Where Docker puts a container's cgroup: `<parent>/<id>` with the cgroupfs driver (parent `/docker` unless
//! `--cgroup-parent` says otherwise), `<expanded slice>/docker-<id>.scope` with the systemd driver.

use std::fmt;
use std::str::FromStr;

use crate::cgroup::{CgroupDir, CgroupError, CgroupRoot, InvalidName, Result};

/// How Docker names container cgroups (`docker info` shows it as "Cgroup Driver").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CgroupDriver {
    /// `<parent>/<id>`, parent `/docker` unless `--cgroup-parent` says otherwise.
    Cgroupfs,
    /// `<expanded slice>/docker-<id>.scope`, slice `system.slice` unless `--cgroup-parent` names another.
    Systemd,
}

impl FromStr for CgroupDriver {
    type Err = CgroupError;

    /// Accepts Docker's spellings, "cgroupfs" and "systemd".
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "cgroupfs" => Ok(Self::Cgroupfs),
            "systemd" => Ok(Self::Systemd),
            _ => Err(CgroupError::InvalidName(InvalidName {
                what: "cgroup driver",
                value: s.into(),
                reason: "expected \"cgroupfs\" or \"systemd\"",
            })),
        }
    }
}

impl fmt::Display for CgroupDriver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Cgroupfs => "cgroupfs",
            Self::Systemd => "systemd",
        })
    }
}

/// The cgroup of Docker container `id` (the full 64-hex-digit id), under Docker's naming for `driver` and its
/// `--cgroup-parent` option (`None`: Docker's default, `/docker` or `system.slice`).
pub fn container_cgroup(root: &CgroupRoot, id: &str, driver: CgroupDriver, parent: Option<&str>) -> Result<CgroupDir> {
    validate_docker_id(id)?;
    let rel = match driver {
        CgroupDriver::Cgroupfs => {
            // Docker writes parents as absolute cgroup paths ("/docker"); they are relative to our root.
            let parent = parent.unwrap_or("/docker").trim_start_matches('/').trim_end_matches('/');
            if parent.is_empty() {
                id.to_owned()
            } else {
                format!("{parent}/{id}")
            }
        }
        CgroupDriver::Systemd => {
            let slice = expand_slice(parent.unwrap_or("system.slice"))?;
            if slice.is_empty() {
                format!("docker-{id}.scope")
            } else {
                format!("{slice}/docker-{id}.scope")
            }
        }
    };
    root.resolve_relative(&rel)
}

/// A full Docker container id: 64 lowercase hex digits (short ids are ambiguous, and anything else could be a
/// path).
fn validate_docker_id(id: &str) -> Result<()> {
    if id.len() == 64 && id.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
        Ok(())
    } else {
        Err(CgroupError::InvalidName(InvalidName {
            what: "container id",
            value: id.into(),
            reason: "expected the full id: 64 lowercase hex digits",
        }))
    }
}

/// systemd's slice naming, as runc's `ExpandSlice`: `a-b-c.slice` lives at `a.slice/a-b.slice/a-b-c.slice`;
/// `-.slice` is the root (empty path).
fn expand_slice(slice: &str) -> Result<String> {
    let invalid = |reason| CgroupError::InvalidName(InvalidName { what: "cgroup parent", value: slice.into(), reason });
    let Some(name) = slice.strip_suffix(".slice") else {
        return Err(invalid("with the systemd driver the parent must be a slice name ending in .slice"));
    };
    if slice.contains('/') {
        return Err(invalid("a slice name contains no '/'"));
    }
    if name == "-" {
        return Ok(String::new());
    }
    let mut path = String::new();
    let mut prefix = String::new();
    for component in name.split('-') {
        if component.is_empty() || component == "." || component == ".." {
            return Err(invalid("empty or dot component between '-'"));
        }
        if !path.is_empty() {
            path.push('/');
        }
        path.push_str(&prefix);
        path.push_str(component);
        path.push_str(".slice");
        prefix.push_str(component);
        prefix.push('-');
    }
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_expand_like_runc() {
        assert_eq!(expand_slice("system.slice").unwrap(), "system.slice");
        assert_eq!(expand_slice("a-b-c.slice").unwrap(), "a.slice/a-b.slice/a-b-c.slice");
        assert_eq!(expand_slice("-.slice").unwrap(), "");
        for bad in ["system", ".slice", "a--b.slice", "-a.slice", "a-.slice", "a/b.slice", "../x.slice", "a-...slice"] {
            assert!(expand_slice(bad).is_err(), "{bad} accepted");
        }
    }

    #[test]
    fn docker_ids() {
        assert!(validate_docker_id(&"a".repeat(64)).is_ok());
        assert!(validate_docker_id(&"0123456789abcdef".repeat(4)).is_ok());
        for bad in ["abc".to_owned(), "A".repeat(64), "g".repeat(64), "a".repeat(65), format!("../{}", "a".repeat(61))]
        {
            assert!(validate_docker_id(&bad).is_err(), "{bad} accepted");
        }
    }

    #[test]
    fn drivers_parse() {
        assert_eq!("systemd".parse::<CgroupDriver>().unwrap(), CgroupDriver::Systemd);
        assert_eq!("cgroupfs".parse::<CgroupDriver>().unwrap().to_string(), "cgroupfs");
        assert!("Systemd".parse::<CgroupDriver>().is_err());
    }
}
