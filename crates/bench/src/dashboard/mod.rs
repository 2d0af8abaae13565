//! `ddiskqos-bench dashboard`: the Grafana dashboard's panels (`deploy/grafana/ddiskqos-agent.json`) drawn from a
//! real run's recorded scrapes (`scripts/record-metrics.sh`) into one PNG, by evaluating each panel's own query
//! expressions ([`promql`]: the subset they use) over time, as Prometheus would over the same samples. Grafana's
//! variables are substituted as it does: `$instance` (All) by `.*`, `$__rate_interval` by `--rate-interval`.

pub mod promql;

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{anyhow, bail, Context, Result};
use plotters::prelude::*;

use promql::{Labels, Series, Store, Value};

/// One query of a panel.
#[derive(Debug, Clone)]
pub struct Target {
    /// The PromQL expression, as in the dashboard.
    pub expr: String,
    /// Grafana's legend format (`{{label}}` replaced by the series' label).
    pub legend: String,
}

/// One panel.
#[derive(Debug, Clone)]
pub struct Panel {
    /// Its title.
    pub title: String,
    /// Grafana's unit (`s`, `Bps`, `short`, ...).
    pub unit: String,
    /// Its queries.
    pub targets: Vec<Target>,
}

/// The panels of a dashboard JSON, in order.
pub fn panels(json: &str, what: &str) -> Result<Vec<Panel>> {
    let d: serde_json::Value = serde_json::from_str(json).with_context(|| format!("{what}: not JSON"))?;
    let panels = d["panels"].as_array().ok_or_else(|| anyhow!("{what}: no panels"))?;
    panels
        .iter()
        .map(|p| {
            let title = p["title"].as_str().unwrap_or("").to_string();
            let targets = p["targets"]
                .as_array()
                .ok_or_else(|| anyhow!("{what}: panel {title:?} has no targets"))?
                .iter()
                .map(|t| {
                    let expr =
                        t["expr"].as_str().ok_or_else(|| anyhow!("{what}: panel {title:?}: a target without expr"))?;
                    Ok(Target { expr: expr.to_string(), legend: t["legendFormat"].as_str().unwrap_or("").to_string() })
                })
                .collect::<Result<Vec<_>>>()?;
            let unit = p["fieldConfig"]["defaults"]["unit"].as_str().unwrap_or("short").to_string();
            Ok(Panel { title, unit, targets })
        })
        .collect()
}

/// Grafana's substitutions for a dashboard viewed with every instance selected.
pub fn substitute(expr: &str, rate_interval: &str) -> String {
    expr.replace("$__rate_interval", rate_interval).replace("${instance}", ".*").replace("$instance", ".*")
}

/// The recorded scrapes: `# SCRAPE unix_ms=<ms> instance=<host:port>` before each exposition (what
/// `scripts/record-metrics.sh` writes); `instance` and `job` are added to every series as Prometheus adds them.
/// A series missing from a scrape gets a stale marker there. Times are seconds since the first scrape.
pub fn parse_scrapes(text: &str, what: &str) -> Result<Store> {
    let mut index: BTreeMap<(String, Labels), usize> = BTreeMap::new();
    let mut store = Store::default();
    let mut t0: Option<f64> = None;
    let mut now = None::<f64>;
    let mut instance = String::new();
    let mut seen: Vec<bool> = Vec::new();
    let finish = |store: &mut Store, seen: &mut Vec<bool>, now: Option<f64>| {
        if let Some(t) = now {
            for (i, s) in store.series.iter_mut().enumerate() {
                let live = s.points.last().is_some_and(|p| p.1.is_some());
                if live && !seen.get(i).copied().unwrap_or(false) {
                    s.points.push((t, None));
                }
            }
        }
        seen.iter_mut().for_each(|s| *s = false);
    };
    for (n, line) in text.lines().enumerate() {
        let at = || format!("{what}:{}", n + 1);
        if let Some(rest) = line.strip_prefix("# SCRAPE ") {
            finish(&mut store, &mut seen, now);
            let mut ms = None;
            for field in rest.split_whitespace() {
                if let Some(v) = field.strip_prefix("unix_ms=") {
                    ms = Some(v.parse::<f64>().with_context(at)?);
                } else if let Some(v) = field.strip_prefix("instance=") {
                    instance = v.to_string();
                }
            }
            let ms = ms.ok_or_else(|| anyhow!("{}: SCRAPE line without unix_ms", at()))?;
            let t = ms / 1000.0 - *t0.get_or_insert(ms / 1000.0);
            now = Some(t);
            continue;
        }
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let t = now.ok_or_else(|| anyhow!("{}: a sample before the first SCRAPE line", at()))?;
        let (name, mut labels, value) = parse_sample(line).with_context(at)?;
        labels.insert("instance".into(), instance.clone());
        labels.insert("job".into(), "ddiskqos-agent".into());
        let key = (name.clone(), labels.clone());
        let i = *index.entry(key).or_insert_with(|| {
            store.series.push(Series { name, labels, points: Vec::new() });
            store.series.len() - 1
        });
        if seen.len() <= i {
            seen.resize(i + 1, false);
        }
        seen[i] = true;
        store.series[i].points.push((t, Some(value)));
    }
    finish(&mut store, &mut seen, now);
    if store.series.is_empty() {
        bail!("{what}: no samples");
    }
    Ok(store)
}

/// `name{a="b",c="d"} value` (OpenMetrics text; no timestamps or exemplars, which the agent does not write).
fn parse_sample(line: &str) -> Result<(String, Labels, f64)> {
    let name_end = line.find(['{', ' ']).ok_or_else(|| anyhow!("no value in {line:?}"))?;
    let name = line[..name_end].to_string();
    let mut labels = Labels::new();
    let mut rest = &line[name_end..];
    if let Some(body) = rest.strip_prefix('{') {
        let mut chars = body.char_indices().peekable();
        let mut end = None;
        loop {
            // label name
            let start = match chars.peek() {
                Some(&(_, '}')) => {
                    end = Some(chars.next().unwrap().0);
                    break;
                }
                Some(&(i, _)) => i,
                None => break,
            };
            let eq = body[start..].find("=\"").ok_or_else(|| anyhow!("bad labels in {line:?}"))? + start;
            let label = body[start..eq].trim_start_matches(',').to_string();
            while chars.peek().is_some_and(|&(i, _)| i <= eq + 1) {
                chars.next();
            }
            let mut value = String::new();
            loop {
                let (_, c) = chars.next().ok_or_else(|| anyhow!("unterminated label value in {line:?}"))?;
                match c {
                    '"' => break,
                    '\\' => match chars.next().map(|x| x.1) {
                        Some('n') => value.push('\n'),
                        Some(c) => value.push(c),
                        None => bail!("bad escape in {line:?}"),
                    },
                    c => value.push(c),
                }
            }
            labels.insert(label, value);
            if chars.peek().is_some_and(|&(_, c)| c == ',') {
                chars.next();
            }
        }
        let end = end.ok_or_else(|| anyhow!("unterminated labels in {line:?}"))?;
        rest = &body[end + 1..];
    }
    let value = rest.split_whitespace().next().ok_or_else(|| anyhow!("no value in {line:?}"))?;
    let value = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v.parse().map_err(|_| anyhow!("value {v:?} in {line:?}"))?,
    };
    Ok((name, labels, value))
}

/// Grafana's legend: `{{label}}` replaced by the label's value (empty when absent), trimmed.
fn legend(format: &str, labels: &Labels) -> String {
    let mut out = format.to_string();
    while let Some(start) = out.find("{{") {
        let Some(len) = out[start..].find("}}") else { break };
        let label = out[start + 2..start + len].trim().to_string();
        out.replace_range(start..start + len + 2, labels.get(&label).map(String::as_str).unwrap_or(""));
    }
    let out = out.split_whitespace().collect::<Vec<_>>().join(" ");
    if out.is_empty() {
        format!("{labels:?}")
    } else {
        out
    }
}

/// One drawn line: its legend and points (seconds, value).
type Line = (String, Vec<(f64, f64)>);

/// A panel's lines over the run, evaluated every `step` seconds.
pub fn evaluate(panel: &Panel, store: &Store, rate_interval: &str, step: f64) -> Result<Vec<Line>> {
    let end = store.series.iter().flat_map(|s| s.points.iter().map(|p| p.0)).fold(0.0, f64::max);
    let mut lines: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    for target in &panel.targets {
        let expr = promql::parse(&substitute(&target.expr, rate_interval))
            .with_context(|| format!("panel {:?}", panel.title))?;
        let mut t = 0.0;
        while t <= end {
            if let Value::Vector(v) = store.eval(&expr, t)? {
                for s in v {
                    lines.entry(legend(&target.legend, &s.labels)).or_default().push((t, s.value));
                }
            }
            t += step;
        }
    }
    Ok(lines.into_iter().collect())
}

const PALETTE: [RGBColor; 8] = [
    RGBColor(0x1f, 0x77, 0xb4),
    RGBColor(0xd6, 0x27, 0x28),
    RGBColor(0x2c, 0xa0, 0x2c),
    RGBColor(0xff, 0x7f, 0x0e),
    RGBColor(0x94, 0x67, 0xbd),
    RGBColor(0x8c, 0x56, 0x4b),
    RGBColor(0xe3, 0x77, 0xc2),
    RGBColor(0x17, 0xbe, 0xcf),
];

fn err<E: std::fmt::Debug>(e: E) -> anyhow::Error {
    anyhow!("drawing: {e:?}")
}

/// Draws every panel (two per row) into `png`.
pub fn render(panels: &[Panel], store: &Store, rate_interval: &str, step: f64, title: &str, png: &Path) -> Result<()> {
    let rows = panels.len().div_ceil(2);
    let (w, row_h) = (1200u32, 250u32);
    let root = BitMapBackend::new(png, (w, row_h * rows as u32 + 40)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let root = root.titled(title, ("sans-serif", 22)).map_err(err)?;
    let areas = root.split_evenly((rows, 2));
    for (area, panel) in areas.iter().zip(panels) {
        let lines = evaluate(panel, store, rate_interval, step)?;
        let x_end = lines.iter().flat_map(|l| l.1.iter().map(|p| p.0)).fold(1.0, f64::max);
        let (lo, hi) = lines
            .iter()
            .flat_map(|l| l.1.iter().map(|p| p.1))
            .filter(|v| v.is_finite())
            .fold((0.0f64, f64::NEG_INFINITY), |(lo, hi), v| (lo.min(v), hi.max(v)));
        let hi = if hi.is_finite() && hi > lo { hi * 1.15 } else { lo + 1.0 };
        let caption = format!("{}  [{}]", panel.title, panel.unit);
        let mut chart = ChartBuilder::on(area)
            .caption(caption, ("sans-serif", 16))
            .margin(8)
            .x_label_area_size(24)
            .y_label_area_size(64)
            .build_cartesian_2d(0.0..x_end, lo..hi)
            .map_err(err)?;
        chart
            .configure_mesh()
            .x_desc("seconds into the run")
            .light_line_style(WHITE)
            .x_labels(8)
            .y_labels(5)
            .y_label_formatter(&|v| short(*v))
            .label_style(("sans-serif", 11))
            .draw()
            .map_err(err)?;
        if lines.is_empty() {
            chart
                .draw_series(std::iter::once(Text::new("no data", (x_end / 2.0, (lo + hi) / 2.0), ("sans-serif", 14))))
                .map_err(err)?;
            continue;
        }
        for (i, (name, pts)) in lines.iter().enumerate() {
            let color = PALETTE[i % PALETTE.len()];
            chart
                .draw_series(LineSeries::new(pts.iter().copied(), color.stroke_width(2)))
                .map_err(err)?
                .label(name.clone())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 14, y)], color.stroke_width(2)));
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK.mix(0.3))
            .label_font(("sans-serif", 11))
            .draw()
            .map_err(err)?;
    }
    root.present().map_err(err)?;
    Ok(())
}

/// An axis label: 1.2k, 3.4M, 0.005.
fn short(v: f64) -> String {
    let a = v.abs();
    if a >= 1e9 {
        format!("{:.1}G", v / 1e9)
    } else if a >= 1e6 {
        format!("{:.1}M", v / 1e6)
    } else if a >= 1e3 {
        format!("{:.1}k", v / 1e3)
    } else if a == 0.0 || a >= 1.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.3}")
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    fn dashboard() -> (String, Vec<Panel>) {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/grafana/ddiskqos-agent.json");
        let text = std::fs::read_to_string(&path).unwrap();
        let panels = panels(&text, &path.display().to_string()).unwrap();
        (text, panels)
    }

    /// A sysfs tree with one BFQ device, loop3 (7:3), and the root disk vda (254:0), for the device settings.
    fn fake_sys() -> tempfile::TempDir {
        use std::os::unix::fs::symlink;
        let tmp = tempfile::tempdir().unwrap();
        let sys = tmp.path();
        for dir in ["block", "dev/block", "class/block"] {
            std::fs::create_dir_all(sys.join(dir)).unwrap();
        }
        for (name, num) in [("loop3", "7:3"), ("vda", "254:0")] {
            let dev = sys.join("devices/block").join(name);
            std::fs::create_dir_all(dev.join("queue/iosched")).unwrap();
            std::fs::write(dev.join("dev"), format!("{num}\n")).unwrap();
            std::fs::write(dev.join("queue/scheduler"), "mq-deadline kyber [bfq] none\n").unwrap();
            std::fs::write(dev.join("queue/iosched/max_budget"), "0\n").unwrap();
            symlink(format!("../devices/block/{name}"), sys.join("block").join(name)).unwrap();
            symlink(format!("../../devices/block/{name}"), sys.join("dev/block").join(num)).unwrap();
            symlink(format!("../../devices/block/{name}"), sys.join("class/block").join(name)).unwrap();
        }
        tmp
    }

    /// The sample names the agent's registry exports, from its own text output with one series in every family
    /// (a family without series is not written): each `# TYPE` line's family, with the suffixes its type adds
    /// (counters `_total`, histograms `_bucket`, `_sum`, `_count`).
    fn exported() -> BTreeMap<String, String> {
        use qos_agent::blockdev::tune::{TunableMap, TunableValue, TunedDevices};
        use qos_agent::ops::metrics::{CallLabels, ContainerLabels, Metrics, ReasonLabels};
        let metrics = Arc::new(Metrics::new());
        let c = ContainerLabels { id: "c".into(), name: "c".into() };
        for family in [&metrics.level, &metrics.weight, &metrics.bytes] {
            family.get_or_create(&c).set(1);
        }
        metrics.decisions.get_or_create(&ReasonLabels { reason: "demoted".into() }).inc();
        metrics.cri_requests.get_or_create(&CallLabels { call: "ListPodSandbox".into() }).inc();
        metrics.device_weight_effective.set("7:3", "bfq", true);
        // A BFQ tunable set on the fake device, read back at each render: ddiskqos_device_setting{,_as_set}.
        let sys = fake_sys();
        let state = tempfile::tempdir().unwrap();
        let mut map = TunableMap::new();
        map.entry("loop3".into()).or_default().insert("max_budget".into(), TunableValue::Int(256));
        let mountinfo = "27 1 254:0 / / rw,relatime - ext4 /dev/vda rw\n";
        let originals = state.path().join("originals.json");
        let tuned = TunedDevices::apply_all_adopting_in(sys.path(), mountinfo, None, &map, &[], &[], Some(&originals))
            .unwrap_or_else(|e| panic!("the fake device's tunable: {e}"));
        metrics.device_settings.set_view(tuned.view(Vec::new()));
        let text = metrics.render();
        let mut out = BTreeMap::new();
        for line in text.lines() {
            let Some(rest) = line.strip_prefix("# TYPE ") else { continue };
            let (family, kind) = rest.split_once(' ').unwrap();
            let samples: Vec<String> = match kind {
                "counter" => vec![format!("{family}_total")],
                "histogram" => ["_bucket", "_sum", "_count"].iter().map(|s| format!("{family}{s}")).collect(),
                "gauge" => vec![family.to_string()],
                other => panic!("unexpected metric type {other} of {family}"),
            };
            for s in samples {
                out.insert(s, family.to_string());
            }
        }
        out
    }

    #[test]
    fn every_dashboard_query_parses_and_names_only_metrics_the_agent_exports() {
        let (_, panels) = dashboard();
        let exported = exported();
        assert!(exported.len() >= 16, "the registry's output lists too few metrics: {exported:?}");
        let mut used = std::collections::BTreeSet::new();
        for p in &panels {
            assert!(!p.targets.is_empty(), "panel {:?} has no query", p.title);
            for t in &p.targets {
                let expr =
                    promql::parse(&substitute(&t.expr, "15s")).unwrap_or_else(|e| panic!("panel {:?}: {e}", p.title));
                let names = expr.metric_names();
                assert!(!names.is_empty(), "panel {:?}: {} selects no metric", p.title, t.expr);
                for n in names {
                    let family = exported.get(&n).unwrap_or_else(|| {
                        panic!("panel {:?}: {} names {n}, which the agent does not export", p.title, t.expr)
                    });
                    used.insert(family.clone());
                }
                assert!(
                    t.expr.contains("instance=~\"$instance\""),
                    "panel {:?}: {} ignores $instance",
                    p.title,
                    t.expr
                );
            }
        }
        // And every metric the agent exports is on the dashboard.
        let families: std::collections::BTreeSet<String> = exported.values().cloned().collect();
        let missing: Vec<_> = families.difference(&used).collect();
        assert!(missing.is_empty(), "metrics without a panel: {missing:?}");
    }

    #[test]
    fn the_dashboard_uses_a_datasource_variable_and_an_instance_variable() {
        let (text, _) = dashboard();
        let d: serde_json::Value = serde_json::from_str(&text).unwrap();
        let vars = d["templating"]["list"].as_array().unwrap();
        let var = |name: &str| vars.iter().find(|v| v["name"] == name).unwrap_or_else(|| panic!("no variable {name}"));
        assert_eq!(var("DS_PROMETHEUS")["type"], "datasource");
        assert_eq!(var("instance")["type"], "query");
        for p in d["panels"].as_array().unwrap() {
            assert_eq!(p["datasource"]["uid"], "${DS_PROMETHEUS}", "panel {}", p["title"]);
            for t in p["targets"].as_array().unwrap() {
                assert_eq!(t["datasource"]["uid"], "${DS_PROMETHEUS}", "panel {}", p["title"]);
            }
        }
    }

    const SCRAPES: &str = "# SCRAPE unix_ms=1000 instance=127.0.0.1:9477
# HELP ddiskqos_container_weight Block-I/O weight
# TYPE ddiskqos_container_weight gauge
ddiskqos_container_weight{id=\"big\",name=\"big\"} 1000
ddiskqos_container_weight{id=\"small\",name=\"sm\\\"all\"} 1000
ddiskqos_decisions_total{reason=\"demoted\"} 0
# EOF
# SCRAPE unix_ms=2000 instance=127.0.0.1:9477
ddiskqos_container_weight{id=\"big\",name=\"big\"} 200
ddiskqos_decisions_total{reason=\"demoted\"} 1
# EOF
# SCRAPE unix_ms=3000 instance=127.0.0.1:9477
ddiskqos_container_weight{id=\"big\",name=\"big\"} 40
ddiskqos_decisions_total{reason=\"demoted\"} 2
# EOF
";

    #[test]
    fn scrapes_parse_into_series_with_instance_and_stale_markers() {
        let store = parse_scrapes(SCRAPES, "test").unwrap();
        let big = store.series.iter().find(|s| s.labels.get("id").map(String::as_str) == Some("big")).unwrap();
        assert_eq!(big.points, [(0.0, Some(1000.0)), (1.0, Some(200.0)), (2.0, Some(40.0))]);
        assert_eq!(big.labels["instance"], "127.0.0.1:9477");
        let small = store.series.iter().find(|s| s.labels.get("id").map(String::as_str) == Some("small")).unwrap();
        assert_eq!(small.labels["name"], "sm\"all", "escaped quote");
        assert_eq!(small.points, [(0.0, Some(1000.0)), (1.0, None)], "gone from the second scrape: stale");
        let panel = Panel {
            title: "w".into(),
            unit: "short".into(),
            targets: vec![Target {
                expr: "ddiskqos_container_weight{instance=~\"$instance\"}".into(),
                legend: "{{name}}".into(),
            }],
        };
        let lines = evaluate(&panel, &store, "15s", 1.0).unwrap();
        assert_eq!(
            lines,
            [
                ("big".to_string(), vec![(0.0, 1000.0), (1.0, 200.0), (2.0, 40.0)]),
                ("sm\"all".to_string(), vec![(0.0, 1000.0)])
            ]
        );
        assert!(parse_scrapes("x 1\n", "t").unwrap_err().to_string().contains("t:1"), "a sample before any SCRAPE");
        assert!(parse_scrapes("# SCRAPE unix_ms=1\nx{a=\"b} 1\n", "t").is_err());
    }
}
