//! [`CriDiscovery`]: pods from a CRI runtime, one entry per pod.
//!
//! List, then watch. Discovery lists the READY sandboxes at start and re-lists them every `relist_interval` (one
//! `ListPodSandbox`, answered from the runtime's memory), and wakes up early for a new pod from two sources:
//! - the runtime's container event stream (`GetContainerEvents`: containerd 1.7+, CRI-O with evented PLEG), where
//!   the runtime has one: every event starts a burst of quick re-lists; a runtime without it (containerd 1.6
//!   answers `Unimplemented`) is logged once and asked again only after it restarts; a stream that ends is asked
//!   for again at the next successful list;
//! - inotify on the kubepods cgroup tree, for every runtime: a pod cgroup appearing or disappearing starts the same
//!   burst (the sandbox becomes READY a moment after its cgroup is made).
//!
//! A new sandbox costs one verbose `PodSandboxStatus`, for its cgroup parent.
//!
//! The entry's id is the pod uid (stable across sandbox re-creation, and the name of its cgroup), its name
//! `namespace/name`, its labels the policy `[policy]` decided from the pod's namespace, labels and annotations
//! ([`crate::policy`]: what was not honoured is logged once per sandbox), its cgroup the pod cgroup.
//!
//! A pod's sandbox may die and be made again by the kubelet (same uid, new sandbox id), while the pod cgroup, and the
//! weight the agent wrote there, stays. A pod is therefore reported `Stopped` only once its cgroup is gone or it
//! moved to another cgroup, never for its sandbox alone (`Stopped` makes the daemon forget the pod's original weight
//! without putting it back, right only for a cgroup that is gone):
//! - a known pod no longer listed READY whose cgroup is still there (between a dead sandbox and the kubelet's next
//!   one, or a new sandbox not usable yet) stays known as it was;
//! - a new sandbox of a known pod on the same cgroup is `Started` again with what its sandbox says now (annotations
//!   may differ): the daemon keeps the original and takes the new policy;
//! - a new sandbox on another cgroup is `Stopped`, then `Started`;
//! - after an outage the `Resync` list keeps the same rule: a known pod whose cgroup is there is listed.

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use k8s_cri::v1::PodSandbox;
use qos_core::ContainerId;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::client::{CriClient, EventWake, SandboxSource};
use super::naming::{cgroup_parent_from_info, pod_cgroup_under, KubeletRoot};
use crate::backend::{ContainerInfo, Discovery, DiscoveryError, DiscoveryEvent};
use crate::cgroup::CgroupRoot;
use crate::policy::{PodFacts, PolicyConfig};
use crate::runtime::support::{Backoff, DirWatch};

/// Annotations copied into an entry's labels: the policy keys and anything else of ours.
pub const ANNOTATION_PREFIX: &str = "ddiskqos.io/";

/// After a change in the kubepods tree, re-list this often ...
const BURST_INTERVAL: Duration = Duration::from_millis(200);
/// ... for this long.
const BURST_FOR: Duration = Duration::from_secs(2);

/// Discovers the pods of a CRI runtime (`S`: the CRI client; a fake in tests).
pub struct CriDiscovery<S = CriClient> {
    client: S,
    root: Arc<CgroupRoot>,
    /// The kubelet's `--cgroup-root`.
    kubelet_root: KubeletRoot,
    /// The cgroups watched with inotify (relative to `root`): the kubepods levels of both drivers.
    watched: Vec<String>,
    /// `[policy]`: what a pod's annotations may ask for, and which pods are left alone.
    policy: Arc<PolicyConfig>,
    relist_interval: Duration,
    /// Pods managed now: uid → (sandbox id, what was reported for it).
    known: BTreeMap<String, (String, ContainerInfo)>,
    /// Sandboxes whose cgroup was refused, so the warning is given once.
    refused: HashSet<String>,
    queue: VecDeque<DiscoveryEvent>,
    lost: bool,
    backoff: Backoff,
    burst_until: Option<Instant>,
    watch: Option<DirWatch>,
    /// The runtime's container events, while subscribed.
    events: Option<mpsc::Receiver<EventWake>>,
    /// The event stream ended: subscribe again after the next successful list.
    resubscribe: bool,
    last_list: Option<Instant>,
}

/// What woke [`CriDiscovery::next_event`] up.
enum Woke {
    Timer,
    Tree(Option<()>),
    Event(Option<EventWake>),
}

impl<S: SandboxSource> std::fmt::Debug for CriDiscovery<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CriDiscovery")
            .field("runtime", &self.client.describe())
            .field("known", &self.known.len())
            .field("lost", &self.lost)
            .finish()
    }
}

impl<S: SandboxSource> CriDiscovery<S> {
    /// Pods of the runtime `client` talks to; pod cgroups under `root`.
    pub fn new(client: S, root: Arc<CgroupRoot>, relist_interval: Duration) -> Self {
        Self {
            client,
            root,
            watched: KubeletRoot::default().watched(),
            kubelet_root: KubeletRoot::default(),
            policy: Arc::new(PolicyConfig::default()),
            relist_interval,
            known: BTreeMap::new(),
            refused: HashSet::new(),
            queue: VecDeque::new(),
            lost: false,
            backoff: Backoff::new(),
            burst_until: None,
            watch: None,
            events: None,
            resubscribe: false,
            last_list: None,
        }
    }

    /// Pods of a kubelet whose `--cgroup-root` is `root` (default `/`).
    pub fn with_kubelet_root(mut self, root: KubeletRoot) -> Self {
        self.watched = root.watched();
        self.kubelet_root = root;
        self
    }

    /// Pods under the operator's `policy` (default: [`PolicyConfig::default`]).
    pub fn with_policy(mut self, policy: Arc<PolicyConfig>) -> Self {
        self.policy = policy;
        self
    }

    /// Subscribes to the runtime's container events (see the module doc).
    fn subscribe(&mut self) {
        self.events = Some(self.client.watch_events());
        self.resubscribe = false;
    }

    /// Watches whichever kubepods cgroups exist now (called at every re-list: the kubelet, or the first pod,
    /// may create them later). Re-adding an existing watch only refreshes it.
    fn watch_tree(&self) {
        let Some(watch) = self.watch.as_ref() else { return };
        for rel in &self.watched {
            let path: PathBuf = self.root.path().join(rel);
            if path.is_dir() {
                if let Err(e) = watch.add(&path) {
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

    /// The pods managed from now on: those listed, and the known ones not listed whose cgroup is still there (see
    /// the module doc), as they were.
    async fn list_managed(&mut self) -> Result<BTreeMap<String, (String, ContainerInfo)>, DiscoveryError> {
        let mut now = self.list().await?;
        for (uid, (sandbox, info)) in &self.known {
            if now.contains_key(uid) || !info.cgroup.as_ref().is_some_and(|c| c.path().is_dir()) {
                continue;
            }
            debug!(pod = uid.as_str(), name = %info.name, sandbox = sandbox.as_str(),
                   "pod not listed READY but its cgroup is there (sandbox being re-created?); kept");
            now.insert(uid.clone(), (sandbox.clone(), info.clone()));
        }
        Ok(now)
    }

    /// Re-lists and queues the differences with what is known (see the module doc).
    async fn relist(&mut self) -> Result<(), DiscoveryError> {
        let now = self.list_managed().await?;
        for (uid, (_, info)) in &self.known {
            // Gone, or its sandbox re-created on another cgroup: drop it first.
            if now.get(uid).is_none_or(|(_, new)| new.cgroup_path() != info.cgroup_path()) {
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
            self.backoff.wait().await;
            match self.list_managed().await {
                Ok(now) => {
                    self.backoff.reset();
                    self.lost = false;
                    self.queue.clear();
                    let list = now.values().map(|(_, info)| info.clone()).collect();
                    self.known = now;
                    info!(runtime = %self.client.describe(), pods = self.known.len(), "CRI runtime answers again");
                    // A restarted runtime may be another version: ask for its events again.
                    self.subscribe();
                    return DiscoveryEvent::Resync(list);
                }
                Err(e) => debug!(error = %e, retry_in = ?self.backoff.next(), "CRI runtime still unreachable"),
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
        match pod_cgroup_under(&self.root, &self.kubelet_root, &parent, uid) {
            Ok((path, dir)) => {
                debug!(pod = uid, qos = %path.qos, cgroup = %path.rel, "pod cgroup");
                Some(ContainerInfo {
                    id: ContainerId::new(uid),
                    name: pod_name(sb),
                    labels: self.decide(sb),
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

impl<S: SandboxSource> CriDiscovery<S> {
    /// The policy labels `[policy]` gives the pod; called once per sandbox (when its cgroup is first usable), so
    /// each note is logged once.
    fn decide(&self, sb: &PodSandbox) -> BTreeMap<String, String> {
        let namespace = sb.metadata.as_ref().map_or("", |m| m.namespace.as_str());
        let facts = PodFacts { namespace, annotations: &sb.annotations, labels: &sb.labels };
        let decision = self.policy.decide_pod(&facts);
        let pod = pod_name(sb);
        if let Some(rule) = &decision.system {
            info!(pod = %pod, rule = %rule, "system pod: never touched");
        }
        for note in &decision.notes {
            warn!(pod = %pod, annotation = note.annotation, value = %note.value, rule = %note.rule,
                  "pod annotation not honoured; the pod is managed without it");
        }
        decision.labels
    }
}

impl<S: SandboxSource> Discovery for CriDiscovery<S> {
    async fn start(&mut self) -> Result<Vec<ContainerInfo>, DiscoveryError> {
        // Watch first, then list: a pod cgroup made in between wakes the first re-list.
        self.watch = Some(DirWatch::start("ddiskqos-cri-watch")?);
        let now = self.list().await?;
        self.last_list = Some(Instant::now());
        let list = now.values().map(|(_, info)| info.clone()).collect();
        self.known = now;
        self.subscribe();
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
            let changed = self.watch.as_mut();
            let events = self.events.as_mut();
            // Biased, events first: an ended or unsupported stream is noted before a re-list another wake starts,
            // so that re-list is the one after which discovery subscribes again.
            let woke = tokio::select! {
                biased;
                w = async { match events { Some(rx) => rx.recv().await, None => std::future::pending().await } } => {
                    Woke::Event(w)
                }
                w = async { match changed { Some(w) => w.changed().await, None => std::future::pending().await } } => {
                    Woke::Tree(w)
                }
                _ = tokio::time::sleep_until(due) => Woke::Timer,
            };
            match woke {
                Woke::Timer => {}
                Woke::Tree(None) => {
                    return Err(DiscoveryError::Runtime {
                        what: "watch kubepods cgroups".into(),
                        detail: "inotify watcher stopped".into(),
                    });
                }
                Woke::Tree(Some(())) | Woke::Event(Some(EventWake::Changed)) => {
                    self.burst_until = Some(Instant::now() + BURST_FOR);
                }
                Woke::Event(Some(EventWake::Unsupported)) => {
                    self.events = None;
                    info!(
                        runtime = %self.client.describe(),
                        relist_interval = ?self.relist_interval,
                        "CRI runtime has no container event stream (GetContainerEvents unimplemented, e.g. containerd \
                         before 1.7): new pods are found by re-listing and by inotify on the kubepods cgroups"
                    );
                    continue;
                }
                Woke::Event(end) => {
                    self.events = None;
                    self.resubscribe = true;
                    let why = match end {
                        Some(EventWake::Ended(why)) => why,
                        _ => "the event task stopped".into(),
                    };
                    debug!(reason = %why, "CRI event stream ended; subscribing again after the next list");
                    continue;
                }
            }
            self.last_list = Some(Instant::now());
            if let Err(e) = self.relist().await {
                warn!(error = %e, "CRI runtime unreachable; weights stay as they are, retrying");
                self.lost = true;
                self.events = None;
                return Ok(DiscoveryEvent::Lost(e.to_string()));
            }
            if self.resubscribe {
                self.subscribe();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::Mutex;

    use k8s_cri::v1::PodSandboxMetadata;

    use super::*;
    use crate::cgroup::CgroupVersion;

    /// An in-memory runtime: the sandboxes it lists, whether it answers, and how often each sandbox was inspected.
    #[derive(Default)]
    struct World {
        sandboxes: Vec<(PodSandbox, String)>, // (sandbox, cgroup parent)
        down: bool,
        inspected: HashMap<String, usize>,
        /// Whether the runtime has a container event stream; the sending end of the current subscription.
        has_events: bool,
        events: Option<mpsc::Sender<EventWake>>,
        subscriptions: usize,
    }

    #[derive(Clone)]
    struct Fake(Arc<Mutex<World>>);

    impl SandboxSource for Fake {
        fn describe(&self) -> String {
            "fake".into()
        }

        async fn ready_sandboxes(&mut self) -> Result<Vec<PodSandbox>, DiscoveryError> {
            let w = self.0.lock().unwrap();
            if w.down {
                return Err(DiscoveryError::Runtime { what: "ListPodSandbox".into(), detail: "Unavailable".into() });
            }
            Ok(w.sandboxes.iter().map(|(s, _)| s.clone()).collect())
        }

        async fn sandbox_info(&mut self, id: &str) -> Result<HashMap<String, String>, DiscoveryError> {
            let mut w = self.0.lock().unwrap();
            *w.inspected.entry(id.to_string()).or_default() += 1;
            let parent = w.sandboxes.iter().find(|(s, _)| s.id == id).map(|(_, p)| p.clone()).unwrap_or_default();
            let json = serde_json::json!({ "config": { "linux": { "cgroup_parent": parent } } });
            Ok(HashMap::from([("info".to_string(), json.to_string())]))
        }

        fn watch_events(&mut self) -> mpsc::Receiver<EventWake> {
            let mut w = self.0.lock().unwrap();
            w.subscriptions += 1;
            let (tx, rx) = mpsc::channel(1);
            if w.has_events {
                w.events = Some(tx);
            } else {
                tx.try_send(EventWake::Unsupported).unwrap();
            }
            rx
        }
    }

    fn uid(n: u8) -> String {
        format!("0000000{n}-aaaa-bbbb-cccc-dddddddddddd")
    }

    fn sandbox(id: &str, uid: &str, annotations: &[(&str, &str)]) -> PodSandbox {
        PodSandbox {
            id: id.into(),
            metadata: Some(PodSandboxMetadata {
                name: format!("p-{id}"),
                uid: uid.into(),
                namespace: "ns".into(),
                attempt: 0,
            }),
            annotations: annotations.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            ..Default::default()
        }
    }

    struct Setup {
        _tmp: tempfile::TempDir,
        root: Arc<CgroupRoot>,
        world: Arc<Mutex<World>>,
        discovery: CriDiscovery<Fake>,
    }

    fn setup() -> Setup {
        setup_with(Duration::from_secs(2), false)
    }

    /// A runtime re-listed every `relist`, with a container event stream if `has_events`.
    fn setup_with(relist: Duration, has_events: bool) -> Setup {
        let tmp = tempfile::tempdir().unwrap();
        let root = Arc::new(CgroupRoot::from_dir(CgroupVersion::V1, tmp.path()).unwrap());
        let world = Arc::new(Mutex::new(World { has_events, ..World::default() }));
        let policy = PolicyConfig { trusted_namespaces: vec!["ns".into()], ..Default::default() };
        let discovery = CriDiscovery::new(Fake(world.clone()), root.clone(), relist).with_policy(Arc::new(policy));
        Setup { _tmp: tmp, root, world, discovery }
    }

    impl Setup {
        /// A READY pod whose cgroup exists (if `mkdir`) at the kubelet's Burstable place.
        fn add(&self, id: &str, uid: &str, annotations: &[(&str, &str)], mkdir: bool) {
            let parent = format!("/kubepods/burstable/pod{uid}");
            if mkdir {
                std::fs::create_dir_all(self.root.path().join(&parent[1..])).unwrap();
            }
            self.world.lock().unwrap().sandboxes.push((sandbox(id, uid, annotations), parent));
        }

        fn remove(&self, id: &str) {
            self.world.lock().unwrap().sandboxes.retain(|(s, _)| s.id != id);
        }

        /// The kubelet removes a pod's cgroup (after its sandbox is gone).
        fn rmdir(&self, uid: &str) {
            std::fs::remove_dir(self.root.path().join(format!("kubepods/burstable/pod{uid}"))).unwrap();
        }

        /// The next event if one comes within `wait` (of virtual time, several re-lists).
        async fn within(&mut self, wait: Duration) -> Option<DiscoveryEvent> {
            tokio::time::timeout(wait, self.discovery.next_event()).await.ok().map(Result::unwrap)
        }

        async fn next(&mut self) -> DiscoveryEvent {
            tokio::time::timeout(Duration::from_secs(30), self.discovery.next_event())
                .await
                .expect("an event within 30 s of virtual time")
                .unwrap()
        }
    }

    fn started_id(ev: &DiscoveryEvent) -> String {
        match ev {
            DiscoveryEvent::Started(info) => info.id.as_str().to_string(),
            other => panic!("expected Started, got {other:?}"),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn pods_appear_and_go_and_policy_annotations_become_labels() {
        let mut s = setup();
        s.add("sb1", &uid(1), &[("ddiskqos.io/weight", "300"), ("other.io/x", "y")], true);
        let list = s.discovery.start().await.unwrap();
        assert_eq!(list.len(), 1);
        let info = &list[0];
        assert_eq!(info.id.as_str(), uid(1));
        assert_eq!(info.name, "ns/p-sb1");
        assert_eq!(info.labels, BTreeMap::from([("ddiskqos.io/weight".to_string(), "300".to_string())]));
        let dir = info.cgroup.as_ref().unwrap().path();
        assert_eq!(dir, s.root.path().join(format!("kubepods/burstable/pod{}", uid(1))));

        s.add("sb2", &uid(2), &[], true);
        assert_eq!(started_id(&s.next().await), uid(2));
        // Its sandbox gone, the pod stays while its cgroup is there; it stops once the kubelet removes that.
        s.remove("sb1");
        assert_eq!(s.within(Duration::from_secs(5)).await, None);
        s.rmdir(&uid(1));
        assert_eq!(s.next().await, DiscoveryEvent::Stopped(ContainerId::new(uid(1))));
        // Known sandboxes are inspected once, however many re-lists see them.
        assert_eq!(s.world.lock().unwrap().inspected["sb2"], 1);
    }

    fn started(ev: DiscoveryEvent) -> ContainerInfo {
        match ev {
            DiscoveryEvent::Started(info) => info,
            other => panic!("expected Started, got {other:?}"),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_sandbox_recreated_on_the_same_cgroup_is_started_again_never_stopped() {
        let mut s = setup();
        s.add("old", &uid(1), &[], true);
        let before = s.discovery.start().await.unwrap().remove(0);
        // Re-created in one re-list.
        s.remove("old");
        s.add("new", &uid(1), &[("ddiskqos.io/weight", "300")], false);
        let info = started(s.next().await);
        assert_eq!((&info.id, &info.cgroup), (&before.id, &before.cgroup));
        assert_eq!(info.labels, BTreeMap::from([("ddiskqos.io/weight".to_string(), "300".to_string())]));
        // Re-created after re-lists that saw no READY sandbox: the pod stayed, and its new annotations come with
        // its new sandbox.
        s.remove("new");
        assert_eq!(s.within(Duration::from_secs(5)).await, None);
        s.add("newer", &uid(1), &[("ddiskqos.io/exclude", "true")], false);
        let info = started(s.next().await);
        assert_eq!(info.cgroup, before.cgroup);
        assert_eq!(info.labels, BTreeMap::from([("ddiskqos.io/exclude".to_string(), "true".to_string())]));
        assert_eq!(s.within(Duration::from_secs(5)).await, None, "nothing else, no Stopped");
    }

    #[tokio::test(start_paused = true)]
    async fn a_sandbox_recreated_on_another_cgroup_is_a_stop_then_a_start() {
        let mut s = setup();
        s.add("old", &uid(1), &[], true);
        assert_eq!(s.discovery.start().await.unwrap().len(), 1);
        s.remove("old");
        let parent = format!("/kubepods/besteffort/pod{}", uid(1));
        std::fs::create_dir_all(s.root.path().join(&parent[1..])).unwrap();
        s.world.lock().unwrap().sandboxes.push((sandbox("new", &uid(1), &[]), parent.clone()));
        assert_eq!(s.next().await, DiscoveryEvent::Stopped(ContainerId::new(uid(1))));
        let info = started(s.next().await);
        assert_eq!(info.cgroup.unwrap().path(), s.root.path().join(&parent[1..]));
    }

    #[tokio::test(start_paused = true)]
    async fn a_pod_whose_cgroup_is_not_there_yet_is_retried_and_a_refused_one_inspected_once() {
        let mut s = setup();
        s.add("early", &uid(1), &[], false);
        // Names another pod's cgroup: refused.
        s.world.lock().unwrap().sandboxes.push((sandbox("evil", &uid(3), &[]), format!("/kubepods/pod{}", uid(1))));
        assert!(s.discovery.start().await.unwrap().is_empty());
        std::fs::create_dir_all(s.root.path().join(format!("kubepods/burstable/pod{}", uid(1)))).unwrap();
        assert_eq!(started_id(&s.next().await), uid(1));
        // More re-lists: the refused sandbox is not asked about again.
        s.add("later", &uid(2), &[], true);
        assert_eq!(started_id(&s.next().await), uid(2));
        let w = s.world.lock().unwrap();
        assert_eq!(w.inspected["evil"], 1, "{:?}", w.inspected);
        assert!(w.inspected["early"] >= 2);
    }

    #[tokio::test(start_paused = true)]
    async fn an_unreachable_runtime_is_lost_then_resynced_in_full() {
        let mut s = setup();
        s.add("a", &uid(1), &[], true);
        s.add("c", &uid(3), &[], true);
        s.add("d", &uid(4), &[], true);
        s.discovery.start().await.unwrap();
        s.world.lock().unwrap().down = true;
        assert!(matches!(s.next().await, DiscoveryEvent::Lost(m) if m.contains("Unavailable")));
        // While down, a pod goes (its cgroup too) and another comes, a third's sandbox is made again with other
        // annotations, and a fourth's sandbox dies (its cgroup stays): when the runtime answers, the full list, with
        // what the new sandbox says.
        s.remove("a");
        s.rmdir(&uid(1));
        s.add("b", &uid(2), &[], true);
        s.remove("c");
        s.add("c2", &uid(3), &[("ddiskqos.io/exclude", "true")], false);
        s.remove("d");
        let t = tokio::time::Instant::now();
        let resync = {
            let world = s.world.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(2500)).await;
                world.lock().unwrap().down = false;
            });
            s.next().await
        };
        match resync {
            DiscoveryEvent::Resync(list) => {
                let ids: Vec<String> = list.iter().map(|i| i.id.as_str().to_string()).collect();
                assert_eq!(ids, vec![uid(2), uid(3), uid(4)]);
                assert_eq!(list[1].labels.get("ddiskqos.io/exclude").map(String::as_str), Some("true"));
            }
            other => panic!("expected Resync, got {other:?}"),
        }
        // Retries after 0.2, 0.6, 1.4 and 3.0 s (backoff doubling from 0.2 s): the fourth finds it back.
        let waited = t.elapsed();
        assert!(waited >= Duration::from_millis(2500) && waited <= Duration::from_millis(3100), "{waited:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_container_event_finds_a_new_pod_long_before_the_relist_interval() {
        let mut s = setup_with(Duration::from_secs(3600), true);
        // The pod's cgroup is there before discovery starts watching, so inotify has nothing to report: only the
        // event can wake discovery before the hour is up (`next` gives up after 30 s).
        std::fs::create_dir_all(s.root.path().join(format!("kubepods/burstable/pod{}", uid(1)))).unwrap();
        assert!(s.discovery.start().await.unwrap().is_empty());
        s.add("sb1", &uid(1), &[], false);
        let t = tokio::time::Instant::now();
        let tx = s.world.lock().unwrap().events.clone().expect("subscribed at start");
        tx.send(EventWake::Changed).await.unwrap();
        assert_eq!(started_id(&s.next().await), uid(1));
        assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
        assert_eq!(s.world.lock().unwrap().subscriptions, 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_runtime_without_events_is_asked_once_and_again_after_it_comes_back() {
        let mut s = setup();
        s.add("a", &uid(1), &[], true);
        s.discovery.start().await.unwrap();
        for (n, id) in [(2, "b"), (3, "c")] {
            s.add(id, &uid(n), &[], true);
            assert_eq!(started_id(&s.next().await), uid(n));
        }
        assert_eq!(s.world.lock().unwrap().subscriptions, 1, "asked again though it said Unimplemented");
        s.world.lock().unwrap().down = true;
        assert!(matches!(s.next().await, DiscoveryEvent::Lost(_)));
        s.world.lock().unwrap().down = false;
        assert!(matches!(s.next().await, DiscoveryEvent::Resync(_)));
        assert_eq!(s.world.lock().unwrap().subscriptions, 2, "not asked again after the runtime came back");
    }

    #[tokio::test(start_paused = true)]
    async fn an_ended_event_stream_is_subscribed_again_after_the_next_list() {
        let mut s = setup_with(Duration::from_secs(2), true);
        s.discovery.start().await.unwrap();
        // The stream ends (the runtime closed it); a pod made meanwhile is found by the periodic re-list, after
        // which discovery subscribes again and the next event is heard.
        drop(s.world.lock().unwrap().events.take());
        std::fs::create_dir_all(s.root.path().join(format!("kubepods/burstable/pod{}", uid(1)))).unwrap();
        s.add("sb1", &uid(1), &[], false);
        assert_eq!(started_id(&s.next().await), uid(1));
        assert_eq!(s.world.lock().unwrap().subscriptions, 2);
        s.add("sb2", &uid(2), &[], false);
        std::fs::create_dir_all(s.root.path().join(format!("kubepods/burstable/pod{}", uid(2)))).unwrap();
        let tx = s.world.lock().unwrap().events.clone().expect("subscribed again");
        tx.send(EventWake::Changed).await.unwrap();
        assert_eq!(started_id(&s.next().await), uid(2));
    }
}
