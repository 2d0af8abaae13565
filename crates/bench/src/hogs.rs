//! `--cpu-hogs N`: threads that keep the CPUs busy through a run, at nice 0 like any other process, so the run
//! shows what a busy host does to the readers and to the agent's reaction time.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

/// The spinning threads; they stop when this is dropped.
#[derive(Debug)]
pub struct CpuHogs {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<u64>>,
}

impl CpuHogs {
    /// Starts `n` threads that spin until [`CpuHogs`] is dropped (none for 0).
    pub fn start(n: u16) -> std::io::Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let mut hogs = Self { stop: stop.clone(), threads: Vec::new() };
        for i in 0..n {
            let stop = stop.clone();
            let spin = move || {
                // Counted, so the loop is work the compiler keeps.
                let mut turns = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    turns = std::hint::black_box(turns.wrapping_add(1));
                }
                turns
            };
            // An error drops `hogs`, which stops the threads already started.
            hogs.threads.push(std::thread::Builder::new().name(format!("cpu-hog-{i}")).spawn(spin)?);
        }
        Ok(hogs)
    }
}

impl Drop for CpuHogs {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hogs_spin_until_dropped() {
        let mut hogs = CpuHogs::start(2).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(50));
        let (stop, threads) = (hogs.stop.clone(), std::mem::take(&mut hogs.threads));
        assert!(!stop.load(Ordering::Relaxed));
        drop(hogs);
        assert!(stop.load(Ordering::Relaxed), "dropping stops them");
        for t in threads {
            assert!(t.join().unwrap() > 0);
        }
        assert!(CpuHogs::start(0).unwrap().threads.is_empty());
    }
}
