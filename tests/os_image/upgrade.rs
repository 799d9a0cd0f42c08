//! An UpgradePlan on the OS-image machines: a real package operation
//! (`dpkg -i`) through the packaged unit's upgrade drop-in, then the
//! reboot.

use super::*;

/// Build the package the upgrade installs: version 2 of `nkos-release`,
/// whose postinst writes `/etc/os-release` naming `version` (as a distro's
/// base-files upgrade would); the kubelet reports it as osImage after the
/// reboot.
fn os_release_package(version: &str) -> std::path::PathBuf {
    let dir = support::scratch().join(format!("nkos-{version}-{:x}", support::rand_u64()));
    let debian = dir.join("pkg/DEBIAN");
    std::fs::create_dir_all(&debian).expect("a package folder");
    std::fs::write(
        debian.join("control"),
        "Package: nkos-release\nVersion: 2\nArchitecture: all\nMaintainer: nodekeeper tests <tests@nodekeeper.invalid>\nDescription: the OS release of the nodekeeper test image\n",
    )
    .expect("control");
    let postinst = format!(
        "#!/bin/sh\nset -e\nrm -f /etc/os-release\nsed 's/^PRETTY_NAME=.*/PRETTY_NAME=\"Debian GNU\\/Linux 12 ({version})\"/' /usr/lib/os-release >/etc/os-release\n"
    );
    std::fs::write(debian.join("postinst"), postinst).expect("postinst");
    let st = Command::new("chmod")
        .arg("0755")
        .arg(debian.join("postinst"))
        .status();
    assert!(st.is_ok_and(|s| s.success()));
    let deb = dir.join(format!("{version}.deb"));
    let out = Command::new("dpkg-deb")
        .args(["--build", "--root-owner-group"])
        .arg(dir.join("pkg"))
        .arg(&deb)
        .output()
        .expect("running dpkg-deb");
    assert!(
        out.status.success(),
        "dpkg-deb: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    deb
}

/// An UpgradePlan upgrades each machine once through the unit's upgrade
/// profile: `dpkg -i` of a package (a real package operation, as root on
/// the host, which the reboot profile's sandbox would refuse), then the
/// reboot, verified by the new boot and the osImage the package names.
#[test]
fn an_upgrade_plan_upgrades_each_machine_with_dpkg_through_the_upgrade_profile() {
    let _one = exclusive();
    let env = block_on(TestEnv::new("osupgrade"));
    let ms: Vec<&OsMachine> = machines().iter().collect();
    let _group = InGroup::new(&env, ms.clone());
    let version = format!("nkos-{}", &env.id[env.id.len() - 6..]);
    let deb = os_release_package(&version);
    struct Back<'a>(&'a [&'static OsMachine]);
    impl Drop for Back<'_> {
        fn drop(&mut self) {
            for m in self.0 {
                m.use_profile(&["--reboot"]);
            }
        }
    }
    let _back = Back(&ms);
    for m in &ms {
        std::fs::copy(&deb, m.root.join(format!("var/tmp/{version}.deb")))
            .expect("the package into the machine");
        m.use_profile(&["--upgrade"]);
        assert_eq!(m.unit("ActiveState"), "active", "{}", m.journal());
    }
    let log = NodeLog::start_labelled(env.client.clone(), &selector());
    let before = boots(&env, &ms);
    let from = now_ms();
    let cluster = support::machines::cluster_role(&env, &["--node-agents"]);
    let plan = create(
        &env,
        "UpgradePlan",
        json!({
            "version": version,
            "versionFrom": {"source": "OSImage"},
            "strategy": {"command": ["dpkg", "-i", "/var/tmp/{version}.deb"], "reboot": true},
            "budget": {"maxUnavailable": 1},
            "deadlines": {"upgradeSeconds": 180},
        }),
    );
    let context = || {
        let mut s = format!("cluster role:\n{}", cluster.log_text());
        for m in &ms {
            s += &format!("\n{} journal:\n{}", m.name, m.journal());
        }
        s
    };
    let done = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        block_on(wait_for("every machine upgraded", WAVE, || async {
            let p = Api::<UpgradePlan>::all(env.client.clone())
                .get(&plan)
                .await
                .ok()?;
            ms.iter()
                .all(|m| {
                    p.entry(&m.name)
                        .is_some_and(|e| e.phase == UpgradePhase::Done)
                })
                .then_some(())
        }))
    }));
    if done.is_err() {
        panic!("the upgrade did not finish\n{}", context());
    }
    wait_back(&env, &ms, &before, "every machine back after its upgrade");
    let seen = log.finish();
    let (most, which) = most_unavailable(&seen);
    assert!(most <= 1, "over budget: {which:?} at once\n{seen:#?}");
    for m in &ms {
        one_real_reboot(m, from, &seen, &context()).print();
        let status = m.run(&[
            "dpkg-query",
            "-W",
            "-f",
            "${Status} ${Version}",
            "nkos-release",
        ]);
        assert_eq!(
            status, "install ok installed 2",
            "{}: dpkg installed the package",
            m.name
        );
        let os = block_on(node(&env, &m.name))
            .and_then(|n| n.status?.node_info.map(|i| i.os_image))
            .unwrap_or_default();
        assert_eq!(
            os,
            format!("Debian GNU/Linux 12 ({version})"),
            "{}: osImage",
            m.name
        );
    }
}
