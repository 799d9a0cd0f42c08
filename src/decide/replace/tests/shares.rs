//! Overlapping NodeVersions: the oldest selecting a node governs it, the
//! younger count it as governed elsewhere, a held one acts on none of
//! its nodes and keeps them from the younger, one of another shard takes
//! nothing, and the others' work is seen only from those this
//! role handles.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use super::*;

/// A NodeVersion created `age` minutes before now selecting `team=<team>`
/// (or every node), with a status unless `status` is `None`.
fn version(
    name: &str,
    age: i64,
    team: Option<&str>,
    status: Option<NodeVersionStatus>,
) -> Arc<NodeVersion> {
    let mut v = nv("img-2", 1);
    v.metadata.name = Some(name.into());
    v.metadata.uid = Some(format!("uid-{name}"));
    v.metadata.creation_timestamp = Some(Time(
        now() - k8s_openapi::jiff::SignedDuration::from_mins(age),
    ));
    v.spec.node_selector = team.map(|t| LabelSelector {
        match_labels: Some([("team".to_string(), t.to_string())].into()),
        ..Default::default()
    });
    v.status = status;
    Arc::new(v)
}

/// Nodes of team a (every test node is) and, with `b`, team b.
fn nodes(b: &[&str]) -> Vec<Arc<Node>> {
    let mut all = vec![node("a1", "g", "img-1", &[]), node("a2", "g", "img-1", &[])];
    for name in b {
        let mut n = (*node(name, "g", "img-1", &[])).clone();
        n.metadata
            .labels
            .get_or_insert_default()
            .insert("team".into(), "b".into());
        all.push(Arc::new(n));
    }
    all
}

fn names(share: &Option<Share>) -> Vec<String> {
    share
        .as_ref()
        .map(|s| s.nodes.iter().map(|n| n.name_any()).collect())
        .unwrap_or_default()
}

fn every(_: Option<&LabelSelector>) -> bool {
    true
}

#[test]
fn the_oldest_selecting_a_node_governs_it_and_the_younger_count_it() {
    // Listed youngest first: oldest_first puts the pool's one first.
    let mut nvs = vec![
        version("cluster", 5, None, Some(Default::default())),
        version("pool-a", 60, Some("a"), Some(Default::default())),
    ];
    oldest_first(&mut nvs);
    assert_eq!(nvs[0].name_any(), "pool-a");
    let given: Vec<_> = nvs.into_iter().map(|v| (v, false)).collect();
    let shares = shares(&given, &every, &nodes(&["b1"]));
    assert_eq!(names(&shares[0]), ["a1", "a2"]);
    assert_eq!(shares[0].as_ref().unwrap().governed_elsewhere, 0);
    assert_eq!(names(&shares[1]), ["b1"]);
    assert_eq!(shares[1].as_ref().unwrap().governed_elsewhere, 2);
}

#[test]
fn one_created_in_the_same_second_yields_to_the_name_before_it() {
    let mut nvs = vec![
        version("b-version", 10, None, Some(Default::default())),
        version("a-version", 10, None, Some(Default::default())),
    ];
    oldest_first(&mut nvs);
    let given: Vec<_> = nvs.into_iter().map(|v| (v, false)).collect();
    let shares = shares(&given, &every, &nodes(&[]));
    assert_eq!(given[0].0.name_any(), "a-version");
    assert_eq!(names(&shares[0]), ["a1", "a2"]);
    assert!(names(&shares[1]).is_empty());
    assert_eq!(shares[1].as_ref().unwrap().governed_elsewhere, 2);
}

#[test]
fn a_held_version_governs_nothing() {
    let given = vec![(version("pool-a", 60, Some("a"), None), true)];
    let shares = shares(&given, &every, &nodes(&[]));
    let share = shares[0].as_ref().unwrap();
    assert!(share.nodes.is_empty());
    assert_eq!(share.governed_elsewhere, 0);
}

#[test]
fn a_held_version_keeps_its_nodes_from_a_younger_one() {
    // pool-a's record cannot be read: it acts on none of its nodes, and
    // the younger cluster-wide one does not take them meanwhile (it would
    // roll them to its image, and pool-a back to its own once readable).
    let given = vec![
        (
            version("pool-a", 60, Some("a"), Some(Default::default())),
            true,
        ),
        (version("cluster", 5, None, Some(Default::default())), false),
    ];
    let shares = shares(&given, &every, &nodes(&["b1"]));
    assert!(names(&shares[0]).is_empty());
    assert_eq!(names(&shares[1]), ["b1"]);
    assert_eq!(shares[1].as_ref().unwrap().governed_elsewhere, 2);
    assert_eq!(shares[1].as_ref().unwrap().held_by, ["pool-a"]);
    assert!(shares[0].as_ref().unwrap().held_by.is_empty());
}

#[test]
fn another_shards_version_takes_nothing_and_is_not_among_the_others() {
    let busy = NodeVersionStatus {
        outdated: vec![Default::default()],
        ..Default::default()
    };
    let given = vec![
        (version("pool-a", 60, Some("a"), Some(busy)), false),
        (version("cluster", 5, None, Some(Default::default())), false),
        (version("new", 1, Some("c"), None), false),
    ];
    // This role handles every selector but team=a's.
    let not_a = |s: Option<&LabelSelector>| {
        s.and_then(|s| s.match_labels.as_ref())
            .is_none_or(|l| l.get("team").map(String::as_str) != Some("a"))
    };
    let shares = shares(&given, &not_a, &nodes(&["b1"]));
    assert!(shares[0].is_none());
    let cluster = shares[1].as_ref().unwrap();
    assert_eq!(names(&shares[1]), ["a1", "a2", "b1"]);
    // pool-a's work is another shard's; "new" has written no status yet.
    assert!(!cluster.others_busy);
    assert!(cluster.others_unknown);
    let new = shares[2].as_ref().unwrap();
    assert!(new.nodes.is_empty());
    assert!(!new.others_busy && !new.others_unknown);
}

#[test]
fn work_in_another_versions_status_is_seen_by_the_rest() {
    let busy = NodeVersionStatus {
        donors: vec![Default::default()],
        ..Default::default()
    };
    let given = vec![
        (version("pool-a", 60, Some("a"), Some(busy)), false),
        (
            version("pool-b", 5, Some("b"), Some(Default::default())),
            false,
        ),
    ];
    let shares = shares(&given, &every, &nodes(&["b1"]));
    assert!(!shares[0].as_ref().unwrap().others_busy);
    assert!(shares[1].as_ref().unwrap().others_busy);
}
