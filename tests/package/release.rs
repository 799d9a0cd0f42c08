//! The release folder (`image/release.sh`, `just release`): built twice —
//! once in this checkout with the commit's time as its default, once from a
//! copy of the tree in another folder with the binaries at other paths and
//! the time given as a builder without git would — and compared byte for
//! byte, both signed with one test key; its checksums and their
//! signature (OpenSSH's, verified as a user would), its SBOMs against what
//! each binary links, the chart's and the k3s tarball's times, and a
//! folder it must not empty.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::{arm64_binary, binary, run, temp, version};

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn commit_time() -> String {
    run(Command::new("git")
        .arg("-C")
        .arg(repo())
        .args(["log", "-1", "--format=%ct"]))
    .trim()
    .to_string()
}

/// `image/release.sh` from the tree at `tree` into `out`; its output.
fn release(
    tree: &Path,
    out: &Path,
    bins: (&Path, &Path),
    env: &[(&str, &str)],
) -> std::process::Output {
    let mut cmd = Command::new(tree.join("image/release.sh"));
    cmd.current_dir(tree).arg(out).arg(bins.0).arg(bins.1);
    // The default under test is the commit's time: none inherited.
    cmd.env_remove("SOURCE_DATE_EPOCH");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output()
        .unwrap_or_else(|e| panic!("image/release.sh: {e}"))
}

fn succeeded(out: std::process::Output, what: &str) {
    assert!(
        out.status.success(),
        "{what} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Every file of a folder: name → content.
fn files(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    std::fs::read_dir(dir)
        .expect("release folder")
        .map(|e| {
            let e = e.expect("entry");
            let name = e.file_name().to_string_lossy().into_owned();
            (name, std::fs::read(e.path()).expect("read"))
        })
        .collect()
}

/// Who signs the test's releases, as `ssh-keygen -Y verify` names them.
const SIGNER: &str = "release@nodekeeper.test";

/// An Ed25519 key without a passphrase, made once for the module: the
/// private key's path (the public key is beside it, `.pub`).
fn signing_key() -> &'static Path {
    static KEY: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    KEY.get_or_init(|| {
        let key = temp("release-key").join("signing");
        run(Command::new("ssh-keygen")
            .args(["-q", "-t", "ed25519", "-N", "", "-C", SIGNER, "-f"])
            .arg(&key));
        key
    })
}

/// The environment that signs a release with the test key.
fn signed() -> (&'static str, String) {
    (
        "NODEKEEPER_RELEASE_SIGNING_KEY",
        signing_key().to_string_lossy().into_owned(),
    )
}

/// The folder this checkout's release builds, once for the module.
fn first() -> &'static Path {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let out = temp("release-one").join("dist");
        let (k, v) = signed();
        succeeded(
            release(repo(), &out, (&binary(), &arm64_binary()), &[(k, &v)]),
            "the release in this checkout",
        );
        out
    })
}

#[test]
fn two_builds_in_different_folders_give_the_same_bytes() {
    let v = version();
    let a = files(first());
    let names: Vec<&str> = a.keys().map(String::as_str).collect();
    let expected = [
        "SHA256SUMS".to_string(),
        "SHA256SUMS.sig".to_string(),
        format!("nodekeeper-{v}-arm64.raw"),
        format!("nodekeeper-{v}-linux-amd64"),
        format!("nodekeeper-{v}-linux-amd64.cdx.json"),
        format!("nodekeeper-{v}-linux-arm64"),
        format!("nodekeeper-{v}-linux-arm64.cdx.json"),
        format!("nodekeeper-{v}-x86-64.raw"),
        format!("nodekeeper-{v}.oci.tar"),
        format!("nodekeeper-chart-{v}.tgz"),
        format!("nodekeeper-k3s-manifests-{v}.tar.gz"),
        format!("nodekeeper-talos-extension-{v}.oci.tar"),
        format!("nodekeeper_{v}_amd64.deb"),
        format!("nodekeeper_{v}_arm64.deb"),
    ];
    assert_eq!(names, expected, "what the release folder holds");

    // A second checkout: the tree's files (tracked and new, as they are
    // now) in another folder, git's history read from this one (deb.sh
    // names the commit), the binaries at other paths, the time given.
    let base = temp("release-two");
    let tree = base.join("tree");
    std::fs::create_dir_all(tree.join("bin")).expect("mkdir");
    run(Command::new("bash")
        .current_dir(repo())
        .arg("-c")
        .arg(format!(
            "git ls-files -z --cached --others --exclude-standard | xargs -0 cp --parents -t '{}'",
            tree.display()
        )));
    let (a64, arm) = (tree.join("bin/amd64"), tree.join("bin/arm64"));
    std::fs::copy(binary(), &a64).expect("copy");
    std::fs::copy(arm64_binary(), &arm).expect("copy");
    let git_dir = repo().join(".git");
    let epoch = commit_time();
    let out = base.join("elsewhere/dist");
    let (key, path) = signed();
    succeeded(
        release(
            &tree,
            &out,
            (&a64, &arm),
            &[
                (key, &path),
                ("SOURCE_DATE_EPOCH", &epoch),
                ("GIT_DIR", &git_dir.to_string_lossy()),
                ("GIT_WORK_TREE", &tree.to_string_lossy()),
            ],
        ),
        "the release from a copy",
    );
    let b = files(&out);
    assert_eq!(
        a.keys().collect::<Vec<_>>(),
        b.keys().collect::<Vec<_>>(),
        "the same files"
    );
    let differ: Vec<&String> = a
        .iter()
        .filter(|(n, bytes)| b[*n] != **bytes)
        .map(|(n, _)| n)
        .collect();
    assert!(
        differ.is_empty(),
        "these differ between the build in {} and the one in {}: {differ:?}",
        first().display(),
        out.display()
    );
    let _ = std::fs::remove_dir_all(base);
}

#[test]
fn the_checksums_cover_every_file_and_verify() {
    let dir = first();
    let sums = std::fs::read_to_string(dir.join("SHA256SUMS")).expect("SHA256SUMS");
    let listed: Vec<&str> = sums.lines().filter_map(|l| l.split("  ").nth(1)).collect();
    let mut all: Vec<String> = files(dir)
        .into_keys()
        .filter(|n| !n.starts_with("SHA256SUMS"))
        .collect();
    all.sort();
    assert_eq!(
        listed, all,
        "SHA256SUMS lists every other file (but its signature), once"
    );
    run(Command::new("sha256sum")
        .current_dir(dir)
        .args(["--check", "--strict", "SHA256SUMS"]));
    // The binaries are the ones given, unchanged.
    let v = version();
    for (bin, arch) in [(binary(), "amd64"), (arm64_binary(), "arm64")] {
        let shipped =
            std::fs::read(dir.join(format!("nodekeeper-{v}-linux-{arch}"))).expect("binary");
        assert!(
            shipped == std::fs::read(&bin).expect("input"),
            "{arch} binary changed on its way in"
        );
    }
}

/// Each SBOM names every crate its binary links (as `cargo tree` resolves
/// them for that target) at its version, carries the commit's time, a
/// serial number and no path of the checkout.
#[test]
fn each_sbom_lists_every_crate_its_binary_links() {
    let v = version();
    let epoch: i64 = commit_time().parse().expect("commit time");
    for (arch, target) in [
        ("amd64", "x86_64-unknown-linux-musl"),
        ("arm64", "aarch64-unknown-linux-musl"),
    ] {
        let text =
            std::fs::read_to_string(first().join(format!("nodekeeper-{v}-linux-{arch}.cdx.json")))
                .expect("SBOM");
        assert!(
            !text.contains(&*repo().to_string_lossy()),
            "the {arch} SBOM names this checkout's path"
        );
        let bom: serde_json::Value = serde_json::from_str(&text).expect("SBOM is JSON");
        assert_eq!(bom["bomFormat"], "CycloneDX");
        assert_eq!(bom["specVersion"], "1.5");
        let serial = bom["serialNumber"].as_str().expect("serialNumber");
        assert!(
            serial.starts_with("urn:uuid:") && serial.len() == 45,
            "{serial}"
        );
        let stamp = bom["metadata"]["timestamp"].as_str().expect("timestamp");
        let stamp: jiff::Timestamp = stamp.parse().expect("RFC 3339 timestamp");
        assert_eq!(stamp.as_second(), epoch, "the SBOM's time is the commit's");
        assert_eq!(bom["metadata"]["component"]["name"], "nodekeeper");
        assert_eq!(bom["metadata"]["component"]["version"], *v);
        let listed: std::collections::BTreeSet<String> = bom["components"]
            .as_array()
            .expect("components")
            .iter()
            .map(|c| {
                format!(
                    "{} v{}",
                    c["name"].as_str().unwrap_or("?"),
                    c["version"].as_str().unwrap_or("?")
                )
            })
            .collect();
        let linked = run(Command::new("cargo").current_dir(repo()).args([
            "tree",
            "--locked",
            "--offline",
            "-e",
            "normal,no-proc-macro",
            "--target",
            target,
            "--prefix",
            "none",
            "--format",
            "{p}",
        ]));
        let linked: std::collections::BTreeSet<String> = linked
            .lines()
            .map(|l| l.trim_end_matches(" (*)").to_string())
            .filter(|l| !l.is_empty() && !l.starts_with("nodekeeper "))
            .collect();
        assert!(
            linked.len() > 50,
            "cargo tree listed {} crates for {target}",
            linked.len()
        );
        let missing: Vec<&String> = linked.difference(&listed).collect();
        assert!(
            missing.is_empty(),
            "the {arch} SBOM lacks crates its binary links: {missing:?}"
        );
        assert!(
            !listed.iter().any(|c| c.starts_with("windows")),
            "the {arch} SBOM lists Windows-only crates: not what its target resolves"
        );
    }
}

/// The chart (helm's own archive) and the k3s tarball: each entry stamped
/// with the commit's time, the k3s folder whole.
#[test]
fn the_chart_and_the_k3s_folder_carry_the_commits_time() {
    let v = version();
    let epoch: i64 = commit_time().parse().expect("commit time");
    for (archive, first_entry) in [
        (format!("nodekeeper-chart-{v}.tgz"), "nodekeeper/Chart.yaml"),
        (
            format!("nodekeeper-k3s-manifests-{v}.tar.gz"),
            "k3s-manifests/",
        ),
    ] {
        let listing = run(Command::new("tar")
            .args(["--list", "--verbose", "--full-time", "--utc", "-zf"])
            .arg(first().join(&archive)));
        let want = jiff::Timestamp::from_second(epoch)
            .expect("time")
            .strftime("%Y-%m-%d %H:%M:%S")
            .to_string();
        assert!(listing.lines().count() > 3, "{archive}: {listing}");
        for line in listing.lines() {
            assert!(
                line.contains(&want),
                "{archive}: an entry not stamped {want}: {line}"
            );
        }
        assert!(
            listing.lines().any(|l| l.ends_with(first_entry)),
            "{archive} lacks {first_entry}:\n{listing}"
        );
    }
    let k3s = run(Command::new("tar")
        .args(["--list", "-zf"])
        .arg(first().join(format!("nodekeeper-k3s-manifests-{v}.tar.gz"))));
    let tracked = run(Command::new("git")
        .arg("-C")
        .arg(repo())
        .args(["ls-files", "k3s-manifests"]));
    for f in tracked.lines() {
        assert!(k3s.lines().any(|l| l == f), "the k3s tarball lacks {f}");
    }
}

/// A folder that is no release folder is not emptied: the script refuses,
/// says why and leaves the file.
#[test]
fn a_folder_of_other_files_is_refused_not_emptied() {
    let dir = temp("release-refused");
    std::fs::write(dir.join("notes.txt"), "mine").expect("write");
    let out = release(repo(), &dir, (&binary(), &arm64_binary()), &[]);
    assert!(
        !out.status.success(),
        "release.sh emptied a folder of other files"
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no release folder"), "{err}");
    assert_eq!(
        std::fs::read_to_string(dir.join("notes.txt")).expect("kept"),
        "mine"
    );
}

/// `ssh-keygen -Y verify` of SHA256SUMS against the signer's public key,
/// as the README tells a user; whether it verified.
fn verifies(sums: &[u8], sig: &Path) -> bool {
    let dir = temp("release-verify");
    let public = std::fs::read_to_string(signing_key().with_extension("pub")).expect("public key");
    let allowed = dir.join("allowed_signers");
    let line = format!("{SIGNER} namespaces=\"file\" {}", public.trim());
    std::fs::write(&allowed, line).expect("allowed_signers");
    let mut child = Command::new("ssh-keygen")
        .args(["-Y", "verify", "-n", "file", "-I", SIGNER, "-f"])
        .arg(&allowed)
        .arg("-s")
        .arg(sig)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("ssh-keygen");
    use std::io::Write;
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(sums)
        .expect("feeding SHA256SUMS");
    child.wait().expect("ssh-keygen -Y verify").success()
}

/// The signature verifies against the signer's key, and not for a list
/// with one checksum changed.
#[test]
fn the_signature_covers_the_checksums() {
    let dir = first();
    let sums = std::fs::read(dir.join("SHA256SUMS")).expect("SHA256SUMS");
    let sig = dir.join("SHA256SUMS.sig");
    assert!(verifies(&sums, &sig), "the release's own signature");
    let mut changed = sums.clone();
    let i = changed
        .iter()
        .position(|b| b.is_ascii_hexdigit())
        .expect("a digest");
    changed[i] = if changed[i] == b'0' { b'1' } else { b'0' };
    assert!(!verifies(&changed, &sig), "verified a changed SHA256SUMS");
}

/// A signing key that is not there: refused before anything is emptied
/// or written, in one line that names it.
#[test]
fn a_missing_signing_key_is_refused_first() {
    let dir = temp("release-nokey");
    let out = dir.join("dist");
    let result = release(
        repo(),
        &out,
        (&binary(), &arm64_binary()),
        &[("NODEKEEPER_RELEASE_SIGNING_KEY", "/nonexistent/key")],
    );
    assert!(!result.status.success(), "released without its signature");
    let err = String::from_utf8_lossy(&result.stderr);
    assert_eq!(
        err.trim(),
        "release: NODEKEEPER_RELEASE_SIGNING_KEY=/nonexistent/key: no such readable key file"
    );
    assert!(!out.exists(), "wrote {} anyway", out.display());
}
