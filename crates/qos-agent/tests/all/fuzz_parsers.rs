//! Property tests ("fuzzing") of everything the agent parses from outside: cgroup v1 blkio stat files, v2
//! `io.stat`, the TOML config and container labels. Arbitrary bytes and strings must never panic; well-formed
//! input generated from a model must parse to what the model says (sums saturate, never wrap); a config that
//! parses survives a round trip through its own serialization.
//!
//! Cases per property: `PROPTEST_CASES` (default 2,000; the long run is `PROPTEST_CASES=20000`). Failures are
//! kept in `proptest-regressions/` (commit them).

use std::collections::BTreeMap;
use std::path::Path;

use proptest::prelude::*;
use qos_agent::cgroup::{parse_blkio_stat, parse_io_stat, CgroupError};
use qos_agent::config::AgentConfig;
use qos_agent::labels::{policy_from_labels, EXCLUDE_LABEL, WEIGHT_LABEL};
use qos_core::{IoCounters, Policy, Weight};

fn config() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(2_000);
    ProptestConfig { cases, ..ProptestConfig::default() }
}

const V1: &str = "blkio.bfq.io_service_bytes_recursive";
const V2: &str = "io.stat";

/// A parse error must point into the input: its line number is 0 (whole file) or a line that exists.
fn check_error(err: &CgroupError, file: &str, input: &[u8]) {
    match err {
        CgroupError::Parse { file: f, line, .. } => {
            assert_eq!(f, Path::new(file));
            let lines = input.split(|b| *b == b'\n').count();
            assert!(*line <= lines, "line {line} of {lines}");
        }
        other => panic!("a parser returned a non-parse error: {other}"),
    }
}

/// Whitespace the kernel never writes but the parsers tolerate between fields.
fn gap() -> impl Strategy<Value = String> {
    prop_oneof![4 => Just(" ".to_string()), 1 => "[ \t]{1,3}"]
}

/// Byte counts biased towards the edges (0, near u64::MAX) where sums saturate.
fn bytes_value() -> impl Strategy<Value = u64> {
    prop_oneof![
        3 => 0..1u64 << 40,
        1 => Just(0u64),
        1 => (u64::MAX - 1000)..=u64::MAX,
        1 => any::<u64>(),
    ]
}

/// One line of a v1 rwstat file for device `maj:min`, and what it adds to (read, write).
fn v1_line() -> impl Strategy<Value = (String, Option<(bool, u64)>)> {
    let op = prop_oneof![
        Just("Read".to_string()),
        Just("Write".to_string()),
        Just("Sync".to_string()),
        Just("Async".to_string()),
        Just("Discard".to_string()),
        Just("Total".to_string()),
        "[A-Za-z]{1,8}",
    ];
    (0u32..4096, 0u32..1 << 20, op, bytes_value(), gap(), gap()).prop_map(|(maj, min, op, v, g1, g2)| {
        let counted = match op.as_str() {
            "Read" => Some((true, v)),
            "Write" => Some((false, v)),
            _ => None,
        };
        (format!("{maj}:{min}{g1}{op}{g2}{v}"), counted)
    })
}

/// A v1 file: device lines, maybe a final `Total`, maybe blank lines, maybe no final newline; with the expected
/// sums.
fn v1_file() -> impl Strategy<Value = (Vec<u8>, IoCounters)> {
    (prop::collection::vec(v1_line(), 0..24), any::<Option<u64>>(), any::<bool>(), any::<bool>()).prop_map(
        |(lines, total, blank, newline)| {
            let mut want = IoCounters::default();
            let mut text = String::new();
            for (line, counted) in &lines {
                text.push_str(line);
                text.push('\n');
                if blank {
                    text.push('\n');
                }
                match counted {
                    Some((true, v)) => want.read = want.read.saturating_add(*v),
                    Some((false, v)) => want.write = want.write.saturating_add(*v),
                    None => {}
                }
            }
            if let Some(t) = total {
                text.push_str(&format!("Total {t}\n"));
            }
            if !newline {
                text.pop();
            }
            (text.into_bytes(), want)
        },
    )
}

/// A v2 `io.stat` file with the keys the kernel writes plus keys of other controllers.
fn v2_file() -> impl Strategy<Value = (Vec<u8>, IoCounters)> {
    let other_key = prop_oneof![
        Just("rios".to_string()),
        Just("wios".to_string()),
        Just("dbytes".to_string()),
        Just("dios".to_string()),
        Just("cost.vrate".to_string()),
        Just("depth".to_string()),
        "[a-z][a-z_.]{0,10}",
    ];
    let other_value = prop_oneof![Just("max".to_string()), "[0-9]{1,5}\\.[0-9]{2}", "[!-~&&[^=]]{0,6}"];
    let extra = prop::collection::vec((other_key, other_value), 0..4);
    let line = (0u32..4096, 0u32..1 << 20, bytes_value(), bytes_value(), extra, any::<bool>());
    prop::collection::vec(line, 0..16).prop_map(|lines| {
        let mut want = IoCounters::default();
        let mut text = String::new();
        for (maj, min, r, w, extra, swap) in lines {
            let mut fields = vec![format!("rbytes={r}"), format!("wbytes={w}")];
            fields.extend(
                extra.into_iter().filter(|(k, _)| k != "rbytes" && k != "wbytes").map(|(k, v)| format!("{k}={v}")),
            );
            if swap {
                fields.reverse();
            }
            text.push_str(&format!("{maj}:{min} {}\n", fields.join(" ")));
            want.read = want.read.saturating_add(r);
            want.write = want.write.saturating_add(w);
        }
        (text.into_bytes(), want)
    })
}

/// Flips, inserts or deletes a few bytes.
fn mutate(mut bytes: Vec<u8>, edits: &[(usize, u8, u8)]) -> Vec<u8> {
    for &(pos, kind, byte) in edits {
        if bytes.is_empty() {
            bytes.push(byte);
            continue;
        }
        let i = pos % bytes.len();
        match kind % 3 {
            0 => bytes[i] = byte,
            1 => bytes.insert(i, byte),
            _ => {
                bytes.remove(i);
            }
        }
    }
    bytes
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn v1_arbitrary_bytes_never_panic(input in prop::collection::vec(any::<u8>(), 0..512)) {
        if let Err(e) = parse_blkio_stat(Path::new(V1), &input) {
            check_error(&e, V1, &input);
        }
    }

    #[test]
    fn v1_text_like_input_never_panics(input in "[0-9: A-Za-z\t\n-]{0,300}") {
        if let Err(e) = parse_blkio_stat(Path::new(V1), input.as_bytes()) {
            check_error(&e, V1, input.as_bytes());
        }
    }

    #[test]
    fn v1_well_formed_files_sum_read_and_write((input, want) in v1_file()) {
        prop_assert_eq!(parse_blkio_stat(Path::new(V1), &input).unwrap(), want);
    }

    #[test]
    fn v1_mutated_files_never_panic(
        (input, _) in v1_file(),
        edits in prop::collection::vec((any::<usize>(), any::<u8>(), any::<u8>()), 1..6),
    ) {
        let input = mutate(input, &edits);
        if let Err(e) = parse_blkio_stat(Path::new(V1), &input) {
            check_error(&e, V1, &input);
        }
    }

    #[test]
    fn v2_arbitrary_bytes_never_panic(input in prop::collection::vec(any::<u8>(), 0..512)) {
        if let Err(e) = parse_io_stat(Path::new(V2), &input) {
            check_error(&e, V2, &input);
        }
    }

    #[test]
    fn v2_text_like_input_never_panics(input in "[0-9: a-z=.\t\n-]{0,300}") {
        if let Err(e) = parse_io_stat(Path::new(V2), input.as_bytes()) {
            check_error(&e, V2, input.as_bytes());
        }
    }

    #[test]
    fn v2_well_formed_files_sum_rbytes_and_wbytes((input, want) in v2_file()) {
        prop_assert_eq!(parse_io_stat(Path::new(V2), &input).unwrap(), want);
    }

    #[test]
    fn v2_mutated_files_never_panic(
        (input, _) in v2_file(),
        edits in prop::collection::vec((any::<usize>(), any::<u8>(), any::<u8>()), 1..6),
    ) {
        let input = mutate(input, &edits);
        if let Err(e) = parse_io_stat(Path::new(V2), &input) {
            check_error(&e, V2, &input);
        }
    }
}

/// A config file assembled from the agent's real keys, each with a value that may be right, wrong or of the
/// wrong type, in a random section; plus junk keys.
fn config_text() -> impl Strategy<Value = String> {
    let value = prop_oneof![
        Just("\"500ms\"".to_string()),
        Just("\"off\"".to_string()),
        Just("\"2MiB\"".to_string()),
        Just("\"cgroup-dir\"".to_string()),
        Just("\"docker\"".to_string()),
        Just("\"auto\"".to_string()),
        Just("\"127.0.0.1:9477\"".to_string()),
        Just("\"/run/x.sock\"".to_string()),
        Just("[]".to_string()),
        Just("[\"sda\"]".to_string()),
        Just("[{ weight = 1000, threshold = \"2MiB\" }, { weight = 10, threshold = \"8MiB\" }]".to_string()),
        (0i64..2000).prop_map(|v| v.to_string()),
        any::<i64>().prop_map(|v| v.to_string()),
        any::<bool>().prop_map(|v| v.to_string()),
        "\"[ -~&&[^\"\\\\]]{0,12}\"",
        "[0-9]{1,4}(ms|s|m|h)?".prop_map(|v| format!("\"{v}\"")),
    ];
    let key = prop_oneof![
        Just("runtime"),
        Just("sample_interval"),
        Just("actuator"),
        Just("dry_run"),
        Just("state_file"),
        Just("control_socket"),
        Just("socket"),
        Just("root"),
        Just("parent"),
        Just("check"),
        Just("switch_to_bfq"),
        Just("enabled"),
        Just("listen"),
        Just("levels"),
        Just("count"),
        Just("boost_after"),
        Just("idle_promote_after"),
        Just("boost_all_every"),
        Just("share_window"),
        Just("share_floor_percent"),
        Just("bottom_cap_window"),
        Just("bottom_cap_percent"),
        Just("bogus"),
    ];
    let section = prop_oneof![
        Just(""),
        Just("[docker]"),
        Just("[cgroup]"),
        Just("[devices]"),
        Just("[metrics]"),
        Just("[mlfq]"),
        Just("[nope]"),
    ];
    prop::collection::vec((section, prop::collection::vec((key, value), 0..4)), 0..5).prop_map(|sections| {
        let mut text = String::new();
        let mut seen = std::collections::HashSet::new();
        for (section, pairs) in sections {
            if !section.is_empty() && !seen.insert(section) {
                continue; // a repeated table is a TOML error the parser already reports; keep most inputs valid TOML
            }
            text.push_str(section);
            text.push('\n');
            let mut keys = std::collections::HashSet::new();
            for (k, v) in pairs {
                if keys.insert(k) {
                    text.push_str(&format!("{k} = {v}\n"));
                }
            }
        }
        text
    })
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn config_arbitrary_text_never_panics(text in "\\PC{0,200}") {
        let _ = AgentConfig::from_toml(&text, Path::new("fuzz.toml"));
    }

    /// Whatever the input, the outcome is a valid config or an error naming the file; a config that parses
    /// is valid and survives a round trip through its own TOML serialization.
    #[test]
    fn config_from_real_keys_is_valid_or_named_error(text in config_text()) {
        match AgentConfig::from_toml(&text, Path::new("fuzz.toml")) {
            Ok(cfg) => {
                prop_assert!(cfg.validate().is_ok());
                let again = toml::to_string(&cfg).expect("a parsed config serializes");
                let back = AgentConfig::from_toml(&again, Path::new("again.toml"));
                prop_assert_eq!(back.as_ref().ok(), Some(&cfg), "round trip of\n{}\nvia\n{}\n{:?}", text, again, back);
            }
            Err(e) => prop_assert!(e.to_string().contains("fuzz.toml"), "{}", e),
        }
    }
}

/// Any valid config: every field drawn from its whole valid range (durations to the nanosecond, IPv4 and IPv6
/// listen addresses, paths with characters TOML must escape, up to 16 levels).
fn valid_config() -> impl Strategy<Value = AgentConfig> {
    use qos_agent::config::{ActuatorMode, RuntimeKind};
    use std::time::Duration;
    let duration = |min_ns: u64, max_ns: u64| {
        prop_oneof![
            (min_ns..=max_ns).prop_map(Duration::from_nanos),
            (min_ns / 1_000_000..=max_ns / 1_000_000).prop_map(|ms| Duration::from_millis(ms.max(1))),
            (1..=max_ns / 1_000_000_000).prop_map(Duration::from_secs),
        ]
        .prop_filter("in range", move |d| (min_ns..=max_ns).contains(&(d.as_nanos() as u64)))
    };
    let year = qos_core::config::MAX_DURATION.as_nanos() as u64;
    let levels = prop::collection::vec((1u64..=1000, 1u64..1 << 40), 1..=qos_core::MAX_LEVELS).prop_map(|raw| {
        // Thresholds strictly increasing, weights non-increasing, as validation demands.
        let mut weights: Vec<u64> = raw.iter().map(|(w, _)| *w).collect();
        weights.sort_unstable_by(|a, b| b.cmp(a));
        let mut threshold = 0u64;
        raw.iter()
            .zip(weights)
            .map(|((_, step), w)| {
                threshold += step;
                qos_core::LevelConfig { weight: Weight::new(w).unwrap(), threshold: qos_core::ByteSize(threshold) }
            })
            .collect::<Vec<_>>()
    });
    let mlfq = (
        levels,
        prop_oneof![Just(qos_core::CountMode::Read), Just(qos_core::CountMode::Write), Just(qos_core::CountMode::Both)],
        duration(1, year),
        prop::option::of(duration(1, year)),
        prop::option::of(duration(1, year)),
        (prop::option::of(duration(1, year)), 1u8..=100),
        (prop::option::of(duration(1, year)), 50u8..=99),
    )
        .prop_map(
            |(
                levels,
                count,
                boost_after,
                idle_promote_after,
                boost_all_every,
                (share_window, share_floor_percent),
                (bottom_cap_window, bottom_cap_percent),
            )| {
                qos_core::Config {
                    levels,
                    count,
                    boost_after,
                    idle_promote_after,
                    boost_all_every,
                    share_window,
                    share_floor_percent,
                    bottom_cap_window,
                    bottom_cap_percent,
                }
            },
        );
    let path = "/[a-zA-Z0-9 _.\\\"'ä-]{1,20}".prop_map(std::path::PathBuf::from);
    let listen = prop_oneof![
        (any::<[u8; 4]>(), any::<u16>()).prop_map(|(ip, port)| std::net::SocketAddr::from((ip, port))),
        (any::<[u16; 8]>(), any::<u16>()).prop_map(|(ip, port)| std::net::SocketAddr::from((ip, port))),
    ];
    let device = "[a-z][a-z0-9]{0,7}";
    (
        (any::<bool>(), duration(10_000_000, 3_600_000_000_000), 0u8..3, any::<bool>()),
        (path.clone(), path.clone(), path),
        ("[a-z/]{0,12}", "[a-z][a-z0-9/]{0,12}"),
        (prop::collection::vec(device, 0..3), prop::collection::vec(device, 0..3)),
        (any::<bool>(), listen, prop::option::of(1u32..=1_000_000)),
        mlfq,
        (
            prop::collection::vec(prop_oneof!["[a-z][a-z0-9-]{0,10}[a-z0-9]", Just("*".to_string())], 0..3),
            1u32..=1000,
            prop::collection::btree_map("[a-z][a-z0-9]{0,8}", 1u32..=1000, 0..3),
            prop::collection::vec("[a-z][a-z0-9-]{0,10}[a-z0-9]", 0..3),
            any::<bool>(),
            prop::collection::btree_map("[a-z./]{1,12}", "[a-z0-9]{0,8}", 0..2),
            (any::<bool>(), "(/[a-z_]{1,6}){0,2}"),
        ),
    )
        .prop_map(
            |(
                (docker, sample_interval, actuator, dry_run),
                (state, control, socket),
                (root, parent),
                devs,
                m,
                mlfq,
                (trusted, ceiling, classes, exclude_ns, statics, exclude_labels, (docker_policy, kubelet_root)),
            )| {
                use qos_agent::config::{
                    CgroupConfig, CriConfig, DevicesConfig, DockerConfig, MetricsConfig, ProtectMode,
                };
                use qos_agent::policy::{ClassConfig, DockerLabels, PolicyConfig};
                // Labels exclude only in trusted namespaces, so a config naming labels names those too.
                let exclude_labels = if trusted.is_empty() { Default::default() } else { exclude_labels };
                let policy = PolicyConfig {
                    trusted_namespaces: trusted,
                    max_pinned_weight: ceiling,
                    classes: classes.into_iter().map(|(k, weight)| (k, ClassConfig { weight })).collect(),
                    exclude_namespaces: exclude_ns,
                    exclude_static_pods: statics,
                    exclude_pod_labels: exclude_labels,
                    docker_labels: if docker_policy { DockerLabels::Policy } else { DockerLabels::Trusted },
                };
                let kubelet_root = if kubelet_root.is_empty() { "/".to_string() } else { kubelet_root };
                AgentConfig {
                    runtime: if docker { RuntimeKind::Docker } else { RuntimeKind::CgroupDir },
                    sample_interval,
                    // Drawn from other generated values: on or off, and a duration in range.
                    entry_sample_interval: m.0.then_some(sample_interval),
                    entry_sample_for: Duration::from_millis(10 + (sample_interval.as_millis() as u64 % 59_990)),
                    cpu_budget: m.2.map(qos_agent::daemon::pacing::CpuBudget::from_ppm),
                    actuator: match (actuator, docker) {
                        (0, true) => ActuatorMode::Docker,
                        (1, _) => ActuatorMode::Files,
                        _ => ActuatorMode::Auto,
                    },
                    dry_run,
                    state_file: state,
                    control_socket: control,
                    // Every nice value Linux knows, drawn from another generated value.
                    nice: (sample_interval.as_millis() % 40) as i8 - 20,
                    docker: DockerConfig { socket },
                    cri: CriConfig { cgroup_root: kubelet_root, ..Default::default() },
                    cgroup: CgroupConfig { root, parent },
                    policy,
                    // `protect` and `opt_out` drawn from other generated values.
                    devices: DevicesConfig {
                        protect: if dry_run { ProtectMode::Off } else { ProtectMode::Auto },
                        opt_out: devs.1.iter().rev().cloned().collect(),
                        check: devs.0,
                        switch_to_bfq: devs.1,
                        bfq_tunables: Default::default(),
                    },
                    metrics: MetricsConfig { enabled: m.0, listen: m.1 },
                    mlfq,
                }
            },
        )
}

proptest! {
    #![proptest_config(config())]

    /// Every valid config written out as TOML reads back as the same config (what `check-config` accepts is
    /// what the agent runs with, and a config file generated by a tool means what the tool meant).
    #[test]
    fn valid_configs_round_trip_through_toml(cfg in valid_config()) {
        prop_assert!(cfg.validate().is_ok(), "generator made an invalid config: {:?}", cfg.validate());
        let text = toml::to_string(&cfg).expect("serializes");
        let back = AgentConfig::from_toml(&text, Path::new("generated.toml"));
        prop_assert_eq!(back.as_ref().ok(), Some(&cfg), "{}\n{:?}", text, back);
    }
}

proptest! {
    #![proptest_config(config())]

    /// The CPU budget's parser: any text is accepted or refused without a panic, and every budget prints as text
    /// that parses back to it.
    #[test]
    fn cpu_budget_text_never_panics_and_round_trips(text in "\\PC{0,12}", ppm in 1u32..=1_000_000) {
        let _ = qos_agent::daemon::pacing::CpuBudget::parse(&text);
        let _ = qos_agent::daemon::pacing::CpuBudget::parse(&format!("{text}%"));
        let b = qos_agent::daemon::pacing::CpuBudget::from_ppm(ppm);
        prop_assert_eq!(qos_agent::daemon::pacing::CpuBudget::parse(&b.to_string()), Ok(b));
    }
}

/// A label value: mostly near the interesting ones, sometimes anything.
fn label_value() -> impl Strategy<Value = String> {
    prop_oneof![
        (0u64..1200).prop_map(|v| v.to_string()),
        Just("true".to_string()),
        Just("TRUE ".to_string()),
        Just(" yes".to_string()),
        Just("0".to_string()),
        Just("no".to_string()),
        Just("".to_string()),
        "[ +-]?[0-9]{1,25}",
        "\\PC{0,12}",
    ]
}

/// The labels' meaning, written independently of `labels.rs`.
fn model(labels: &BTreeMap<String, String>) -> (Policy, usize) {
    let mut errors = 0;
    let mut policy = Policy::Managed;
    if let Some(v) = labels.get(WEIGHT_LABEL) {
        match v.trim().parse::<u64>().ok().filter(|n| (1..=1000).contains(n)) {
            Some(n) => policy = Policy::Pinned(Weight::new(n).unwrap()),
            None => errors += 1,
        }
    }
    if let Some(v) = labels.get(EXCLUDE_LABEL) {
        match v.trim().to_ascii_lowercase().as_str() {
            "true" | "1" | "yes" => policy = Policy::Excluded,
            "false" | "0" | "no" => {}
            _ => errors += 1,
        }
    }
    (policy, errors)
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn labels_match_the_model(
        weight in prop::option::of(label_value()),
        exclude in prop::option::of(label_value()),
        others in prop::collection::btree_map("\\PC{0,16}", "\\PC{0,16}", 0..6),
    ) {
        let mut labels = others;
        labels.remove(WEIGHT_LABEL);
        labels.remove(EXCLUDE_LABEL);
        if let Some(w) = weight {
            labels.insert(WEIGHT_LABEL.into(), w);
        }
        if let Some(x) = exclude {
            labels.insert(EXCLUDE_LABEL.into(), x);
        }
        let (policy, errors) = policy_from_labels(&labels);
        let (want, want_errors) = model(&labels);
        prop_assert_eq!(policy, want);
        prop_assert_eq!(errors.len(), want_errors);
        for e in &errors {
            // Every message names the label and shows the value.
            let text = e.to_string();
            prop_assert!(text.contains(e.label), "{}", text);
            prop_assert!(text.contains(&format!("{:?}", e.value)), "{}", text);
        }
    }
}

proptest! {
    #![proptest_config(config())]

    /// `[policy]` on arbitrary pods: never a panic; the labels it hands the daemon always parse without an error
    /// (nothing a tenant wrote reaches the daemon unchecked); a pin is never above the ceiling unless an operator's
    /// class says so; a pod of an untrusted namespace is excluded only as a system pod and pinned only by a class;
    /// everything not honoured is named in a note.
    #[test]
    fn the_pod_policy_holds_whatever_a_pod_says(
        namespace in prop_oneof![Just("trusted".to_string()), Just("kube-system".to_string()), "\\PC{0,12}"],
        weight in prop::option::of(label_value()),
        exclude in prop::option::of(label_value()),
        class in prop::option::of(prop_oneof![Just("batch".to_string()), "\\PC{0,8}"]),
        source in prop::option::of(prop_oneof![Just("api".to_string()), Just("file".to_string()), "\\PC{0,6}"]),
        ceiling in 1u32..=1000,
    ) {
        use qos_agent::policy::{ClassConfig, PodFacts, PolicyConfig, CLASS_ANNOTATION, CONFIG_SOURCE_ANNOTATION};
        use qos_agent::labels::{EXCLUDE_ANNOTATION, WEIGHT_ANNOTATION};
        let cfg = PolicyConfig {
            trusted_namespaces: vec!["trusted".into()],
            max_pinned_weight: ceiling,
            classes: BTreeMap::from([("batch".to_string(), ClassConfig { weight: 40 })]),
            ..Default::default()
        };
        let mut annotations = std::collections::HashMap::new();
        for (k, v) in [(WEIGHT_ANNOTATION, &weight), (EXCLUDE_ANNOTATION, &exclude), (CLASS_ANNOTATION, &class), (CONFIG_SOURCE_ANNOTATION, &source)] {
            if let Some(v) = v {
                annotations.insert(k.to_string(), v.clone());
            }
        }
        let labels = std::collections::HashMap::new();
        let d = cfg.decide_pod(&PodFacts { namespace: &namespace, annotations: &annotations, labels: &labels });
        let (policy, errors) = policy_from_labels(&d.labels);
        prop_assert!(errors.is_empty(), "{:?}", errors);
        let system = namespace == "kube-system" || source.as_deref().is_some_and(|s| s != "api");
        prop_assert_eq!(d.system.is_some(), system);
        let class_ok = class.as_deref().is_some_and(|c| c.trim() == "batch");
        match policy {
            Policy::Excluded => prop_assert!(system || (namespace == "trusted" && exclude.is_some())),
            Policy::Pinned(w) => {
                prop_assert!(!system);
                prop_assert!(w.get() <= ceiling || (class_ok && w.get() == 40), "{w:?}");
                if namespace != "trusted" {
                    prop_assert!(class_ok && w.get() == 40);
                }
            }
            Policy::Managed => prop_assert!(!system),
        }
        if !system && namespace != "trusted" {
            let asked = usize::from(weight.is_some()) + usize::from(exclude.is_some());
            let refused = d.notes.iter().filter(|n| n.rule.contains("not in policy.trusted_namespaces")).count();
            prop_assert_eq!(refused, asked, "{:?}", d.notes);
        }
    }
}
