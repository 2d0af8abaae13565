//! Byte sizes, I/O counters and human-readable durations, with the parsing the config needs.

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A number of bytes, written in config files as `"2MiB"`, `"8 MB"`, `"512k"` or a plain integer.
///
/// Binary suffixes (`KiB`, `MiB`, `GiB`, `TiB`, and the bare `K`, `M`, `G`, `T`) are powers of 1024; decimal ones
/// (`kB`, `MB`, `GB`, `TB`) powers of 1000.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct ByteSize(pub u64);

impl ByteSize {
    /// `n` mebibytes.
    pub const fn mib(n: u64) -> Self {
        Self(n * 1024 * 1024)
    }

    /// Parses the config notation; the error text names the value.
    pub fn parse(text: &str) -> Result<Self, String> {
        let t = text.trim();
        let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
        let (num, unit) = t.split_at(split);
        let n: u64 = num.parse().map_err(|_| {
            if num.is_empty() {
                format!("byte size {text:?} does not start with a number")
            } else {
                format!("byte size {text:?} overflows 64 bits")
            }
        })?;
        let mult: u64 = match unit.trim() {
            "" | "B" => 1,
            "K" | "KiB" | "k" => 1 << 10,
            "M" | "MiB" => 1 << 20,
            "G" | "GiB" => 1 << 30,
            "T" | "TiB" => 1 << 40,
            "kB" | "KB" => 1_000,
            "MB" => 1_000_000,
            "GB" => 1_000_000_000,
            "TB" => 1_000_000_000_000,
            other => return Err(format!("byte size {text:?} has unknown unit {other:?}")),
        };
        n.checked_mul(mult).map(Self).ok_or_else(|| format!("byte size {text:?} overflows 64 bits"))
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: [(&str, u64); 4] = [("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)];
        for (name, size) in UNITS {
            if self.0 >= size && self.0 % size == 0 {
                return write!(f, "{}{}", self.0 / size, name);
            }
        }
        write!(f, "{}B", self.0)
    }
}

impl Serialize for ByteSize {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Int(i64),
            Text(String),
        }
        match Raw::deserialize(d)? {
            Raw::Int(n) => u64::try_from(n)
                .map(ByteSize)
                .map_err(|_| serde::de::Error::custom(format!("byte size {n} is negative"))),
            Raw::Text(t) => ByteSize::parse(&t).map_err(serde::de::Error::custom),
        }
    }
}

/// Cumulative I/O byte counters of one container, as read from its cgroup.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash, Serialize, Deserialize)]
pub struct IoCounters {
    /// Bytes read since the cgroup was created.
    pub read: u64,
    /// Bytes written since the cgroup was created.
    pub write: u64,
}

impl IoCounters {
    /// Counters with the given read and write totals.
    pub const fn new(read: u64, write: u64) -> Self {
        Self { read, write }
    }
}

/// Parses `"500ms"`, `"5s"`, `"2m"`, `"1h"`, `"1.5s"` (also `"us"`, `"µs"` and `"ns"`); the error text names the
/// value. Integers are converted exactly, so every value [`format_duration`] writes reads back unchanged.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let out_of_range = || format!("duration {text:?} is out of range");
    // Integers are converted exactly: `"1000000001ns"` must not lose its last nanosecond to f64 rounding.
    let integral = !num.is_empty() && num.bytes().all(|b| b.is_ascii_digit());
    let fractional = if integral {
        None
    } else {
        Some(num.parse::<f64>().map_err(|_| format!("duration {text:?} does not start with a number"))?)
    };
    let unit_nanos: u64 = match unit.trim() {
        "ns" => 1,
        "us" | "µs" => 1_000,
        "ms" => 1_000_000,
        "s" => NANOS_PER_SEC,
        "m" | "min" => 60 * NANOS_PER_SEC,
        "h" => 3600 * NANOS_PER_SEC,
        "" => return Err(format!("duration {text:?} needs a unit (ns, us, ms, s, m, h)")),
        other => return Err(format!("duration {text:?} has unknown unit {other:?}")),
    };
    let nanos: u128 = match fractional {
        None => {
            let n: u128 = num.parse().map_err(|_| out_of_range())?;
            n.checked_mul(u128::from(unit_nanos)).ok_or_else(out_of_range)?
        }
        Some(n) => {
            let nanos = (n * unit_nanos as f64).round();
            if !nanos.is_finite() || nanos >= MAX_DURATION_NANOS as f64 {
                return Err(out_of_range());
            }
            nanos as u128
        }
    };
    if nanos > MAX_DURATION_NANOS {
        return Err(out_of_range());
    }
    let secs = u64::try_from(nanos / u128::from(NANOS_PER_SEC)).map_err(|_| out_of_range())?;
    Ok(Duration::new(secs, (nanos % u128::from(NANOS_PER_SEC)) as u32))
}

const NANOS_PER_SEC: u64 = 1_000_000_000;
/// Nanoseconds in `Duration::MAX`.
const MAX_DURATION_NANOS: u128 = Duration::MAX.as_nanos();

/// Formats a duration the way [`parse_duration`] reads it, in the largest unit that keeps it exact.
pub fn format_duration(d: Duration) -> String {
    let nanos = d.as_nanos();
    if nanos == 0 {
        "0ms".to_owned()
    } else if nanos % u128::from(NANOS_PER_SEC) == 0 {
        format!("{}s", d.as_secs())
    } else if nanos % 1_000_000 == 0 {
        format!("{}ms", nanos / 1_000_000)
    } else if nanos % 1_000 == 0 {
        format!("{}us", nanos / 1_000)
    } else {
        format!("{nanos}ns")
    }
}

/// Serde adapter for a required duration written as text (`"5s"`).
pub mod duration {
    use super::*;

    /// Serializes as `"5s"`.
    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format_duration(*d))
    }

    /// Deserializes `"5s"`.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let t = String::deserialize(d)?;
        parse_duration(&t).map_err(serde::de::Error::custom)
    }
}

/// Serde adapter for an optional duration: a duration as text, or `"off"`.
pub mod opt_duration {
    use super::*;

    /// Serializes `None` as `"off"`.
    pub fn serialize<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match d {
            Some(d) => s.serialize_str(&format_duration(*d)),
            None => s.serialize_str("off"),
        }
    }

    /// Deserializes `"off"` as `None`.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        let t = String::deserialize(d)?;
        if t.trim() == "off" {
            return Ok(None);
        }
        parse_duration(&t).map(Some).map_err(serde::de::Error::custom)
    }
}
