//! `[policy]`: what the node's operator lets pods (and, where wanted, Docker containers) ask for, and which pods
//! the agent never touches.
//!
//! On a shared cluster a pod author is a tenant, not the operator: an unchecked `ddiskqos.io/weight: "1000"` pins
//! a pod at the top for good (its demoted neighbours get 10 against 1000, worse than without the agent), and
//! `ddiskqos.io/exclude: "true"` keeps a heavy pod at 100, ten times a demoted neighbour. So, by default:
//! - `ddiskqos.io/weight` and `ddiskqos.io/exclude` are honoured only for pods of `trusted_namespaces` (none),
//!   and a pinned weight is at most `max_pinned_weight`;
//! - `ddiskqos.io/class` lets any pod pick one of the classes the operator defined (`classes`, none by default),
//!   as containerd/goresctrl let pods pick only among block-I/O classes an administrator defined;
//! - system pods are never touched: static pods (annotation `kubernetes.io/config.source` other than `api`),
//!   pods of `exclude_namespaces` (`kube-system`) and pods of `trusted_namespaces` carrying one of
//!   `exclude_pod_labels` (a pod's author sets its labels, so a label excludes only where the operator trusts the
//!   authors: a tenant that copies `tier=control-plane` elsewhere is managed like any other pod).
//!
//! An annotation that is not honoured is reported once per pod sandbox (pod, annotation, value, rule) and
//! ignored: the pod is managed like any other. [`PolicyConfig::decide_pod`] is pure; CRI discovery applies it
//! when it first sees a sandbox and passes the daemon only the labels of the decision, so nothing a tenant wrote
//! reaches the daemon unchecked.
//!
//! Docker labels (`ddiskqos.weight`, `ddiskqos.exclude`) are honoured as before by default
//! (`docker_labels = "trusted"`): on a Docker host whoever can set a container's labels can reach dockerd's
//! socket, which is root on the host, so there is no tenant to protect against. `docker_labels = "policy"` applies
//! the ceiling and the classes (`ddiskqos.class`) to them too and ignores `ddiskqos.exclude`, for hosts where a
//! front end lets users start containers without the socket.

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};

use crate::labels::{EXCLUDE_ANNOTATION, EXCLUDE_LABEL, WEIGHT_ANNOTATION, WEIGHT_LABEL};

/// Pod annotation choosing an operator-defined class (`[policy] classes`).
pub const CLASS_ANNOTATION: &str = "ddiskqos.io/class";
/// Docker label choosing an operator-defined class (with `docker_labels = "policy"`).
pub const CLASS_LABEL: &str = "ddiskqos.class";
/// The kubelet's annotation naming where a pod came from: `api` for pods of the API server; `file` or `http` for
/// static pods (etcd, the API server and the other control-plane pods of a kubeadm node).
pub const CONFIG_SOURCE_ANNOTATION: &str = "kubernetes.io/config.source";

/// How Docker labels are treated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DockerLabels {
    /// Honoured as they are (default): whoever sets labels can use dockerd's socket, i.e. is root on the host.
    #[default]
    Trusted,
    /// The pod rules: `ddiskqos.weight` capped at `max_pinned_weight`, `ddiskqos.class` through `classes`,
    /// `ddiskqos.exclude` ignored.
    Policy,
}

/// An operator-defined class (`[policy.classes.<name>]`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClassConfig {
    /// The weight (1..=1000) a pod of this class is pinned at: never demoted or boosted.
    pub weight: u32,
}

/// `[policy]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PolicyConfig {
    /// Namespaces whose pods may use `ddiskqos.io/weight` and `ddiskqos.io/exclude`. Default: none. `"*"`: every
    /// namespace (the agent's behaviour before `[policy]` existed).
    pub trusted_namespaces: Vec<String>,
    /// The highest weight an annotation (or, with `docker_labels = "policy"`, a label) may pin; a higher one is
    /// pinned at this value, with a warning. 1..=1000, default 1000.
    pub max_pinned_weight: u32,
    /// Classes pods of any namespace may choose with `ddiskqos.io/class: "<name>"`. Default: none.
    pub classes: BTreeMap<String, ClassConfig>,
    /// Pods of these namespaces are never touched. Default: `["kube-system"]`.
    pub exclude_namespaces: Vec<String>,
    /// Static pods (annotation `kubernetes.io/config.source` other than `api`) are never touched. Default: true.
    pub exclude_static_pods: bool,
    /// Pods of `trusted_namespaces` carrying any of these labels (key = value) are never touched, e.g.
    /// `{ tier = "control-plane" }`; a pod elsewhere with the same label is managed (its author chose the label).
    /// (A pod's priority class is not part of what the CRI runtime knows, and the agent does not talk to the API
    /// server; label such pods, or put them in an excluded namespace.) Default: none. Needs `trusted_namespaces`.
    pub exclude_pod_labels: BTreeMap<String, String>,
    /// Docker labels: `"trusted"` (default) or `"policy"` (see the module doc).
    pub docker_labels: DockerLabels,
}

impl Default for PolicyConfig {
    fn default() -> Self {
        Self {
            trusted_namespaces: Vec::new(),
            max_pinned_weight: 1000,
            classes: BTreeMap::new(),
            exclude_namespaces: vec!["kube-system".into()],
            exclude_static_pods: true,
            exclude_pod_labels: BTreeMap::new(),
            docker_labels: DockerLabels::Trusted,
        }
    }
}

fn invalid(field: String, value: impl ToString, reason: &str) -> qos_core::ConfigError {
    qos_core::ConfigError::Invalid { field, value: value.to_string(), reason: reason.into() }
}

/// A Kubernetes namespace name (a DNS-1123 label): 1..=63 of `a-z`, `0-9`, `-`, starting and ending alphanumeric.
pub fn is_namespace_name(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b.iter().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
}

impl PolicyConfig {
    /// Checks every rule; the error names the field (`policy.trusted_namespaces[1]`) and the value.
    pub fn validate(&self) -> Result<(), qos_core::ConfigError> {
        const NS: &str = "must be a namespace name (lowercase letters, digits and '-', at most 63), one per entry";
        for (i, ns) in self.trusted_namespaces.iter().enumerate() {
            if ns != "*" && !is_namespace_name(ns) {
                return Err(invalid(format!("policy.trusted_namespaces[{i}]"), ns, &format!("{NS}, or \"*\"")));
            }
        }
        for (i, ns) in self.exclude_namespaces.iter().enumerate() {
            if !is_namespace_name(ns) {
                return Err(invalid(format!("policy.exclude_namespaces[{i}]"), ns, NS));
            }
        }
        if !(1..=1000).contains(&self.max_pinned_weight) {
            return Err(invalid("policy.max_pinned_weight".into(), self.max_pinned_weight, "must be 1..=1000"));
        }
        for (name, class) in &self.classes {
            if !is_namespace_name(name) {
                return Err(invalid(
                    format!("policy.classes.{name}"),
                    name,
                    "a class name must be lowercase letters, digits and '-', at most 63",
                ));
            }
            if !(1..=1000).contains(&class.weight) {
                return Err(invalid(format!("policy.classes.{name}.weight"), class.weight, "must be 1..=1000"));
            }
        }
        if !self.exclude_pod_labels.is_empty() && self.trusted_namespaces.is_empty() {
            let (key, value) = self.exclude_pod_labels.iter().next().expect("not empty");
            return Err(invalid(
                format!("policy.exclude_pod_labels.{key}"),
                value,
                "acts only on pods of policy.trusted_namespaces (a pod's author sets its labels, so any tenant could \
                 copy the label), and trusted_namespaces is empty: name the namespaces whose pods may be excluded by \
                 label, or use policy.exclude_namespaces",
            ));
        }
        for (key, value) in &self.exclude_pod_labels {
            if key.is_empty() || key.len() > 317 || key.chars().any(|c| c.is_whitespace() || c == '=') {
                return Err(invalid(format!("policy.exclude_pod_labels.{key}"), key, "not a Kubernetes label key"));
            }
            if value.len() > 63 || value.chars().any(char::is_whitespace) {
                return Err(invalid(format!("policy.exclude_pod_labels.{key}"), value, "not a Kubernetes label value"));
            }
        }
        Ok(())
    }

    fn trusts(&self, namespace: &str) -> bool {
        self.trusted_namespaces.iter().any(|n| n == "*" || n == namespace)
    }

    /// Why a pod is a system pod the agent leaves alone, if it is one.
    fn system_rule(&self, pod: &PodFacts<'_>) -> Option<String> {
        if self.exclude_static_pods {
            if let Some(source) = pod.annotations.get(CONFIG_SOURCE_ANNOTATION).filter(|s| s.as_str() != "api") {
                return Some(format!(
                    "static pod ({CONFIG_SOURCE_ANNOTATION}={source:?}; policy.exclude_static_pods = true)"
                ));
            }
        }
        if self.exclude_namespaces.iter().any(|n| n == pod.namespace) {
            return Some(format!("namespace {:?} is in policy.exclude_namespaces", pod.namespace));
        }
        for (key, value) in self.exclude_pod_labels.iter().filter(|_| self.trusts(pod.namespace)) {
            if pod.labels.get(key) == Some(value) {
                return Some(format!("pod label {key}={value:?} is in policy.exclude_pod_labels"));
            }
        }
        None
    }

    /// The pod's policy under these rules (see the module doc). Precedence: a system pod is excluded; then, for a
    /// trusted namespace, `exclude`, then `weight`; then `class`; else managed.
    pub fn decide_pod(&self, pod: &PodFacts<'_>) -> PodDecision {
        let mut notes = Vec::new();
        if let Some(rule) = self.system_rule(pod) {
            return PodDecision { labels: exclude(EXCLUDE_ANNOTATION), system: Some(rule), notes };
        }
        let trusted = self.trusts(pod.namespace);
        let untrusted = || format!("namespace {:?} is not in policy.trusted_namespaces", pod.namespace);
        let mut note = |annotation: &'static str, value: &String, rule: String| {
            notes.push(PolicyNote { annotation, value: value.clone(), rule });
        };
        let mut decided: Option<BTreeMap<String, String>> = None;
        if let Some(v) = pod.annotations.get(EXCLUDE_ANNOTATION) {
            match (trusted, parse_bool(v)) {
                (false, _) => note(EXCLUDE_ANNOTATION, v, untrusted()),
                (true, Some(true)) => decided = Some(exclude(EXCLUDE_ANNOTATION)),
                (true, Some(false)) => {}
                (true, None) => note(EXCLUDE_ANNOTATION, v, "expected true or false".into()),
            }
        }
        if let Some(v) = pod.annotations.get(WEIGHT_ANNOTATION) {
            if !trusted {
                note(WEIGHT_ANNOTATION, v, untrusted());
            } else if let Some(w) = self.pinned_weight(v, &mut |rule| note(WEIGHT_ANNOTATION, v, rule)) {
                decided = decided.or_else(|| Some(pin(WEIGHT_ANNOTATION, w)));
            }
        }
        if let Some(v) = pod.annotations.get(CLASS_ANNOTATION) {
            match self.classes.get(v.trim()) {
                Some(class) => decided = decided.or_else(|| Some(pin(WEIGHT_ANNOTATION, class.weight))),
                None => note(CLASS_ANNOTATION, v, self.unknown_class()),
            }
        }
        PodDecision { labels: decided.unwrap_or_default(), system: None, notes }
    }

    /// A pinned weight's value checked against 1..=1000 and the ceiling (capped there); `None` if unusable.
    fn pinned_weight(&self, value: &str, note: &mut dyn FnMut(String)) -> Option<u32> {
        match value.trim().parse::<u32>() {
            Ok(w @ 1..=1000) if w > self.max_pinned_weight => {
                note(format!(
                    "above policy.max_pinned_weight = {}: pinned at {} instead",
                    self.max_pinned_weight, self.max_pinned_weight
                ));
                Some(self.max_pinned_weight)
            }
            Ok(w @ 1..=1000) => Some(w),
            _ => {
                note("not a whole number in 1..=1000".into());
                None
            }
        }
    }

    fn unknown_class(&self) -> String {
        if self.classes.is_empty() {
            "not a class of policy.classes (none defined)".into()
        } else {
            let known: Vec<&str> = self.classes.keys().map(String::as_str).collect();
            format!("not a class of policy.classes (defined: {})", known.join(", "))
        }
    }

    /// A Docker container's labels under `docker_labels`: as they are when trusted (the daemon parses them as
    /// before); otherwise the decision's labels and the notes on what was not honoured.
    pub fn decide_docker(&self, labels: &BTreeMap<String, String>) -> (BTreeMap<String, String>, Vec<PolicyNote>) {
        if self.docker_labels == DockerLabels::Trusted {
            return (labels.clone(), Vec::new());
        }
        let mut notes = Vec::new();
        let mut note = |label: &'static str, value: &String, rule: String| {
            notes.push(PolicyNote { annotation: label, value: value.clone(), rule });
        };
        if let Some(v) = labels.get(EXCLUDE_LABEL) {
            note(EXCLUDE_LABEL, v, "policy.docker_labels = \"policy\": containers cannot exclude themselves".into());
        }
        let mut decided = None;
        if let Some(v) = labels.get(WEIGHT_LABEL) {
            if let Some(w) = self.pinned_weight(v, &mut |rule| note(WEIGHT_LABEL, v, rule)) {
                decided = Some(pin(WEIGHT_LABEL, w));
            }
        }
        if let Some(v) = labels.get(CLASS_LABEL) {
            match self.classes.get(v.trim()) {
                Some(class) => decided = decided.or_else(|| Some(pin(WEIGHT_LABEL, class.weight))),
                None => note(CLASS_LABEL, v, self.unknown_class()),
            }
        }
        (decided.unwrap_or_default(), notes)
    }
}

fn parse_bool(v: &str) -> Option<bool> {
    match v.trim().to_ascii_lowercase().as_str() {
        "true" | "1" | "yes" => Some(true),
        "false" | "0" | "no" => Some(false),
        _ => None,
    }
}

fn exclude(key: &str) -> BTreeMap<String, String> {
    BTreeMap::from([(key.to_string(), "true".to_string())])
}

fn pin(key: &str, weight: u32) -> BTreeMap<String, String> {
    BTreeMap::from([(key.to_string(), weight.to_string())])
}

/// What the policy looks at in a pod (from its CRI sandbox).
#[derive(Debug, Clone, Copy)]
pub struct PodFacts<'a> {
    /// The pod's namespace.
    pub namespace: &'a str,
    /// The pod's annotations (all of them: `kubernetes.io/config.source` is one).
    pub annotations: &'a HashMap<String, String>,
    /// The pod's labels.
    pub labels: &'a HashMap<String, String>,
}

/// An annotation (or label) not honoured, and the rule that says so.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{annotation}={value:?} not honoured: {rule}")]
pub struct PolicyNote {
    /// The annotation's (or label's) key.
    pub annotation: &'static str,
    /// Its value.
    pub value: String,
    /// The rule, naming the `[policy]` field where one applies.
    pub rule: String,
}

/// The policy for one pod.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PodDecision {
    /// The policy labels the daemon gets (`ddiskqos.io/exclude` or `ddiskqos.io/weight`, or none: managed).
    pub labels: BTreeMap<String, String>,
    /// Set for a system pod: the rule that excludes it.
    pub system: Option<String>,
    /// What was not honoured.
    pub notes: Vec<PolicyNote>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::labels::policy_from_labels;
    use qos_core::{Policy, Weight};

    fn map(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    /// The daemon's view: the policy the decision's labels parse to.
    fn decide(
        cfg: &PolicyConfig,
        ns: &str,
        annotations: &[(&str, &str)],
        labels: &[(&str, &str)],
    ) -> (Policy, PodDecision) {
        let (a, l) = (map(annotations), map(labels));
        let d = cfg.decide_pod(&PodFacts { namespace: ns, annotations: &a, labels: &l });
        let (p, errors) = policy_from_labels(&d.labels);
        assert!(errors.is_empty(), "the decision's labels do not parse: {errors:?}");
        (p, d)
    }

    fn pinned(w: u64) -> Policy {
        Policy::Pinned(Weight::new(w).unwrap())
    }

    #[test]
    fn by_default_tenants_cannot_pin_or_exclude_and_are_told_why() {
        let cfg = PolicyConfig::default();
        let (p, d) = decide(&cfg, "team-a", &[(WEIGHT_ANNOTATION, "1000"), (EXCLUDE_ANNOTATION, "true")], &[]);
        assert_eq!(p, Policy::Managed);
        assert_eq!(d.notes.len(), 2, "{:?}", d.notes);
        for n in &d.notes {
            let msg = n.to_string();
            assert!(msg.contains("\"team-a\" is not in policy.trusted_namespaces"), "{msg}");
        }
        assert!(d.notes[0].to_string().starts_with("ddiskqos.io/exclude=\"true\""), "{}", d.notes[0]);
        assert!(d.notes[1].to_string().starts_with("ddiskqos.io/weight=\"1000\""), "{}", d.notes[1]);
        // No annotation: managed, nothing said.
        assert_eq!(decide(&cfg, "team-a", &[("other", "x")], &[]).1, PodDecision::default());
    }

    #[test]
    fn trusted_namespaces_pin_and_exclude_up_to_the_ceiling() {
        let cfg =
            PolicyConfig { trusted_namespaces: vec!["batch".into()], max_pinned_weight: 500, ..Default::default() };
        assert_eq!(decide(&cfg, "batch", &[(WEIGHT_ANNOTATION, " 300 ")], &[]).0, pinned(300));
        let (p, d) = decide(&cfg, "batch", &[(WEIGHT_ANNOTATION, "1000")], &[]);
        assert_eq!(p, pinned(500));
        assert_eq!(
            d.notes[0].to_string(),
            "ddiskqos.io/weight=\"1000\" not honoured: above policy.max_pinned_weight = 500: pinned at 500 instead"
        );
        assert_eq!(
            decide(&cfg, "batch", &[(EXCLUDE_ANNOTATION, "true"), (WEIGHT_ANNOTATION, "3")], &[]).0,
            Policy::Excluded
        );
        assert_eq!(decide(&cfg, "batch", &[(EXCLUDE_ANNOTATION, "false")], &[]).1.notes, vec![]);
        for (key, bad) in [
            (WEIGHT_ANNOTATION, "0"),
            (WEIGHT_ANNOTATION, "abc"),
            (WEIGHT_ANNOTATION, "-1"),
            (EXCLUDE_ANNOTATION, "maybe"),
        ] {
            let (p, d) = decide(&cfg, "batch", &[(key, bad)], &[]);
            assert_eq!(p, Policy::Managed, "{key}={bad}");
            assert_eq!(d.notes.len(), 1);
            assert!(d.notes[0].to_string().starts_with(&format!("{key}={bad:?}")), "{}", d.notes[0]);
        }
        // Another namespace is still not trusted; "*" trusts all.
        assert_eq!(decide(&cfg, "web", &[(WEIGHT_ANNOTATION, "300")], &[]).0, Policy::Managed);
        let all = PolicyConfig { trusted_namespaces: vec!["*".into()], ..Default::default() };
        assert_eq!(decide(&all, "web", &[(WEIGHT_ANNOTATION, "1000")], &[]).0, pinned(1000));
    }

    #[test]
    fn classes_are_open_to_every_namespace_and_unknown_ones_named() {
        let cfg = PolicyConfig {
            classes: BTreeMap::from([
                ("batch".into(), ClassConfig { weight: 40 }),
                ("interactive".into(), ClassConfig { weight: 800 }),
            ]),
            ..Default::default()
        };
        assert_eq!(decide(&cfg, "team-a", &[(CLASS_ANNOTATION, "batch")], &[]).0, pinned(40));
        let (p, d) = decide(&cfg, "team-a", &[(CLASS_ANNOTATION, "gold")], &[]);
        assert_eq!(p, Policy::Managed);
        assert_eq!(
            d.notes[0].to_string(),
            "ddiskqos.io/class=\"gold\" not honoured: not a class of policy.classes (defined: batch, interactive)"
        );
        // A tenant's raw weight is still refused beside a valid class: the class decides.
        let (p, d) = decide(&cfg, "team-a", &[(CLASS_ANNOTATION, "batch"), (WEIGHT_ANNOTATION, "1000")], &[]);
        assert_eq!((p, d.notes.len()), (pinned(40), 1));
        let none = decide(&PolicyConfig::default(), "x", &[(CLASS_ANNOTATION, "batch")], &[]).1;
        assert!(none.notes[0].rule.contains("none defined"), "{:?}", none.notes);
    }

    #[test]
    fn system_pods_are_excluded_whatever_they_ask_for() {
        let cfg = PolicyConfig {
            exclude_namespaces: vec!["kube-system".into(), "monitoring".into()],
            exclude_pod_labels: BTreeMap::from([("tier".into(), "control-plane".into())]),
            trusted_namespaces: vec!["*".into()],
            ..Default::default()
        };
        let (p, d) = decide(&cfg, "kube-system", &[(WEIGHT_ANNOTATION, "1000")], &[]);
        assert_eq!(p, Policy::Excluded);
        assert_eq!(d.system.as_deref(), Some("namespace \"kube-system\" is in policy.exclude_namespaces"));
        assert_eq!(decide(&cfg, "monitoring", &[], &[]).0, Policy::Excluded);
        let (p, d) = decide(&cfg, "default", &[(CONFIG_SOURCE_ANNOTATION, "file")], &[]);
        assert_eq!(p, Policy::Excluded);
        assert!(d.system.unwrap().contains("static pod"));
        assert_eq!(decide(&cfg, "default", &[(CONFIG_SOURCE_ANNOTATION, "api")], &[]).0, Policy::Managed);
        assert_eq!(decide(&cfg, "default", &[], &[("tier", "control-plane")]).0, Policy::Excluded);
        assert_eq!(decide(&cfg, "default", &[], &[("tier", "web")]).0, Policy::Managed);
        // A label excludes only in a trusted namespace: a tenant elsewhere that copies it is managed.
        let some = PolicyConfig { trusted_namespaces: vec!["platform".into()], ..cfg.clone() };
        assert_eq!(decide(&some, "platform", &[], &[("tier", "control-plane")]).0, Policy::Excluded);
        assert_eq!(decide(&some, "team-a", &[], &[("tier", "control-plane")]).0, Policy::Managed);
        // Switched off: a static pod is managed.
        let off = PolicyConfig { exclude_static_pods: false, exclude_namespaces: vec![], ..Default::default() };
        assert_eq!(decide(&off, "kube-system", &[(CONFIG_SOURCE_ANNOTATION, "file")], &[]).0, Policy::Managed);
        // The default excludes kube-system and static pods.
        let def = PolicyConfig::default();
        assert_eq!(decide(&def, "kube-system", &[], &[]).0, Policy::Excluded);
        assert_eq!(decide(&def, "default", &[(CONFIG_SOURCE_ANNOTATION, "http")], &[]).0, Policy::Excluded);
    }

    #[test]
    fn docker_labels_are_trusted_by_default_and_checked_on_request() {
        let labels: BTreeMap<String, String> = [(WEIGHT_LABEL, "1000"), (EXCLUDE_LABEL, "true")]
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let (out, notes) = PolicyConfig::default().decide_docker(&labels);
        assert_eq!((out, notes), (labels.clone(), vec![]));
        let cfg = PolicyConfig {
            docker_labels: DockerLabels::Policy,
            max_pinned_weight: 200,
            classes: BTreeMap::from([("batch".into(), ClassConfig { weight: 40 })]),
            ..Default::default()
        };
        let (out, notes) = cfg.decide_docker(&labels);
        assert_eq!(policy_from_labels(&out).0, pinned(200));
        assert_eq!(notes.len(), 2, "{notes:?}");
        let class: BTreeMap<String, String> = [(CLASS_LABEL.to_string(), "batch".to_string())].into();
        assert_eq!(policy_from_labels(&cfg.decide_docker(&class).0).0, pinned(40));
    }

    #[test]
    fn validation_names_the_field_and_value() {
        let bad = |f: fn(&mut PolicyConfig), want: &str| {
            let mut cfg = PolicyConfig::default();
            f(&mut cfg);
            let e = cfg.validate().unwrap_err().to_string();
            assert!(e.contains(want), "{e}");
        };
        bad(
            |c| c.trusted_namespaces = vec!["ok".into(), "team-a,team-b".into()],
            "policy.trusted_namespaces[1] = team-a,team-b",
        );
        bad(|c| c.trusted_namespaces = vec!["Team".into()], "policy.trusted_namespaces[0] = Team");
        bad(|c| c.exclude_namespaces = vec!["*".into()], "policy.exclude_namespaces[0] = *");
        bad(|c| c.exclude_namespaces = vec!["".into()], "policy.exclude_namespaces[0]");
        bad(|c| c.max_pinned_weight = 0, "policy.max_pinned_weight = 0");
        bad(|c| c.max_pinned_weight = 1001, "policy.max_pinned_weight = 1001");
        bad(
            |c| c.classes = BTreeMap::from([("batch".into(), ClassConfig { weight: 5000 })]),
            "policy.classes.batch.weight = 5000",
        );
        bad(
            |c| c.classes = BTreeMap::from([("Gold Class".into(), ClassConfig { weight: 5 })]),
            "policy.classes.Gold Class",
        );
        bad(
            |c| {
                c.trusted_namespaces = vec!["platform".into()];
                c.exclude_pod_labels = BTreeMap::from([("a b".into(), "x".into())]);
            },
            "policy.exclude_pod_labels.a b",
        );
        bad(
            |c| c.exclude_pod_labels = BTreeMap::from([("tier".into(), "control-plane".into())]),
            "policy.exclude_pod_labels.tier = control-plane: acts only on pods of policy.trusted_namespaces",
        );
        PolicyConfig::default().validate().unwrap();
        assert!(is_namespace_name("kube-system") && !is_namespace_name("-x") && !is_namespace_name(&"a".repeat(64)));
    }
}
