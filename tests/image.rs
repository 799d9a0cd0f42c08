//! The OCI image archives `just image` builds (`image/oci-archive.sh`),
//! checked the way a runtime reads them: the layout's index, manifest,
//! config and layer blobs with their digests and sizes, then the layer
//! unpacked and the binary run from it. Also that a rebuild is
//! byte-identical. Uses `$NODEKEEPER_IMAGE_BIN` (the static binary, in
//! `tests/check`) or else the test build of the binary, and with
//! `$NODEKEEPER_ARM64_BIN` (`just test` sets it) checks the image index of
//! both platforms, the arm64 binary run under qemu-user.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

fn sh(cmd: &mut Command) -> String {
    let out = cmd.output().expect("running a command");
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn sha256(path: &Path) -> String {
    sh(Command::new("sha256sum").arg(path))
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_string()
}

fn binary() -> PathBuf {
    std::env::var_os("NODEKEEPER_IMAGE_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_nodekeeper")))
}

fn temp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("nk-image-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

/// The arm64 binary, when the run has one (`just test`): the archives then
/// hold both platforms.
fn arm64_binary() -> Option<PathBuf> {
    std::env::var_os("NODEKEEPER_ARM64_BIN").map(PathBuf::from)
}

fn build(out: &Path) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("image/oci-archive.sh");
    let mut cmd = Command::new(script);
    cmd.arg(binary()).arg(out);
    if let Some(arm) = arm64_binary() {
        cmd.arg(arm);
    }
    sh(&mut cmd);
}

/// A blob the descriptor `d` names, after checking its digest and size.
fn blob(layout: &Path, d: &Value) -> PathBuf {
    let digest = d["digest"].as_str().expect("digest");
    let hex = digest.strip_prefix("sha256:").expect("a sha256 digest");
    let path = layout.join("blobs/sha256").join(hex);
    assert_eq!(sha256(&path), hex, "{digest}: content does not match");
    let size = std::fs::metadata(&path).expect("blob").len();
    assert_eq!(Some(size), d["size"].as_u64(), "{digest}: size");
    path
}

fn json(path: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(path).expect("read json")).expect("parse json")
}

/// Unpack an OCI archive, verify it, return each platform's (image config,
/// unpacked rootfs) by architecture: the one manifest its index names, or
/// every manifest of the image index it names (multi-platform).
fn open(archive: &Path, want_ref: &str) -> std::collections::BTreeMap<String, (Value, PathBuf)> {
    let dir = archive.with_extension("unpacked");
    let layout = dir.join("layout");
    std::fs::create_dir_all(&layout).expect("mkdir");
    sh(Command::new("tar")
        .arg("-xf")
        .arg(archive)
        .arg("-C")
        .arg(&layout));
    assert_eq!(
        json(&layout.join("oci-layout"))["imageLayoutVersion"],
        "1.0.0"
    );
    let index = json(&layout.join("index.json"));
    assert_eq!(index["schemaVersion"], 2);
    let entries = index["manifests"].as_array().expect("manifests");
    assert_eq!(entries.len(), 1, "one image per archive");
    let entry = &entries[0];
    assert_eq!(
        entry["annotations"]["org.opencontainers.image.ref.name"],
        want_ref
    );
    let platforms: Vec<Value> = if entry["mediaType"] == "application/vnd.oci.image.index.v1+json" {
        let nested = json(&blob(&layout, entry));
        nested["manifests"]
            .as_array()
            .expect("the platforms")
            .clone()
    } else {
        vec![entry.clone()]
    };
    let mut out = std::collections::BTreeMap::new();
    for d in &platforms {
        assert_eq!(d["platform"]["os"], "linux");
        let arch = d["platform"]["architecture"]
            .as_str()
            .expect("an architecture")
            .to_string();
        let manifest = json(&blob(&layout, d));
        assert_eq!(
            manifest["mediaType"],
            "application/vnd.oci.image.manifest.v1+json"
        );
        let config = json(&blob(&layout, &manifest["config"]));
        assert_eq!(
            config["architecture"],
            arch.as_str(),
            "config and index agree"
        );
        let layers = manifest["layers"].as_array().expect("layers");
        assert_eq!(layers.len(), 1);
        assert_eq!(
            layers[0]["mediaType"],
            "application/vnd.oci.image.layer.v1.tar+gzip"
        );
        let layer = blob(&layout, &layers[0]);
        // The config's diff_id is the digest of the uncompressed layer.
        let plain = dir.join(format!("layer-{arch}.tar"));
        let tar = sh(Command::new("sh").arg("-c").arg(format!(
            "gzip -dc '{}' > '{}'",
            layer.display(),
            plain.display()
        )));
        assert!(tar.is_empty());
        assert_eq!(
            config["rootfs"]["diff_ids"][0],
            format!("sha256:{}", sha256(&plain))
        );
        let rootfs = dir.join(format!("rootfs-{arch}"));
        std::fs::create_dir_all(&rootfs).expect("mkdir");
        sh(Command::new("tar")
            .arg("-xf")
            .arg(&plain)
            .arg("-C")
            .arg(&rootfs));
        out.insert(arch, (config, rootfs));
    }
    out
}

/// The platforms the archives must hold.
fn platforms() -> Vec<&'static str> {
    if arm64_binary().is_some() {
        vec!["amd64", "arm64"]
    } else {
        vec!["amd64"]
    }
}

/// Run `bin` (an arm64 one under qemu-user) with `args`.
fn run_as(arch: &str, bin: &Path, args: &[&str]) -> String {
    if arch == "arm64" {
        sh(Command::new("qemu-aarch64-static").arg(bin).args(args))
    } else {
        sh(Command::new(bin).args(args))
    }
}

#[test]
fn the_image_archives_are_valid_oci_and_run_the_binary() {
    let out = temp("build");
    build(&out);
    let bin = binary();
    let version = env!("CARGO_PKG_VERSION");

    let binary_of = |arch: &str| match arch {
        "arm64" => arm64_binary().expect("the arm64 binary"),
        _ => bin.clone(),
    };
    let agent = open(
        &out.join(format!("nodekeeper-{version}.oci.tar")),
        &format!("localhost/nodekeeper:{version}"),
    );
    assert_eq!(
        agent.keys().map(String::as_str).collect::<Vec<_>>(),
        platforms()
    );
    for (arch, (config, rootfs)) in &agent {
        assert_eq!(config["config"]["Entrypoint"][0], "/nodekeeper");
        assert_eq!(config["config"]["User"], "65532:65532");
        let inside = rootfs.join("nodekeeper");
        assert_eq!(
            sha256(&inside),
            sha256(&binary_of(arch)),
            "the {arch} image holds the {arch} binary"
        );
        assert!(
            rootfs
                .join("etc/ssl/certs/ca-certificates.crt")
                .metadata()
                .is_ok_and(|m| m.len() > 0)
        );
        let printed = run_as(arch, &inside, &["version"]);
        assert_eq!(printed.trim(), format!("nodekeeper {version}"));
    }

    let extensions = open(
        &out.join(format!("nodekeeper-talos-extension-{version}.oci.tar")),
        &format!("localhost/nodekeeper-talos-extension:{version}"),
    );
    assert_eq!(
        extensions.keys().map(String::as_str).collect::<Vec<_>>(),
        platforms()
    );
    let ext_archive = out.join(format!("nodekeeper-talos-extension-{version}.oci.tar"));
    for (arch, (_, ext)) in &extensions {
        // Talos's own rules for the rootfs (pkg/machinery/extensions): only
        // regular files, directories and symlinks, none world-writable,
        // every regular file under a prefix Talos allows.
        let layer = ext_archive
            .with_extension("unpacked")
            .join(format!("layer-{arch}.tar"));
        let listing = sh(Command::new("tar").arg("-tvf").arg(&layer));
        let allowed = [
            "/usr/local/",
            "/usr/lib/firmware/",
            "/usr/lib/modules/",
            "/usr/lib/udev/rules.d/",
            "/etc/cri/conf.d/",
        ];
        for line in listing.lines() {
            let perms = line.split_whitespace().next().unwrap_or_default();
            let path = line.split_whitespace().last().unwrap_or_default();
            let kind = perms.chars().next().unwrap_or('?');
            assert!(
                matches!(kind, '-' | 'd' | 'l'),
                "{arch}: a special file: {line}"
            );
            assert_ne!(
                perms.chars().nth(8),
                Some('w'),
                "{arch}: world-writable: {line}"
            );
            if kind == '-'
                && let Some(inside) = path.strip_prefix("rootfs")
            {
                assert!(
                    allowed.iter().any(|a| inside.starts_with(a)),
                    "{arch}: {inside} is outside what Talos allows an extension"
                );
            }
        }
        assert!(
            listing.lines().any(|l| l.ends_with(" manifest.yaml")),
            "{arch}: no manifest.yaml: {listing}"
        );
        let ext_bin = ext.join("rootfs/usr/local/lib/containers/nodekeeper/nodekeeper");
        assert_eq!(sha256(&ext_bin), sha256(&binary_of(arch)));
        let printed = run_as(arch, &ext_bin, &["version"]);
        assert_eq!(printed.trim(), format!("nodekeeper {version}"));
    }
    let (_, ext) = &extensions["amd64"];
    let service = ext.join("rootfs/usr/local/etc/containers/nodekeeper.yaml");
    let generated = nodekeeper::deploy::render("talos", &Default::default()).expect("render");
    let want = generated
        .iter()
        .find(|f| f.path == "rootfs/usr/local/etc/containers/nodekeeper.yaml")
        .expect("service file");
    assert_eq!(
        std::fs::read_to_string(&service).unwrap_or_default(),
        want.content
    );
    assert!(ext.join("manifest.yaml").is_file());
    assert!(
        !ext.join("extension-service-config.yaml").exists(),
        "machine config stays out of the image"
    );

    // The Containerfile's build context is staged next to the archives.
    assert_eq!(sha256(&out.join("context/nodekeeper")), sha256(&bin));

    // Reproducible: a second build gives the same bytes.
    let again = temp("again");
    build(&again);
    for name in [
        format!("nodekeeper-{version}.oci.tar"),
        format!("nodekeeper-talos-extension-{version}.oci.tar"),
    ] {
        assert_eq!(
            sha256(&out.join(&name)),
            sha256(&again.join(&name)),
            "{name} differs between two builds"
        );
    }
    let _ = std::fs::remove_dir_all(&out);
    let _ = std::fs::remove_dir_all(&again);
}
