//! Read-time statistics: an HDR histogram at microsecond resolution per (case, variant), its summary, its
//! serialized form (V2 + DEFLATE, base64) and value/count pairs for the JSON, CDF points for the chart, and the
//! ratios the report prints, always computed from the histograms.

use std::time::Duration;

use anyhow::{Context, Result};
use base64::Engine as _;
use hdrhistogram::serialization::{Deserializer, Serializer, V2DeflateSerializer};
use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

/// Largest read time recorded: one hour, in microseconds.
const MAX_US: u64 = 3_600_000_000;

/// Read times of one case and variant, in microseconds.
#[derive(Debug, Clone)]
pub struct Latency {
    hist: Histogram<u64>,
}

impl Default for Latency {
    fn default() -> Self {
        Self::new()
    }
}

/// Mean and percentiles, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// Samples.
    pub n: u64,
    /// Mean.
    pub mean_ms: f64,
    /// Median.
    pub p50_ms: f64,
    /// 90th percentile.
    pub p90_ms: f64,
    /// 99th percentile.
    pub p99_ms: f64,
    /// Largest.
    pub max_ms: f64,
    /// Smallest.
    pub min_ms: f64,
}

/// `a / b` for each statistic (`None` where `b` is zero or either side is empty).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Ratios {
    /// Of the means.
    pub mean: Option<f64>,
    /// Of the medians.
    pub p50: Option<f64>,
    /// Of the 90th percentiles.
    pub p90: Option<f64>,
    /// Of the 99th percentiles.
    pub p99: Option<f64>,
    /// Of the maxima.
    pub max: Option<f64>,
}

impl Latency {
    /// An empty histogram (1 µs .. 1 h, 3 significant digits).
    pub fn new() -> Self {
        Self { hist: Histogram::new_with_bounds(1, MAX_US, 3).expect("static bounds are valid") }
    }

    /// Records one read time (clamped to 1 µs .. 1 h).
    pub fn record(&mut self, d: Duration) {
        let us = (d.as_nanos() / 1000).clamp(1, u128::from(MAX_US)) as u64;
        self.hist.record(us).expect("value clamped into range");
    }

    /// Mean and percentiles.
    pub fn summary(&self) -> Summary {
        let ms = |us: u64| us as f64 / 1e3;
        if self.hist.is_empty() {
            return Summary::empty();
        }
        Summary {
            n: self.hist.len(),
            mean_ms: self.hist.mean() / 1e3,
            p50_ms: ms(self.hist.value_at_quantile(0.50)),
            p90_ms: ms(self.hist.value_at_quantile(0.90)),
            p99_ms: ms(self.hist.value_at_quantile(0.99)),
            max_ms: ms(self.hist.max()),
            min_ms: ms(self.hist.min()),
        }
    }

    /// Serialized as hdrhistogram V2 + DEFLATE, base64 (readable by any HdrHistogram implementation).
    pub fn to_base64(&self) -> String {
        let mut bytes = Vec::new();
        V2DeflateSerializer::new().serialize(&self.hist, &mut bytes).expect("serializing into memory");
        base64::engine::general_purpose::STANDARD.encode(bytes)
    }

    /// Inverse of [`Latency::to_base64`].
    pub fn from_base64(text: &str) -> Result<Self> {
        let bytes = base64::engine::general_purpose::STANDARD.decode(text).context("histogram is not base64")?;
        let hist: Histogram<u64> =
            Deserializer::new().deserialize(&mut bytes.as_slice()).context("histogram is not hdrhistogram V2")?;
        Ok(Self { hist })
    }

    /// Recorded values (µs, bucket-equivalent) with their counts, ascending.
    pub fn value_counts(&self) -> Vec<(u64, u64)> {
        self.hist
            .iter_recorded()
            .map(|v| (self.hist.highest_equivalent(v.value_iterated_to()), v.count_at_value()))
            .collect()
    }

    /// CDF points: (milliseconds, fraction of reads at or below), ascending.
    pub fn cdf(&self) -> Vec<(f64, f64)> {
        let total = self.hist.len() as f64;
        let mut acc = 0u64;
        self.value_counts()
            .into_iter()
            .map(|(us, count)| {
                acc += count;
                (us as f64 / 1e3, acc as f64 / total)
            })
            .collect()
    }
}

impl Summary {
    /// The summary of no samples: all zeros.
    pub const fn empty() -> Self {
        Summary { n: 0, mean_ms: 0.0, p50_ms: 0.0, p90_ms: 0.0, p99_ms: 0.0, max_ms: 0.0, min_ms: 0.0 }
    }
}

impl Ratios {
    /// `a / b` statistic by statistic.
    pub fn of(a: &Summary, b: &Summary) -> Self {
        let r = |x: f64, y: f64| (a.n > 0 && b.n > 0 && y > 0.0).then(|| x / y);
        Self {
            mean: r(a.mean_ms, b.mean_ms),
            p50: r(a.p50_ms, b.p50_ms),
            p90: r(a.p90_ms, b.p90_ms),
            p99: r(a.p99_ms, b.p99_ms),
            max: r(a.max_ms, b.max_ms),
        }
    }
}

/// Throughput in MiB/s of `bytes` over `secs`.
pub fn mib_per_s(bytes: u64, secs: f64) -> f64 {
    if secs > 0.0 {
        bytes as f64 / (1u64 << 20) as f64 / secs
    } else {
        0.0
    }
}

/// The spread of a quantity over repetitions: how many, the median, the least and the most.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Spread {
    /// Repetitions.
    pub n: usize,
    /// Median (the mean of the middle two for an even count).
    pub median: f64,
    /// Smallest.
    pub min: f64,
    /// Largest.
    pub max: f64,
}

impl Spread {
    /// Of `values` (`None` when empty; NaNs are left out).
    pub fn of(values: impl IntoIterator<Item = f64>) -> Option<Self> {
        let mut v: Vec<f64> = values.into_iter().filter(|x| !x.is_nan()).collect();
        if v.is_empty() {
            return None;
        }
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let median = if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 };
        Some(Self { n, median, min: v[0], max: v[n - 1] })
    }

    /// The p-th percentile by nearest rank (`p` in 0..=100).
    pub fn percentile(values: &[f64], p: f64) -> Option<f64> {
        let mut v: Vec<f64> = values.iter().copied().filter(|x| !x.is_nan()).collect();
        if v.is_empty() {
            return None;
        }
        v.sort_by(f64::total_cmp);
        let rank = ((p / 100.0) * v.len() as f64).ceil().max(1.0) as usize;
        Some(v[rank.min(v.len()) - 1])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lat(ms: &[u64]) -> Latency {
        let mut l = Latency::new();
        for &m in ms {
            l.record(Duration::from_millis(m));
        }
        l
    }

    #[test]
    fn summary_of_known_values() {
        let l = lat(&(1..=100).collect::<Vec<_>>());
        let s = l.summary();
        assert_eq!(s.n, 100);
        assert!((s.mean_ms - 50.5).abs() < 0.1, "{s:?}");
        assert!((s.p50_ms - 50.0).abs() < 0.1, "{s:?}");
        assert!((s.p90_ms - 90.0).abs() < 0.1, "{s:?}");
        assert!((s.p99_ms - 99.0).abs() < 0.1, "{s:?}");
        assert!((s.max_ms - 100.0).abs() < 0.1 && (s.min_ms - 1.0).abs() < 0.01, "{s:?}");
        assert_eq!(Latency::new().summary().n, 0);
    }

    #[test]
    fn microsecond_resolution_and_clamping() {
        let mut l = Latency::new();
        l.record(Duration::from_micros(1234));
        l.record(Duration::from_nanos(10));
        let s = l.summary();
        assert!((s.max_ms - 1.234).abs() < 0.002, "{s:?}");
        assert_eq!(s.min_ms, 0.001);
    }

    #[test]
    fn base64_round_trip() {
        let l = lat(&[1, 2, 3, 500, 20_000]);
        let back = Latency::from_base64(&l.to_base64()).unwrap();
        assert_eq!(back.summary(), l.summary());
        assert_eq!(back.value_counts(), l.value_counts());
        assert!(Latency::from_base64("not base64!").is_err());
    }

    #[test]
    fn cdf_ends_at_one_and_is_monotone() {
        let l = lat(&[5, 1, 1, 9]);
        let cdf = l.cdf();
        assert_eq!(cdf.len(), 3);
        assert!((cdf[0].1 - 0.5).abs() < 1e-9);
        assert!((cdf.last().unwrap().1 - 1.0).abs() < 1e-9);
        assert!(cdf.windows(2).all(|w| w[0].0 < w[1].0 && w[0].1 <= w[1].1));
        assert_eq!(l.value_counts().iter().map(|(_, c)| c).sum::<u64>(), 4);
    }

    #[test]
    fn ratios() {
        let a = lat(&[10, 10]).summary();
        let b = lat(&[20, 40]).summary();
        let r = Ratios::of(&a, &b);
        assert!((r.mean.unwrap() - 10.0 / 30.0).abs() < 1e-3);
        assert!((r.max.unwrap() - 0.25).abs() < 1e-3);
        assert_eq!(Ratios::of(&a, &Latency::new().summary()).mean, None);
        assert!((mib_per_s(3 << 20, 2.0) - 1.5).abs() < 1e-9);
        assert_eq!(mib_per_s(1, 0.0), 0.0);
    }
}
