//! What goes in and out of the [`Reconciler`](super::Reconciler) besides ids and weights: how an original is known,
//! the actions and reports it emits, and the shutdown summary.

use qos_core::{ContainerId, Weight, WeightChange};

use crate::backend::{AppliedVia, BackendError};
use crate::state::StateError;

/// What is known of a container's original weight when it starts being tracked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Original {
    /// Recorded in the state file by an earlier agent: it wins over the cgroup file, which may hold that agent's
    /// stale decision.
    OnFile(Weight),
    /// Read from the cgroup file at discovery.
    Read(Weight),
    /// The read at discovery failed: read again before the first write.
    Unknown,
}

/// How a container is to be treated, as far as restoring goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tracking {
    /// Managed or pinned: the engine's decisions follow.
    Follow,
    /// Excluded by label: never written, except that an original on file is put back.
    Excluded,
}

/// What a driver must do, or hear about.
#[derive(Debug)]
pub enum Output {
    /// Read the container's weight from its cgroup; answer with [`Reconciler::handle_read_result`](super::Reconciler::handle_read_result).
    ReadWeight {
        /// The container.
        id: ContainerId,
    },
    /// Record these originals in the state file and write it, in one save (before the writes that need them);
    /// answer with [`Reconciler::handle_save_result`](super::Reconciler::handle_save_result). While saves are held
    /// the list may be empty: the file is written anyway, to learn whether saving works again.
    SaveOriginals(Vec<(ContainerId, Weight)>),
    /// Write and verify a weight; answer with [`Reconciler::handle_write_result`](super::Reconciler::handle_write_result).
    Write {
        /// The container.
        id: ContainerId,
        /// The weight.
        weight: Weight,
    },
    /// Put the container's original weight back and verify it; answer with
    /// [`Reconciler::handle_write_result`](super::Reconciler::handle_write_result). Its own action, not a
    /// [`Output::Write`] of the original's value: a writer may put back more than a value (cgroup v2: per-device
    /// overrides), and a weight pinned at the original's value is a write like any other.
    Restore {
        /// The container.
        id: ContainerId,
        /// Its original weight.
        weight: Weight,
    },
    /// Put the original weight back into the configuration of a container that stopped (its cgroup is gone), which
    /// the writer keeps beyond the cgroup (`WeightWriter::restore_exited`), and verify it there; answer with
    /// [`Reconciler::handle_write_result`](super::Reconciler::handle_write_result). An error for which
    /// `BackendError::is_vanished` holds means the runtime no longer knows the container.
    RestoreExited {
        /// The container.
        id: ContainerId,
        /// Its original weight.
        weight: Weight,
    },
    /// Drop these containers from the state file, in one save.
    ForgetOriginals(Vec<ContainerId>),
    /// Something worth a log line or a metric.
    Report(Report),
}

/// How a decision took effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Effect {
    /// Written and verified, by this path.
    Applied(AppliedVia),
    /// The file already held the weight.
    Unchanged,
    /// Dry run: decided, not written.
    DryRun,
}

impl Effect {
    /// The `via` of the decision's log line: `docker`, `files`, `systemd`, `unchanged` or `dry-run`.
    pub fn as_str(self) -> &'static str {
        match self {
            Effect::Applied(via) => via.as_str(),
            Effect::Unchanged => "unchanged",
            Effect::DryRun => "dry-run",
        }
    }
}

/// Which step of applying a weight failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailedStep {
    /// Reading the original (needed before any write).
    ReadOriginal,
    /// Writing the weight.
    Write,
    /// Putting the original back into the configuration of a container that stopped ([`Output::RestoreExited`]).
    RestoreExited,
}

/// A fact for the driver's logs and metrics.
#[derive(Debug)]
#[non_exhaustive]
pub enum Report {
    /// An engine decision took effect.
    Decision {
        /// The decision (levels 0-based).
        change: WeightChange,
        /// The weight before: the verified one, or else the original.
        old_weight: Option<Weight>,
        /// The weight now.
        weight: Weight,
        /// How.
        effect: Effect,
    },
    /// A weight was written and verified (any write, restores included).
    Written {
        /// The container.
        id: ContainerId,
        /// The weight now in the file.
        weight: Weight,
        /// The path that delivered it.
        via: AppliedVia,
    },
    /// Reading the original or writing a weight failed; retried on the next round. Sent on every failure (each is
    /// a `write_failures` count); `first` is set on the first since the last success (the one to log).
    ApplyFailed {
        /// The container.
        id: ContainerId,
        /// The weight that could not be applied.
        weight: Weight,
        /// Which step failed.
        step: FailedStep,
        /// The first failure since the container's last successful write.
        first: bool,
        /// Why.
        error: BackendError,
    },
    /// A re-verify found another weight in the file than the one verified there: it is written again.
    ChangedOutside {
        /// The container.
        id: ContainerId,
        /// What the agent had verified.
        want: Weight,
        /// What the file holds now.
        have: Weight,
    },
    /// A container still being set up by its runtime had its weight put back by the runtime's manager (systemd
    /// re-applying a unit's values): it is written again.
    PutBackWhileStarting {
        /// The container.
        id: ContainerId,
        /// What the agent had verified.
        want: Weight,
        /// What the file holds now.
        have: Weight,
    },
    /// A re-verify read failed; it is tried again on the next round.
    ReverifyFailed {
        /// The container.
        id: ContainerId,
        /// Why.
        error: BackendError,
    },
    /// An original weight is back in the cgroup file and forgotten from the state file.
    OriginalRestored {
        /// The container.
        id: ContainerId,
        /// The original weight.
        weight: Weight,
    },
    /// A restore at shutdown (or on entering dry run) failed: the original stays on file for the next agent.
    RestoreFailed {
        /// The container.
        id: ContainerId,
        /// The original weight.
        weight: Weight,
        /// Why.
        error: BackendError,
    },
    /// The state file could not be saved: weight changes are held (originals the agent changed are put back,
    /// nothing else is written) until a save works. Sent on every failed save; `first` on the one that started it.
    SaveFailed {
        /// Why.
        error: StateError,
        /// The failure that started the hold (the one to log).
        first: bool,
    },
    /// A save worked again after [`Report::SaveFailed`]: weights are written again.
    SavesResumed,
    /// Every restore of a shutdown (or of entering dry run) is done.
    RestoresFinished(Summary),
    /// The container's counters cannot be read; sent on the first failure since the last good sample.
    SampleFailed {
        /// The container.
        id: ContainerId,
        /// Why.
        error: BackendError,
    },
    /// The container's cgroup vanished during a read or write: it stopped, and is no longer followed here; the
    /// driver drops it too (its state-file entry is forgotten by an [`Output::ForgetOriginals`] before this, or,
    /// with a persisting writer, once its original is back in its configuration, see
    /// [`Reconciler::handle_exited`](super::Reconciler::handle_exited)).
    Gone {
        /// The container.
        id: ContainerId,
    },
}

/// What a shutdown restored.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Summary {
    /// Containers whose original weight was restored at shutdown.
    pub restored: usize,
    /// Restores that failed (logged).
    pub restore_failures: usize,
}
