//! Disruption budgets: how many of a set of nodes may be unavailable at
//! once, and whether taking one more node stays within every limit (the
//! whole selection, each topology domain, the control plane).
//!
//! **Every unavailable node counts**: NotReady, cordoned, in any
//! NodeMaintenance, or holding one of our slots — not only the nodes this
//! feature disrupted. A node that is already unavailable costs nothing more
//! when taken.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::api::common::Budget;

/// The control-plane role label.
pub const CONTROL_PLANE_LABEL: &str = "node-role.kubernetes.io/control-plane";

/// `max` of `total` nodes: a count as given; a percentage rounded down,
/// but at least 1 when above 0% (a budget that rounds to nothing would
/// never let a small pool progress). The schema refuses other strings; a
/// malformed one allows nothing.
pub fn allowed(max: &IntOrString, total: usize) -> usize {
    match max {
        IntOrString::Int(n) => (*n).max(0) as usize,
        IntOrString::String(s) => {
            let Some(p) = s
                .strip_suffix('%')
                .and_then(|p| p.trim().parse::<usize>().ok())
            else {
                return 0;
            };
            if p == 0 {
                0
            } else {
                (total * p.min(100) / 100).max(1)
            }
        }
    }
}

/// What the budget needs to know about one selected node.
#[derive(Debug, Clone, Default)]
pub struct Member<'a> {
    pub name: &'a str,
    pub labels: Option<&'a BTreeMap<String, String>>,
    pub unavailable: bool,
}

impl Member<'_> {
    fn label(&self, key: &str) -> Option<&str> {
        self.labels?.get(key).map(String::as_str)
    }

    pub fn control_plane(&self) -> bool {
        self.label(CONTROL_PLANE_LABEL).is_some()
    }
}

/// Would taking `candidate` (one of `members`) keep every limit of
/// `budget`? `Err` says which limit is full, for the status.
pub fn admits(budget: &Budget, members: &[Member], candidate: &Member) -> Result<(), String> {
    if candidate.unavailable {
        return Ok(());
    }
    let down = members.iter().filter(|m| m.unavailable).count();
    let max = allowed(&budget.max_unavailable, members.len());
    if down + 1 > max {
        return Err(format!(
            "budget full: {down} of {} selected nodes unavailable, maxUnavailable allows {max}",
            members.len()
        ));
    }
    for topo in &budget.per_topology {
        let value = candidate.label(&topo.key);
        let domain: Vec<&Member> = members
            .iter()
            .filter(|m| m.label(&topo.key) == value)
            .collect();
        let down = domain.iter().filter(|m| m.unavailable).count();
        let max = allowed(&topo.max_unavailable, domain.len());
        if down + 1 > max {
            return Err(format!(
                "budget full in {}={}: {down} of {} nodes unavailable, allowed {max}",
                topo.key,
                value.unwrap_or("<unset>"),
                domain.len()
            ));
        }
    }
    if candidate.control_plane() {
        let down = members
            .iter()
            .filter(|m| m.control_plane() && m.unavailable)
            .count();
        let max = budget.max_control_plane.max(0) as usize;
        if down + 1 > max {
            return Err(format!(
                "control-plane budget full: {down} control-plane nodes unavailable, maxControlPlane allows {max}"
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::common::TopologyBudget;

    fn pct(s: &str) -> IntOrString {
        IntOrString::String(s.into())
    }

    #[test]
    fn percentages_round_down_but_never_to_nothing() {
        assert_eq!(allowed(&pct("25%"), 12), 3);
        assert_eq!(allowed(&pct("25%"), 10), 2, "2.5 rounds down");
        assert_eq!(allowed(&pct("10%"), 3), 1, "0.3 still allows one");
        assert_eq!(allowed(&pct("0%"), 100), 0);
        assert_eq!(allowed(&pct("100%"), 7), 7);
        assert_eq!(allowed(&IntOrString::Int(3), 2), 3);
        assert_eq!(allowed(&IntOrString::Int(0), 5), 0);
        assert_eq!(allowed(&pct("lots"), 5), 0, "malformed allows nothing");
    }

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn every_unavailable_node_counts() {
        let b = Budget {
            max_unavailable: IntOrString::Int(2),
            ..Budget::default()
        };
        let ms = [
            Member {
                name: "a",
                labels: None,
                unavailable: true,
            },
            Member {
                name: "b",
                labels: None,
                unavailable: false,
            },
            Member {
                name: "c",
                labels: None,
                unavailable: false,
            },
        ];
        assert!(admits(&b, &ms, &ms[1]).is_ok(), "1 down + 1 = 2");
        let ms2 = [
            Member {
                unavailable: true,
                ..ms[0].clone()
            },
            Member {
                unavailable: true,
                ..ms[1].clone()
            },
            ms[2].clone(),
        ];
        let e = admits(&b, &ms2, &ms2[2]).unwrap_err();
        assert!(e.contains("2 of 3"), "{e}");
        // A node already down costs nothing to take.
        assert!(admits(&b, &ms2, &ms2[1]).is_ok());
    }

    #[test]
    fn topology_domains_have_their_own_limit() {
        let (za, zb) = (labels(&[("zone", "a")]), labels(&[("zone", "b")]));
        let b = Budget {
            max_unavailable: IntOrString::Int(10),
            per_topology: vec![TopologyBudget {
                key: "zone".into(),
                max_unavailable: IntOrString::Int(1),
            }],
            ..Budget::default()
        };
        let ms = [
            Member {
                name: "a1",
                labels: Some(&za),
                unavailable: true,
            },
            Member {
                name: "a2",
                labels: Some(&za),
                unavailable: false,
            },
            Member {
                name: "b1",
                labels: Some(&zb),
                unavailable: false,
            },
        ];
        let e = admits(&b, &ms, &ms[1]).unwrap_err();
        assert!(e.contains("zone=a"), "{e}");
        assert!(admits(&b, &ms, &ms[2]).is_ok(), "zone b is free");
    }

    #[test]
    fn control_plane_nodes_have_their_own_limit() {
        let cp = labels(&[(CONTROL_PLANE_LABEL, "")]);
        let b = Budget {
            max_unavailable: IntOrString::Int(5),
            ..Budget::default()
        };
        let ms = [
            Member {
                name: "cp1",
                labels: Some(&cp),
                unavailable: true,
            },
            Member {
                name: "cp2",
                labels: Some(&cp),
                unavailable: false,
            },
            Member {
                name: "w1",
                labels: None,
                unavailable: false,
            },
        ];
        assert!(
            admits(&b, &ms, &ms[1])
                .unwrap_err()
                .contains("control-plane")
        );
        assert!(admits(&b, &ms, &ms[2]).is_ok());
    }
}
