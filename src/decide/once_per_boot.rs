//! The once-per-ask record of a host reboot (the reboot feature's, and the
//! one after an upgrade): before the command runs, the boot and the ask
//! it serves are written on the node, guarded by the resourceVersion, so
//! that of two writers only one runs it and no crash runs it twice; after
//! it, a failure is recorded on the node with that record as its prefix.
//! Pure: the effects and the reads of those annotations.
//!
//! **A person's request is an epoch.** A record is `<boot>@<epoch>`: the
//! boot it was issued in and the ask it serves — `need=<stamp>` for a
//! reboot need (`reboot-required`, a sentinel), `upgrade=<token>` for the
//! reboot after an upgrade (plan, version, boot and attempt). A new ask of
//! the same kind in the same boot (`reboot-required` after a failure) is
//! not the recorded one, so it runs again under a host-run id of its own;
//! a repeat of one ask never does. An ask of another kind is served by any
//! reboot in the boot (a reboot after an upgrade also serves a reboot
//! need). A record without an epoch (written before epochs) serves every
//! ask of its boot: never a second reboot on an upgrade of nodekeeper.

use crate::api::node::Node;
use kube::ResourceExt;
use serde_json::json;

use crate::api::reboot::{FAILED_ANNOTATION, ISSUED_ANNOTATION, NEEDED_ANNOTATION};
use crate::decide::maintenance::annotation;
use crate::decide::{Effect, HostAction, HostRecord, Outcome};

/// How long a reboot command may run: `systemctl reboot` returns once the
/// shutdown is queued.
pub const REBOOT_COMMAND_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(120);

/// One ask for a reboot: the boot it is to happen in and what asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ask {
    pub boot: String,
    /// `need=<stamp>`, `upgrade=<token>`, or none (a marker with no stamp:
    /// the CoreOS operator's and FLUO's).
    pub epoch: Option<String>,
}

impl Ask {
    /// The reboot feature's ask on `node` in `boot`: its need's stamp.
    pub fn need(node: &Node, boot: &str) -> Ask {
        Ask {
            boot: boot.to_string(),
            epoch: annotation(node, NEEDED_ANNOTATION).map(|s| format!("need={s}")),
        }
    }

    /// The reboot after the upgrade whose command token is `token`.
    pub fn upgrade(boot: &str, token: &str) -> Ask {
        Ask {
            boot: boot.to_string(),
            epoch: Some(format!("upgrade={token}")),
        }
    }

    /// The record's text (and the host-run id's tail).
    pub fn key(&self) -> String {
        match &self.epoch {
            Some(e) => format!("{}@{e}", self.boot),
            None => self.boot.clone(),
        }
    }

    /// Is a record written as `recorded` this ask's? The same boot, and
    /// not another ask of the same kind.
    fn serves(&self, recorded: &str) -> bool {
        let (boot, epoch) = match recorded.split_once('@') {
            Some((b, e)) => (b, Some(e)),
            None => (recorded, None),
        };
        let kind = |e: &str| e.split_once('=').map_or(e, |(k, _)| k).to_string();
        boot == self.boot
            && match (epoch, &self.epoch) {
                (Some(r), Some(a)) => r == a || kind(r) != kind(a),
                _ => true,
            }
    }
}

/// Was a reboot for `ask` issued (in its boot)?
pub fn issued_in(node: &Node, ask: &Ask) -> bool {
    annotation(node, ISSUED_ANNOTATION).is_some_and(|r| ask.serves(r))
}

/// The failure of the reboot command for `ask`, if one was recorded.
pub fn failure_in<'a>(node: &'a Node, ask: &Ask) -> Option<&'a str> {
    let (recorded, why) = annotation(node, FAILED_ANNOTATION)?.split_once(": ")?;
    ask.serves(recorded).then_some(why)
}

/// Issue a reboot for `ask`: first record it on the node, guarded by the
/// resourceVersion (of two writers only one succeeds, and a failed write
/// stops the plan before the command), then run the action: on this host
/// (a command or Talos's API), or from here (the cluster role's
/// `reboot.remoteCommand`). The host-run id names the ask, so a new ask
/// runs and a repeat attaches to the first run.
pub fn issue(node: &Node, ask: &Ask, action: HostAction) -> Vec<Effect> {
    let n = node.name_any();
    let key = ask.key();
    vec![
        Effect::PatchNode {
            node: n.clone(),
            resource_version: node.resource_version(),
            patch: json!({"metadata": {"annotations": {ISSUED_ANNOTATION: key}}}),
        },
        Effect::RunHost {
            id: format!("reboot/{n}/{key}"),
            node: n,
            action,
            record: HostRecord {
                annotation: FAILED_ANNOTATION,
                failed: format!("{key}: "),
                succeeded: None,
            },
            timeout: REBOOT_COMMAND_TIMEOUT,
        },
    ]
}

/// After a host command: its result is recorded on the node as the effect
/// says (a failed reboot: the policy gives the node back and reports it;
/// a reboot that succeeded needs nothing — the node goes down and comes
/// back with a new boot ID).
pub fn after_command(effect: &Effect, outcome: &Outcome) -> Option<Effect> {
    let (Effect::RunHost { node, record, .. }, Outcome::HostRan { ok, output }) = (effect, outcome)
    else {
        return None;
    };
    let value = match (ok, &record.succeeded) {
        (false, _) => format!("{}{output}", record.failed),
        (true, Some(v)) => v.clone(),
        (true, None) => return None,
    };
    Some(Effect::PatchNode {
        node: node.clone(),
        // One key of our own; nothing to lose in a concurrent change.
        resource_version: None,
        patch: json!({"metadata": {"annotations": {record.annotation: value}}}),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(annotations: &[(&str, &str)]) -> Node {
        let mut n = Node::default();
        n.metadata.name = Some("n1".into());
        n.metadata.annotations = Some(
            annotations
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        n
    }

    /// where-features-meet.md, finding 1: `reboot-required` after a failed
    /// reboot in the same boot is a new ask; its command runs.
    #[test]
    fn a_new_ask_in_the_same_boot_is_not_the_failed_one() {
        let first = node(&[(NEEDED_ANNOTATION, "t1")]);
        let ask1 = Ask::need(&first, "b1");
        let effects = issue(&first, &ask1, HostAction::Command(vec!["true".into()]));
        let Effect::RunHost { id, record, .. } = &effects[1] else {
            panic!("{effects:?}")
        };
        assert_eq!(id, "reboot/n1/b1@need=t1");
        let failed = format!("{}exit 1", record.failed);
        let after = node(&[
            (NEEDED_ANNOTATION, "t1"),
            (ISSUED_ANNOTATION, "b1@need=t1"),
            (FAILED_ANNOTATION, &failed),
        ]);
        assert!(issued_in(&after, &ask1));
        assert_eq!(failure_in(&after, &ask1), Some("exit 1"));
        // The person asks again: a newer stamp.
        let again = node(&[(NEEDED_ANNOTATION, "t2"), (ISSUED_ANNOTATION, "b1@need=t1")]);
        let ask2 = Ask::need(&again, "b1");
        assert!(!issued_in(&again, &ask2));
        assert_eq!(failure_in(&after, &ask2), None);
        let Effect::RunHost { id, .. } = &issue(&again, &ask2, HostAction::TalosReboot)[1] else {
            panic!()
        };
        assert_eq!(id, "reboot/n1/b1@need=t2");
    }

    #[test]
    fn a_record_serves_its_boot_only_and_other_kinds_of_ask() {
        let n = node(&[(ISSUED_ANNOTATION, "b1@upgrade=p/v1/b1/3")]);
        // The reboot after an upgrade serves a reboot need of that boot.
        assert!(issued_in(
            &n,
            &Ask::need(&node(&[(NEEDED_ANNOTATION, "t")]), "b1")
        ));
        assert!(!issued_in(&n, &Ask::need(&n, "b2")));
        // Another attempt of the upgrade is a new ask.
        assert!(!issued_in(&n, &Ask::upgrade("b1", "p/v1/b1/4")));
        assert!(issued_in(&n, &Ask::upgrade("b1", "p/v1/b1/3")));
        // Written before epochs: serves every ask of its boot.
        let old = node(&[(ISSUED_ANNOTATION, "b1"), (FAILED_ANNOTATION, "b1: exit 1")]);
        let ask = Ask::need(&node(&[(NEEDED_ANNOTATION, "t9")]), "b1");
        assert!(issued_in(&old, &ask));
        assert_eq!(failure_in(&old, &ask), Some("exit 1"));
        // A withdrawn need does not make an issued reboot look unissued.
        let issued = node(&[(ISSUED_ANNOTATION, "b1@need=t1")]);
        assert!(issued_in(&issued, &Ask::need(&issued, "b1")));
    }
}
