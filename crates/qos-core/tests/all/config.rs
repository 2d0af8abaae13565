//! Config validation (every error names field and value) and TOML parsing.

use std::time::Duration;

use qos_core::config::MAX_DURATION;
use qos_core::{ByteSize, Config, ConfigError, CountMode, LevelConfig, MAX_LEVELS};

use crate::common::{ms, s, w};

fn level(weight: u64, threshold_mib: u64) -> LevelConfig {
    LevelConfig { weight: w(weight), threshold: ByteSize::mib(threshold_mib) }
}

/// Field, value and full message of a validation error.
fn error_of(config: &Config) -> (String, String, String) {
    match config.validate() {
        Err(e @ ConfigError::Invalid { .. }) => {
            let ConfigError::Invalid { field, value, .. } = &e else { unreachable!() };
            (field.clone(), value.clone(), e.to_string())
        }
        Err(other) => panic!("unexpected error {other:?}"),
        Ok(()) => panic!("config should be rejected: {config:?}"),
    }
}

fn assert_rejected(config: Config, field: &str, value: &str) {
    let (got_field, got_value, message) = error_of(&config);
    assert_eq!((got_field.as_str(), got_value.as_str()), (field, value), "{message}");
    assert!(message.contains(field) && message.contains(value), "message must name both: {message}");
}

// ----- defaults -----

#[test]
fn defaults_are_the_papers() {
    let c = Config::default();
    c.validate().unwrap();
    let table: Vec<(u32, u64)> = c.levels.iter().map(|l| (l.weight.get(), l.threshold.0 >> 20)).collect();
    assert_eq!(table, [(1000, 2), (200, 8), (40, 32), (10, 128)]);
    assert_eq!(c.count, CountMode::Both);
    assert_eq!(c.boost_after, s(10));
    assert_eq!(c.idle_promote_after, Some(s(2)));
    assert_eq!(c.boost_all_every, None);
    assert_eq!(c.bottom(), 3);
}

#[test]
fn one_level_is_enough() {
    let c = Config { levels: vec![level(500, 1)], ..Config::default() };
    c.validate().unwrap();
    assert_eq!(c.bottom(), 0);
}

// ----- validation -----

#[test]
fn no_levels_is_rejected() {
    assert_rejected(Config { levels: vec![], ..Config::default() }, "levels", "[]");
}

#[test]
fn too_many_levels_are_rejected() {
    let levels = (0..=MAX_LEVELS as u64).map(|i| level(1000 - i, i + 1)).collect();
    assert_rejected(Config { levels, ..Config::default() }, "levels", &(MAX_LEVELS + 1).to_string());
    let levels = (0..MAX_LEVELS as u64).map(|i| level(1000 - i, i + 1)).collect();
    Config { levels, ..Config::default() }.validate().unwrap();
}

#[test]
fn thresholds_must_increase() {
    let equal = vec![level(1000, 2), level(200, 8), level(40, 8)];
    assert_rejected(Config { levels: equal, ..Config::default() }, "levels[2].threshold", "8MiB");
    let decreasing = vec![level(1000, 2), level(200, 1)];
    let (_, _, message) = error_of(&Config { levels: decreasing.clone(), ..Config::default() });
    assert!(message.contains("levels[0].threshold = 2MiB"), "names the level it is compared with: {message}");
    assert_rejected(Config { levels: decreasing, ..Config::default() }, "levels[1].threshold", "1MiB");
}

#[test]
fn thresholds_must_be_non_zero() {
    let zero = vec![LevelConfig { weight: w(1000), threshold: ByteSize(0) }, level(200, 8)];
    assert_rejected(Config { levels: zero, ..Config::default() }, "levels[0].threshold", "0B");
    let single = vec![LevelConfig { weight: w(1000), threshold: ByteSize(0) }];
    assert_rejected(Config { levels: single, ..Config::default() }, "levels[0].threshold", "0B");
}

#[test]
fn weights_must_not_increase() {
    let rising = vec![level(1000, 2), level(200, 8), level(300, 32)];
    assert_rejected(Config { levels: rising, ..Config::default() }, "levels[2].weight", "300");
    // Equal weights are allowed (a level that only counts).
    let flat = vec![level(100, 2), level(100, 8)];
    Config { levels: flat, ..Config::default() }.validate().unwrap();
}

#[test]
fn durations_must_be_non_zero() {
    assert_rejected(Config { boost_after: Duration::ZERO, ..Config::default() }, "boost_after", "0ms");
    let idle = Config { idle_promote_after: Some(Duration::ZERO), ..Config::default() };
    assert_rejected(idle, "idle_promote_after", "0ms");
    let all = Config { boost_all_every: Some(Duration::ZERO), ..Config::default() };
    assert_rejected(all, "boost_all_every", "0ms");
}

#[test]
fn durations_must_be_at_most_a_year() {
    let long = MAX_DURATION + s(1);
    assert_rejected(Config { boost_after: long, ..Config::default() }, "boost_after", "31536001s");
    let all = Config { boost_all_every: Some(long), ..Config::default() };
    assert_rejected(all, "boost_all_every", "31536001s");
    Config { boost_after: MAX_DURATION, ..Config::default() }.validate().unwrap();
    Config { boost_after: Duration::from_nanos(1), ..Config::default() }.validate().unwrap();
}

// ----- TOML -----

fn parse(text: &str) -> Result<Config, String> {
    toml::from_str::<Config>(text).map_err(|e| e.to_string())
}

#[test]
fn documented_example_parses_to_the_defaults() {
    let text = r#"
        count = "both"
        boost_after = "10s"
        idle_promote_after = "2s"
        boost_all_every = "off"
        levels = [
          { weight = 1000, threshold = "2MiB" },
          { weight = 200,  threshold = "8MiB" },
          { weight = 40,   threshold = "32MiB" },
          { weight = 10,   threshold = "128MiB" },
        ]
    "#;
    assert_eq!(parse(text).unwrap(), Config::default());
}

#[test]
fn missing_fields_take_the_defaults() {
    assert_eq!(parse("").unwrap(), Config::default());
    let c = parse("boost_after = \"30s\"\nidle_promote_after = \"off\"").unwrap();
    assert_eq!(c, Config { boost_after: s(30), idle_promote_after: None, ..Config::default() });
}

#[test]
fn levels_as_array_of_tables() {
    let text = r#"
        count = "read"
        boost_all_every = "1m"
        [[levels]]
        weight = 800
        threshold = 1048576
        [[levels]]
        weight = 100
        threshold = "4 MB"
    "#;
    let c = parse(text).unwrap();
    assert_eq!(c.count, CountMode::Read);
    assert_eq!(c.boost_all_every, Some(s(60)));
    assert_eq!(c.levels, [level(800, 1), LevelConfig { weight: w(100), threshold: ByteSize(4_000_000) }]);
    c.validate().unwrap();
}

#[test]
fn unknown_fields_are_rejected() {
    let err = parse("boost_afterr = \"10s\"").unwrap_err();
    assert!(err.contains("boost_afterr"), "{err}");
    let err = parse("levels = [{ weight = 1000, threshold = \"2MiB\", limit = 5 }]").unwrap_err();
    assert!(err.contains("limit"), "{err}");
}

#[test]
fn a_level_needs_both_fields() {
    let err = parse("levels = [{ weight = 1000 }]").unwrap_err();
    assert!(err.contains("threshold"), "{err}");
    let err = parse("levels = [{ threshold = \"2MiB\" }]").unwrap_err();
    assert!(err.contains("weight"), "{err}");
}

#[test]
fn bad_values_are_named_in_the_error() {
    for (text, expect) in [
        ("levels = [{ weight = 0, threshold = \"2MiB\" }]", "weight 0 is outside 1..=1000"),
        ("levels = [{ weight = 1001, threshold = \"2MiB\" }]", "weight 1001 is outside 1..=1000"),
        ("levels = [{ weight = -5, threshold = \"2MiB\" }]", "weight -5 is outside 1..=1000"),
        ("levels = [{ weight = 10, threshold = -1 }]", "byte size -1 is negative"),
        ("levels = [{ weight = 10, threshold = \"2 parsecs\" }]", "\"2 parsecs\""),
        ("boost_after = \"10\"", "needs a unit"),
        ("boost_after = \"soon\"", "\"soon\""),
        ("idle_promote_after = \"never\"", "\"never\""),
        ("count = \"Both\"", "Both"),
        ("count = \"all\"", "all"),
    ] {
        let err = parse(text).unwrap_err();
        assert!(err.contains(expect), "{text}: {err}");
    }
}

#[test]
fn parsing_does_not_validate_but_validate_names_the_field() {
    let c = parse("boost_after = \"0s\"").unwrap();
    assert_rejected(c, "boost_after", "0ms");
    let c = parse("levels = [{ weight = 10, threshold = \"2MiB\" }, { weight = 20, threshold = \"4MiB\" }]").unwrap();
    assert_rejected(c, "levels[1].weight", "20");
}

#[test]
fn share_floor_is_validated_and_parsed() {
    let c = Config::default();
    assert_eq!((c.share_window, c.share_floor_percent), (Some(s(1)), 10));
    assert_rejected(Config { share_floor_percent: 0, ..Config::default() }, "share_floor_percent", "0");
    assert_rejected(Config { share_floor_percent: 101, ..Config::default() }, "share_floor_percent", "101");
    assert_rejected(Config { share_window: Some(Duration::ZERO), ..Config::default() }, "share_window", "0ms");
    let c = parse("share_window = \"off\"\nshare_floor_percent = 25").unwrap();
    assert_eq!((c.share_window, c.share_floor_percent), (None, 25));
    c.validate().unwrap();
    let c = parse("share_window = \"250ms\"").unwrap();
    assert_eq!(c.share_window, Some(ms(250)));
}

#[test]
fn config_round_trips_through_toml() {
    let configs = [
        Config::default(),
        Config {
            levels: vec![level(900, 3), LevelConfig { weight: w(1), threshold: ByteSize(3 * 1024 * 1024 + 1) }],
            count: CountMode::Write,
            boost_after: ms(1500),
            idle_promote_after: None,
            boost_all_every: Some(Duration::new(1, 1)),
            share_window: None,
            share_floor_percent: 35,
            bottom_cap_window: None,
            bottom_cap_percent: 80,
        },
    ];
    for config in configs {
        let text = toml::to_string(&config).unwrap();
        assert_eq!(parse(&text).unwrap(), config, "{text}");
    }
}
