//! Building blocks every disruption feature shares, one Rust type each, so
//! RebootPolicy, UpgradePlan and replacement speak the same language:
//! node names, and the drain options an owner hands to the NodeMaintenance
//! it takes a node with. Selection, budgets, windows and stage deadlines
//! join this file with the first feature that uses them.

use std::time::Duration;

/// Is `name` a name a Node can have: a lowercase RFC 1123 subdomain, as
/// the API server validates Node names (and the CRD's CEL rule checks
/// `spec.nodeName`)? Any label length: Node names are subdomains, not DNS
/// labels.
pub fn is_node_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

/// What a drain does once its deadline passes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Escalation {
    /// Keep trying and report what blocks it (NodeMaintenance's default).
    #[default]
    Wait,
    /// Delete what eviction could not move, PodDisruptionBudgets
    /// notwithstanding.
    Force,
    /// Give the node back undrained: the maintenance fails, and its owner
    /// skips the node and reports.
    Skip,
}

impl Escalation {
    pub fn parse(s: &str) -> Option<Escalation> {
        match s.trim() {
            "Wait" => Some(Escalation::Wait),
            "Force" => Some(Escalation::Force),
            "Skip" => Some(Escalation::Skip),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Escalation::Wait => "Wait",
            Escalation::Force => "Force",
            Escalation::Skip => "Skip",
        }
    }
}

/// How one NodeMaintenance drains: its deadline and what happens after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DrainOptions {
    pub timeout: Duration,
    pub on_timeout: Escalation,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_names_are_the_api_servers_subdomains() {
        for ok in [
            "worker-1",
            "ip-10-0-0-1.ec2.internal",
            "a",
            &"x".repeat(253),
        ] {
            assert!(is_node_name(ok), "{ok}");
        }
        for bad in [
            "",
            "Worker",
            "-a",
            "a-",
            "a..b",
            "a_b",
            " a",
            &"x".repeat(254),
        ] {
            assert!(!is_node_name(bad), "{bad:?}");
        }
    }

    #[test]
    fn escalations_parse_their_names_only() {
        for e in [Escalation::Wait, Escalation::Force, Escalation::Skip] {
            assert_eq!(Escalation::parse(e.as_str()), Some(e));
        }
        assert_eq!(Escalation::parse("force"), None);
    }
}
