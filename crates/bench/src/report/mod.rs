//! A run's results: the data ([`data`]: what the JSON holds) and the output: the text tables ([`table`]), the JSON
//! ([`json`]) and the chart ([`chart`]).

pub mod chart;
pub mod data;
pub mod json;
pub mod table;

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use crate::report::data::RunReport;

/// Files written for a run.
#[derive(Debug, Clone)]
pub struct Written {
    /// The JSON.
    pub json: PathBuf,
    /// The text report.
    pub text: PathBuf,
    /// The charts, if they could be drawn.
    pub charts: Option<(PathBuf, PathBuf)>,
}

/// Writes `results.json`, `report.txt`, `chart.svg` and `chart.png` into `dir` (a chart failure is a warning).
pub fn write_all(run: &RunReport, dir: &Path) -> Result<Written> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let json = dir.join("results.json");
    json::write(run, &json)?;
    let text = dir.join("report.txt");
    std::fs::write(&text, table::render(run)).with_context(|| format!("cannot write {}", text.display()))?;
    let (svg, png) = (dir.join("chart.svg"), dir.join("chart.png"));
    let charts = match chart::write(run, &svg, &png) {
        Ok(()) => Some((svg, png)),
        Err(e) => {
            eprintln!("warning: no chart: {e:#}");
            None
        }
    };
    Ok(Written { json, text, charts })
}

/// The part of a mode's heading shared by the text report and the chart: BFQ mode, `low_latency`, runtime, layout.
pub fn mode_heading(run: &RunReport, mode: &crate::report::data::ModeReport) -> String {
    let device = if mode.mode.is_iocost() {
        mode.mode.label().to_string()
    } else {
        format!(
            "{}, low_latency={}",
            mode.mode.label(),
            mode.iosched.get("low_latency").map(String::as_str).unwrap_or("?")
        )
    };
    let cgroup = if run.meta.cgroup.is_empty() { String::new() } else { format!(" | cgroup {}", run.meta.cgroup) };
    format!("{device} | runtime {}, {} cgroups{cgroup}", run.meta.runtime, run.meta.cgroup_layout)
}
