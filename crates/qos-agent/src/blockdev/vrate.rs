//! io.cost's rate multiplier per device, watched: `cost.vrate` in the v2 root's `io.stat` against the `min=` of the
//! device's line in `io.cost.qos`.
//!
//! io.cost issues I/O at `vrate` percent of what its model (`io.cost.model`) says the device can do, and lowers
//! `vrate` while the device misses the latency target. Pinned at its minimum, the device is slower than even the
//! lowest rate the controller may use: the model overstates it, the device queue fills, and the cgroups' weights act
//! weakly or not at all (the bench saw it with a calibration that overstated a loop device three times: `cost.vrate`
//! at 10 %, a new container's 1 MiB read 75x slower than alone). [`VrateWatch`] turns periodic readings into news:
//! one warning when a device has sat at the floor for [`HOLD`], one line when it leaves it. Pure: the caller reads
//! the files and passes the time.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use super::DevNum;

/// How long `cost.vrate` must sit at its minimum before the warning: io.cost adjusts it every period (tens of
/// milliseconds), so a short dip under a burst is normal.
pub const HOLD: Duration = Duration::from_secs(30);

/// How often the writer reads the root's `io.stat` and `io.cost.qos` for the devices under io.cost.
pub const CHECK_EVERY: Duration = Duration::from_secs(5);

/// `vrate` within this many percentage points of `min` counts as at the floor (both are printed with two
/// decimals).
const FLOOR_SLACK: f64 = 0.5;

/// `cost.vrate` (percent) of device `dev` in the text of the v2 root's `io.stat`; `None` if the device has no line
/// or the line no `cost.vrate` (io.cost off for it).
pub fn vrate_of(io_stat: &str, dev: DevNum) -> Option<f64> {
    field_of(io_stat, dev, "cost.vrate=")
}

/// `min=` (percent) of device `dev` in the text of the root's `io.cost.qos`.
pub fn qos_min_of(io_cost_qos: &str, dev: DevNum) -> Option<f64> {
    field_of(io_cost_qos, dev, "min=")
}

fn field_of(text: &str, dev: DevNum, key: &str) -> Option<f64> {
    let wanted = dev.to_string();
    let line = text.lines().find(|l| l.split_whitespace().next() == Some(wanted.as_str()))?;
    let value: f64 = line.split_whitespace().find_map(|f| f.strip_prefix(key))?.parse().ok()?;
    value.is_finite().then_some(value)
}

/// What a reading changed.
#[derive(Debug, Clone, PartialEq)]
pub enum VrateNews {
    /// The device has sat at io.cost's minimum rate for `held`: warn (once per stay).
    AtFloor {
        /// The device.
        dev: DevNum,
        /// `cost.vrate` now, percent.
        vrate: f64,
        /// The floor (`min=` of `io.cost.qos`), percent.
        min: f64,
        /// How long it has been there.
        held: Duration,
    },
    /// A device warned about has left the floor.
    LeftFloor {
        /// The device.
        dev: DevNum,
        /// `cost.vrate` now, percent.
        vrate: f64,
    },
}

/// Per-device floor state (see the module doc).
#[derive(Debug, Default)]
pub struct VrateWatch {
    /// Devices at the floor now, since when.
    floor_since: BTreeMap<DevNum, Instant>,
    /// Devices warned about in their current stay at the floor.
    warned: BTreeSet<DevNum>,
}

impl VrateWatch {
    /// Feeds one reading of device `dev` at `now`.
    pub fn observe(&mut self, dev: DevNum, vrate: f64, min: f64, now: Instant) -> Option<VrateNews> {
        if vrate <= min + FLOOR_SLACK {
            let since = *self.floor_since.entry(dev).or_insert(now);
            let held = now.saturating_duration_since(since);
            (held >= HOLD && self.warned.insert(dev)).then_some(VrateNews::AtFloor { dev, vrate, min, held })
        } else {
            self.floor_since.remove(&dev);
            self.warned.remove(&dev).then_some(VrateNews::LeftFloor { dev, vrate })
        }
    }

    /// Forgets a device no longer under io.cost (or gone): a later stay at the floor starts afresh.
    pub fn forget(&mut self, dev: DevNum) {
        self.floor_since.remove(&dev);
        self.warned.remove(&dev);
    }

    /// The devices being watched.
    pub fn devices(&self) -> impl Iterator<Item = DevNum> + '_ {
        self.floor_since.keys().copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEV: DevNum = DevNum { major: 7, minor: 0 };

    #[test]
    fn vrate_and_min_from_the_kernels_lines() {
        let stat = "8:0 rbytes=1 wbytes=2 rios=1 wios=1 dbytes=0 dios=0\n\
                    7:0 rbytes=10 wbytes=0 rios=1 wios=0 dbytes=0 dios=0 cost.vrate=10.00 cost.usage=5 cost.wait=0\n";
        assert_eq!(vrate_of(stat, DEV), Some(10.0));
        assert_eq!(vrate_of(stat, DevNum { major: 8, minor: 0 }), None, "io.cost off: no cost.vrate");
        assert_eq!(vrate_of(stat, DevNum { major: 7, minor: 1 }), None);
        // 7:01 is not 7:0's line, nor is a line that only mentions it later.
        assert_eq!(vrate_of("7:01 cost.vrate=5.00\n1:1 x=7:0 cost.vrate=9\n", DEV), None);
        assert_eq!(vrate_of("7:0 cost.vrate=abc\n", DEV), None);
        assert_eq!(vrate_of("7:0 cost.vrate=NaN\n", DEV), None);
        let qos = "7:0 enable=1 ctrl=user rpct=95.00 rlat=2000 wpct=95.00 wlat=2000 min=10.00 max=100.00\n";
        assert_eq!(qos_min_of(qos, DEV), Some(10.0));
        assert_eq!(qos_min_of(qos, DevNum { major: 7, minor: 2 }), None);
    }

    #[test]
    fn warns_once_after_the_hold_and_says_when_it_left() {
        let mut w = VrateWatch::default();
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        assert_eq!(w.observe(DEV, 10.0, 10.0, at(0)), None);
        assert_eq!(w.observe(DEV, 10.3, 10.0, at(20)), None, "not yet {HOLD:?}");
        assert_eq!(
            w.observe(DEV, 10.0, 10.0, at(30)),
            Some(VrateNews::AtFloor { dev: DEV, vrate: 10.0, min: 10.0, held: Duration::from_secs(30) })
        );
        assert_eq!(w.observe(DEV, 10.0, 10.0, at(35)), None, "one warning per stay");
        assert_eq!(w.observe(DEV, 42.0, 10.0, at(40)), Some(VrateNews::LeftFloor { dev: DEV, vrate: 42.0 }));
        assert_eq!(w.observe(DEV, 43.0, 10.0, at(45)), None);
        // A new stay: the hold starts again.
        assert_eq!(w.observe(DEV, 10.0, 10.0, at(50)), None);
        assert_eq!(w.observe(DEV, 10.0, 10.0, at(79)), None);
        assert!(matches!(w.observe(DEV, 10.0, 10.0, at(80)), Some(VrateNews::AtFloor { .. })));
    }

    #[test]
    fn a_dip_shorter_than_the_hold_is_no_news_and_forget_starts_afresh() {
        let mut w = VrateWatch::default();
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        for s in (0..100).step_by(5) {
            // 25 s at the floor, 5 s above, over and over.
            let vrate = if s % 30 == 25 { 50.0 } else { 25.0 };
            assert_eq!(w.observe(DEV, vrate, 25.0, at(s)), None, "at {s} s");
        }
        w.observe(DEV, 25.0, 25.0, at(100));
        w.forget(DEV);
        assert_eq!(w.devices().count(), 0);
        assert_eq!(w.observe(DEV, 25.0, 25.0, at(129)), None, "held only since the reading after forget");
    }
}
