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

    /// Sets `IOWeight` and (when there are entries) `IODeviceWeight` of `unit` for this boot (runtime = true:
    /// nothing is written under /etc, and systemd keeps them over reloads).
    pub async fn set_io_weights(&mut self, unit: &UnitName, weights: &UnitIoWeights) -> Result<(), BusError> {
        let conn = self.connection().await?;
        let mut props: Vec<(&str, Value<'_>)> = vec![("IOWeight", Value::U64(weights.io_weight))];
        if !weights.device_weights.is_empty() {
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
