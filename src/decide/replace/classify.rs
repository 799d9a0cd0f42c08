//! Replacement's classification and status: every governed node in
//! exactly one of Constellation's classes, the NodeVersion status its CLI
//! reads, what holds a rollout up (the status message) and the warnings
//! for escalations.

use super::*;

/// Every governed node in exactly one class (Constellation's rules, first
/// match wins).
#[derive(Debug, Default)]
pub struct Classes<'a> {
    pub obsolete: Vec<&'a Node>,
    pub awaiting: Vec<&'a Node>,
    pub outdated: Vec<&'a Node>,
    pub donors: Vec<&'a Node>,
    pub heirs: Vec<&'a Node>,
    pub mints: Vec<(&'a Node, &'a PendingNode)>,
    pub up_to_date: Vec<&'a Node>,
    pub invalid: Vec<(&'a Node, String)>,
}

impl Classes<'_> {
    /// Nothing left to replace (Constellation counts awaiting nodes here
    /// but not in the condition; see [`status`]).
    pub fn all_up_to_date(&self, pending: usize) -> bool {
        self.outdated.len()
            + self.heirs.len()
            + self.awaiting.len()
            + self.obsolete.len()
            + self.donors.len()
            + pending
            == 0
    }
}

/// Classify the nodes. Annotations the provider answered this round count
/// as if written (they are, in the same round).
pub fn classify<'a>(s: &'a Snapshot) -> Classes<'a> {
    let mut c = Classes::default();
    let components = components_wanted(s);
    for n in s.nodes.iter().map(|n| n.as_ref()) {
        let Some(pid) = provider_id(n) else {
            c.invalid.push((n, "the node has no providerID".into()));
            continue;
        };
        let node_image = match annotation(n, IMAGE_ANNOTATION) {
            Some(i) => i.to_string(),
            None => match s.facts.image_of.get(pid) {
                Some(Ok(i)) => i.clone(),
                Some(Err(e)) => {
                    c.invalid.push((n, e.clone()));
                    continue;
                }
                None => String::new(),
            },
        };
        if annotation(n, SCALING_GROUP_ANNOTATION).is_none()
            && let Some(Err(e)) = s.facts.group_of.get(pid)
        {
            c.invalid.push((n, e.clone()));
            continue;
        }
        let node_components = annotation(n, COMPONENTS_ANNOTATION);
        if annotation(n, OBSOLETE_ANNOTATION) == Some("true") {
            c.obsolete.push(n);
        } else if node_image.is_empty() || (components.is_some() && node_components.is_none()) {
            // nodekeeper compares components only when the NodeVersion
            // names them (Constellation always does): outside
            // Constellation no join service stamps them.
            c.awaiting.push(n);
        } else if differs(s, Some(&node_image), node_components) {
            if annotation(n, HEIR_ANNOTATION).is_some() {
                c.donors.push(n);
            } else if annotation(n, DONOR_ANNOTATION).is_some() {
                // A heir whose image the NodeVersion stopped naming (it
                // changed mid-pair): the pair completes — its donor goes as
                // planned — and the heir, released, is outdated like any
                // other. Constellation calls it outdated at once, which
                // unpairs the donor: both were then replaced, the pool
                // one node larger for good (found by the random worlds).
                c.heirs.push(n);
            } else {
                c.outdated.push(n);
            }
        } else if annotation(n, DONOR_ANNOTATION).is_some() {
            c.heirs.push(n);
        } else if let Some(p) = s.pending.iter().find(|p| {
            p.spec.goal.as_deref() == Some("Join")
                && p.spec.node_name.as_deref() == Some(n.name_any().as_str())
                && state(s, p).as_deref() == Some("Ready")
        }) {
            c.mints.push((n, p));
        } else {
            c.up_to_date.push(n);
        }
    }
    c
}

/// A node's image or Kubernetes components (where the NodeVersion names
/// them) are not the NodeVersion's.
pub(super) fn differs(s: &Snapshot, image: Option<&str>, components: Option<&str>) -> bool {
    let wanted = components_wanted(s);
    !eq(image, s.nv.spec.image.as_deref()) || (wanted.is_some() && !eq(components, wanted))
}

pub(super) fn components_wanted<'a>(s: &'a Snapshot) -> Option<&'a str> {
    s.nv.spec
        .kubernetes_components_reference
        .as_deref()
        .filter(|r| !r.is_empty())
}

/// A PendingNode's CSP state: this round's answer, else its status.
pub(super) fn state(s: &Snapshot, p: &PendingNode) -> Option<String> {
    let pid = p.spec.provider_id.as_deref()?;
    match s.facts.state_of.get(pid) {
        Some(Ok(st)) => Some(st.clone()),
        _ => p.status.as_ref().and_then(|st| st.csp_state.clone()),
    }
}

pub(super) fn reference(n: &Node) -> ObjectReference {
    // Without resourceVersion (Constellation's references carry it): the
    // status would otherwise change with every node heartbeat.
    node_ref(n)
}

pub(super) fn is_control_plane(n: &Node) -> bool {
    n.labels().contains_key(CONTROL_PLANE_LABEL)
}

pub(super) fn group_of<'a>(s: &'a Snapshot, n: &'a Node) -> Option<String> {
    annotation(n, SCALING_GROUP_ANNOTATION)
        .map(str::to_string)
        .or_else(|| {
            let pid = provider_id(n)?;
            s.facts.group_of.get(pid)?.as_ref().ok().cloned()
        })
        .map(|g| g.to_lowercase())
}

/// Paired donors not drained yet while a pod's opt-out holds them (their
/// pods are read for the drain anyway: `retire`).
fn donors_held_by_pods(s: &Snapshot, c: &Classes) -> Vec<String> {
    c.donors
        .iter()
        .filter(|d| {
            maintenance_of(s, &d.name_any()).is_none()
                && !crate::decide::do_not_disrupt::node_holds(d)
        })
        .filter_map(|d| {
            let pods = (s.node_pods)(&d.name_any());
            match crate::decide::rollout::pods_hold(pods, s.now, |_| {}) {
                Some((crate::decide::rollout::WAIT_DO_NOT_DISRUPT, why)) => {
                    Some(format!("node {}: {why}", d.name_any()))
                }
                _ => None,
            }
        })
        .collect()
}

/// The status Constellation's CLI reads, from the classes.
pub fn status(
    s: &Snapshot,
    c: &Classes,
    budget: usize,
    message: Option<String>,
    held_by_pods: &[String],
) -> NodeVersionStatus {
    let refs = |v: &[&Node]| v.iter().map(|n| reference(n)).collect::<Vec<_>>();
    let old = s.nv.status.clone().unwrap_or_default();
    let mut conditions = old.conditions.clone();
    conditions.retain(|c| c.type_ == CONDITION_OUTDATED);
    // Constellation leaves awaiting nodes out of this count and donors
    // too; nodekeeper counts both (a rollout with either is not done), so
    // the CLI never calls a half-finished rollout up to date.
    let out = c.outdated.len()
        + c.heirs.len()
        + s.pending.len()
        + c.obsolete.len()
        + c.awaiting.len()
        + c.donors.len();
    if out == 0 {
        // No node selected: none is outdated, but "every node is up to
        // date" would say it governs some.
        let msg = if s.nodes.is_empty() {
            "No node is selected, so none is out of date"
        } else {
            "Node version of every node is up to date"
        };
        set_condition(
            &mut conditions,
            s.now,
            CONDITION_OUTDATED,
            "False",
            "NodeVersionsUpToDate",
            msg,
        );
    } else {
        let held: Vec<String> = c
            .outdated
            .iter()
            .chain(&c.donors)
            .filter(|n| crate::decide::do_not_disrupt::node_holds(n))
            .map(|n| n.name_any())
            .collect();
        let mut msg = match held.is_empty() {
            true => "Some node versions are out of date".to_string(),
            false => format!(
                "Some node versions are out of date; not replaced while {} is on node {}",
                crate::decide::do_not_disrupt::ANNOTATION,
                held.join(", ")
            ),
        };
        // Nodes a pod's opt-out keeps from getting a surge node, or a
        // paired one from its drain.
        for why in held_by_pods.iter().chain(&donors_held_by_pods(s, c)) {
            msg.push_str("; not replaced while ");
            msg.push_str(why);
        }
        set_condition(
            &mut conditions,
            s.now,
            CONDITION_OUTDATED,
            "True",
            "NodeVersionsOutOfDate",
            &msg,
        );
    }
    NodeVersionStatus {
        outdated: refs(&c.outdated),
        up_to_date: refs(&c.up_to_date),
        donors: refs(&c.donors),
        heirs: refs(&c.heirs),
        mints: c.mints.iter().map(|(n, _)| reference(n)).collect(),
        awaiting_annotation: refs(&c.awaiting),
        pending: s
            .pending
            .iter()
            .map(|p| ObjectReference {
                api_version: Some(format!("{GROUP}/v1alpha1")),
                kind: Some("PendingNode".into()),
                name: Some(p.name_any()),
                uid: p.uid(),
                ..Default::default()
            })
            .collect(),
        obsolete: refs(&c.obsolete),
        invalid: c.invalid.iter().map(|(n, _)| reference(n)).collect(),
        budget: budget as i32,
        conditions,
        activeclusterversionupgrade: false,
        message,
    }
}

/// What holds the rollout up, in one line, and when a drain becomes
/// overdue.
pub(super) fn message(s: &Snapshot, c: &Classes) -> (Option<String>, Option<Duration>) {
    let mut parts: Vec<String> = s.fields.note.iter().cloned().collect();
    if !s.held_elsewhere.is_empty() {
        parts.push(format!(
            "nodes it selects are kept by NodeVersion {}, whose rollout fields cannot be read (its status says why): they are left alone until they can",
            s.held_elsewhere.join(", ")
        ));
    } else if s.nodes.is_empty() && !s.fields.hold {
        parts.push(match (s.governed_elsewhere, &s.nv.spec.node_selector) {
            (0, Some(_)) => "the nodeSelector selects no node".to_string(),
            (0, None) => "there is no node to govern".to_string(),
            (n, _) => format!("every node it selects ({n}) is governed by an older NodeVersion"),
        });
    }
    for (n, why) in &c.invalid {
        parts.push(format!("node {}: {why}", n.name_any()));
    }
    for f in s.failures.values() {
        parts.push(f.message.clone());
    }
    let mut wake = None;
    for d in c.donors.iter().chain(c.obsolete.iter()) {
        if let Some(nm) = maintenance_of(s, &d.name_any())
            && nm.status.as_ref().and_then(|st| st.phase) != Some(Phase::Succeeded)
            && let Some(deadline) = drain_deadline(s, nm)
        {
            if s.now >= deadline {
                parts.push(format!(
                    "the drain of node {} is overdue (over {} s); the node is kept until it finishes",
                    d.name_any(),
                    s.nv.spec.drain_timeout_seconds
                ));
            } else {
                wake = crate::decide::earliest(
                    wake,
                    Some(crate::decide::duration_until(s.now, deadline)),
                );
            }
        }
    }
    for d in c.donors.iter().chain(c.obsolete.iter()) {
        if is_control_plane(d) && internal_ip(d).is_empty() {
            parts.push(format!(
                "control-plane node {} reports no InternalIP address, so its etcd member cannot be named for removal; the node is kept until it reports one",
                d.name_any()
            ));
        }
    }
    for p in s.pending.iter().filter(|p| lifecycle::leave_overdue(s, p)) {
        parts.push(format!(
            "instance {} has not terminated by its deadline; deletion asked again",
            p.spec.provider_id.as_deref().unwrap_or_default()
        ));
    }
    if let (Some(want), Some(have)) = (
        s.nv.spec
            .kubernetes_cluster_version
            .as_deref()
            .filter(|v| !v.is_empty()),
        s.server_version,
    ) && !same_minor_patch(want, have)
    {
        parts.push(format!(
            "kubernetesClusterVersion {want} differs from the API server's {have}: nodekeeper does not run Kubernetes (kubeadm) upgrades; nodes are replaced by image and components only"
        ));
    }
    let msg = (!parts.is_empty()).then(|| parts.join("; "));
    (msg, wake)
}

/// `v1.30.2` vs `v1.30.2+k3s1`: the same release.
pub(super) fn same_minor_patch(a: &str, b: &str) -> bool {
    let core = |v: &str| {
        v.trim_start_matches('v')
            .split(['+', '-'])
            .next()
            .unwrap_or_default()
            .to_string()
    };
    core(a) == core(b)
}

/// Warning events for escalations (the service publishes each once per
/// object and reason).
pub(super) fn overdue_events(s: &Snapshot, c: &Classes) -> Vec<Effect> {
    let mut fx = Vec::new();
    for d in c.donors.iter().chain(c.obsolete.iter()) {
        if let Some(nm) = maintenance_of(s, &d.name_any())
            && nm.status.as_ref().and_then(|st| st.phase) != Some(Phase::Succeeded)
            && drain_deadline(s, nm).is_some_and(|t| s.now >= t)
        {
            fx.push(Effect::Event {
                object: node_ref(d),
                warning: true,
                reason: "DrainOverdue",
                note: format!(
                    "not drained within {} s; kept (not deleted) until the drain finishes",
                    s.nv.spec.drain_timeout_seconds
                ),
            });
        }
    }
    fx
}
