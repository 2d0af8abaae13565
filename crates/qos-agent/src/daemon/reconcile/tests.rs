//! The reconciler driven directly, against an in-memory world: one unit test per rule, then a model-based proptest.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use qos_core::{ContainerId, Reason, Weight, WeightChange};

use super::*;
use crate::cgroup::CgroupError;

fn w(v: u64) -> Weight {
    Weight::new(v).unwrap()
}

fn id(s: &str) -> ContainerId {
    ContainerId::new(s)
}

fn broken(id: &ContainerId) -> BackendError {
    BackendError::Runtime { id: id.clone(), what: "test", detail: "injected fault".into() }
}

fn vanished(id: &ContainerId) -> BackendError {
    BackendError::Cgroup(CgroupError::Vanished {
        path: PathBuf::from(format!("/fake/{id}")),
        source: std::io::Error::from(std::io::ErrorKind::NotFound),
    })
}

/// What a runtime answers about a container it no longer knows (removed).
fn no_container(id: &ContainerId) -> BackendError {
    BackendError::NoContainer { id: id.clone(), detail: "No such container".into() }
}

fn unsaveable() -> crate::state::StateError {
    crate::state::StateError::Io {
        path: PathBuf::from("/fake/state.json"),
        source: std::io::Error::from_raw_os_error(libc::EROFS),
    }
}

fn decision(c: &str, weight: Option<u64>, reason: Reason) -> WeightChange {
    WeightChange {
        id: id(c),
        weight: weight.map(w),
        old_level: None,
        new_level: Some(0),
        reason,
        bytes_at_old_level: 0,
    }
}

/// What a driver did, in order, as the tests compare it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Did {
    Read(String),
    Save(Vec<(String, u32)>),
    /// A save that failed (the state file cannot be written).
    SaveFailed(Vec<(String, u32)>),
    Write(String, u32),
    /// An original put back ([`Output::Restore`]).
    Restore(String, u32),
    /// An original put back into a stopped container's configuration ([`Output::RestoreExited`]).
    RestoreExited(String, u32),
    Forget(Vec<String>),
}

/// A driver over an in-memory world: cgroup files, the state file, injected faults.
#[derive(Debug)]
struct Sim {
    r: Reconciler,
    files: BTreeMap<ContainerId, Weight>,
    state_file: BTreeMap<ContainerId, Weight>,
    broken_writes: BTreeSet<ContainerId>,
    broken_reads: BTreeSet<ContainerId>,
    vanished: BTreeSet<ContainerId>,
    /// Containers whose last successful write was a restore: their files are as the agent found them.
    put_back: BTreeSet<ContainerId>,
    /// Saves of the state file fail.
    broken_saves: bool,
    /// What a persisting writer keeps of each container beyond its cgroup (Docker: its configuration): every
    /// weight written while the reconciler says its writer persists.
    configs: BTreeMap<ContainerId, Weight>,
    /// Containers the runtime no longer knows (removed): a restore into their configuration finds none.
    removed_from_runtime: BTreeSet<ContainerId>,
    /// Writes a persisting writer keeps in the configuration but whose check after it fails (Docker took the
    /// update, the files do not hold it).
    kept_but_failed: BTreeSet<ContainerId>,
    did: Vec<Did>,
    reports: Vec<Report>,
    /// The time passed in to the reconciler's rounds; tests move it.
    now: Instant,
}

impl Default for Sim {
    fn default() -> Self {
        Self {
            r: Reconciler::default(),
            files: BTreeMap::new(),
            state_file: BTreeMap::new(),
            broken_writes: BTreeSet::new(),
            broken_reads: BTreeSet::new(),
            vanished: BTreeSet::new(),
            put_back: BTreeSet::new(),
            broken_saves: false,
            configs: BTreeMap::new(),
            removed_from_runtime: BTreeSet::new(),
            kept_but_failed: BTreeSet::new(),
            did: Vec::new(),
            reports: Vec::new(),
            now: Instant::now(),
        }
    }
}

impl Sim {
    fn new(dry_run: bool) -> Self {
        Self { r: Reconciler::new(dry_run), ..Self::default() }
    }

    /// Over a writer whose weights outlive the cgroup (Docker's API).
    fn persisting() -> Self {
        Self { r: Reconciler::new(false).with_persisting_writer(true), ..Self::default() }
    }

    /// A container whose file holds `file`, tracked with `original` (the usual: read at discovery).
    fn track(&mut self, c: &str, file: u64, original: Original, tracking: Tracking) {
        self.files.insert(id(c), w(file));
        if let Original::OnFile(o) = original {
            self.state_file.insert(id(c), o);
        }
        self.r.handle_tracked(&id(c), original, tracking);
        self.drain();
    }

    fn managed(&mut self, c: &str, file: u64) {
        self.track(c, file, Original::Read(w(file)), Tracking::Follow);
    }

    fn decide(&mut self, changes: Vec<WeightChange>) {
        self.r.handle_decisions(changes);
        self.drain();
    }

    fn round(&mut self) {
        self.r.handle_round(self.now);
        self.drain();
    }

    /// Carries out every output, feeding reads and writes back at once (the drain rule).
    fn drain(&mut self) {
        while let Some(o) = self.r.poll_output() {
            match o {
                Output::ReadWeight { id } => {
                    self.did.push(Did::Read(id.to_string()));
                    let result = if self.vanished.contains(&id) {
                        Err(vanished(&id))
                    } else if self.broken_reads.contains(&id) {
                        Err(broken(&id))
                    } else {
                        Ok(self.files[&id])
                    };
                    self.r.handle_read_result(&id, result);
                }
                Output::Write { id, weight } => {
                    self.did.push(Did::Write(id.to_string(), weight.get()));
                    let result = self.put(&id, weight, false);
                    self.r.handle_write_result(&id, result);
                }
                Output::Restore { id, weight } => {
                    self.did.push(Did::Restore(id.to_string(), weight.get()));
                    let result = self.put(&id, weight, true);
                    self.r.handle_write_result(&id, result);
                }
                Output::RestoreExited { id, weight } => {
                    self.did.push(Did::RestoreExited(id.to_string(), weight.get()));
                    let result = if self.removed_from_runtime.contains(&id) {
                        Err(no_container(&id))
                    } else if self.broken_writes.contains(&id) {
                        Err(broken(&id))
                    } else {
                        self.configs.insert(id.clone(), weight);
                        Ok(AppliedVia::DockerApi)
                    };
                    self.r.handle_write_result(&id, result);
                }
                Output::SaveOriginals(items) => {
                    let list = items.iter().map(|(i, w)| (i.to_string(), w.get())).collect();
                    if self.broken_saves {
                        self.did.push(Did::SaveFailed(list));
                        self.r.handle_save_result(Err(unsaveable()));
                        continue;
                    }
                    self.did.push(Did::Save(list));
                    for (i, w) in items {
                        self.state_file.entry(i).or_insert(w);
                    }
                    self.r.handle_save_result(Ok(()));
                }
                Output::ForgetOriginals(ids) => {
                    self.did.push(Did::Forget(ids.iter().map(ToString::to_string).collect()));
                    for i in ids {
                        self.state_file.remove(&i);
                    }
                }
                Output::Report(r) => self.reports.push(r),
            }
        }
    }

    /// A write or restore into the in-memory file, with the injected faults.
    fn put(&mut self, id: &ContainerId, weight: Weight, restore: bool) -> Result<AppliedVia, BackendError> {
        if self.vanished.contains(id) {
            return Err(vanished(id));
        }
        if self.kept_but_failed.contains(id) {
            self.configs.insert(id.clone(), weight);
            return Err(broken(id));
        }
        if self.broken_writes.contains(id) {
            return Err(broken(id));
        }
        self.files.insert(id.clone(), weight);
        if self.r.persisting {
            self.configs.insert(id.clone(), weight);
        }
        if restore {
            self.put_back.insert(id.clone());
        } else {
            self.put_back.remove(id);
        }
        Ok(AppliedVia::CgroupFile)
    }

    fn take(&mut self) -> Vec<Did> {
        std::mem::take(&mut self.did)
    }

    fn file(&self, c: &str) -> u32 {
        self.files[&id(c)].get()
    }

    fn config(&self, c: &str) -> Option<u32> {
        self.configs.get(&id(c)).map(|w| w.get())
    }

    fn on_file(&self, c: &str) -> Option<u32> {
        self.state_file.get(&id(c)).map(|w| w.get())
    }

    fn count(&self, pred: impl Fn(&Report) -> bool) -> usize {
        self.reports.iter().filter(|r| pred(r)).count()
    }

    fn summary(&self) -> Option<Summary> {
        self.reports.iter().rev().find_map(|r| match r {
            Report::RestoresFinished(s) => Some(s.clone()),
            _ => None,
        })
    }
}

fn write(c: &str, v: u32) -> Did {
    Did::Write(c.into(), v)
}

fn restore(c: &str, v: u32) -> Did {
    Did::Restore(c.into(), v)
}

fn restore_exited(c: &str, v: u32) -> Did {
    Did::RestoreExited(c.into(), v)
}

fn save(items: &[(&str, u32)]) -> Did {
    Did::Save(items.iter().map(|(c, v)| (c.to_string(), *v)).collect())
}

fn forget(ids: &[&str]) -> Did {
    Did::Forget(ids.iter().map(|c| c.to_string()).collect())
}

// ----- writing decisions -----

#[test]
fn one_save_before_the_writes_of_a_batch() {
    let mut s = Sim::new(false);
    s.managed("a", 100);
    s.managed("b", 300);
    assert_eq!(s.take(), vec![], "tracking alone does nothing");
    s.decide(vec![decision("a", Some(1000), Reason::New), decision("b", Some(1000), Reason::New)]);
    assert_eq!(s.take(), vec![save(&[("a", 100), ("b", 300)]), write("a", 1000), write("b", 1000)]);
    // Later writes need no save: the originals are on file.
    s.decide(vec![decision("a", Some(200), Reason::Demoted)]);
    assert_eq!(s.take(), vec![write("a", 200)]);
    assert_eq!(s.r.applied(&id("a")), Some(w(200)));
}

#[test]
fn decision_is_reported_once_it_takes_effect_with_the_weight_before() {
    let mut s = Sim::new(false);
    s.managed("a", 100);
    s.decide(vec![decision("a", Some(1000), Reason::New)]);
    s.decide(vec![decision("a", Some(200), Reason::Demoted)]);
    s.decide(vec![decision("a", Some(200), Reason::Reconfigured)]);
    let decisions: Vec<_> = s
        .reports
        .iter()
        .filter_map(|r| match r {
            Report::Decision { change, old_weight, weight, effect } => {
                Some((change.reason, old_weight.map(Weight::get), weight.get(), *effect))
            }
            _ => None,
        })
        .collect();
    let applied = Effect::Applied(AppliedVia::CgroupFile);
    assert_eq!(
        decisions,
        vec![
            (Reason::New, Some(100), 1000, applied),
            (Reason::Demoted, Some(1000), 200, applied),
            (Reason::Reconfigured, Some(200), 200, Effect::Unchanged),
        ]
    );
    assert_eq!(s.take().len(), 3, "save, two writes: nothing for the unchanged weight");
}

#[test]
fn no_write_before_the_original_is_known_read_first_every_round() {
    let mut s = Sim::new(false);
    s.files.insert(id("a"), w(700));
    s.broken_reads.insert(id("a"));
    s.r.handle_tracked(&id("a"), Original::Unknown, Tracking::Follow);
    s.decide(vec![decision("a", Some(1000), Reason::New)]);
    assert_eq!(s.take(), vec![Did::Read("a".into())]);
    s.round();
    s.round();
    assert_eq!(s.take(), vec![Did::Read("a".into()), Did::Read("a".into())], "retried every round, nothing written");
    let failures: Vec<bool> = s
        .reports
        .iter()
        .filter_map(|r| match r {
            Report::ApplyFailed { step: FailedStep::ReadOriginal, first, .. } => Some(*first),
            _ => None,
        })
        .collect();
    assert_eq!(failures, vec![true, false, false], "every failure is reported, the first marked");

    s.broken_reads.clear();
    s.round();
    assert_eq!(s.take(), vec![Did::Read("a".into()), save(&[("a", 700)]), write("a", 1000)]);
    assert_eq!(s.r.original(&id("a")), Some(w(700)));
}

#[test]
fn failed_write_is_retried_every_round_and_reported_first_once_until_it_works() {
    let mut s = Sim::new(false);
    s.managed("a", 100);
    s.broken_writes.insert(id("a"));
    s.decide(vec![decision("a", Some(1000), Reason::New)]);
    s.round();
    s.round();
    assert_eq!(s.take(), vec![save(&[("a", 100)]), write("a", 1000), write("a", 1000), write("a", 1000)]);
    let firsts = || move |r: &Report| matches!(r, Report::ApplyFailed { step: FailedStep::Write, first: true, .. });
    assert_eq!(s.count(firsts()), 1);
    assert_eq!(s.count(|r| matches!(r, Report::ApplyFailed { .. })), 3);
    assert_eq!(s.r.applied(&id("a")), None);

    s.broken_writes.clear();
    s.round();
    assert_eq!(s.take(), vec![write("a", 1000)]);
    s.round();
    assert_eq!(s.take(), vec![], "nothing once applied");
    // A new failure after a success is a first again.
    s.broken_writes.insert(id("a"));
    s.decide(vec![decision("a", Some(200), Reason::Demoted)]);
    assert_eq!(s.count(firsts()), 2);
    assert_eq!(s.r.applied(&id("a")), Some(w(1000)), "the verified weight stays");
}

#[test]
fn an_idle_round_does_nothing() {
    let mut s = Sim::new(false);
    s.managed("a", 100);
    s.decide(vec![decision("a", Some(1000), Reason::New)]);
    s.take();
    s.round();
    assert_eq!(s.take(), vec![]);
    assert!(s.r.poll_output().is_none());
}

#[test]
fn vanished_on_write_is_a_removal() {
    let mut s = Sim::new(false);
    s.managed("a", 100);
    s.decide(vec![decision("a", Some(1000), Reason::New)]);
    s.vanished.insert(id("a"));
    s.decide(vec![decision("a", Some(200), Reason::Demoted)]);
    assert_eq!(s.take()[2..], [write("a", 200), forget(&["a"])]);
    assert_eq!(s.count(|r| matches!(r, Report::Gone { id } if id.as_str() == "a")), 1);
    assert_eq!(s.count(|r| matches!(r, Report::ApplyFailed { .. })), 0, "not a failure");
    assert!(!s.r.is_tracked(&id("a")));
    s.round();
    s.decide(vec![decision("a", Some(40), Reason::Demoted)]);
    assert_eq!(s.take(), vec![], "no action for a removed container");
}

#[test]
fn removed_container_gets_no_action_even_if_it_was_waiting() {
    let mut s = Sim::new(false);
    s.managed("a", 100);
    s.broken_writes.insert(id("a"));
    s.decide(vec![decision("a", Some(1000), Reason::New)]);
    s.take();
    s.r.handle_removed(&[id("a")]);
    s.round();
    assert_eq!(s.take(), vec![forget(&["a"])]);
    assert_eq!(s.on_file("a"), None);
}

#[test]
fn updated_weight_changed_outside_is_written_again() {
    let mut s = Sim::new(false);
    s.managed("a", 100);
    s.decide(vec![decision("a", Some(1000), Reason::New)]);
    s.take();
    s.r.handle_updated(&id("a"));
    s.drain();
    assert_eq!(s.take(), vec![Did::Read("a".into())], "the file is right: nothing else");
    s.files.insert(id("a"), w(555));
    s.r.handle_updated(&id("a"));
    s.drain();
    assert_eq!(s.take(), vec![Did::Read("a".into()), write("a", 1000)]);
    assert_eq!(
        s.count(|r| matches!(r, Report::ChangedOutside { want, have, .. } if (want.get(), have.get()) == (1000, 555))),
        1
    );
}

/// While its runtime sets a container up, its weight is read again on every check and written again where the
/// runtime's manager put the file back, reported as the runtime's doing (not as a change from outside).
#[test]
fn still_starting_checks_put_the_weight_back_quietly() {
    let mut s = Sim::new(false);
    s.managed("a", 100);
    s.decide(vec![decision("a", Some(1000), Reason::New)]);
    s.take();
    s.r.handle_still_starting(&id("a"));
    s.drain();
    assert_eq!(s.take(), vec![Did::Read("a".into())], "the file is right: nothing else");
    s.files.insert(id("a"), w(100));
    s.r.handle_still_starting(&id("a"));
    s.drain();
    assert_eq!(s.take(), vec![Did::Read("a".into()), write("a", 1000)]);
    assert_eq!(s.file("a"), 1000);
    assert_eq!(s.count(|r| matches!(r, Report::PutBackWhileStarting { .. })), 1);
    assert_eq!(s.count(|r| matches!(r, Report::ChangedOutside { .. })), 0);
    // runc sets the unit's properties once: after a put-back, no more checks.
    s.r.handle_still_starting(&id("a"));
    s.drain();
    assert_eq!(s.take(), vec![], "checked again after the runtime's put-back");
    // A change found by an ordinary re-verify is still one from outside.
    s.files.insert(id("a"), w(555));
    s.r.handle_updated(&id("a"));
    s.drain();
    assert_eq!(s.count(|r| matches!(r, Report::ChangedOutside { .. })), 1);
}

/// A container announced while its runtime set it up got its weight by file; once settled, the same weight is
/// written once more (the writer's own way), with no decision reported, and a failed rewrite is tried again.
#[test]
fn settled_rewrites_the_verified_weight_once_without_a_decision() {
    let mut s = Sim::new(false);
    s.managed("a", 100);
    s.decide(vec![decision("a", Some(1000), Reason::New)]);
    s.take();
    let decisions = |s: &Sim| s.count(|r| matches!(r, Report::Decision { .. }));
    assert_eq!(decisions(&s), 1);
    s.broken_writes.insert(id("a"));
    let window = Duration::from_secs(2);
    s.r.handle_settled(&id("a"), s.now + window);
    s.drain();
    assert_eq!(s.take(), vec![], "not at once");
    s.round();
    s.now += window / 2;
    s.round();
    assert_eq!(s.take(), vec![], "not in a round before its time (the container's entry window)");
    s.now += window / 2;
    s.round();
    assert_eq!(s.take(), vec![write("a", 1000)], "at the first round at its time");
    s.broken_writes.clear();
    s.round();
    assert_eq!(s.take(), vec![write("a", 1000)], "a failed rewrite is tried again next round");
    s.round();
    assert_eq!(s.take(), vec![], "written once it worked, not again");
    assert_eq!(decisions(&s), 1, "a rewrite is not a decision");
    // A container with nothing verified yet, and dry run: nothing.
    s.managed("b", 100);
    s.r.handle_settled(&id("b"), s.now);
    s.drain();
    assert_eq!(s.take(), vec![]);
    let mut dry = Sim::new(true);
    dry.managed("a", 100);
    dry.decide(vec![decision("a", Some(1000), Reason::New)]);
    dry.take();
    dry.r.handle_settled(&id("a"), dry.now);
    dry.drain();
    assert_eq!(dry.take(), vec![]);
}

#[test]
fn sample_failure_is_reported_once_until_a_good_sample() {
    let mut s = Sim::new(false);
    s.managed("a", 100);
    for _ in 0..3 {
        s.r.handle_sample_failed(&id("a"), broken(&id("a")));
    }
    s.r.handle_sample_ok(&id("a"));
    s.r.handle_sample_failed(&id("a"), broken(&id("a")));
    s.r.handle_sample_failed(&id("x"), broken(&id("x"))); // untracked: nothing
    s.drain();
    assert_eq!(s.count(|r| matches!(r, Report::SampleFailed { .. })), 2);
}

// ----- restoring -----

#[test]
fn released_gets_its_original_back_only_if_the_agent_wrote_something() {
    let mut s = Sim::new(false);
    s.managed("wrote", 500);
    s.managed("never", 300);
    s.broken_writes.insert(id("never"));
    s.decide(vec![decision("wrote", Some(200), Reason::New), decision("never", Some(200), Reason::New)]);
    s.take();
    s.decide(vec![decision("wrote", None, Reason::Released), decision("never", None, Reason::Released)]);
    assert_eq!(s.take(), vec![forget(&["never"]), restore("wrote", 500), forget(&["wrote"])]);
    assert_eq!((s.file("wrote"), s.file("never")), (500, 300));
    assert_eq!((s.on_file("wrote"), s.on_file("never")), (None, None));
    assert_eq!(s.count(|r| matches!(r, Report::OriginalRestored { .. })), 1);
    s.round();
    assert_eq!(s.take(), vec![], "nothing more to do");
}

#[test]
fn a_weight_equal_to_the_original_is_a_write_and_still_owes_a_restore() {
    let mut s = Sim::new(false);
    s.managed("p", 300);
    s.decide(vec![decision("p", Some(300), Reason::Pinned)]);
    assert_eq!(s.take(), vec![save(&[("p", 300)]), write("p", 300)], "a write, not a restore");
    s.decide(vec![decision("p", None, Reason::Released)]);
    assert_eq!(s.take(), vec![restore("p", 300), forget(&["p"])]);
    s.decide(vec![decision("p", Some(300), Reason::Pinned)]);
    s.take();
    s.r.handle_shutdown();
    s.drain();
    assert_eq!(s.take(), vec![restore("p", 300), forget(&["p"])]);
    assert_eq!(s.summary(), Some(Summary { restored: 1, restore_failures: 0 }));
}

#[test]
fn excluded_container_with_its_original_on_file_is_restored_whatever_the_file_holds() {
    let mut s = Sim::new(false);
    s.track("x", 40, Original::OnFile(w(400)), Tracking::Excluded);
    assert_eq!(s.take(), vec![restore("x", 400), forget(&["x"])]);
    // Excluded without an original on file: untouched.
    s.track("y", 40, Original::Read(w(40)), Tracking::Excluded);
    assert_eq!(s.take(), vec![]);
}

#[test]
fn failed_restore_keeps_the_original_wanted_retried_and_on_file() {
    let mut s = Sim::new(false);
    s.broken_writes.insert(id("x"));
    s.track("x", 40, Original::OnFile(w(400)), Tracking::Excluded);
    s.round();
    assert_eq!(s.take(), vec![restore("x", 400), restore("x", 400)]);
    assert_eq!(s.on_file("x"), Some(400));
    s.broken_writes.clear();
    s.round();
    assert_eq!(s.take(), vec![restore("x", 400), forget(&["x"])]);
    s.round();
    assert_eq!(s.take(), vec![], "then left alone");
}

#[test]
fn shutdown_restores_what_the_agent_changed_and_forgets_it_in_one_save() {
    let mut s = Sim::new(false);
    s.managed("demoted", 500);
    s.managed("top", 1000);
    s.managed("never", 250);
    s.managed("broken", 600);
    s.managed("gone", 700);
    s.broken_writes.insert(id("never"));
    s.decide(["demoted", "top", "never", "broken", "gone"].map(|c| decision(c, Some(200), Reason::New)).to_vec());
    s.decide(vec![decision("top", Some(1000), Reason::Boosted)]);
    s.take();
    s.broken_writes.insert(id("broken"));
    s.vanished.insert(id("gone"));
    s.r.handle_shutdown();
    s.drain();
    assert_eq!(
        s.take(),
        vec![
            restore("broken", 600),
            restore("demoted", 500),
            restore("gone", 700),
            restore("top", 1000),
            forget(&["never", "demoted", "gone", "top"])
        ],
        "top was written (at its original's value), so it is restored too; never was not changed by the agent, so \
         its saved original is only forgotten"
    );
    assert_eq!(s.on_file("never"), None, "a clean stop leaves only failed restores on file");
    assert_eq!(s.summary(), Some(Summary { restored: 2, restore_failures: 1 }));
    assert_eq!(s.on_file("broken"), Some(600), "kept for the next agent");
    assert_eq!(s.count(|r| matches!(r, Report::RestoreFailed { .. })), 1);
    s.decide(vec![decision("demoted", Some(40), Reason::Demoted)]);
    s.round();
    assert_eq!(s.take(), vec![], "nothing after shutdown");
}

#[test]
fn shutdown_retries_a_restore_still_wanted() {
    let mut s = Sim::new(false);
    s.broken_writes.insert(id("x"));
    s.track("x", 40, Original::OnFile(w(400)), Tracking::Excluded);
    s.take();
    s.r.handle_shutdown();
    s.drain();
    assert_eq!(s.take(), vec![restore("x", 400)]);
    assert_eq!(s.summary(), Some(Summary { restored: 0, restore_failures: 1 }));
}

#[test]
fn a_weight_a_crashed_agent_left_is_restored_at_shutdown_even_if_nothing_was_written() {
    let mut s = Sim::new(false);
    s.broken_writes.insert(id("a"));
    s.track("a", 10, Original::OnFile(w(100)), Tracking::Follow);
    s.decide(vec![decision("a", Some(1000), Reason::New)]);
    s.broken_writes.clear();
    s.r.handle_shutdown();
    s.drain();
    assert_eq!(s.take(), vec![write("a", 1000), restore("a", 100), forget(&["a"])]);
    assert_eq!(s.summary(), Some(Summary { restored: 1, restore_failures: 0 }));
}

#[test]
fn a_release_does_not_cancel_a_restore_still_wanted() {
    let mut s = Sim::new(false);
    s.broken_writes.insert(id("x"));
    s.track("x", 10, Original::OnFile(w(400)), Tracking::Excluded);
    s.decide(vec![decision("x", None, Reason::Released)]);
    assert_eq!(s.on_file("x"), Some(400), "still owed its original");
    s.broken_writes.clear();
    s.round();
    assert_eq!((s.file("x"), s.on_file("x")), (400, None));
}

// ----- containers that stop, with a writer whose weights outlive the cgroup -----

/// Demoted through a persisting writer: "a" (original 100) holds 200 in its cgroup and in its configuration.
fn demoted_persisting() -> Sim {
    let mut s = Sim::persisting();
    s.managed("a", 100);
    s.decide(vec![decision("a", Some(1000), Reason::New)]);
    s.decide(vec![decision("a", Some(200), Reason::Demoted)]);
    s.take();
    assert_eq!((s.config("a"), s.on_file("a")), (Some(200), Some(100)));
    s
}

#[test]
fn a_stopped_container_gets_its_original_back_in_its_configuration_then_is_forgotten() {
    let mut s = demoted_persisting();
    s.r.handle_exited(&[id("a")]);
    s.drain();
    assert_eq!(s.take(), vec![restore_exited("a", 100), forget(&["a"])], "put back before it is forgotten");
    assert_eq!((s.config("a"), s.on_file("a")), (Some(100), None));
    assert_eq!(
        s.count(|r| matches!(r, Report::OriginalRestored { id, weight } if id.as_str() == "a" && weight.get() == 100)),
        1
    );
    assert!(!s.r.is_tracked(&id("a")));
    s.round();
    s.r.handle_shutdown();
    s.drain();
    assert_eq!(s.take(), vec![], "nothing more for it, not even at shutdown");
}

#[test]
fn a_persisting_writers_failed_write_may_have_kept_the_weight_so_the_original_is_owed_at_stop_and_at_shutdown() {
    // Docker took the demotion into the configuration, the check after it failed: no write ever succeeded.
    let mut s = Sim::persisting();
    s.managed("a", 100);
    s.managed("b", 100);
    s.kept_but_failed.extend([id("a"), id("b")]);
    s.decide(vec![decision("a", Some(200), Reason::Demoted), decision("b", Some(200), Reason::Demoted)]);
    assert_eq!((s.config("a"), s.config("b")), (Some(200), Some(200)));
    s.take();
    s.r.handle_exited(&[id("a")]);
    s.drain();
    assert_eq!(s.take(), vec![restore_exited("a", 100), forget(&["a"])], "a stopped one gets it back");
    assert_eq!(s.config("a"), Some(100));
    s.kept_but_failed.clear();
    s.r.handle_shutdown();
    s.drain();
    assert!(s.take().contains(&Did::Restore("b".into(), 100)), "a running one gets it back at shutdown");
    assert_eq!(s.config("b"), Some(100));
}

#[test]
fn a_stopped_container_is_only_forgotten_without_a_persisting_writer_or_a_change_of_the_agent() {
    // The files' writers: the cgroup, and the agent's weight in it, is gone.
    let mut s = Sim::new(false);
    s.managed("a", 100);
    s.decide(vec![decision("a", Some(200), Reason::New)]);
    s.take();
    s.r.handle_exited(&[id("a")]);
    s.drain();
    assert_eq!(s.take(), vec![forget(&["a"])]);
    // A persisting writer that never wrote the container: nothing of the agent's is in its configuration.
    let mut s = Sim::persisting();
    s.managed("b", 100);
    s.r.handle_exited(&[id("b")]);
    s.drain();
    assert_eq!(s.take(), vec![forget(&["b"])]);
    assert_eq!(s.config("b"), None);
}

#[test]
fn a_failed_restore_of_a_stopped_container_keeps_the_original_on_file_and_is_retried_every_round() {
    let mut s = demoted_persisting();
    s.broken_writes.insert(id("a"));
    s.r.handle_exited(&[id("a")]);
    s.drain();
    s.round();
    s.round();
    assert_eq!(s.take(), vec![restore_exited("a", 100); 3], "tried at once, then every round; nothing forgotten");
    assert_eq!((s.config("a"), s.on_file("a")), (Some(200), Some(100)), "the original stays on file");
    let failures: Vec<bool> = s
        .reports
        .iter()
        .filter_map(|r| match r {
            Report::ApplyFailed { step: FailedStep::RestoreExited, first, weight, .. } if weight.get() == 100 => {
                Some(*first)
            }
            _ => None,
        })
        .collect();
    assert_eq!(failures, vec![true, false, false], "every failure is reported, the first marked");
    s.decide(vec![decision("a", Some(1000), Reason::Boosted)]);
    assert_eq!(s.take(), vec![], "a decision the engine still had for it is not a write");

    s.broken_writes.clear();
    s.round();
    assert_eq!(s.take(), vec![restore_exited("a", 100), forget(&["a"])]);
    assert_eq!((s.config("a"), s.on_file("a")), (Some(100), None));
    s.round();
    assert_eq!(s.take(), vec![], "then left alone");
}

#[test]
fn a_stopped_container_whose_restore_still_fails_at_shutdown_stays_on_file_for_the_next_agent() {
    let mut s = demoted_persisting();
    s.broken_writes.insert(id("a"));
    s.r.handle_exited(&[id("a")]);
    s.drain();
    s.take();
    s.r.handle_shutdown();
    s.drain();
    assert_eq!(s.take(), vec![restore_exited("a", 100)], "tried once more, nothing forgotten");
    assert_eq!(s.summary(), Some(Summary { restored: 0, restore_failures: 1 }));
    assert_eq!(s.on_file("a"), Some(100), "kept for the next agent");
}

#[test]
fn a_stopped_container_the_runtime_no_longer_knows_is_forgotten() {
    let mut s = demoted_persisting();
    s.removed_from_runtime.insert(id("a"));
    s.r.handle_exited(&[id("a")]);
    s.drain();
    assert_eq!(s.take(), vec![restore_exited("a", 100), forget(&["a"])]);
    assert_eq!(s.count(|r| matches!(r, Report::ApplyFailed { .. } | Report::OriginalRestored { .. })), 0);
    assert!(!s.r.is_tracked(&id("a")));
    // Removed outright (Docker's `destroy`) while a failed restore waits: forgotten, not tried again.
    let mut s = demoted_persisting();
    s.broken_writes.insert(id("a"));
    s.r.handle_exited(&[id("a")]);
    s.drain();
    s.take();
    s.r.handle_removed(&[id("a")]);
    s.round();
    assert_eq!(s.take(), vec![forget(&["a"])]);
}

#[test]
fn a_cgroup_that_vanishes_under_a_write_is_a_stopped_container_for_a_persisting_writer() {
    let mut s = demoted_persisting();
    s.vanished.insert(id("a"));
    s.decide(vec![decision("a", Some(40), Reason::Demoted)]);
    assert_eq!(s.take(), vec![write("a", 40), restore_exited("a", 100), forget(&["a"])]);
    assert_eq!(s.count(|r| matches!(r, Report::Gone { id } if id.as_str() == "a")), 1);
    assert_eq!(s.config("a"), Some(100));
}

#[test]
fn a_stopped_container_started_again_before_its_restore_keeps_its_original() {
    let mut s = demoted_persisting();
    s.broken_writes.insert(id("a"));
    s.r.handle_exited(&[id("a")]);
    s.drain();
    s.take();
    // Started again: its configuration gave its new cgroup the agent's 200, which a read would take for its own.
    s.broken_writes.clear();
    s.files.insert(id("a"), w(200));
    s.r.handle_tracked(&id("a"), Original::Read(w(200)), Tracking::Follow);
    s.drain();
    assert!(!s.r.is_exited(&id("a")));
    assert_eq!(s.r.original(&id("a")), Some(w(100)));
    s.decide(vec![decision("a", Some(1000), Reason::New)]);
    s.r.handle_shutdown();
    s.drain();
    assert_eq!(s.take(), vec![write("a", 1000), restore("a", 100), forget(&["a"])]);
    assert_eq!(s.config("a"), Some(100));
}

#[test]
fn leftovers_on_file_at_start_are_put_back_with_a_persisting_writer_and_only_forgotten_otherwise() {
    let leftovers = [(id("x"), w(100)), (id("y"), w(500))];
    let mut s = Sim::persisting();
    s.state_file.extend(leftovers.iter().cloned());
    s.removed_from_runtime.insert(id("y"));
    s.r.handle_leftovers(&leftovers);
    s.drain();
    assert_eq!(s.take(), vec![restore_exited("x", 100), forget(&["x"]), restore_exited("y", 500), forget(&["y"])]);
    assert_eq!((s.config("x"), s.on_file("x"), s.on_file("y")), (Some(100), None, None));

    let mut s = Sim::new(false);
    s.state_file.extend(leftovers.iter().cloned());
    s.r.handle_leftovers(&leftovers);
    s.drain();
    assert_eq!(s.take(), vec![forget(&["x", "y"])], "one save");
    assert!(s.state_file.is_empty());
}

#[test]
fn entering_dry_run_puts_a_stopped_containers_original_back_and_a_failed_one_waits_until_it_ends() {
    let mut s = demoted_persisting();
    s.broken_writes.insert(id("a"));
    s.r.handle_exited(&[id("a")]);
    s.drain();
    s.take();
    s.r.handle_reload(true);
    s.drain();
    s.round();
    assert_eq!(s.take(), vec![restore_exited("a", 100)], "tried with the other restores, not in dry run");
    assert_eq!(s.on_file("a"), Some(100));
    s.broken_writes.clear();
    s.r.handle_reload(false);
    s.drain();
    assert_eq!(s.take(), vec![restore_exited("a", 100), forget(&["a"])]);
}

// ----- dry run -----

#[test]
fn dry_run_decides_but_reads_writes_and_saves_nothing() {
    let mut s = Sim::new(true);
    s.managed("a", 100);
    s.r.handle_tracked(&id("u"), Original::Unknown, Tracking::Follow);
    s.decide(vec![decision("a", Some(1000), Reason::New), decision("u", Some(1000), Reason::New)]);
    s.decide(vec![decision("a", Some(200), Reason::Demoted)]);
    s.r.handle_updated(&id("a"));
    s.r.handle_shutdown();
    s.drain();
    assert_eq!(s.take(), vec![]);
    assert_eq!(s.r.applied(&id("a")), Some(w(200)), "decided");
    assert_eq!(s.count(|r| matches!(r, Report::Decision { effect: Effect::DryRun, .. })), 3);
    assert_eq!(s.summary(), Some(Summary::default()));
}

#[test]
fn entering_dry_run_restores_first_then_decides_without_writing() {
    let mut s = Sim::new(false);
    s.managed("a", 500);
    s.decide(vec![decision("a", Some(200), Reason::New)]);
    s.take();
    s.r.handle_reload(true);
    s.drain();
    assert_eq!(s.take(), vec![restore("a", 500), forget(&["a"])]);
    assert_eq!(s.summary(), Some(Summary { restored: 1, restore_failures: 0 }));
    assert_eq!(s.r.applied(&id("a")), Some(w(200)), "still decided, in dry run");
    s.decide(vec![decision("a", Some(40), Reason::Demoted)]);
    s.r.handle_shutdown();
    s.drain();
    assert_eq!(s.take(), vec![], "nothing written in dry run, not even at shutdown");
    assert_eq!(s.file("a"), 500);
}

#[test]
fn leaving_dry_run_writes_the_decided_weights() {
    let mut s = Sim::new(true);
    s.managed("a", 100);
    s.decide(vec![decision("a", Some(200), Reason::New)]);
    s.r.handle_reload(false);
    s.drain();
    assert_eq!(s.take(), vec![save(&[("a", 100)]), write("a", 200)]);
    s.r.handle_shutdown();
    s.drain();
    assert_eq!(s.file("a"), 100);
}

#[test]
fn at_most_one_read_or_write_is_outstanding() {
    let mut r = Reconciler::new(false);
    r.handle_tracked(&id("a"), Original::Read(w(100)), Tracking::Follow);
    r.handle_tracked(&id("b"), Original::Read(w(100)), Tracking::Follow);
    r.handle_decisions(vec![decision("a", Some(1000), Reason::New), decision("b", Some(1000), Reason::New)]);
    assert!(matches!(r.poll_output(), Some(Output::SaveOriginals(v)) if v.len() == 2));
    assert!(r.poll_output().is_none(), "waits for the save's result");
    r.handle_save_result(Ok(()));
    assert!(matches!(r.poll_output(), Some(Output::Write { id, .. }) if id.as_str() == "a"));
    assert!(r.poll_output().is_none(), "waits for a's result");
    r.handle_write_result(&id("b"), Ok(AppliedVia::CgroupFile)); // not asked for: ignored
    assert!(r.poll_output().is_none());
    r.handle_write_result(&id("a"), Ok(AppliedVia::CgroupFile));
    assert!(matches!(r.poll_output(), Some(Output::Report(Report::Written { .. }))));
}

// ----- saves that fail -----

#[test]
fn a_failed_save_holds_every_change_puts_originals_back_and_resumes_when_a_save_works() {
    let mut s = Sim::new(false);
    s.managed("a", 100);
    s.managed("b", 300);
    s.decide(vec![decision("a", Some(40), Reason::Demoted)]);
    assert_eq!(s.take(), vec![save(&[("a", 100)]), write("a", 40)]);

    // The state file becomes unwritable: b's original cannot be saved, so b is not written; a goes back.
    s.broken_saves = true;
    s.decide(vec![decision("b", Some(1000), Reason::New), decision("a", Some(10), Reason::Demoted)]);
    assert_eq!(s.take(), vec![Did::SaveFailed(vec![("b".into(), 300)]), restore("a", 100)]);
    assert!(s.r.saves_held());
    assert_eq!((s.file("a"), s.file("b")), (100, 300));
    let first = |s: &Sim, want: bool| s.count(|r| matches!(r, Report::SaveFailed { first, .. } if *first == want));
    assert_eq!(first(&s, true), 1);

    // Every round tries the save again; nothing but originals is written meanwhile, and it is said once.
    s.decide(vec![decision("a", Some(200), Reason::Boosted)]);
    s.round();
    s.round();
    assert_eq!(s.take(), vec![Did::SaveFailed(vec![("b".into(), 300)]), Did::SaveFailed(vec![("b".into(), 300)])]);
    assert_eq!((first(&s, true), first(&s, false)), (1, 2));

    // The file is writable again: the next round saves, then writes what the engine wants now.
    s.broken_saves = false;
    s.round();
    assert_eq!(s.take(), vec![save(&[("b", 300)]), write("a", 200), write("b", 1000)]);
    assert!(!s.r.saves_held());
    assert_eq!(s.count(|r| matches!(r, Report::SavesResumed)), 1);
    assert_eq!((s.on_file("a"), s.on_file("b")), (Some(100), Some(300)));

    s.r.handle_shutdown();
    s.drain();
    assert_eq!((s.file("a"), s.file("b")), (100, 300));
    assert_eq!(s.summary(), Some(Summary { restored: 2, restore_failures: 0 }));
}

#[test]
fn a_restore_that_fails_while_saves_are_held_is_retried_every_round() {
    let mut s = Sim::new(false);
    s.managed("a", 100);
    s.managed("b", 100);
    s.decide(vec![decision("a", Some(40), Reason::Demoted)]);
    s.broken_saves = true;
    s.broken_writes.insert(id("a"));
    s.decide(vec![decision("b", Some(40), Reason::Demoted)]);
    assert_eq!(s.file("a"), 40);
    s.round();
    assert_eq!(s.file("a"), 40, "still broken");
    s.broken_writes.clear();
    s.round();
    assert_eq!((s.file("a"), s.file("b")), (100, 100), "put back although saves still fail; b never written");
    // Stopped while still held: nothing else to put back, and the file's entries are forgotten (or left
    // holding the weight the container has).
    s.r.handle_shutdown();
    s.drain();
    assert_eq!((s.file("a"), s.file("b")), (100, 100));
    assert!(s.did.iter().all(|d| !matches!(d, Did::Write(c, v) if c == "b" && *v != 100)));
}

#[test]
fn a_crashed_agents_container_is_restored_at_shutdown_while_saves_fail() {
    let mut s = Sim::new(false);
    s.broken_saves = true;
    // Left at 40 by a SIGKILLed agent; its original 100 is on file.
    s.track("a", 40, Original::OnFile(w(100)), Tracking::Follow);
    s.managed("b", 100);
    s.decide(vec![decision("a", Some(1000), Reason::New), decision("b", Some(1000), Reason::New)]);
    // a's original is on file, so a may be written; b's save fails, and a goes back to its original.
    assert_eq!(s.file("b"), 100);
    assert_eq!(s.file("a"), 100);
    s.r.handle_shutdown();
    s.drain();
    assert_eq!((s.file("a"), s.file("b")), (100, 100));
    assert_eq!(s.summary().map(|x| x.restore_failures), Some(0));
}

// ----- model-based -----

mod model {
    use proptest::prelude::*;

    use super::*;

    #[derive(Debug, Clone)]
    enum Step {
        Track(u8, u16, Kind),
        Decide(Vec<(u8, Option<u16>)>),
        BreakWrites(u8, bool),
        BreakReads(u8, bool),
        Vanish(u8),
        ChangeOutside(u8, u16),
        Round,
        Remove(u8),
        Reload(bool),
        SampleFailed(u8),
        BreakSaves(bool),
    }

    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Kind {
        Read,
        Unknown,
        OnFile(u16),
        ExcludedOnFile(u16),
    }

    fn weight() -> impl Strategy<Value = u16> {
        prop_oneof![Just(10u16), Just(40), Just(200), Just(1000), 1u16..=1000]
    }

    fn step() -> impl Strategy<Value = Step> {
        let c = 0u8..3;
        let kind = prop_oneof![
            3 => Just(Kind::Read),
            1 => Just(Kind::Unknown),
            1 => weight().prop_map(Kind::OnFile),
            1 => weight().prop_map(Kind::ExcludedOnFile),
        ];
        prop_oneof![
            3 => (c.clone(), weight(), kind).prop_map(|(c, f, k)| Step::Track(c, f, k)),
            5 => proptest::collection::vec((c.clone(), prop::option::weighted(0.85, weight())), 1..4).prop_map(Step::Decide),
            2 => (c.clone(), any::<bool>()).prop_map(|(c, b)| Step::BreakWrites(c, b)),
            1 => (c.clone(), any::<bool>()).prop_map(|(c, b)| Step::BreakReads(c, b)),
            1 => c.clone().prop_map(Step::Vanish),
            1 => (c.clone(), weight()).prop_map(|(c, v)| Step::ChangeOutside(c, v)),
            3 => Just(Step::Round),
            1 => c.clone().prop_map(Step::Remove),
            1 => any::<bool>().prop_map(Step::Reload),
            1 => c.prop_map(Step::SampleFailed),
            1 => prop::bool::weighted(0.4).prop_map(Step::BreakSaves),
        ]
    }

    /// What the model expects of one tracked container.
    #[derive(Debug, Clone)]
    struct Expect {
        original: Option<Weight>,
        /// The engine's last word: `Some` = that weight, `None` = leave or put back the original.
        want: Option<Weight>,
        /// The file holds a weight the agent wrote (or a crashed agent did: the original was on file), not undone
        /// yet: shutdown must restore it or report the failure.
        changed: bool,
        /// A restore is due (released after a change, or excluded with its original on file): once nothing is
        /// broken and a round has passed, it must be done.
        restore_wanted: bool,
    }

    fn cid(c: u8) -> ContainerId {
        id(&format!("c{c}"))
    }

    /// Runs the steps against the reconciler (through [`Sim`]) and checks it against the model after each.
    fn run(steps: Vec<Step>, start_dry: bool) -> Result<(), TestCaseError> {
        let mut s = Sim::new(start_dry);
        let mut model: BTreeMap<ContainerId, Expect> = BTreeMap::new();
        let mut removed: BTreeSet<ContainerId> = BTreeSet::new();
        let mut dry = start_dry;
        for step in steps {
            let before = s.did.len();
            let reports_before = s.reports.len();
            match step.clone() {
                Step::Track(c, file, kind) => {
                    let i = cid(c);
                    if model.contains_key(&i) {
                        continue;
                    }
                    removed.remove(&i);
                    s.vanished.remove(&i); // faults set before it was tracked stay: they hit its first read or write
                    s.files.insert(i.clone(), w(file.into()));
                    let (original, tracking) = match kind {
                        Kind::Read => (Original::Read(w(file.into())), Tracking::Follow),
                        Kind::Unknown => (Original::Unknown, Tracking::Follow),
                        Kind::OnFile(o) => (Original::OnFile(w(o.into())), Tracking::Follow),
                        Kind::ExcludedOnFile(o) => (Original::OnFile(w(o.into())), Tracking::Excluded),
                    };
                    if let Original::OnFile(o) = original {
                        s.state_file.insert(i.clone(), o);
                    }
                    // Unknown: read later, and (unless changed outside meanwhile) it is what the file holds now.
                    let expected_original = match original {
                        Original::OnFile(o) | Original::Read(o) => Some(o),
                        Original::Unknown => Some(w(file.into())),
                    };
                    let inherited = matches!(original, Original::OnFile(o) if o != w(file.into()));
                    let restore_wanted = tracking == Tracking::Excluded && matches!(original, Original::OnFile(_));
                    model.insert(
                        i.clone(),
                        Expect {
                            original: expected_original,
                            want: None,
                            changed: inherited,
                            restore_wanted: restore_wanted && !dry,
                        },
                    );
                    s.r.handle_tracked(&i, original, tracking);
                }
                Step::Decide(list) => {
                    let mut batch = Vec::new();
                    for (c, weight) in list {
                        let i = cid(c);
                        let Some(m) = model.get_mut(&i) else { continue };
                        m.want = weight.map(|v| w(v.into()));
                        m.restore_wanted = m.want.is_none() && m.changed && !dry;
                        let reason = if weight.is_some() { Reason::Demoted } else { Reason::Released };
                        batch.push(WeightChange {
                            id: i,
                            weight: m.want,
                            old_level: None,
                            new_level: None,
                            reason,
                            bytes_at_old_level: 0,
                        });
                    }
                    s.r.handle_decisions(batch);
                }
                Step::BreakWrites(c, on) => {
                    if on {
                        s.broken_writes.insert(cid(c));
                    } else {
                        s.broken_writes.remove(&cid(c));
                    }
                }
                Step::BreakReads(c, on) => {
                    if on {
                        s.broken_reads.insert(cid(c));
                    } else {
                        s.broken_reads.remove(&cid(c));
                    }
                }
                Step::Vanish(c) => {
                    s.vanished.insert(cid(c));
                }
                Step::ChangeOutside(c, v) => {
                    let i = cid(c);
                    if let (Some(m), false) = (model.get_mut(&i), s.vanished.contains(&i)) {
                        s.files.insert(i.clone(), w(v.into()));
                        if s.r.original(&i).is_none() {
                            m.original = Some(w(v.into())); // what the agent will read as the original
                        }
                        // Someone else's weight now: shutdown owes nothing unless the agent writes again.
                        m.changed = false;
                        s.r.handle_updated(&i);
                    }
                }
                Step::Round => s.r.handle_round(s.now),
                Step::Remove(c) => {
                    let i = cid(c);
                    if model.remove(&i).is_some() {
                        removed.insert(i.clone());
                        s.r.handle_removed(&[i]);
                    }
                }
                Step::Reload(d) => {
                    if d && !dry {
                        // Entering dry run: restores happen now; what fails is reported now.
                        for m in model.values_mut() {
                            (m.changed, m.restore_wanted) = (false, false);
                        }
                    }
                    dry = d;
                    s.r.handle_reload(d);
                }
                Step::SampleFailed(c) => s.r.handle_sample_failed(&cid(c), broken(&cid(c))),
                Step::BreakSaves(on) => s.broken_saves = on,
            }
            let on_file_before: BTreeSet<ContainerId> = s.state_file.keys().cloned().collect();
            let held_before = s.r.saves_held();
            s.drain();
            let originals = model.iter().map(|(i, m)| (i.clone(), m.original)).collect();
            check_outputs(&s, before, reports_before, &on_file_before, &removed, dry, held_before, &originals)?;
            // The vanished ones the reconciler found are removals.
            for r in &s.reports[reports_before..] {
                if let Report::Gone { id } = r {
                    model.remove(id);
                    removed.insert(id.clone());
                }
            }
            for r in &s.reports[reports_before..] {
                // What the agent's verified writes did to each file.
                // A write changes the file, even at the original's value (cgroup v2: other per-device values);
                // only a restore puts it back as found.
                if let Report::Written { id, .. } = r {
                    if let Some(m) = model.get_mut(id) {
                        m.changed = !s.put_back.contains(id);
                        m.restore_wanted &= m.changed;
                    }
                }
            }
            for (i, m) in &model {
                prop_assert_eq!(s.r.is_tracked(i), true, "{} tracked", i);
                check_steady(&s, i, m, dry, &step)?;
            }
        }
        // Shutdown: every container whose file the agent changed is restored, or its failure reported.
        let before = s.did.len();
        let reports_before = s.reports.len();
        let on_file_before: BTreeSet<ContainerId> = s.state_file.keys().cloned().collect();
        let held_before = s.r.saves_held();
        s.r.handle_shutdown();
        s.drain();
        let originals = model.iter().map(|(i, m)| (i.clone(), m.original)).collect();
        check_outputs(&s, before, reports_before, &on_file_before, &removed, dry, held_before, &originals)?;
        let failed: BTreeSet<&ContainerId> = s.reports[reports_before..]
            .iter()
            .filter_map(|r| match r {
                Report::RestoreFailed { id, .. } => Some(id),
                _ => None,
            })
            .collect();
        prop_assert!(s.summary().is_some(), "a summary");
        for (i, m) in &model {
            if m.changed && !dry && !s.vanished.contains(i) {
                let restored = s.put_back.contains(i) && Some(s.files[i]) == m.original;
                prop_assert!(restored || failed.contains(i), "{} changed by the agent: restored or reported", i);
            }
            if failed.contains(i) {
                prop_assert_eq!(s.state_file.get(i).copied(), m.original, "{} failed restore stays on file", i);
            }
        }
        Ok(())
    }

    /// Invariants on what one drain did: no write whose original is not on file (saved by a save that worked), and
    /// while saves fail, no write but of an original.
    #[allow(clippy::too_many_arguments)]
    fn check_outputs(
        s: &Sim,
        before: usize,
        reports_before: usize,
        on_file_before: &BTreeSet<ContainerId>,
        removed: &BTreeSet<ContainerId>,
        dry: bool,
        held_before: bool,
        originals: &BTreeMap<ContainerId, Option<Weight>>,
    ) -> Result<(), TestCaseError> {
        let mut on_file = on_file_before.clone();
        let mut held = held_before;
        let restores_finished = s.reports[reports_before..].iter().any(|r| matches!(r, Report::RestoresFinished(_)));
        for d in &s.did[before..] {
            match d {
                Did::Save(items) => {
                    prop_assert!(!dry, "no save in dry run");
                    on_file.extend(items.iter().map(|(c, _)| id(c)));
                    held = false;
                }
                Did::SaveFailed(_) => {
                    prop_assert!(!dry, "no save in dry run");
                    held = true;
                }
                Did::Forget(ids) => {
                    for c in ids {
                        on_file.remove(&id(c));
                    }
                }
                // The model runs a writer whose weights go with the cgroup.
                Did::RestoreExited(c, _) => prop_assert!(false, "a restore into {}'s configuration", c),
                Did::Write(c, v) | Did::Restore(c, v) => {
                    if matches!(d, Did::Restore(..)) {
                        let original = originals.get(&id(c)).copied().flatten().map(|o| o.get());
                        prop_assert_eq!(Some(*v), original, "a restore of {} puts back its original", c);
                    }
                    if held {
                        let original = originals.get(&id(c)).copied().flatten().map(|o| o.get());
                        prop_assert_eq!(Some(*v), original, "write to {} while saves fail is not its original", c);
                    }
                    prop_assert!(
                        on_file.contains(&id(c)),
                        "write to {} whose original is not on file: {:?}",
                        c,
                        &s.did[before..]
                    );
                    prop_assert!(!removed.contains(&id(c)), "write to removed {}", c);
                    // In dry run, only the restores of entering it (a batch ending in RestoresFinished) write.
                    prop_assert!(!dry || restores_finished, "write to {} in dry run", c);
                }
                Did::Read(c) => {
                    prop_assert!(!removed.contains(&id(c)), "read of removed {}", c);
                    prop_assert!(!dry, "read of {} in dry run", c);
                }
            }
        }
        Ok(())
    }

    /// Where nothing is broken and a round has given retries their chance, the file holds what the model says.
    fn check_steady(s: &Sim, i: &ContainerId, m: &Expect, dry: bool, step: &Step) -> Result<(), TestCaseError> {
        let healthy = !s.broken_writes.contains(i) && !s.broken_reads.contains(i) && !s.vanished.contains(i);
        if dry || !matches!(step, Step::Round) {
            return Ok(());
        }
        // A round tries a held save again; once saves work, it works.
        prop_assert!(s.broken_saves || !s.r.saves_held(), "held after a round although saves work");
        if !healthy {
            return Ok(());
        }
        if s.r.saves_held() {
            // Everything the agent changed is back at its original.
            prop_assert!(!m.changed, "{} left at {} while saves fail (original {:?})", i, s.files[i], m.original);
            return Ok(());
        }
        match m.want {
            Some(want) => {
                prop_assert_eq!(s.files[i], want, "{} file", i);
                prop_assert_eq!(s.r.applied(i), Some(want), "{} applied", i);
                prop_assert_eq!(s.state_file.get(i).copied(), m.original, "{} original on file", i);
            }
            None => {
                prop_assert_eq!(s.r.applied(i), None, "{} nothing applied once released", i);
                prop_assert!(!m.restore_wanted, "{} restore due but not done", i);
            }
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

        #[test]
        fn reconciler_matches_the_model(steps in proptest::collection::vec(step(), 1..60), dry in prop::bool::weighted(0.2)) {
            run(steps, dry)?;
        }
    }
}
