//! Label selectors, pure: whether one matches a set of labels (as the API
//! server and the disruption controller do), and whether one a spec gives
//! is valid, checked as the API server checks it, with the field named.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

/// Does a label selector match these labels? (A PDB's nil selector matches
/// nothing, an empty one everything, as the disruption controller does.)
pub fn selector_matches(sel: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    if let Some(ml) = &sel.match_labels
        && !ml.iter().all(|(k, v)| labels.get(k) == Some(v))
    {
        return false;
    }
    sel.match_expressions.iter().flatten().all(|e| {
        let val = labels.get(&e.key);
        let vals = e.values.as_deref().unwrap_or_default();
        match e.operator.as_str() {
            "In" => val.is_some_and(|v| vals.contains(v)),
            "NotIn" => val.is_none_or(|v| !vals.contains(v)),
            "Exists" => val.is_some(),
            "DoesNotExist" => val.is_none(),
            _ => false,
        }
    })
}

/// A node selector's operators and values (the CRDs refuse a bad one; an
/// object stored before they did is caught here).
pub fn check_selector(sel: &LabelSelector) -> Result<(), String> {
    check_selector_at("nodeSelector", sel)
}

/// [`check_selector`] for the selector at `field`, named in the message.
/// Keys and values are checked as the API server checks label selectors:
/// one it refuses ("my app") made a blocking-pod gate's watch fail for
/// ever.
pub fn check_selector_at(field: &str, sel: &LabelSelector) -> Result<(), String> {
    for (k, v) in sel.match_labels.iter().flatten() {
        check_label_key(field, k)?;
        check_label_value(field, k, v)?;
    }
    for e in sel.match_expressions.iter().flatten() {
        check_label_key(field, &e.key)?;
        for v in e.values.iter().flatten() {
            check_label_value(field, &e.key, v)?;
        }
        let has_values = e.values.as_ref().is_some_and(|v| !v.is_empty());
        match e.operator.as_str() {
            "In" | "NotIn" if !has_values => {
                return Err(format!("{field}: {} {} needs values", e.key, e.operator));
            }
            "Exists" | "DoesNotExist" if has_values => {
                return Err(format!("{field}: {} {} takes no values", e.key, e.operator));
            }
            "In" | "NotIn" | "Exists" | "DoesNotExist" => {}
            other => {
                return Err(format!(
                    "{field}: unknown operator {other:?} (In, NotIn, Exists, DoesNotExist)"
                ));
            }
        }
    }
    Ok(())
}

/// A label key: an optional DNS-subdomain prefix and `/`, then a name of
/// at most 63 characters (alphanumerics, `-`, `_`, `.`, alphanumeric at
/// both ends).
pub(crate) fn check_label_key(field: &str, key: &str) -> Result<(), String> {
    let (prefix, name) = match key.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    let prefix_ok = prefix.is_none_or(crate::api::common::is_node_name);
    if !prefix_ok || !label_name(name) {
        return Err(format!("{field}: {key:?} is not a valid label key"));
    }
    Ok(())
}

pub(crate) fn check_label_value(field: &str, key: &str, value: &str) -> Result<(), String> {
    if !value.is_empty() && !label_name(value) {
        return Err(format!(
            "{field}: {key}={value:?} is not a valid label value (at most 63 alphanumerics, '-', '_' or '.', alphanumeric at both ends)"
        ));
    }
    Ok(())
}

/// A label name or value: 1 to 63 of `[A-Za-z0-9_.-]`, alphanumeric at
/// both ends.
fn label_name(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

/// One blocking-pod gate as its watch would be built: selector and
/// namespace (which reaches the URL path).
pub fn check_gate(gate: &crate::api::common::BlockingPods) -> Result<(), String> {
    check_selector_at("selector", &gate.selector)?;
    check_namespace("namespace", gate.namespace.as_deref())
}

/// A namespace at `field`, if given, is a valid namespace name (it
/// reaches a URL path).
pub(crate) fn check_namespace(field: &str, ns: Option<&str>) -> Result<(), String> {
    match ns {
        Some(ns) if !ns.is_empty() && !crate::api::common::is_dns_label(ns) => {
            Err(format!("{field}: {ns:?} is not a valid namespace name"))
        }
        _ => Ok(()),
    }
}
