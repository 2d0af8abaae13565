//! The bench's session scheduled as the agent's own is under systemd.
//!
//! The agent gives its session's scheduling group (the kernel's autogroup) its own nice value where it leads its
//! session, as every systemd service does (`qos_agent::priority::apply_autogroup`): on a kernel that groups
//! sessions a thread's nice value weighs only inside its session. The bench embeds the agent in its own process,
//! which does not lead its session (the caller's shell does), so there the agent leaves the group alone; the bench
//! sets its session's group to the agent's nice value itself for the run and puts the old value back at its end
//! (Ctrl-C too). Otherwise a busy host would measure an agent whose session runs at nice 0, as no service of it
//! does. The group also holds the bench's own threads (its reaction observer at nice -20 among them, which competes
//! with the agent rather than helps it) and the `docker` CLI processes it starts; the daemons that do the work of a
//! container start (dockerd, containerd, runc) run in dockerd's session (`scripts/setup-host.sh` starts it with
//! setsid), and the readers and the background in their containers' CPU cgroups, where no session group counts.

use anyhow::Result;
use qos_agent::priority::{self, SessionGroup};

use crate::cleanup::Cleanup;

/// Sets the session's group to `nice` for the run (undone by `cleanup`); what was done, for the report's notes.
pub fn give_the_agents_nice(nice: i8, cleanup: &'static Cleanup) -> Result<String> {
    match priority::set_autogroup_nice(nice) {
        Ok(SessionGroup::Off) => {
            Ok("the kernel does not group sessions (no autogroup): the agent's nice value acts host-wide".into())
        }
        Ok(SessionGroup::Root) => Ok("the bench runs in the kernel's root scheduling group (init's session, no \
                                      group of its own): the agent's nice value acts host-wide"
            .into()),
        Ok(SessionGroup::Nice(before)) if before == i32::from(nice) => {
            Ok(format!("the bench's session group (autogroup) was already at the agent's nice {nice}"))
        }
        Ok(SessionGroup::Nice(before)) => {
            // Back to a higher value needs no privilege; back to a lower one needs what set this one.
            let back = i8::try_from(before).unwrap_or(0);
            cleanup.push(format!("put the session's autogroup back to nice {before}"), move || {
                priority::set_autogroup_nice(back).map(drop).map_err(anyhow::Error::from)
            });
            Ok(format!(
                "the bench's session group (autogroup) at the agent's nice {nice} for the run (was {before}), as a \
                 systemd service's own session is under the agent"
            ))
        }
        Err(e) => {
            tracing::warn!(error = %e, "the agent's session keeps its group's priority: on a busy host the agent waits \
                                       for a CPU like any nice-0 process");
            Ok(format!("the bench's session group (autogroup) could not be set to the agent's nice {nice}: {e}"))
        }
    }
}
