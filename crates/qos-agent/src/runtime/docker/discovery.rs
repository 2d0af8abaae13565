//! [`DockerDiscovery`]: containers from dockerd's events and listings.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bollard::models::{ContainerInspectResponse, EventMessage};
use bollard::query_parameters::{EventsOptions, ListContainersOptions};
use bollard::Docker;
use futures_util::{Stream, StreamExt};
use qos_core::ContainerId;
use tracing::{debug, info, warn};

use super::naming::{container_cgroup, CgroupDriver};
use crate::backend::{ContainerInfo, Discovery, DiscoveryError, DiscoveryEvent};
use crate::cgroup::CgroupRoot;

type EventStream = Pin<Box<dyn Stream<Item = Result<EventMessage, bollard::errors::Error>> + Send>>;

/// Discovers Docker containers.
pub struct DockerDiscovery {
    api: Inspector,
    events: Option<EventStream>,
    backoff: Duration,
    /// The containers of the last listing and when it was asked for (Unix ns): `since` replays events from
    /// before the listing, and those of listed containers are already reflected in it.
    listed: HashSet<ContainerId>,
    listed_at_ns: i64,
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

const BACKOFF_MIN: Duration = Duration::from_millis(200);
const BACKOFF_MAX: Duration = Duration::from_secs(5);

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
        Ok(Self {
            api: Inspector { docker, root, driver },
            events: None,
            backoff: BACKOFF_MIN,
            listed: HashSet::new(),
            listed_at_ns: 0,
        })
    }

    fn subscribe(&mut self) {
        // `since` makes dockerd replay events from just before the list, so nothing between the two is missed;
        // replayed events of containers the list already shows are dropped in `next_event`.
        let since = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs()).saturating_sub(1);
        let filters: HashMap<String, Vec<String>> = HashMap::from([
            ("type".into(), vec!["container".into()]),
            ("event".into(), ["start", "die", "destroy", "update"].map(String::from).to_vec()),
        ]);
        let opts = EventsOptions { since: Some(since.to_string()), until: None, filters: Some(filters) };
        self.events = Some(Box::pin(self.api.docker.events(Some(opts))));
    }

    async fn reconnect(&mut self) -> DiscoveryEvent {
        loop {
            tokio::time::sleep(self.backoff).await;
            self.backoff = (self.backoff * 2).min(BACKOFF_MAX);
            if let Err(e) = self.api.docker.ping().await {
                debug!(error = %e, retry_in = ?self.backoff, "docker still unreachable");
                continue;
            }
            self.subscribe();
            match self.list().await {
                Ok(list) => {
                    self.backoff = BACKOFF_MIN;
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
        let list = self.api.list().await?;
        self.listed = list.iter().map(|c| c.id.clone()).collect();
        Ok(list)
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

    async fn list(&self) -> Result<Vec<ContainerInfo>, DiscoveryError> {
        let list = self
            .docker
            .list_containers(Some(ListContainersOptions { all: false, ..Default::default() }))
            .await
            .map_err(|e| DiscoveryError::Runtime { what: "list containers".into(), detail: e.to_string() })?;
        let mut out = Vec::with_capacity(list.len());
        for c in list {
            let Some(id) = c.id else { continue };
            if let Some(info) = self.inspect(&id).await {
                out.push(info);
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
        let by_pid = pid.map(|p| self.root.resolve_pid(p));
        let cgroup = match by_pid {
            // On cgroup v1 an exited, not yet reaped process (a zombie) reads as being in the hierarchy's root
            // cgroup: that is not the container's cgroup (whose counters would then be the whole machine's).
            Some(Ok(dir)) if dir.path() == self.root.path() => {
                debug!(container = %id.short(), "container's process has exited (its cgroup reads as the root); ignoring it");
                return None;
            }
            Some(Ok(dir)) => Some(dir),
            Some(Err(e)) if e.is_vanished() => {
                debug!(container = %id.short(), error = %e, "container exited while being inspected; ignoring it");
                return None;
            }
            other => {
                if let Some(Err(e)) = other {
                    debug!(container = %id.short(), error = %e, "cgroup from pid failed; trying the driver's layout");
                }
                match container_cgroup(&self.root, id.as_str(), self.driver, parent.as_deref()) {
                    Ok(dir) => Some(dir),
                    Err(e) => {
                        warn!(container = %id.short(), name = %name, error = %e, "cannot find the container's cgroup");
                        None
                    }
                }
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
            let Some(events) = self.events.as_mut() else {
                return Ok(self.reconnect().await);
            };
            let msg = match events.next().await {
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
            match msg.action.as_deref() {
                Some("start") => {
                    // Fast path for the < 100 ms promise: the event carries name and labels, and the cgroup sits
                    // where the daemon's driver puts it; only an unusual layout costs an inspect call.
                    let attributes = msg.actor.and_then(|a| a.attributes).unwrap_or_default();
                    if let Some(info) = self.api.info_from_event(&id, attributes) {
                        return Ok(DiscoveryEvent::Started(info));
                    }
                    if let Some(info) = self.api.inspect(&id).await {
                        return Ok(DiscoveryEvent::Started(info));
                    }
                }
                Some("die") | Some("destroy") => return Ok(DiscoveryEvent::Stopped(ContainerId::from(id))),
                Some("update") => return Ok(DiscoveryEvent::Updated(ContainerId::from(id))),
                _ => {}
            }
        }
    }
}
