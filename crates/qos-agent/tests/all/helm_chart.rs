//! `deploy/helm/ddiskqos-agent/`: the Helm chart, rendered by a real `helm` (`helm template`), against the kustomize
//! base and its overlays: with the default values it renders the base's objects (`deploy/kubernetes/*.yaml` but the
//! Namespace, which a chart installed with `--namespace` does not own), and with each `ci/<overlay>-values.yaml` the
//! objects of `kustomize build deploy/kubernetes-overlays/<overlay>` (parsed YAML, compared after removing Helm's
//! standard labels, the generated ConfigMap's hash suffix and the config-hash annotation; the two `agent.toml`s
//! compared as parsed TOML). `helm lint --strict` and `kubernetes-validate --strict` (Kubernetes 1.28 and 1.37) for
//! the default and every values file; the schema refuses unknown keys; `config` covers every setting of
//! `deploy/agent.toml`. A missing `helm` fails under CI (`DDISKQOS_REQUIRE_REAL=1`) and is a printed skip elsewhere.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use qos_agent::config::AgentConfig;
use serde::Deserialize;
use serde_json::Value;
use testbed::Need;

use crate::k8s_manifests::{kustomize, sha256_of};

fn chart() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/helm/ddiskqos-agent")
}

fn deploy() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy")
}

/// The release's name and namespace for every render: the base's object names and namespace.
const RELEASE: &str = "ddiskqos-agent";
const NAMESPACE: &str = "ddiskqos";

/// Kinds whose schemas are not in Kubernetes' own (CRDs): `kubernetes-validate` knows only the core API, so these
/// are taken out of what it validates, by name, and checked here instead (`podmonitor_scrapes_the_agents_port`).
const NOT_IN_THE_CORE_SCHEMAS: &[(&str, &str)] = &[("monitoring.coreos.com/v1", "PodMonitor")];

/// The documented values files: `ci/*-values.yaml`, sorted.
fn values_files() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(chart().join("ci"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().ends_with("-values.yaml"))
        .collect();
    files.sort();
    files
}

/// `helm` with its own config, cache and data directories (nothing of the user's read or written).
fn helm(home: &Path) -> Command {
    let mut c = Command::new("helm");
    for (var, dir) in [("HELM_CONFIG_HOME", "config"), ("HELM_CACHE_HOME", "cache"), ("HELM_DATA_HOME", "data")] {
        c.env(var, home.join(dir));
    }
    c
}

/// `helm template` of the chart with these values files and `--set`s: the output, or helm's error.
fn render(home: &Path, values: &[&Path], set: &[&str]) -> Result<String, String> {
    let mut c = helm(home);
    c.args(["template", RELEASE]).arg(chart()).args(["--namespace", NAMESPACE]);
    for v in values {
        c.arg("--values").arg(v);
    }
    for s in set {
        c.args(["--set", s]);
    }
    let out = c.output().expect("running helm");
    if out.status.success() {
        Ok(String::from_utf8(out.stdout).unwrap())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// Every object of a multi-document YAML stream (empty documents left out), as JSON.
fn objects(text: &str, what: &str) -> Vec<Value> {
    serde_yaml::Deserializer::from_str(text)
        .map(|d| serde_yaml::Value::deserialize(d).unwrap_or_else(|e| panic!("{what}: {e}")))
        .filter(|v| !v.is_null())
        .map(|v| serde_yaml::from_value::<Value>(v).unwrap_or_else(|e| panic!("{what}: {e}")))
        .collect()
}

/// Labels Helm charts add by convention and the kustomize manifests do not carry.
const HELM_LABELS: &[&str] =
    &["helm.sh/chart", "app.kubernetes.io/instance", "app.kubernetes.io/managed-by", "app.kubernetes.io/version"];

/// What two renderings of the same objects may differ in, taken out: Helm's standard labels (in every `labels` and
/// `matchLabels`), the generated ConfigMap's hash suffix (kustomize), the config-hash annotation (each hashes its
/// own text), and `agent.toml`'s text (replaced by its parsed TOML: comments and key order do not count).
fn normalise(mut v: Value, what: &str) -> Value {
    fn walk(v: &mut Value) {
        match v {
            Value::Object(map) => {
                for (k, child) in map.iter_mut() {
                    if k == "labels" || k == "matchLabels" {
                        if let Value::Object(labels) = child {
                            labels.retain(|l, _| !HELM_LABELS.contains(&l.as_str()));
                        }
                    }
                    walk(child);
                }
            }
            Value::Array(items) => items.iter_mut().for_each(walk),
            _ => {}
        }
    }
    walk(&mut v);
    let kind = v["kind"].as_str().unwrap_or_default().to_string();
    let hashed = |name: &str| name.strip_prefix("ddiskqos-agent-").is_some_and(|h| h.len() == 10);
    if kind == "ConfigMap" {
        if v["metadata"]["name"].as_str().is_some_and(hashed) {
            v["metadata"]["name"] = "ddiskqos-agent".into();
        }
        let text = v["data"]["agent.toml"].as_str().unwrap_or_else(|| panic!("{what}: ConfigMap without agent.toml"));
        let parsed: toml::Value = toml::from_str(text).unwrap_or_else(|e| panic!("{what}: agent.toml: {e}\n{text}"));
        v["data"]["agent.toml"] = serde_json::to_value(parsed).unwrap();
    }
    if kind == "DaemonSet" {
        if let Some(ann) = v["spec"]["template"]["metadata"]["annotations"].as_object_mut() {
            ann.remove("ddiskqos.io/config-sha256");
        }
        for vol in v["spec"]["template"]["spec"]["volumes"].as_array_mut().into_iter().flatten() {
            if vol["configMap"]["name"].as_str().is_some_and(hashed) {
                vol["configMap"]["name"] = "ddiskqos-agent".into();
            }
        }
    }
    v
}

/// The objects by `Kind/name`, normalised.
fn by_kind(objects: Vec<Value>, what: &str) -> BTreeMap<String, Value> {
    let mut map = BTreeMap::new();
    for o in objects {
        let o = normalise(o, what);
        let key = format!("{}/{}", o["kind"].as_str().unwrap_or("?"), o["metadata"]["name"].as_str().unwrap_or("?"));
        assert!(map.insert(key.clone(), o).is_none(), "{what}: {key} twice");
    }
    map
}

/// Where two JSON values differ, one line per path (at most 20).
fn differences(a: &Value, b: &Value) -> Vec<String> {
    fn go(a: &Value, b: &Value, path: &str, out: &mut Vec<String>) {
        match (a, b) {
            (Value::Object(x), Value::Object(y)) => {
                let keys: std::collections::BTreeSet<&String> = x.keys().chain(y.keys()).collect();
                for k in keys {
                    let p = format!("{path}.{k}");
                    match (x.get(k), y.get(k)) {
                        (Some(x), Some(y)) => go(x, y, &p, out),
                        (x, y) => out.push(format!("{p}: {x:?} vs {y:?}")),
                    }
                }
            }
            (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
                for (i, (x, y)) in x.iter().zip(y).enumerate() {
                    go(x, y, &format!("{path}[{i}]"), out);
                }
            }
            _ if a != b => out.push(format!("{path}: {a} vs {b}")),
            _ => {}
        }
    }
    let mut out = Vec::new();
    go(a, b, "", &mut out);
    out.truncate(20);
    out
}

/// Asserts that two sets of objects are the same, naming each difference.
fn assert_same(chart: &BTreeMap<String, Value>, want: &BTreeMap<String, Value>, what: &str) {
    assert_eq!(chart.keys().collect::<Vec<_>>(), want.keys().collect::<Vec<_>>(), "{what}: other objects");
    for (key, w) in want {
        let diff = differences(&chart[key], w);
        assert!(diff.is_empty(), "{what}: {key} differs (chart vs kustomize):\n{}", diff.join("\n"));
    }
}

/// The chart's DaemonSet carries the hash of its own ConfigMap's `agent.toml`, so a config change rolls the pods.
fn assert_config_hash(rendered: &[Value], what: &str) {
    let cm = rendered.iter().find(|o| o["kind"] == "ConfigMap").unwrap_or_else(|| panic!("{what}: no ConfigMap"));
    let ds = rendered.iter().find(|o| o["kind"] == "DaemonSet").unwrap_or_else(|| panic!("{what}: no DaemonSet"));
    let text = cm["data"]["agent.toml"].as_str().unwrap();
    let ann = &ds["spec"]["template"]["metadata"]["annotations"]["ddiskqos.io/config-sha256"];
    assert_eq!(ann.as_str(), Some(sha256_of(text.as_bytes()).as_str()), "{what}: config-sha256 is not agent.toml's");
}

fn needs_helm(test: &str, more: &[Need]) -> bool {
    let mut needs = vec![Need::Program("helm")];
    needs.extend_from_slice(more);
    testbed::require(test, &needs)
}

#[test]
fn chart_renders_the_kustomize_base_and_every_overlay() {
    let (program, sub) = kustomize();
    if !needs_helm("helm_chart::chart_renders_the_kustomize_base_and_every_overlay", &[Need::Program(program)]) {
        return;
    }
    let home = tempfile::tempdir().unwrap();
    // The base as `kubectl apply -f` reads it; its Namespace is the release's namespace.
    let mut base = Vec::new();
    let mut files: Vec<PathBuf> = std::fs::read_dir(deploy().join("kubernetes"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    for f in &files {
        base.extend(objects(&std::fs::read_to_string(f).unwrap(), &f.display().to_string()));
    }
    let ns = base.iter().position(|o| o["kind"] == "Namespace").expect("the base's Namespace");
    let ns = base.remove(ns);
    assert_eq!(ns["metadata"]["name"], NAMESPACE, "the tests render into the base's namespace");
    let text = render(home.path(), &[], &[]).unwrap_or_else(|e| panic!("helm template (default values): {e}"));
    let rendered = objects(&text, "helm template (default values)");
    assert_config_hash(&rendered, "default values");
    assert!(!rendered.iter().any(|o| o["kind"] == "Namespace"), "the chart must not own its release's namespace");
    assert_same(&by_kind(rendered, "chart"), &by_kind(base, "deploy/kubernetes"), "default values");

    // Each overlay: kustomize's rendering against the chart with the overlay's values file.
    let overlays = deploy().join("kubernetes-overlays");
    let mut names: Vec<String> =
        std::fs::read_dir(&overlays).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    names.sort();
    assert!(names.len() >= 4, "{names:?}");
    for name in &names {
        let values = chart().join("ci").join(format!("{name}-values.yaml"));
        assert!(values.is_file(), "overlay {name} has no values file {}", values.display());
        let out = Command::new(program).args(&sub).arg(overlays.join(name)).output().unwrap();
        assert!(out.status.success(), "{program} {sub:?} {name}: {}", String::from_utf8_lossy(&out.stderr));
        let mut want = objects(&String::from_utf8(out.stdout).unwrap(), name);
        want.retain(|o| o["kind"] != "Namespace");
        let text = render(home.path(), &[&values], &[]).unwrap_or_else(|e| panic!("helm template -f {name}: {e}"));
        let rendered = objects(&text, name);
        assert_config_hash(&rendered, name);
        assert_same(&by_kind(rendered, name), &by_kind(want, name), &format!("overlay {name}"));
    }
}

#[test]
fn chart_lints_and_every_values_file_passes_the_kubernetes_schema() {
    let test = "helm_chart::chart_lints_and_every_values_file_passes_the_kubernetes_schema";
    if !needs_helm(test, &[Need::Program("kubernetes-validate")]) {
        return;
    }
    let home = tempfile::tempdir().unwrap();
    let mut sets: Vec<(String, Option<PathBuf>)> = vec![("default".into(), None)];
    sets.extend(values_files().into_iter().map(|p| (p.file_name().unwrap().to_string_lossy().into_owned(), Some(p))));
    assert!(sets.len() >= 6, "the overlays' values files and the PodMonitor's: {sets:?}");
    let mut files = Vec::new();
    let mut core_objects = 0;
    let mut skipped = BTreeMap::<String, usize>::new();
    for (name, values) in &sets {
        let mut lint = helm(home.path());
        lint.args(["lint", "--strict", "--namespace", NAMESPACE]).arg(chart());
        if let Some(v) = values {
            lint.arg("--values").arg(v);
        }
        let out = lint.output().unwrap();
        let report = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success() && report.contains("0 chart(s) failed"), "helm lint --strict ({name}):\n{report}");
        let values: Vec<&Path> = values.iter().map(PathBuf::as_path).collect();
        let text = render(home.path(), &values, &[]).unwrap_or_else(|e| panic!("helm template ({name}): {e}"));
        let mut core = String::new();
        for o in objects(&text, name) {
            let kind = (o["apiVersion"].as_str().unwrap_or(""), o["kind"].as_str().unwrap_or(""));
            if NOT_IN_THE_CORE_SCHEMAS.contains(&kind) {
                podmonitor_scrapes_the_agents_port(&o, &objects(&text, name), name);
                *skipped.entry(kind.1.to_string()).or_default() += 1;
                continue;
            }
            core_objects += 1;
            core.push_str("---\n");
            core.push_str(&serde_yaml::to_string(&o).unwrap());
        }
        let file = home.path().join(format!("rendered-{name}"));
        std::fs::write(&file, core).unwrap();
        files.push(file);
    }
    // The PodMonitor was rendered (by its values file) and checked here, since kubernetes-validate cannot.
    assert_eq!(skipped.get("PodMonitor"), Some(&1), "{skipped:?}");
    for version in crate::k8s_manifests::KUBERNETES_VERSIONS {
        let report = crate::k8s_manifests::kubernetes_validate(version, &files);
        // A kind without a schema is only a warning there: none may be left.
        assert!(!report.contains("WARN"), "kubernetes-validate {version}: an object was not validated:\n{report}");
        let passed = report.lines().filter(|l| l.contains(" passed for resource ")).count();
        assert_eq!(passed, core_objects, "kubernetes-validate {version}: not every object validated:\n{report}");
    }
}

/// The PodMonitor (a CRD, not in kubernetes-validate's schemas): it selects the DaemonSet's pods, in the release's
/// namespace, on the container's named metrics port at /metrics.
fn podmonitor_scrapes_the_agents_port(pm: &Value, all: &[Value], what: &str) {
    let ds = all.iter().find(|o| o["kind"] == "DaemonSet").unwrap();
    let pod_labels = ds["spec"]["template"]["metadata"]["labels"].as_object().unwrap();
    let selector = pm["spec"]["selector"]["matchLabels"].as_object().expect("PodMonitor selector.matchLabels");
    assert!(!selector.is_empty(), "{what}: PodMonitor selects every pod");
    for (k, v) in selector {
        assert_eq!(pod_labels.get(k), Some(v), "{what}: PodMonitor selects {k}={v}, the pods do not carry it");
    }
    assert_eq!(pm["spec"]["namespaceSelector"]["matchNames"], serde_json::json!([NAMESPACE]), "{what}");
    let endpoints = pm["spec"]["podMetricsEndpoints"].as_array().expect("podMetricsEndpoints");
    assert_eq!(endpoints.len(), 1, "{what}");
    let ports = ds["spec"]["template"]["spec"]["containers"][0]["ports"].as_array().unwrap();
    assert!(
        ports.iter().any(|p| p["name"] == endpoints[0]["port"]),
        "{what}: no container port {}",
        endpoints[0]["port"]
    );
    assert_eq!(endpoints[0]["path"], "/metrics", "{what}");
    let known = ["port", "path", "interval", "scrapeTimeout", "relabelings"];
    for k in endpoints[0].as_object().unwrap().keys() {
        assert!(known.contains(&k.as_str()), "{what}: PodMonitor endpoint field {k} not checked here");
    }
}

#[test]
fn the_schema_refuses_unknown_keys_and_values_and_the_chart_refuses_a_systemd_actuator_without_its_mounts() {
    let test = "helm_chart::the_schema_refuses_unknown_keys_and_values_and_the_chart_refuses_a_systemd_actuator_without_its_mounts";
    if !needs_helm(test, &[]) {
        return;
    }
    let home = tempfile::tempdir().unwrap();
    for (set, says) in [
        ("config.mlfq.boost_afterr=10s", "boost_afterr"),
        ("config.runtime=podman", "/config/runtime"),
        ("imagee.tag=1", "imagee"),
        ("config.nice=-30", "nice"),
        ("config.policy.classes.batch.wieght=40", "wieght"),
        ("config.actuator=systemd", "systemdDriver.enabled"),
    ] {
        let err = render(home.path(), &[], &[set]).err().unwrap_or_else(|| panic!("--set {set}: rendered"));
        assert!(err.contains(says), "--set {set}: the error does not name {says:?}:\n{err}");
    }
    // And what the schema allows renders: a class, a device's BFQ tunable, another metrics port (which the
    // container's port, the probes' and the NetworkPolicy's follow).
    let text = render(
        home.path(),
        &[],
        &[
            "config.policy.classes.batch.weight=40",
            "config.devices.bfq_tunables.sdb.max_budget=256",
            "config.metrics.listen=0.0.0.0:9555",
        ],
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let rendered = objects(&text, "--set");
    let cm = rendered.iter().find(|o| o["kind"] == "ConfigMap").unwrap();
    let toml_text = cm["data"]["agent.toml"].as_str().unwrap();
    let cfg = AgentConfig::from_toml(toml_text, Path::new("rendered agent.toml"))
        .unwrap_or_else(|e| panic!("{e}\n{toml_text}"));
    assert_eq!(cfg.policy.classes["batch"].weight, 40, "{toml_text}");
    assert_eq!(cfg.metrics.listen.port(), 9555);
    let ds = rendered.iter().find(|o| o["kind"] == "DaemonSet").unwrap();
    assert_eq!(ds["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"], 9555);
    let np = rendered.iter().find(|o| o["kind"] == "NetworkPolicy").unwrap();
    assert_eq!(np["spec"]["ingress"][0]["ports"][0]["port"], 9555);
    assert_eq!(ds["spec"]["template"]["metadata"]["annotations"]["prometheus.io/port"], "9555");
    assert!(toml_text.contains("bfq_tunables = { \"sdb\" = { \"max_budget\" = 256 } }"), "{toml_text}");
}

/// `deploy/agent.toml` (every setting, with its default) as the chart's `config`: the rendered agent.toml is the
/// same config, so every setting can be given as a value and is written as the agent reads it.
#[test]
fn every_setting_of_deploy_agent_toml_can_be_given_as_a_value() {
    if !needs_helm("helm_chart::every_setting_of_deploy_agent_toml_can_be_given_as_a_value", &[]) {
        return;
    }
    let home = tempfile::tempdir().unwrap();
    let path = deploy().join("agent.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    let all: toml::Value = toml::from_str(&text).unwrap();
    let mut values = serde_json::json!({ "config": all });
    // deploy/agent.toml is the Docker runtime's file; the chart's pods need [metrics] on their own address.
    values["config"]["metrics"]["listen"] = "0.0.0.0:9477".into();
    // As JSON (YAML too): serde_yaml writes the string "off" bare, which Helm's YAML 1.1 reads as `false`.
    let file = home.path().join("every-setting-values.yaml");
    std::fs::write(&file, serde_json::to_string_pretty(&values).unwrap()).unwrap();
    let out = render(home.path(), &[&file], &[]).unwrap_or_else(|e| panic!("helm template -f every setting: {e}"));
    let rendered = objects(&out, "every setting");
    let cm = rendered.iter().find(|o| o["kind"] == "ConfigMap").unwrap();
    let got_text = cm["data"]["agent.toml"].as_str().unwrap();
    let got = AgentConfig::from_toml(got_text, Path::new("rendered agent.toml")).unwrap_or_else(|e| panic!("{e}"));
    let mut want = AgentConfig::from_toml(&text, &path).unwrap();
    want.metrics.listen = "0.0.0.0:9477".parse().unwrap();
    want.policy.exclude_namespaces.push(NAMESPACE.into());
    assert_eq!(got, want, "rendered:\n{got_text}");
    // Every key is written, none added: the parsed files have the same keys.
    let keys = |v: &toml::Value| -> Vec<String> {
        let t = v.as_table().unwrap();
        t.iter()
            .flat_map(|(k, v)| match v.as_table() {
                Some(s) => s.keys().map(|kk| format!("{k}.{kk}")).collect(),
                None => vec![k.clone()],
            })
            .collect()
    };
    let got_toml: toml::Value = toml::from_str(got_text).unwrap();
    assert_eq!(keys(&got_toml), keys(&all), "rendered:\n{got_text}");
}

/// The schema's `config` names exactly the settings `deploy/agent.toml` lists (every one the agent knows), so a new
/// setting is refused by the chart until the schema has it, and a removed one is not offered.
#[test]
fn the_values_schema_names_every_setting_of_deploy_agent_toml() {
    let schema: Value = serde_json::from_str(&std::fs::read_to_string(chart().join("values.schema.json")).unwrap())
        .expect("values.schema.json");
    let config = &schema["properties"]["config"];
    assert_eq!(config["additionalProperties"], false, "config must refuse unknown keys, as the agent does");
    let mut from_schema = Vec::new();
    for (k, v) in config["properties"].as_object().unwrap() {
        if v["type"] == "object" && v.get("properties").is_some() {
            assert_eq!(v["additionalProperties"], false, "config.{k} must refuse unknown keys");
            from_schema.extend(v["properties"].as_object().unwrap().keys().map(|kk| format!("{k}.{kk}")));
        } else {
            from_schema.push(k.clone());
        }
    }
    let all: toml::Value = toml::from_str(&std::fs::read_to_string(deploy().join("agent.toml")).unwrap()).unwrap();
    let mut from_file = Vec::new();
    for (k, v) in all.as_table().unwrap() {
        match v.as_table() {
            Some(s) => from_file.extend(s.keys().map(|kk| format!("{k}.{kk}"))),
            None => from_file.push(k.clone()),
        }
    }
    from_schema.sort();
    from_file.sort();
    assert_eq!(from_schema, from_file, "values.schema.json's config vs deploy/agent.toml");
}

/// The chart's appVersion is the workspace's version, and the image tag defaults to it (the image
/// `build-image.sh` builds and the base's DaemonSet names).
#[test]
fn the_charts_app_version_is_the_agents_version() {
    let chart_yaml: Value =
        serde_yaml::from_str(&std::fs::read_to_string(chart().join("Chart.yaml")).unwrap()).expect("Chart.yaml");
    assert_eq!(chart_yaml["appVersion"], env!("CARGO_PKG_VERSION"), "Chart.yaml appVersion vs Cargo.toml");
    let values: Value =
        serde_yaml::from_str(&std::fs::read_to_string(chart().join("values.yaml")).unwrap()).expect("values.yaml");
    assert_eq!(values["image"]["tag"], "", "values.yaml image.tag: empty means the appVersion");
    let image = format!("{}:{}", values["image"]["repository"].as_str().unwrap(), env!("CARGO_PKG_VERSION"));
    assert_eq!(image, crate::deploy_real::IMAGE);
}
