//! [`CriClient`]: the few CRI v1 `RuntimeService` calls the agent makes, over the runtime's unix socket.

use std::path::{Path, PathBuf};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use k8s_cri::v1::{
    ListPodSandboxRequest, PodSandbox, PodSandboxFilter, PodSandboxState, PodSandboxStateValue,
    PodSandboxStatusRequest, VersionRequest,
};
use tonic::transport::{Channel, Endpoint, Uri};

use crate::backend::DiscoveryError;

/// The two calls discovery makes, so it can run against a fake runtime in tests.
pub trait SandboxSource: Send {
    /// What this is, for logs (the socket).
    fn describe(&self) -> String;
    /// The READY pod sandboxes.
    fn ready_sandboxes(&mut self) -> impl std::future::Future<Output = Result<Vec<PodSandbox>, DiscoveryError>> + Send;
    /// The `info` map of a verbose `PodSandboxStatus`.
    fn sandbox_info(
        &mut self,
        sandbox_id: &str,
    ) -> impl std::future::Future<Output = Result<std::collections::HashMap<String, String>, DiscoveryError>> + Send;
}

impl SandboxSource for CriClient {
    fn describe(&self) -> String {
        self.socket.display().to_string()
    }

    async fn ready_sandboxes(&mut self) -> Result<Vec<PodSandbox>, DiscoveryError> {
        CriClient::ready_sandboxes(self).await
    }

    async fn sandbox_info(
        &mut self,
        sandbox_id: &str,
    ) -> Result<std::collections::HashMap<String, String>, DiscoveryError> {
        CriClient::sandbox_info(self, sandbox_id).await
    }
}

/// One CRI call's deadline: the runtime answers these from memory, so a slow answer means trouble.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// A client of one CRI runtime socket. The channel connects lazily and reconnects by itself after the runtime
/// restarts: a call made while the runtime is down fails with `Unavailable`, the next one after it is back works.
#[derive(Debug, Clone)]
pub struct CriClient {
    rt: RuntimeServiceClient<Channel>,
    socket: PathBuf,
}

impl CriClient {
    /// A client of the runtime listening on `socket` (nothing is connected yet).
    pub fn new(socket: &Path) -> Result<Self, DiscoveryError> {
        let path = socket.to_path_buf();
        // The URI is required by the HTTP/2 layer and ignored: every connection goes to the socket.
        let channel = Endpoint::from_static("http://cri.invalid")
            .connect_timeout(Duration::from_secs(2))
            .timeout(CALL_TIMEOUT)
            .connect_with_connector_lazy(tower::service_fn(move |_: Uri| {
                let path = path.clone();
                async move { Ok::<_, std::io::Error>(TokioIo::new(tokio::net::UnixStream::connect(path).await?)) }
            }));
        Ok(Self { rt: RuntimeServiceClient::new(channel), socket: socket.to_path_buf() })
    }

    /// The socket this client talks to.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    fn error(&self, call: &str, status: tonic::Status) -> DiscoveryError {
        DiscoveryError::Runtime {
            what: format!("CRI {call} on {}", self.socket.display()),
            detail: format!("{:?}: {}", status.code(), status.message()),
        }
    }

    /// `Version`: the runtime's name and version (e.g. `containerd`, `v1.6.20`).
    pub async fn version(&mut self) -> Result<(String, String), DiscoveryError> {
        let resp = self
            .rt
            .version(VersionRequest { version: "v1".into() })
            .await
            .map_err(|s| self.error("Version", s))?
            .into_inner();
        Ok((resp.runtime_name, resp.runtime_version))
    }

    /// `ListPodSandbox` with state READY: the pods that run now.
    pub async fn ready_sandboxes(&mut self) -> Result<Vec<PodSandbox>, DiscoveryError> {
        let filter = PodSandboxFilter {
            state: Some(PodSandboxStateValue { state: PodSandboxState::SandboxReady as i32 }),
            ..Default::default()
        };
        let resp = self
            .rt
            .list_pod_sandbox(ListPodSandboxRequest { filter: Some(filter) })
            .await
            .map_err(|s| self.error("ListPodSandbox", s))?
            .into_inner();
        Ok(resp.items)
    }

    /// Verbose `PodSandboxStatus`: its `info` map (containerd and CRI-O put the sandbox config and OCI spec
    /// there as JSON), from which [`super::naming::cgroup_parent_from_info`] takes the cgroup parent.
    pub async fn sandbox_info(
        &mut self,
        sandbox_id: &str,
    ) -> Result<std::collections::HashMap<String, String>, DiscoveryError> {
        let resp = self
            .rt
            .pod_sandbox_status(PodSandboxStatusRequest { pod_sandbox_id: sandbox_id.into(), verbose: true })
            .await
            .map_err(|s| self.error("PodSandboxStatus", s))?
            .into_inner();
        Ok(resp.info)
    }
}
