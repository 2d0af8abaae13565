//! The PromQL the dashboard (`deploy/grafana/ddiskqos-agent.json`) uses, and nothing more: instant selectors with
//! label matchers (`=`, `!=`, `=~`, `!~`), range selectors as the argument of `rate` and `increase`,
//! `histogram_quantile`, and the aggregations `sum`, `count`, `max`, `min`, `avg` and `count_values`, with or without
//! `by (...)`. Evaluated as Prometheus does: a 5-minute lookback for instant selectors (a series missing from a
//! scrape is stale from then on), left-open ranges, `rate`/`increase` extrapolated to the range's edges with counter
//! resets, `histogram_quantile` interpolating linearly inside the bucket.

use std::collections::BTreeMap;

use anyhow::{anyhow, bail, Result};

/// Labels of a series (`__name__` included for raw selectors).
pub type Labels = BTreeMap<String, String>;

/// One series of the recorded scrapes: its points, `None` where it went stale.
#[derive(Debug, Clone)]
pub struct Series {
    /// Metric name.
    pub name: String,
    /// Labels without the name.
    pub labels: Labels,
    /// (seconds, value); `None` = stale marker.
    pub points: Vec<(f64, Option<f64>)>,
}

/// Every recorded series.
#[derive(Debug, Default, Clone)]
pub struct Store {
    /// The series.
    pub series: Vec<Series>,
}

/// Prometheus's default lookback for instant selectors.
const LOOKBACK: f64 = 300.0;

/// A label matcher.
#[derive(Debug, Clone)]
pub enum Matcher {
    /// `label="value"`.
    Eq(String, String),
    /// `label!="value"`.
    Ne(String, String),
    /// `label=~"re"` (anchored).
    Re(String, regex::Regex),
    /// `label!~"re"` (anchored).
    NotRe(String, regex::Regex),
}

impl PartialEq for Matcher {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Self::Eq(a, x), Self::Eq(b, y)) | (Self::Ne(a, x), Self::Ne(b, y)) => a == b && x == y,
            (Self::Re(a, x), Self::Re(b, y)) | (Self::NotRe(a, x), Self::NotRe(b, y)) => {
                a == b && x.as_str() == y.as_str()
            }
            _ => false,
        }
    }
}

impl Matcher {
    fn matches(&self, labels: &Labels) -> bool {
        let get = |l: &str| labels.get(l).map(String::as_str).unwrap_or("");
        match self {
            Self::Eq(l, v) => get(l) == v,
            Self::Ne(l, v) => get(l) != v,
            Self::Re(l, r) => r.is_match(get(l)),
            Self::NotRe(l, r) => !r.is_match(get(l)),
        }
    }
}

/// Aggregation operators.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AggOp {
    /// `sum`.
    Sum,
    /// `count`.
    Count,
    /// `max`.
    Max,
    /// `min`.
    Min,
    /// `avg`.
    Avg,
    /// `count_values("label", v)`.
    CountValues,
}

/// Functions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Func {
    /// `rate(v[d])`.
    Rate,
    /// `increase(v[d])`.
    Increase,
    /// `histogram_quantile(q, v)`.
    HistogramQuantile,
}

/// An expression of the subset.
#[derive(Debug, Clone, PartialEq)]
pub enum Expr {
    /// A number literal.
    Number(f64),
    /// A string literal (only as `count_values`' parameter).
    Str(String),
    /// `name{matchers}` with an optional `[range]` in seconds.
    Selector {
        /// Metric name.
        name: String,
        /// Label matchers.
        matchers: Vec<Matcher>,
        /// The range of a range selector, in seconds.
        range: Option<f64>,
    },
    /// A function call.
    Call(Func, Vec<Expr>),
    /// An aggregation.
    Agg {
        /// The operator.
        op: AggOp,
        /// `by (...)` labels (empty: everything aggregated into one).
        by: Vec<String>,
        /// `count_values`' label name.
        param: Option<String>,
        /// The aggregated expression.
        expr: Box<Expr>,
    },
}

impl Expr {
    /// Every metric name the expression selects (the dashboard's test checks them against the agent's registry).
    #[cfg(test)]
    pub fn metric_names(&self) -> Vec<String> {
        match self {
            Self::Number(_) | Self::Str(_) => Vec::new(),
            Self::Selector { name, .. } => vec![name.clone()],
            Self::Call(_, args) => args.iter().flat_map(Expr::metric_names).collect(),
            Self::Agg { expr, .. } => expr.metric_names(),
        }
    }
}

// ----- Lexer and parser -----

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Ident(String),
    Num(f64),
    Str(String),
    Dur(f64),
    Punct(&'static str),
}

fn lex(src: &str) -> Result<Vec<Tok>> {
    let b = src.as_bytes();
    let mut i = 0;
    let mut out = Vec::new();
    let mut in_range = false;
    while i < b.len() {
        let c = b[i] as char;
        if c.is_whitespace() {
            i += 1;
        } else if in_range && c.is_ascii_digit() {
            let start = i;
            while i < b.len() && (b[i] as char).is_ascii_alphanumeric() {
                i += 1;
            }
            out.push(Tok::Dur(parse_duration(&src[start..i])?));
        } else if c.is_ascii_alphabetic() || c == '_' || c == ':' {
            let start = i;
            while i < b.len() && ((b[i] as char).is_ascii_alphanumeric() || b[i] == b'_' || b[i] == b':') {
                i += 1;
            }
            out.push(Tok::Ident(src[start..i].to_string()));
        } else if c.is_ascii_digit() || c == '.' {
            let start = i;
            while i < b.len() && ((b[i] as char).is_ascii_digit() || b[i] == b'.' || b[i] == b'e') {
                i += 1;
            }
            out.push(Tok::Num(src[start..i].parse().map_err(|e| anyhow!("number {:?}: {e}", &src[start..i]))?));
        } else if c == '"' {
            let mut s = String::new();
            i += 1;
            loop {
                let Some(&ch) = b.get(i) else { bail!("unterminated string at byte {i}") };
                match ch {
                    b'"' => break,
                    b'\\' => {
                        let esc = *b.get(i + 1).ok_or_else(|| anyhow!("unterminated string"))?;
                        s.push(match esc {
                            b'n' => '\n',
                            b't' => '\t',
                            other => other as char,
                        });
                        i += 2;
                        continue;
                    }
                    _ => {}
                }
                let ch_len = src[i..].chars().next().unwrap().len_utf8();
                s.push_str(&src[i..i + ch_len]);
                i += ch_len;
            }
            i += 1;
            out.push(Tok::Str(s));
        } else {
            let two = src.get(i..i + 2).unwrap_or("");
            let p: &'static str = match two {
                "!=" => "!=",
                "=~" => "=~",
                "!~" => "!~",
                _ => match c {
                    '(' => "(",
                    ')' => ")",
                    '{' => "{",
                    '}' => "}",
                    '[' => "[",
                    ']' => "]",
                    ',' => ",",
                    '=' => "=",
                    _ => bail!("unsupported character {c:?} at byte {i}"),
                },
            };
            in_range = match p {
                "[" => true,
                "]" => false,
                _ => in_range,
            };
            i += p.len();
            out.push(Tok::Punct(p));
        }
    }
    Ok(out)
}

/// `15s`, `1m`, `5m30s`, `1h`, `500ms`.
pub fn parse_duration(s: &str) -> Result<f64> {
    let mut total = 0.0;
    let mut rest = s;
    if rest.is_empty() {
        bail!("empty duration");
    }
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit()).ok_or_else(|| anyhow!("duration {s:?}: no unit"))?;
        let n: f64 = rest[..digits].parse().map_err(|_| anyhow!("duration {s:?}"))?;
        rest = &rest[digits..];
        let unit_len = rest.find(|c: char| c.is_ascii_digit()).unwrap_or(rest.len());
        let mult = match &rest[..unit_len] {
            "ms" => 0.001,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            "d" => 86400.0,
            u => bail!("duration {s:?}: unit {u:?}"),
        };
        total += n * mult;
        rest = &rest[unit_len..];
    }
    Ok(total)
}

struct Parser {
    toks: Vec<Tok>,
    pos: usize,
}

impl Parser {
    fn peek(&self) -> Option<&Tok> {
        self.toks.get(self.pos)
    }

    fn next(&mut self) -> Result<Tok> {
        let t = self.toks.get(self.pos).cloned().ok_or_else(|| anyhow!("unexpected end"))?;
        self.pos += 1;
        Ok(t)
    }

    fn expect(&mut self, p: &str) -> Result<()> {
        match self.next()? {
            Tok::Punct(q) if q == p => Ok(()),
            other => bail!("expected {p:?}, found {other:?}"),
        }
    }

    fn eat(&mut self, p: &'static str) -> bool {
        if self.peek() == Some(&Tok::Punct(p)) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    fn labels_list(&mut self) -> Result<Vec<String>> {
        self.expect("(")?;
        let mut out = Vec::new();
        loop {
            match self.next()? {
                Tok::Ident(l) => out.push(l),
                Tok::Punct(")") if out.is_empty() => return Ok(out),
                other => bail!("expected a label name, found {other:?}"),
            }
            match self.next()? {
                Tok::Punct(",") => {}
                Tok::Punct(")") => return Ok(out),
                other => bail!("expected ',' or ')', found {other:?}"),
            }
        }
    }

    fn expr(&mut self) -> Result<Expr> {
        match self.next()? {
            Tok::Num(n) => Ok(Expr::Number(n)),
            Tok::Str(s) => Ok(Expr::Str(s)),
            Tok::Ident(id) => {
                let agg = match id.as_str() {
                    "sum" => Some(AggOp::Sum),
                    "count" => Some(AggOp::Count),
                    "max" => Some(AggOp::Max),
                    "min" => Some(AggOp::Min),
                    "avg" => Some(AggOp::Avg),
                    "count_values" => Some(AggOp::CountValues),
                    _ => None,
                };
                if let Some(op) = agg {
                    let mut by = Vec::new();
                    if self.peek() == Some(&Tok::Ident("by".into())) {
                        self.pos += 1;
                        by = self.labels_list()?;
                    }
                    self.expect("(")?;
                    let param = if op == AggOp::CountValues {
                        let Tok::Str(p) = self.next()? else { bail!("count_values needs a label name string") };
                        self.expect(",")?;
                        Some(p)
                    } else {
                        None
                    };
                    let expr = Box::new(self.expr()?);
                    self.expect(")")?;
                    if self.peek() == Some(&Tok::Ident("by".into())) {
                        self.pos += 1;
                        by = self.labels_list()?;
                    }
                    return Ok(Expr::Agg { op, by, param, expr });
                }
                let func = match id.as_str() {
                    "rate" => Some(Func::Rate),
                    "increase" => Some(Func::Increase),
                    "histogram_quantile" => Some(Func::HistogramQuantile),
                    _ => None,
                };
                if let Some(f) = func {
                    self.expect("(")?;
                    let mut args = vec![self.expr()?];
                    while self.eat(",") {
                        args.push(self.expr()?);
                    }
                    self.expect(")")?;
                    let ok = match f {
                        Func::Rate | Func::Increase => {
                            matches!(args.as_slice(), [Expr::Selector { range: Some(_), .. }])
                        }
                        Func::HistogramQuantile => {
                            matches!(args.as_slice(), [Expr::Number(_), e] if !matches!(e, Expr::Selector { range: Some(_), .. }))
                        }
                    };
                    if !ok {
                        bail!("{id}: unsupported arguments {args:?}");
                    }
                    return Ok(Expr::Call(f, args));
                }
                if self.peek() == Some(&Tok::Punct("(")) {
                    bail!("function {id:?} is not in the supported subset");
                }
                let mut matchers = Vec::new();
                if self.eat("{") {
                    loop {
                        let label = match self.next()? {
                            Tok::Ident(l) => l,
                            Tok::Punct("}") if matchers.is_empty() => break,
                            other => bail!("expected a label name, found {other:?}"),
                        };
                        let op = self.next()?;
                        let Tok::Str(value) = self.next()? else { bail!("{label}: expected a quoted value") };
                        let re = |label: &str, v: &str| {
                            regex::Regex::new(&format!("^(?:{v})$")).map_err(|e| anyhow!("{label}=~{v:?}: {e}"))
                        };
                        matchers.push(match op {
                            Tok::Punct("=") => Matcher::Eq(label, value),
                            Tok::Punct("!=") => Matcher::Ne(label, value),
                            Tok::Punct("=~") => {
                                let r = re(&label, &value)?;
                                Matcher::Re(label, r)
                            }
                            Tok::Punct("!~") => {
                                let r = re(&label, &value)?;
                                Matcher::NotRe(label, r)
                            }
                            other => bail!("{label}: unsupported matcher {other:?}"),
                        });
                        match self.next()? {
                            Tok::Punct(",") => {}
                            Tok::Punct("}") => break,
                            other => bail!("expected ',' or '}}', found {other:?}"),
                        }
                    }
                }
                let range = if self.eat("[") {
                    let Tok::Dur(d) = self.next()? else { bail!("{id}: expected a duration in [...]") };
                    self.expect("]")?;
                    Some(d)
                } else {
                    None
                };
                Ok(Expr::Selector { name: id, matchers, range })
            }
            other => bail!("unexpected {other:?}"),
        }
    }
}

/// Parses one expression of the subset; the error names what is not supported.
pub fn parse(src: &str) -> Result<Expr> {
    let run = || -> Result<Expr> {
        let mut p = Parser { toks: lex(src)?, pos: 0 };
        let e = p.expr()?;
        if p.pos != p.toks.len() {
            bail!("trailing {:?}", &p.toks[p.pos..]);
        }
        Ok(e)
    };
    run().map_err(|e| anyhow!("PromQL {src:?}: {e}"))
}

// ----- Evaluation -----

/// One element of an instant vector.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// Its labels.
    pub labels: Labels,
    /// Its value.
    pub value: f64,
}

/// The value of an expression at one instant.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// A number.
    Scalar(f64),
    /// A string.
    Str(String),
    /// An instant vector.
    Vector(Vec<Sample>),
}

impl Store {
    fn matching<'a>(&'a self, name: &'a str, matchers: &'a [Matcher]) -> impl Iterator<Item = &'a Series> + 'a {
        self.series.iter().filter(move |s| {
            if s.name != name {
                return false;
            }
            let mut l = s.labels.clone();
            l.insert("__name__".into(), s.name.clone());
            matchers.iter().all(|m| m.matches(&l))
        })
    }

    /// Evaluates `expr` at `t` (seconds).
    pub fn eval(&self, expr: &Expr, t: f64) -> Result<Value> {
        Ok(match expr {
            Expr::Number(n) => Value::Scalar(*n),
            Expr::Str(s) => Value::Str(s.clone()),
            Expr::Selector { name, matchers, range: None } => {
                let mut out = Vec::new();
                for s in self.matching(name, matchers) {
                    let last = s.points.iter().rev().find(|(ts, _)| *ts <= t);
                    if let Some(&(ts, Some(v))) = last {
                        if ts > t - LOOKBACK {
                            let mut labels = s.labels.clone();
                            labels.insert("__name__".into(), name.clone());
                            out.push(Sample { labels, value: v });
                        }
                    }
                }
                Value::Vector(out)
            }
            Expr::Selector { range: Some(_), .. } => bail!("a range selector outside rate/increase"),
            Expr::Call(f @ (Func::Rate | Func::Increase), args) => {
                let Expr::Selector { name, matchers, range: Some(range) } = &args[0] else { unreachable!() };
                let mut out = Vec::new();
                for s in self.matching(name, matchers) {
                    let pts: Vec<(f64, f64)> = s
                        .points
                        .iter()
                        .filter(|(ts, _)| *ts > t - range && *ts <= t)
                        .filter_map(|&(ts, v)| v.map(|v| (ts, v)))
                        .collect();
                    if let Some(v) = extrapolated_increase(&pts, t - range, t) {
                        let value = if *f == Func::Rate { v / range } else { v };
                        out.push(Sample { labels: s.labels.clone(), value });
                    }
                }
                Value::Vector(out)
            }
            Expr::Call(Func::HistogramQuantile, args) => {
                let Expr::Number(q) = args[0] else { unreachable!() };
                let Value::Vector(v) = self.eval(&args[1], t)? else { bail!("histogram_quantile of a non-vector") };
                let mut groups: BTreeMap<Labels, Vec<(f64, f64)>> = BTreeMap::new();
                for s in v {
                    let mut labels = s.labels.clone();
                    let le = labels.remove("le").ok_or_else(|| anyhow!("histogram_quantile: a series without le"))?;
                    labels.remove("__name__");
                    let le = if le == "+Inf" { f64::INFINITY } else { le.parse().map_err(|_| anyhow!("le={le:?}"))? };
                    groups.entry(labels).or_default().push((le, s.value));
                }
                let mut out = Vec::new();
                for (labels, buckets) in groups {
                    if let Some(value) = bucket_quantile(q, buckets) {
                        out.push(Sample { labels, value });
                    }
                }
                Value::Vector(out)
            }
            Expr::Agg { op, by, param, expr } => {
                let Value::Vector(v) = self.eval(expr, t)? else { bail!("aggregation of a non-vector") };
                let key = |l: &Labels| -> Labels {
                    by.iter().filter_map(|b| l.get(b).map(|v| (b.clone(), v.clone()))).collect()
                };
                let mut groups: BTreeMap<Labels, Vec<f64>> = BTreeMap::new();
                for s in &v {
                    let mut k = key(&s.labels);
                    if *op == AggOp::CountValues {
                        k.insert(param.clone().unwrap(), format_value(s.value));
                    }
                    groups.entry(k).or_default().push(s.value);
                }
                let out = groups
                    .into_iter()
                    .map(|(labels, vals)| {
                        let n = vals.len() as f64;
                        let value = match op {
                            AggOp::Sum => vals.iter().sum(),
                            AggOp::Count | AggOp::CountValues => n,
                            AggOp::Max => vals.iter().cloned().fold(f64::NEG_INFINITY, f64::max),
                            AggOp::Min => vals.iter().cloned().fold(f64::INFINITY, f64::min),
                            AggOp::Avg => vals.iter().sum::<f64>() / n,
                        };
                        Sample { labels, value }
                    })
                    .collect();
                Value::Vector(out)
            }
        })
    }
}

/// A value as Prometheus writes it in a label (`count_values`): integers without a fraction.
fn format_value(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{}", v as i64)
    } else {
        format!("{v}")
    }
}

/// The increase of a counter over the points of (start, end], corrected for resets and extrapolated towards the
/// range's edges as Prometheus does: by half a sample interval at most where the samples stop short of an edge,
/// never below zero at the start. `None` with fewer than two points.
fn extrapolated_increase(pts: &[(f64, f64)], start: f64, end: f64) -> Option<f64> {
    if pts.len() < 2 {
        return None;
    }
    let (first, last) = (pts[0], pts[pts.len() - 1]);
    let mut increase = last.1 - first.1;
    for w in pts.windows(2) {
        if w[1].1 < w[0].1 {
            increase += w[0].1;
        }
    }
    let sampled = last.0 - first.0;
    let average = sampled / (pts.len() - 1) as f64;
    let threshold = average * 1.1;
    let mut to_start = first.0 - start;
    let mut to_end = end - last.0;
    if to_start >= threshold {
        to_start = average / 2.0;
    }
    if increase > 0.0 && first.1 >= 0.0 {
        let to_zero = sampled * (first.1 / increase);
        if to_zero < to_start {
            to_start = to_zero;
        }
    }
    if to_end >= threshold {
        to_end = average / 2.0;
    }
    Some(increase * (sampled + to_start + to_end) / sampled)
}

/// The q-quantile of cumulative buckets (upper bound, count): linear interpolation inside the bucket the rank falls
/// in (from 0 for the first bucket); in the +Inf bucket, the highest finite bound.
fn bucket_quantile(q: f64, mut buckets: Vec<(f64, f64)>) -> Option<f64> {
    if q.is_nan() || buckets.len() < 2 {
        return None;
    }
    if q < 0.0 {
        return Some(f64::NEG_INFINITY);
    }
    if q > 1.0 {
        return Some(f64::INFINITY);
    }
    buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    let &(top, total) = buckets.last()?;
    if top != f64::INFINITY || total == 0.0 {
        return None;
    }
    let rank = q * total;
    let i = buckets.iter().position(|b| b.1 >= rank)?;
    if i == buckets.len() - 1 {
        return Some(buckets[buckets.len() - 2].0);
    }
    let (lower, below) = if i == 0 { (0.0, 0.0) } else { buckets[i - 1] };
    let (upper, count) = buckets[i];
    if i == 0 && upper <= 0.0 {
        return Some(upper);
    }
    let in_bucket = count - below;
    if in_bucket == 0.0 {
        return Some(upper);
    }
    Some(lower + (upper - lower) * (rank - below) / in_bucket)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn series(name: &str, labels: &[(&str, &str)], points: &[(f64, Option<f64>)]) -> Series {
        Series {
            name: name.into(),
            labels: labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            points: points.to_vec(),
        }
    }

    fn vector(store: &Store, src: &str, t: f64) -> Vec<(Labels, f64)> {
        match store.eval(&parse(src).unwrap(), t).unwrap() {
            Value::Vector(v) => v.into_iter().map(|s| (s.labels, s.value)).collect(),
            other => panic!("{src}: {other:?}"),
        }
    }

    fn labels(pairs: &[(&str, &str)]) -> Labels {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn parses_the_shapes_the_dashboard_uses_and_refuses_the_rest() {
        let e = parse(r#"sum by (reason) (rate(ddiskqos_decisions_total{instance=~".*", job!="x"}[15s]))"#).unwrap();
        let Expr::Agg { op: AggOp::Sum, by, expr, .. } = &e else { panic!("{e:?}") };
        assert_eq!(by, &["reason"]);
        let Expr::Call(Func::Rate, args) = expr.as_ref() else { panic!("{expr:?}") };
        assert!(matches!(&args[0], Expr::Selector { name, matchers, range: Some(r) }
            if name == "ddiskqos_decisions_total" && matchers.len() == 2 && *r == 15.0));
        assert_eq!(e.metric_names(), ["ddiskqos_decisions_total"]);
        let q = parse("histogram_quantile(0.99, sum by (le) (rate(x_bucket[1m30s])))").unwrap();
        assert!(matches!(q, Expr::Call(Func::HistogramQuantile, _)));
        let c = parse(r#"count_values("level", ddiskqos_container_level)"#).unwrap();
        assert!(matches!(c, Expr::Agg { op: AggOp::CountValues, param: Some(ref p), .. } if p == "level"));
        assert_eq!(parse("sum(x) by (a)").unwrap(), parse("sum by (a) (x)").unwrap());
        for bad in ["rate(x)", "x + y", "deriv(x[1m])", "sum(x", "x{a=b}", "x[1m]y", "x offset 5m"] {
            assert!(parse(bad).is_err(), "{bad} parsed");
        }
        assert!(parse("topk(3, x)").unwrap_err().to_string().contains("topk"));
    }

    #[test]
    fn rate_and_increase_extrapolate_and_survive_counter_resets() {
        // A counter growing 1 per second, scraped every second from t=0.
        let pts: Vec<(f64, Option<f64>)> = (0..=60).map(|t| (t as f64, Some(t as f64))).collect();
        let store = Store { series: vec![series("c_total", &[("instance", "a")], &pts)] };
        let rate = vector(&store, "rate(c_total[15s])", 60.0);
        assert_eq!(rate.len(), 1);
        assert!((rate[0].1 - 1.0).abs() < 1e-9, "{rate:?}");
        assert!(!rate[0].0.contains_key("__name__"), "rate drops the name");
        let inc = vector(&store, "increase(c_total[30s])", 60.0);
        assert!((inc[0].1 - 30.0).abs() < 1e-9, "{inc:?}");
        // A reset (a restarted agent) at t=31: the increase still counts every second.
        let reset: Vec<(f64, Option<f64>)> =
            (0..=60).map(|t| (t as f64, Some(if t <= 30 { t as f64 } else { (t - 31) as f64 }))).collect();
        let store = Store { series: vec![series("c_total", &[], &reset)] };
        let inc = vector(&store, "increase(c_total[20s])", 40.0);
        // Points 21..=40: 21 to 30 (+9), the reset to 0, then to 9 (+9); 19 s sampled, extrapolated to the 20 s range
        // (the first point 1 s after the range's start).
        let raw: f64 = 9.0 + 9.0;
        assert!((inc[0].1 - raw * 20.0 / 19.0).abs() < 1e-9, "{inc:?}");
        // Fewer than two points in the range: no value.
        assert!(vector(&store, "rate(c_total[1s])", 40.0).is_empty());
    }

    #[test]
    fn instant_selectors_match_labels_anchored_and_series_go_stale() {
        let store = Store {
            series: vec![
                series("w", &[("name", "big"), ("instance", "n1")], &[(0.0, Some(10.0)), (5.0, None)]),
                series("w", &[("name", "small"), ("instance", "n1")], &[(0.0, Some(1000.0)), (5.0, Some(1000.0))]),
                series("w", &[("name", "ab"), ("instance", "n2")], &[(0.0, Some(5.0))]),
            ],
        };
        let names = |v: Vec<(Labels, f64)>| v.into_iter().map(|(l, _)| l["name"].clone()).collect::<Vec<_>>();
        assert_eq!(names(vector(&store, r#"w{instance=~"n1"}"#, 1.0)), ["big", "small"]);
        assert_eq!(names(vector(&store, r#"w{name=~"b"}"#, 1.0)), Vec::<String>::new(), "=~ is anchored");
        assert_eq!(names(vector(&store, r#"w{name!~"a.*|s.*"}"#, 1.0)), ["big"]);
        assert_eq!(names(vector(&store, r#"w{name!="big",instance="n1"}"#, 1.0)), ["small"]);
        // big vanished from the scrape at t=5: gone from then on; ab's last point is kept for the lookback.
        assert_eq!(names(vector(&store, "w", 6.0)), ["small", "ab"]);
        assert_eq!(names(vector(&store, "w", 301.0)), ["small"]);
        assert!(vector(&store, "w", -1.0).is_empty(), "nothing before the first scrape");
    }

    #[test]
    fn aggregations_group_by_labels_and_count_values_labels_by_value() {
        let store = Store {
            series: vec![
                series("l", &[("name", "a"), ("instance", "n1")], &[(0.0, Some(0.0))]),
                series("l", &[("name", "b"), ("instance", "n1")], &[(0.0, Some(2.0))]),
                series("l", &[("name", "c"), ("instance", "n2")], &[(0.0, Some(0.0))]),
            ],
        };
        assert_eq!(
            vector(&store, r#"count_values("level", l)"#, 0.0),
            [(labels(&[("level", "0")]), 2.0), (labels(&[("level", "2")]), 1.0)]
        );
        assert_eq!(
            vector(&store, "sum by (instance) (l)", 0.0),
            [(labels(&[("instance", "n1")]), 2.0), (labels(&[("instance", "n2")]), 0.0)]
        );
        assert_eq!(vector(&store, "max(l)", 0.0), [(Labels::new(), 2.0)]);
        assert_eq!(vector(&store, "count(l)", 0.0), [(Labels::new(), 3.0)]);
        assert_eq!(vector(&store, "avg(l)", 0.0), [(Labels::new(), 2.0 / 3.0)]);
    }

    #[test]
    fn histogram_quantile_interpolates_inside_the_bucket() {
        let b = |le: &str, v: f64| series("h_bucket", &[("le", le)], &[(0.0, Some(v))]);
        let store = Store { series: vec![b("0.1", 2.0), b("0.2", 6.0), b("+Inf", 8.0)] };
        let q = |q: f64| vector(&store, &format!("histogram_quantile({q}, h_bucket)"), 0.0)[0].1;
        assert!((q(0.5) - 0.15).abs() < 1e-12, "rank 4 of 8: halfway through (0.1, 0.2]");
        assert!((q(0.125) - 0.05).abs() < 1e-12, "rank 1: halfway through (0, 0.1]");
        assert_eq!(q(0.9), 0.2, "in the +Inf bucket: the highest finite bound");
        let empty = Store { series: vec![b("0.1", 0.0), b("+Inf", 0.0)] };
        assert!(vector(&empty, "histogram_quantile(0.5, h_bucket)", 0.0).is_empty(), "no observations: no value");
    }

    #[test]
    fn durations_parse_like_prometheus() {
        assert_eq!(parse_duration("15s").unwrap(), 15.0);
        assert_eq!(parse_duration("1m30s").unwrap(), 90.0);
        assert_eq!(parse_duration("500ms").unwrap(), 0.5);
        assert!(parse_duration("15").is_err() && parse_duration("1x").is_err() && parse_duration("").is_err());
    }
}
