//! The undo stack: everything the bench sets up (loop device, mount, scheduler settings, cgroups, processes,
//! containers, temp files) registers how to undo it here, and the stack runs last-in first-out on normal exit, on
//! error (the [`Guard`]'s `Drop`) and on SIGINT/SIGTERM/SIGHUP (a watcher thread).
//!
//! Actions run while the stack's lock is held, so a signal arriving during a normal teardown waits for it instead
//! of exiting the process half-way; an action registered after the stack ran is run at once.

use std::sync::{Mutex, OnceLock};

use anyhow::Result;

type Action = Box<dyn FnOnce() -> Result<()> + Send>;

struct Entry {
    token: u64,
    what: String,
    action: Action,
}

#[derive(Default)]
struct Inner {
    entries: Vec<Entry>,
    next_token: u64,
    /// Set once the whole stack ran (teardown or signal): later registrations run immediately.
    closed: bool,
}

/// A stack of undo actions. Use [`Cleanup::global`] in the binary; tests may make their own.
pub struct Cleanup {
    inner: Mutex<Inner>,
    /// The exit status a signal asked for (128 + its number), once one arrived.
    interrupted: OnceLock<i32>,
}

impl std::fmt::Debug for Cleanup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let inner = self.lock();
        let names: Vec<&str> = inner.entries.iter().map(|e| e.what.as_str()).collect();
        f.debug_struct("Cleanup").field("pending", &names).field("closed", &inner.closed).finish()
    }
}

/// Handle of one registered action, to run it early ([`Cleanup::run`]) or drop it ([`Cleanup::dismiss`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Token(u64);

impl Default for Cleanup {
    fn default() -> Self {
        Self::new()
    }
}

impl Cleanup {
    /// An empty stack.
    pub fn new() -> Self {
        Self { inner: Mutex::new(Inner::default()), interrupted: OnceLock::new() }
    }

    /// The process-wide stack that the signal watcher runs.
    pub fn global() -> &'static Cleanup {
        static GLOBAL: OnceLock<Cleanup> = OnceLock::new();
        GLOBAL.get_or_init(Cleanup::new)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic inside an action must not stop the remaining ones from running.
        self.inner.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Registers an undo action, described by `what` in logs.
    pub fn push(&self, what: impl Into<String>, action: impl FnOnce() -> Result<()> + Send + 'static) -> Token {
        let what = what.into();
        let mut inner = self.lock();
        if inner.closed {
            drop(inner);
            run_one(&what, Box::new(action));
            return Token(u64::MAX);
        }
        let token = inner.next_token;
        inner.next_token += 1;
        inner.entries.push(Entry { token, what, action: Box::new(action) });
        Token(token)
    }

    /// Runs one action now (if still pending) and removes it from the stack. Returns its error, if any.
    pub fn run(&self, token: Token) -> Result<()> {
        let mut inner = self.lock();
        let Some(pos) = inner.entries.iter().position(|e| e.token == token.0) else {
            return Ok(());
        };
        let entry = inner.entries.remove(pos);
        // Run under the lock: a concurrent `run_all` must not exit the process while this runs.
        (entry.action)()
    }

    /// Forgets an action without running it (what it undoes was undone some other way).
    #[cfg(test)]
    pub fn dismiss(&self, token: Token) {
        self.lock().entries.retain(|e| e.token != token.0);
    }

    /// Number of pending actions.
    pub fn pending(&self) -> usize {
        self.lock().entries.len()
    }

    /// Runs every pending action, newest first, logging (not stopping at) failures; closes the stack.
    pub fn run_all(&self) {
        let mut inner = self.lock();
        inner.closed = true;
        while let Some(entry) = inner.entries.pop() {
            run_one(&entry.what, entry.action);
        }
    }

    /// Reopens a closed stack (tests).
    #[cfg(test)]
    pub fn reopen(&self) {
        self.lock().closed = false;
    }
}

fn run_one(what: &str, action: Action) {
    tracing::debug!(what, "cleanup");
    if let Err(e) = action() {
        eprintln!("cleanup: {what}: {e:#}");
    }
}

/// Runs the global stack when dropped (normal return or unwinding).
#[derive(Debug)]
pub struct Guard(&'static Cleanup);

impl Guard {
    /// Guards the global stack and starts the signal watcher.
    pub fn install() -> Self {
        spawn_signal_watcher(Cleanup::global());
        Guard(Cleanup::global())
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        self.0.run_all();
        // A signal's teardown may make the run fail (its readers vanish) while the watcher runs the stack; the
        // process must still exit with the signal's status, not the failure's, whichever thread exits first.
        if let Some(&code) = self.0.interrupted.get() {
            std::process::exit(code);
        }
    }
}

/// On SIGINT, SIGTERM or SIGHUP: run the stack, then exit with 128 + signal number.
fn spawn_signal_watcher(stack: &'static Cleanup) {
    let spawned = std::thread::Builder::new().name("signal-watcher".into()).spawn(move || {
        let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
            Ok(rt) => rt,
            Err(e) => {
                eprintln!("warning: no signal handling (tokio runtime: {e}); Ctrl-C will not clean up");
                return;
            }
        };
        let code = rt.block_on(async {
            use tokio::signal::unix::{signal, SignalKind};
            let (Ok(mut int), Ok(mut term), Ok(mut hup)) =
                (signal(SignalKind::interrupt()), signal(SignalKind::terminate()), signal(SignalKind::hangup()))
            else {
                eprintln!("warning: cannot install signal handlers; Ctrl-C will not clean up");
                return None;
            };
            tokio::select! {
                _ = int.recv() => Some(130),
                _ = term.recv() => Some(143),
                _ = hup.recv() => Some(129),
            }
        });
        if let Some(code) = code {
            let _ = stack.interrupted.set(code);
            eprintln!("\ninterrupted: cleaning up ({} actions)", stack.pending());
            stack.run_all();
            std::process::exit(code);
        }
    });
    if let Err(e) = spawned {
        eprintln!("warning: cannot start the signal watcher: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex as StdMutex};

    type Log = Arc<StdMutex<Vec<String>>>;

    fn recorder() -> (Log, impl Fn(&str) -> Action) {
        let log = Arc::new(StdMutex::new(Vec::new()));
        let l = log.clone();
        let make = move |name: &str| {
            let l = l.clone();
            let name = name.to_string();
            Box::new(move || {
                l.lock().unwrap().push(name);
                Ok(())
            }) as Box<dyn FnOnce() -> Result<()> + Send>
        };
        (log, make)
    }

    #[test]
    fn runs_last_in_first_out() {
        let stack = Cleanup::new();
        let (log, make) = recorder();
        stack.push("a", make("a"));
        stack.push("b", make("b"));
        stack.push("c", make("c"));
        stack.run_all();
        assert_eq!(*log.lock().unwrap(), vec!["c", "b", "a"]);
        assert_eq!(stack.pending(), 0);
    }

    #[test]
    fn run_one_early_and_dismiss() {
        let stack = Cleanup::new();
        let (log, make) = recorder();
        let a = stack.push("a", make("a"));
        let b = stack.push("b", make("b"));
        stack.push("c", make("c"));
        stack.run(b).unwrap();
        stack.dismiss(a);
        stack.run(b).unwrap(); // already gone: no-op
        stack.run_all();
        assert_eq!(*log.lock().unwrap(), vec!["b", "c"]);
    }

    #[test]
    fn failures_do_not_stop_the_rest() {
        let stack = Cleanup::new();
        let (log, make) = recorder();
        stack.push("a", make("a"));
        stack.push("bad", || anyhow::bail!("boom"));
        stack.run_all();
        assert_eq!(*log.lock().unwrap(), vec!["a"]);
    }

    #[test]
    fn registering_after_close_runs_at_once() {
        let stack = Cleanup::new();
        let (log, make) = recorder();
        stack.run_all();
        stack.push("late", make("late"));
        assert_eq!(*log.lock().unwrap(), vec!["late"]);
        stack.reopen();
        stack.push("kept", make("kept"));
        assert_eq!(stack.pending(), 1);
    }
}
