//! Byte sizes and durations as written in config files.

use std::time::Duration;

use proptest::prelude::*;
use qos_core::units::{format_duration, parse_duration};
use qos_core::{ByteSize, IoCounters};

use crate::common::{mib, ms, s};

#[test]
fn byte_sizes_parse() {
    for (text, bytes) in [
        ("0", 0),
        ("512", 512),
        ("512B", 512),
        ("512k", 512 << 10),
        ("1K", 1 << 10),
        ("1KiB", 1 << 10),
        ("2MiB", mib(2)),
        ("2 MiB", mib(2)),
        ("  8M ", mib(8)),
        ("1G", 1 << 30),
        ("1GiB", 1 << 30),
        ("1T", 1 << 40),
        ("1TiB", 1 << 40),
        ("1kB", 1_000),
        ("1KB", 1_000),
        ("4MB", 4_000_000),
        ("1GB", 1_000_000_000),
        ("1TB", 1_000_000_000_000),
        ("18446744073709551615", u64::MAX),
    ] {
        assert_eq!(ByteSize::parse(text), Ok(ByteSize(bytes)), "{text:?}");
    }
}

#[test]
fn bad_byte_sizes_name_the_value() {
    for (text, expect) in [
        ("", "does not start with a number"),
        ("MiB", "does not start with a number"),
        ("-1", "does not start with a number"),
        ("1.5MiB", "unknown unit \".5MiB\""),
        ("2mib", "unknown unit \"mib\""),
        ("1PB", "unknown unit \"PB\""),
        ("16777216TiB", "overflows 64 bits"),
        ("18446744073709551616", "overflows 64 bits"),
    ] {
        let err = ByteSize::parse(text).unwrap_err();
        assert!(err.contains(&format!("{text:?}")), "names the value: {err}");
        assert!(err.contains(expect), "{text:?}: {err}");
    }
}

#[test]
fn byte_sizes_display_in_the_largest_exact_binary_unit() {
    for (bytes, text) in [
        (0, "0B"),
        (1, "1B"),
        (1023, "1023B"),
        (1024, "1KiB"),
        (1536, "1536B"),
        (mib(3), "3MiB"),
        (mib(1024), "1GiB"),
        (mib(3) + 1024, "3073KiB"),
        (1 << 40, "1TiB"),
        (u64::MAX, "18446744073709551615B"),
    ] {
        assert_eq!(ByteSize(bytes).to_string(), text);
    }
}

#[test]
fn io_counters_hold_their_values() {
    let c = IoCounters::new(1, 2);
    assert_eq!((c.read, c.write), (1, 2));
    assert_eq!(IoCounters::default(), IoCounters::new(0, 0));
}

#[test]
fn durations_parse() {
    for (text, d) in [
        ("500ms", ms(500)),
        ("5s", s(5)),
        (" 3 s ", s(3)),
        ("2m", s(120)),
        ("2min", s(120)),
        ("1h", s(3600)),
        ("1.5s", ms(1500)),
        ("0.1s", ms(100)),
        (".5s", ms(500)),
        ("0.25m", s(15)),
        ("10us", Duration::from_micros(10)),
        ("10µs", Duration::from_micros(10)),
        ("7ns", Duration::from_nanos(7)),
        ("1000000001ns", Duration::new(1, 1)),
        ("0s", Duration::ZERO),
        ("18446744073709551615s", Duration::from_secs(u64::MAX)),
    ] {
        assert_eq!(parse_duration(text), Ok(d), "{text:?}");
    }
}

#[test]
fn bad_durations_name_the_value() {
    for (text, expect) in [
        ("", "does not start with a number"),
        ("5", "needs a unit"),
        ("s", "does not start with a number"),
        ("-1s", "does not start with a number"),
        ("1.5.3s", "does not start with a number"),
        ("1e3s", "unknown unit \"e3s\""),
        ("1d", "unknown unit \"d\""),
        ("18446744073709551616s", "out of range"),
        ("5124095576030432h", "out of range"),
        ("99999999999999999999999.5h", "out of range"),
    ] {
        let err = parse_duration(text).unwrap_err();
        assert!(err.contains(&format!("{text:?}")), "names the value: {err}");
        assert!(err.contains(expect), "{text:?}: {err}");
    }
}

#[test]
fn durations_format_in_the_largest_exact_unit() {
    for (d, text) in [
        (Duration::ZERO, "0ms"),
        (s(10), "10s"),
        (s(120), "120s"),
        (ms(1500), "1500ms"),
        (Duration::from_micros(1500), "1500us"),
        (Duration::from_nanos(1), "1ns"),
        // Whole milliseconds plus one nanosecond must not be shown (or written back) as whole seconds.
        (Duration::new(1, 1), "1000000001ns"),
    ] {
        assert_eq!(format_duration(d), text);
    }
}

proptest! {
    #[test]
    fn byte_size_display_parses_back(bytes in any::<u64>()) {
        prop_assert_eq!(ByteSize::parse(&ByteSize(bytes).to_string()), Ok(ByteSize(bytes)));
    }

    #[test]
    fn byte_size_in_every_unit_parses(n in 0u64..1 << 20, unit in prop::sample::select(vec![
        ("B", 1u64), ("K", 1 << 10), ("KiB", 1 << 10), ("M", 1 << 20), ("MiB", 1 << 20), ("G", 1 << 30),
        ("GiB", 1 << 30), ("kB", 1_000), ("MB", 1_000_000), ("GB", 1_000_000_000),
    ])) {
        prop_assert_eq!(ByteSize::parse(&format!("{n}{}", unit.0)), Ok(ByteSize(n * unit.1)));
    }

    #[test]
    fn duration_format_parses_back(secs in any::<u64>(), nanos in 0u32..1_000_000_000) {
        let d = Duration::new(secs, nanos);
        prop_assert_eq!(parse_duration(&format_duration(d)), Ok(d));
    }

    #[test]
    fn small_durations_format_parses_back(nanos in any::<u64>()) {
        let d = Duration::from_nanos(nanos);
        prop_assert_eq!(parse_duration(&format_duration(d)), Ok(d));
    }

    #[test]
    fn parsing_arbitrary_text_never_panics(text in "\\PC{0,24}") {
        let _ = parse_duration(&text);
        let _ = ByteSize::parse(&text);
    }
}
