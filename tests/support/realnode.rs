//! Shared by the real-node and real-machine test binaries: each uses a part.
#![allow(dead_code)]
//! Real nodes for the tests that kwok cannot answer: a real kubelet and a
//! private containerd with runc, and one kube-proxy for the machine
//! (`tests/realnode/node.sh`), registered with the test control plane beside
//! the kwok nodes. [`real_node`] brings one
//! up (or finds it up) and reads what `node.sh env` wrote; tests on it take
//! [`exclusive`], because they share the one node and its host paths.
//!
//! The nodes are labelled `nodekeeper.test/real-node=true` and tainted with
//! the same key (NoSchedule), so other tests' workloads never land there;
//! a test's own workload tolerates the taint.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::Duration;

/// The taint (and label) key of the real nodes.
pub const REAL_NODE_KEY: &str = "nodekeeper.test/real-node";

/// One real node, as `node.sh env` describes it.
#[derive(Clone, Debug)]
pub struct RealNode {
    pub name: String,
    /// `ctr` with this node's containerd address and the `k8s.io` namespace.
    pub ctr: Vec<String>,
    /// The kubelet's staticPodPath.
    pub manifests: PathBuf,
}

impl RealNode {
    /// `node.sh SUBCOMMAND ARGS` (restarts and logs), panicking with its
    /// output if it fails.
    pub fn script(&self, args: &[&str]) -> String {
        let out = Command::new("bash")
            .arg(script())
            .args(args)
            .stderr(Stdio::piped())
            .output()
            .expect("running node.sh");
        assert!(
            out.status.success(),
            "node.sh {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/realnode/node.sh")
}

/// Bring one real node up (or find it up) and describe it. Fails loudly,
/// with the components' logs, if it cannot start: never a skip.
pub fn real_node() -> &'static RealNode {
    static NODE: OnceLock<RealNode> = OnceLock::new();
    NODE.get_or_init(|| {
        let env = up(&["1"], "the real node");
        let get = |k: &str| {
            env.get(k)
                .cloned()
                .unwrap_or_else(|| panic!("node.sh env has no {k}"))
        };
        RealNode {
            name: get("NODEKEEPER_REALNODE_NAME"),
            ctr: get("NODEKEEPER_REALNODE_CTR")
                .split_whitespace()
                .map(str::to_string)
                .collect(),
            manifests: PathBuf::from(get("NODEKEEPER_REALNODE_MANIFESTS")),
        }
    })
}

/// `node.sh up ARGS` (the control plane started first) and the `KEY=value`
/// lines it prints. Fails loudly, with the components' logs, if `what`
/// cannot start: never a skip.
pub fn up(args: &[&str], what: &str) -> HashMap<String, String> {
    crate::support::cluster();
    let out = Command::new("bash")
        .arg(script())
        .arg("up")
        .args(args)
        .stderr(Stdio::inherit())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", script().display()));
    assert!(
        out.status.success(),
        "{what} did not start ({}); node.sh's output and log tails are above",
        out.status
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.trim_matches('\'').to_string()))
        .collect()
}

/// A README recipe, as a list of command lines, comments dropped: the first
/// `sh` block under the heading `### {heading}`.
pub fn readme_recipe(heading: &str) -> Vec<String> {
    let readme = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md"))
        .expect("README.md");
    let section = readme
        .split(&format!("\n### {heading}\n"))
        .nth(1)
        .unwrap_or_else(|| panic!("README has no '### {heading}' section"));
    let block = section
        .split("\n### ")
        .next()
        .and_then(|s| s.split("```sh\n").nth(1))
        .and_then(|b| b.split("\n```").next())
        .unwrap_or_else(|| panic!("the README's '{heading}' section has no sh block"));
    block
        .lines()
        .map(|l| l.split(" #").next().unwrap_or(l).trim().to_string())
        .filter(|l| !l.is_empty())
        .collect()
}

/// One real-node test at a time: they share the node, its static pod
/// folder and the host's /etc/nodekeeper.
pub fn exclusive() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

/// The static binary's OCI archive (`image/oci-archive.sh`), built once per
/// test run into a temporary folder. The image must hold the static binary:
/// `$NODEKEEPER_IMAGE_BIN` (`just test` and `tests/check` set it).
pub fn image_archive() -> &'static Path {
    static ARCHIVE: OnceLock<PathBuf> = OnceLock::new();
    ARCHIVE.get_or_init(|| {
        let bin = std::env::var_os("NODEKEEPER_IMAGE_BIN")
            .map(PathBuf::from)
            .expect(
                "the real-node tests run the image, which needs the static binary: \
             set NODEKEEPER_IMAGE_BIN (just test does: just build-static first)",
            );
        let out = crate::support::scratch().join("nk-realnode-image");
        let _ = std::fs::remove_dir_all(&out);
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("image/oci-archive.sh");
        // Both platforms when the run has the arm64 binary (`just test`):
        // containerd imports the image index as users get it.
        let mut cmd = Command::new(script);
        cmd.arg(&bin).arg(&out);
        if let Some(arm) = std::env::var_os("NODEKEEPER_ARM64_BIN") {
            cmd.arg(arm);
        }
        let st = cmd.status().expect("running oci-archive.sh");
        assert!(st.success(), "image/oci-archive.sh failed");
        std::fs::read_dir(&out)
            .expect("the archive folder")
            .filter_map(|e| e.ok().map(|e| e.path()))
            .find(|p| {
                p.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
                    n.starts_with("nodekeeper-") && !n.contains("talos") && n.ends_with(".oci.tar")
                })
            })
            .expect("oci-archive.sh wrote no nodekeeper-*.oci.tar")
    })
}

/// Processes whose command line contains every one of `words`: (pid,
/// command line with spaces).
pub fn processes_with(words: &[&str]) -> Vec<(u32, String)> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(raw) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let line = String::from_utf8_lossy(&raw).replace('\0', " ");
        if words.iter().all(|w| line.contains(w)) {
            found.push((pid, line.trim().to_string()));
        }
    }
    found
}

/// A field of /proc/PID/status (e.g. "Uid", "CapEff").
pub fn proc_status(pid: u32, field: &str) -> Option<String> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .map(|v| v.trim().to_string())
}

/// Wait (bounded, polling the host, not the product) until `check` holds.
pub fn wait_host(what: &str, limit: Duration, mut check: impl FnMut() -> bool) {
    let start = std::time::Instant::now();
    while !check() {
        assert!(
            start.elapsed() < limit,
            "timed out after {limit:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}
