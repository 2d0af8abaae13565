//! qos-agent's integration tests, one binary with a module per area (one link instead of nine).
//!
//! Without root:
//! - `daemon_fake`: the daemon on in-memory backends on tokio's paused clock, plus a model-based proptest.
//! - `cgroup_fixtures`: the cgroup layer on fixture trees of the v1 and v2 layouts.
//! - `file_writer`: the file writer's cgroup-v2 overrides and restores on fixture files written through testbed's
//!   fixture kernel; its throughput cap in the throttle files (v1 and v2), lifted exactly, also after a crash.
//! - `cli`: the binary from outside: `check-config`, `status`, `run` errors, completions and man pages, `deploy/`, the
//!   systemd notify protocol.
//! - `confinement`: writes only to managed weight files, paths leading outside the root refused, metrics on
//!   loopback.
//! - `fuzz_parsers`: property tests of everything parsed from outside.
//! - `systemd_fake`: the systemd actuator's failure paths (bus down, slow, refusing; a unit vanishing mid-call)
//!   against a fake systemd manager on a private peer-to-peer D-Bus socket.
//! - `k8s_manifests`: `deploy/kubernetes/` parsed into the Kubernetes API types, its key fields checked; every
//!   manifest and rendered overlay through `kubernetes-validate --strict` (a missing tool fails under CI).
//! - `helm_chart`: `deploy/helm/ddiskqos-agent` rendered by a real `helm` and compared with the kustomize base and
//!   overlays; `helm lint --strict`, `kubernetes-validate --strict` per values file; the values schema (a missing
//!   `helm` fails under CI).
//!
//! Real (root, cgroup v1 blkio, loop devices, Docker; `#[ignore]`d, so a plain `cargo test` lists them as ignored;
//! `./scripts/test.sh` runs them, and they fail rather than skip there; see `testbed`):
//! - `cgroup_real`: the cgroup layer on the kernel, on a BFQ loop device (the throughput cap in v1's throttle files
//!   too).
//! - `cgroup_dir_real`: the agent's cgroup-dir runtime on real blkio cgroups.
//! - `docker_real`: the agent against the host's dockerd.
//! - `faults_real`: dockerd restarts, churn, SIGKILL, broken and vanishing cgroup files, bad config (a private
//!   dockerd); the fixture-based fault tests there run without root.
//! - `cri_real`: the agent's CRI runtime against a private containerd, pods made through CRI as a kubelet would;
//!   `[policy]` and system pods under kind's `--cgroup-root=/kubelet`; `/readyz`.
//! - `deploy_real`: the DaemonSet's image run as a pod through that containerd, with the manifests' mounts, args,
//!   security context and probes (`deploy/kubernetes/build-image.sh` builds the image first).
//! - `scale_real`: correctness at 1,024 cgroups and 32 containers; 110 pods of 2 containers through containerd,
//!   measured (CPU, memory, CRI calls a minute, new pods' time to the top).
//! - `attacks_real`: the attacks of issue 12 replayed (a metrics flood by `nobody`, two agents on one state file, a
//!   container moving its process into another cgroup, a read-only state directory, a planted symlink, an idle
//!   status client): no cgroup at a wrong weight after a clean stop.
//! - `tunables_real`: `[devices] bfq_tunables` set at start, restored on SIGTERM and after a SIGKILL.
//! - `protect_real`: protection by default on a loop device of its own: switched to BFQ and given the short slots,
//!   shown in status and metrics, put back on SIGTERM; `opt_out`; `devices restore` after a SIGKILL.
//! - `v2_real`: the agent on real cgroup v2 (BFQ and io.cost loop devices, a dockerd on v2; status per device), the
//!   io.cost set-up command, and the `io.stat` counters of real containers; it runs only inside
//!   `scripts/cgroup-v2.sh` (the machine boots v1), so `scripts/test.sh` skips it in the main run and runs it there.
//!
//! Tests of this binary run in parallel threads of one process: a real test holds `testbed::exclusive()` for its
//! whole run, so no two of them overlap (they measure latencies and CPU, and restart daemons).
//!
//! `daemon_fake` installs this binary's one global tracing subscriber (lines routed to the emitting thread's
//! buffer), so its log assertions cannot race with other tests.

mod attacks_real;
mod cgroup_dir_real;
mod cgroup_fixtures;
mod cgroup_real;
mod cli;
mod confinement;
mod cri_real;
mod daemon_fake;
mod deploy_real;
mod docker_real;
mod faults_real;
mod file_writer;
mod fuzz_parsers;
mod helm_chart;
mod k8s_manifests;
mod protect_real;
mod scale_real;
mod systemd_fake;
mod systemd_real;
mod tunables_real;
mod v2_real;

/// The agent binary under test.
const AGENT: &str = env!("CARGO_BIN_EXE_ddiskqos-agent");
