//! Before a cluster role has listed a node's pods it takes only the steps
//! that read none (`Step::reads_no_pods`): every such step decided without
//! the pods must be the step decided with them, in every world built from
//! these parts.

use super::*;

#[test]
fn a_step_that_reads_no_pods_is_the_same_with_the_pods_unknown() {
    let pod_sets = [
        vec![],
        vec![pod("a", "ReplicaSet")],
        vec![pod("a", "ReplicaSet"), pod("ds", "DaemonSet")],
    ];
    let nodes = [
        None,
        Some(node()),
        Some(maintained("m", false)),
        Some(maintained("m", true)),
        Some(maintained("other", false)),
    ];
    let phases = [
        None,
        Some(Phase::Running),
        Some(Phase::Succeeded),
        Some(Phase::Failed),
    ];
    let (mut worlds, mut fast) = (0, 0);
    for node in &nodes {
        for phase in &phases {
            for finalized in [false, true] {
                for being_deleted in [false, true] {
                    for lease in [None, Some(ts(5)), Some(ts(3000))] {
                        for second in [false, true] {
                            let mut m = nm("m", 0, *phase);
                            if finalized {
                                m.metadata.finalizers = Some(vec![FINALIZER.into()]);
                            }
                            if being_deleted {
                                m = deleting(m);
                            }
                            let mut nms = vec![m];
                            if second {
                                nms.push(nm("later", 1, None));
                            }
                            let mut unknown = World::new(node.clone(), nms);
                            unknown.lease_renew_at = lease;
                            let step = unknown.decide();
                            for pods in &pod_sets {
                                worlds += 1;
                                let mut known = World::new(node.clone(), unknown.nms.clone());
                                known.lease_renew_at = lease;
                                known.pods = pods.clone();
                                if step.reads_no_pods() {
                                    fast += 1;
                                    assert_eq!(
                                        known.decide(),
                                        step,
                                        "node {node:?}, phase {phase:?}, finalizer {finalized}, deleting {being_deleted}, lease {lease:?}, pods {}",
                                        pods.len()
                                    );
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    assert!(fast > 0 && fast < worlds, "{fast} of {worlds} worlds");
}
