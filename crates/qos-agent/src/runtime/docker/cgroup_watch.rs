//! [`CgroupWatch`]: a container seen the moment runc creates its cgroup, before its process runs.
//!
//! Docker's `start` event comes after the container's process has started (and after dockerd's own bookkeeping,
//! tens to hundreds of milliseconds), so a container that reads at once would do its first I/O at whatever weight
//! its cgroup had. The cgroup itself appears earlier, at `runc create`: inotify on the directories where Docker's
//! driver puts container cgroups tells the agent then. A directory alone is not enough to manage a container (its
//! name and labels decide its policy, and a name that looks like an id proves nothing), so a new cgroup is
//! announced only for a container Docker has told about: its `create` event (name and labels), or a listing that
//! showed it created and not yet running. Others wait for their `start` event, as before.
//!
//! A container whose own configuration sets a block-I/O weight (`--blkio-weight`, `--blkio-weight-device`) is not
//! announced early either: runc writes those weights after it created the cgroup, over whatever the agent wrote
//! there, and the agent would record the pre-runc value as the container's original. Whether it sets one is read
//! from dockerd's `hostconfig.json` of the container (written at create, read without asking dockerd, whose
//! container lock a starting container holds); where that cannot be read, the `start` event decides, as before.
//!
//! With the **systemd** cgroup driver the container's cgroup is a transient scope that runc is still configuring
//! through systemd (its device policy included) when the directory appears. A `SetUnitProperties` from the agent in
//! that window made systemd re-apply the unit's cgroup settings under runc: `docker run` failed with "failed to call
//! BPF_PROG_ATTACH (BPF_CGROUP_DEVICE ...): no such file or directory" (seen once in the systemd guest, right after
//! `systemctl restart docker`). So the writer writes a starting scope's files directly (no call to systemd), and
//! Docker's `start` event, which comes once runc is done, is passed on as
//! [`DiscoveryEvent::Settled`](crate::backend::DiscoveryEvent::Settled): the daemon then writes the weight again at
//! the first round after the container's entry window (`entry_sample_for`), through systemd, which keeps it over its
//! own re-applies. Until Docker's start event, runc's own
//! `SetUnitProperties` makes systemd put the scope's files back at the unit's values; discovery therefore sends
//! [`DiscoveryEvent::StillStarting`](crate::backend::DiscoveryEvent::StillStarting) every 20 ms meanwhile (for a
//! minute at most per container: one Docker never reports started is left to the rounds), and the daemon reads the
//! weight again and writes it where it was put back.
//!
//! A container announced early is still starting: dockerd holds its container lock until the start completes, so
//! a `docker update` sent now waits for that. [`Starting`] tells the writer which containers those are (it writes
//! their cgroup files directly; see `writer.rs`).
//!
//! The cgroup path is Docker's naming for the id under a watched parent, the same path the documented lookup
//! gives, so nothing a container's process does can steer it elsewhere.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use qos_core::ContainerId;
use tracing::debug;

use super::naming::{container_cgroup, CgroupDriver};
use crate::backend::{ContainerInfo, DiscoveryError, DiscoveryEvent, Starting};
use crate::cgroup::CgroupRoot;
use crate::runtime::support::DirWatch;

/// At most this many created-but-not-started containers are remembered (oldest forgotten first; a forgotten one
/// is announced by its `start` event instead).
const CREATED_CAP: usize = 4096;

/// Name and labels of a container Docker created.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Created {
    /// The container's name (without the leading `/`).
    pub name: String,
    /// Its labels.
    pub labels: BTreeMap<String, String>,
}

/// New container cgroups, from inotify on the parents where Docker's driver puts them.
#[derive(Debug)]
pub(super) struct CgroupWatch {
    watch: Option<DirWatch>,
    root: Arc<CgroupRoot>,
    driver: CgroupDriver,
    /// Parents watched (absolute paths under the root), and the parent expected to appear (cgroupfs' `docker`).
    parents: BTreeSet<PathBuf>,
    created: HashMap<ContainerId, Created>,
    created_order: VecDeque<ContainerId>,
    /// Container cgroup directories announced here, by their inode: a restarted container gets a new directory
    /// under the same name, announced again; the same directory never is.
    seen: HashMap<ContainerId, u64>,
    /// Announcements found by the last scan, handed out one per [`CgroupWatch::next_ready`].
    ready: VecDeque<DiscoveryEvent>,
    /// dockerd's data root (`docker info`), where `containers/<id>/hostconfig.json` says whether a container sets
    /// its own block-I/O weights; `None`: unknown, nothing is announced early.
    data_root: Option<PathBuf>,
    /// Those of `seen` whose start Docker has not confirmed (nor their death, nor a listing shown them running);
    /// shared with the writer.
    starting: Starting,
}

impl CgroupWatch {
    /// Watches the driver's default parents (cgroupfs: the root, for `--cgroup-parent=/`, and `docker`; systemd:
    /// `system.slice`) once they exist. Without inotify (an error) discovery works as before, on events alone.
    pub fn start(
        root: Arc<CgroupRoot>,
        driver: CgroupDriver,
        data_root: Option<PathBuf>,
    ) -> Result<Self, DiscoveryError> {
        let mut this = Self::off(root, driver);
        this.watch = Some(DirWatch::start("ddiskqos-docker-cgroups")?);
        this.data_root = data_root;
        for parent in this.default_parents() {
            this.watch_parent(&parent);
        }
        Ok(this)
    }

    /// A watch that never wakes (hosts without inotify; tests).
    pub fn off(root: Arc<CgroupRoot>, driver: CgroupDriver) -> Self {
        Self {
            data_root: None,
            watch: None,
            root,
            driver,
            parents: BTreeSet::new(),
            created: HashMap::new(),
            created_order: VecDeque::new(),
            seen: HashMap::new(),
            ready: VecDeque::new(),
            starting: Starting::default(),
        }
    }

    /// The containers announced early and not yet confirmed started (a handle that follows the watch).
    pub fn starting(&self) -> Starting {
        self.starting.clone()
    }

    fn default_parents(&self) -> Vec<PathBuf> {
        let root = self.root.path();
        match self.driver {
            CgroupDriver::Cgroupfs => vec![root.to_path_buf(), root.join("docker")],
            CgroupDriver::Systemd => vec![root.join("system.slice")],
        }
    }

    /// Watches `dir` (a container cgroup's parent) too, if it is a directory under the root.
    pub fn watch_parent(&mut self, dir: &Path) {
        if !dir.starts_with(self.root.path()) || !dir.is_dir() {
            return;
        }
        let Some(watch) = &self.watch else { return };
        match watch.add(dir) {
            Ok(()) => {
                if self.parents.insert(dir.to_path_buf()) {
                    debug!(dir = %dir.display(), "watching for new container cgroups");
                }
            }
            Err(e) => debug!(dir = %dir.display(), error = %e, "cannot watch for new container cgroups"),
        }
    }

    /// Remembers a container Docker created (its `create` event, or a listing showing it created).
    pub fn created(&mut self, id: ContainerId, created: Created) {
        if self.created.insert(id.clone(), created).is_none() {
            self.created_order.push_back(id);
            while self.created_order.len() > CREATED_CAP {
                if let Some(old) = self.created_order.pop_front() {
                    self.created.remove(&old);
                }
            }
        }
    }

    /// Docker's `start` event for `id`: `true` when this watch announced it already (the event is then dropped).
    pub fn confirm_started(&mut self, id: &ContainerId) -> bool {
        self.starting.remove(id)
    }

    /// A listing showed these containers running: those announced early have started (their `start` event may
    /// have been missed while dockerd was unreachable).
    pub fn listed_running<'a>(&mut self, running: impl IntoIterator<Item = &'a ContainerId>) {
        for id in running {
            self.starting.remove(id);
        }
    }

    /// Docker's `die`: no longer starting (Docker's event stops it; the directory still there is not announced
    /// again, nor reported stopped when it goes).
    pub fn died(&mut self, id: &ContainerId) {
        self.starting.remove(id);
    }

    /// Docker's `destroy`: the container is gone for good.
    pub fn destroyed(&mut self, id: &ContainerId) {
        self.created.remove(id);
        self.created_order.retain(|c| c != id);
    }

    /// Waits for inotify to report a change (forever, when the watch is off).
    pub async fn changed(&mut self) {
        match self.watch.as_mut() {
            Some(w) => {
                if w.changed().await.is_none() {
                    self.watch = None;
                    std::future::pending::<()>().await;
                }
            }
            None => std::future::pending::<()>().await,
        }
    }

    /// The next announcement found by a scan, if any.
    pub fn next_ready(&mut self) -> Option<DiscoveryEvent> {
        self.ready.pop_front()
    }

    /// Reads the watched parents: a new directory of a container Docker created is queued as `Started`; a
    /// directory announced early that vanished before Docker confirmed the start is queued as `Stopped`.
    pub fn scan(&mut self) {
        // A parent that appeared since (cgroupfs' `docker` at the first container) is watched from now on.
        for parent in self.default_parents() {
            if !self.parents.contains(&parent) {
                self.watch_parent(&parent);
            }
        }
        let mut present: HashMap<ContainerId, (u64, PathBuf)> = HashMap::new();
        for parent in &self.parents {
            let Ok(entries) = std::fs::read_dir(parent) else { continue };
            for entry in entries.flatten() {
                let name = entry.file_name();
                let Some(id) = name.to_str().and_then(|n| container_id_of(self.driver, n)) else { continue };
                let Ok(meta) = entry.metadata() else { continue };
                if meta.is_dir() {
                    present.insert(id, (meta.ino(), parent.clone()));
                }
            }
        }
        // Gone: forget; announced early and never confirmed (runc failed, or it exited at once): stopped.
        let gone: Vec<ContainerId> = self.seen.keys().filter(|id| !present.contains_key(*id)).cloned().collect();
        for id in gone {
            self.seen.remove(&id);
            if self.starting.remove(&id) {
                self.ready.push_back(DiscoveryEvent::Stopped(id));
            }
        }
        for (id, (ino, parent)) in present {
            if self.seen.get(&id) == Some(&ino) {
                continue;
            }
            let Some(created) = self.created.get(&id) else { continue };
            if self.sets_own_weights(&id) != Some(false) {
                continue;
            }
            let Some(info) = self.info(&id, &parent, created) else { continue };
            self.starting.insert(&id);
            self.seen.insert(id, ino);
            self.ready.push_back(DiscoveryEvent::Started(info));
        }
    }

    /// The container's info, its cgroup by Docker's naming under `parent` (the root-relative `--cgroup-parent`).
    fn info(&self, id: &ContainerId, parent: &Path, created: &Created) -> Option<ContainerInfo> {
        let cgroup = match self.driver {
            CgroupDriver::Cgroupfs => {
                let rel = parent.strip_prefix(self.root.path()).ok()?.to_str()?;
                container_cgroup(&self.root, id.as_str(), self.driver, Some(&format!("/{rel}"))).ok()?
            }
            // system.slice (the default) is the only systemd parent watched.
            CgroupDriver::Systemd => container_cgroup(&self.root, id.as_str(), self.driver, None).ok()?,
        };
        // The documented path must be the directory seen (a parent by another name would not be).
        (cgroup.path().parent() == Some(parent)).then(|| ContainerInfo {
            id: id.clone(),
            name: created.name.clone(),
            labels: created.labels.clone(),
            cgroup: Some(cgroup),
        })
    }
}

impl CgroupWatch {
    /// Whether the container's own configuration sets a block-I/O weight runc will write (`BlkioWeight` non-zero or
    /// `BlkioWeightDevice` non-empty in dockerd's `hostconfig.json`); `None` when that cannot be told.
    fn sets_own_weights(&self, id: &ContainerId) -> Option<bool> {
        let path = self.data_root.as_ref()?.join("containers").join(id.as_str()).join("hostconfig.json");
        let text = std::fs::read(&path).ok()?;
        let host: serde_json::Value = serde_json::from_slice(&text).ok()?;
        let weight = host.get("BlkioWeight").and_then(serde_json::Value::as_u64).unwrap_or(0);
        let devices =
            host.get("BlkioWeightDevice").and_then(serde_json::Value::as_array).is_some_and(|d| !d.is_empty());
        Some(weight != 0 || devices)
    }
}

/// The container id a directory name stands for under `driver`'s naming: the 64-hex id itself (cgroupfs) or
/// `docker-<id>.scope` (systemd).
fn container_id_of(driver: CgroupDriver, name: &str) -> Option<ContainerId> {
    let id = match driver {
        CgroupDriver::Cgroupfs => name,
        CgroupDriver::Systemd => name.strip_prefix("docker-")?.strip_suffix(".scope")?,
    };
    let hex = id.len() == 64 && id.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    hex.then(|| ContainerId::from(id.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cgroup::CgroupVersion;

    fn id(c: char) -> String {
        std::iter::repeat_n(c, 64).collect()
    }

    fn created(name: &str) -> Created {
        Created { name: name.into(), labels: BTreeMap::from([("tier".into(), "web".into())]) }
    }

    fn fixture(driver: CgroupDriver) -> (tempfile::TempDir, CgroupWatch) {
        let tmp = tempfile::tempdir().unwrap();
        let root = Arc::new(CgroupRoot::from_dir(CgroupVersion::V1, tmp.path()).unwrap());
        let mut w = CgroupWatch::off(root, driver);
        w.data_root = Some(tmp.path().join("docker-data"));
        // Without inotify the parents are added by hand (the real watch adds them at start and on a scan).
        for p in w.default_parents() {
            std::fs::create_dir_all(&p).unwrap();
            w.parents.insert(p);
        }
        (tmp, w)
    }

    /// dockerd's `hostconfig.json` of `id`, with or without a weight of its own.
    fn hostconfig(w: &CgroupWatch, id: &str, json: &str) {
        let dir = w.data_root.as_ref().unwrap().join("containers").join(id);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("hostconfig.json"), json).unwrap();
    }

    const PLAIN: &str = r#"{"BlkioWeight":0,"BlkioWeightDevice":[],"CpuShares":0}"#;

    fn drain(w: &mut CgroupWatch) -> Vec<String> {
        std::iter::from_fn(|| w.next_ready())
            .map(|ev| match ev {
                DiscoveryEvent::Started(info) => format!(
                    "started {} {} {}",
                    &info.id.as_str()[..1],
                    info.name,
                    info.cgroup.unwrap().path().display()
                ),
                DiscoveryEvent::Stopped(id) => format!("stopped {}", &id.as_str()[..1]),
                other => format!("{other:?}"),
            })
            .collect()
    }

    #[test]
    fn a_created_containers_cgroup_is_announced_once_with_its_labels() {
        let (tmp, mut w) = fixture(CgroupDriver::Cgroupfs);
        let a = ContainerId::from(id('a'));
        w.created(a.clone(), created("web"));
        hostconfig(&w, &id('a'), PLAIN);
        std::fs::create_dir(tmp.path().join("docker").join(id('a'))).unwrap();
        w.scan();
        let root = tmp.path().display();
        assert_eq!(drain(&mut w), vec![format!("started a web {root}/docker/{}", id('a'))]);
        // Another change (anything) rescans: nothing new.
        w.scan();
        assert!(drain(&mut w).is_empty());
        // Docker's start event for it is dropped, once.
        assert!(w.confirm_started(&a));
        assert!(!w.confirm_started(&a));
    }

    #[test]
    fn a_cgroup_docker_never_announced_is_left_to_the_start_event() {
        let (tmp, mut w) = fixture(CgroupDriver::Cgroupfs);
        // A directory named like an id, with no create event (made by someone else, or created before the agent).
        std::fs::create_dir(tmp.path().join("docker").join(id('b'))).unwrap();
        std::fs::create_dir(tmp.path().join("docker").join("not-an-id")).unwrap();
        w.scan();
        assert!(drain(&mut w).is_empty());
        assert!(!w.confirm_started(&ContainerId::from(id('b'))));
    }

    #[test]
    fn flat_parent_and_restart_and_a_failed_start() {
        let (tmp, mut w) = fixture(CgroupDriver::Cgroupfs);
        let c = ContainerId::from(id('c'));
        w.created(c.clone(), created("flat"));
        hostconfig(&w, &id('c'), PLAIN);
        let dir = tmp.path().join(id('c'));
        std::fs::create_dir(&dir).unwrap();
        w.scan();
        assert_eq!(drain(&mut w), vec![format!("started c flat {}", dir.display())]);
        assert!(w.confirm_started(&c));
        // It dies; until its directory is gone nothing is announced; restarted: a new directory, announced.
        w.died(&c);
        w.scan();
        assert!(drain(&mut w).is_empty());
        std::fs::remove_dir(&dir).unwrap();
        w.scan();
        assert!(drain(&mut w).is_empty(), "confirmed and died: Docker's die event stopped it");
        std::fs::create_dir(&dir).unwrap();
        w.scan();
        assert_eq!(drain(&mut w), vec![format!("started c flat {}", dir.display())]);
        // runc fails before Docker confirms the start: the directory goes, the container is stopped.
        std::fs::remove_dir(&dir).unwrap();
        w.scan();
        assert_eq!(drain(&mut w), vec!["stopped c".to_string()]);
        // Removed for good: its name and labels are forgotten.
        w.destroyed(&c);
        std::fs::create_dir(&dir).unwrap();
        w.scan();
        assert!(drain(&mut w).is_empty());
    }

    #[test]
    fn the_writer_sees_a_container_as_starting_from_its_announcement_until_docker_confirms_or_it_goes() {
        let (tmp, mut w) = fixture(CgroupDriver::Cgroupfs);
        let starting = w.starting();
        let [a, b, c, d] = ['a', 'b', 'c', 'd'].map(|ch| {
            let cid = ContainerId::from(id(ch));
            w.created(cid.clone(), created("web"));
            hostconfig(&w, &id(ch), PLAIN);
            std::fs::create_dir(tmp.path().join("docker").join(id(ch))).unwrap();
            cid
        });
        assert!(![&a, &b, &c, &d].iter().any(|x| starting.contains(x)), "nothing is starting before a scan");
        w.scan();
        assert_eq!(drain(&mut w).len(), 4);
        assert!([&a, &b, &c, &d].iter().all(|x| starting.contains(x)));
        // The start event; a listing that shows it running (a start event missed while dockerd was away); its
        // die event; its directory gone before any of those (runc failed).
        assert!(w.confirm_started(&a));
        w.listed_running([&b]);
        w.died(&c);
        std::fs::remove_dir(tmp.path().join("docker").join(id('d'))).unwrap();
        w.scan();
        assert_eq!(drain(&mut w), vec!["stopped d".to_string()]);
        for x in [&a, &b, &c, &d] {
            assert!(!starting.contains(x), "{} still starting", x.short());
        }
        // A listed container no longer announced early: its (replayed) start event is not dropped as a duplicate.
        assert!(!w.confirm_started(&b));
    }

    #[test]
    fn systemd_scopes_are_announced_at_creation_and_stay_starting_until_docker_confirms() {
        let (tmp, mut w) = fixture(CgroupDriver::Systemd);
        let starting = w.starting();
        let d = ContainerId::from(id('d'));
        w.created(d.clone(), created("svc"));
        hostconfig(&w, &id('d'), PLAIN);
        let scope = tmp.path().join("system.slice").join(format!("docker-{}.scope", id('d')));
        std::fs::create_dir(&scope).unwrap();
        w.scan();
        assert_eq!(drain(&mut w), vec![format!("started d svc {}", scope.display())]);
        // The writer keeps systemd out of it while runc sets the scope up through systemd.
        assert!(starting.contains(&d), "a scope runc is setting up must be written by file");
        assert!(w.confirm_started(&d), "its start event confirms it (and is passed on as Settled)");
        assert!(!starting.contains(&d));
        // A scope of a container Docker never told about is not announced.
        let other = tmp.path().join("system.slice").join(format!("docker-{}.scope", id('e')));
        std::fs::create_dir(&other).unwrap();
        w.scan();
        assert!(drain(&mut w).is_empty());
    }

    #[test]
    fn a_container_with_weights_of_its_own_waits_for_its_start_event() {
        let (tmp, mut w) = fixture(CgroupDriver::Cgroupfs);
        // runc writes these after creating the cgroup: an early weight would be overwritten, and the value before
        // runc recorded as the original.
        for (c, json) in [
            ('e', r#"{"BlkioWeight":300,"BlkioWeightDevice":[]}"#),
            ('f', r#"{"BlkioWeight":0,"BlkioWeightDevice":[{"Path":"/dev/sdb","Weight":500}]}"#),
            ('g', "not json"),
        ] {
            w.created(ContainerId::from(id(c)), created("own"));
            hostconfig(&w, &id(c), json);
            std::fs::create_dir(tmp.path().join("docker").join(id(c))).unwrap();
        }
        // And one whose hostconfig.json is not there (another data root, or not readable).
        w.created(ContainerId::from(id('h')), created("unknown"));
        std::fs::create_dir(tmp.path().join("docker").join(id('h'))).unwrap();
        w.scan();
        assert!(drain(&mut w).is_empty());
        assert!(!w.confirm_started(&ContainerId::from(id('e'))), "its start event announces it");
    }

    #[test]
    fn the_created_map_is_bounded() {
        let (_tmp, mut w) = fixture(CgroupDriver::Cgroupfs);
        for i in 0..CREATED_CAP + 10 {
            w.created(ContainerId::from(format!("{i:064x}")), created("x"));
        }
        assert_eq!(w.created.len(), CREATED_CAP);
        assert!(!w.created.contains_key(&ContainerId::from(format!("{:064x}", 0))));
        assert!(w.created.contains_key(&ContainerId::from(format!("{:064x}", CREATED_CAP + 9))));
    }

    #[test]
    fn directory_names() {
        let i = id('e');
        assert!(container_id_of(CgroupDriver::Cgroupfs, &i).is_some());
        assert!(container_id_of(CgroupDriver::Cgroupfs, &format!("docker-{i}.scope")).is_none());
        assert!(container_id_of(CgroupDriver::Systemd, &format!("docker-{i}.scope")).is_some());
        assert!(container_id_of(CgroupDriver::Systemd, &i).is_none());
        assert!(container_id_of(CgroupDriver::Cgroupfs, &"A".repeat(64)).is_none());
    }
}
