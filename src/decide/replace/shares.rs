//! Which nodes each NodeVersion governs when their selectors overlap, and
//! what each knows of the others.
//!
//! The oldest NodeVersion selecting a node governs it (by creation time,
//! then name), so two never act on one node; a younger one counts the
//! nodes its selector matches that an older one governs
//! ([`Snapshot::governed_elsewhere`], for its status's message). One whose
//! rollout fields cannot be read ([`Reading::hold`]) acts on none of its
//! nodes, and they stay its: no younger one takes them meanwhile. One this
//! role does not handle (another shard's, `service::roles`) takes none and
//! is not counted among the others. Its work in progress, or a status not
//! yet written, holds the others' surges ([`Snapshot::others_busy`],
//! [`Snapshot::others_unknown`]).

use std::collections::{BTreeSet, HashMap};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use super::*;
use crate::decide::selector::selector_matches;

/// One NodeVersion's part of the nodes this round.
#[derive(Debug, Default)]
pub struct Share {
    /// The nodes it governs.
    pub nodes: Vec<Arc<Node>>,
    /// Nodes its selector matches that an older NodeVersion governs.
    pub governed_elsewhere: usize,
    /// The older NodeVersions among those that hold (their rollout fields
    /// cannot be read) and keep nodes its selector matches.
    pub held_by: Vec<String>,
    /// Another NodeVersion this role handles has work in its status.
    pub others_busy: bool,
    /// Another one this role handles has written no status yet.
    pub others_unknown: bool,
}

/// Sort NodeVersions oldest first: the order [`shares`] gives nodes in.
pub fn oldest_first(nvs: &mut [Arc<NodeVersion>]) {
    nvs.sort_by_key(|v| {
        (
            v.metadata.creation_timestamp.as_ref().map(|t| t.0),
            v.name_any(),
        )
    });
}

/// Each NodeVersion's share of `nodes`, in the order of `nvs` (oldest
/// first: [`oldest_first`]), each given with whether it holds; `None` for
/// one whose selector `handled` refuses.
pub fn shares(
    nvs: &[(Arc<NodeVersion>, bool)],
    handled: &dyn Fn(Option<&LabelSelector>) -> bool,
    nodes: &[Arc<Node>],
) -> Vec<Option<Share>> {
    // Each node given so far, with the name of the NodeVersion it went to
    // if that one holds.
    let mut taken: HashMap<String, Option<String>> = HashMap::new();
    nvs.iter()
        .map(|(nv, hold)| {
            let selector = nv.spec.node_selector.as_ref();
            if !handled(selector) {
                return None;
            }
            let (mine, elsewhere): (Vec<Arc<Node>>, Vec<Arc<Node>>) = nodes
                .iter()
                .filter(|n| selector.is_none_or(|s| selector_matches(s, n.labels())))
                .cloned()
                .partition(|n| !taken.contains_key(&n.name_any()));
            let held_by: BTreeSet<String> = elsewhere
                .iter()
                .filter_map(|n| taken.get(&n.name_any()).cloned().flatten())
                .collect();
            let keeper = hold.then(|| nv.name_any());
            taken.extend(mine.iter().map(|n| (n.name_any(), keeper.clone())));
            // A held one keeps its nodes from the younger ones and acts on
            // none: handed to a younger overlapping NodeVersion while its
            // record could not be read, they were rolled to that one's
            // image and back again once it could (a fight over each node).
            let mine = if *hold { Vec::new() } else { mine };
            let others: Vec<&NodeVersion> = nvs
                .iter()
                .map(|(o, _)| o.as_ref())
                .filter(|o| o.uid() != nv.uid() && handled(o.spec.node_selector.as_ref()))
                .collect();
            Some(Share {
                nodes: mine,
                governed_elsewhere: elsewhere.len(),
                held_by: held_by.into_iter().collect(),
                others_busy: others.iter().any(|o| busy(o)),
                others_unknown: others.iter().any(|o| o.status.is_none()),
            })
        })
        .collect()
}

/// Does its status list work in progress?
fn busy(nv: &NodeVersion) -> bool {
    nv.status.as_ref().is_some_and(|st| {
        !st.outdated.is_empty()
            || !st.pending.is_empty()
            || !st.heirs.is_empty()
            || !st.donors.is_empty()
            || !st.obsolete.is_empty()
            || !st.awaiting_annotation.is_empty()
    })
}
