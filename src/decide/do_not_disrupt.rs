//! Karpenter's opt-out, `karpenter.sh/do-not-disrupt`, read as Karpenter
//! reads it (its `pkg/utils/pod/scheduling.go`, `IsDoNotDisruptActive`,
//! and `pkg/controllers/state/statenode.go`, `ValidateNodeDisruptable`):
//!
//! - on a Node, exactly `"true"` keeps every feature off the node;
//! - on an active pod (not Succeeded or Failed, not terminating; mirror and
//!   DaemonSet pods count too), `"true"` holds for as long as the pod runs,
//!   and a Go duration (`"90m"`, `"1h30m"`, positive) holds until that long
//!   after the pod started (with no start time yet it holds); any other
//!   value is ignored, as Karpenter ignores it.
//!
//! A feature never takes a node one holds ([`super::rollout`]); a drain
//! keeps such a pod until its deadline says otherwise
//! ([`super::drain_plan`]).

use std::sync::Arc;

use crate::api::node::Node;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::ResourceExt;

use crate::api::pod::Pod;

pub use crate::api::pod::DO_NOT_DISRUPT as ANNOTATION;

/// Is the node itself opted out?
pub fn node_holds(node: &Node) -> bool {
    node.annotations().get(ANNOTATION).map(String::as_str) == Some("true")
}

/// A pod that holds its node, and until when (`None`: while it runs).
#[derive(Debug, Clone, PartialEq)]
pub struct Hold {
    /// `namespace/name`.
    pub pod: String,
    pub until: Option<Timestamp>,
}

impl Hold {
    /// How a status message names it.
    pub fn message(&self) -> String {
        format!("pod {} has {}", self.pod, self.why())
    }

    /// The annotation and until when, for a message that names the pod.
    pub fn why(&self) -> String {
        match self.until {
            None => format!("{ANNOTATION}=true"),
            Some(t) => format!("{ANNOTATION} until {t:.0}"),
        }
    }
}

/// Does `pod` hold its node at `now`?
pub fn pod_hold(pod: &Pod, now: Timestamp) -> Option<Hold> {
    let value = pod.annotations().get(ANNOTATION)?;
    let finished = matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    );
    if finished || pod.metadata.deletion_timestamp.is_some() {
        return None;
    }
    let name = || {
        let ns = pod.metadata.namespace.as_deref().unwrap_or_default();
        format!("{ns}/{}", pod.name_any())
    };
    if value == "true" {
        return Some(Hold {
            pod: name(),
            until: None,
        });
    }
    let d = go_duration(value).filter(|d| d.is_positive())?;
    let started = pod.status.as_ref().and_then(|s| s.start_time.as_ref());
    let Some(started) = started else {
        return Some(Hold {
            pod: name(),
            until: None,
        });
    };
    let until = started.0.checked_add(d).ok()?;
    (now < until).then(|| Hold {
        pod: name(),
        until: Some(until),
    })
}

/// The pod that holds the node longest, if any does: one held while it
/// runs first, else the latest end.
pub fn longest(pods: &[Arc<Pod>], now: Timestamp) -> Option<Hold> {
    pods.iter()
        .filter_map(|p| pod_hold(p, now))
        .max_by_key(|h| h.until.map_or((1, Timestamp::MAX), |t| (0, t)))
}

/// Go's `time.ParseDuration`: an optional sign, then one or more decimal
/// numbers (a fraction allowed) each with a unit `ns`, `us` (`µs`, `μs`),
/// `ms`, `s`, `m`, `h`; `"0"` alone is zero.
pub fn go_duration(s: &str) -> Option<SignedDuration> {
    let (negative, mut rest) = match s.as_bytes().first()? {
        b'-' => (true, &s[1..]),
        b'+' => (false, &s[1..]),
        _ => (false, s),
    };
    if rest == "0" {
        return Some(SignedDuration::ZERO);
    }
    if rest.is_empty() {
        return None;
    }
    let mut nanos = 0f64;
    while !rest.is_empty() {
        let number_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (number, tail) = rest.split_at(number_end);
        let digits = number.bytes().filter(u8::is_ascii_digit).count();
        if digits == 0 || number.matches('.').count() > 1 {
            return None;
        }
        let value: f64 = number.parse().ok()?;
        let unit_end = tail
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(tail.len());
        let (unit, tail) = tail.split_at(unit_end);
        let scale = match unit {
            "ns" => 1.0,
            "us" | "\u{b5}s" | "\u{3bc}s" => 1e3,
            "ms" => 1e6,
            "s" => 1e9,
            "m" => 60e9,
            "h" => 3600e9,
            _ => return None,
        };
        nanos += value * scale;
        rest = tail;
    }
    if nanos > i64::MAX as f64 {
        return None;
    }
    let d = SignedDuration::from_nanos(nanos as i64);
    Some(if negative { -d } else { d })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::api::pod::PodStatus;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn at(s: &str) -> Timestamp {
        s.parse().expect("timestamp")
    }

    /// `prod/<name>` on `node` with `karpenter.sh/do-not-disrupt: value`,
    /// in `phase`, started at `started` (for the features' tests too).
    pub(crate) fn opted_out_pod(
        name: &str,
        node: &str,
        value: &str,
        phase: &str,
        started: Option<Timestamp>,
    ) -> Arc<Pod> {
        let mut p = Pod::default();
        p.metadata.name = Some(name.into());
        p.metadata.namespace = Some("prod".into());
        p.metadata
            .annotations
            .get_or_insert_default()
            .insert(ANNOTATION.into(), value.into());
        p.spec = Some(crate::api::pod::PodSpec {
            node_name: Some(node.into()),
            ..Default::default()
        });
        p.status = Some(PodStatus {
            phase: Some(phase.into()),
            start_time: started.map(Time),
        });
        Arc::new(p)
    }

    fn pod(value: &str, phase: &str, started: Option<&str>) -> Pod {
        let mut p = (*opted_out_pod("p", "n", value, phase, started.map(at))).clone();
        p.metadata.namespace = Some("ns".into());
        p
    }

    /// Go's `time.ParseDuration` (its `time/format.go`), as Karpenter
    /// parses the annotation.
    #[test]
    fn durations_as_go_parses_them() {
        let secs = |s: &str| go_duration(s).map(|d| d.as_secs_f64());
        assert_eq!(secs("90m"), Some(5400.0));
        assert_eq!(secs("1h30m"), Some(5400.0));
        assert_eq!(secs("1.5h"), Some(5400.0));
        assert_eq!(secs(".5s"), Some(0.5));
        assert_eq!(secs("1.s"), Some(1.0));
        assert_eq!(secs("300ms"), Some(0.3));
        assert_eq!(secs("2\u{b5}s"), Some(0.000002));
        assert_eq!(secs("-1m"), Some(-60.0));
        assert_eq!(secs("0"), Some(0.0));
        for bad in [
            "", "1", "h", "1d", "true", "1h ", " 1h", "1..5h", ".h", "-", "1hh",
        ] {
            assert_eq!(secs(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_pod_holds_as_karpenter_says() {
        let now = at("2026-11-29T12:00:00Z");
        let running = pod("true", "Running", Some("2026-11-29T11:00:00Z"));
        assert_eq!(pod_hold(&running, now).map(|h| h.until), Some(None));
        let two_hours = pod("2h", "Running", Some("2026-11-29T11:00:00Z"));
        let until = pod_hold(&two_hours, now).and_then(|h| h.until);
        assert_eq!(until, Some(at("2026-11-29T13:00:00Z")));
        assert_eq!(
            pod_hold(&two_hours, now).map(|h| h.message()).as_deref(),
            Some("pod ns/p has karpenter.sh/do-not-disrupt until 2026-11-29T13:00:00Z")
        );
        // Elapsed, finished, terminating, not yet started, or not a value
        // Karpenter reads.
        assert_eq!(
            pod_hold(&pod("30m", "Running", Some("2026-11-29T11:00:00Z")), now),
            None
        );
        assert_eq!(pod_hold(&pod("true", "Succeeded", None), now), None);
        let mut deleting = running.clone();
        deleting.metadata.deletion_timestamp = Some(Time(now));
        assert_eq!(pod_hold(&deleting, now), None);
        assert!(
            pod_hold(&pod("1h", "Pending", None), now).is_some(),
            "no start time holds"
        );
        for ignored in ["True", "yes", "0s", "-1h", "forever"] {
            assert_eq!(
                pod_hold(&pod(ignored, "Running", None), now),
                None,
                "{ignored}"
            );
        }
        // The longest of several: one held while it runs beats any end.
        let pods = [two_hours, running].map(Arc::new);
        assert_eq!(longest(&pods, now).map(|h| h.until), Some(None));
    }
}
