//! The JSON file: the whole [`RunReport`] (configuration, machine, device, BFQ tunables per mode, raw samples,
//! histograms, live-engine decisions), pretty-printed, and its consistency check.

use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Context, Result};

use crate::report::data::RunReport;
use crate::stats::{Latency, Ratios, Spread, Summary};
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

/// Checks that a report is complete and self-consistent: every case has the three variants of every run (and the
/// static-best variant in every case of a mode where any case has it) with the planned number of samples, each
/// summary equals its histogram's, the histogram holds exactly the samples, and the ratios are the ratios of the
/// histograms' statistics.
pub fn check_consistency(run: &RunReport) -> Result<()> {
    let plan = &run.meta.plan;
    let soak = plan.is_soak();
    for mode in &run.modes {
        let m = mode.mode.name();
        let static_best = mode.exp1.iter().chain(&mode.exp2).any(|row| row.variant(Variant::StaticBest).is_some());
        let variants = Variant::measured(static_best);
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
            // A soak's rounds end with its clock, each round with every variant: the same count for all, at most
            // the planned.
            let mut round_count = None;
            for &v in &variants {
                let c = row.variant(v).with_context(|| format!("{m} {}: {} missing", row.label, v.label()))?;
                let hist = Latency::from_base64(&c.histogram_v2_base64)?;
                if !summaries_match(&c.summary, &hist.summary()) {
                    bail!("{m} {} {}: summary differs from its histogram", row.label, v.label());
                }
                let n = c.samples.len() as u64;
                let as_planned = if soak { n <= want_n && round_count.is_none_or(|r| r == n) } else { n == want_n };
                if c.summary.n != n || !as_planned {
                    let (l, v) = (&row.label, v.label());
                    let at_most = if soak { "at most the other variants' and " } else { "" };
                    bail!("{m} {l} {v}: {n} samples ({} in its summary), planned {at_most}{want_n}", c.summary.n);
                }
                round_count = Some(n);
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
            let want = static_best.then(|| Ratios::of(&s(Variant::DDiskQos), &s(Variant::StaticBest)));
            let same = match (&row.ddiskqos_over_static_best, &want) {
                (Some(a), Some(b)) => ratios_match(a, b),
                (None, None) => true,
                _ => false,
            };
            if !same {
                bail!("{m} {}: the ratios to static best are not those of the histograms", row.label);
            }
            // The per-repetition spreads a file stores (older files have none) are those of its samples.
            for (what, base, stored) in [
                ("Original", Variant::Original, row.reps_over_original),
                ("Alone", Variant::Alone, row.reps_over_alone),
                ("static best", Variant::StaticBest, row.reps_over_static_best),
            ] {
                if stored.is_some_and(|s| row.per_rep(base).is_none_or(|f| !spreads_match(&s, &f))) {
                    bail!("{m} {}: the per-repetition ratios to {what} are not those of the samples", row.label);
                }
            }
        }
    }
    Ok(())
}

/// Fills what a file may lack from its samples (the per-repetition spreads; [`check_consistency`] first).
pub fn complete(run: &mut RunReport) {
    for row in run.modes.iter_mut().flat_map(|m| m.exp1.iter_mut().chain(m.exp2.iter_mut())) {
        row.recompute_ratios();
    }
}

fn spreads_match(a: &Spread, b: &Spread) -> bool {
    a.n == b.n && close(a.median, b.median) && close(a.min, b.min) && close(a.max, b.max)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::table::tests::{fake_mode, fake_mode_static, fake_run};
    use crate::workload::{BfqMode, Exp1Case, Plan};

    /// A run of the fake modes (three repetitions of 1, 10 and 100 MiB, no Experiment 2) with its plan.
    fn run_of(modes: Vec<crate::report::data::ModeReport>) -> RunReport {
        let mut run = fake_run(modes);
        let exp1 = [1, 10, 100].into_iter().map(|size_mib| Exp1Case { size_mib, reps: 3 }).collect();
        run.meta.plan = Plan { exp1, exp2: Vec::new(), exp2_reps: 0 };
        for row in run.modes.iter_mut().flat_map(|m| &mut m.exp1) {
            let bytes = row.size_mib << 20;
            row.variants.iter_mut().flat_map(|c| &mut c.samples).for_each(|s| s.bytes = bytes);
        }
        run
    }

    fn round_trip(run: &RunReport) -> (String, RunReport) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("results.json");
        write(run, &path).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        (text, read(&path).unwrap())
    }

    #[test]
    fn a_run_with_static_best_round_trips_and_checks() {
        let run = run_of(vec![fake_mode_static(BfqMode::Strict, &[1.2, 1.3, 1.2], &[1.1, 1.0, 1.1])]);
        check_consistency(&run).unwrap();
        let (text, back) = round_trip(&run);
        assert!(text.contains("\"variant\": \"static-best\"") && text.contains("\"static-best\": {"), "{text}");
        check_consistency(&back).unwrap();
        let (a, b) = (&run.modes[0].exp1[0], &back.modes[0].exp1[0]);
        assert_eq!(b.variant(Variant::StaticBest).unwrap().samples.len(), 3);
        let (sa, sb) = (a.reps_over_static_best.unwrap(), b.reps_over_static_best.unwrap());
        assert!(sa.n == sb.n && close(sa.median, sb.median) && close(sa.max, sb.max), "{sa:?} {sb:?}");
        assert!(ratios_match(&a.ddiskqos_over_static_best.unwrap(), &b.ddiskqos_over_static_best.unwrap()));
        assert!(back.modes[0].background_blocks.contains_key(&Variant::StaticBest));
        // A case of the mode without it, or ratios that are not its histograms', fails the check.
        let mut missing = back.clone();
        missing.modes[0].exp1[1].variants.retain(|c| c.variant != Variant::StaticBest);
        let err = check_consistency(&missing).unwrap_err().to_string();
        assert!(err.contains("10MiB: Static best missing"), "{err}");
        let mut wrong = back;
        wrong.modes[0].exp1[2].ddiskqos_over_static_best = None;
        let err = check_consistency(&wrong).unwrap_err().to_string();
        assert!(err.contains("100MiB: the ratios to static best"), "{err}");
    }

    #[test]
    fn a_run_without_static_best_and_an_old_file_still_load() {
        let run = run_of(vec![fake_mode(BfqMode::Default, 20.0)]);
        let (text, back) = round_trip(&run);
        assert!(!text.contains("static"), "nothing of the variant in a run without it");
        check_consistency(&back).unwrap();
        assert!(back.modes[0].exp1.iter().all(|r| r.ddiskqos_over_static_best.is_none()));
        // A file from before the variant existed: none of its fields; it loads and checks as before.
        let mut old: serde_json::Value = serde_json::from_str(&text).unwrap();
        for row in old["modes"][0]["exp1"].as_array_mut().unwrap() {
            let row = row.as_object_mut().unwrap();
            assert!(row.remove("ddiskqos_over_static_best").is_none() && row.remove("reps_over_static_best").is_none());
            row.remove("reps_over_original");
        }
        let mut old: RunReport = serde_json::from_value(old).unwrap();
        check_consistency(&old).unwrap();
        assert!(old.modes[0].exp1[0].variant(Variant::StaticBest).is_none());
        // `report` fills the per-repetition spreads such a file lacks from its samples (the targets judge them).
        assert!(old.modes[0].exp1[0].reps_over_original.is_none());
        complete(&mut old);
        let (filled, fresh) = (old.modes[0].exp1[0].reps_over_original, run.modes[0].exp1[0].reps_over_original);
        assert!(filled.is_some_and(|f| spreads_match(&f, &fresh.unwrap())), "{filled:?} {fresh:?}");
    }

    #[test]
    fn stored_per_repetition_ratios_that_are_not_the_samples_fail_the_check() {
        let mut run = run_of(vec![fake_mode(BfqMode::Default, 20.0)]);
        check_consistency(&run).unwrap();
        let spread = run.modes[0].exp1[1].reps_over_original.as_mut().unwrap();
        spread.median *= 0.5;
        let err = check_consistency(&run).unwrap_err().to_string();
        assert!(err.contains("10MiB: the per-repetition ratios to Original are not those of the samples"), "{err}");
    }

    #[test]
    fn a_soak_checks_with_as_many_rounds_as_its_clock_allowed() {
        let mut run = run_of(vec![fake_mode(BfqMode::Default, 20.0)]);
        // A soak plans more rounds than it reaches: three of them here.
        let mut soak = Plan::soak();
        soak.exp1.retain(|c| [1, 10, 100].contains(&c.size_mib));
        soak.exp2.clear();
        assert!(soak.is_soak() && !Plan::quick().is_soak());
        run.meta.plan = soak;
        check_consistency(&run).unwrap();
        // But every variant of a case ran the same rounds.
        let mut short = run.clone();
        let orig = short.modes[0].exp1[0].variants.iter_mut().find(|c| c.variant == Variant::Original).unwrap();
        orig.samples.pop();
        let err = check_consistency(&short).unwrap_err().to_string();
        assert!(err.contains("1MiB Original: 2 samples (3 in its summary)"), "{err}");
        // And a plain run's count is the planned one.
        let exp1 = [1, 10, 100].into_iter().map(|size_mib| Exp1Case { size_mib, reps: 4 }).collect();
        run.meta.plan = Plan { exp1, exp2: Vec::new(), exp2_reps: 0 };
        let err = check_consistency(&run).unwrap_err().to_string();
        assert!(err.contains("3 samples (3 in its summary), planned 4"), "{err}");
    }
}
