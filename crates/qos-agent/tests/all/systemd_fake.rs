//! The systemd actuator's failure paths against a fake systemd manager: `org.freedesktop.systemd1.Manager`'s
//! `SetUnitProperties` served with zbus on a private peer-to-peer socket (as systemd serves `/run/systemd/private`),
//! writing a fixture scope's `io.weight` and `io.bfq.weight` as systemd does. No root, no bus daemon, real time with
//! a short call deadline (300 ms instead of 5 s). What is shown: a bus that is down, one that answers later than
//! the deadline, a refusal, and a unit that vanishes mid-call are each an error naming the unit (a warning for the
//! outage), never a panic; a back-off keeps a stalled bus from costing every container the deadline; the next call
//! after it works again; a restore during a short stall waits it out and puts the unit back.
//!
//! The reconciler's side (a failed write is logged once and retried every round, others go on) is
//! `daemon_fake::failed_write_is_retried_every_round_logged_once_and_others_go_on`; all of it on a real systemd,
//! with the system dbus-daemon stopped and Docker and containerd restarted:
//! `systemd_real::the_agent_rides_out_a_stalled_dbus_and_restarts_of_docker_and_containerd`.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use qos_agent::backend::{AppliedVia, BackendError, ContainerInfo, WeightWriter};
use qos_agent::cgroup::{CgroupRoot, CgroupVersion};
use qos_agent::files::FileWriter;
use qos_agent::systemd::bus::IO_WEIGHT_UNSET;
use qos_agent::systemd::mapping::bfq_weight_of;
use qos_agent::systemd::{BusAddress, BusError, SystemdBus, UnitName, UnitWriter};
use qos_agent::writer::{AgentWriter, Way};
use qos_core::{ContainerId, Weight};
use zbus::zvariant::OwnedValue;

use crate::daemon_fake::LogBuffer;

const DEADLINE: Duration = Duration::from_millis(300);
const ID: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

/// How the fake answers the next calls.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Mode {
    /// Sets the properties and writes the files, as systemd does.
    Normal,
    /// Answers (as `Normal`) only after this long.
    Slow(Duration),
    /// An error reply: `org.freedesktop.DBus.Error.AccessDenied`.
    AccessDenied,
    /// An error reply: `org.freedesktop.DBus.Error.InvalidArgs`.
    InvalidArgs,
    /// The unit stops during the call: its cgroup is removed and the answer is `NoSuchUnit`.
    Vanish,
    /// `NoSuchUnit` while the cgroup stays (a unit systemd has not registered yet, say).
    NoSuchUnitCgroupStays,
    /// Answers as `Normal`, then the cgroup is removed before the agent reads it back.
    VanishAfterAnswer,
}

#[derive(Debug, zbus::DBusError)]
#[zbus(prefix = "org.freedesktop")]
enum SdError {
    #[zbus(error)]
    ZBus(zbus::Error),
    #[zbus(name = "systemd1.NoSuchUnit")]
    NoSuchUnit(String),
    #[zbus(name = "DBus.Error.AccessDenied")]
    AccessDenied(String),
    #[zbus(name = "DBus.Error.InvalidArgs")]
    InvalidArgs(String),
}

#[derive(Debug, Default)]
struct Seen {
    /// `(unit, IOWeight)` of every call that got through, in order.
    calls: Vec<(String, u64)>,
    /// Connections accepted.
    connections: usize,
}

struct FakeManager {
    /// Held through a call: systemd answers one message at a time, in order, from its event loop (so a slow call
    /// delays the calls behind it, and the late one is applied before them).
    event_loop: Arc<tokio::sync::Mutex<()>>,
    mode: Arc<Mutex<Mode>>,
    seen: Arc<Mutex<Seen>>,
    /// The cgroup directory of each unit (by name).
    scope: PathBuf,
}

#[zbus::interface(name = "org.freedesktop.systemd1.Manager")]
impl FakeManager {
    async fn set_unit_properties(
        &self,
        name: String,
        _runtime: bool,
        properties: Vec<(String, OwnedValue)>,
    ) -> Result<(), SdError> {
        let _one_at_a_time = self.event_loop.lock().await;
        let mode = *self.mode.lock().unwrap();
        let io_weight = properties
            .iter()
            .find(|(k, _)| k == "IOWeight")
            .and_then(|(_, v)| u64::try_from(v.try_clone().ok()?).ok())
            .ok_or_else(|| SdError::InvalidArgs("no IOWeight".into()))?;
        let unit_here = self.scope.file_name().and_then(|n| n.to_str()) == Some(name.as_str());
        match mode {
            Mode::AccessDenied => return Err(SdError::AccessDenied("Access denied".into())),
            Mode::InvalidArgs => return Err(SdError::InvalidArgs(format!("Invalid IOWeight {io_weight}"))),
            Mode::Vanish => {
                let _ = std::fs::remove_dir_all(&self.scope);
                return Err(SdError::NoSuchUnit(format!("Unit {name} not loaded.")));
            }
            Mode::NoSuchUnitCgroupStays => return Err(SdError::NoSuchUnit(format!("Unit {name} not loaded."))),
            Mode::Slow(d) => tokio::time::sleep(d).await,
            Mode::Normal | Mode::VanishAfterAnswer => {}
        }
        if !unit_here || !self.scope.is_dir() {
            return Err(SdError::NoSuchUnit(format!("Unit {name} not loaded.")));
        }
        self.seen.lock().unwrap().calls.push((name, io_weight));
        let w = if io_weight == IO_WEIGHT_UNSET { 100 } else { io_weight };
        std::fs::write(self.scope.join("io.weight"), format!("default {w}\n")).unwrap();
        std::fs::write(self.scope.join("io.bfq.weight"), format!("default {}\n", bfq_weight_of(w))).unwrap();
        if mode == Mode::VanishAfterAnswer {
            std::fs::remove_dir_all(&self.scope).unwrap();
        }
        Ok(())
    }
}

/// The fake manager on `sock`, and a scope cgroup `system.slice/docker-<ID>.scope` under a v2 fixture root.
struct Fake {
    _tmp: tempfile::TempDir,
    sock: PathBuf,
    root: PathBuf,
    scope: PathBuf,
    mode: Arc<Mutex<Mode>>,
    seen: Arc<Mutex<Seen>>,
    server: Option<tokio::task::JoinHandle<()>>,
}

impl Fake {
    fn new() -> Self {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("cgroup");
        let scope = root.join("system.slice").join(format!("docker-{ID}.scope"));
        std::fs::create_dir_all(&scope).unwrap();
        // No device in io.stat (a container that has done no I/O): the read-back checks the files as systemd
        // writes them for the properties sent; per-device files are checked on a real systemd in systemd_real.
        for (file, text) in [("io.weight", "default 100\n"), ("io.bfq.weight", "default 100\n"), ("io.stat", "")] {
            std::fs::write(scope.join(file), text).unwrap();
        }
        let sock = tmp.path().join("systemd-private");
        Fake {
            _tmp: tmp,
            sock,
            root,
            scope,
            mode: Arc::new(Mutex::new(Mode::Normal)),
            seen: Arc::default(),
            server: None,
        }
    }

    /// Serves the manager on the socket (a new listener each time: systemd or its bus back).
    fn serve(&mut self) {
        let _ = std::fs::remove_file(&self.sock);
        let listener = tokio::net::UnixListener::bind(&self.sock).unwrap();
        let (mode, seen, scope) = (self.mode.clone(), self.seen.clone(), self.scope.clone());
        let event_loop = Arc::new(tokio::sync::Mutex::new(()));
        self.server = Some(tokio::spawn(async move {
            let mut conns = Vec::new();
            while let Ok((stream, _)) = listener.accept().await {
                seen.lock().unwrap().connections += 1;
                let manager = FakeManager {
                    event_loop: event_loop.clone(),
                    mode: mode.clone(),
                    seen: seen.clone(),
                    scope: scope.clone(),
                };
                let conn = zbus::connection::Builder::unix_stream(stream)
                    .server(zbus::Guid::generate())
                    .unwrap()
                    .p2p()
                    .serve_at("/org/freedesktop/systemd1", manager)
                    .unwrap()
                    .build()
                    .await;
                // Kept, so that the connections live as long as the server.
                conns.extend(conn.ok());
            }
        }));
    }

    /// The manager is gone: listener and connections closed, socket removed.
    async fn shut_down(&mut self) {
        if let Some(server) = self.server.take() {
            server.abort();
            let _ = server.await;
        }
        let _ = std::fs::remove_file(&self.sock);
    }

    fn set(&self, mode: Mode) {
        *self.mode.lock().unwrap() = mode;
    }

    fn calls(&self) -> Vec<(String, u64)> {
        self.seen.lock().unwrap().calls.clone()
    }

    fn bus(&self) -> SystemdBus {
        SystemdBus::at(BusAddress::Peer(format!("unix:path={}", self.sock.display()))).with_call_timeout(DEADLINE)
    }

    /// The agent's writer with the systemd way, as `agent::with_writer` assembles it on a systemd host.
    fn actuator(&self) -> AgentWriter {
        let units = UnitWriter::new(self.root.clone()).with_bus(self.bus());
        AgentWriter::new(FileWriter::new(&self.root), Way::SystemdUnits(units))
    }

    fn info(&self) -> ContainerInfo {
        let root = CgroupRoot::from_dir(CgroupVersion::V2, &self.root).unwrap();
        let rel = format!("system.slice/docker-{ID}.scope");
        ContainerInfo {
            id: ContainerId::new(ID),
            name: "web".into(),
            labels: Default::default(),
            cgroup: Some(root.resolve_relative(&rel).unwrap()),
        }
    }

    fn files(&self) -> (String, String) {
        let read = |f: &str| std::fs::read_to_string(self.scope.join(f)).unwrap_or_else(|e| format!("({e})"));
        (read("io.bfq.weight"), read("io.weight"))
    }
}

fn unit() -> String {
    format!("docker-{ID}.scope")
}

fn w(v: u64) -> Weight {
    Weight::new(v).unwrap()
}

/// `io.bfq.weight` and `io.weight` as systemd writes them for `IOWeight` `io_weight`.
fn files_at(io_weight: u64) -> (String, String) {
    (format!("default {}\n", bfq_weight_of(io_weight)), format!("default {io_weight}\n"))
}

/// The actuator's error for a write, asserted to be a retryable runtime error (not a removal) naming the unit.
fn retryable(result: Result<AppliedVia, BackendError>, what: &str) -> String {
    let err = result.expect_err(what);
    assert!(!err.is_vanished(), "{what}: a removal, not a retryable error: {err}");
    let text = err.to_string();
    assert!(text.contains(&unit()), "{what}: the error does not name the unit: {text}");
    text
}

/// The fake behaves as systemd does for the actuator: `IOWeight` 10000 for the top weight, files read back, and a
/// restore unsets it (the baseline the failure tests below depart from).
#[tokio::test]
async fn the_fake_manager_takes_weights_and_restores_like_systemd() {
    let mut fake = Fake::new();
    fake.serve();
    let mut act = fake.actuator();
    let info = fake.info();
    assert_eq!(act.write(&info, w(1000)).await.unwrap(), AppliedVia::Systemd);
    assert_eq!(fake.files(), ("default 1000\n".into(), "default 10000\n".into()));
    assert_eq!(act.write(&info, w(10)).await.unwrap(), AppliedVia::Systemd);
    assert_eq!(fake.files(), files_at(10));
    assert_eq!(act.restore(&info, w(100)).await.unwrap(), AppliedVia::Systemd);
    assert_eq!(fake.files(), files_at(100));
    assert_eq!(fake.calls(), vec![(unit(), 10_000), (unit(), 10), (unit(), IO_WEIGHT_UNSET)]);
    // One connection for all three calls.
    assert_eq!(fake.seen.lock().unwrap().connections, 1);
    // Not a systemd unit name: the inner (file) writer, no call.
    let mut plain = fake.info();
    let plain_dir = fake.root.join("docker").join(ID);
    std::fs::create_dir_all(&plain_dir).unwrap();
    for (file, text) in [("io.weight", "default 100\n"), ("io.bfq.weight", "default 100\n"), ("io.stat", "")] {
        std::fs::write(plain_dir.join(file), text).unwrap();
    }
    plain.cgroup = Some(
        CgroupRoot::from_dir(CgroupVersion::V2, &fake.root).unwrap().resolve_relative(&format!("docker/{ID}")).unwrap(),
    );
    assert_eq!(act.write(&plain, w(500)).await.unwrap(), AppliedVia::CgroupFile);
    assert_eq!(fake.calls().len(), 3, "a cgroupfs path went to systemd");
}

/// Nobody listening (systemd or its bus down): an error naming the unit and the address, one warning for the
/// outage, calls during the back-off fail at once; once the manager is back, the next call after the back-off
/// sets the weight, and the outage is over (logged).
#[tokio::test]
async fn a_bus_that_is_down_is_an_error_and_a_warning_then_the_weight_is_set_when_it_is_back() {
    let logs = LogBuffer::default();
    let _capture = logs.install();
    let mut fake = Fake::new();
    let mut act = fake.actuator();
    let info = fake.info();

    let err = retryable(act.write(&info, w(1000)).await, "write with no manager");
    assert!(err.contains("cannot connect to peer unix:path="), "{err}");
    let started = Instant::now();
    let err = retryable(act.write(&info, w(1000)).await, "write during the back-off");
    assert!(started.elapsed() < Duration::from_millis(50), "a call in the back-off waited {:?}", started.elapsed());
    assert!(err.contains("not tried, the bus is unavailable"), "{err}");
    let log = logs.text();
    assert_eq!(log.matches("systemd is unavailable").count(), 1, "one warning per outage:\n{log}");
    let warning = log.lines().find(|l| l.contains("systemd is unavailable")).unwrap();
    assert!(warning.contains("WARN") && warning.contains(&format!("unit={}", unit())), "{warning}");
    assert_eq!(fake.files(), files_at(100), "something was written with no manager");

    fake.serve();
    tokio::time::sleep(DEADLINE).await;
    assert_eq!(act.write(&info, w(1000)).await.unwrap(), AppliedVia::Systemd);
    assert_eq!(fake.files(), files_at(10_000));
    assert!(logs.text().contains("systemd answers again"), "{}", logs.text());

    // Down again, for good: a restore waits out the back-off once, fails naming the unit (the original stays
    // in the state file for the next start); the next restore in the same outage fails at once.
    fake.shut_down().await;
    // The first call finds its connection broken (no outage: the next call reconnects at once), the next finds
    // nobody listening: an outage.
    let err = retryable(act.write(&info, w(10)).await, "write on the broken connection");
    assert!(!err.contains("not tried"), "{err}");
    let err = retryable(act.write(&info, w(10)).await, "write with the manager gone");
    assert!(err.contains("cannot connect"), "{err}");
    let started = Instant::now();
    let err = act.restore(&info, w(100)).await.expect_err("restore with the manager gone");
    assert!(started.elapsed() >= DEADLINE / 2, "the restore did not wait out the back-off: {:?}", started.elapsed());
    assert!(err.to_string().contains(&unit()), "{err}");
    let started = Instant::now();
    let _ = act.restore(&info, w(100)).await.expect_err("a second restore in the same outage");
    assert!(started.elapsed() < Duration::from_millis(50), "a second restore waited {:?}", started.elapsed());
}

/// A manager that answers later than the deadline: a timeout naming the unit after the deadline (not after the
/// answer), a back-off that costs the next calls nothing, and a write that works once it answers in time. A
/// restore during the back-off (a stop during a short stall) waits it out and puts the unit back.
#[tokio::test]
async fn a_slow_manager_costs_one_deadline_then_calls_fail_fast_until_it_answers() {
    let logs = LogBuffer::default();
    let _capture = logs.install();
    let mut fake = Fake::new();
    fake.serve();
    let mut act = fake.actuator();
    let info = fake.info();
    assert_eq!(act.write(&info, w(10)).await.unwrap(), AppliedVia::Systemd);

    fake.set(Mode::Slow(DEADLINE * 3 / 2));
    let started = Instant::now();
    let err = retryable(act.write(&info, w(500)).await, "write to a slow manager");
    let took = started.elapsed();
    assert!(err.contains("no answer within 300ms"), "{err}");
    assert!(took >= DEADLINE && took < DEADLINE * 2, "the timeout took {took:?}");
    // Ten more containers' worth of calls in the same round: none waits.
    let started = Instant::now();
    for _ in 0..10 {
        let err = retryable(act.write(&info, w(500)).await, "write during the back-off");
        assert!(err.contains("not tried") && err.contains("no answer within"), "{err}");
    }
    assert!(started.elapsed() < Duration::from_millis(50), "10 calls in the back-off took {:?}", started.elapsed());
    assert!(logs.text().contains("systemd is unavailable"), "{}", logs.text());

    // The manager is quick again; a stop comes during the back-off: the restore waits it out and works.
    fake.set(Mode::Normal);
    let _ = retryable(act.write(&info, w(500)).await, "write just after the timeout");
    let started = Instant::now();
    assert_eq!(act.restore(&info, w(100)).await.unwrap(), AppliedVia::Systemd);
    eprintln!("restore during the back-off: put back after {:?}", started.elapsed());
    assert_eq!(fake.files(), files_at(100));
    assert_eq!(fake.calls().last(), Some(&(unit(), IO_WEIGHT_UNSET)));
    // The timed-out call (IOWeight for 500) was applied late, but before the restore, which is the last word.
    assert!(fake.calls().contains(&(unit(), 4500)), "{:?}", fake.calls());
    tokio::time::sleep(DEADLINE * 2).await;
    assert_eq!(fake.calls().last(), Some(&(unit(), IO_WEIGHT_UNSET)), "{:?}", fake.calls());
    assert_eq!(fake.files(), files_at(100));
    assert_eq!(act.write(&info, w(1000)).await.unwrap(), AppliedVia::Systemd);
    assert_eq!(fake.files(), files_at(10_000));
}

/// An error reply (access denied, invalid arguments) is an answer: an error naming the unit and systemd's error,
/// no back-off (the next call goes out at once), the connection kept, no outage warning.
#[tokio::test]
async fn a_refusal_is_an_error_naming_the_unit_and_the_next_call_goes_out_at_once() {
    let logs = LogBuffer::default();
    let _capture = logs.install();
    let mut fake = Fake::new();
    fake.serve();
    let mut act = fake.actuator();
    let info = fake.info();
    for (mode, name) in [
        (Mode::AccessDenied, "org.freedesktop.DBus.Error.AccessDenied"),
        (Mode::InvalidArgs, "org.freedesktop.DBus.Error.InvalidArgs"),
    ] {
        fake.set(mode);
        let err = retryable(act.write(&info, w(1000)).await, name);
        assert!(err.contains(name) && err.contains("IOWeight=10000"), "{err}");
    }
    assert_eq!(fake.files(), files_at(100));
    fake.set(Mode::Normal);
    assert_eq!(act.write(&info, w(1000)).await.unwrap(), AppliedVia::Systemd);
    assert_eq!(fake.seen.lock().unwrap().connections, 1, "a refusal cost a reconnect");
    assert!(!logs.text().contains("systemd is unavailable"), "a refusal is not an outage:\n{}", logs.text());
}

/// A unit that stops during the call: a removal (the container is dropped, nothing retried) when its cgroup is
/// gone, whether systemd answered `NoSuchUnit` or the cgroup vanished before the read-back; `NoSuchUnit` with the
/// cgroup still there is a retryable error.
#[tokio::test]
async fn a_unit_that_vanishes_mid_call_is_a_removal_and_a_missing_unit_with_its_cgroup_is_retried() {
    let mut fake = Fake::new();
    fake.serve();
    let mut act = fake.actuator();
    let info = fake.info();

    fake.set(Mode::NoSuchUnitCgroupStays);
    let err = retryable(act.write(&info, w(1000)).await, "NoSuchUnit with the cgroup there");
    assert!(err.contains(&format!("systemd has no unit {}", unit())), "{err}");

    fake.set(Mode::Vanish);
    let err = act.write(&info, w(1000)).await.expect_err("vanished during the call");
    assert!(err.is_vanished(), "not a removal: {err}");

    let mut fake = Fake::new();
    fake.serve();
    let mut act = fake.actuator();
    let info = fake.info();
    fake.set(Mode::VanishAfterAnswer);
    let err = act.write(&info, w(1000)).await.expect_err("vanished before the read-back");
    assert!(err.is_vanished(), "not a removal: {err}");
    // And a restore of a vanished unit is a removal too: nothing left to restore.
    let err = act.restore(&info, w(100)).await.expect_err("restore of a vanished unit");
    assert!(err.is_vanished(), "not a removal: {err}");
}

/// The bus client alone: a deadline per call, the error names the unit, and the back-off is over after one
/// deadline.
#[tokio::test]
async fn the_bus_client_times_out_names_the_unit_and_backs_off_for_one_deadline() {
    let mut fake = Fake::new();
    fake.serve();
    fake.set(Mode::Slow(DEADLINE * 2));
    let mut bus = fake.bus();
    let unit = UnitName::parse(&unit()).unwrap();
    let weights = qos_agent::systemd::UnitIoWeights { io_weight: 500, device_weights: Vec::new() };
    match bus.set_io_weights(&unit, &weights).await {
        Err(BusError::Timeout { unit: u, after }) => assert_eq!((u, after), (unit.clone(), DEADLINE)),
        other => panic!("not a timeout: {other:?}"),
    }
    assert!(bus.is_down());
    assert!(matches!(bus.set_io_weights(&unit, &weights).await, Err(BusError::Unavailable { .. })));
    fake.set(Mode::Normal);
    tokio::time::sleep(DEADLINE).await;
    bus.set_io_weights(&unit, &weights).await.unwrap();
    assert!(!bus.is_down());
}
