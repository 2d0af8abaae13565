//! The JSON file: the whole [`RunReport`] (configuration, machine, device, BFQ tunables per mode, raw samples,
//! histograms, live-engine decisions), pretty-printed, and its consistency check.

use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Context, Result};

use crate::report::data::RunReport;
use crate::stats::{Latency, Ratios, Summary};
use crate::workload::Variant;

/// Serializes a duration as milliseconds (`#[serde(serialize_with = "crate::report::json::ser_ms")]`).
pub(crate) fn ser_ms<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64() * 1e3)
}

/// Writes the report.
pub fn write(run: &RunReport, path: &Path) -> Result<()> {
    let text = serde_json::to_string_pretty(run)?;
    std::fs::write(path, text).with_context(|| format!("cannot write {}", path.display()))
}

/// Reads a report back.
pub fn read(path: &Path) -> Result<RunReport> {
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("{} is not a ddiskqos-bench report", path.display()))
}

/// Equal up to float parsing (serde_json's default float parser is not correctly rounded in the last bit).
fn ratios_match(a: &Ratios, b: &Ratios) -> bool {
    let eq = |x: Option<f64>, y: Option<f64>| match (x, y) {
        (Some(x), Some(y)) => close(x, y),
        (None, None) => true,
        _ => false,
    };
    eq(a.mean, b.mean) && eq(a.p50, b.p50) && eq(a.p90, b.p90) && eq(a.p99, b.p99) && eq(a.max, b.max)
}

fn close(x: f64, y: f64) -> bool {
    (x - y).abs() <= 1e-9 * x.abs().max(y.abs())
}

fn summaries_match(a: &Summary, b: &Summary) -> bool {
    a.n == b.n
        && [(a.mean_ms, b.mean_ms), (a.p50_ms, b.p50_ms), (a.p90_ms, b.p90_ms), (a.p99_ms, b.p99_ms)]
            .into_iter()
            .chain([(a.max_ms, b.max_ms), (a.min_ms, b.min_ms)])
            .all(|(x, y)| close(x, y))
}

/// Checks that a report is complete and self-consistent: every case has all three variants with the planned
/// number of samples, each summary equals its histogram's, the histogram holds exactly the samples, and the
/// ratios are the ratios of the histograms' statistics.
pub fn check_consistency(run: &RunReport) -> Result<()> {
    let plan = &run.meta.plan;
    for mode in &run.modes {
        let m = mode.mode.name();
        let mut sizes: Vec<u64> = plan.exp1.iter().map(|c| c.size_mib).collect();
        sizes.sort_unstable();
        sizes.dedup();
        let got: Vec<u64> = mode.exp1.iter().map(|r| r.size_mib).collect();
        if !mode.exp1.is_empty() && got != sizes {
            bail!("{m}: experiment 1 has sizes {got:?}, planned {sizes:?}");
        }
        if !mode.exp2.is_empty() && mode.exp2.len() != plan.exp2.len() {
            bail!("{m}: experiment 2 has {} readers, planned {}", mode.exp2.len(), plan.exp2.len());
        }
        for row in mode.exp1.iter().chain(&mode.exp2) {
            let want_n = match row.start_ms {
                None => plan.exp1.iter().find(|c| c.size_mib == row.size_mib).map(|c| u64::from(c.reps)).unwrap_or(0),
                Some(_) => u64::from(plan.exp2_reps),
            };
            for v in Variant::ALL {
                let c = row.variant(v).with_context(|| format!("{m} {}: {} missing", row.label, v.label()))?;
                let hist = Latency::from_base64(&c.histogram_v2_base64)?;
                if !summaries_match(&c.summary, &hist.summary()) {
                    bail!("{m} {} {}: summary differs from its histogram", row.label, v.label());
                }
                if c.summary.n != want_n || c.samples.len() as u64 != want_n {
                    bail!("{m} {} {}: {} samples, planned {want_n}", row.label, v.label(), c.summary.n);
                }
                let mut from_samples = Latency::new();
                for s in &c.samples {
                    from_samples.record(std::time::Duration::from_secs_f64(s.read_ms / 1e3));
                    if s.bytes != row.size_mib << 20 {
                        bail!("{m} {} {}: a read of {} bytes", row.label, v.label(), s.bytes);
                    }
                }
                if from_samples.value_counts() != hist.value_counts() {
                    bail!("{m} {} {}: histogram does not hold the samples", row.label, v.label());
                }
            }
            let s = |v| row.variant(v).map(|c| c.summary).expect("checked above");
            if !ratios_match(&row.ddiskqos_over_original, &Ratios::of(&s(Variant::DDiskQos), &s(Variant::Original)))
                || !ratios_match(&row.ddiskqos_over_alone, &Ratios::of(&s(Variant::DDiskQos), &s(Variant::Alone)))
            {
                bail!("{m} {}: ratios are not those of the histograms", row.label);
            }
        }
    }
    Ok(())
}
