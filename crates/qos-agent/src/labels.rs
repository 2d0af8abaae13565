//! Per-container policy from labels: `ddiskqos.exclude=true` leaves a container alone; `ddiskqos.weight=N` pins it
//! to weight N (1..=1000). A malformed label is reported and ignored for that container, never fatal.

use std::collections::BTreeMap;

use qos_core::{Policy, Weight};

/// Label that excludes a container (`"true"` / `"false"`).
pub const EXCLUDE_LABEL: &str = "ddiskqos.exclude";
/// Label that pins a container to a weight (1..=1000).
pub const WEIGHT_LABEL: &str = "ddiskqos.weight";

/// A policy label that could not be understood; the message names the label and the value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("label {label}={value:?} ignored: {reason}")]
pub struct LabelError {
    /// The label's key.
    pub label: &'static str,
    /// Its value.
    pub value: String,
    /// What is wrong with it.
    pub reason: String,
}

/// The policy the labels ask for, and the problems found. Exclusion wins over a pin; bad labels are skipped.
pub fn policy_from_labels(labels: &BTreeMap<String, String>) -> (Policy, Vec<LabelError>) {
    let mut errors = Vec::new();
    let mut policy = Policy::Managed;
    if let Some(v) = labels.get(WEIGHT_LABEL) {
        match v.trim().parse::<u64>() {
            Ok(n) => match Weight::new(n) {
                Ok(w) => policy = Policy::Pinned(w),
                Err(e) => errors.push(LabelError { label: WEIGHT_LABEL, value: v.clone(), reason: e.to_string() }),
            },
            Err(_) => errors.push(LabelError {
                label: WEIGHT_LABEL,
                value: v.clone(),
                reason: "not a whole number in 1..=1000".into(),
            }),
        }
    }
    if let Some(v) = labels.get(EXCLUDE_LABEL) {
        match v.trim().to_ascii_lowercase().as_str() {
            "true" | "1" | "yes" => policy = Policy::Excluded,
            "false" | "0" | "no" => {}
            _ => errors.push(LabelError {
                label: EXCLUDE_LABEL,
                value: v.clone(),
                reason: "expected true or false".into(),
            }),
        }
    }
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
}
