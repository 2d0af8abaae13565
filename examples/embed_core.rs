//! Embeds qos-core the way another container runtime would: it owns the clock and the counters, feeds the engine
//! inputs with `now`, drains the decisions after every input, and wakes the engine at `poll_timeout()`.
//!
//! Here the clock is virtual (half-second ticks from one `Instant`) and the counters are made up, so the run is
//! instant and always prints the same decisions:
//!
//! `cargo run --example embed_core`

use std::time::{Duration, Instant};

use qos_core::{Config, ContainerId, Engine, IoCounters, Policy, Weight, WeightChange};

const MIB: u64 = 1 << 20;
const TICK: Duration = Duration::from_millis(500);

/// A made-up container: starts at a tick, reads `per_tick` bytes for `busy_ticks` ticks, then idles.
struct Fake {
    id: ContainerId,
    starts_at: u32,
    per_tick: u64,
    busy_ticks: u32,
    counters: IoCounters,
    exited: bool,
}

fn main() {
    let origin = Instant::now();
    let mut engine = Engine::new(Config::default(), origin).expect("the default config is valid");
    let mut fakes = [
        fake("web", 0, 256 * 1024, u32::MAX), // light and steady: stays near the top
        fake("backup", 2, 40 * MIB, 30),      // heavy: sinks to the bottom, boosted every 10 s
        fake("batch", 6, 3 * MIB, 4),         // a short burst: down one level, back up when idle
    ];
    // A database the operator pinned: the engine holds its weight whatever it does.
    engine.set_policy(&ContainerId::new("db"), Policy::Pinned(Weight::new(500).expect("in range")), origin);
    report(&mut engine, Duration::ZERO);

    for tick in 0..=50u32 {
        let now = origin + TICK * tick;
        let at = now - origin;
        for f in fakes.iter_mut().filter(|f| f.starts_at == tick) {
            engine.handle_started(&f.id, now);
            report(&mut engine, at);
        }
        for f in fakes.iter_mut().filter(|f| f.starts_at <= tick && !f.exited) {
            if tick - f.starts_at < f.busy_ticks {
                f.counters.read += f.per_tick;
            }
            engine.handle_sample(&f.id, f.counters, now);
            report(&mut engine, at);
        }
        if tick == 40 {
            // The backup container exits: the engine forgets it, there is nothing to write.
            fakes[1].exited = true;
            engine.handle_removed(&fakes[1].id, now);
        }
        // A real driver sleeps until min(next tick, poll_timeout()); on this virtual clock the deadlines that fall
        // before the next tick are handled at their own time. Each handle_timeout moves poll_timeout() past `due`.
        while let Some(due) = engine.poll_timeout().filter(|d| *d < now + TICK) {
            let due = due.max(now);
            engine.handle_timeout(due);
            report(&mut engine, due - origin);
        }
    }
    println!("\nfinal state:");
    for view in engine.containers(origin + TICK * 50) {
        let weight = view.weight.map_or("untouched".to_owned(), |w| w.to_string());
        let level = if view.policy == Policy::Managed { format!("L{}", view.level) } else { "-".to_owned() };
        println!("  {:<7} {level:>2}  weight {weight:>9}  {:>6.1} MiB read", view.id.as_str(), mib(view.total_bytes));
    }
}

fn fake(name: &str, starts_at: u32, per_tick: u64, busy_ticks: u32) -> Fake {
    Fake { id: ContainerId::new(name), starts_at, per_tick, busy_ticks, counters: IoCounters::default(), exited: false }
}

/// Applies (here: prints) every pending decision. A runtime writes `weight` to the container's cgroup, or puts
/// back the weight it had before when `weight` is `None`.
fn report(engine: &mut Engine, at: Duration) {
    while let Some(WeightChange { id, weight, old_level, new_level, reason, bytes_at_old_level }) = engine.poll_change()
    {
        let level = |l: Option<usize>| l.map_or("-".to_owned(), |l| format!("L{l}"));
        let weight = weight.map_or("restore".to_owned(), |w| w.to_string());
        println!(
            "t={:>5.1}s  {:<7} {:>2} -> {:<2}  weight {weight:>7}  {:<13}  {:>6.1} MiB counted at the old level",
            at.as_secs_f64(),
            id.as_str(),
            level(old_level),
            level(new_level),
            reason.as_str(),
            mib(bytes_at_old_level),
        );
    }
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / MIB as f64
}
