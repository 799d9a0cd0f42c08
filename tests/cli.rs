//! The command line as people type it: `--flag=value`, durations with a
//! unit, output piped into `head`, usage errors with their own exit code,
//! and a node name that does not exist answered with a hint about the name
//! (not about `--node`, which these commands do not take).

use crate::support;

use std::process::Command;

use support::run_cli;

#[test]
fn flags_take_an_equals_sign_as_well_as_a_space() {
    let (spaced, with_space, _) = run_cli(&["manifests", "--for", "rbac"], &[]);
    let (equals, with_equals, err) = run_cli(&["manifests", "--for=rbac"], &[]);
    assert!(spaced.success() && equals.success(), "{err}");
    assert!(!with_space.is_empty());
    assert_eq!(with_space, with_equals);
}

#[test]
fn durations_take_a_unit_and_a_bad_one_is_a_usage_error() {
    // Accepted: the run goes on to look for credentials (and fails there).
    let (status, _, err) = run_cli(
        &[
            "run",
            "--drain-timeout",
            "2m",
            "--provider-timeout=90s",
            "--kubeconfig",
            "/nonexistent/kubeconfig",
            "--metrics-address",
            "off",
        ],
        &[],
    );
    assert!(!status.success());
    assert!(!err.contains("duration"), "{err}");
    assert!(err.contains("/nonexistent/kubeconfig"), "{err}");
    // Refused as usage (exit 2), naming what a duration may be.
    let (status, _, err) = run_cli(&["run", "--drain-timeout", "10d"], &[]);
    assert_eq!(status.code(), Some(2), "{err}");
    assert!(err.contains("the unit must be s, m or h"), "{err}");
    let (status, _, err) = run_cli(&["maintain"], &[]);
    assert_eq!(status.code(), Some(2), "a missing argument: {err}");
}

#[test]
fn output_into_a_reader_that_goes_away_ends_quietly() {
    // The CRDs are far more than a pipe holds, so the write meets the
    // closed pipe (it panicked: exit 134 and a backtrace).
    let out = Command::new("bash")
        .args([
            "-c",
            "set -o pipefail; \"$0\" crds | head -1 >/dev/null",
            env!("CARGO_BIN_EXE_nodekeeper"),
        ])
        .output()
        .expect("running bash");
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(out.status.success(), "exit {:?}: {err}", out.status.code());
    assert!(err.is_empty(), "{err}");
}

#[test]
fn a_node_that_does_not_exist_is_answered_about_its_name() {
    // The commands check the CRDs first; alone on a fresh cluster this
    // test found none.
    support::install_crds();
    let kc = support::cluster().to_string_lossy().to_string();
    for args in [
        vec!["maintain", "no-such-node-here"],
        vec!["drain", "--dry-run", "no-such-node-here"],
        vec!["reboot-required", "no-such-node-here"],
    ] {
        let mut full = args.clone();
        full.extend(["--kubeconfig", &kc]);
        let (status, _, err) = run_cli(&full, &[]);
        assert!(!status.success(), "{args:?}");
        assert!(
            err.contains("\"no-such-node-here\" does not exist")
                && err.contains("kubectl get nodes")
                && !err.contains("NODE_NAME"),
            "{args:?}: {err}"
        );
    }
}

#[test]
fn withdrawing_a_reboot_request_says_what_changed() {
    support::install_crds();
    let (_env, node) = support::block_on(async {
        let mut env = support::TestEnv::new("cli-clear").await;
        let n = env.add_node("a").await;
        (env, n)
    });
    let kc = support::cluster().to_string_lossy().to_string();
    let ask = |extra: &[&str]| {
        let mut args = vec!["reboot-required", node.as_str(), "--kubeconfig", &kc];
        args.extend(extra);
        let (status, out, err) = run_cli(&args, &[]);
        assert!(status.success(), "{args:?}: {err}");
        out
    };
    ask(&[]);
    let out = ask(&["--clear"]);
    assert!(out.contains("reboot request withdrawn"), "{out}");
    let out = ask(&["--clear"]);
    assert!(out.contains("had no reboot request"), "{out}");
}

/// `just --list` shows only the comment line right above a recipe: every
/// recipe with a longer comment carries a one-line `[doc]` (the list
/// showed the last line of each, "table, asserts nothing.").
#[test]
fn every_recipe_is_listed_with_a_whole_sentence() {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/Justfile"))
        .expect("reading the Justfile");
    let lines: Vec<&str> = text.lines().collect();
    let mut bad = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let is_recipe = line.split_once(':').is_some_and(|(name, _)| {
            !name.is_empty()
                && name
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c == '-' || c == ' ' || c.is_ascii_digit())
        }) && !line.starts_with(' ')
            && !line.contains(":=");
        if !is_recipe || i == 0 {
            continue;
        }
        let above = lines[i - 1];
        let ok = above.starts_with("[doc(")
            || (above.starts_with("# ") && (i < 2 || !lines[i - 2].starts_with('#')));
        if !ok {
            bad.push(line.to_string());
        }
    }
    assert!(bad.is_empty(), "recipes listed with a fragment: {bad:?}");
}

/// Linked as `kubectl-nodekeeper` on PATH, the binary is a kubectl plugin:
/// the real kubectl finds it, runs `kubectl nodekeeper status` against the
/// test cluster, and the usage line names the command as typed.
#[test]
fn linked_as_kubectl_nodekeeper_it_runs_as_a_kubectl_plugin() {
    support::install_crds();
    let dir = support::scratch().join(format!("kubectl-plugin-{}", support::rand_u64()));
    std::fs::create_dir_all(&dir).expect("a plugin folder");
    std::os::unix::fs::symlink(
        env!("CARGO_BIN_EXE_nodekeeper"),
        dir.join("kubectl-nodekeeper"),
    )
    .expect("linking the plugin");
    let path = format!(
        "{}:{}",
        dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let kubectl = |args: &[&str]| {
        Command::new(support::bin_dir().join("kubectl"))
            .args(args)
            .env("PATH", &path)
            .env("KUBECONFIG", support::cluster())
            .output()
            .expect("running kubectl")
    };
    let list = kubectl(&["plugin", "list"]);
    let listed = String::from_utf8_lossy(&list.stdout);
    assert!(listed.contains("kubectl-nodekeeper"), "{listed}");
    let help = kubectl(&["nodekeeper", "--help"]);
    let usage = String::from_utf8_lossy(&help.stdout);
    assert!(help.status.success(), "{usage}");
    assert!(usage.starts_with("Usage: kubectl nodekeeper"), "{usage}");
    let status = kubectl(&["nodekeeper", "status"]);
    assert!(
        status.status.success() && String::from_utf8_lossy(&status.stdout).contains("NODE"),
        "{}{}",
        String::from_utf8_lossy(&status.stdout),
        String::from_utf8_lossy(&status.stderr)
    );
}
