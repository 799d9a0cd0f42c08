//! The README's demo, run twice in a row as a newcomer would: the second
//! run must not trip over the first one's namespace, which is still being
//! deleted (it printed "0 to evict", exited 0, then failed), and each run
//! must show the drain blocked by the PodDisruptionBudget and then finish.
//! Its own test binary: the demo makes nodes and a namespace of fixed names.

use std::process::Command;

#[test]
fn the_demo_runs_twice_in_a_row_and_shows_a_blocked_drain() {
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
    }
}
