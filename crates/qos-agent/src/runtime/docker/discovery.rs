//! [`DockerDiscovery`]: containers from dockerd's events and listings.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::pin::Pin;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use bollard::models::{ContainerInspectResponse, ContainerSummaryStateEnum, EventMessage};
use bollard::query_parameters::{EventsOptions, ListContainersOptions};
use bollard::Docker;
use futures_util::{Stream, StreamExt};
use qos_core::ContainerId;
use tracing::{debug, info, warn};

use super::cgroup_watch::{CgroupWatch, Created};
use super::naming::{container_cgroup, CgroupDriver};
use crate::backend::{ContainerInfo, Discovery, DiscoveryError, DiscoveryEvent, Starting};
use crate::cgroup::{CgroupDir, CgroupError, CgroupRoot};
use crate::runtime::support::Backoff;

type EventStream = Pin<Box<dyn Stream<Item = Result<EventMessage, bollard::errors::Error>> + Send>>;

/// Discovers Docker containers.
pub struct DockerDiscovery {
    api: Inspector,
    events: Option<EventStream>,
    backoff: Backoff,
    /// The containers of the last listing and when it was asked for (Unix ns): `since` replays events from
    /// before the listing, and those of listed containers are already reflected in it.
    listed: HashSet<ContainerId>,
    listed_at_ns: i64,
    /// New containers seen by their cgroup's creation, before Docker's `start` event.
    cgroups: CgroupWatch,
    /// When the containers still starting are checked next (systemd driver only).
    recheck_at: Option<tokio::time::Instant>,
    /// Since when each container still starting has been checked.
    checked_since: StartingClock,
}

/// How often, on Docker's systemd driver, the weights of containers announced early and not yet reported started
/// are read again: runc's `SetUnitProperties` (after the scope appeared, before the container's process runs)
/// makes systemd put the scope's files back at the unit's values, and the agent writes them again within this.
const STARTING_RECHECK: std::time::Duration = std::time::Duration::from_millis(20);

/// How long a container announced early is checked every [`STARTING_RECHECK`] at most: one that Docker never
/// reports started (a failed start whose cgroup stays) would otherwise be read every 20 ms for as long as it exists.
/// Under emulation Docker's start event came 6-8 s after the scope; the rounds keep verifying it after this.
const STARTING_CHECKED_FOR: std::time::Duration = std::time::Duration::from_secs(60);

/// When each container still starting was first checked: those checked for longer than a limit are left to the
/// rounds.
#[derive(Debug, Default)]
struct StartingClock(HashMap<ContainerId, tokio::time::Instant>);

impl StartingClock {
    /// Of `starting` (the set now), those first seen less than `limit` before `now`; forgets the others' entries
    /// once they leave the set.
    fn still_checked(
        &mut self,
        starting: Vec<ContainerId>,
        now: tokio::time::Instant,
        limit: std::time::Duration,
    ) -> Vec<ContainerId> {
        self.0.retain(|id, _| starting.contains(id));
        starting.into_iter().filter(|id| now.duration_since(*self.0.entry(id.clone()).or_insert(now)) < limit).collect()
    }
}

/// The `Sync` half of discovery (API client and cgroup layout), so its futures stay `Send` while the event
/// stream (not `Sync`) lives beside it.
#[derive(Clone)]
struct Inspector {
    docker: Docker,
    root: Arc<CgroupRoot>,
    driver: CgroupDriver,
}

impl std::fmt::Debug for DockerDiscovery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DockerDiscovery")
            .field("driver", &self.api.driver)
            .field("connected", &self.events.is_some())
            .finish()
    }
}

impl DockerDiscovery {
    /// Uses `docker` (already connected) and the cgroup root found at start-up.
    pub async fn new(docker: Docker, root: Arc<CgroupRoot>) -> Result<Self, DiscoveryError> {
        let info = docker
            .info()
            .await
            .map_err(|e| DiscoveryError::Runtime { what: "docker info".into(), detail: e.to_string() })?;
        let driver = match info.cgroup_driver.map(|d| d.to_string()).as_deref() {
            Some("systemd") => CgroupDriver::Systemd,
            _ => CgroupDriver::Cgroupfs,
        };
        info!(?driver, version = info.server_version.as_deref().unwrap_or("?"), "connected to dockerd");
        let data_root = info.docker_root_dir.as_ref().map(std::path::PathBuf::from);
        let cgroups = CgroupWatch::start(root.clone(), driver, data_root).unwrap_or_else(|e| {
            warn!(error = %e, "cannot watch for new container cgroups; new containers are seen by Docker's start \
                               event only (after their process started)");
            CgroupWatch::off(root.clone(), driver)
        });
        Ok(Self {
            cgroups,
            api: Inspector { docker, root, driver },
            events: None,
            backoff: Backoff::new(),
            listed: HashSet::new(),
            listed_at_ns: 0,
            recheck_at: None,
            checked_since: StartingClock::default(),
        })
    }

    /// The containers announced at their cgroup's creation whose start Docker has not confirmed yet: the writer
    /// does not send those a `docker update`, which would wait for the start to complete.
    pub fn starting(&self) -> Starting {
        self.cgroups.starting()
    }

    fn subscribe(&mut self) {
        // `since` makes dockerd replay events from just before the list, so nothing between the two is missed;
        // replayed events of containers the list already shows are dropped in `next_event`.
        let since = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs()).saturating_sub(1);
        let filters: HashMap<String, Vec<String>> = HashMap::from([
            ("type".into(), vec!["container".into()]),
            ("event".into(), ["create", "start", "die", "destroy", "update"].map(String::from).to_vec()),
        ]);
        let opts = EventsOptions { since: Some(since.to_string()), until: None, filters: Some(filters) };
        self.events = Some(Box::pin(self.api.docker.events(Some(opts))));
    }

    async fn reconnect(&mut self) -> DiscoveryEvent {
        loop {
            // A new container cgroup means dockerd is back (it makes them): ask at once rather than after the rest
            // of a backoff that may have grown to seconds while it restarted.
            tokio::select! {
                () = self.backoff.wait() => {}
                () = self.cgroups.changed() => debug!("a container cgroup appeared; trying dockerd now"),
            }
            if let Err(e) = self.api.docker.ping().await {
                debug!(error = %e, retry_in = ?self.backoff.next(), "docker still unreachable");
                continue;
            }
            self.subscribe();
            match self.list().await {
                Ok(list) => {
                    self.backoff.reset();
                    return DiscoveryEvent::Resync(list);
                }
                Err(e) => {
                    debug!(error = %e, "still cannot list containers");
                    self.events = None;
                }
            }
        }
    }

    /// Lists the running containers, remembering which and when for [`DockerDiscovery::is_replayed`].
    async fn list(&mut self) -> Result<Vec<ContainerInfo>, DiscoveryError> {
        self.listed_at_ns = unix_ns();
        // Every running container the listing saw, also those it refused (a moved process): a replayed start of
        // one of them must not bring it in through the event path.
        let listing = self.api.list().await?;
        self.cgroups.listed_running(&listing.running);
        self.listed = listing.running;
        for (id, created) in listing.created {
            self.cgroups.created(id, created);
        }
        for info in &listing.managed {
            if let Some(parent) = info.cgroup.as_ref().and_then(|c| c.path().parent()) {
                self.cgroups.watch_parent(parent);
            }
        }
        // Containers started between the listing and now whose cgroups the listing already showed.
        self.cgroups.scan();
        Ok(listing.managed)
    }

    /// Whether an event is one `since` replayed from before the last listing, about a container the listing
    /// already showed running: its effect is already known. Handling it again used to reset such a container
    /// to the top as if it had just started (a replayed `start`) and cost an inspect call per container started
    /// in the second or two before the agent (re)connected.
    fn is_replayed(&mut self, msg: &EventMessage, id: &str) -> bool {
        match msg.time_nano {
            Some(t) if t < self.listed_at_ns => self.listed.contains(&ContainerId::from(id.to_string())),
            _ => {
                self.listed.clear(); // events come in order: no more replays until the next listing
                false
            }
        }
    }
}

fn unix_ns() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

impl Inspector {
    /// Builds the container's info from a start event alone, if its cgroup is at the driver's default place.
    fn info_from_event(&self, id: &str, mut attributes: HashMap<String, String>) -> Option<ContainerInfo> {
        let cgroup = container_cgroup(&self.root, id, self.driver, None).ok()?;
        // Its processes must be there: an empty cgroup (they moved away, or exited) takes the inspect path, which
        // cross-checks the container's process and refuses a moved one.
        let procs = std::fs::read(cgroup.path().join("cgroup.procs")).ok()?;
        if procs.iter().all(u8::is_ascii_whitespace) {
            return None;
        }
        let name = attributes.remove("name").unwrap_or_default();
        // Event attributes are the container's labels plus `image` and `name` (and `exitCode` on die).
        attributes.remove("image");
        Some(ContainerInfo {
            id: ContainerId::from(id.to_string()),
            name,
            labels: attributes.into_iter().collect(),
            cgroup: Some(cgroup),
        })
    }

    /// The running containers the agent may manage, the ids of every running container listed, and the name and
    /// labels of those created and not yet started (for [`CgroupWatch`]).
    async fn list(&self) -> Result<Listing, DiscoveryError> {
        let list = self
            .docker
            .list_containers(Some(ListContainersOptions { all: true, ..Default::default() }))
            .await
            .map_err(|e| DiscoveryError::Runtime { what: "list containers".into(), detail: e.to_string() })?;
        let mut out = Listing::default();
        for c in list {
            let Some(id) = c.id else { continue };
            match c.state {
                Some(ContainerSummaryStateEnum::RUNNING) => {
                    out.running.insert(ContainerId::from(id.clone()));
                    if let Some(info) = self.inspect(&id).await {
                        out.managed.push(info);
                    }
                }
                Some(ContainerSummaryStateEnum::CREATED) => {
                    let name = c.names.and_then(|n| n.into_iter().next()).unwrap_or_default();
                    let labels = c.labels.unwrap_or_default().into_iter().collect();
                    let created = Created { name: name.trim_start_matches('/').to_string(), labels };
                    out.created.push((ContainerId::from(id), created));
                }
                _ => {}
            }
        }
        Ok(out)
    }

    /// One API call per container when it appears (never per round). `None` for a container that is already gone
    /// (removed, exited, or its cgroup removed): under churn many exit before they are inspected, and their `die`
    /// event follows, so this is not worth a warning.
    async fn inspect(&self, id: &str) -> Option<ContainerInfo> {
        match self.docker.inspect_container(id, None).await {
            Ok(resp) if resp.state.as_ref().and_then(|s| s.running) != Some(true) => {
                debug!(container = id, "container no longer running when inspected; ignoring it");
                None
            }
            Ok(resp) => self.to_info(resp),
            Err(e) => {
                debug!(container = id, error = %e, "inspect failed (container gone?)");
                None
            }
        }
    }

    fn to_info(&self, resp: ContainerInspectResponse) -> Option<ContainerInfo> {
        let id = ContainerId::from(resp.id.unwrap_or_default());
        let name = resp.name.unwrap_or_default().trim_start_matches('/').to_string();
        let labels: BTreeMap<String, String> =
            resp.config.and_then(|c| c.labels).unwrap_or_default().into_iter().collect();
        let pid = resp.state.and_then(|s| s.pid).filter(|p| *p > 0).and_then(|p| u32::try_from(p).ok());
        let parent = resp.host_config.and_then(|h| h.cgroup_parent).filter(|p| !p.is_empty());
        let documented = container_cgroup(&self.root, id.as_str(), self.driver, parent.as_deref());
        let by_pid = pid.map(|p| self.root.resolve_pid(p));
        let cgroup = match identify(&self.root, documented, by_pid) {
            Identity::Managed(dir) => Some(dir),
            Identity::Gone(why) => {
                debug!(container = %id.short(), name = %name, reason = %why, "container gone while being inspected; ignoring it");
                return None;
            }
            Identity::Refused { documented, reported } => {
                warn!(container = %id.short(), name = %name, documented = %documented.display(),
                      reported = %reported.display(),
                      "the container's process reports a cgroup outside the one Docker made for it: not managing \
                       this container (a process that moved itself must not steer the agent to another cgroup)");
                return None;
            }
            Identity::Unknown(e) => {
                warn!(container = %id.short(), name = %name, error = %e,
                      "cannot find the container's cgroup where Docker puts it; its counters come from the Docker \
                       API and its weight is not managed");
                None
            }
        };
        Some(ContainerInfo { id, name, labels, cgroup })
    }
}

impl Discovery for DockerDiscovery {
    async fn start(&mut self) -> Result<Vec<ContainerInfo>, DiscoveryError> {
        self.subscribe();
        self.list().await
    }

    async fn next_event(&mut self) -> Result<DiscoveryEvent, DiscoveryError> {
        loop {
            if let Some(ev) = self.cgroups.next_ready() {
                return Ok(ev);
            }
            let Some(events) = self.events.as_mut() else {
                return Ok(self.reconnect().await);
            };
            // On the systemd driver, containers announced early are checked every STARTING_RECHECK until Docker
            // reports them started: runc's own SetUnitProperties makes systemd put their files back.
            let starting = match self.api.driver {
                CgroupDriver::Systemd => self.cgroups.starting().ids(),
                CgroupDriver::Cgroupfs => Vec::new(),
            };
            let starting =
                self.checked_since.still_checked(starting, tokio::time::Instant::now(), STARTING_CHECKED_FOR);
            if starting.is_empty() {
                self.recheck_at = None;
            }
            let recheck_at = *self.recheck_at.get_or_insert_with(|| tokio::time::Instant::now() + STARTING_RECHECK);
            // All three are cancel-safe: a message or a wake-up not taken now is there next time.
            let next = tokio::select! {
                biased;
                () = self.cgroups.changed() => None,
                next = events.next() => Some(next),
                () = tokio::time::sleep_until(recheck_at), if !starting.is_empty() => {
                    self.recheck_at = None;
                    return Ok(DiscoveryEvent::StillStarting(starting));
                }
            };
            let Some(next) = next else {
                self.cgroups.scan();
                continue;
            };
            let msg = match next {
                Some(Ok(msg)) => msg,
                Some(Err(e)) => {
                    self.events = None;
                    return Ok(DiscoveryEvent::Lost(format!("docker event stream: {e}")));
                }
                None => {
                    self.events = None;
                    return Ok(DiscoveryEvent::Lost("docker event stream ended".into()));
                }
            };
            let Some(id) = msg.actor.as_ref().and_then(|a| a.id.clone()) else { continue };
            if self.is_replayed(&msg, &id) {
                debug!(container = %id, action = ?msg.action, "replayed event of a listed container; already known");
                continue;
            }
            let cid = ContainerId::from(id.clone());
            match msg.action.as_deref() {
                Some("create") => {
                    let mut attributes = msg.actor.and_then(|a| a.attributes).unwrap_or_default();
                    let name = attributes.remove("name").unwrap_or_default();
                    attributes.remove("image");
                    self.cgroups.created(cid, Created { name, labels: attributes.into_iter().collect() });
                    // Its cgroup may be there already (the event came late).
                    self.cgroups.scan();
                }
                Some("start") => {
                    if self.cgroups.confirm_started(&cid) {
                        debug!(container = %cid.short(), "start event of a container already seen by its cgroup");
                        if self.api.driver == CgroupDriver::Systemd {
                            // Its weight went into the scope's files while runc set the scope up through
                            // systemd; now it goes into the unit's properties too (see cgroup_watch.rs).
                            return Ok(DiscoveryEvent::Settled(cid));
                        }
                        continue;
                    }
                    // Fast path for the < 100 ms promise: the event carries name and labels, and the cgroup sits
                    // where the daemon's driver puts it; only an unusual layout costs an inspect call.
                    let attributes = msg.actor.and_then(|a| a.attributes).unwrap_or_default();
                    if let Some(info) = self.api.info_from_event(&id, attributes) {
                        return Ok(DiscoveryEvent::Started(info));
                    }
                    if let Some(info) = self.api.inspect(&id).await {
                        // Its parent is watched from now on: the next container there is seen at its creation.
                        if let Some(parent) = info.cgroup.as_ref().and_then(|c| c.path().parent()) {
                            self.cgroups.watch_parent(parent);
                        }
                        return Ok(DiscoveryEvent::Started(info));
                    }
                }
                // A container that died still exists, and its configuration with it (a weight `docker update` put
                // there included); one destroyed does not.
                Some("die") => {
                    self.cgroups.died(&cid);
                    return Ok(DiscoveryEvent::Stopped(cid));
                }
                Some("destroy") => {
                    self.cgroups.destroyed(&cid);
                    return Ok(DiscoveryEvent::Removed(cid));
                }
                Some("update") => return Ok(DiscoveryEvent::Updated(cid)),
                _ => {}
            }
        }
    }
}

/// What a listing found.
#[derive(Debug, Default)]
struct Listing {
    /// The running containers the agent may manage.
    managed: Vec<ContainerInfo>,
    /// Every running container listed (also those refused).
    running: HashSet<ContainerId>,
    /// Containers created and not started: name and labels.
    created: Vec<(ContainerId, Created)>,
}

/// Where a container's cgroup is, decided from the runtime's own naming (the documented path), with the
/// container's `/proc/<pid>/cgroup` only as a cross-check: a container's processes can move themselves (one that
/// has the host's cgroup tree mounted can write any `cgroup.procs`), Docker's naming they cannot change.
#[derive(Debug)]
enum Identity {
    /// The documented cgroup; the process is in it or below it.
    Managed(CgroupDir),
    /// The container exited meanwhile (its cgroup or process vanished, or its process reads as the root: a
    /// zombie on v1). Not worth a warning: its `die` event follows.
    Gone(String),
    /// The process reports a cgroup outside the documented one.
    Refused {
        /// Where Docker put the container.
        documented: std::path::PathBuf,
        /// Where its process says it is.
        reported: std::path::PathBuf,
    },
    /// The documented path cannot be used (an unknown layout, a bad parent name).
    Unknown(CgroupError),
}

fn identify(
    root: &CgroupRoot,
    documented: Result<CgroupDir, CgroupError>,
    by_pid: Option<Result<CgroupDir, CgroupError>>,
) -> Identity {
    match (documented, by_pid) {
        (_, Some(Ok(dir))) if dir.path() == root.path() => {
            Identity::Gone("its process reads as the root cgroup".into())
        }
        (_, Some(Err(e))) if e.is_vanished() => Identity::Gone(e.to_string()),
        (Err(e), _) if e.is_vanished() => Identity::Gone(e.to_string()),
        (Ok(doc), Some(Ok(dir))) if !dir.path().starts_with(doc.path()) => {
            Identity::Refused { documented: doc.path().to_owned(), reported: dir.path().to_owned() }
        }
        (Ok(doc), _) => Identity::Managed(doc),
        (Err(e), _) => Identity::Unknown(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_container_still_starting_is_checked_for_a_bounded_time_then_forgotten() {
        let mut clock = StartingClock::default();
        let limit = std::time::Duration::from_secs(60);
        let t0 = tokio::time::Instant::now();
        let (a, b) = (ContainerId::new("a"), ContainerId::new("b"));
        assert_eq!(clock.still_checked(vec![a.clone()], t0, limit), vec![a.clone()]);
        let t30 = t0 + std::time::Duration::from_secs(30);
        assert_eq!(clock.still_checked(vec![a.clone(), b.clone()], t30, limit), vec![a.clone(), b.clone()]);
        // a's minute is up; b (first seen at 30 s) is still checked.
        let t61 = t0 + std::time::Duration::from_secs(61);
        assert_eq!(clock.still_checked(vec![a.clone(), b.clone()], t61, limit), vec![b.clone()]);
        // A container that left the set is forgotten: announced again, its minute starts again.
        assert!(clock.still_checked(vec![b.clone()], t61, limit).contains(&b));
        assert_eq!(clock.still_checked(vec![a.clone()], t61, limit), vec![a]);
    }
    use crate::cgroup::CgroupVersion;

    const ID: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    fn tree() -> (tempfile::TempDir, CgroupRoot) {
        let tmp = tempfile::tempdir().unwrap();
        for d in [format!("docker/{ID}/sub"), "victim".into()] {
            std::fs::create_dir_all(tmp.path().join(d)).unwrap();
        }
        let root = CgroupRoot::from_dir(CgroupVersion::V1, tmp.path()).unwrap();
        (tmp, root)
    }

    #[test]
    fn the_documented_cgroup_wins_and_a_moved_process_is_refused() {
        let (_tmp, root) = tree();
        let doc = || container_cgroup(&root, ID, CgroupDriver::Cgroupfs, None);
        let at = |rel: &str| Some(root.resolve_relative(rel));
        let own = format!("docker/{ID}");
        match identify(&root, doc(), at(&own)) {
            Identity::Managed(dir) => assert_eq!(dir.path(), root.path().join(&own)),
            other => panic!("{other:?}"),
        }
        // A process in a sub-cgroup of its own container: still that container, managed at the documented path.
        match identify(&root, doc(), at(&format!("{own}/sub"))) {
            Identity::Managed(dir) => assert_eq!(dir.path(), root.path().join(&own)),
            other => panic!("{other:?}"),
        }
        // The attack: the container's init moved itself into another cgroup.
        match identify(&root, doc(), at("victim")) {
            Identity::Refused { reported, .. } => assert_eq!(reported, root.path().join("victim")),
            other => panic!("{other:?}"),
        }
        // No pid (or no answer): the documented path alone.
        assert!(matches!(identify(&root, doc(), None), Identity::Managed(_)));
        // A zombie reads as the root; a vanished process or cgroup is gone, not an error.
        assert!(matches!(identify(&root, doc(), at("")), Identity::Gone(_)));
        let other = "f".repeat(64);
        let missing = container_cgroup(&root, &other, CgroupDriver::Cgroupfs, None);
        assert!(matches!(identify(&root, missing, None), Identity::Gone(_)));
        let bad_parent = container_cgroup(&root, ID, CgroupDriver::Systemd, Some("not-a-slice"));
        assert!(matches!(identify(&root, bad_parent, at("victim")), Identity::Unknown(_)));
    }
}
