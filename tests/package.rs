//! The Debian packages (`image/deb.sh`, `just deb`), built from the static
//! binaries this run ships: the same bytes from two builds, what dpkg sees
//! inside (files, owners, modes, times, fields, the conffile, the
//! maintainer scripts), systemd's own check of the unit with each drop-in,
//! and lintian's verdict.

mod release;

use std::path::{Path, PathBuf};
use std::process::Command;

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn binary() -> PathBuf {
    std::env::var_os("NODEKEEPER_IMAGE_BIN")
        .map(PathBuf::from)
        .expect("NODEKEEPER_IMAGE_BIN: the static amd64 binary (`just test` sets it)")
}

fn arm64_binary() -> PathBuf {
    std::env::var_os("NODEKEEPER_ARM64_BIN")
        .map(PathBuf::from)
        .expect("NODEKEEPER_ARM64_BIN: the static arm64 binary (`just test` sets it)")
}

fn temp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("nk-deb-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

/// Build both packages into `out`; their paths, amd64 first.
fn build(out: &Path) -> Vec<PathBuf> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("image/deb.sh");
    let printed = run(Command::new(script)
        .arg(out)
        .arg(binary())
        .arg(arm64_binary()));
    printed.lines().map(PathBuf::from).collect()
}

fn version() -> String {
    let v = run(Command::new(binary()).arg("version"));
    v.split_whitespace().nth(1).expect("a version").to_string()
}

/// Both packages, built once for the module.
fn debs() -> &'static [PathBuf] {
    static DEBS: std::sync::OnceLock<Vec<PathBuf>> = std::sync::OnceLock::new();
    DEBS.get_or_init(|| build(&temp("one")))
}

#[test]
fn two_builds_give_the_same_bytes() {
    let again = build(&temp("two"));
    assert_eq!(again.len(), 2);
    for (a, b) in debs().iter().zip(&again) {
        assert_eq!(a.file_name(), b.file_name());
        let (x, y) = (std::fs::read(a).expect("a"), std::fs::read(b).expect("b"));
        assert!(x == y, "{} differs between two builds", a.display());
    }
}

/// The maintainer goes into the control file, the changelog and the
/// copyright file: a value that is not one `Name <address>` line is
/// refused before anything is written (a newline would add fields).
#[test]
fn a_maintainer_that_is_not_one_line_is_refused() {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("image/deb.sh");
    for bad in [
        "ops <ops@example.org>\nEssential: yes",
        "ops",
        "ops <not an address>",
    ] {
        let out_dir = temp("maintainer");
        let out = Command::new(&script)
            .env("NODEKEEPER_DEB_MAINTAINER", bad)
            .arg(&out_dir)
            .arg(binary())
            .output()
            .expect("deb.sh");
        assert!(!out.status.success(), "deb.sh took the maintainer {bad:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("NODEKEEPER_DEB_MAINTAINER must be one line"),
            "{err}"
        );
        let written = std::fs::read_dir(&out_dir).map(|d| d.count()).unwrap_or(0);
        assert_eq!(
            written, 0,
            "deb.sh wrote a package for the maintainer {bad:?}"
        );
    }
}

#[test]
fn each_package_holds_the_binary_the_unit_its_profiles_and_a_conffile() {
    let v = version();
    let epoch = run(Command::new("git").args([
        "-C",
        env!("CARGO_MANIFEST_DIR"),
        "log",
        "-1",
        "--format=%ct",
    ]))
    .trim()
    .parse::<i64>()
    .expect("the commit's time");
    let stamp =
        run(Command::new("date").args(["-u", "-d", &format!("@{epoch}"), "+%Y-%m-%d %H:%M"]));
    for (deb, arch, bin) in [
        (&debs()[0], "amd64", binary()),
        (&debs()[1], "arm64", arm64_binary()),
    ] {
        assert_eq!(
            deb.file_name().and_then(|n| n.to_str()),
            Some(format!("nodekeeper_{v}_{arch}.deb").as_str())
        );
        let field = |f: &str| run(Command::new("dpkg-deb").args(["-f"]).arg(deb).arg(f));
        assert_eq!(field("Package").trim(), "nodekeeper");
        assert_eq!(field("Version").trim(), v);
        assert_eq!(field("Architecture").trim(), arch);
        let listing = run(Command::new("dpkg-deb").arg("-c").arg(deb).env("TZ", "UTC"));
        for (mode, path) in [
            ("-rwxr-xr-x", "./usr/bin/nodekeeper"),
            ("-rw-r--r--", "./usr/lib/systemd/system/nodekeeper.service"),
            (
                "-rw-r--r--",
                "./usr/share/nodekeeper/systemd/reboot-cap-sys-admin.conf",
            ),
            (
                "-rw-r--r--",
                "./usr/share/nodekeeper/systemd/upgrade-host-root.conf",
            ),
            ("-rw-r--r--", "./etc/nodekeeper/nodekeeper.env"),
            ("-rw-r--r--", "./usr/share/doc/nodekeeper/copyright"),
            ("-rw-r--r--", "./usr/share/doc/nodekeeper/changelog.gz"),
        ] {
            let line = listing
                .lines()
                .find(|l| l.ends_with(&format!(" {path}")))
                .unwrap_or_else(|| panic!("{}: no {path}:\n{listing}", deb.display()));
            assert!(
                line.starts_with(&format!("{mode} root/root")),
                "{path}: {line}"
            );
            assert!(
                line.contains(stamp.trim()),
                "{path} stamped at the commit: {line}"
            );
        }
        let tree = temp(&format!("x-{arch}"));
        run(Command::new("dpkg-deb").arg("-x").arg(deb).arg(&tree));
        assert!(
            std::fs::read(tree.join("usr/bin/nodekeeper")).expect("the binary")
                == std::fs::read(&bin).expect("the built binary"),
            "{arch}: the package holds the static binary as built"
        );
        let unit = std::fs::read_to_string(tree.join("usr/lib/systemd/system/nodekeeper.service"))
            .expect("the unit");
        assert!(
            unit.contains("\nExecStart=/usr/bin/nodekeeper run "),
            "{unit}"
        );
        assert!(
            unit.contains("\nCapabilityBoundingSet=\n"),
            "maintenance only: {unit}"
        );
        let control = temp(&format!("c-{arch}"));
        run(Command::new("dpkg-deb").arg("-e").arg(deb).arg(&control));
        assert_eq!(
            std::fs::read_to_string(control.join("conffiles")).expect("conffiles"),
            "/etc/nodekeeper/nodekeeper.env\n"
        );
        let postinst = std::fs::read_to_string(control.join("postinst")).expect("postinst");
        assert!(
            postinst.contains("if [ -d /run/systemd/system ]; then"),
            "starts only where systemd runs: {postinst}"
        );
        let copyright = std::fs::read_to_string(tree.join("usr/share/doc/nodekeeper/copyright"))
            .expect("copyright");
        for crate_ in ["kube-client", "rustls", "smol"] {
            assert!(
                copyright.contains(&format!("\n {crate_} v")),
                "the copyright names {crate_}: {copyright}"
            );
        }
    }
}

/// systemd's own reading of the packaged unit, alone and with each
/// drop-in (`systemd-analyze verify`: every key known and in its section,
/// every value parsed). A drop-in's lines are read as if appended to the
/// unit, so each pair is verified as one file; ExecStart points at the
/// extracted binary (the packaged path does not exist on this machine).
#[test]
fn systemd_reads_the_unit_with_each_profile() {
    let tree = temp("verify");
    run(Command::new("dpkg-deb")
        .arg("-x")
        .arg(&debs()[0])
        .arg(&tree));
    let unit = std::fs::read_to_string(tree.join("usr/lib/systemd/system/nodekeeper.service"))
        .expect("the packaged unit");
    let bin = tree.join("usr/bin/nodekeeper");
    let unit = unit.replace(
        "ExecStart=/usr/bin/nodekeeper",
        &format!("ExecStart={}", bin.display()),
    );
    for dropin in [
        None,
        Some("reboot-cap-sys-admin.conf"),
        Some("upgrade-host-root.conf"),
    ] {
        let mut whole = unit.clone();
        if let Some(name) = dropin {
            let path = tree.join("usr/share/nodekeeper/systemd").join(name);
            whole.push_str(&std::fs::read_to_string(path).expect("the drop-in"));
        }
        let dir = temp(&format!("unit-{}", dropin.unwrap_or("alone")));
        std::fs::write(dir.join("nodekeeper.service"), whole).expect("the unit");
        let out = Command::new("systemd-analyze")
            .args(["verify", "--man=no"])
            .arg(dir.join("nodekeeper.service"))
            .output()
            .expect("running systemd-analyze");
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            out.status.success() && said.trim().is_empty(),
            "{dropin:?}: {said}"
        );
    }
}

/// lintian, as Debian's archive would run it: no error and no warning;
/// each override the package carries says why.
#[test]
fn lintian_accepts_both_packages() {
    assert!(
        Command::new("lintian").arg("--version").output().is_ok(),
        "lintian is missing: tests/install-prereqs installs it"
    );
    for deb in debs() {
        // Not with --show-overrides: lintian 2.116 then fails on the tags
        // it overrode.
        let out = Command::new("lintian")
            .args(["--fail-on", "error,warning", "--display-info"])
            .arg(deb)
            .output()
            .expect("running lintian");
        let said = String::from_utf8_lossy(&out.stdout);
        println!("lintian {}:\n{said}", deb.display());
        assert!(
            out.status.success(),
            "lintian refuses {}:\n{said}{}",
            deb.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// Both system extension images, built once for the module.
fn sysexts() -> &'static [PathBuf] {
    static RAWS: std::sync::OnceLock<Vec<PathBuf>> = std::sync::OnceLock::new();
    RAWS.get_or_init(|| build_sysext(&temp("sysext-one")))
}

fn build_sysext(out: &Path) -> Vec<PathBuf> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("image/sysext.sh");
    let printed = run(Command::new(script)
        .arg(out)
        .arg(binary())
        .arg(arm64_binary()));
    printed.lines().map(PathBuf::from).collect()
}

/// The images are the same bytes from two builds, and systemd's own
/// reading of them (`systemd-dissect`) takes each as a system extension
/// for any distribution on its architecture.
#[test]
fn the_sysext_images_are_reproducible_system_extensions() {
    let v = version();
    let again = build_sysext(&temp("sysext-two"));
    for ((raw, arch), other) in sysexts().iter().zip(["x86-64", "arm64"]).zip(&again) {
        assert_eq!(
            raw.file_name().and_then(|n| n.to_str()),
            Some(format!("nodekeeper-{v}-{arch}.raw").as_str())
        );
        assert!(
            std::fs::read(raw).expect("a") == std::fs::read(other).expect("b"),
            "{} differs between two builds",
            raw.display()
        );
        let said = run(Command::new("systemd-dissect").arg(raw));
        for line in [
            "ID=_any",
            &format!("ARCHITECTURE={arch}"),
            &format!("VERSION_ID={v}"),
            "✓ extension for system",
        ] {
            assert!(
                said.contains(line),
                "{}: no {line:?} in\n{said}",
                raw.display()
            );
        }
    }
}

/// `systemd-sysext merge` (in a mount namespace of its own, on a root
/// folder holding this host's os-release) puts the binary, the unit and
/// its wants link into /usr; the arm64 image is refused on this amd64
/// host by systemd-sysext's architecture rule.
#[test]
fn systemd_sysext_merges_the_image_and_refuses_another_architecture() {
    for (raw, merges) in [(&sysexts()[0], true), (&sysexts()[1], false)] {
        let root = temp(if merges { "merge-ok" } else { "merge-arm64" });
        std::fs::create_dir_all(root.join("usr/lib")).expect("usr");
        std::fs::create_dir_all(root.join("var/lib/extensions")).expect("extensions");
        std::fs::copy("/usr/lib/os-release", root.join("usr/lib/os-release")).expect("os-release");
        let name = raw.file_name().expect("a name");
        std::fs::copy(raw, root.join("var/lib/extensions").join(name)).expect("the image");
        let r = root.display();
        // /run a mount of its own and / shared inside the namespace:
        // systemd-sysext remounts /run and moves its overlay out of a
        // namespace of its own.
        let script = format!(
            "mount --make-rprivate / && mount --make-rshared / && mount -t tmpfs tmpfs /run && \
             systemd-sysext merge --root={r} 2>&1 && {r}/usr/bin/nodekeeper version && \
             cat {r}/usr/lib/systemd/system/multi-user.target.wants/nodekeeper.service"
        );
        let out = Command::new("unshare")
            .args(["-m", "--propagation", "unchanged", "sh", "-c", &script])
            .output()
            .expect("unshare (util-linux), as root");
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        if merges {
            assert!(out.status.success(), "{said}");
            assert!(
                said.contains(&format!("nodekeeper {}", version())),
                "{said}"
            );
            assert!(said.contains("ExecStart=/usr/bin/nodekeeper run"), "{said}");
        } else {
            assert!(!out.status.success(), "{said}");
            assert!(said.contains("incompatible"), "{said}");
        }
    }
}
