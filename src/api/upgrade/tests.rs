//! Unit tests of `upgrade`.

use super::*;
use kube::CustomResourceExt;

#[test]
fn crd_is_cluster_scoped_with_short_name_and_columns() {
    let crd = UpgradePlan::crd();
    assert_eq!(
        crd.metadata.name.as_deref(),
        Some("upgradeplans.nodekeeper.io")
    );
    assert_eq!(crd.spec.scope, "Cluster");
    assert_eq!(crd.spec.names.short_names, Some(vec!["upp".to_string()]));
    let json = serde_json::to_string(&crd).unwrap_or_default();
    for needle in [
        "Upgrading",
        "x-kubernetes-preserve-unknown-fields",
        "strategy.type must be InPlace",
    ] {
        assert!(json.contains(needle), "{needle} missing");
    }
}

#[test]
fn a_minimal_spec_takes_the_documented_defaults() {
    let spec: UpgradePlanSpec = serde_json::from_value(serde_json::json!({
        "version": "v1.31.2",
        "strategy": {"command": ["/usr/local/bin/upgrade", "{version}"]}
    }))
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(spec.strategy.type_, "InPlace");
    assert_eq!(spec.strategy.reboot_command, vec!["systemctl", "reboot"]);
    assert_eq!(spec.version_from.source, "KubeletVersion");
    assert_eq!(spec.on_failure, "Pause");
    assert_eq!(spec.deadlines.upgrade_seconds, 1800);
    assert_eq!(spec.budget.max_control_plane, 1);
}
