//! [`CriDiscovery`]: pods from a CRI runtime, one entry per pod.
//!
//! containerd 1.6 has no event stream in CRI v1 (`GetContainerEvents` came with 1.7), so discovery re-lists the
//! READY sandboxes every `relist_interval` (one `ListPodSandbox`, answered from the runtime's memory) and, so a new
//! pod is seen at once rather than up to an interval later, watches the kubepods cgroup tree with inotify: a pod
//! cgroup appearing or disappearing starts a burst of quick re-lists (the sandbox becomes READY a moment after its
//! cgroup is made). A new sandbox costs one verbose `PodSandboxStatus`, for its cgroup parent.
//!
//! The entry's id is the pod uid (stable across sandbox re-creation, and the name of its cgroup), its name
//! `namespace/name`, its labels the pod's `ddiskqos.io/*` annotations, its cgroup the pod cgroup.

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use k8s_cri::v1::PodSandbox;
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
use qos_core::ContainerId;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::client::CriClient;
use super::naming::{cgroup_parent_from_info, pod_cgroup};
use crate::backend::{ContainerInfo, Discovery, DiscoveryError, DiscoveryEvent};
use crate::cgroup::CgroupRoot;

/// Annotations copied into an entry's labels: the policy keys and anything else of ours.
pub const ANNOTATION_PREFIX: &str = "ddiskqos.io/";

/// After a change in the kubepods tree, re-list this often ...
const BURST_INTERVAL: Duration = Duration::from_millis(200);
/// ... for this long.
const BURST_FOR: Duration = Duration::from_secs(2);
const BACKOFF_MIN: Duration = Duration::from_millis(200);
const BACKOFF_MAX: Duration = Duration::from_secs(5);

/// The cgroups whose children are pod cgroups (both drivers), and the root (where kubepods itself appears).
const WATCHED: [&str; 7] = [
    "",
    "kubepods",
    "kubepods/burstable",
    "kubepods/besteffort",
    "kubepods.slice",
    "kubepods.slice/kubepods-burstable.slice",
    "kubepods.slice/kubepods-besteffort.slice",
];

/// Discovers the pods of a CRI runtime.
pub struct CriDiscovery {
    client: CriClient,
    root: Arc<CgroupRoot>,
    relist_interval: Duration,
    /// Pods managed now: uid → (sandbox id, what was reported for it).
    known: BTreeMap<String, (String, ContainerInfo)>,
    /// Sandboxes whose cgroup was refused, so the warning is given once.
    refused: HashSet<String>,
    queue: VecDeque<DiscoveryEvent>,
    lost: bool,
    backoff: Duration,
    burst_until: Option<Instant>,
    inotify: Option<Arc<Inotify>>,
    changed: Option<mpsc::Receiver<()>>,
    last_list: Option<Instant>,
}

impl std::fmt::Debug for CriDiscovery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CriDiscovery")
            .field("socket", &self.client.socket())
            .field("known", &self.known.len())
            .field("lost", &self.lost)
            .finish()
    }
}

impl CriDiscovery {
    /// Pods of the runtime `client` talks to; pod cgroups under `root`.
    pub fn new(client: CriClient, root: Arc<CgroupRoot>, relist_interval: Duration) -> Self {
        Self {
            client,
            root,
            relist_interval,
            known: BTreeMap::new(),
            refused: HashSet::new(),
            queue: VecDeque::new(),
            lost: false,
            backoff: BACKOFF_MIN,
            burst_until: None,
            inotify: None,
            changed: None,
            last_list: None,
        }
    }

    /// Watches whichever kubepods cgroups exist now (called at every re-list: the kubelet, or the first pod,
    /// may create them later). Re-adding an existing watch only refreshes it.
    fn watch_tree(&self) {
        let Some(ino) = self.inotify.as_ref() else { return };
        for rel in WATCHED {
            let path: PathBuf = self.root.path().join(rel);
            if path.is_dir() {
                let flags = AddWatchFlags::IN_CREATE | AddWatchFlags::IN_DELETE | AddWatchFlags::IN_ONLYDIR;
                if let Err(e) = ino.add_watch(&path, flags) {
                    debug!(path = %path.display(), error = %e, "cannot watch kubepods cgroup");
                }
            }
        }
    }

    /// The full list of READY pods with a usable cgroup, by uid.
    async fn list(&mut self) -> Result<BTreeMap<String, (String, ContainerInfo)>, DiscoveryError> {
        self.watch_tree();
        let sandboxes = self.client.ready_sandboxes().await?;
        // A refused sandbox stays refused (one warning) while it is listed; forgotten once it is gone.
        let listed: HashSet<&str> = sandboxes.iter().map(|s| s.id.as_str()).collect();
        self.refused.retain(|s| listed.contains(s.as_str()));
        let mut out = BTreeMap::new();
        for sb in sandboxes {
            let Some(uid) = sb.metadata.as_ref().map(|m| m.uid.clone()) else { continue };
            match self.known.get(&uid) {
                // Known and unchanged: a sandbox's config (cgroup parent, annotations) never changes.
                Some((sandbox, info)) if *sandbox == sb.id => {
                    out.insert(uid, (sb.id.clone(), info.clone()));
                }
                _ => {
                    if let Some(info) = self.inspect(&sb, &uid).await {
                        out.insert(uid, (sb.id.clone(), info));
                    }
                }
            }
        }
        Ok(out)
    }

    /// Re-lists and queues the differences with what is known.
    async fn relist(&mut self) -> Result<(), DiscoveryError> {
        let now = self.list().await?;
        for (uid, (sandbox, _)) in &self.known {
            // Gone, or its sandbox re-created (a new sandbox may mean a new cgroup parent): drop it first.
            if now.get(uid).is_none_or(|(s, _)| s != sandbox) {
                self.queue.push_back(DiscoveryEvent::Stopped(ContainerId::new(uid)));
            }
        }
        for (uid, (sandbox, info)) in &now {
            if self.known.get(uid).is_none_or(|(s, _)| s != sandbox) {
                self.queue.push_back(DiscoveryEvent::Started(info.clone()));
            }
        }
        self.known = now;
        Ok(())
    }

    /// Waits until the runtime answers again (backoff 0.2 s doubling to 5 s), then lists everything.
    async fn reconnect(&mut self) -> DiscoveryEvent {
        loop {
            tokio::time::sleep(self.backoff).await;
            self.backoff = (self.backoff * 2).min(BACKOFF_MAX);
            match self.list().await {
                Ok(now) => {
                    self.backoff = BACKOFF_MIN;
                    self.lost = false;
                    self.queue.clear();
                    let list = now.values().map(|(_, info)| info.clone()).collect();
                    self.known = now;
                    info!(socket = %self.client.socket().display(), pods = self.known.len(), "CRI runtime answers again");
                    return DiscoveryEvent::Resync(list);
                }
                Err(e) => debug!(error = %e, retry_in = ?self.backoff, "CRI runtime still unreachable"),
            }
        }
    }

    /// When the next re-list is due.
    fn next_relist(&mut self, last: Instant) -> Instant {
        match self.burst_until {
            Some(until) if last < until => last + BURST_INTERVAL,
            _ => {
                self.burst_until = None;
                last + self.relist_interval
            }
        }
    }

    /// One verbose status call for a sandbox not seen before; `None` if its cgroup is refused or not there yet.
    async fn inspect(&mut self, sb: &PodSandbox, uid: &str) -> Option<ContainerInfo> {
        if self.refused.contains(&sb.id) {
            return None;
        }
        let info = match self.client.sandbox_info(&sb.id).await {
            Ok(info) => info,
            Err(e) => {
                debug!(sandbox = %sb.id, error = %e, "sandbox status failed (sandbox gone?)");
                return None;
            }
        };
        let parent = cgroup_parent_from_info(&info).unwrap_or_default();
        match pod_cgroup(&self.root, &parent, uid) {
            Ok((path, dir)) => {
                debug!(pod = uid, qos = %path.qos, cgroup = %path.rel, "pod cgroup");
                Some(ContainerInfo {
                    id: ContainerId::new(uid),
                    name: pod_name(sb),
                    labels: policy_annotations(sb),
                    cgroup: Some(dir),
                })
            }
            Err(e) if e.is_vanished() => {
                debug!(pod = uid, error = %e, "pod cgroup not there (yet); next re-list tries again");
                None
            }
            Err(e) => {
                warn!(pod = uid, name = %pod_name(sb), sandbox = %sb.id, error = %e, "pod not managed");
                self.refused.insert(sb.id.clone());
                None
            }
        }
    }
}

/// `namespace/name` of a sandbox.
fn pod_name(sb: &PodSandbox) -> String {
    sb.metadata.as_ref().map_or_else(|| sb.id.clone(), |m| format!("{}/{}", m.namespace, m.name))
}

/// The pod's `ddiskqos.io/*` annotations, read as policy labels.
fn policy_annotations(sb: &PodSandbox) -> BTreeMap<String, String> {
    sb.annotations
        .iter()
        .filter(|(k, _)| k.starts_with(ANNOTATION_PREFIX))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

impl Discovery for CriDiscovery {
    async fn start(&mut self) -> Result<Vec<ContainerInfo>, DiscoveryError> {
        // Watch first, then list: a pod cgroup made in between wakes the first re-list.
        let ino = Inotify::init(InitFlags::IN_CLOEXEC)
            .map_err(|e| DiscoveryError::Runtime { what: "inotify_init".into(), detail: e.to_string() })?;
        let ino = Arc::new(ino);
        let (tx, rx) = mpsc::channel(1);
        let reader = ino.clone();
        // A thread blocked on the descriptor (tokio's `AsyncFd` registration is `unsafe`, and this crate has none);
        // it ends when the receiver is dropped and the next notification arrives.
        std::thread::Builder::new()
            .name("ddiskqos-cri-watch".into())
            .spawn(move || loop {
                match reader.read_events() {
                    Ok(_) => {
                        if let Err(mpsc::error::TrySendError::Closed(())) = tx.try_send(()) {
                            return;
                        }
                    }
                    Err(nix::errno::Errno::EINTR) => {}
                    Err(_) => return,
                }
            })
            .map_err(|e| DiscoveryError::Runtime { what: "spawn CRI watch thread".into(), detail: e.to_string() })?;
        self.inotify = Some(ino);
        self.changed = Some(rx);
        let now = self.list().await?;
        self.last_list = Some(Instant::now());
        let list = now.values().map(|(_, info)| info.clone()).collect();
        self.known = now;
        Ok(list)
    }

    async fn next_event(&mut self) -> Result<DiscoveryEvent, DiscoveryError> {
        loop {
            if let Some(ev) = self.queue.pop_front() {
                return Ok(ev);
            }
            if self.lost {
                return Ok(self.reconnect().await);
            }
            let last = self.last_list.unwrap_or_else(Instant::now);
            let due = self.next_relist(last);
            let changed = self.changed.as_mut();
            tokio::select! {
                _ = tokio::time::sleep_until(due) => {}
                woke = async { match changed { Some(rx) => rx.recv().await, None => std::future::pending().await } } => {
                    if woke.is_none() {
                        return Err(DiscoveryError::Runtime {
                            what: "watch kubepods cgroups".into(),
                            detail: "inotify watcher stopped".into(),
                        });
                    }
                    self.burst_until = Some(Instant::now() + BURST_FOR);
                }
            }
            self.last_list = Some(Instant::now());
            if let Err(e) = self.relist().await {
                warn!(error = %e, "CRI runtime unreachable; weights stay as they are, retrying");
                self.lost = true;
                return Ok(DiscoveryEvent::Lost(e.to_string()));
            }
        }
    }
}
