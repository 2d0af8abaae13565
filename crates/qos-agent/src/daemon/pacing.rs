//! [`Pacer`]: when the next sampling round starts. The configured interval, stretched when rounds would cost more
//! CPU than the budget allows (a host with so many containers doing I/O that every counter file must be read in
//! every round), up to [`MAX_STRETCH`] times the interval. Pure: the CPU time of each round is passed in.

use std::time::Duration;

/// The longest a round may be stretched to, in multiples of the sampling interval (4 s at the default 500 ms):
/// beyond it demotion would lag too far behind the I/O, so the budget gives way (and says so once).
pub const MAX_STRETCH: u32 = 8;

/// A CPU budget: a share of one core, in parts per million (`"0.8%"` is 8,000).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuBudget(u32);

impl CpuBudget {
    /// Parts per million of one core.
    pub const fn from_ppm(ppm: u32) -> Self {
        Self(ppm)
    }

    /// Parts per million of one core.
    pub const fn ppm(self) -> u32 {
        self.0
    }

    /// Parses `"0.8%"`: a percentage of one core, > 0 and <= 100, at most four decimals.
    pub fn parse(text: &str) -> Result<Self, String> {
        let number = text.trim().strip_suffix('%').ok_or("must be a percentage of one core such as \"0.8%\"")?;
        let number = number.trim();
        let (int, frac) = number.split_once('.').unwrap_or((number, "0"));
        let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
        if !digits(int) || !digits(frac) || frac.len() > 4 || int.len() > 3 {
            return Err("must be a percentage of one core such as \"0.8%\" (at most 4 decimals)".into());
        }
        let ppm = int.parse::<u32>().unwrap_or(u32::MAX).saturating_mul(10_000)
            + format!("{frac:0<4}").parse::<u32>().unwrap_or(0);
        if ppm == 0 || ppm > 1_000_000 {
            return Err("must be more than 0% and at most 100%".into());
        }
        Ok(Self(ppm))
    }

    /// The round period that keeps `cpu` per round within the budget.
    fn period_for(self, cpu: Duration) -> Duration {
        let nanos = cpu.as_nanos().saturating_mul(1_000_000) / u128::from(self.0);
        Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
    }
}

impl std::fmt::Display for CpuBudget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (int, frac) = (self.0 / 10_000, self.0 % 10_000);
        if frac == 0 {
            write!(f, "{int}%")
        } else {
            write!(f, "{int}.{}%", format!("{frac:04}").trim_end_matches('0'))
        }
    }
}

/// Whether the last [`Pacer::after_round`] changed how rounds are paced (for a log line on transitions only).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transition {
    /// No change.
    None,
    /// Rounds are now further apart than the interval.
    Stretched,
    /// Back to the interval.
    Relaxed,
    /// Even [`MAX_STRETCH`] times the interval does not keep rounds within the budget.
    OverBudget,
}

/// Paces sampling rounds. Feed it each round's CPU time; it answers the period until the next round's start.
#[derive(Debug, Clone)]
pub struct Pacer {
    interval: Duration,
    budget: Option<CpuBudget>,
    /// Smoothed CPU time per round (a quarter of each new round, so one slow round does not stall sampling).
    avg: Option<Duration>,
    period: Duration,
    over: bool,
}

impl Pacer {
    /// Rounds every `interval`, stretched to stay within `budget` (`None`: never stretched).
    pub fn new(interval: Duration, budget: Option<CpuBudget>) -> Self {
        Self { interval, budget, avg: None, period: interval, over: false }
    }

    /// Changes the interval and budget (a reloaded config), keeping the CPU history.
    pub fn reconfigure(&mut self, interval: Duration, budget: Option<CpuBudget>) {
        self.interval = interval;
        self.budget = budget;
        self.period = self.compute();
    }

    /// The current period between round starts.
    pub fn period(&self) -> Duration {
        self.period
    }

    /// The smoothed CPU time per round.
    pub fn cpu_per_round(&self) -> Duration {
        self.avg.unwrap_or_default()
    }

    /// Whether rounds every `interval` (shorter than the period, e.g. the agent's entry rounds) stay within the
    /// budget at the CPU a round costs now. Always, without a budget.
    pub fn allows(&self, interval: Duration) -> bool {
        self.budget.is_none_or(|b| b.period_for(self.cpu_per_round()) <= interval)
    }

    /// Records a round's CPU time; afterwards [`Pacer::period`] is the time from that round's start to the next.
    pub fn after_round(&mut self, cpu: Duration) -> Transition {
        self.avg = Some(match self.avg {
            None => cpu,
            Some(avg) => (avg * 3 + cpu) / 4,
        });
        let before = self.period;
        let was_over = self.over;
        self.period = self.compute();
        match () {
            _ if self.over && !was_over => Transition::OverBudget,
            _ if self.period > self.interval && before == self.interval => Transition::Stretched,
            _ if self.period == self.interval && before > self.interval => Transition::Relaxed,
            _ => Transition::None,
        }
    }

    fn compute(&mut self) -> Duration {
        let Some(budget) = self.budget else {
            self.over = false;
            return self.interval;
        };
        let wanted = budget.period_for(self.cpu_per_round());
        let max = self.interval.saturating_mul(MAX_STRETCH);
        self.over = wanted > max;
        wanted.clamp(self.interval, max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn shorter_rounds_are_allowed_only_within_the_budget() {
        let mut p = Pacer::new(MS * 500, Some(CpuBudget::from_ppm(8_000)));
        assert!(p.allows(MS * 50), "no history yet");
        p.after_round(Duration::from_micros(80)); // 10 ms of period at 0.8 %
        assert!(p.allows(MS * 50) && p.allows(MS * 10));
        assert!(!p.allows(MS * 9));
        p.after_round(MS * 4); // the smoothed round now costs ~1 ms: 125 ms of period
        assert!(!p.allows(MS * 50), "{:?}", p.cpu_per_round());
        assert!(p.allows(MS * 500));
        assert!(Pacer::new(MS * 500, None).allows(MS * 10), "no budget, no limit");
    }

    #[test]
    fn budget_parses_and_prints() {
        for (text, ppm, shown) in
            [("0.8%", 8_000, "0.8%"), ("1%", 10_000, "1%"), (" 0.0125% ", 125, "0.0125%"), ("100%", 1_000_000, "100%")]
        {
            let b = CpuBudget::parse(text).unwrap();
            assert_eq!(b.ppm(), ppm, "{text}");
            assert_eq!(b.to_string(), shown);
        }
        for bad in ["0.8", "0%", "0.00001%", "-1%", "101%", "abc%", "1.%", ".5%", "1e2%", "", "%", "99999999999%"] {
            assert!(CpuBudget::parse(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn cheap_rounds_keep_the_interval() {
        let mut p = Pacer::new(500 * MS, Some(CpuBudget::from_ppm(8_000)));
        for _ in 0..10 {
            assert_eq!(p.after_round(2 * MS), Transition::None);
            assert_eq!(p.period(), 500 * MS, "2 ms per 500 ms is 0.4 %");
        }
    }

    #[test]
    fn costly_rounds_are_spread_to_the_budget_and_back() {
        let mut p = Pacer::new(500 * MS, Some(CpuBudget::from_ppm(8_000)));
        assert_eq!(p.after_round(8 * MS), Transition::Stretched);
        assert_eq!(p.period(), 1000 * MS, "8 ms of CPU at 0.8 % needs a second");
        for _ in 0..20 {
            p.after_round(8 * MS);
        }
        assert_eq!(p.period(), 1000 * MS);
        // Cheap again: the average decays by a quarter per round, the period follows, then snaps to the interval.
        let mut relaxed = false;
        for i in 0..30 {
            match p.after_round(MS) {
                Transition::Relaxed => {
                    relaxed = true;
                    assert!(i > 1, "one cheap round does not undo the stretch at once");
                    break;
                }
                t => assert_eq!(t, Transition::None),
            }
        }
        assert!(relaxed);
        assert_eq!(p.period(), 500 * MS);
    }

    #[test]
    fn one_slow_round_stretches_a_quarter_as_much() {
        let mut p = Pacer::new(500 * MS, Some(CpuBudget::from_ppm(8_000)));
        p.after_round(MS);
        p.after_round(33 * MS); // (3 * 1 + 33) / 4 = 9 ms average
        assert_eq!(p.period(), 1125 * MS);
    }

    #[test]
    fn the_stretch_is_capped_and_says_so_once() {
        let mut p = Pacer::new(500 * MS, Some(CpuBudget::from_ppm(8_000)));
        assert_eq!(p.after_round(100 * MS), Transition::OverBudget);
        assert_eq!(p.period(), 4000 * MS, "{MAX_STRETCH} x the interval at most");
        assert_eq!(p.after_round(100 * MS), Transition::None);
    }

    #[test]
    fn no_budget_never_stretches_and_reconfigure_applies() {
        let mut p = Pacer::new(500 * MS, None);
        assert_eq!(p.after_round(Duration::from_secs(1)), Transition::None);
        assert_eq!(p.period(), 500 * MS);
        p.reconfigure(250 * MS, Some(CpuBudget::from_ppm(10_000)));
        assert_eq!(p.period(), 2000 * MS, "the kept history (1 s per round) at 1 %, capped at 8 x 250 ms");
    }
}

/// Serde for an optional budget as text: `"0.8%"`, or `"off"` for none (for `#[serde(with = ...)]`).
pub mod budget_text {
    use serde::{Deserialize, Deserializer, Serializer};

    use super::CpuBudget;

    /// Writes `"off"` or the percentage.
    pub fn serialize<S: Serializer>(budget: &Option<CpuBudget>, s: S) -> Result<S::Ok, S::Error> {
        match budget {
            None => s.serialize_str("off"),
            Some(b) => s.collect_str(b),
        }
    }

    /// Reads `"off"` or a percentage; the error names the value.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<CpuBudget>, D::Error> {
        let text = String::deserialize(d)?;
        if text.trim() == "off" {
            return Ok(None);
        }
        CpuBudget::parse(&text).map(Some).map_err(|why| serde::de::Error::custom(format!("{text:?}: {why}")))
    }
}
