//! Where the kubelet puts a pod's cgroup, and the check that a runtime-reported cgroup parent is one of those
//! places.
//!
//! The kubelet makes one cgroup per pod and passes it to the runtime as the sandbox's `linux.cgroup_parent`:
//!
//! | QoS class | cgroupfs driver | systemd driver |
//! |---|---|---|
//! | Guaranteed | `/kubepods/pod<uid>` | `kubepods-pod<uid_>.slice` (at `kubepods.slice/…`) |
//! | Burstable | `/kubepods/burstable/pod<uid>` | `kubepods-burstable-pod<uid_>.slice` (at `kubepods.slice/kubepods-burstable.slice/…`) |
//! | BestEffort | `/kubepods/besteffort/pod<uid>` | `kubepods-besteffort-pod<uid_>.slice` (at `kubepods.slice/kubepods-besteffort.slice/…`) |
//!
//! (`uid_`: the pod uid with `-` replaced by `_`, as systemd unit names need.) The relative path is the same on
//! cgroup v1 (below each controller's mount) and v2 (below the unified mount). Anything else is refused, whatever
//! the runtime says: a parent outside kubepods, one naming another pod's uid, `..`, or a symlink on the way
//! ([`CgroupRoot::resolve_relative`] confines the walk to the root).

use std::fmt;

use crate::cgroup::{CgroupDir, CgroupError, CgroupRoot};

/// The kubelet's cgroup driver, as recognised from the shape of the parent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KubeletDriver {
    /// Plain paths: `/kubepods/burstable/pod<uid>`.
    Cgroupfs,
    /// Slice names: `kubepods-burstable-pod<uid_>.slice`.
    Systemd,
}

/// A pod's Kubernetes QoS class, which decides where its cgroup is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QosClass {
    /// Requests equal limits for every container: directly under kubepods, beside the two class cgroups.
    Guaranteed,
    /// Under `kubepods/burstable`.
    Burstable,
    /// Under `kubepods/besteffort`.
    BestEffort,
}

impl fmt::Display for QosClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Guaranteed => "guaranteed",
            Self::Burstable => "burstable",
            Self::BestEffort => "besteffort",
        })
    }
}

/// A pod cgroup path that matches the kubelet's naming for its uid.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodCgroupPath {
    /// The pod's QoS class.
    pub qos: QosClass,
    /// The driver the naming belongs to.
    pub driver: KubeletDriver,
    /// The path relative to the cgroup root, e.g. `kubepods/burstable/pod<uid>`.
    pub rel: String,
}

/// A pod's cgroup could not be used. Messages name the pod uid and the parent.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PodCgroupError {
    /// The uid is not a Kubernetes pod uid (lowercase hex digits and `-`).
    #[error("pod uid {uid:?} refused: expected lowercase hex digits and '-' (a UUID)")]
    BadUid {
        /// The uid as reported.
        uid: String,
    },
    /// The runtime reported no cgroup parent for the sandbox.
    #[error("pod {uid}: the runtime reports no cgroup parent for its sandbox")]
    NoParent {
        /// The pod uid.
        uid: String,
    },
    /// The parent is not where the kubelet puts this pod's cgroup.
    #[error("pod {uid}: cgroup parent {parent:?} refused: {reason}")]
    NotKubepods {
        /// The pod uid.
        uid: String,
        /// The parent as reported.
        parent: String,
        /// Why it is refused.
        reason: &'static str,
    },
    /// The path matches, but the directory cannot be used (missing, a symlink, ...).
    #[error(transparent)]
    Cgroup(#[from] CgroupError),
}

impl PodCgroupError {
    /// The pod cgroup is not (or no longer) there: the pod is starting or gone, not a fault.
    pub fn is_vanished(&self) -> bool {
        matches!(self, Self::Cgroup(e) if e.is_vanished())
    }
}

fn check_uid(uid: &str) -> Result<(), PodCgroupError> {
    let ok = !uid.is_empty()
        && uid.len() <= 64
        && uid.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b) || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(PodCgroupError::BadUid { uid: uid.into() })
    }
}

/// The kubelet's `--cgroup-root` (`cgroupRoot` in its config file, `[cri] cgroup_root` here), below which it
/// makes `kubepods`: `/` by default; kind runs its kubelets with `/kubelet`. With the cgroupfs driver it prefixes
/// the path (`/kubelet/kubepods/burstable/pod<uid>`); with the systemd driver every slice name
/// (`kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-burstable.slice/kubelet-kubepods-burstable-pod<uid_>.slice`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct KubeletRoot {
    /// The root's components: none for `/`, `["kubelet"]` for `/kubelet`.
    parts: Vec<String>,
}

impl KubeletRoot {
    /// Parses a cgroup root such as `/` or `/kubelet`; the error says what is wrong.
    pub fn parse(root: &str) -> Result<Self, &'static str> {
        let Some(rest) = root.strip_prefix('/') else {
            return Err("must be an absolute cgroup path such as \"/\" or \"/kubelet\" (the kubelet's --cgroup-root)");
        };
        let mut parts = Vec::new();
        for c in rest.split('/').filter(|c| !c.is_empty()) {
            let ok = c.len() <= 64
                && !c.ends_with(".slice")
                && c.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
                && c != "kubepods";
            if !ok {
                return Err("each component must be letters, digits, '_' or '-' (no '.', no \"kubepods\"), at most 64");
            }
            parts.push(c.to_string());
        }
        if parts.len() > 8 {
            return Err("at most 8 components");
        }
        Ok(Self { parts })
    }

    /// `kubepods` relative to the cgroup root, with the cgroupfs driver (`kubelet/kubepods`).
    fn cgroupfs_kubepods(&self) -> String {
        self.parts.iter().map(String::as_str).chain(["kubepods"]).collect::<Vec<_>>().join("/")
    }

    /// The slice-name prefix of the systemd driver (`kubelet-`, or empty for `/`).
    fn slice_prefix(&self) -> String {
        self.parts.iter().map(|p| format!("{p}-")).collect()
    }

    /// `kubepods.slice` relative to the cgroup root, with the systemd driver
    /// (`kubelet.slice/kubelet-kubepods.slice`).
    fn systemd_kubepods(&self) -> String {
        let mut out = Vec::new();
        let mut name = String::new();
        for p in self.parts.iter().map(String::as_str).chain(["kubepods"]) {
            name = if name.is_empty() { p.to_string() } else { format!("{name}-{p}") };
            out.push(format!("{name}.slice"));
        }
        out.join("/")
    }

    /// The cgroups (relative to the cgroup root) whose children are pod cgroups or lead to them, both drivers:
    /// what discovery watches with inotify. The root's own levels come first.
    pub fn watched(&self) -> Vec<String> {
        let mut out = vec![String::new()];
        for i in 1..=self.parts.len() {
            out.push(self.parts[..i].join("/"));
        }
        let (fs, sd, pre) = (self.cgroupfs_kubepods(), self.systemd_kubepods(), self.slice_prefix());
        out.extend([fs.clone(), format!("{fs}/burstable"), format!("{fs}/besteffort")]);
        if !self.parts.is_empty() {
            let mut name = String::new();
            let mut path = Vec::new();
            for p in &self.parts {
                name = if name.is_empty() { p.clone() } else { format!("{name}-{p}") };
                path.push(format!("{name}.slice"));
                out.push(path.join("/"));
            }
        }
        out.extend([
            sd.clone(),
            format!("{sd}/{pre}kubepods-burstable.slice"),
            format!("{sd}/{pre}kubepods-besteffort.slice"),
        ]);
        out
    }
}

impl fmt::Display for KubeletRoot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "/{}", self.parts.join("/"))
    }
}

/// Checks `parent` (the sandbox's `linux.cgroup_parent`) against the kubelet's naming for pod `uid` with the
/// default cgroup root `/`, and returns the pod cgroup's path relative to the cgroup root. Touches no file.
pub fn pod_cgroup_path(parent: &str, uid: &str) -> Result<PodCgroupPath, PodCgroupError> {
    pod_cgroup_path_under(&KubeletRoot::default(), parent, uid)
}

/// [`pod_cgroup_path`] for a kubelet whose `--cgroup-root` is `root`.
pub fn pod_cgroup_path_under(root: &KubeletRoot, parent: &str, uid: &str) -> Result<PodCgroupPath, PodCgroupError> {
    check_uid(uid)?;
    if parent.is_empty() {
        return Err(PodCgroupError::NoParent { uid: uid.into() });
    }
    let refuse = |reason| PodCgroupError::NotKubepods { uid: uid.into(), parent: parent.into(), reason };
    if let Some(unit) = parent.strip_suffix(".slice") {
        if parent.contains('/') {
            return Err(refuse("a systemd slice name contains no '/'"));
        }
        let uid_ = uid.replace('-', "_");
        let (pre, sd) = (root.slice_prefix(), root.systemd_kubepods());
        let (qos, rel) = if unit == format!("{pre}kubepods-pod{uid_}") {
            (QosClass::Guaranteed, format!("{sd}/{parent}"))
        } else if unit == format!("{pre}kubepods-burstable-pod{uid_}") {
            (QosClass::Burstable, format!("{sd}/{pre}kubepods-burstable.slice/{parent}"))
        } else if unit == format!("{pre}kubepods-besteffort-pod{uid_}") {
            (QosClass::BestEffort, format!("{sd}/{pre}kubepods-besteffort.slice/{parent}"))
        } else {
            return Err(refuse(
                "not the kubelet's slice for this pod (<cgroup_root->kubepods[-burstable|-besteffort]-pod<uid with _>.slice; \
                 is [cri] cgroup_root the kubelet's --cgroup-root?)",
            ));
        };
        return Ok(PodCgroupPath { qos, driver: KubeletDriver::Systemd, rel });
    }
    let rel = parent.strip_prefix('/').unwrap_or(parent).trim_end_matches('/');
    let pod = format!("pod{uid}");
    let Some(below) = rel.strip_prefix(&root.cgroupfs_kubepods()).and_then(|r| r.strip_prefix('/')) else {
        return Err(refuse(
            "not below the kubelet's kubepods (<cgroup_root>/kubepods[/burstable|/besteffort]/pod<uid>; is [cri] \
             cgroup_root the kubelet's --cgroup-root?)",
        ));
    };
    let qos = match below.split('/').collect::<Vec<_>>().as_slice() {
        [p] if *p == pod => QosClass::Guaranteed,
        ["burstable", p] if *p == pod => QosClass::Burstable,
        ["besteffort", p] if *p == pod => QosClass::BestEffort,
        _ => {
            return Err(refuse(
                "not the kubelet's cgroup for this pod (<cgroup_root>/kubepods[/burstable|/besteffort]/pod<uid>)",
            ))
        }
    };
    Ok(PodCgroupPath { qos, driver: KubeletDriver::Cgroupfs, rel: rel.to_string() })
}

/// The pod's cgroup directory: [`pod_cgroup_path`], then resolved (and confined) under `root`.
pub fn pod_cgroup(root: &CgroupRoot, parent: &str, uid: &str) -> Result<(PodCgroupPath, CgroupDir), PodCgroupError> {
    pod_cgroup_under(root, &KubeletRoot::default(), parent, uid)
}

/// [`pod_cgroup`] for a kubelet whose `--cgroup-root` is `kubelet`.
pub fn pod_cgroup_under(
    root: &CgroupRoot,
    kubelet: &KubeletRoot,
    parent: &str,
    uid: &str,
) -> Result<(PodCgroupPath, CgroupDir), PodCgroupError> {
    let path = pod_cgroup_path_under(kubelet, parent, uid)?;
    let dir = root.resolve_relative(&path.rel)?;
    Ok((path, dir))
}

/// The cgroup parent of a sandbox from the `info` map of a verbose `PodSandboxStatus`: the sandbox config's
/// `linux.cgroup_parent` (containerd's `info` JSON carries the config), else the parent of the OCI spec's
/// `linux.cgroupsPath` (`/kubepods/burstable/pod<uid>/<id>` with cgroupfs, `<slice>:<prefix>:<name>` with
/// systemd). `None` if neither is there.
pub fn cgroup_parent_from_info(info: &std::collections::HashMap<String, String>) -> Option<String> {
    let json: serde_json::Value = serde_json::from_str(info.get("info")?).ok()?;
    let linux = json.get("config").and_then(|c| c.get("linux"));
    let from_config = linux
        .and_then(|l| l.get("cgroup_parent").or_else(|| l.get("cgroupParent")))
        .and_then(|p| p.as_str())
        .filter(|p| !p.is_empty());
    if let Some(p) = from_config {
        return Some(p.to_string());
    }
    let spec_path = json.get("runtimeSpec")?.get("linux")?.get("cgroupsPath")?.as_str()?;
    if let Some((slice, _)) = spec_path.split_once(':') {
        return Some(slice.to_string()).filter(|s| !s.is_empty());
    }
    let (parent, _) = spec_path.rsplit_once('/')?;
    Some(parent.to_string()).filter(|p| !p.is_empty())
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::cgroup::CgroupVersion;

    const UID: &str = "0b6c3a2e-51f4-4b8d-9c3e-7a1d2f4e5b60";
    const UID_: &str = "0b6c3a2e_51f4_4b8d_9c3e_7a1d2f4e5b60";

    #[test]
    fn cgroupfs_parents_of_all_three_classes() {
        for (parent, qos, rel) in [
            (format!("/kubepods/pod{UID}"), QosClass::Guaranteed, format!("kubepods/pod{UID}")),
            (format!("/kubepods/burstable/pod{UID}"), QosClass::Burstable, format!("kubepods/burstable/pod{UID}")),
            (format!("kubepods/besteffort/pod{UID}/"), QosClass::BestEffort, format!("kubepods/besteffort/pod{UID}")),
        ] {
            let p = pod_cgroup_path(&parent, UID).unwrap();
            assert_eq!(p, PodCgroupPath { qos, driver: KubeletDriver::Cgroupfs, rel }, "{parent}");
        }
    }

    #[test]
    fn systemd_parents_of_all_three_classes() {
        for (parent, qos, rel) in [
            (
                format!("kubepods-pod{UID_}.slice"),
                QosClass::Guaranteed,
                format!("kubepods.slice/kubepods-pod{UID_}.slice"),
            ),
            (
                format!("kubepods-burstable-pod{UID_}.slice"),
                QosClass::Burstable,
                format!("kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice"),
            ),
            (
                format!("kubepods-besteffort-pod{UID_}.slice"),
                QosClass::BestEffort,
                format!("kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}.slice"),
            ),
        ] {
            let p = pod_cgroup_path(&parent, UID).unwrap();
            assert_eq!(p, PodCgroupPath { qos, driver: KubeletDriver::Systemd, rel }, "{parent}");
        }
    }

    #[test]
    fn parents_outside_kubepods_or_of_another_pod_are_refused() {
        let other = "11111111-2222-3333-4444-555555555555";
        for parent in [
            "/".to_string(),
            "/docker".into(),
            "/kubepods".into(),
            "/kubepods/burstable".into(),
            format!("/kubepods/burstable/pod{other}"),
            format!("/kubepods/burstable/pod{UID}/../../../docker"),
            format!("/kubepods/guaranteed/pod{UID}"),
            format!("/system.slice/pod{UID}"),
            format!("/kubepods/burstable/pod{UID}/extra"),
            format!("/x/kubepods/pod{UID}"),
            "system.slice".into(),
            format!("kubepods-burstable-pod{UID}.slice"), // dashes: not the systemd escaping
            format!("kubepods-burstable-pod{}.slice", other.replace('-', "_")),
            format!("kubepods.slice/kubepods-pod{UID_}.slice"),
            format!("../kubepods-pod{UID_}.slice"),
        ] {
            let e = pod_cgroup_path(&parent, UID).unwrap_err();
            assert!(matches!(e, PodCgroupError::NotKubepods { .. }), "{parent}: {e}");
            assert!(e.to_string().contains(UID) && e.to_string().contains(&parent), "{e}");
        }
        assert!(matches!(pod_cgroup_path("", UID), Err(PodCgroupError::NoParent { .. })));
    }

    #[test]
    fn a_custom_cgroup_root_like_kinds_prefixes_both_drivers() {
        let kind = KubeletRoot::parse("/kubelet").unwrap();
        assert_eq!(kind.to_string(), "/kubelet");
        for (parent, qos, rel) in [
            (format!("/kubelet/kubepods/pod{UID}"), QosClass::Guaranteed, format!("kubelet/kubepods/pod{UID}")),
            (
                format!("/kubelet/kubepods/besteffort/pod{UID}"),
                QosClass::BestEffort,
                format!("kubelet/kubepods/besteffort/pod{UID}"),
            ),
            (
                format!("kubelet-kubepods-burstable-pod{UID_}.slice"),
                QosClass::Burstable,
                format!(
                    "kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-burstable.slice/\
                     kubelet-kubepods-burstable-pod{UID_}.slice"
                ),
            ),
            (
                format!("kubelet-kubepods-pod{UID_}.slice"),
                QosClass::Guaranteed,
                format!("kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-pod{UID_}.slice"),
            ),
        ] {
            let p = pod_cgroup_path_under(&kind, &parent, UID).unwrap();
            assert_eq!((p.qos, p.rel), (qos, rel), "{parent}");
            // The default root refuses them (and says to check cgroup_root), and vice versa.
            let e = pod_cgroup_path(&parent, UID).unwrap_err().to_string();
            assert!(e.contains("cgroup_root") || e.contains("not the kubelet's"), "{e}");
        }
        for parent in [format!("/kubepods/pod{UID}"), format!("kubepods-pod{UID_}.slice")] {
            assert!(pod_cgroup_path_under(&kind, &parent, UID).is_err(), "{parent}");
        }
        let two = KubeletRoot::parse("/a/b/").unwrap();
        let p = pod_cgroup_path_under(&two, &format!("a-b-kubepods-besteffort-pod{UID_}.slice"), UID).unwrap();
        assert_eq!(
            p.rel,
            format!("a.slice/a-b.slice/a-b-kubepods.slice/a-b-kubepods-besteffort.slice/a-b-kubepods-besteffort-pod{UID_}.slice")
        );
        assert_eq!(
            pod_cgroup_path_under(&two, &format!("/a/b/kubepods/pod{UID}"), UID).unwrap().rel,
            format!("a/b/kubepods/pod{UID}")
        );
        assert_eq!(
            kind.watched(),
            [
                "",
                "kubelet",
                "kubelet/kubepods",
                "kubelet/kubepods/burstable",
                "kubelet/kubepods/besteffort",
                "kubelet.slice",
                "kubelet.slice/kubelet-kubepods.slice",
                "kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-burstable.slice",
                "kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice",
            ]
        );
        assert_eq!(KubeletRoot::parse("/").unwrap(), KubeletRoot::default());
        assert_eq!(KubeletRoot::parse("").unwrap_err(), KubeletRoot::parse("kubelet").unwrap_err());
        for bad in ["kubelet", "/../x", "/a.slice", "/kubepods", "/a b", "/a/./b"] {
            assert!(KubeletRoot::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn uids_that_could_be_paths_are_refused() {
        for uid in ["", "../x", "ABC", "a/b", "pod", &"a".repeat(65), "0b6c 3a2e"] {
            let e = pod_cgroup_path("/kubepods/pod", uid).unwrap_err();
            assert!(matches!(e, PodCgroupError::BadUid { .. }), "{uid}: {e}");
        }
    }

    /// v1 and v2 trees on disk: the same relative paths resolve, and a symlink on the way is refused.
    #[test]
    fn resolves_in_v1_and_v2_fixture_trees() {
        for version in [CgroupVersion::V1, CgroupVersion::V2] {
            let dir = tempfile::tempdir().unwrap();
            let cases = [
                (format!("/kubepods/burstable/pod{UID}"), format!("kubepods/burstable/pod{UID}")),
                (
                    format!("kubepods-besteffort-pod{UID_}.slice"),
                    format!("kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}.slice"),
                ),
            ];
            for (_, rel) in &cases {
                std::fs::create_dir_all(dir.path().join(rel)).unwrap();
            }
            let root = CgroupRoot::from_dir(version, dir.path()).unwrap();
            for (parent, rel) in &cases {
                let (path, cg) = pod_cgroup(&root, parent, UID).unwrap();
                assert_eq!(cg.path(), root.path().join(rel), "{version:?} {parent}");
                assert_eq!(cg.version(), version);
                assert_eq!(&path.rel, rel);
            }
            // Guaranteed pod not created: vanished (a pod still starting), not refused.
            let e = pod_cgroup(&root, &format!("/kubepods/pod{UID}"), UID).unwrap_err();
            assert!(e.is_vanished(), "{e}");
            // A symlink in place of the pod dir is refused even though the name matches.
            let elsewhere = tempfile::tempdir().unwrap();
            std::fs::create_dir_all(dir.path().join("kubepods")).unwrap();
            std::os::unix::fs::symlink(elsewhere.path(), dir.path().join(format!("kubepods/pod{UID}"))).unwrap();
            let e = pod_cgroup(&root, &format!("/kubepods/pod{UID}"), UID).unwrap_err();
            assert!(matches!(e, PodCgroupError::Cgroup(CgroupError::OutsideRoot { .. })), "{e}");
        }
    }

    #[test]
    fn parent_from_containerd_and_spec_info() {
        let info = |json: &str| HashMap::from([("info".to_string(), json.to_string())]);
        let containerd = info(&format!(
            r#"{{"pid":1,"config":{{"metadata":{{"uid":"{UID}"}},"linux":{{"cgroup_parent":"/kubepods/pod{UID}"}}}},
               "runtimeSpec":{{"linux":{{"cgroupsPath":"/elsewhere/x"}}}}}}"#
        ));
        assert_eq!(cgroup_parent_from_info(&containerd).unwrap(), format!("/kubepods/pod{UID}"));
        let spec_fs =
            info(&format!(r#"{{"runtimeSpec":{{"linux":{{"cgroupsPath":"/kubepods/besteffort/pod{UID}/abc"}}}}}}"#));
        assert_eq!(cgroup_parent_from_info(&spec_fs).unwrap(), format!("/kubepods/besteffort/pod{UID}"));
        let spec_sd = info(&format!(
            r#"{{"runtimeSpec":{{"linux":{{"cgroupsPath":"kubepods-pod{UID_}.slice:cri-containerd:abc"}}}}}}"#
        ));
        assert_eq!(cgroup_parent_from_info(&spec_sd).unwrap(), format!("kubepods-pod{UID_}.slice"));
        for bad in [info("not json"), info("{}"), HashMap::new(), info(r#"{"config":{"linux":{"cgroup_parent":""}}}"#)]
        {
            assert_eq!(cgroup_parent_from_info(&bad), None, "{bad:?}");
        }
    }
}
