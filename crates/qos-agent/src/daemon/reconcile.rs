//! [`Reconciler`]: the rules that get the engine's decisions into the cgroup files and the original weights back
//! out, as a synchronous state machine in the engine's handle/poll shape. The daemon does the I/O; this decides it.
//!
//! Per container it keeps the original weight (known, or not read yet), whether that original is on file (the state
//! file a restarted agent restores from), the desired weight (`None`: leave the original, or put it back), the
//! weight verified in the cgroup file, the engine decision waiting to take effect (for its log line), and the
//! log-once flags. Its rules:
//! - no weight is written before the container's original is known (read first, retried every round) and on file
//!   (one [`Output::SaveOriginals`] for everything a batch of decisions is about to write, *before* the first of
//!   those writes, so a SIGKILL right after a write still leaves the original on file);
//! - a failed read or write is retried on the next round ([`Reconciler::handle_round`]) and reported once per
//!   container until one works again ([`Report::ApplyFailed`] says which failure is the first); a failed sample
//!   likewise ([`Report::SampleFailed`]);
//! - a vanished cgroup is a container that stopped ([`Report::Gone`], and the next rule);
//! - a container that stopped ([`Reconciler::handle_exited`]) is dropped and its original forgotten, as a removed one
//!   ([`Reconciler::handle_removed`]) is: its cgroup, and every weight the agent wrote there, is gone. Not so with a
//!   writer whose weights outlive the cgroup ([`Reconciler::with_persisting_writer`]: Docker's API keeps them in the
//!   stopped container's configuration, which gives them to it again at its next start): a stopped container the
//!   agent (or a crashed agent, its original on file) may have changed gets its original put back there
//!   ([`Output::RestoreExited`], verified by the writer in that configuration, its files being gone), then
//!   forgotten; the runtime no longer knowing the container (removed) forgets it too; a restore that fails keeps
//!   the original on file and is retried every round (reported like a failed write), at shutdown and on entering
//!   dry run with the other restores. Until then the container waits, untracked by the engine; started again, it is
//!   tracked afresh with the original known here (its cgroup holds what its configuration gave it). Originals on
//!   file of containers not running when the agent starts ([`Reconciler::handle_leftovers`]) are such containers
//!   with a persisting writer, and forgotten otherwise;
//! - a released container gets its original back only if the agent wrote something; an excluded container whose
//!   original is on file (a previous agent changed it) gets it back whatever the file holds; a restore that fails
//!   keeps the original wanted, retried and on file;
//! - putting an original back is its own action ([`Output::Restore`]), owed whenever the agent wrote, even a weight
//!   equal to the original (on cgroup v2 that write set every governed device, the original's files may have had
//!   other per-device values); a decision for the original's value is an [`Output::Write`];
//! - dry run decides but writes nothing: entering it first puts back every original the agent changed, and
//!   entering or leaving it forgets what is "applied" so everything is decided or written afresh;
//! - shutdown puts back every original the agent changed and forgets them from the file in one save, then reports
//!   a [`Summary`];
//! - no weight is ever written whose original is not *saved*: a save that fails ([`Reconciler::handle_save_result`])
//!   holds every change ([`Report::SaveFailed`], `first` once): the agent puts back every original it changed (a
//!   write of the original needs no save), writes nothing else, tries the save again every round, and once one
//!   works ([`Report::SavesResumed`]) writes what the engine wants again.
//!
//! Methods come in three groups:
//! - getters: [`Reconciler::applied`], [`Reconciler::original`], [`Reconciler::is_tracked`], [`Reconciler::is_exited`],
//!   [`Reconciler::len`], [`Reconciler::dry_run`], [`Reconciler::is_shut_down`];
//! - inputs: [`Reconciler::handle_tracked`], [`Reconciler::handle_decisions`], [`Reconciler::handle_round`],
//!   [`Reconciler::handle_read_result`], [`Reconciler::handle_write_result`], [`Reconciler::handle_updated`],
//!   [`Reconciler::handle_save_result`], [`Reconciler::handle_sample_ok`], [`Reconciler::handle_sample_failed`],
//!   [`Reconciler::handle_removed`], [`Reconciler::handle_exited`], [`Reconciler::handle_leftovers`],
//!   [`Reconciler::handle_reload`], [`Reconciler::handle_shutdown`];
//! - output: [`Reconciler::poll_output`].
//!
//! The rule for drivers: after every input (or a run of inputs given back to back, as a round gives its decisions
//! and then [`Reconciler::handle_round`]), call [`Reconciler::poll_output`] until it returns `None`. Carry out
//! each action as it comes; a [`Output::ReadWeight`], [`Output::Write`], [`Output::Restore`],
//! [`Output::RestoreExited`] or [`Output::SaveOriginals`] must have its
//! result fed back ([`Reconciler::handle_read_result`], [`Reconciler::handle_write_result`],
//! [`Reconciler::handle_save_result`]) before the next poll (at most one is outstanding: until its result arrives,
//! `poll_output` returns `None`). [`Output::ForgetOriginals`] needs no answer: an original left on file by a failed
//! forget is the weight the container has anyway. [`Output::Report`]s are data for logs and metrics.
//!
//! No input takes `now`: there are no timers here. Retries ride on the sampling round, which the driver reports
//! with [`Reconciler::handle_round`]. No I/O, no clock, no logging: everything worth saying is a [`Report`].

mod protocol;

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Instant;

use qos_core::{ContainerId, Reason, Weight, WeightChange};

use crate::backend::{AppliedVia, BackendError};
use crate::state::StateError;

pub use protocol::{Effect, FailedStep, Original, Output, Report, Summary, Tracking};

/// What the reconciler keeps of one container.
#[derive(Debug)]
struct Entry {
    /// The weight before the agent first wrote one.
    original: Option<Weight>,
    /// `original` is in the state file (saved, or found there).
    on_file: bool,
    /// What the engine wants; `None` = leave the original (or, with `restoring`, it is being put back).
    desired: Option<Weight>,
    /// Verified in the cgroup file (in dry run: decided).
    applied: Option<Weight>,
    /// `desired` is the original being put back; once verified, it is forgotten from the file.
    restoring: bool,
    /// The cgroup file may hold a weight the agent wrote (this agent, or a crashed one whose original is on file):
    /// releasing, entering dry run and shutdown owe it its original.
    changed_by_agent: bool,
    /// The decision waiting to take effect, for its report.
    pending: Option<WeightChange>,
    /// In `dirty`, waiting for its read or write.
    queued: bool,
    /// A read or write failed: waits for the next round.
    blocked: bool,
    /// A failed read or write was reported as the first since the last success.
    apply_failure_reported: bool,
    /// A failed sample was reported as the first since the last good one.
    sample_failure_reported: bool,
    /// The verified weight is to be written again, the writer's own way now that the runtime settled the
    /// container (`handle_settled`); not a new decision.
    rewrite: bool,
    /// While its runtime set it up, the runtime's manager put its weight back once (runc sets a scope's unit
    /// properties once, in `runc create`): it is not checked again until it settles.
    put_back_while_starting: bool,
    /// The container stopped (its cgroup is gone) and the persisting writer's configuration of it may hold a
    /// weight the agent wrote: only its original's restore there is left (`desired`, `restoring`), then it goes.
    exited: bool,
}

impl Entry {
    fn new(original: Original) -> Self {
        let (original, on_file) = match original {
            // An earlier agent recorded it, so that agent changed the weight.
            Original::OnFile(w) => (Some(w), true),
            Original::Read(w) => (Some(w), false),
            Original::Unknown => (None, false),
        };
        Self {
            original,
            on_file,
            desired: None,
            applied: None,
            restoring: false,
            changed_by_agent: on_file,
            pending: None,
            queued: false,
            blocked: false,
            apply_failure_reported: false,
            sample_failure_reported: false,
            rewrite: false,
            put_back_while_starting: false,
            exited: false,
        }
    }

    /// A write is needed: something is desired and not verified.
    fn wants_write(&self) -> bool {
        self.desired.is_some() && (self.desired != self.applied || self.rewrite)
    }

    /// While saves are held: the original, if the agent (or a crashed one) wrote the file since it was last put
    /// back, whatever value it wrote.
    fn held_restore(&self) -> Option<Weight> {
        let original = self.original?;
        self.changed_by_agent.then_some(original)
    }
}

/// The read or write the driver is carrying out.
#[derive(Debug, Clone)]
enum InFlight {
    ReadOriginal(ContainerId),
    Reverify(ContainerId, Weight),
    Write(ContainerId, Weight),
    /// A write of a restore batch (shutdown, entering dry run).
    BatchRestore(ContainerId, Weight),
    /// Saves are failing: the original put back.
    HeldRestore(ContainerId, Weight),
    /// The original put back into the configuration of a container that stopped.
    ExitRestore(ContainerId, Weight),
    /// A save of these originals.
    Save(Vec<ContainerId>),
}

impl InFlight {
    fn id(&self) -> Option<&ContainerId> {
        match self {
            InFlight::ReadOriginal(id)
            | InFlight::Reverify(id, _)
            | InFlight::Write(id, _)
            | InFlight::BatchRestore(id, _)
            | InFlight::HeldRestore(id, _)
            | InFlight::ExitRestore(id, _) => Some(id),
            InFlight::Save(_) => None,
        }
    }
}

/// Restores of a shutdown or of entering dry run, forgotten from the file in one save at the end.
#[derive(Debug, Default)]
struct RestoreBatch {
    queue: VecDeque<(ContainerId, Weight)>,
    done: Vec<ContainerId>,
    summary: Summary,
}

/// The reconciler. See the module documentation for the calling rules.
#[derive(Debug, Default)]
pub struct Reconciler {
    entries: BTreeMap<ContainerId, Entry>,
    dry_run: bool,
    shut_down: bool,
    in_flight: Option<InFlight>,
    /// Reports and state-file actions, in order.
    out: VecDeque<Output>,
    /// Containers to re-verify (`Updated`).
    reverify: VecDeque<ContainerId>,
    /// Containers whose re-verify read failed: tried again on the next round.
    reverify_next_round: Vec<ContainerId>,
    /// Those of `reverify` checked because their runtime is still setting them up (`handle_still_starting`): a
    /// weight found moved is the runtime's doing, expected, and reported as such.
    starting_checks: BTreeSet<ContainerId>,
    /// Settled containers, each written again at the first round at or after its time (`handle_settled`).
    settled: Vec<(ContainerId, Instant)>,
    /// Containers about to be written whose original is not on file yet.
    unsaved: Vec<ContainerId>,
    /// Containers whose desired weight is not applied, in the order they became so.
    dirty: VecDeque<ContainerId>,
    /// Containers whose read or write failed this round.
    blocked: Vec<ContainerId>,
    batch: Option<RestoreBatch>,
    /// Containers with `sample_failure_reported` set.
    sample_failures_reported: usize,
    /// The last save failed: nothing but originals is written until one works again.
    held: bool,
    /// While held: a save is tried again (set every round).
    retry_save: bool,
    /// The writer's weights outlive the cgroup: a container that stops gets its original back (see the module doc).
    persisting: bool,
}

impl Reconciler {
    /// An empty reconciler; `dry_run` as configured at start.
    pub fn new(dry_run: bool) -> Self {
        Self { dry_run, ..Self::default() }
    }

    /// Says whether the writer's weights outlive the container's cgroup (`WeightWriter::persists`): then a
    /// container that stops gets its original put back ([`Reconciler::handle_exited`]).
    pub fn with_persisting_writer(mut self, persisting: bool) -> Self {
        self.persisting = persisting;
        self
    }

    // ----- getters -----

    /// The weight verified in the container's cgroup file (in dry run: decided), if any.
    pub fn applied(&self, id: &ContainerId) -> Option<Weight> {
        self.entries.get(id).and_then(|e| e.applied)
    }

    /// The container's original weight, if known.
    pub fn original(&self, id: &ContainerId) -> Option<Weight> {
        self.entries.get(id).and_then(|e| e.original)
    }

    /// Whether the container is tracked (a stopped one waiting for its original's restore is).
    pub fn is_tracked(&self, id: &ContainerId) -> bool {
        self.entries.contains_key(id)
    }

    /// Whether the container stopped and waits for its original's restore ([`Reconciler::handle_exited`]).
    pub fn is_exited(&self, id: &ContainerId) -> bool {
        self.entries.get(id).is_some_and(|e| e.exited)
    }

    /// Containers tracked (stopped ones waiting for their original's restore included).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no container is tracked.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Whether writes are suppressed.
    pub fn dry_run(&self) -> bool {
        self.dry_run
    }

    /// Whether the last save failed, so that weight changes are held (see the module documentation).
    pub fn saves_held(&self) -> bool {
        self.held
    }

    /// Whether [`Reconciler::handle_shutdown`] was called (every later input is ignored).
    pub fn is_shut_down(&self) -> bool {
        self.shut_down
    }

    // ----- inputs -----

    /// A container starts being tracked (ignored if it already is). An excluded one whose original is on file
    /// gets that original back. One that stopped and still waits for its original's restore started again: it is
    /// tracked afresh, but with the original known here, whatever `original` says (its files hold what its
    /// configuration gave it, maybe the agent's weight), and as changed by the agent.
    pub fn handle_tracked(&mut self, id: &ContainerId, original: Original, tracking: Tracking) {
        if self.shut_down || self.entries.get(id).is_some_and(|e| !e.exited) {
            return;
        }
        let mut entry = Entry::new(original);
        if let Some(old) = self.entries.remove(id) {
            (entry.original, entry.on_file, entry.changed_by_agent) = (old.original, old.on_file, true);
            entry.queued = old.queued; // it may be in `dirty` still
        }
        self.entries.insert(id.clone(), entry);
        if tracking == Tracking::Excluded && matches!(original, Original::OnFile(_)) {
            self.start_restore(id, true);
        }
    }

    /// A batch of engine decisions (everything one drain of the engine gave): one save covers all their writes.
    /// Decisions for untracked containers are ignored.
    pub fn handle_decisions(&mut self, changes: impl IntoIterator<Item = WeightChange>) {
        if self.shut_down {
            return;
        }
        for change in changes {
            let id = change.id.clone();
            let Some(e) = self.entries.get_mut(&id).filter(|e| !e.exited) else { continue };
            match change.weight {
                Some(weight) if change.reason != Reason::Released => {
                    e.restoring = false;
                    e.desired = Some(weight);
                    e.pending = Some(change);
                    if e.applied == Some(weight) {
                        let old = e.applied.or(e.original);
                        self.report_decision(&id, old, weight, Effect::Unchanged);
                    } else {
                        self.make_dirty(&id);
                    }
                }
                _ => {
                    e.pending = Some(change);
                    self.start_restore(&id, false);
                }
            }
        }
    }

    /// A sampling round happened: reads and writes that failed are tried again.
    /// `now` decides which settled containers are due for their rewrite.
    pub fn handle_round(&mut self, now: Instant) {
        if self.shut_down {
            return;
        }
        self.reverify.extend(self.reverify_next_round.drain(..));
        let (due, later): (Vec<_>, Vec<_>) =
            std::mem::take(&mut self.settled).into_iter().partition(|(_, at)| *at <= now);
        self.settled = later;
        for (id, _) in due {
            if self.entries.get(&id).is_some_and(|e| e.rewrite) {
                self.make_dirty(&id);
            }
        }
        self.retry_save = self.held;
        if self.held && !self.dry_run {
            // Anything still owed its original (a restore that failed, a container a crashed agent left changed
            // and tracked since) is put back.
            let owed: Vec<ContainerId> =
                self.entries.iter().filter(|(_, e)| e.held_restore().is_some()).map(|(i, _)| i.clone()).collect();
            for i in owed {
                self.make_dirty(&i);
            }
        }
        for id in std::mem::take(&mut self.blocked) {
            if self.entries.get(&id).is_some_and(|e| e.blocked) {
                self.make_dirty(&id);
            }
        }
    }

    /// The answer to an [`Output::ReadWeight`]. A result nobody asked for is ignored.
    pub fn handle_read_result(&mut self, id: &ContainerId, result: Result<Weight, BackendError>) {
        let in_flight = match &self.in_flight {
            Some(InFlight::ReadOriginal(i) | InFlight::Reverify(i, _)) if i == id => self.in_flight.take(),
            _ => return,
        };
        match (in_flight, result) {
            (_, Err(e)) if e.is_vanished() => self.gone(id),
            (Some(InFlight::ReadOriginal(_)), Ok(w)) => {
                let e = self.entries.get_mut(id).expect("in flight means tracked");
                e.original = Some(w);
                // Written next, straight after its save, as if the read had worked at discovery.
                if e.wants_write() && !e.queued {
                    e.queued = true;
                    self.dirty.push_front(id.clone());
                }
                self.note_unsaved(id);
            }
            (Some(InFlight::ReadOriginal(_)), Err(error)) => {
                let weight = self.entries[id].desired.expect("a read before a write means a weight is desired");
                self.failed(id, weight, FailedStep::ReadOriginal, error);
            }
            (Some(InFlight::Reverify(_, want)), Ok(have)) => {
                let starting = self.starting_checks.remove(id);
                if have != want {
                    let report = if starting {
                        if let Some(e) = self.entries.get_mut(id) {
                            e.put_back_while_starting = true;
                        }
                        Report::PutBackWhileStarting { id: id.clone(), want, have }
                    } else {
                        Report::ChangedOutside { id: id.clone(), want, have }
                    };
                    self.out.push_back(Output::Report(report));
                    let e = self.entries.get_mut(id).expect("in flight means tracked");
                    e.applied = None;
                    if e.desired.is_some() {
                        self.make_dirty(id);
                    }
                }
            }
            (Some(InFlight::Reverify(..)), Err(error)) => {
                // Tried again next round: the weight may well have been changed, that is why it is checked.
                self.starting_checks.remove(id);
                self.reverify_next_round.push(id.clone());
                self.out.push_back(Output::Report(Report::ReverifyFailed { id: id.clone(), error }));
            }
            _ => unreachable!("only reads are matched above"),
        }
    }

    /// The answer to an [`Output::Write`], an [`Output::Restore`] or an [`Output::RestoreExited`]. A result nobody
    /// asked for is ignored.
    pub fn handle_write_result(&mut self, id: &ContainerId, result: Result<AppliedVia, BackendError>) {
        let (weight, batch, held) = match self.in_flight {
            Some(InFlight::Write(ref i, w)) if i == id => (w, false, false),
            Some(InFlight::BatchRestore(ref i, w)) if i == id => (w, true, false),
            Some(InFlight::HeldRestore(ref i, w)) if i == id => (w, false, true),
            Some(InFlight::ExitRestore(ref i, w)) if i == id => {
                self.in_flight = None;
                return self.exit_restore_result(id, w, result);
            }
            _ => return,
        };
        self.in_flight = None;
        if self.persisting && result.is_err() {
            // Docker's API may have kept the weight in the container's configuration before the check after it
            // failed (or its answer was lost): from now on the agent owes the original there too.
            if let Some(e) = self.entries.get_mut(id) {
                e.changed_by_agent = true;
            }
        }
        if batch {
            return self.batch_write_result(id, weight, result);
        }
        if held {
            return self.held_write_result(id, weight, result);
        }
        match result {
            Ok(via) => {
                self.out.push_back(Output::Report(Report::Written { id: id.clone(), weight, via }));
                let e = self.entries.get_mut(id).expect("in flight means tracked");
                let old = e.applied.or(e.original);
                let rewritten = std::mem::take(&mut e.rewrite) && e.applied == Some(weight);
                e.applied = Some(weight);
                e.apply_failure_reported = false;
                e.changed_by_agent = true;
                if e.desired == Some(weight) && !rewritten {
                    self.report_decision(id, old, weight, Effect::Applied(via));
                    if self.entries[id].restoring {
                        self.finish_restore(id, weight);
                    }
                }
            }
            Err(e) if e.is_vanished() => self.gone(id),
            Err(error) => self.failed(id, weight, FailedStep::Write, error),
        }
    }

    /// The answer to an [`Output::SaveOriginals`]. A failure holds every weight change (the originals the agent
    /// changed are put back, nothing else is written) until a save works again; saves are tried again every round.
    pub fn handle_save_result(&mut self, result: Result<(), StateError>) {
        let Some(InFlight::Save(ids)) = self.in_flight.take_if(|f| matches!(f, InFlight::Save(_))) else { return };
        match result {
            Ok(()) => {
                if std::mem::replace(&mut self.held, false) {
                    self.out.push_back(Output::Report(Report::SavesResumed));
                    let wanting: Vec<ContainerId> =
                        self.entries.iter().filter(|(_, e)| e.wants_write()).map(|(i, _)| i.clone()).collect();
                    for i in wanting {
                        self.make_dirty(&i);
                    }
                }
            }
            Err(error) => {
                for i in &ids {
                    if let Some(e) = self.entries.get_mut(i) {
                        e.on_file = false;
                    }
                    self.unsaved.push(i.clone());
                }
                let first = !std::mem::replace(&mut self.held, true);
                self.out.push_back(Output::Report(Report::SaveFailed { error, first }));
                if first {
                    // Put back every original the agent changed: those writes need no save.
                    let owed: Vec<ContainerId> = self
                        .entries
                        .iter()
                        .filter(|(_, e)| e.held_restore().is_some())
                        .map(|(i, _)| i.clone())
                        .collect();
                    for i in owed {
                        self.make_dirty(&i);
                    }
                }
            }
        }
    }

    /// The container's configuration changed (`docker update`): the verified weight is read again, and written
    /// again if someone changed it. Nothing to check in dry run (nothing was written).
    pub fn handle_updated(&mut self, id: &ContainerId) {
        if self.shut_down || self.dry_run {
            return;
        }
        if self.entries.get(id).is_some_and(|e| e.applied.is_some()) {
            self.reverify.push_back(id.clone());
        }
    }

    /// A container announced early is still being set up by its runtime
    /// ([`crate::backend::DiscoveryEvent::StillStarting`]): its verified weight is read again, and written again
    /// if it moved (systemd puts a scope's files back at the unit's values when runc sets the unit's properties),
    /// reported as the runtime's doing rather than a change from outside. Once that happened the container is not
    /// checked again (runc sets a unit's properties once; each check is a read of its files).
    pub fn handle_still_starting(&mut self, id: &ContainerId) {
        if self.shut_down || self.dry_run {
            return;
        }
        let due = self.entries.get(id).is_some_and(|e| e.applied.is_some() && !e.queued && !e.put_back_while_starting);
        if due && !self.reverify.contains(id) {
            self.starting_checks.insert(id.clone());
            self.reverify.push_back(id.clone());
        }
    }

    /// The runtime finished starting a container announced early ([`crate::backend::DiscoveryEvent::Settled`]):
    /// its verified weight is written once more, at the first round at or after `rewrite_at` (the writer may now
    /// take its own way, e.g. a systemd unit's properties, where it wrote the files while the runtime set the
    /// cgroup up). The daemon passes the end of the container's entry window: systemd's work on the unit (its
    /// files written again, measured at 0.1-0.7 s of CPU under emulation) then does not coincide with the
    /// container's first reads, which the files already serve at the right weight. Not a decision: nothing is
    /// reported but the write. Nothing happens for a container with no verified weight (its first write takes the
    /// writer's way anyway), one being put back, or in dry run.
    pub fn handle_settled(&mut self, id: &ContainerId, rewrite_at: Instant) {
        if self.shut_down || self.dry_run || self.held {
            return;
        }
        let Some(e) = self.entries.get_mut(id) else { return };
        if e.restoring || e.applied.is_none() || e.desired != e.applied {
            return;
        }
        e.rewrite = true;
        self.settled.retain(|(i, _)| i != id);
        self.settled.push((id.clone(), rewrite_at));
    }

    /// The container's counters were read.
    pub fn handle_sample_ok(&mut self, id: &ContainerId) {
        // Called for every container every round: nothing to look up unless some failure is outstanding.
        if self.sample_failures_reported == 0 {
            return;
        }
        if let Some(e) = self.entries.get_mut(id) {
            if std::mem::replace(&mut e.sample_failure_reported, false) {
                self.sample_failures_reported -= 1;
            }
        }
    }

    /// The container's counters could not be read (not vanished: that is a removal).
    pub fn handle_sample_failed(&mut self, id: &ContainerId, error: BackendError) {
        let Some(e) = self.entries.get_mut(id) else { return };
        if !std::mem::replace(&mut e.sample_failure_reported, true) {
            self.sample_failures_reported += 1;
            self.out.push_back(Output::Report(Report::SampleFailed { id: id.clone(), error }));
        }
    }

    /// Containers that are gone: dropped, and forgotten from the state file in one save.
    pub fn handle_removed(&mut self, ids: &[ContainerId]) {
        if ids.is_empty() {
            return;
        }
        for id in ids {
            if self.in_flight.as_ref().and_then(InFlight::id) == Some(id) {
                self.in_flight = None; // its result, if it still comes, is for a container no longer here
            }
            if let Some(e) = self.entries.remove(id) {
                self.sample_failures_reported -= usize::from(e.sample_failure_reported);
            }
            self.starting_checks.remove(id);
        }
        self.out.push_back(Output::ForgetOriginals(ids.to_vec()));
    }

    /// Containers that stopped: their cgroups are gone, the containers may not be. Dropped and forgotten from the
    /// state file like removed ones ([`Reconciler::handle_removed`]), except, with a persisting writer, those the
    /// agent may have changed: each gets its original put back into its configuration ([`Output::RestoreExited`]),
    /// then is dropped and forgotten (see the module doc).
    pub fn handle_exited(&mut self, ids: &[ContainerId]) {
        let mut removed = Vec::new();
        for id in ids {
            let owed =
                self.persisting && !self.shut_down && self.entries.get(id).is_some_and(|e| e.held_restore().is_some());
            if !owed {
                removed.push(id.clone());
                continue;
            }
            if self.in_flight.as_ref().and_then(InFlight::id) == Some(id) {
                self.in_flight = None; // a result for the running container, if it still comes, is stale
            }
            self.starting_checks.remove(id);
            self.mark_exited(id);
        }
        self.handle_removed(&removed);
    }

    /// Originals on file of containers that are not running when the agent starts (an earlier agent recorded
    /// them; the caller leaves out those it tracks). Forgotten from the file in one save; with a persisting writer
    /// each is a container that stopped with that agent's weight maybe in its configuration, which gets its
    /// original put back there first ([`Reconciler::handle_exited`]).
    pub fn handle_leftovers(&mut self, originals: &[(ContainerId, Weight)]) {
        if self.shut_down {
            return;
        }
        let mut forget = Vec::new();
        for (id, original) in originals {
            if self.entries.contains_key(id) {
                continue;
            }
            if !self.persisting {
                forget.push(id.clone());
                continue;
            }
            self.entries.insert(id.clone(), Entry::new(Original::OnFile(*original)));
            self.mark_exited(id);
        }
        if !forget.is_empty() {
            self.out.push_back(Output::ForgetOriginals(forget));
        }
    }

    /// The configuration was reloaded. Entering dry run first puts back every original the agent changed (nothing
    /// written from now on could be restored at shutdown); entering or leaving it forgets what is applied, so
    /// every container's weight is decided (dry run) or written (leaving it) afresh.
    pub fn handle_reload(&mut self, dry_run: bool) {
        if self.shut_down || dry_run == self.dry_run {
            return;
        }
        if dry_run {
            self.start_batch();
        }
        self.dry_run = dry_run;
        let ids: Vec<ContainerId> = self.entries.keys().cloned().collect();
        for id in ids {
            let e = self.entries.get_mut(&id).expect("listed just now");
            e.applied = None;
            // A stopped container's restore is part of the batch too, but stays wanted until it works.
            if dry_run && e.restoring && !e.exited {
                // Its restore is part of the batch just started.
                e.restoring = false;
                e.desired = None;
                e.pending = None;
            }
            if e.desired.is_some() {
                self.make_dirty(&id);
            }
        }
    }

    /// The agent stops: every original it changed is put back (in dry run: nothing, nothing was written), then
    /// [`Report::RestoresFinished`] comes. Every later input is ignored.
    pub fn handle_shutdown(&mut self) {
        if self.shut_down {
            return;
        }
        self.shut_down = true;
        self.start_batch();
    }

    // ----- output -----

    /// The next action or report. Drain until `None` after every input; see the module documentation.
    pub fn poll_output(&mut self) -> Option<Output> {
        loop {
            if self.in_flight.is_some() {
                return None;
            }
            if let Some(o) = self.out.pop_front() {
                return Some(o);
            }
            if let Some(batch) = &mut self.batch {
                if let Some((id, weight)) = batch.queue.pop_front() {
                    if let Some(e) = self.entries.get(&id) {
                        self.in_flight = Some(InFlight::BatchRestore(id.clone(), weight));
                        if e.exited {
                            return Some(Output::RestoreExited { id, weight });
                        }
                        return Some(Output::Restore { id, weight });
                    }
                    continue;
                }
                self.finish_batch();
                continue;
            }
            if self.shut_down {
                return None;
            }
            if let Some(id) = self.reverify.pop_front() {
                if let Some(want) = self.entries.get(&id).and_then(|e| e.applied).filter(|_| !self.dry_run) {
                    self.in_flight = Some(InFlight::Reverify(id.clone(), want));
                    return Some(Output::ReadWeight { id });
                }
                continue;
            }
            if let Some(save) = self.take_unsaved() {
                return Some(save);
            }
            let id = self.dirty.pop_front()?;
            let Some(e) = self.entries.get_mut(&id) else { continue };
            e.queued = false;
            if e.exited {
                // Only its original is owed, which needs no save (it is on file, or was read and is written back
                // as it was); in dry run it waits, like every other write.
                let Some(original) = e.original.filter(|_| !e.blocked && !self.dry_run) else { continue };
                self.in_flight = Some(InFlight::ExitRestore(id.clone(), original));
                return Some(Output::RestoreExited { id, weight: original });
            }
            if self.held && !self.dry_run {
                // Saves fail: only the original goes back, nothing else is written until a save works.
                if let Some(original) = e.held_restore().filter(|_| !e.blocked) {
                    self.in_flight = Some(InFlight::HeldRestore(id.clone(), original));
                    return Some(Output::Restore { id, weight: original });
                }
                continue;
            }
            let Some(want) = e.desired.filter(|_| e.wants_write() && !e.blocked) else { continue };
            if self.dry_run {
                let old = e.applied.or(e.original);
                e.applied = Some(want);
                self.report_decision(&id, old, want, Effect::DryRun);
                continue;
            }
            if e.original.is_none() {
                // A weight written now could never be put back: read the original first.
                self.in_flight = Some(InFlight::ReadOriginal(id.clone()));
                return Some(Output::ReadWeight { id });
            }
            if !e.on_file {
                // Made dirty before its original was known (read just now): save it first.
                e.queued = true;
                self.dirty.push_front(id.clone());
                self.unsaved.push(id);
                continue;
            }
            self.in_flight = Some(InFlight::Write(id.clone(), want));
            if e.restoring {
                return Some(Output::Restore { id, weight: want });
            }
            return Some(Output::Write { id, weight: want });
        }
    }

    // ----- internals -----

    fn make_dirty(&mut self, id: &ContainerId) {
        let Some(e) = self.entries.get_mut(id) else { return };
        e.blocked = false;
        if !e.queued {
            e.queued = true;
            self.dirty.push_back(id.clone());
        }
        self.note_unsaved(id);
    }

    /// Notes a container about to be written whose original must go on file first.
    fn note_unsaved(&mut self, id: &ContainerId) {
        let Some(e) = self.entries.get(id) else { return };
        if !self.dry_run && e.original.is_some() && !e.on_file && e.wants_write() && !e.exited {
            self.unsaved.push(id.clone());
        }
    }

    /// One save for every original noted since the last one. While held, only on a retry (once a round), and then
    /// even with nothing new to save: the save itself is the probe.
    fn take_unsaved(&mut self) -> Option<Output> {
        if self.held {
            // In dry run nothing is written, so nothing needs saving: the probe waits until it ends.
            if self.dry_run || !std::mem::replace(&mut self.retry_save, false) {
                return None;
            }
        } else if self.unsaved.is_empty() {
            return None;
        }
        let mut save = Vec::new();
        for id in std::mem::take(&mut self.unsaved) {
            if let Some(e) = self.entries.get_mut(&id) {
                if let (Some(w), false) = (e.original, e.on_file) {
                    // Counted as on file once asked for; a failed save takes it back (`handle_save_result`).
                    e.on_file = true;
                    save.push((id, w));
                }
            }
        }
        if save.is_empty() && !self.held {
            return None;
        }
        self.in_flight = Some(InFlight::Save(save.iter().map(|(i, _)| i.clone()).collect()));
        Some(Output::SaveOriginals(save))
    }

    fn report_decision(&mut self, id: &ContainerId, old_weight: Option<Weight>, weight: Weight, effect: Effect) {
        let Some(change) = self.entries.get_mut(id).and_then(|e| e.pending.take()) else { return };
        self.out.push_back(Output::Report(Report::Decision { change, old_weight, weight, effect }));
    }

    /// Puts the original back if the agent wrote something (or always, with `force`); otherwise just forgets it.
    /// A restore still wanted (an earlier one failed) stays wanted.
    fn start_restore(&mut self, id: &ContainerId, force: bool) {
        let Some(e) = self.entries.get_mut(id) else { return };
        match e.original.filter(|_| force || e.changed_by_agent || e.applied.is_some()) {
            Some(original) if self.dry_run => {
                // Decided, not written (a weight "applied" in dry run is not in the file either): the original
                // stays on file, owed at shutdown or to a later agent.
                let old = e.applied.or(e.original);
                (e.desired, e.applied, e.restoring) = (None, None, false);
                self.report_decision(id, old, original, Effect::DryRun);
            }
            Some(original) => {
                e.desired = Some(original);
                e.restoring = true;
                if e.applied == Some(original) {
                    // Written as a weight, not put back: the restore is still owed (see the module doc). The
                    // decision's "before" stays right: it falls back to the original, the same value.
                    e.applied = None;
                }
                self.make_dirty(id);
            }
            None => {
                // Nothing of the agent's is in the file: nothing to put back.
                let forget = std::mem::replace(&mut e.on_file, false);
                (e.desired, e.applied, e.restoring, e.pending) = (None, None, false, None);
                if forget {
                    self.out.push_back(Output::ForgetOriginals(vec![id.clone()]));
                }
            }
        }
    }

    /// The original is verified back in the file: forget it.
    fn finish_restore(&mut self, id: &ContainerId, original: Weight) {
        let e = self.entries.get_mut(id).expect("restoring means tracked");
        (e.desired, e.applied, e.restoring, e.changed_by_agent) = (None, None, false, false);
        let forget = std::mem::replace(&mut e.on_file, false);
        self.out.push_back(Output::Report(Report::OriginalRestored { id: id.clone(), weight: original }));
        if forget {
            self.out.push_back(Output::ForgetOriginals(vec![id.clone()]));
        }
    }

    fn failed(&mut self, id: &ContainerId, weight: Weight, step: FailedStep, error: BackendError) {
        let e = self.entries.get_mut(id).expect("in flight means tracked");
        e.blocked = true;
        let first = !std::mem::replace(&mut e.apply_failure_reported, true);
        self.blocked.push(id.clone());
        self.out.push_back(Output::Report(Report::ApplyFailed { id: id.clone(), weight, step, first, error }));
    }

    /// The cgroup vanished under a read or write: the container stopped (or was removed).
    fn gone(&mut self, id: &ContainerId) {
        self.handle_exited(std::slice::from_ref(id));
        self.out.push_back(Output::Report(Report::Gone { id: id.clone() }));
    }

    /// The container stopped, and the persisting writer's configuration of it may hold the agent's weight: only
    /// its original's restore is left, made dirty (see the module doc).
    fn mark_exited(&mut self, id: &ContainerId) {
        let e = self.entries.get_mut(id).expect("called for tracked containers");
        if std::mem::replace(&mut e.sample_failure_reported, false) {
            self.sample_failures_reported -= 1;
        }
        e.exited = true;
        (e.desired, e.restoring, e.applied, e.pending) = (e.original, true, None, None);
        (e.rewrite, e.put_back_while_starting, e.apply_failure_reported) = (false, false, false);
        self.make_dirty(id);
    }

    /// The answer to an [`Output::RestoreExited`].
    fn exit_restore_result(&mut self, id: &ContainerId, weight: Weight, result: Result<AppliedVia, BackendError>) {
        match result {
            Ok(via) => {
                self.out.push_back(Output::Report(Report::Written { id: id.clone(), weight, via }));
                self.out.push_back(Output::Report(Report::OriginalRestored { id: id.clone(), weight }));
                self.handle_removed(std::slice::from_ref(id));
            }
            // The runtime no longer knows it: nothing left to restore.
            Err(e) if e.is_vanished() => self.handle_removed(std::slice::from_ref(id)),
            // Kept, on file, and tried again next round.
            Err(error) => self.failed(id, weight, FailedStep::RestoreExited, error),
        }
    }

    /// Restores of every original the agent changed, none in dry run.
    fn start_batch(&mut self) {
        let mut batch = RestoreBatch::default();
        if !self.dry_run {
            for (id, e) in &self.entries {
                let Some(original) = e.original else { continue };
                if !e.changed_by_agent {
                    if e.on_file {
                        // Nothing owed (put back while saves were held, or never written): only the entry to forget.
                        batch.done.push(id.clone());
                    }
                    continue;
                }
                // Even at the original's value: what the agent wrote is not what it read (see the module doc).
                batch.queue.push_back((id.clone(), original));
            }
        }
        self.batch = Some(batch);
    }

    fn held_write_result(&mut self, id: &ContainerId, weight: Weight, result: Result<AppliedVia, BackendError>) {
        match result {
            Ok(via) => {
                self.out.push_back(Output::Report(Report::Written { id: id.clone(), weight, via }));
                // The file holds the original: nothing owed; whatever the engine wants is written on resuming.
                let e = self.entries.get_mut(id).expect("in flight means tracked");
                (e.applied, e.changed_by_agent, e.apply_failure_reported) = (None, false, false);
                if e.restoring && e.desired == Some(weight) {
                    self.report_decision(id, None, weight, Effect::Applied(via));
                    self.finish_restore(id, weight);
                }
            }
            Err(e) if e.is_vanished() => self.gone(id),
            Err(error) => self.failed(id, weight, FailedStep::Write, error),
        }
    }

    fn batch_write_result(&mut self, id: &ContainerId, weight: Weight, result: Result<AppliedVia, BackendError>) {
        let batch = self.batch.as_mut().expect("a batch write belongs to a batch");
        match result {
            Ok(via) => {
                batch.done.push(id.clone());
                batch.summary.restored += 1;
                self.out.push_back(Output::Report(Report::Written { id: id.clone(), weight, via }));
                self.out.push_back(Output::Report(Report::OriginalRestored { id: id.clone(), weight }));
            }
            // Gone: nothing left to restore, nothing to keep on file.
            Err(e) if e.is_vanished() => batch.done.push(id.clone()),
            Err(error) => {
                batch.summary.restore_failures += 1;
                self.out.push_back(Output::Report(Report::RestoreFailed { id: id.clone(), weight, error }));
            }
        }
    }

    fn finish_batch(&mut self) {
        let batch = self.batch.take().expect("called with a batch");
        for id in &batch.done {
            if self.entries.get(id).is_some_and(|e| e.exited) {
                // Its original is back (or it is removed): nothing of it is left.
                let e = self.entries.remove(id).expect("looked up just now");
                self.sample_failures_reported -= usize::from(e.sample_failure_reported);
                continue;
            }
            if let Some(e) = self.entries.get_mut(id) {
                (e.on_file, e.applied, e.changed_by_agent) = (false, None, false);
            }
        }
        if !batch.done.is_empty() {
            self.out.push_back(Output::ForgetOriginals(batch.done));
        }
        self.out.push_back(Output::Report(Report::RestoresFinished(batch.summary)));
    }
}

#[cfg(test)]
mod tests;
