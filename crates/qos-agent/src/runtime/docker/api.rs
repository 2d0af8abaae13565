//! [`DockerApiWriter`]: weights through `docker update --blkio-weight` (actuator `docker`), always verified in the
//! files.
//!
//! Only `docker` asks Docker; `auto` never does: `docker update` persists the weight in the container's
//! `hostconfig.json`, so after an agent crash or removal a restarted container would come back at the agent's last
//! demotion (10), and a new agent would take that for the container's own weight. The agent's weights are
//! transient; the files hold them for the cgroup's life and no longer. (On a systemd host the units' weights go
//! through systemd's runtime properties, see [`crate::systemd::UnitWriter`], which do not persist either.)
//!
//! `docker` is for an operator who wants Docker's own view to show the weight, and accepts that persistence: every
//! restore writes the original back through Docker too, that of a container that stopped included. A container
//! stops with the agent's weight in its configuration, and would start again with it (and a later agent read it as
//! its original): so when one the agent may have changed stops (Docker's `die`), its original goes back into its
//! configuration ([`DockerApiWriter::restore_exited`]; `docker update` works on a stopped container) before it is
//! forgotten from the state file; one Docker no longer knows (removed) has nothing left to restore; a failed restore
//! keeps the original on file and is tried again every round (the reconciler's rules,
//! [`crate::daemon::reconcile`]), and an agent that starts puts back the originals on file of containers not
//! running. A stopped container's cgroup files are gone, so that restore is verified in what Docker keeps and
//! applies at the next start, `HostConfig.BlkioWeight` of `docker inspect`.
//!
//! Docker cannot unset a weight: `BlkioWeight` 0 in `docker update` means "leave it as it is" (moby's
//! `Container.UpdateContainer`, `daemon/container/container_unix.go`, copies the weight only `if
//! resources.BlkioWeight != 0`, and `toContainerdResources`, `daemon/update_linux.go`, sends a running container
//! none either). A container created without `--blkio-weight` (`BlkioWeight` 0: the kernel's default applies) that
//! the agent changed through Docker therefore gets its original back as an explicit weight, the number the agent
//! read from its files, i.e. the kernel's default (100 under BFQ, `blkio.weight`'s own on v1): the weight in force is
//! the one it had, but `docker inspect` shows it set, runc writes it at every start, and
//! [`super::cgroup_watch`] takes it for the container's own (so its next start is announced at Docker's `start`
//! event, not at its cgroup's creation). Only a configuration still without a weight, the agent's weights never
//! having gone through Docker (all written while the container was starting, see below), is left so: a running
//! container's restore puts the files back as first read ([`DockerApiWriter::restore`]); a stopped one's writes
//! nothing, its files gone with its cgroup and its configuration holding nothing of the agent's
//! ([`DockerApiWriter::restore_exited`]).
//!
//! On cgroup v2 Docker 20.10 writes `io.bfq.weight`
//! (`default N`) and never `io.weight`, so its weight reaches BFQ devices only; the check after `docker update` is
//! the file writer's per-device one, and a weight not in force is an error. A container seen at its cgroup's
//! creation is still starting, and dockerd answers a `docker update` for it only once the start completed (it holds
//! the container's lock meanwhile), so such a container's files are written directly (the agent's writer,
//! [`crate::writer::AgentWriter`], sees to that with discovery's [`crate::backend::Starting`]); its later weights
//! go through Docker.

use bollard::models::ContainerUpdateBody;
use bollard::Docker;
use qos_core::{ContainerId, Weight};

use crate::backend::{AppliedVia, BackendError, ContainerInfo};
use crate::cgroup::{CgroupError, V2_IO_WEIGHT};
use crate::files::FileWriter;

/// The call that sets a container's weight, as errors name it.
const UPDATE: &str = "docker update --blkio-weight";

/// Applies weights through `docker update --blkio-weight`; every write is verified by reading the cgroup files
/// back through the agent's one [`FileWriter`], which the caller lends.
pub struct DockerApiWriter {
    docker: Docker,
}

impl std::fmt::Debug for DockerApiWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DockerApiWriter").finish_non_exhaustive()
    }
}

impl DockerApiWriter {
    /// A writer asking `docker`.
    pub fn new(docker: Docker) -> Self {
        Self { docker }
    }

    /// Sets `weight` (a restore: the original) through Docker and verifies it in the files through `files`.
    pub async fn write(
        &mut self,
        info: &ContainerInfo,
        weight: Weight,
        files: &mut FileWriter,
    ) -> Result<AppliedVia, BackendError> {
        if weight.get() < 10 {
            return Err(BackendError::Runtime {
                id: info.id.clone(),
                what: UPDATE,
                detail: format!("Docker accepts weights 10..=1000 only, not {weight}"),
            });
        }
        self.update(&info.id, weight.to_docker()).await?;
        // Trust only the kernel's files: Docker 20.10 answers success and discards the weight on BFQ-only v1
        // kernels, and on v2 writes only io.bfq.weight, which does not act on io.cost devices.
        if let Err(e) = files.verify_weight(info, weight) {
            if e.is_vanished() {
                return Err(e);
            }
            let why = match &e {
                BackendError::Cgroup(CgroupError::DeviceMismatch { path, .. }) if path.ends_with(V2_IO_WEIGHT) => {
                    "Docker's --blkio-weight writes io.bfq.weight only, which does not act on a device under io.cost"
                }
                BackendError::Cgroup(CgroupError::DeviceMismatch { what, .. }) if what.contains("override") => {
                    "Docker's --blkio-weight sets only the default of io.bfq.weight, and a per-device override \
                     (e.g. from --blkio-weight-device) wins over it"
                }
                _ => "Docker discards --blkio-weight on kernels without blkio.weight (e.g. BFQ-only cgroup v1)",
            };
            return Err(BackendError::Runtime {
                id: info.id.clone(),
                what: UPDATE,
                detail: format!(
                    "dockerd answered success but the weight is not in force ({why}; actuator \"auto\" writes the \
                     files): {e}"
                ),
            });
        }
        Ok(AppliedVia::DockerApi)
    }

    /// Puts the original weight of a running container back. A configuration still without a weight (`BlkioWeight`
    /// 0: the agent's weights were all written into the files while the container started) is left without one,
    /// and the files are put back as first read ([`FileWriter::restore_weight`]): `docker update --blkio-weight
    /// 100` would make the kernel's default an explicit setting Docker can never unset (see the module doc).
    /// Otherwise `original` goes through Docker, like any weight ([`Self::write`]).
    pub async fn restore(
        &mut self,
        info: &ContainerInfo,
        original: Weight,
        files: &mut FileWriter,
    ) -> Result<AppliedVia, BackendError> {
        let found = self.inspect(&info.id, "docker inspect (HostConfig.BlkioWeight)").await?;
        if configured_weight(&found).is_none() {
            tracing::debug!(container = %info.id.short(), name = %info.name, original = original.get(),
                "the container's configuration holds no weight: restoring its files only, leaving it unset");
            return files.restore_weight(info, original);
        }
        self.write(info, original, files).await
    }

    /// Puts `original` back into the configuration of container `id`, which stopped, and verifies it there: its
    /// cgroup files are gone, so what is read back is `HostConfig.BlkioWeight` of `docker inspect`, the weight
    /// dockerd gives the container when it starts again. A container Docker no longer knows, or is removing (`--rm`,
    /// `docker rm -f`: its configuration goes with it, and dockerd refuses to update it with an error that is no
    /// 404), is [`BackendError::NoContainer`]. Docker holds weights 10..=1000: an original below 10 (BFQ's 1..=9,
    /// written into the files by someone else) goes back as 10, the nearest it holds, and is said so. A
    /// configuration without a weight (`BlkioWeight` 0) holds nothing of the agent's: nothing is written (0 is
    /// Docker's "unchanged", and any other value would set a weight the container never had), and the container
    /// starts again at the kernel's default, where the original was read. (Where dockerd discards weights, a
    /// kernel without `blkio.weight`, every configuration stays without one, and the update's check failed every
    /// round.)
    pub async fn restore_exited(&mut self, id: &ContainerId, original: Weight) -> Result<AppliedVia, BackendError> {
        let found = self.inspect(id, "docker inspect").await?;
        if let Some(why) = removing(&found) {
            return Err(BackendError::NoContainer { id: id.clone(), detail: why });
        }
        let name = found.name.as_deref().unwrap_or_default().trim_start_matches('/');
        if configured_weight(&found).is_none() {
            tracing::debug!(container = %id.short(), name, original = original.get(),
                "the stopped container's configuration holds no weight: nothing of the agent's to put back");
            return Ok(AppliedVia::DockerApi);
        }
        let kept = original.to_docker();
        if u32::from(kept) != original.get() {
            tracing::warn!(container = %id.short(), name, original = original.get(), kept,
                           "original below Docker's least weight; the container's configuration gets the least");
        }
        self.update(id, kept).await?;
        let what = "docker inspect (HostConfig.BlkioWeight)";
        let have = self.inspect(id, what).await?.host_config.and_then(|h| h.blkio_weight);
        if have != Some(kept) {
            return Err(BackendError::Runtime {
                id: id.clone(),
                what,
                detail: format!(
                    "dockerd answered docker update --blkio-weight {kept} with success but the container's \
                     configuration holds {}",
                    have.map_or_else(|| "no weight".to_string(), |w| w.to_string())
                ),
            });
        }
        Ok(AppliedVia::DockerApi)
    }

    /// `docker update --blkio-weight` with Docker's value (10..=1000), nothing verified.
    async fn update(&self, id: &ContainerId, blkio_weight: u16) -> Result<(), BackendError> {
        let body = ContainerUpdateBody { blkio_weight: Some(blkio_weight), ..Default::default() };
        self.docker.update_container(id.as_str(), body).await.map_err(|e| api_error(id, UPDATE, e))
    }

    /// `docker inspect` of container `id`; `what` names the call in an error.
    async fn inspect(
        &self,
        id: &ContainerId,
        what: &'static str,
    ) -> Result<bollard::models::ContainerInspectResponse, BackendError> {
        self.docker.inspect_container(id.as_str(), None).await.map_err(|e| api_error(id, what, e))
    }
}

/// The block-I/O weight the container's configuration sets (`HostConfig.BlkioWeight`), `None` when it sets none
/// (0 or absent: the kernel's default applies).
fn configured_weight(found: &bollard::models::ContainerInspectResponse) -> Option<u16> {
    found.host_config.as_ref().and_then(|h| h.blkio_weight).filter(|&w| w != 0)
}

/// Why a container's configuration is going away with it (`docker inspect` of a stopped container), if it is.
fn removing(found: &bollard::models::ContainerInspectResponse) -> Option<String> {
    use bollard::models::ContainerStateStatusEnum as Status;
    let status = found.state.as_ref().and_then(|s| s.status);
    if let Some(status @ (Status::REMOVING | Status::DEAD)) = status {
        return Some(format!("docker inspect: the container is {status}"));
    }
    found
        .host_config
        .as_ref()
        .and_then(|h| h.auto_remove)
        .unwrap_or(false)
        .then(|| "docker inspect: the container was run with --rm and is removed once it stops".to_string())
}

/// A failed call about container `id`: one Docker does not know (404) is [`BackendError::NoContainer`].
fn api_error(id: &ContainerId, what: &'static str, e: bollard::errors::Error) -> BackendError {
    match e {
        bollard::errors::Error::DockerResponseServerError { status_code: 404, message } => {
            BackendError::NoContainer { id: id.clone(), detail: format!("{what}: {message}") }
        }
        e => BackendError::Runtime { id: id.clone(), what, detail: e.to_string() },
    }
}

#[cfg(test)]
mod tests {
    use qos_core::ContainerId;

    use super::*;
    use crate::backend::{Starting, WeightWriter};
    use crate::cgroup::{CgroupRoot, CgroupVersion};
    use crate::config::ActuatorMode;
    use crate::runtime::docker::api_writer;
    use crate::writer::{AgentWriter, Way};

    /// The agent's writer as assembled for `mode` on a host that is not a systemd host (`agent::with_writer`).
    fn agent_writer(docker: &Docker, mode: ActuatorMode, starting: &Starting) -> AgentWriter {
        let way = api_writer(docker, mode).map_or(Way::Files, Way::DockerApi);
        AgentWriter::new(FileWriter::default(), way).with_starting(starting.clone())
    }

    fn w(n: u64) -> Weight {
        Weight::new(n).unwrap()
    }

    /// What `docker inspect` answers for a stopped container in `status`, run with `--rm` or not.
    fn inspected(status: &str, auto_remove: bool) -> bollard::models::ContainerInspectResponse {
        serde_json::from_value(serde_json::json!({
            "State": {"Status": status},
            "HostConfig": {"AutoRemove": auto_remove, "BlkioWeight": 10}
        }))
        .unwrap()
    }

    /// Review finding of 2026-11-29: a `--rm` or `docker rm -f` container's restore hit dockerd while it removed
    /// the container, which refuses with an error that is no 404, and was tried every round until `destroy`.
    #[test]
    fn a_container_being_removed_has_no_configuration_to_restore() {
        assert_eq!(removing(&inspected("exited", false)), None);
        assert_eq!(removing(&inspected("created", false)), None);
        for status in ["removing", "dead"] {
            let why = removing(&inspected(status, false)).expect(status);
            assert!(why.contains(status), "{why}");
        }
        assert!(removing(&inspected("exited", true)).expect("--rm").contains("--rm"));
    }

    /// A dockerd that fails every call (it accepts the connection and closes it), and how often it was asked.
    fn failing_dockerd(dir: &std::path::Path) -> (Docker, impl Fn() -> usize) {
        let sock = dir.join("failing-dockerd.sock");
        let listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        let asked = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counter = asked.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                drop(conn);
            }
        });
        let docker = Docker::connect_with_unix(sock.to_str().unwrap(), 2, bollard::API_DEFAULT_VERSION).unwrap();
        (docker, move || asked.load(std::sync::atomic::Ordering::SeqCst))
    }

    /// A dockerd that knows every container it is asked about, with `HostConfig.BlkioWeight` starting at
    /// `blkio_weight` (0: unset) and set by `docker update`, as moby does (0 leaves it unchanged); and the weights
    /// it was sent by `docker update`.
    fn answering_dockerd(dir: &std::path::Path, blkio_weight: u16) -> (Docker, impl Fn() -> Vec<u64>) {
        use std::io::{BufRead, BufReader, Read, Write};
        use std::sync::{Arc, Mutex};
        let sock = dir.join("answering-dockerd.sock");
        let listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        let updates = Arc::new(Mutex::new(Vec::new()));
        let sent = updates.clone();
        let configured = Arc::new(Mutex::new(u64::from(blkio_weight)));
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let (updates, configured) = (updates.clone(), configured.clone());
                std::thread::spawn(move || {
                    let mut conn = BufReader::new(conn.unwrap());
                    loop {
                        let mut request = String::new();
                        let mut length = 0;
                        loop {
                            let mut line = String::new();
                            if conn.read_line(&mut line).unwrap_or(0) == 0 {
                                return;
                            }
                            if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                                length = v.trim().parse().unwrap();
                            }
                            if line == "\r\n" {
                                break;
                            }
                            request.push_str(&line);
                        }
                        let mut body = vec![0; length];
                        conn.read_exact(&mut body).unwrap();
                        let answer = if request.starts_with("POST") && request.contains("/update") {
                            let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
                            let weight = body["BlkioWeight"].as_u64().unwrap_or(0);
                            updates.lock().unwrap().push(weight);
                            if weight != 0 {
                                *configured.lock().unwrap() = weight;
                            }
                            serde_json::json!({"Warnings": []})
                        } else {
                            serde_json::json!({
                                "Name": "/old-name",
                                "State": {"Status": "running"},
                                "HostConfig": {"AutoRemove": false, "BlkioWeight": *configured.lock().unwrap()}
                            })
                        };
                        let answer = answer.to_string();
                        let head = format!(
                            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
                            answer.len()
                        );
                        let out = conn.get_mut();
                        if out.write_all(head.as_bytes()).and_then(|()| out.write_all(answer.as_bytes())).is_err() {
                            return;
                        }
                    }
                });
            }
        });
        let docker = Docker::connect_with_unix(sock.to_str().unwrap(), 5, bollard::API_DEFAULT_VERSION).unwrap();
        (docker, move || sent.lock().unwrap().clone())
    }

    /// Review finding of 2026-11-29: a container created without `--blkio-weight` (its configuration holds 0: the
    /// kernel's default applies) was restored with `docker update --blkio-weight 100`, a weight Docker can never
    /// unset. One whose configuration the agent never wrote (all its writes went into the files while it started)
    /// keeps it unset: its files are put back, running or not; one the agent wrote through Docker gets the original
    /// (Docker's 0 would leave the agent's weight there).
    #[tokio::test]
    async fn an_unset_configuration_is_restored_through_the_files_and_stays_unset() {
        let (tmp, info, file) = fixture();
        let (docker, updates) = answering_dockerd(tmp.path(), 0);
        let starting = Starting::default();
        starting.insert(&ContainerId::new("old"));
        let mut writer = agent_writer(&docker, ActuatorMode::Docker, &starting);
        assert_eq!(writer.read(&info("old")).await.unwrap(), w(100));
        assert_eq!(writer.write(&info("old"), w(1000)).await.unwrap(), AppliedVia::CgroupFile);
        starting.remove(&ContainerId::new("old"));

        assert_eq!(writer.restore(&info("old"), w(100)).await.unwrap(), AppliedVia::CgroupFile);
        assert_eq!(file("old"), "100\n", "the files as first read");
        assert_eq!(writer.restore_exited(&ContainerId::new("old"), w(100)).await.unwrap(), AppliedVia::DockerApi);
        assert_eq!(updates(), Vec::<u64>::new(), "an unset weight was made explicit in the configuration");
    }

    /// The other side: a configuration that holds a weight (the agent's, after `docker update`) gets the original,
    /// stopped or running.
    #[tokio::test]
    async fn a_configuration_holding_a_weight_gets_the_original_through_docker() {
        let (tmp, info, file) = fixture();
        let (docker, updates) = answering_dockerd(tmp.path(), 10);
        let mut writer = agent_writer(&docker, ActuatorMode::Docker, &Starting::default());
        assert_eq!(writer.restore_exited(&ContainerId::new("old"), w(100)).await.unwrap(), AppliedVia::DockerApi);
        assert_eq!(updates(), vec![100]);
        // Running: Docker is asked, and the files are checked (the fake dockerd writes none, as Docker 20.10 on a
        // BFQ-only v1 kernel).
        std::fs::write(tmp.path().join("old").join("blkio.bfq.weight"), "10\n").unwrap();
        let err = writer.restore(&info("old"), w(100)).await.unwrap_err().to_string();
        assert!(err.contains("not in force"), "{err}");
        assert_eq!((updates(), file("old")), (vec![100, 100], "10\n".to_string()));
    }

    fn fixture() -> (tempfile::TempDir, impl Fn(&str) -> ContainerInfo, impl Fn(&str) -> String) {
        let tmp = tempfile::tempdir().unwrap();
        for c in ["new", "old"] {
            std::fs::create_dir(tmp.path().join(c)).unwrap();
            std::fs::write(tmp.path().join(c).join("blkio.bfq.weight"), "100\n").unwrap();
        }
        let root = CgroupRoot::from_dir(CgroupVersion::V1, tmp.path()).unwrap();
        let info = move |c: &str| ContainerInfo {
            id: ContainerId::new(c),
            name: c.into(),
            labels: Default::default(),
            cgroup: Some(root.resolve_relative(c).unwrap()),
        };
        let base = tmp.path().to_owned();
        let file = move |c: &str| std::fs::read_to_string(base.join(c).join("blkio.bfq.weight")).unwrap();
        (tmp, info, file)
    }

    /// Defect 3 of issue 28: `docker update` persists the weight in the container's hostconfig.json, so `auto`
    /// never sends one there, started or starting, write or restore.
    #[tokio::test]
    async fn auto_never_asks_docker_so_no_weight_of_the_agent_persists_in_the_containers_config() {
        let (tmp, info, file) = fixture();
        let (docker, asked) = failing_dockerd(tmp.path());
        let starting = Starting::default();
        starting.insert(&ContainerId::new("new"));
        assert!(api_writer(&docker, ActuatorMode::Auto).is_none(), "auto has no Docker API way");
        let mut writer = agent_writer(&docker, ActuatorMode::Auto, &starting);
        assert_eq!(writer.read(&info("old")).await.unwrap(), w(100));
        for (c, weight) in [("new", 1000), ("old", 1000), ("old", 10), ("new", 200)] {
            assert_eq!(writer.write(&info(c), w(weight)).await.unwrap(), AppliedVia::CgroupFile);
            assert_eq!(file(c), format!("{weight}\n"));
            starting.remove(&ContainerId::new("new"));
        }
        assert_eq!(writer.restore(&info("old"), w(100)).await.unwrap(), AppliedVia::CgroupFile);
        assert_eq!(file("old"), "100\n");
        assert_eq!(asked(), 0, "auto asked Docker, which would persist the agent's weight in hostconfig.json");
    }

    /// `docker`: a starting container's files directly (dockerd would answer only after the start), then Docker;
    /// a failed call is an error for that write and leaves the file alone (no silent fallback in this mode).
    #[tokio::test]
    async fn docker_mode_writes_a_starting_containers_file_then_asks_docker() {
        let (tmp, info, file) = fixture();
        let (docker, asked) = failing_dockerd(tmp.path());
        let starting = Starting::default();
        starting.insert(&ContainerId::new("new"));
        let mut writer = agent_writer(&docker, ActuatorMode::Docker, &starting);

        assert_eq!(writer.write(&info("new"), w(1000)).await.unwrap(), AppliedVia::CgroupFile);
        assert_eq!(file("new"), "1000\n");
        assert_eq!(asked(), 0, "Docker was asked about a starting container");

        starting.remove(&ContainerId::new("new"));
        let err = writer.write(&info("new"), w(200)).await.unwrap_err().to_string();
        assert!(err.contains("docker update --blkio-weight"), "{err}");
        assert!(asked() >= 1, "Docker was not asked about a started container");
        assert_eq!(file("new"), "1000\n", "a failed Docker call must not be papered over by a file write");
        let err = writer.write(&info("old"), w(5)).await.unwrap_err().to_string();
        assert!(err.contains("10..=1000") && err.contains('5'), "{err}");
    }
}
