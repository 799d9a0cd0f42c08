//! nodekeeper's Debian package on a running machine (the image installed
//! it while being built, see tests/osimage/image.sh): a newer version
//! installed with dpkg, as an operator or a configuration tool would, restarts
//! the agent through the package's postinst and reboots nothing; the
//! operator's env file (a conffile) and drop-ins stay.

use super::*;

/// `image/deb.sh` for the machines' binary, with the Debian version
/// `version`: the package's path.
fn deb_of_version(version: &str) -> std::path::PathBuf {
    let out = support::scratch().join(format!("deb-{version}-{:x}", support::rand_u64()));
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("image/deb.sh");
    let run = Command::new(script)
        .arg(&out)
        .arg(osmachine::shipped_binary())
        .env("NODEKEEPER_DEB_VERSION", version)
        .output()
        .expect("running image/deb.sh");
    assert!(
        run.status.success(),
        "image/deb.sh: {}",
        String::from_utf8_lossy(&run.stderr)
    );
    let path = String::from_utf8_lossy(&run.stdout).trim().to_string();
    std::path::PathBuf::from(path)
}

#[test]
fn upgrading_the_package_restarts_the_agent_and_reboots_nothing() {
    let _one = exclusive();
    let m = &machines()[0];
    let (_, installed) = m.exec(&["dpkg-query", "-W", "-f", "${Version}", "nodekeeper"]);
    let version = format!("{}+{}", installed.trim(), support::rand_u64() % 1000);
    let deb = deb_of_version(&version);
    std::fs::copy(&deb, m.root.join("var/tmp/nodekeeper-next.deb")).expect("into the machine");
    // The operator's own setting in the env file, which an upgrade keeps.
    m.run(&[
        "sh",
        "-c",
        "echo '# the operator was here' >> /etc/nodekeeper/nodekeeper.env",
    ]);
    let boot = m.boot_id();
    let dropins = m.unit("DropInPaths");
    let first: u32 = m.unit("MainPID").parse().unwrap_or(0);
    assert!(first > 0, "nodekeeper.service runs: {}", m.journal());
    let from = now_ms();
    m.run(&["dpkg", "-i", "/var/tmp/nodekeeper-next.deb"]);
    let second = block_on(wait_for(
        "the postinst restarts nodekeeper.service",
        Duration::from_secs(60),
        || async {
            let pid: u32 = m.unit("MainPID").parse().unwrap_or(0);
            (pid != 0 && pid != first && m.unit("ActiveState") == "active").then_some(pid)
        },
    ));
    println!(
        "{}: nodekeeper {first} → {second} by the upgrade to {version}",
        m.name
    );
    let (_, now) = m.exec(&[
        "dpkg-query",
        "-W",
        "-f",
        "${Status} ${Version}",
        "nodekeeper",
    ]);
    assert_eq!(now, format!("install ok installed {version}"));
    assert_eq!(m.boot_id(), boot, "the machine was not rebooted");
    assert!(
        m.records_since("down", from).is_empty(),
        "no shutdown since the upgrade began"
    );
    let (_, env) = m.exec(&["cat", "/etc/nodekeeper/nodekeeper.env"]);
    assert!(
        env.contains("# the operator was here"),
        "the conffile was kept: {env}"
    );
    assert_eq!(m.unit("DropInPaths"), dropins, "the drop-ins were kept");
    assert_eq!(m.unit("UnitFileState"), "enabled");
}
