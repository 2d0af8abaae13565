//! [`CriClient`]: the few CRI v1 `RuntimeService` calls the agent makes, over the runtime's unix socket.

use std::path::{Path, PathBuf};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use k8s_cri::v1::{
    GetEventsRequest, ListPodSandboxRequest, PodSandbox, PodSandboxFilter, PodSandboxState, PodSandboxStateValue,
    PodSandboxStatusRequest, VersionRequest,
};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use tokio::sync::mpsc;

use crate::ops::metrics::CallLabels;
use tonic::transport::{Channel, Endpoint, Uri};

use crate::backend::DiscoveryError;

/// What the runtime's container event stream (`GetContainerEvents`) tells discovery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EventWake {
    /// A container or sandbox changed: re-list now.
    Changed,
    /// The runtime has no event stream (`Unimplemented`: containerd before 1.7); do not ask again until it restarts.
    Unsupported,
    /// The stream ended or failed (the runtime restarting, say); ask again at the next successful list.
    Ended(String),
}

/// The calls discovery makes, so it can run against a fake runtime in tests.
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
    /// Subscribes to the runtime's container events: every event becomes [`EventWake::Changed`] on the returned
    /// channel, and its end one last [`EventWake::Unsupported`] or [`EventWake::Ended`]. Returns at once (the
    /// call runs in a task). The default: a runtime without events.
    fn watch_events(&mut self) -> mpsc::Receiver<EventWake> {
        let (tx, rx) = mpsc::channel(1);
        let _ = tx.try_send(EventWake::Unsupported);
        rx
    }
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

    fn watch_events(&mut self) -> mpsc::Receiver<EventWake> {
        CriClient::watch_events(self)
    }
}

/// One CRI call's deadline: the runtime answers these from memory, so a slow answer means trouble.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// A client of one CRI runtime socket. The channel connects lazily and reconnects by itself after the runtime
/// restarts: a call made while the runtime is down fails with `Unavailable`, the next one after it is back works.
#[derive(Debug, Clone)]
pub struct CriClient {
    rt: RuntimeServiceClient<Channel>,
    /// For the event stream: a channel without [`CALL_TIMEOUT`] (a stream lasts, and a runtime may send its
    /// response headers only with the first event).
    events: RuntimeServiceClient<Channel>,
    socket: PathBuf,
    /// Calls made, by name (`ddiskqos_cri_requests_total{call}`), if the caller exports them.
    requests: Option<Family<CallLabels, Counter>>,
}

/// How long connecting to a CRI socket may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// The largest answer taken from the runtime: the kubelet's own limit (16 MiB), not tonic's default of 4 MiB, which
/// a node's pod annotations can outgrow (`ListPodSandbox` carries every pod's), leaving pods unmanaged.
const MAX_ANSWER: usize = 16 << 20;

/// A gRPC channel to the unix socket `path` that connects on first use (so a runtime that is not up yet is not
/// an error here), with a per-call deadline if `call_timeout` is given. Must be called inside a tokio runtime.
/// The one way the agent, the bench and the test bed open a CRI socket.
pub fn unix_channel(path: &Path, connect_timeout: Duration, call_timeout: Option<Duration>) -> Channel {
    unix_endpoint(connect_timeout, call_timeout).connect_with_connector_lazy(unix_connector(path))
}

/// [`unix_channel`], connected now: an error when nothing answers on `path`.
pub async fn unix_channel_connected(
    path: &Path,
    connect_timeout: Duration,
    call_timeout: Option<Duration>,
) -> Result<Channel, tonic::transport::Error> {
    unix_endpoint(connect_timeout, call_timeout).connect_with_connector(unix_connector(path)).await
}

fn unix_endpoint(connect_timeout: Duration, call_timeout: Option<Duration>) -> Endpoint {
    // The URI is required by the HTTP/2 layer and ignored: every connection goes to the socket.
    let endpoint = Endpoint::from_static("http://cri.invalid").connect_timeout(connect_timeout);
    match call_timeout {
        Some(t) => endpoint.timeout(t),
        None => endpoint,
    }
}

fn unix_connector(
    path: &Path,
) -> impl tower::Service<Uri, Response = TokioIo<tokio::net::UnixStream>, Error = std::io::Error, Future: Send + 'static>
       + Clone
       + Send
       + 'static {
    let path = path.to_path_buf();
    tower::service_fn(move |_: Uri| {
        let path = path.clone();
        async move { Ok::<_, std::io::Error>(TokioIo::new(tokio::net::UnixStream::connect(path).await?)) }
    })
}

impl CriClient {
    /// A client of the runtime listening on `socket` (nothing is connected yet).
    pub fn new(socket: &Path) -> Result<Self, DiscoveryError> {
        Ok(Self {
            rt: RuntimeServiceClient::new(unix_channel(socket, CONNECT_TIMEOUT, Some(CALL_TIMEOUT)))
                .max_decoding_message_size(MAX_ANSWER),
            events: RuntimeServiceClient::new(unix_channel(socket, CONNECT_TIMEOUT, None))
                .max_decoding_message_size(MAX_ANSWER),
            socket: socket.to_path_buf(),
            requests: None,
        })
    }

    /// Counts every call in `requests` (by call name).
    pub fn with_metric(mut self, requests: Family<CallLabels, Counter>) -> Self {
        self.requests = Some(requests);
        self
    }

    fn count(&self, call: &'static str) {
        if let Some(r) = &self.requests {
            r.get_or_create(&CallLabels { call: call.into() }).inc();
        }
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
        self.count("Version");
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
        self.count("ListPodSandbox");
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
        self.count("PodSandboxStatus");
        let resp = self
            .rt
            .pod_sandbox_status(PodSandboxStatusRequest { pod_sandbox_id: sandbox_id.into(), verbose: true })
            .await
            .map_err(|s| self.error("PodSandboxStatus", s))?
            .into_inner();
        Ok(resp.info)
    }

    /// `GetContainerEvents` (CRI v1, containerd 1.7+, CRI-O with evented PLEG), forwarded by a task: see
    /// [`SandboxSource::watch_events`]. Wake-ups are coalesced (a channel of one: a re-list sees every change).
    pub fn watch_events(&mut self) -> mpsc::Receiver<EventWake> {
        self.count("GetContainerEvents");
        let (tx, rx) = mpsc::channel(1);
        let mut rt = self.events.clone();
        let socket = self.socket.clone();
        tokio::spawn(async move {
            let end = match rt.get_container_events(GetEventsRequest {}).await {
                Err(s) if s.code() == tonic::Code::Unimplemented => EventWake::Unsupported,
                Err(s) => EventWake::Ended(format!("{:?}: {}", s.code(), s.message())),
                Ok(resp) => {
                    let mut stream = resp.into_inner();
                    loop {
                        match stream.message().await {
                            Ok(Some(_)) => {
                                if let Err(mpsc::error::TrySendError::Closed(_)) = tx.try_send(EventWake::Changed) {
                                    return;
                                }
                            }
                            Ok(None) => break EventWake::Ended("the runtime closed the stream".into()),
                            Err(s) => break EventWake::Ended(format!("{:?}: {}", s.code(), s.message())),
                        }
                    }
                }
            };
            tracing::debug!(socket = %socket.display(), end = ?end, "CRI event stream ended");
            // The last word: wait for room (a pending Changed is read first).
            let _ = tx.send(end).await;
        });
        rx
    }
}

#[cfg(test)]
mod tests {
    //! [`CriClient::watch_events`] against a CRI server of the test's own on a unix socket (tonic's generated
    //! server; every call but `GetContainerEvents` answers `Unimplemented`): real gRPC, real streams.

    use std::pin::Pin;

    use k8s_cri::v1 as cri;
    use k8s_cri::v1::runtime_service_server::{RuntimeService, RuntimeServiceServer};
    use tonic::codegen::tokio_stream::wrappers::UnixListenerStream;
    use tonic::codegen::tokio_stream::Stream;
    use tonic::{Request, Response, Status};

    use super::*;

    /// What the test runtime's `GetContainerEvents` does.
    #[derive(Clone, Copy)]
    enum Events {
        /// Sends this many events, 50 ms apart, then closes the stream.
        Send(usize),
        /// Answers `Unimplemented`, as containerd 1.6 does.
        Unimplemented,
    }

    /// The test runtime: its events, and the bytes of annotations its one READY sandbox carries.
    struct TestRuntime(Events, usize);

    type EventStream = Pin<Box<dyn Stream<Item = Result<cri::ContainerEventResponse, Status>> + Send>>;

    /// The trait's other calls, all `Unimplemented`.
    macro_rules! runtime {
        ($($call:ident($req:ident) -> $resp:ident;)*) => {
            #[tonic::async_trait]
            impl RuntimeService for TestRuntime {
                type GetContainerEventsStream = EventStream;

                async fn get_container_events(
                    &self,
                    _: Request<cri::GetEventsRequest>,
                ) -> Result<Response<EventStream>, Status> {
                    let n = match self.0 {
                        Events::Unimplemented => return Err(Status::unimplemented("GetContainerEvents")),
                        Events::Send(n) => n,
                    };
                    let (tx, rx) = mpsc::channel(4);
                    tokio::spawn(async move {
                        for i in 0..n {
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            let ev = cri::ContainerEventResponse { container_id: format!("c{i}"), ..Default::default() };
                            if tx.send(Ok(ev)).await.is_err() {
                                return;
                            }
                        }
                    });
                    Ok(Response::new(Box::pin(tonic::codegen::tokio_stream::wrappers::ReceiverStream::new(rx))))
                }

                async fn list_pod_sandbox(
                    &self,
                    _: Request<cri::ListPodSandboxRequest>,
                ) -> Result<Response<cri::ListPodSandboxResponse>, Status> {
                    let big = std::collections::HashMap::from([("example.com/big".to_string(), "x".repeat(self.1))]);
                    let pod = cri::PodSandbox { id: "s1".into(), annotations: big, ..Default::default() };
                    Ok(Response::new(cri::ListPodSandboxResponse { items: vec![pod] }))
                }

                $(
                    async fn $call(&self, _: Request<cri::$req>) -> Result<Response<cri::$resp>, Status> {
                        Err(Status::unimplemented(stringify!($call)))
                    }
                )*
            }
        };
    }

    runtime! {
        version(VersionRequest) -> VersionResponse;
        run_pod_sandbox(RunPodSandboxRequest) -> RunPodSandboxResponse;
        stop_pod_sandbox(StopPodSandboxRequest) -> StopPodSandboxResponse;
        remove_pod_sandbox(RemovePodSandboxRequest) -> RemovePodSandboxResponse;
        pod_sandbox_status(PodSandboxStatusRequest) -> PodSandboxStatusResponse;
        create_container(CreateContainerRequest) -> CreateContainerResponse;
        start_container(StartContainerRequest) -> StartContainerResponse;
        stop_container(StopContainerRequest) -> StopContainerResponse;
        remove_container(RemoveContainerRequest) -> RemoveContainerResponse;
        list_containers(ListContainersRequest) -> ListContainersResponse;
        container_status(ContainerStatusRequest) -> ContainerStatusResponse;
        update_container_resources(UpdateContainerResourcesRequest) -> UpdateContainerResourcesResponse;
        reopen_container_log(ReopenContainerLogRequest) -> ReopenContainerLogResponse;
        exec_sync(ExecSyncRequest) -> ExecSyncResponse;
        exec(ExecRequest) -> ExecResponse;
        attach(AttachRequest) -> AttachResponse;
        port_forward(PortForwardRequest) -> PortForwardResponse;
        container_stats(ContainerStatsRequest) -> ContainerStatsResponse;
        list_container_stats(ListContainerStatsRequest) -> ListContainerStatsResponse;
        pod_sandbox_stats(PodSandboxStatsRequest) -> PodSandboxStatsResponse;
        list_pod_sandbox_stats(ListPodSandboxStatsRequest) -> ListPodSandboxStatsResponse;
        update_runtime_config(UpdateRuntimeConfigRequest) -> UpdateRuntimeConfigResponse;
        status(StatusRequest) -> StatusResponse;
        checkpoint_container(CheckpointContainerRequest) -> CheckpointContainerResponse;
        list_metric_descriptors(ListMetricDescriptorsRequest) -> ListMetricDescriptorsResponse;
        list_pod_sandbox_metrics(ListPodSandboxMetricsRequest) -> ListPodSandboxMetricsResponse;
        runtime_config(RuntimeConfigRequest) -> RuntimeConfigResponse;
    }

    /// Serves a [`TestRuntime`] on a socket in a fresh directory; returns the directory (kept alive) and socket.
    fn serve(events: Events) -> (tempfile::TempDir, PathBuf) {
        serve_with(events, 0)
    }

    fn serve_with(events: Events, annotation_bytes: usize) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("cri.sock");
        let listener = tokio::net::UnixListener::bind(&socket).unwrap();
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(RuntimeServiceServer::new(TestRuntime(events, annotation_bytes)))
                .serve_with_incoming(UnixListenerStream::new(listener)),
        );
        (dir, socket)
    }

    /// Every wake-up until the stream's last word (at most 10 s).
    async fn wakes(rx: &mut mpsc::Receiver<EventWake>) -> Vec<EventWake> {
        let mut out = Vec::new();
        loop {
            let w = tokio::time::timeout(Duration::from_secs(10), rx.recv()).await.expect("a wake-up within 10 s");
            let last = !matches!(w, Some(EventWake::Changed));
            out.extend(w);
            if last {
                return out;
            }
        }
    }

    #[tokio::test]
    async fn events_wake_discovery_and_the_end_of_the_stream_is_reported() {
        let (_dir, socket) = serve(Events::Send(3));
        let mut client = CriClient::new(&socket).unwrap();
        let mut rx = client.watch_events();
        let got = wakes(&mut rx).await;
        // Wake-ups are coalesced (a busy reader may see two events as one): one to three of them, then the end.
        let (end, changed) = got.split_last().expect("at least the end");
        assert_eq!(*end, EventWake::Ended("the runtime closed the stream".into()), "{got:?}");
        assert!((1..=3).contains(&changed.len()), "{got:?}");
        assert!(changed.iter().all(|w| *w == EventWake::Changed), "{got:?}");
    }

    #[tokio::test]
    async fn a_listing_larger_than_grpcs_default_4_mib_is_read() {
        // 6 MiB of one pod's annotations: over tonic's default limit, under the kubelet's 16 MiB.
        let (_dir, socket) = serve_with(Events::Unimplemented, 6 << 20);
        let mut client = CriClient::new(&socket).unwrap();
        let pods = client.ready_sandboxes().await.expect("a 6 MiB answer is taken");
        assert_eq!(pods.len(), 1);
        assert_eq!(pods[0].annotations["example.com/big"].len(), 6 << 20);
    }

    #[tokio::test]
    async fn a_runtime_without_the_call_is_unsupported() {
        let (_dir, socket) = serve(Events::Unimplemented);
        let mut rx = CriClient::new(&socket).unwrap().watch_events();
        assert_eq!(wakes(&mut rx).await, vec![EventWake::Unsupported]);
    }

    #[tokio::test]
    async fn no_runtime_on_the_socket_ends_the_stream_naming_why() {
        let dir = tempfile::tempdir().unwrap();
        let mut rx = CriClient::new(&dir.path().join("absent.sock")).unwrap().watch_events();
        match wakes(&mut rx).await.as_slice() {
            [EventWake::Ended(why)] => assert!(why.contains("Unavailable"), "{why}"),
            other => panic!("expected one Ended, got {other:?}"),
        }
    }
}
