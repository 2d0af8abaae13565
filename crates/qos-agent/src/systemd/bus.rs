//! The one call the actuator makes: `org.freedesktop.systemd1.Manager.SetUnitProperties(unit, runtime = true,
//! properties)` on the system bus, with a deadline. The connection is made on first use and dropped after a
//! failure, so a restarted D-Bus or systemd is reconnected to on the next call.

use std::time::Duration;

use zbus::zvariant::Value;

use super::mapping::UnitIoWeights;
use super::unit::UnitName;

/// How long one call may take before it counts as failed (retried next round).
pub const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// A failed call to systemd.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BusError {
    /// No connection to the system bus.
    #[error("cannot connect to the system bus: {0}")]
    Connect(String),
    /// systemd has no such unit (it stopped, or the cgroup is not a unit after all).
    #[error("systemd has no unit {0}")]
    NoSuchUnit(UnitName),
    /// systemd refused or the call failed.
    #[error("SetUnitProperties {unit} {what}: {detail}")]
    Call {
        /// The unit.
        unit: UnitName,
        /// The properties sent.
        what: String,
        /// systemd's answer.
        detail: String,
    },
    /// No answer within [`CALL_TIMEOUT`].
    #[error("SetUnitProperties {0}: no answer within {CALL_TIMEOUT:?}")]
    Timeout(UnitName),
}

/// `IOWeight` as systemd reports an unset one (`CGROUP_WEIGHT_INVALID`); sending it resets the property.
pub const IO_WEIGHT_UNSET: u64 = u64::MAX;

/// A unit's I/O weight properties as systemd has them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnitIoProperties {
    /// `IOWeight`; [`IO_WEIGHT_UNSET`] when not set.
    pub io_weight: u64,
    /// `IODeviceWeight` entries.
    pub device_weights: Vec<(String, u64)>,
}

/// A client of systemd's manager on the system bus.
#[derive(Debug, Default)]
pub struct SystemdBus {
    conn: Option<zbus::Connection>,
}

impl SystemdBus {
    /// A client that connects on first use.
    pub fn new() -> Self {
        Self::default()
    }

    async fn connection(&mut self) -> Result<zbus::Connection, BusError> {
        if let Some(c) = &self.conn {
            return Ok(c.clone());
        }
        let c = tokio::time::timeout(CALL_TIMEOUT, zbus::Connection::system())
            .await
            .map_err(|_| BusError::Connect(format!("no connection within {CALL_TIMEOUT:?}")))?
            .map_err(|e| BusError::Connect(e.to_string()))?;
        self.conn = Some(c.clone());
        Ok(c)
    }

    /// The unit's `IOWeight` and `IODeviceWeight` now (`GetUnit`, then the unit type's interface properties).
    pub async fn io_properties(&mut self, unit: &UnitName) -> Result<UnitIoProperties, BusError> {
        let conn = self.connection().await?;
        let failed = |what: &str, e: String| BusError::Call { unit: unit.clone(), what: what.into(), detail: e };
        let iface = match unit.as_str().rsplit('.').next() {
            Some("scope") => "org.freedesktop.systemd1.Scope",
            Some("slice") => "org.freedesktop.systemd1.Slice",
            _ => "org.freedesktop.systemd1.Service",
        };
        let body = (unit.as_str(),);
        let get_unit = conn.call_method(
            Some("org.freedesktop.systemd1"),
            "/org/freedesktop/systemd1",
            Some("org.freedesktop.systemd1.Manager"),
            "GetUnit",
            &body,
        );
        let reply = match tokio::time::timeout(CALL_TIMEOUT, get_unit).await {
            Err(_) => return Err(BusError::Timeout(unit.clone())),
            Ok(Err(zbus::Error::MethodError(name, _, _))) if name.as_str() == "org.freedesktop.systemd1.NoSuchUnit" => {
                return Err(BusError::NoSuchUnit(unit.clone()))
            }
            Ok(r) => r.map_err(|e| failed("GetUnit", e.to_string()))?,
        };
        let path: zbus::zvariant::OwnedObjectPath =
            reply.body().deserialize().map_err(|e| failed("GetUnit", e.to_string()))?;
        let get = async |prop: &str| -> Result<zbus::zvariant::OwnedValue, BusError> {
            let body = (iface, prop);
            let call = conn.call_method(
                Some("org.freedesktop.systemd1"),
                path.as_str(),
                Some("org.freedesktop.DBus.Properties"),
                "Get",
                &body,
            );
            let reply = tokio::time::timeout(CALL_TIMEOUT, call)
                .await
                .map_err(|_| BusError::Timeout(unit.clone()))?
                .map_err(|e| failed(prop, e.to_string()))?;
            reply.body().deserialize::<zbus::zvariant::OwnedValue>().map_err(|e| failed(prop, e.to_string()))
        };
        let io_weight = u64::try_from(get("IOWeight").await?).map_err(|e| failed("IOWeight", e.to_string()))?;
        let device_weights = <Vec<(String, u64)>>::try_from(get("IODeviceWeight").await?)
            .map_err(|e| failed("IODeviceWeight", e.to_string()))?;
        Ok(UnitIoProperties { io_weight, device_weights })
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
        let conn = self.connection().await?;
        let mut props: Vec<(&str, Value<'_>)> = vec![("IOWeight", Value::U64(weights.io_weight))];
        if empty_list_too || !weights.device_weights.is_empty() {
            props.push(("IODeviceWeight", Value::from(weights.device_weights.clone())));
        }
        let body = (unit.as_str(), true, props);
        let call = conn.call_method(
            Some("org.freedesktop.systemd1"),
            "/org/freedesktop/systemd1",
            Some("org.freedesktop.systemd1.Manager"),
            "SetUnitProperties",
            &body,
        );
        let answer = match tokio::time::timeout(CALL_TIMEOUT, call).await {
            Ok(answer) => answer,
            Err(_) => {
                self.conn = None;
                return Err(BusError::Timeout(unit.clone()));
            }
        };
        match answer {
            Ok(_) => Ok(()),
            Err(zbus::Error::MethodError(name, _, _)) if name.as_str() == "org.freedesktop.systemd1.NoSuchUnit" => {
                Err(BusError::NoSuchUnit(unit.clone()))
            }
            Err(e) => {
                // A broken connection is made anew next time; a refusal costs one reconnect, nothing more.
                self.conn = None;
                Err(BusError::Call {
                    unit: unit.clone(),
                    what: format!("IOWeight={} IODeviceWeight={:?}", weights.io_weight, weights.device_weights),
                    detail: e.to_string(),
                })
            }
        }
    }
}
