//! The chart: per BFQ mode, the mean (solid) and p99 (thin) read time per size for Alone, Original, dDiskQoS and
//! (where it ran) static best on log-log axes, and the CDFs of the 1 MiB and 10 MiB reads. Written as SVG and PNG.

use std::path::Path;

use anyhow::{anyhow, Result};
use plotters::coord::Shift;
use plotters::prelude::*;

use crate::report::data::{CaseReport, ModeReport, RunReport};
use crate::stats::Latency;
use crate::workload::Variant;

const ROW_HEIGHT: u32 = 460;
const WIDTH: u32 = 1500;

fn color(v: Variant) -> RGBColor {
    match v {
        Variant::Alone => RGBColor(0x2c, 0xa0, 0x2c),
        Variant::Original => RGBColor(0xd6, 0x27, 0x28),
        Variant::DDiskQos => RGBColor(0x1f, 0x77, 0xb4),
        Variant::StaticBest => RGBColor(0x94, 0x67, 0xbd),
    }
}

fn err<E: std::fmt::Debug>(e: E) -> anyhow::Error {
    anyhow!("chart: {e:?}")
}

/// Writes `<stem>.svg` and `<stem>.png`.
pub fn write(run: &RunReport, svg: &Path, png: &Path) -> Result<()> {
    let height = ROW_HEIGHT * run.modes.len().max(1) as u32;
    {
        let root = SVGBackend::new(svg, (WIDTH, height)).into_drawing_area();
        draw(&root, run)?;
        root.present().map_err(err)?;
    }
    let root = BitMapBackend::new(png, (WIDTH, height)).into_drawing_area();
    draw(&root, run)?;
    root.present().map_err(err)?;
    Ok(())
}

fn draw<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, run: &RunReport) -> Result<()> {
    root.fill(&WHITE).map_err(err)?;
    let rows = root.split_evenly((run.modes.len().max(1), 1));
    for (area, mode) in rows.iter().zip(&run.modes) {
        let title = format!("{} | {}", super::mode_heading(run, mode), run.meta.date_utc);
        let area = area.titled(&title, ("sans-serif", 20)).map_err(err)?;
        let cols = area.split_evenly((1, 3));
        per_size(&cols[0], mode)?;
        for (col, size) in cols[1..].iter().zip([1u64, 10]) {
            if let Some(row) = mode.exp1.iter().find(|r| r.size_mib == size) {
                cdf(col, row)?;
            }
        }
    }
    Ok(())
}

fn per_size<DB: DrawingBackend>(area: &DrawingArea<DB, Shift>, mode: &ModeReport) -> Result<()> {
    let rows: Vec<&CaseReport> = mode.exp1.iter().collect();
    if rows.is_empty() {
        return Ok(());
    }
    let values = rows.iter().flat_map(|r| r.variants.iter().flat_map(|v| [v.summary.mean_ms, v.summary.p99_ms]));
    let (lo, hi) = bounds(values);
    let max_size = rows.iter().map(|r| r.size_mib).max().unwrap_or(1) as f64;
    let mut chart = ChartBuilder::on(area)
        .caption("Exp. 1: read time per file size (mean solid, p99 thin)", ("sans-serif", 16))
        .margin(8)
        .x_label_area_size(36)
        .y_label_area_size(60)
        .build_cartesian_2d((0.7f64..max_size * 1.5).log_scale(), (lo..hi).log_scale())
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("file size (MiB)")
        .y_desc("read time (ms)")
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_label_formatter(&|y| format!("{y}"))
        .draw()
        .map_err(err)?;
    for v in drawn(&rows) {
        let pts = |f: fn(&crate::stats::Summary) -> f64| -> Vec<(f64, f64)> {
            rows.iter()
                .filter_map(|r| {
                    r.variant(v).filter(|c| c.summary.n > 0).map(|c| (r.size_mib as f64, f(&c.summary).max(lo)))
                })
                .collect()
        };
        let c = color(v);
        let means = pts(|s| s.mean_ms);
        chart
            .draw_series(LineSeries::new(means.clone(), c.stroke_width(3)))
            .map_err(err)?
            .label(v.label())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], c.stroke_width(3)));
        chart.draw_series(means.iter().map(|p| Circle::new(*p, 4, c.filled()))).map_err(err)?;
        chart.draw_series(LineSeries::new(pts(|s| s.p99_ms), c.stroke_width(1))).map_err(err)?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(err)?;
    Ok(())
}

/// The variants that ran in `rows`, in report order: each gets a line and a legend entry.
fn drawn(rows: &[&CaseReport]) -> Vec<Variant> {
    Variant::ALL.into_iter().filter(|v| rows.iter().any(|r| r.variant(*v).is_some())).collect()
}

fn cdf<DB: DrawingBackend>(area: &DrawingArea<DB, Shift>, row: &CaseReport) -> Result<()> {
    let curves: Vec<(Variant, Vec<(f64, f64)>)> = row
        .variants
        .iter()
        .filter_map(|c| Latency::from_base64(&c.histogram_v2_base64).ok().map(|l| (c.variant, l.cdf())))
        .collect();
    let (lo, hi) = bounds(curves.iter().flat_map(|(_, c)| c.iter().map(|p| p.0)));
    let mut chart = ChartBuilder::on(area)
        .caption(format!("Exp. 1: CDF of {} read times", row.label), ("sans-serif", 16))
        .margin(8)
        .x_label_area_size(36)
        .y_label_area_size(50)
        .build_cartesian_2d((lo..hi).log_scale(), 0f64..1.0)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("read time (ms)")
        .y_desc("fraction of reads")
        .x_labels(8)
        .x_label_formatter(&|x| format!("{x}"))
        .draw()
        .map_err(err)?;
    for (v, points) in curves {
        // A step function: each value reaches its cumulative fraction.
        let mut steps = Vec::with_capacity(points.len() * 2 + 1);
        let mut prev = 0.0;
        for (x, y) in points {
            steps.push((x, prev));
            steps.push((x, y));
            prev = y;
        }
        let c = color(v);
        chart
            .draw_series(LineSeries::new(steps, c.stroke_width(2)))
            .map_err(err)?
            .label(v.label())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], c.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(err)?;
    Ok(())
}

/// Log-axis bounds around positive values, padded; a default when there are none.
pub fn bounds(values: impl Iterator<Item = f64>) -> (f64, f64) {
    let (mut lo, mut hi) = (f64::MAX, f64::MIN);
    for v in values.filter(|v| *v > 0.0 && v.is_finite()) {
        lo = lo.min(v);
        hi = hi.max(v);
    }
    if lo > hi {
        return (0.1, 1000.0);
    }
    (lo / 1.5, hi * 1.5)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn static_best_is_drawn_where_it_ran_in_its_own_colour() {
        use crate::report::table::tests::{fake_mode, fake_mode_static};
        use crate::workload::BfqMode;
        let with = fake_mode_static(BfqMode::Strict, &[1.2, 1.2, 1.2], &[1.1, 1.1, 1.1]);
        let rows: Vec<&CaseReport> = with.exp1.iter().collect();
        assert_eq!(drawn(&rows), Variant::ALL.to_vec());
        let without = fake_mode(BfqMode::Strict, 1.2);
        let rows: Vec<&CaseReport> = without.exp1.iter().collect();
        assert_eq!(drawn(&rows), Variant::BASE.to_vec());
        let colours: Vec<RGBColor> = Variant::ALL.into_iter().map(color).collect();
        assert!(colours.iter().enumerate().all(|(i, c)| !colours[..i].contains(c)), "{colours:?}");
    }

    #[test]
    fn bounds_pad_and_default() {
        assert_eq!(bounds([].into_iter()), (0.1, 1000.0));
        let (lo, hi) = bounds([1.0, 0.0, 10.0, f64::NAN].into_iter());
        assert!((lo - 1.0 / 1.5).abs() < 1e-9 && (hi - 15.0).abs() < 1e-9);
    }
}
