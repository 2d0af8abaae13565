//! [`Weight`]: a block-I/O weight on the engine's one scale, and conversions to every file and API that takes one.
//!
//! The engine works on BFQ's scale, 1..=1000 (default 100). Docker's `--blkio-weight` (10..=1000) fits inside it.
//! All arithmetic is done in `u32`/`u64`, which cannot overflow for these ranges.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A block-I/O weight on BFQ's scale, 1..=1000.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Weight(u16);

/// A weight outside 1..=1000, or a file value outside its file's range.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WeightError {
    /// A value given on the engine's scale was outside 1..=1000.
    #[error("weight {value} is outside {min}..={max}")]
    OutOfRange {
        /// The rejected value.
        value: u64,
        /// Smallest accepted value.
        min: u32,
        /// Largest accepted value.
        max: u32,
    },
}

impl Weight {
    /// Smallest weight (BFQ's minimum).
    pub const MIN: Weight = Weight(1);
    /// Largest weight: the paper's weight for new containers.
    pub const MAX: Weight = Weight(1000);
    /// The kernel's default for a cgroup nobody configured (BFQ and io.weight both use 100).
    pub const KERNEL_DEFAULT: Weight = Weight(100);

    /// Validates `value` against 1..=1000.
    pub fn new(value: u64) -> Result<Self, WeightError> {
        if (u64::from(Self::MIN.0)..=u64::from(Self::MAX.0)).contains(&value) {
            Ok(Self(value as u16))
        } else {
            Err(WeightError::OutOfRange { value, min: Self::MIN.0.into(), max: Self::MAX.0.into() })
        }
    }

    /// The value on the engine's scale.
    pub fn get(self) -> u32 {
        u32::from(self.0)
    }

    /// Value for cgroup v1 `blkio.bfq.weight` and cgroup v2 `io.bfq.weight` (both 1..=1000): identical.
    pub fn to_bfq(self) -> u32 {
        self.get()
    }

    /// Value for the legacy cgroup v1 `blkio.weight` (CFQ, 10..=1000): weights below 10 are raised to 10.
    pub fn to_v1_blkio_weight(self) -> u32 {
        self.get().max(10)
    }

    /// Value for Docker's `--blkio-weight` / `HostConfig.BlkioWeight` (10..=1000; 0 means "unset" to Docker, so
    /// weights below 10 are raised to 10).
    pub fn to_docker(self) -> u16 {
        self.0.max(10)
    }

    /// Value for cgroup v2 `io.weight` (io.cost, 1..=10000, default 100).
    ///
    /// Identity: both schedulers are proportional-share with default 100, so keeping the number keeps every ratio
    /// between containers and keeps "unconfigured" meaning the same. A linear range map (1..1000 -> 1..10000, as
    /// runc does for Docker's 10..1000) would turn a 1000:10 ratio into 10000:1 and 100 into 991.
    pub fn to_io_weight(self) -> u32 {
        self.get()
    }

    /// Inverse of [`Weight::to_io_weight`] for reading `io.weight` back; values above 1000 (set by someone else)
    /// are reported as 1000, the top of our scale.
    pub fn from_io_weight(value: u32) -> Result<Self, WeightError> {
        if !(1..=10_000).contains(&value) {
            return Err(WeightError::OutOfRange { value: value.into(), min: 1, max: 10_000 });
        }
        Ok(Self(value.min(1000) as u16))
    }
}

impl fmt::Display for Weight {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl Serialize for Weight {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u16(self.0)
    }
}

impl<'de> Deserialize<'de> for Weight {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = i64::deserialize(d)?;
        let v = u64::try_from(v).map_err(|_| serde::de::Error::custom(format!("weight {v} is outside 1..=1000")))?;
        Weight::new(v).map_err(serde::de::Error::custom)
    }
}
