//! The plan without fixture trees: concrete cases (v2, v1 BFQ), then a proptest against a small model of the kernel.

use std::collections::BTreeMap;

use proptest::prelude::*;

use super::*;

const BFQ: Governor = Governor { bfq: true, io_cost: false };
const IO_COST: Governor = Governor { bfq: false, io_cost: true };
const BOTH: Governor = Governor { bfq: true, io_cost: true };
const IO: WeightFileKind = WeightFileKind::V2Io;
const BFQ_FILE: WeightFileKind = WeightFileKind::V2Bfq;
const V1_DEV: WeightFileKind = WeightFileKind::V1BfqDevice;

fn dev(s: &str) -> DevNum {
    s.parse().unwrap()
}

fn w(v: u64) -> Weight {
    Weight::new(v).unwrap()
}

fn lines(default: u32, overrides: &[(&str, u32)]) -> WeightLines {
    WeightLines { default, devices: overrides.iter().map(|(d, v)| (dev(d), *v)).collect() }
}

/// loop3 (7:3) under BFQ, loop4 (7:4) under io.cost, vda (254:0) under nothing: the writer's fixture, as facts.
fn three() -> WeightPlan {
    WeightPlan::new([(dev("254:0"), Governor::NONE), (dev("7:3"), BFQ), (dev("7:4"), IO_COST)])
}

#[test]
fn each_device_gets_the_file_that_governs_it() {
    let plan = three();
    assert_eq!(plan.files(), [IO, BFQ_FILE], "io.weight first");
    assert_eq!(plan.governed_by(BFQ_FILE).collect::<Vec<_>>(), [dev("7:3")]);
    assert_eq!(plan.governed_by(IO).collect::<Vec<_>>(), [dev("7:4")]);
    assert_eq!(plan.expected(w(40)), [(dev("7:3"), BFQ_FILE, 40), (dev("7:4"), IO, 40)], "vda: nothing expected");
    // Sorted by device, a device named twice counted once.
    let again =
        WeightPlan::new([(dev("7:4"), IO_COST), (dev("7:3"), BFQ), (dev("7:4"), BFQ), (dev("254:0"), Governor::NONE)]);
    assert_eq!(again, plan);
}

#[test]
fn only_the_governing_files_are_written_and_both_when_none_governs() {
    assert_eq!(WeightPlan::new([(dev("7:3"), BFQ)]).files(), [BFQ_FILE]);
    assert_eq!(WeightPlan::new([(dev("7:4"), IO_COST)]).files(), [IO]);
    assert_eq!(WeightPlan::new([(dev("7:3"), BOTH)]).files(), [IO, BFQ_FILE]);
    assert_eq!(WeightPlan::new([(dev("254:0"), Governor::NONE)]).files(), [IO, BFQ_FILE]);
    assert_eq!(WeightPlan::new([]).files(), [IO, BFQ_FILE]);
}

#[test]
fn an_override_that_would_win_is_overwritten_and_others_left_alone() {
    let plan = three();
    // loop3 has its own io.bfq.weight line; 8:0 (not the cgroup's device) has one in io.weight.
    let bfq = lines(100, &[("7:3", 500)]);
    let io = lines(100, &[("8:0", 300)]);
    assert_eq!(plan.write_lines(BFQ_FILE, w(1000), &bfq), [Line::Default(1000), Line::Device(dev("7:3"), Some(1000))]);
    assert_eq!(plan.write_lines(IO, w(1000), &io), [Line::Default(1000)], "8:0 is not governed for this cgroup");
    // An override already at the value needs no line.
    assert_eq!(plan.write_lines(BFQ_FILE, w(500), &bfq), [Line::Default(500)]);
}

#[test]
fn check_names_the_device_and_whether_its_override_or_the_default_disagrees() {
    let plan = three();
    assert_eq!(plan.check(BFQ_FILE, w(10), &lines(10, &[])), Ok(()));
    // What Docker 20.10 does on v2: `default 10` in io.bfq.weight only; io.weight still reads 100 on loop4.
    let m = plan.check(IO, w(10), &lines(100, &[])).unwrap_err();
    assert_eq!(m, Mismatch { dev: Some(dev("7:4")), wrote: 10, read: 100, from_override: false });
    assert_eq!(m.what(), "the default");
    let m = plan.check(IO, w(10), &lines(10, &[("7:4", 300)])).unwrap_err();
    assert_eq!((m.read, m.what()), (300, "its MAJ:MIN override"));
    // An override on a device the file does not govern does not matter.
    assert_eq!(plan.check(IO, w(10), &lines(10, &[("7:3", 300)])), Ok(()));
    // A file that governs nothing here is checked by its default.
    let none = WeightPlan::new([(dev("254:0"), Governor::NONE)]);
    assert_eq!(none.check(BFQ_FILE, w(200), &lines(200, &[("254:0", 7)])), Ok(()));
    let m = none.check(BFQ_FILE, w(200), &lines(100, &[])).unwrap_err();
    assert_eq!(m, Mismatch { dev: None, wrote: 200, read: 100, from_override: false });
}

#[test]
fn in_force_and_device_weights_read_each_device_in_the_files_that_act_on_it() {
    let plan = three();
    let files = [(BFQ_FILE, lines(100, &[("7:3", 500)])), (IO, lines(40, &[]))];
    assert_eq!(plan.in_force(&files), [(dev("7:3"), BFQ_FILE, 500), (dev("7:4"), IO, 40)]);
    let status: Vec<_> = plan.device_weights(&files).into_iter().map(|d| (d.dev, d.governor, d.effective)).collect();
    assert_eq!(
        status,
        [
            (dev("7:3"), BFQ, vec![(BFQ_FILE, 500)]),
            (dev("7:4"), IO_COST, vec![(IO, 40)]),
            (dev("254:0"), Governor::NONE, vec![])
        ]
    );
    // A file the cgroup lacks (no BFQ module) contributes nothing.
    assert_eq!(plan.in_force(&files[1..]), [(dev("7:4"), IO, 40)]);
}

#[test]
fn restore_lines_put_a_file_back_as_snapshotted() {
    let want = lines(100, &[("7:3", 500)]);
    // The agent wrote 10 everywhere and someone added an override on 7:4.
    let now = lines(10, &[("7:3", 10), ("7:4", 900)]);
    assert_eq!(
        restore_lines(IO, &want, &now),
        [Line::Default(100), Line::Device(dev("7:4"), None), Line::Device(dev("7:3"), Some(500))]
    );
    assert_eq!(restore_lines(IO, &want, &want), []);
    assert_eq!(check_restored(&want, &want), Ok(()));
    let m = check_restored(&want, &lines(100, &[("7:3", 500), ("7:4", 900)])).unwrap_err();
    assert_eq!(m, Mismatch { dev: Some(dev("7:4")), wrote: 100, read: 900, from_override: true });
    let m = check_restored(&want, &lines(10, &[("7:3", 500)])).unwrap_err();
    assert_eq!((m.dev, m.wrote, m.read), (None, 100, 10));
}

#[test]
fn v1_plans_blkio_bfq_weight_device_on_bfq_devices() {
    // loop0 under BFQ, vda under mq-deadline: on v1 only the per-device file, and only BFQ devices are governed.
    let plan = WeightPlan::over(&V1_FILES, [(dev("7:0"), BFQ), (dev("254:0"), Governor::NONE)]);
    assert_eq!(plan.files(), [V1_DEV]);
    assert_eq!(plan.governed_by(V1_DEV).collect::<Vec<_>>(), [dev("7:0")]);
    assert_eq!(plan.expected(w(10)), [(dev("7:0"), V1_DEV, 10)]);
    // Nothing governed: still the one v1 file, checked by its default.
    let none = WeightPlan::over(&V1_FILES, [(dev("254:0"), Governor::NONE)]);
    assert_eq!(none.files(), [V1_DEV]);
    assert_eq!(none.check(V1_DEV, w(10), &lines(10, &[])), Ok(()));
    // An override on loop0 (`docker run --blkio-weight-device`, an operator) is what acts there.
    let m = plan.check(V1_DEV, w(10), &lines(10, &[("7:0", 300)])).unwrap_err();
    assert_eq!(m, Mismatch { dev: Some(dev("7:0")), wrote: 10, read: 300, from_override: true });
}

#[test]
fn a_bfq_default_line_removes_the_overrides_so_other_devices_get_theirs_back() {
    // As the kernel reads blkio.bfq.weight_device: `default 40` after `7:0 250` leaves `default 40` alone.
    let plan = WeightPlan::over(&V1_FILES, [(dev("7:0"), BFQ)]);
    let current = lines(100, &[("7:0", 300), ("8:0", 500)]);
    assert_eq!(
        plan.write_lines(V1_DEV, w(10), &current),
        [Line::Default(10), Line::Device(dev("7:0"), Some(10)), Line::Device(dev("8:0"), Some(500))],
        "8:0 is not the cgroup's device: its override is written back"
    );
    // Same in v2's io.bfq.weight, which the kernel parses alike; io.weight keeps its overrides by itself.
    let v2 = WeightPlan::new([(dev("7:0"), BFQ)]);
    assert_eq!(v2.write_lines(BFQ_FILE, w(10), &current)[2], Line::Device(dev("8:0"), Some(500)));
    assert_eq!(v2.write_lines(IO, w(10), &current), [Line::Default(10)]);
}

#[test]
fn a_bfq_restore_that_writes_the_default_writes_every_override_after_it() {
    // The snapshot had 7:0 at 300; the agent's last write left `default 300` with 7:0 at 300 too.
    let want = lines(100, &[("7:0", 300)]);
    let now = lines(300, &[("7:0", 300)]);
    assert_eq!(restore_lines(V1_DEV, &want, &now), [Line::Default(100), Line::Device(dev("7:0"), Some(300))]);
    assert_eq!(restore_lines(IO, &want, &now), [Line::Default(100)], "io.weight keeps 7:0 through the default");
    // An override the agent added is removed; with the default unchanged nothing else is written.
    assert_eq!(restore_lines(V1_DEV, &lines(100, &[]), &lines(100, &[("7:0", 10)])), [Line::Device(dev("7:0"), None)]);
}

// ----- against a model of the kernel -----

/// One weight file with per-device lines as the kernel keeps it: a default and per-device overrides, which a
/// default line removes if `clears` (BFQ's files on Linux 6.18).
#[derive(Debug, Clone, PartialEq, Eq)]
struct KernelFile {
    default: u32,
    overrides: BTreeMap<DevNum, u32>,
    clears: bool,
}

impl KernelFile {
    fn of(lines: &WeightLines) -> Self {
        Self { default: lines.default, overrides: lines.devices.clone(), clears: false }
    }

    /// A file whose default line removes the overrides if `clears`.
    fn clearing(lines: &WeightLines, clears: bool) -> Self {
        Self { clears, ..Self::of(lines) }
    }

    fn lines(&self) -> WeightLines {
        WeightLines { default: self.default, devices: self.overrides.clone() }
    }

    /// What the kernel does with one written line.
    fn write(&mut self, line: Line) {
        match line {
            Line::Default(v) => {
                self.default = v;
                if self.clears {
                    self.overrides.clear();
                }
            }
            Line::Device(d, Some(v)) => {
                self.overrides.insert(d, v);
            }
            Line::Device(d, None) => {
                self.overrides.remove(&d);
            }
        }
    }

    /// The weight the file applies to `dev`: its override, else the default.
    fn on(&self, dev: DevNum) -> u32 {
        self.overrides.get(&dev).copied().unwrap_or(self.default)
    }
}

/// The kernel's rule, written independently of [`governs`]: io.weight under io.cost, io.bfq.weight and v1's
/// blkio.bfq.weight_device under BFQ.
fn acts(kind: WeightFileKind, g: Governor) -> bool {
    (kind == IO && g.io_cost) || ((kind == BFQ_FILE || kind == V1_DEV) && g.bfq)
}

fn a_dev() -> impl Strategy<Value = DevNum> {
    // A small pool, so overrides often land on the cgroup's devices.
    (prop_oneof![Just(7u32), Just(8), Just(254)], 0u32..3).prop_map(|(major, minor)| DevNum { major, minor })
}

fn a_governor() -> impl Strategy<Value = Governor> {
    (any::<bool>(), any::<bool>()).prop_map(|(bfq, io_cost)| Governor { bfq, io_cost })
}

fn a_value() -> impl Strategy<Value = u32> {
    prop_oneof![Just(100u32), Just(10), Just(1000), 1u32..=10_000]
}

fn a_file() -> impl Strategy<Value = WeightLines> {
    (a_value(), proptest::collection::btree_map(a_dev(), a_value(), 0..4))
        .prop_map(|(default, devices)| WeightLines { default, devices })
}

fn a_weight() -> impl Strategy<Value = Weight> {
    prop_oneof![Just(10u64), Just(100), Just(1000), 1u64..=1000].prop_map(|v| Weight::new(v).unwrap())
}

fn a_plan() -> impl Strategy<Value = WeightPlan> {
    proptest::collection::vec((a_dev(), a_governor()), 0..4).prop_map(WeightPlan::new)
}

/// A v2 or a v1 plan.
fn a_plan_of_either() -> impl Strategy<Value = WeightPlan> {
    let kinds = prop_oneof![Just(&V2_FILES[..]), Just(&V1_FILES[..])];
    (kinds, proptest::collection::vec((a_dev(), a_governor()), 0..4))
        .prop_map(|(kinds, devices)| WeightPlan::over(kinds, devices))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// After the plan's lines, every device reads the weight in every file that acts on it, nothing else changed
    /// but the defaults of the files written, and the plan's check and expectations agree with the model: on v2
    /// and v1, whether or not BFQ's default line removes the overrides.
    #[test]
    fn a_written_weight_is_in_force_on_every_governed_device(
        plan in a_plan_of_either(), io in a_file(), bfq in a_file(), weight in a_weight(), clears in any::<bool>()
    ) {
        let before: Vec<(WeightFileKind, WeightLines)> = if plan.kinds() == V1_FILES {
            vec![(V1_DEV, bfq)]
        } else {
            vec![(IO, io), (BFQ_FILE, bfq)]
        };
        let mut kernel: std::collections::HashMap<WeightFileKind, KernelFile> = before
            .iter()
            .map(|(k, l)| (*k, KernelFile::clearing(l, clears && k.default_clears_overrides())))
            .collect();
        let written = plan.files();
        for kind in &written {
            let current = kernel[kind].lines();
            for line in plan.write_lines(*kind, weight, &current) {
                kernel.get_mut(kind).unwrap().write(line);
            }
        }
        let mut expected = Vec::new();
        let mut governed_any = false;
        for (dev, g) in plan.devices() {
            for kind in plan.kinds().iter().copied() {
                if acts(kind, *g) {
                    governed_any = true;
                    prop_assert_eq!(kernel[&kind].on(*dev), kind.file_value(weight), "{} on {}", kind.file_name(), dev);
                    expected.push((*dev, kind, kind.file_value(weight)));
                }
            }
        }
        prop_assert_eq!(plan.expected(weight), expected);
        for (kind, lines) in &before {
            let after = &kernel[kind];
            if !written.contains(kind) {
                prop_assert_eq!(&after.lines(), lines, "{} not written", kind.file_name());
                continue;
            }
            prop_assert_eq!(after.default, kind.file_value(weight), "{} default", kind.file_name());
            // Overrides of devices the file does not act on for this cgroup are someone else's.
            for (dev, v) in &lines.devices {
                let ours = plan.devices().iter().any(|(d, g)| d == dev && acts(*kind, *g));
                if !ours {
                    prop_assert_eq!(after.overrides.get(dev), Some(v), "{} override of {} kept", kind.file_name(), dev);
                }
            }
            prop_assert_eq!(plan.check(*kind, weight, &after.lines()), Ok(()));
        }
        if !governed_any {
            prop_assert_eq!(written, plan.kinds().to_vec(), "nothing governed: every file");
        }
    }

    /// The check passes exactly when the model says the weight is in force (or, on a file governing nothing, its
    /// default holds it).
    #[test]
    fn the_check_agrees_with_the_model(plan in a_plan(), file in a_file(), weight in a_weight(), io in any::<bool>()) {
        let kind = if io { IO } else { BFQ_FILE };
        let k = KernelFile::of(&file);
        let value = kind.file_value(weight);
        let governed: Vec<DevNum> =
            plan.devices().iter().filter(|(_, g)| acts(kind, *g)).map(|(d, _)| *d).collect();
        let in_force = if governed.is_empty() { k.default == value } else { governed.iter().all(|d| k.on(*d) == value) };
        prop_assert_eq!(plan.check(kind, weight, &file).is_ok(), in_force);
        let mut want_in_force = Vec::new();
        for (dev, g) in plan.devices() {
            if acts(kind, *g) {
                want_in_force.push((*dev, kind, k.on(*dev)));
            }
        }
        prop_assert_eq!(plan.in_force(&[(kind, file.clone())]), want_in_force);
    }

    /// The restore lines turn any file back into the snapshot, whether or not BFQ's default line removes the
    /// overrides, and the restore check passes exactly then.
    #[test]
    fn a_restore_puts_the_snapshot_back(
        want in a_file(), now in a_file(), kind in prop_oneof![Just(IO), Just(BFQ_FILE), Just(V1_DEV)],
        clears in any::<bool>()
    ) {
        let mut k = KernelFile::clearing(&now, clears && kind.default_clears_overrides());
        for line in restore_lines(kind, &want, &now) {
            k.write(line);
        }
        prop_assert_eq!(&k.lines(), &want);
        prop_assert_eq!(check_restored(&want, &k.lines()), Ok(()));
        prop_assert_eq!(check_restored(&want, &now).is_ok(), want == now);
    }
}
