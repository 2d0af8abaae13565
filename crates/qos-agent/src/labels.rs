//! Per-container policy from labels: `ddiskqos.exclude=true` leaves a container alone; `ddiskqos.weight=N` pins it
//! to weight N (1..=1000). Kubernetes pods say the same with the annotations `ddiskqos.io/exclude` and
//! `ddiskqos.io/weight` (the CRI runtime passes a pod's `ddiskqos.io/*` annotations as its labels). A malformed
//! label or annotation is reported and ignored for that container, never fatal.

use std::collections::BTreeMap;

use qos_core::{Policy, Weight};

/// Label that excludes a container (`"true"` / `"false"`).
pub const EXCLUDE_LABEL: &str = "ddiskqos.exclude";
/// Label that pins a container to a weight (1..=1000).
pub const WEIGHT_LABEL: &str = "ddiskqos.weight";

/// Pod annotation that excludes a pod (`"true"` / `"false"`).
pub const EXCLUDE_ANNOTATION: &str = "ddiskqos.io/exclude";
/// Pod annotation that pins a pod to a weight (1..=1000).
pub const WEIGHT_ANNOTATION: &str = "ddiskqos.io/weight";

/// One naming of the two policy keys.
struct Keys {
    kind: &'static str,
    exclude: &'static str,
    weight: &'static str,
}

const KEYS: [Keys; 2] = [
    Keys { kind: "label", exclude: EXCLUDE_LABEL, weight: WEIGHT_LABEL },
    Keys { kind: "annotation", exclude: EXCLUDE_ANNOTATION, weight: WEIGHT_ANNOTATION },
];

/// A policy label that could not be understood; the message names the label and the value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{kind} {label}={value:?} ignored: {reason}")]
pub struct LabelError {
    /// `label` (Docker) or `annotation` (Kubernetes pod).
    pub kind: &'static str,
    /// The label's key.
    pub label: &'static str,
    /// Its value.
    pub value: String,
    /// What is wrong with it.
    pub reason: String,
}

/// The policy the labels (or pod annotations) ask for, and the problems found. Exclusion wins over a pin; bad
/// values are skipped. Both namings are read; should both pin, the Docker label's weight wins.
pub fn policy_from_labels(labels: &BTreeMap<String, String>) -> (Policy, Vec<LabelError>) {
    let mut errors = Vec::new();
    let mut pin = None;
    let mut excluded = false;
    for keys in &KEYS {
        let error =
            |label, value: &String, reason: String| LabelError { kind: keys.kind, label, value: value.clone(), reason };
        if let Some(v) = labels.get(keys.weight) {
            match v.trim().parse::<u64>() {
                Ok(n) => match Weight::new(n) {
                    Ok(w) => pin = pin.or(Some(w)),
                    Err(e) => errors.push(error(keys.weight, v, e.to_string())),
                },
                Err(_) => errors.push(error(keys.weight, v, "not a whole number in 1..=1000".into())),
            }
        }
        if let Some(v) = labels.get(keys.exclude) {
            match v.trim().to_ascii_lowercase().as_str() {
                "true" | "1" | "yes" => excluded = true,
                "false" | "0" | "no" => {}
                _ => errors.push(error(keys.exclude, v, "expected true or false".into())),
            }
        }
    }
    let policy = match (excluded, pin) {
        (true, _) => Policy::Excluded,
        (false, Some(w)) => Policy::Pinned(w),
        (false, None) => Policy::Managed,
    };
    (policy, errors)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn no_labels_is_managed() {
        assert_eq!(policy_from_labels(&labels(&[("other", "x")])), (Policy::Managed, vec![]));
    }

    #[test]
    fn pin_and_exclude() {
        let (p, e) = policy_from_labels(&labels(&[(WEIGHT_LABEL, "300")]));
        assert_eq!(p, Policy::Pinned(Weight::new(300).unwrap()));
        assert!(e.is_empty());
        let (p, _) = policy_from_labels(&labels(&[(EXCLUDE_LABEL, "true"), (WEIGHT_LABEL, "300")]));
        assert_eq!(p, Policy::Excluded);
    }

    #[test]
    fn malformed_labels_are_reported_and_ignored() {
        for bad in ["0", "1001", "-5", "abc", "", "99999999999999999999999"] {
            let (p, e) = policy_from_labels(&labels(&[(WEIGHT_LABEL, bad)]));
            assert_eq!(p, Policy::Managed, "{bad}");
            assert_eq!(e.len(), 1, "{bad}");
            assert!(e[0].to_string().contains(WEIGHT_LABEL), "{}", e[0]);
            assert_eq!(e[0].value, bad);
        }
        let (p, e) = policy_from_labels(&labels(&[(EXCLUDE_LABEL, "maybe")]));
        assert_eq!(p, Policy::Managed);
        assert!(e[0].to_string().contains("maybe"));
    }

    #[test]
    fn pod_annotations_work_like_labels() {
        let (p, e) = policy_from_labels(&labels(&[(WEIGHT_ANNOTATION, " 250 ")]));
        assert_eq!((p, e), (Policy::Pinned(Weight::new(250).unwrap()), vec![]));
        let (p, _) = policy_from_labels(&labels(&[(EXCLUDE_ANNOTATION, "true"), (WEIGHT_ANNOTATION, "300")]));
        assert_eq!(p, Policy::Excluded);
        for (key, bad) in [(WEIGHT_ANNOTATION, "0"), (WEIGHT_ANNOTATION, "abc"), (EXCLUDE_ANNOTATION, "maybe")] {
            let (p, e) = policy_from_labels(&labels(&[(key, bad)]));
            assert_eq!(p, Policy::Managed, "{key}={bad}");
            assert_eq!(e.len(), 1);
            let msg = e[0].to_string();
            assert!(msg.starts_with(&format!("annotation {key}=")) && msg.contains(bad), "{msg}");
        }
        // A bad annotation does not undo a good label.
        let (p, e) = policy_from_labels(&labels(&[(WEIGHT_LABEL, "40"), (WEIGHT_ANNOTATION, "x")]));
        assert_eq!(p, Policy::Pinned(Weight::new(40).unwrap()));
        assert_eq!(e.len(), 1);
    }
}
