//! One sampling round: read the counters of every container's cgroup through its [`CounterReader`].
//!
//! Two sets of N cgroups (N = 64, 256, 1024):
//! - `fixture`: directories in a temp dir holding regular files with the content of a real
//!   `blkio.bfq.io_service_bytes_recursive` (one device);
//! - `real_v1`: real blkio cgroups under a dedicated parent, each of which has done one 4 KiB O_DIRECT read on a
//!   BFQ loop device (so its file shows a device, like a busy container's). Only when running as root on a
//!   cgroup v1 host (`testbed::require`: elsewhere `SKIPPED`, a failure under `CI=true` or
//!   `DDISKQOS_REQUIRE_REAL=1`); removed afterwards.
//!
//! - `gated_idle_real_v1` (N = 1,024 only): the agent's own sampler (`FileCounters` with the parent gate) over
//!   the same real cgroups when none does I/O: a round is one read of the parent's recursive counters, which the
//!   kernel sums over every child (so it still grows with N), plus every 8th round a read of every child.
//!
//! Criterion reports time per round and, through `Throughput::Elements(N)`, containers per second; the
//! per-container cost is time / N (also printed at the end).

use std::collections::BTreeMap;
use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use testbed::blkio::{run_in_cgroup, CgroupGuard};
use testbed::fixture::{make_cgroup, Layout};
use testbed::loopdev::LoopDevice;
use testbed::{require, Need};

use qos_agent::backend::ContainerInfo;
use qos_agent::cgroup::{CgroupRoot, CgroupVersion, CounterFileKind, CounterReader};
use qos_agent::files::FileCounters;
use qos_core::ContainerId;

const SIZES: [usize; 3] = [64, 256, 1024];
const MAX: usize = 1024;

/// Real cgroups, with the loop device they did their I/O on; dropped (cgroups first) after the benchmark.
struct RealSet {
    cgroup: CgroupGuard,
    _disk: LoopDevice,
}

impl RealSet {
    fn new() -> Option<Self> {
        if !require("sampling_round real_v1", &[Need::Root, Need::BlkioV1, Need::LoopDevices, Need::Bfq]) {
            return None;
        }
        let disk = LoopDevice::with_bfq(64);
        let cgroup = CgroupGuard::new("ddiskqos-bench");
        let t = Instant::now();
        for i in 0..MAX {
            let child = cgroup.child(&format!("c{i}"));
            let script = format!("dd if={} of=/dev/null bs=4k count=1 iflag=direct status=none", disk.dev.display());
            run_in_cgroup(&child, &script);
        }
        eprintln!("sampling_round: {MAX} real cgroups with one read each, set up in {:?}", t.elapsed());
        Some(Self { cgroup, _disk: disk })
    }
}

fn open_readers(root: &CgroupRoot, parent_rel: &str, n: usize) -> Vec<CounterReader> {
    (0..n)
        .map(|i| {
            let dir = root.resolve_relative(&format!("{parent_rel}/c{i}")).unwrap();
            let reader = CounterReader::open(&dir).unwrap();
            assert_eq!(reader.kind(), CounterFileKind::V1Bfq);
            reader
        })
        .collect()
}

fn round(readers: &mut [CounterReader]) -> u64 {
    let mut total = 0u64;
    for r in readers.iter_mut() {
        total = total.wrapping_add(r.read().unwrap().read);
    }
    total
}

fn sampling_round(c: &mut Criterion) {
    // Up to 2 x MAX counter files are open at once (fixture and real): raise the soft descriptor limit to the hard
    // one, as the agent does at start, and say so if even that is too few (a shell's default soft limit is 1024).
    let nofile = qos_agent::ops::limits::raise_nofile_limit().expect("RLIMIT_NOFILE");
    let need = 2 * MAX as u64 + 64;
    assert!(
        nofile >= need,
        "sampling_round needs {need} open files; RLIMIT_NOFILE allows {nofile} (raise its hard limit)"
    );
    let tmp = tempfile::tempdir().unwrap();
    for i in 0..MAX {
        make_cgroup(&tmp.path().join("parent").join(format!("c{i}")), Layout::V1Bfq);
    }
    let fixture_root = CgroupRoot::from_dir(CgroupVersion::V1, tmp.path()).unwrap();
    let real = RealSet::new();
    let real_root = real.as_ref().map(|_| CgroupRoot::detect().unwrap());

    let mut summary = Vec::new();
    let mut group = c.benchmark_group("sampling_round");
    for n in SIZES {
        group.throughput(Throughput::Elements(n as u64));
        let mut readers = open_readers(&fixture_root, "parent", n);
        assert_eq!(round(&mut readers), n as u64 * (64 << 20));
        group.bench_with_input(BenchmarkId::new("fixture", n), &n, |b, _| b.iter(|| black_box(round(&mut readers))));
        summary.push(("fixture", n, per_container(&mut readers)));

        if let (Some(real), Some(root)) = (&real, &real_root) {
            let mut readers = open_readers(root, &real.cgroup.rel, n);
            assert_eq!(round(&mut readers), n as u64 * 4096, "every real cgroup read 4 KiB");
            group
                .bench_with_input(BenchmarkId::new("real_v1", n), &n, |b, _| b.iter(|| black_box(round(&mut readers))));
            summary.push(("real_v1", n, per_container(&mut readers)));

            if n != MAX {
                continue; // the parent's read sums over all MAX children, whatever N: only N = MAX is that case
            }
            let mut gated = gated_sampler(root, &real.cgroup.rel, n);
            let mut out = Vec::new();
            gated.sample_now(&mut out);
            assert_eq!(out.len(), n, "the first round reads every child (baselines)");
            group.bench_with_input(BenchmarkId::new("gated_idle_real_v1", n), &n, |b, _| {
                b.iter(|| {
                    out.clear();
                    gated.sample_now(&mut out);
                    black_box(out.len())
                })
            });
        }
    }
    group.finish();
    for (set, n, (median, min)) in summary {
        eprintln!(
            "sampling_round summary: {set:8} N={n:5}: {median:6.0} ns per container per round (median of 200 rounds), \
             {min:6.0} ns (fastest round)"
        );
    }
    drop(real);
}

/// The agent's sampler over `parent_rel/c0..cN`, with the parent gate.
fn gated_sampler(root: &CgroupRoot, parent_rel: &str, n: usize) -> FileCounters {
    let root = Arc::new(root.clone());
    let mut c = FileCounters::with_root(root.clone());
    for i in 0..n {
        let info = ContainerInfo {
            id: ContainerId::new(format!("c{i}")),
            name: format!("c{i}"),
            labels: BTreeMap::new(),
            cgroup: Some(root.resolve_relative(&format!("{parent_rel}/c{i}")).unwrap()),
        };
        c.attach_now(&info).unwrap();
    }
    c
}

/// A plain cross-check of criterion's figure, less sensitive to a busy machine: (median, minimum) of 200 timed
/// rounds, divided by N.
fn per_container(readers: &mut [CounterReader]) -> (f64, f64) {
    let mut samples: Vec<Duration> = (0..200)
        .map(|_| {
            let t = Instant::now();
            black_box(round(readers));
            t.elapsed()
        })
        .collect();
    samples.sort();
    let per = |d: Duration| d.as_nanos() as f64 / readers.len() as f64;
    (per(samples[samples.len() / 2]), per(samples[0]))
}

criterion_group!(benches, sampling_round);
criterion_main!(benches);
