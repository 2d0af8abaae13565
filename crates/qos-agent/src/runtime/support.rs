//! What every runtime's discovery shares (this is not a runtime): the reconnect [`Backoff`] and the inotify
//! [`DirWatch`]. Written once here, so a runtime does not borrow another's internals.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
use tokio::sync::mpsc;

use crate::backend::DiscoveryError;

/// Waits between reconnect attempts: 0.2 s doubling to 5 s, back to 0.2 s after a success.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    next: Duration,
}

impl Backoff {
    /// The first wait.
    pub const MIN: Duration = Duration::from_millis(200);
    /// The longest wait.
    pub const MAX: Duration = Duration::from_secs(5);

    /// A backoff at its first wait.
    pub const fn new() -> Self {
        Self { next: Self::MIN }
    }

    /// Sleeps the current wait (tokio's clock), then doubles it up to [`Backoff::MAX`].
    pub async fn wait(&mut self) {
        tokio::time::sleep(self.next).await;
        self.next = (self.next * 2).min(Self::MAX);
    }

    /// The wait the next [`Backoff::wait`] sleeps (for "retry in" log fields).
    pub fn next(&self) -> Duration {
        self.next
    }

    /// After a success: the next outage starts again at [`Backoff::MIN`].
    pub fn reset(&mut self) {
        self.next = Self::MIN;
    }
}

impl Default for Backoff {
    fn default() -> Self {
        Self::new()
    }
}

/// Directories watched with inotify for entries created or deleted: [`DirWatch::changed`] wakes once per batch of
/// changes (coalesced; the caller reads what changed from the directories themselves, so an overflow loses
/// nothing). A thread blocks on the descriptor (tokio's `AsyncFd` registration is `unsafe`, and this crate has
/// none); it ends when the watch is dropped and the next notification arrives.
#[derive(Debug)]
pub struct DirWatch {
    inotify: Arc<Inotify>,
    changed: mpsc::Receiver<()>,
}

impl DirWatch {
    /// Starts the watch (no directory yet); `thread` names its thread.
    pub fn start(thread: &str) -> Result<Self, DiscoveryError> {
        let inotify = Inotify::init(InitFlags::IN_CLOEXEC)
            .map_err(|e| DiscoveryError::Runtime { what: "inotify_init".into(), detail: e.to_string() })?;
        let inotify = Arc::new(inotify);
        let (tx, changed) = mpsc::channel(1);
        let reader = inotify.clone();
        std::thread::Builder::new()
            .name(thread.into())
            .spawn(move || loop {
                match reader.read_events() {
                    Ok(_) => {
                        // A full channel already holds a wake-up; the rescan will see this change too.
                        if let Err(mpsc::error::TrySendError::Closed(())) = tx.try_send(()) {
                            return;
                        }
                    }
                    Err(nix::errno::Errno::EINTR) => {}
                    Err(_) => return,
                }
            })
            .map_err(|e| DiscoveryError::Runtime { what: format!("spawn thread {thread}"), detail: e.to_string() })?;
        Ok(Self { inotify, changed })
    }

    /// Watches `dir` for subdirectories created or deleted (again: refreshes the watch).
    pub fn add(&self, dir: &Path) -> nix::Result<()> {
        let flags = AddWatchFlags::IN_CREATE | AddWatchFlags::IN_DELETE | AddWatchFlags::IN_ONLYDIR;
        self.inotify.add_watch(dir, flags).map(drop)
    }

    /// Waits for the next batch of changes; `None` once the watching thread has stopped.
    pub async fn changed(&mut self) -> Option<()> {
        self.changed.recv().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn backoff_doubles_to_its_maximum_and_resets() {
        let mut b = Backoff::new();
        let start = tokio::time::Instant::now();
        let mut waits = Vec::new();
        for _ in 0..7 {
            let before = tokio::time::Instant::now();
            b.wait().await;
            waits.push((tokio::time::Instant::now() - before).as_millis());
        }
        assert_eq!(waits, [200, 400, 800, 1600, 3200, 5000, 5000]);
        assert_eq!(b.next(), Backoff::MAX);
        b.reset();
        assert_eq!(b.next(), Backoff::MIN);
        assert!(tokio::time::Instant::now() - start >= Duration::from_millis(16_200));
    }

    #[tokio::test]
    async fn a_dir_watch_wakes_on_a_new_subdirectory() {
        let tmp = tempfile::tempdir().unwrap();
        let mut watch = DirWatch::start("test-watch").unwrap();
        watch.add(tmp.path()).unwrap();
        std::fs::create_dir(tmp.path().join("c1")).unwrap();
        let woke = tokio::time::timeout(Duration::from_secs(5), watch.changed()).await;
        assert_eq!(woke.expect("woken within 5 s"), Some(()));
        // Nothing else changed: nothing pending after the first wake-up.
        let again = tokio::time::timeout(Duration::from_millis(200), watch.changed()).await;
        assert!(again.is_err(), "one change, one wake-up");
    }
}
