//! Which unit properties yield a weight in the file that governs each device.
//!
//! systemd has one scale, `IOWeight` 1..=10000 (default 100), and writes it to both files: `io.weight` as is, and
//! `io.bfq.weight` mapped onto BFQ's 1..=1000 — the identity up to 100, then linear from 100 to 10000 onto 100 to
//! 1000 (measured in the systemd guest, systemd 252: 700 → 154, 1200 → 200, 10000 → 1000). `IODeviceWeight` entries
//! go, per device, to `io.bfq.weight` when the device's scheduler is BFQ and to `io.weight` otherwise (measured:
//! `/dev/loop0 40` on a BFQ device gave `io.bfq.weight` `7:0 40` and no `io.weight` line).
//!
//! The agent's weights are BFQ-scale (1..=1000) and go to `io.weight` unchanged (`Weight::to_io_weight`). One
//! `IOWeight` cannot give both files the same number above 100, so: `IOWeight` is chosen for BFQ (its default line
//! then reads the weight on every BFQ device), and every device under io.cost gets an `IODeviceWeight` entry with
//! the weight itself (its `io.weight` line). Every io.cost device of the host is listed, not only those a container
//! has used, so a new container is at its weight on each before its first I/O.

use qos_core::Weight;

use crate::kernel::DevNum;

/// systemd's default `IOWeight` (also the kernel's default in both files).
pub const IO_WEIGHT_DEFAULT: u64 = 100;
/// systemd's largest `IOWeight`.
pub const IO_WEIGHT_MAX: u64 = 10_000;
/// BFQ's largest weight.
pub const BFQ_WEIGHT_MAX: u64 = 1_000;

/// What systemd writes into `io.bfq.weight` for `IOWeight` `io_weight` (1..=10000).
pub fn bfq_weight_of(io_weight: u64) -> u64 {
    if io_weight <= IO_WEIGHT_DEFAULT {
        io_weight
    } else {
        IO_WEIGHT_DEFAULT
            + (io_weight - IO_WEIGHT_DEFAULT) * (BFQ_WEIGHT_MAX - IO_WEIGHT_DEFAULT)
                / (IO_WEIGHT_MAX - IO_WEIGHT_DEFAULT)
    }
}

/// The smallest `IOWeight` for which systemd writes `weight` into `io.bfq.weight`.
pub fn io_weight_for_bfq(weight: Weight) -> u64 {
    let w = u64::from(weight.get());
    if w <= IO_WEIGHT_DEFAULT {
        w
    } else {
        // The map's slope is 900/9900 = 1/11: eleven IOWeight steps per BFQ step, exactly.
        IO_WEIGHT_DEFAULT
            + (w - IO_WEIGHT_DEFAULT) * (IO_WEIGHT_MAX - IO_WEIGHT_DEFAULT) / (BFQ_WEIGHT_MAX - IO_WEIGHT_DEFAULT)
    }
}

/// The unit properties for one weight.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnitIoWeights {
    /// `IOWeight`: yields the weight in `io.bfq.weight`'s default line.
    pub io_weight: u64,
    /// `IODeviceWeight` entries `(device node, weight)`, one per device under io.cost (its `io.weight` line). Empty:
    /// the property is left as it is.
    pub device_weights: Vec<(String, u64)>,
}

impl UnitIoWeights {
    /// The properties that put `weight` in force on BFQ devices and on every device of `io_cost_devices`.
    pub fn for_weight(weight: Weight, io_cost_devices: &[DevNum]) -> Self {
        let device_weights =
            io_cost_devices.iter().map(|d| (device_node(*d), u64::from(weight.to_io_weight()))).collect();
        Self { io_weight: io_weight_for_bfq(weight), device_weights }
    }
}

/// The node systemd resolves to a device number: udev's `/dev/block/MAJ:MIN` link (no name lookup needed).
pub fn device_node(dev: DevNum) -> String {
    format!("/dev/block/{}:{}", dev.major, dev.minor)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(v: u64) -> Weight {
        Weight::new(v).unwrap()
    }

    #[test]
    fn the_measured_points_of_systemds_map() {
        // systemd 252 in the guest: set-property IOWeight=N, then io.bfq.weight read.
        assert_eq!(bfq_weight_of(700), 154);
        assert_eq!(bfq_weight_of(1200), 200);
        assert_eq!(bfq_weight_of(10_000), 1000);
        assert_eq!(bfq_weight_of(100), 100);
        assert_eq!(bfq_weight_of(40), 40);
    }

    #[test]
    fn every_agent_weight_has_the_smallest_io_weight_that_yields_it() {
        for v in 1..=1000 {
            let x = io_weight_for_bfq(w(v));
            assert!((1..=IO_WEIGHT_MAX).contains(&x), "{v} -> {x}");
            assert_eq!(bfq_weight_of(x), v, "IOWeight {x} for {v}");
            assert!(x == 1 || bfq_weight_of(x - 1) < v, "{x} is not the smallest for {v}");
        }
        assert_eq!(io_weight_for_bfq(w(1000)), 10_000);
        assert_eq!(io_weight_for_bfq(w(200)), 1200);
        assert_eq!(io_weight_for_bfq(w(10)), 10);
    }

    #[test]
    fn io_cost_devices_get_the_weight_itself_per_device() {
        let devs = [DevNum { major: 7, minor: 1 }, DevNum { major: 259, minor: 0 }];
        let p = UnitIoWeights::for_weight(w(1000), &devs);
        assert_eq!(p.io_weight, 10_000);
        assert_eq!(p.device_weights, vec![("/dev/block/7:1".into(), 1000), ("/dev/block/259:0".into(), 1000)]);
        let none = UnitIoWeights::for_weight(w(40), &[]);
        assert_eq!(none, UnitIoWeights { io_weight: 40, device_weights: vec![] });
    }
}
