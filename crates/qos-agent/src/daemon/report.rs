//! The reconciler's reports as log lines and metrics: the only place the daemon's per-container log lines about
//! weights are worded. Levels in log lines are shown with [`display_level`].

use tracing::{debug, error, info, warn};

use super::{display_level, Daemon};
use crate::backend::{CounterSource, Discovery, WeightWriter};
use crate::daemon::reconcile::{FailedStep, Report};

impl<D: Discovery, C: CounterSource, W: WeightWriter> Daemon<D, C, W> {
    /// Turns a reconciler report into log lines and metrics.
    pub(super) fn report(&mut self, report: Report) {
        match report {
            Report::Decision { change, old_weight, weight, effect } => info!(
                container = %change.id.short(),
                name = %self.name_of(&change.id),
                reason = change.reason.as_str(),
                old_level = change.old_level.map(display_level),
                new_level = change.new_level.map(display_level),
                old_weight = old_weight.map(qos_core::Weight::get),
                weight = weight.get(),
                bytes = change.bytes_at_old_level,
                via = effect.as_str(),
                "weight decision"
            ),
            Report::Written { id, weight, via } => {
                if let Some(t) = self.tracked.get(&id) {
                    self.metrics.weight.get_or_create(&t.labels).set(weight.get().into());
                }
                self.actuator.in_use = Some(via);
            }
            Report::ApplyFailed { id, weight, step, first, error } => {
                self.metrics.write_failures.inc();
                if first {
                    let name = self.name_of(&id);
                    match step {
                        FailedStep::Write => error!(container = %id.short(), %name, weight = weight.get(),
                            error = %error, "cannot apply weight; will retry every round"),
                        FailedStep::ReadOriginal => error!(container = %id.short(), %name, weight = weight.get(),
                            error = %error, "cannot read the current weight, so it could not be restored: not \
                            changing it; will retry every round"),
                        FailedStep::RestoreExited => error!(container = %id.short(), %name, weight = weight.get(),
                            error = %error, "cannot put the original weight back into the configuration of a \
                            container that stopped (it would start again with the agent's weight): keeping the \
                            original on file; will retry every round"),
                    }
                }
            }
            Report::ChangedOutside { id, want, have } => warn!(container = %id.short(),
                name = %self.name_of(&id), want = want.get(), have = have.get(),
                "weight changed outside the agent; writing it again"),
            Report::PutBackWhileStarting { id, want, have } => debug!(container = %id.short(),
                name = %self.name_of(&id), want = want.get(), have = have.get(),
                "weight put back by the runtime while it set the container up; writing it again"),
            Report::ReverifyFailed { id, error } => {
                debug!(container = %id.short(), error = %error, "cannot re-verify weight")
            }
            Report::OriginalRestored { id, weight } => info!(container = %id.short(),
                name = %self.name_of(&id), weight = weight.get(), "original weight restored"),
            Report::RestoreFailed { id, weight, error } => error!(container = %id.short(),
                name = %self.name_of(&id), weight = weight.get(), error = %error,
                "cannot restore original weight"),
            Report::RestoresFinished(summary) => self.restores = Some(summary),
            Report::SampleFailed { id, error } => warn!(container = %id.short(),
                name = %self.name_of(&id), error = %error,
                "cannot read I/O counters; skipping this container until they read again"),
            Report::Gone { id } => self.drop_tracked(&id),
            Report::SaveFailed { error, first } => {
                if first {
                    error!(error = %error, "cannot save the state file: no weight is changed until it can be saved \
                        (no weight is written whose original is not on file); putting back the originals the agent \
                        changed; trying again every round")
                } else {
                    debug!(error = %error, "state file still cannot be saved")
                }
            }
            Report::SavesResumed => info!("state file saved again: changing weights again"),
        }
    }
}
