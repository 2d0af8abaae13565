//! The one call the actuator makes: `org.freedesktop.systemd1.Manager.SetUnitProperties(unit, runtime = true,
//! properties)`, on the system bus by default, with a deadline. The connection is made on first use and dropped
//! after a failure, so a restarted D-Bus or systemd is reconnected to on the next call.
//!
//! A bus that is down (no connection) or stalled (no answer within the deadline) opens a short back-off: calls in
//! the next [`SystemdBus::call_timeout`] fail at once ([`BusError::Unavailable`]) instead of each waiting out the
//! deadline, so a stalled D-Bus costs a round at most one deadline (the service's watchdog is 10 s) however many
//! containers there are. The first call after the back-off tries again; the first answer ends the outage.

use std::time::Duration;

use tokio::time::Instant;
use tracing::{info, warn};
use zbus::zvariant::Value;

use super::mapping::UnitIoWeights;
use super::unit::UnitName;

/// How long one call (with its connection, when one has to be made) may take before it counts as failed
/// (retried next round); also how long the back-off after such a failure lasts.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// A failed call to systemd. Every variant names the unit.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BusError {
    /// No connection to the bus (or the peer).
    #[error("SetUnitProperties {unit}: cannot connect to {address}: {detail}")]
    Connect {
        /// The unit.
        unit: UnitName,
        /// Where ([`BusAddress`]'s display).
        address: String,
        /// Why.
        detail: String,
    },
    /// systemd has no such unit (it stopped, or the cgroup is not a unit after all).
    #[error("systemd has no unit {0}")]
    NoSuchUnit(UnitName),
    /// systemd refused (an error reply: access denied, invalid arguments, ...) or the connection broke.
    #[error("SetUnitProperties {unit} {what}: {detail}")]
    Call {
        /// The unit.
        unit: UnitName,
        /// The properties sent.
        what: String,
        /// systemd's answer.
        detail: String,
    },
    /// No answer within the deadline.
    #[error("SetUnitProperties {unit}: no answer within {after:?}")]
    Timeout {
        /// The unit.
        unit: UnitName,
        /// The deadline.
        after: Duration,
    },
    /// Not tried: a call just before found the bus down or stalled (see the module doc).
    #[error("SetUnitProperties {unit}: not tried, the bus is unavailable ({last}); next try in {retry_in:?}")]
    Unavailable {
        /// The unit.
        unit: UnitName,
        /// The failure that opened the back-off.
        last: String,
        /// Until the back-off ends.
        retry_in: Duration,
    },
}

/// `IOWeight` as systemd reports an unset one (`CGROUP_WEIGHT_INVALID`); sending it resets the property.
pub const IO_WEIGHT_UNSET: u64 = u64::MAX;

/// A unit's I/O weight properties as systemd has them.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UnitIoProperties {
    /// `IOWeight`; [`IO_WEIGHT_UNSET`] when not set.
    pub io_weight: u64,
    /// `IODeviceWeight` entries.
    pub device_weights: Vec<(String, u64)>,
}

/// Where systemd's manager is reached.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum BusAddress {
    /// The system bus (`/run/dbus/system_bus_socket`, or `$DBUS_SYSTEM_BUS_ADDRESS`): what the agent uses.
    #[default]
    System,
    /// A D-Bus address (`unix:path=...`) of a peer that serves the manager itself, with no bus daemon between:
    /// systemd's private socket (`unix:path=/run/systemd/private`, root only), or a test's or embedder's own
    /// manager.
    Peer(String),
}

impl std::fmt::Display for BusAddress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BusAddress::System => f.write_str("the system bus"),
            BusAddress::Peer(a) => write!(f, "peer {a}"),
        }
    }
}

/// An outage: since a call found no bus or no answer, until the next answer.
#[derive(Debug)]
struct Down {
    /// Calls before this fail at once.
    until: Instant,
    /// What the last failure was.
    last: String,
    /// Whether a restore has waited out a back-off in this outage already (see [`SystemdBus::wait_out_backoff`]).
    waited: bool,
}

/// A client of systemd's manager.
#[derive(Debug)]
pub struct SystemdBus {
    address: BusAddress,
    call_timeout: Duration,
    conn: Option<zbus::Connection>,
    down: Option<Down>,
}

impl Default for SystemdBus {
    fn default() -> Self {
        Self::at(BusAddress::System)
    }
}

/// What one attempt found, before it is told apart into a [`BusError`].
enum Failure {
    Connect(String),
    NoSuchUnit,
    Reply(String, String),
    Broken(String, String),
}

impl SystemdBus {
    /// A client of the system bus that connects on first use.
    pub fn new() -> Self {
        Self::default()
    }

    /// A client of the manager at `address` that connects on first use.
    pub fn at(address: BusAddress) -> Self {
        Self { address, call_timeout: CALL_TIMEOUT, conn: None, down: None }
    }

    /// With another deadline per call (and back-off) than [`CALL_TIMEOUT`].
    pub fn with_call_timeout(mut self, timeout: Duration) -> Self {
        self.call_timeout = timeout;
        self
    }

    /// The deadline of one call, which is also the back-off after a bus found down or stalled.
    pub fn call_timeout(&self) -> Duration {
        self.call_timeout
    }

    /// Whether an outage is on: a call found no bus or no answer, and none has been answered since.
    pub fn is_down(&self) -> bool {
        self.down.is_some()
    }

    /// For a restore: once per outage, waits until the back-off ends, so that a stop during a short stall of the
    /// bus still puts every unit back; later restores in the same outage fail at once, each with its error (their
    /// originals stay in the state file, and the next start puts them back).
    pub async fn wait_out_backoff(&mut self) {
        if let Some(d) = self.down.as_mut().filter(|d| !d.waited) {
            d.waited = true;
            tokio::time::sleep_until(d.until).await;
        }
    }

    /// The unit's `IOWeight` and `IODeviceWeight` now (`GetUnit`, then the unit type's interface properties).
    pub async fn io_properties(&mut self, unit: &UnitName) -> Result<UnitIoProperties, BusError> {
        let iface = match unit.as_str().rsplit('.').next() {
            Some("scope") => "org.freedesktop.systemd1.Scope",
            Some("slice") => "org.freedesktop.systemd1.Slice",
            _ => "org.freedesktop.systemd1.Service",
        };
        self.attempt(unit, "GetUnit", async |conn| {
            let reply = conn
                .call_method(
                    Some("org.freedesktop.systemd1"),
                    "/org/freedesktop/systemd1",
                    Some("org.freedesktop.systemd1.Manager"),
                    "GetUnit",
                    &(unit.as_str(),),
                )
                .await
                .map_err(|e| failure("GetUnit", e))?;
            let answered = |what: &str, e: String| Failure::Reply(what.into(), e);
            let path: zbus::zvariant::OwnedObjectPath =
                reply.body().deserialize().map_err(|e| answered("GetUnit", e.to_string()))?;
            let get = async |prop: &str| -> Result<zbus::zvariant::OwnedValue, Failure> {
                let reply = conn
                    .call_method(
                        Some("org.freedesktop.systemd1"),
                        path.as_str(),
                        Some("org.freedesktop.DBus.Properties"),
                        "Get",
                        &(iface, prop),
                    )
                    .await
                    .map_err(|e| failure(prop, e))?;
                reply.body().deserialize::<zbus::zvariant::OwnedValue>().map_err(|e| answered(prop, e.to_string()))
            };
            let io_weight = u64::try_from(get("IOWeight").await?).map_err(|e| answered("IOWeight", e.to_string()))?;
            let device_weights = <Vec<(String, u64)>>::try_from(get("IODeviceWeight").await?)
                .map_err(|e| answered("IODeviceWeight", e.to_string()))?;
            Ok(UnitIoProperties { io_weight, device_weights })
        })
        .await
    }

    /// Sets both properties as given (`IODeviceWeight` even when empty: that clears the list; `IOWeight`
    /// [`IO_WEIGHT_UNSET`] unsets it): how a unit's own properties are put back.
    pub async fn put_back(&mut self, unit: &UnitName, props: &UnitIoProperties) -> Result<(), BusError> {
        let weights = UnitIoWeights { io_weight: props.io_weight, device_weights: props.device_weights.clone() };
        self.set(unit, &weights, true).await
    }

    /// Sets `IOWeight` and (when there are entries) `IODeviceWeight` of `unit` for this boot (runtime = true:
    /// nothing is written under /etc, and systemd keeps them over reloads).
    pub async fn set_io_weights(&mut self, unit: &UnitName, weights: &UnitIoWeights) -> Result<(), BusError> {
        self.set(unit, weights, false).await
    }

    async fn set(&mut self, unit: &UnitName, weights: &UnitIoWeights, empty_list_too: bool) -> Result<(), BusError> {
        let mut props: Vec<(&str, Value<'_>)> = vec![("IOWeight", Value::U64(weights.io_weight))];
        if empty_list_too || !weights.device_weights.is_empty() {
            props.push(("IODeviceWeight", Value::from(weights.device_weights.clone())));
        }
        let what = format!("IOWeight={} IODeviceWeight={:?}", weights.io_weight, weights.device_weights);
        let body = (unit.as_str(), true, props);
        self.attempt(unit, &what, async |conn| {
            conn.call_method(
                Some("org.freedesktop.systemd1"),
                "/org/freedesktop/systemd1",
                Some("org.freedesktop.systemd1.Manager"),
                "SetUnitProperties",
                &body,
            )
            .await
            .map(drop)
            .map_err(|e| failure(&what, e))
        })
        .await
    }

    /// Runs `op` on the connection (made first, when there is none) within one deadline, unless a back-off is on;
    /// keeps the connection and the outage up to date with what it found.
    async fn attempt<T>(
        &mut self,
        unit: &UnitName,
        what: &str,
        op: impl AsyncFnOnce(&zbus::Connection) -> Result<T, Failure>,
    ) -> Result<T, BusError> {
        if let Some(d) = self.down.as_ref().filter(|d| Instant::now() < d.until) {
            let retry_in = d.until.saturating_duration_since(Instant::now());
            return Err(BusError::Unavailable { unit: unit.clone(), last: d.last.clone(), retry_in });
        }
        let outcome = tokio::time::timeout(self.call_timeout, async {
            let conn = match self.conn.clone() {
                Some(c) => c,
                None => {
                    let c = connect(&self.address).await.map_err(|e| Failure::Connect(e.to_string()))?;
                    self.conn = Some(c.clone());
                    c
                }
            };
            op(&conn).await
        })
        .await;
        let (unit, what) = (unit.clone(), what.to_string());
        match outcome {
            Ok(Ok(v)) => {
                self.answered();
                Ok(v)
            }
            Ok(Err(Failure::NoSuchUnit)) => {
                self.answered();
                Err(BusError::NoSuchUnit(unit))
            }
            // A refusal is an answer: the bus is up and the connection good.
            Ok(Err(Failure::Reply(what, detail))) => {
                self.answered();
                Err(BusError::Call { unit, what, detail })
            }
            // A broken connection is made anew by the next call, at once.
            Ok(Err(Failure::Broken(what, detail))) => {
                self.conn = None;
                Err(BusError::Call { unit, what, detail })
            }
            Ok(Err(Failure::Connect(detail))) => {
                self.conn = None;
                self.unavailable(&unit, &what, format!("cannot connect to {}: {detail}", self.address));
                Err(BusError::Connect { unit, address: self.address.to_string(), detail })
            }
            Err(_) => {
                self.conn = None;
                self.unavailable(&unit, &what, format!("no answer within {:?}", self.call_timeout));
                Err(BusError::Timeout { unit, after: self.call_timeout })
            }
        }
    }

    /// A call found the bus down or stalled: a back-off starts (an outage too, if none is on).
    fn unavailable(&mut self, unit: &UnitName, what: &str, last: String) {
        let until = Instant::now() + self.call_timeout;
        match &mut self.down {
            Some(d) => (d.until, d.last) = (until, last),
            None => {
                warn!(bus = %self.address, unit = %unit, call = what, error = %last, backoff = ?self.call_timeout,
                    "systemd is unavailable: weights of systemd units are not set until it answers; tried again \
                     after each back-off, every round");
                self.down = Some(Down { until, last, waited: false });
            }
        }
    }

    /// A call was answered: an outage, if one was on, is over.
    fn answered(&mut self) {
        if let Some(d) = self.down.take() {
            info!(bus = %self.address, last_error = %d.last, "systemd answers again");
        }
    }
}

async fn connect(address: &BusAddress) -> Result<zbus::Connection, zbus::Error> {
    match address {
        BusAddress::System => zbus::Connection::system().await,
        BusAddress::Peer(a) => zbus::connection::Builder::address(a.as_str())?.p2p().build().await,
    }
}

/// A failed call told apart: systemd's "no such unit", another error reply, or no reply (a broken connection).
fn failure(what: &str, e: zbus::Error) -> Failure {
    match e {
        zbus::Error::MethodError(name, _, _) if name.as_str() == "org.freedesktop.systemd1.NoSuchUnit" => {
            Failure::NoSuchUnit
        }
        e @ (zbus::Error::MethodError(..) | zbus::Error::FDO(_)) => Failure::Reply(what.into(), e.to_string()),
        e => Failure::Broken(what.into(), e.to_string()),
    }
}
