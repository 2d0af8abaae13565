//! Operating the agent: what an operator and the host talk to, apart from the loop.
//!
//! - [`preflight`]: the checks `run` and `check-config` share before anything starts;
//! - [`control`]: the status socket (`ddiskqos-agent status`) and its rendering;
//! - [`metrics`]: the Prometheus registry;
//! - [`http`]: the HTTP endpoint on `[metrics] listen` (hyper): `/metrics`, `/readyz`, `/healthz`;
//! - `readiness.rs`: [`Readiness`], what `/readyz` answers (the runtime, the checked devices);
//! - [`limits`]: the bounds on those connections and the descriptor limit.

pub mod control;
pub mod http;
pub mod limits;
pub mod metrics;
pub mod preflight;
pub(crate) mod readiness;

pub use readiness::{CheckedDevice, Readiness, ReadinessReport};
