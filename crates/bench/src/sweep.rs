//! `sweep`: one knob at a time around the baseline (the flags, by default the paper's configuration): the bottom
//! level's weight, the sampling interval, the boost period; each in both BFQ modes, on 1 and 10 MiB reads with
//! Alone, Original and dDiskQoS interleaved. Prints, per mode, the setting with the best small-read latency among
//! those whose background keeps at least `--min-background` of Original's throughput.

use std::fmt::Write as _;
use std::time::Duration;

use anyhow::Result;
use qos_core::{Config, Weight};
use serde::Serialize;

use crate::app;
use crate::cleanup::Cleanup;
use crate::cli::SweepArgs;
use crate::disk::DiskInfo;
use crate::report::data::ModeReport;
use crate::report::table::{background_ratio, fmt_ms};
use crate::runner;
use crate::workload::{BfqMode, Exp1Case, Plan, Variant};

/// One point of the sweep.
#[derive(Debug, Clone, Serialize)]
pub struct Setting {
    /// Human-readable name.
    pub name: String,
    /// Engine configuration.
    pub engine: Config,
    /// Sampling interval.
    #[serde(serialize_with = "crate::report::json::ser_ms")]
    pub sample_interval: Duration,
    /// BFQ tunables set for this setting only (`KEY=VALUE`).
    pub bfq: Vec<String>,
}

/// `sweep.json`.
#[derive(Debug, Serialize)]
pub struct SweepReport {
    /// When the sweep ended (UTC).
    pub date_utc: String,
    /// `uname -r`.
    pub kernel: String,
    /// `cgroup` or `docker`.
    pub runtime: String,
    /// The device.
    pub disk: DiskInfo,
    /// Smallest acceptable background share of Original's.
    pub min_background: f64,
    /// Every setting in every mode.
    pub points: Vec<Point>,
}

/// The settings: the baseline, then each knob varied alone.
pub fn settings(base: &Config, interval: Duration) -> Vec<Setting> {
    let mut out =
        vec![Setting { name: "baseline".into(), engine: base.clone(), sample_interval: interval, bfq: Vec::new() }];
    let bottom = base.bottom();
    for w in [1u64, 50, 100] {
        let mut cfg = base.clone();
        let weight = Weight::new(w).expect("in range");
        if cfg.levels[bottom].weight == weight {
            continue;
        }
        cfg.levels[bottom].weight = weight;
        // Keep weights non-increasing down the levels.
        for i in (0..bottom).rev() {
            if cfg.levels[i].weight < cfg.levels[i + 1].weight {
                cfg.levels[i].weight = cfg.levels[i + 1].weight;
            }
        }
        out.push(Setting {
            name: format!("bottom weight {w}"),
            engine: cfg,
            sample_interval: interval,
            bfq: Vec::new(),
        });
    }
    for ms in [25u64, 500] {
        let d = Duration::from_millis(ms);
        if d != interval {
            out.push(Setting {
                name: format!("sampling {ms} ms"),
                engine: base.clone(),
                sample_interval: d,
                bfq: Vec::new(),
            });
        }
    }
    for s in [2u64, 60] {
        let d = Duration::from_secs(s);
        if d != base.boost_after {
            let cfg = Config { boost_after: d, ..base.clone() };
            out.push(Setting {
                name: format!("boost after {s} s"),
                engine: cfg,
                sample_interval: interval,
                bfq: Vec::new(),
            });
        }
    }
    // BFQ's own low-latency heuristics (weight raising, injection) act inside groups and may fight the weights.
    out.push(Setting {
        name: "bfq low_latency=0".into(),
        engine: base.clone(),
        sample_interval: interval,
        bfq: vec!["low_latency=0".into()],
    });
    out
}

/// The settings of a BFQ-tunable sweep: the baseline, then one setting per `--bfq-point` (`K=V+K=V`), the engine
/// fixed. A point that is not a list of `KEY=VALUE` is an error naming it.
pub fn bfq_settings(base: &Config, interval: Duration, points: &[String]) -> Result<Vec<Setting>> {
    let mut out =
        vec![Setting { name: "baseline".into(), engine: base.clone(), sample_interval: interval, bfq: Vec::new() }];
    for point in points {
        let bfq: Vec<String> = point.split('+').map(|a| a.trim().to_string()).collect();
        for a in &bfq {
            match a.split_once('=') {
                Some((k, v)) if !k.is_empty() && !v.is_empty() => {}
                _ => anyhow::bail!("--bfq-point {point:?}: {a:?} is not KEY=VALUE"),
            }
        }
        out.push(Setting { name: bfq.join(" "), engine: base.clone(), sample_interval: interval, bfq });
    }
    Ok(out)
}

/// Result of one setting in one mode.
#[derive(Debug, Clone, Serialize)]
pub struct Point {
    /// BFQ mode.
    pub mode: BfqMode,
    /// The setting.
    pub setting: Setting,
    /// Geometric mean over 1 and 10 MiB of dDiskQoS mean / Alone mean (1 = the physical limit).
    pub score: Option<f64>,
    /// dDiskQoS / Original background throughput over whole blocks.
    pub background: Option<f64>,
    /// The full results.
    pub report: ModeReport,
}

/// Score of a mode's results: geometric mean of dDiskQoS/Alone mean ratios.
pub fn score(report: &ModeReport) -> Option<f64> {
    let ratios: Vec<f64> = report.exp1.iter().filter_map(|r| r.ddiskqos_over_alone.mean).collect();
    if ratios.is_empty() || ratios.len() != report.exp1.len() {
        return None;
    }
    Some((ratios.iter().map(|r| r.ln()).sum::<f64>() / ratios.len() as f64).exp())
}

/// The best point of a mode: lowest score among those with enough background.
pub fn best(points: &[Point], mode: BfqMode, min_background: f64) -> Option<&Point> {
    points
        .iter()
        .filter(|p| p.mode == mode && p.background.is_some_and(|b| b >= min_background))
        .filter(|p| p.score.is_some())
        .min_by(|a, b| a.score.partial_cmp(&b.score).unwrap_or(std::cmp::Ordering::Equal))
}

/// Renders the sweep table.
pub fn render(points: &[Point], modes: &[BfqMode], min_background: f64) -> String {
    let mut out = String::new();
    for &mode in modes {
        let _ = writeln!(out, "\nsweep, {}", mode.label());
        let _ = writeln!(
            out,
            "{:<34} {:>27} {:>27} {:>27} {:>27} {:>7} {:>8}",
            "setting (ms: Alone/Orig/dDQ)", "1MiB mean", "1MiB p99", "10MiB mean", "10MiB p99", "score", "bg/Orig"
        );
        for p in points.iter().filter(|p| p.mode == mode) {
            let cell = |size: u64, p99: bool| {
                let row = p.report.exp1.iter().find(|r| r.size_mib == size);
                [Variant::Alone, Variant::Original, Variant::DDiskQos]
                    .iter()
                    .map(|&v| {
                        row.and_then(|r| r.variant(v))
                            .map(|c| fmt_ms(if p99 { c.summary.p99_ms } else { c.summary.mean_ms }))
                            .unwrap_or_else(|| "-".into())
                    })
                    .collect::<Vec<_>>()
                    .join("/")
            };
            let _ = writeln!(
                out,
                "{:<34} {:>27} {:>27} {:>27} {:>27} {:>7} {:>8}",
                p.setting.name,
                cell(1, false),
                cell(1, true),
                cell(10, false),
                cell(10, true),
                p.score.map(|s| format!("{s:.2}")).unwrap_or_else(|| "-".into()),
                p.background.map(|b| format!("{:.0} %", b * 100.0)).unwrap_or_else(|| "-".into()),
            );
        }
        match best(points, mode, min_background) {
            Some(p) => {
                let _ = writeln!(
                    out,
                    "best in {} mode: {} (dDiskQoS/Alone {:.2}, background {:.0} % of Original)",
                    mode.name(),
                    p.setting.name,
                    p.score.unwrap_or(f64::NAN),
                    p.background.unwrap_or(f64::NAN) * 100.0
                );
            }
            None => {
                let _ = writeln!(
                    out,
                    "no setting kept the background >= {:.0} % in {} mode",
                    min_background * 100.0,
                    mode.name()
                );
            }
        }
    }
    out
}

/// `sweep`.
pub fn run(args: &SweepArgs, cleanup: &'static Cleanup) -> Result<()> {
    app::preflight(&args.common.modes)?;
    let common = &args.common;
    let plan = Plan {
        exp1: vec![Exp1Case { size_mib: 1, reps: args.reps }, Exp1Case { size_mib: 10, reps: args.reps }],
        exp2: Vec::new(),
        exp2_reps: 0,
    };
    let base = app::run_config(common, plan.clone(), true, false)?;
    let setup = app::set_up(common, &plan, cleanup)?;
    let env = setup.env();
    let list = if args.bfq_points.is_empty() {
        settings(&base.engine, base.sample_interval)
    } else {
        bfq_settings(&base.engine, base.sample_interval, &args.bfq_points)?
    };
    let bar = app::progress(u64::from(args.reps) * 2 * 3 * (list.len() * common.modes.len()) as u64);
    let mut points = Vec::new();
    for &mode in &common.modes {
        for setting in &list {
            let cfg = runner::RunConfig {
                engine: setting.engine.clone(),
                sample_interval: setting.sample_interval,
                ..base.clone()
            };
            let mut restore = Vec::new();
            for assignment in &setting.bfq {
                restore.push(setup.disk.set_tunable(assignment, cleanup)?);
            }
            let report = runner::run_mode(&env, &cfg, mode, &bar);
            for token in restore.into_iter().rev() {
                cleanup.run(token)?;
            }
            let report = report?;
            points.push(Point {
                mode,
                setting: setting.clone(),
                score: score(&report),
                background: background_ratio(&report),
                report,
            });
        }
    }
    bar.finish_and_clear();
    let text = render(&points, &common.modes, args.min_background);
    print!("{text}");
    std::fs::create_dir_all(&common.out)?;
    std::fs::write(common.out.join("sweep.txt"), &text)?;
    let json = SweepReport {
        date_utc: crate::sys::utc_now(),
        kernel: crate::sys::kernel_release(),
        runtime: setup.runtime.name().into(),
        disk: setup.disk.info.clone(),
        min_background: args.min_background,
        points,
    };
    std::fs::write(common.out.join("sweep.json"), serde_json::to_string_pretty(&json)?)?;
    println!("\nwrote {}", common.out.join("sweep.json").display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_vary_one_knob_and_stay_valid() {
        let base = Config::default();
        let list = settings(&base, Duration::from_millis(100));
        assert_eq!(list[0].name, "baseline");
        assert!(list.len() >= 7);
        for s in &list {
            s.engine.validate().unwrap_or_else(|e| panic!("{}: {e}", s.name));
        }
        let w100 = list.iter().find(|s| s.name == "bottom weight 100").unwrap();
        let weights: Vec<u32> = w100.engine.levels.iter().map(|l| l.weight.get()).collect();
        assert_eq!(weights, vec![1000, 200, 100, 100]);
        assert!(list.iter().any(|s| s.sample_interval == Duration::from_millis(25)));
        assert_eq!(list.last().unwrap().bfq, vec!["low_latency=0".to_string()]);
    }

    #[test]
    fn bfq_points_become_settings_and_bad_ones_are_named() {
        let base = Config::default();
        let points = vec!["timeout_sync=8".to_string(), "timeout_sync=8+slice_idle=0".to_string()];
        let list = bfq_settings(&base, Duration::from_millis(100), &points).unwrap();
        assert_eq!(list.len(), 3);
        assert!(list[0].bfq.is_empty());
        assert_eq!(list[2].bfq, vec!["timeout_sync=8".to_string(), "slice_idle=0".to_string()]);
        assert_eq!(list[2].name, "timeout_sync=8 slice_idle=0");
        assert!(list.iter().all(|s| s.engine == base));
        let err = bfq_settings(&base, Duration::ZERO, &["timeout_sync=8+slice_idle".to_string()]).unwrap_err();
        assert!(err.to_string().contains("\"slice_idle\" is not KEY=VALUE"), "{err}");
    }

    #[test]
    fn best_respects_the_background_floor() {
        let mode = crate::report::table::tests::fake_mode(BfqMode::Strict, 1.2);
        let mk = |name: &str, score: f64, bg: f64| Point {
            mode: BfqMode::Strict,
            setting: Setting {
                name: name.into(),
                engine: Config::default(),
                sample_interval: Duration::ZERO,
                bfq: vec![],
            },
            score: Some(score),
            background: Some(bg),
            report: mode.clone(),
        };
        let points = vec![mk("fast but greedy", 1.0, 0.5), mk("ok", 1.3, 0.95), mk("slow", 2.0, 1.0)];
        assert_eq!(best(&points, BfqMode::Strict, 0.9).unwrap().setting.name, "ok");
        assert!(best(&points, BfqMode::Default, 0.9).is_none());
        assert!((score(&mode).unwrap() - 1.2).abs() < 0.01);
        let text = render(&points, &[BfqMode::Strict], 0.9);
        assert!(text.contains("best in strict mode: ok"), "{text}");
    }
}
