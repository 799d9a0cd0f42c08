//! The README's demo, run twice in a row as a newcomer would: the second
//! run must not trip over what the first one left (its namespace still
//! being deleted once made it print "0 to evict", exit 0, then fail), and
//! each run must show its three parts: the drain blocked by the
//! PodDisruptionBudget and then finished; a rolling reboot of the three
//! nodes, each rebooted once to a new boot ID, never more than one of them
//! unavailable by kubectl's own watch; an upgrade with one before-hook Job
//! per node, every node reporting the new version, within the same budget.
//! Its own test binary: the demo makes nodes and a namespace of fixed names.

use std::process::Command;

#[test]
fn the_demo_runs_twice_in_a_row_and_shows_maintenance_a_rolling_reboot_and_an_upgrade() {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/demo.sh");
    for run in 1..=2 {
        let out = Command::new("bash")
            .arg(script)
            .output()
            .expect("running tests/demo.sh");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "run {run} failed:\n{text}");
        // 1. maintenance
        assert!(
            text.contains("2 to evict")
                || text.contains("1 to evict")
                || text.contains("3 to evict"),
            "run {run}: nothing to evict:\n{text}"
        );
        assert!(
            text.contains("← PDB web: needs 6 healthy"),
            "run {run}: no blocked drain shown:\n{text}"
        );
        assert!(
            text.contains("node demo-1 is in maintenance")
                && text.contains("node demo-1 is out of maintenance"),
            "run {run}:\n{text}"
        );
        // 2. the rolling reboot: once each, to a new boot ID (the script
        // itself fails when a boot ID did not change).
        for n in ["demo-1", "demo-2", "demo-3"] {
            assert!(
                text.contains(&format!("{n}: rebooted 1 time(s), boot ID")),
                "run {run}: {n} not rebooted exactly once:\n{text}"
            );
            assert!(
                text.contains(&format!("{n}: upgrade command ran for v2; reports v2")),
                "run {run}: {n} not upgraded once to v2:\n{text}"
            );
        }
        // Both the reboot and the upgrade took one node at a time (and
        // took some: 0 would mean the watch saw nothing).
        let budget = "most nodes unavailable at once (kubectl's own watch): 1 of 3";
        assert_eq!(
            text.matches(budget).count(),
            2,
            "run {run}: a budget of one not held (or nothing seen):\n{text}"
        );
        // 3. one completed before-hook Job per node.
        let jobs: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("demo-backup-"))
            .collect();
        assert_eq!(jobs.len(), 3, "run {run}: hook Jobs {jobs:?}\n{text}");
        for n in ["demo-1", "demo-2", "demo-3"] {
            assert!(
                jobs.iter()
                    .any(|l| l.contains("Complete") && l.trim_end().ends_with(n)),
                "run {run}: no completed before hook for {n}: {jobs:?}"
            );
        }
    }
}
