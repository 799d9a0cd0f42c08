//! Unit tests of the generator: every target renders, options flow into
//! the output, bad options name their flag.

use super::*;

#[test]
fn every_target_renders_with_defaults() {
    for (t, _, _) in TARGETS {
        let files = render(t, &Options::default());
        assert!(
            files.as_ref().is_ok_and(|f| !f.is_empty()),
            "{t}: {files:?}"
        );
    }
}

#[test]
fn options_flow_into_the_manifests() {
    let o = Options {
        image: "registry.example/nk:9".into(),
        namespace: "ops".into(),
        kubeconfig: "/var/lib/nk/kc".into(),
        log_level: "debug".into(),
        metrics_address: Some("127.0.0.1:9999".into()),
    };
    let text: String = ["k3s", "static-pod", "systemd", "deployment"]
        .iter()
        .flat_map(|t| render(t, &o).unwrap_or_default())
        .map(|f| f.content)
        .collect();
    for want in [
        "registry.example/nk:9",
        "namespace: ops",
        "system:serviceaccount:ops:nodekeeper-agent",
        "/var/lib/nk/kc",
        "nodekeeper=debug",
        "127.0.0.1:9999",
        "containerPort: 9999",
    ] {
        assert!(text.contains(want), "missing {want}");
    }
    assert!(!text.contains("namespace: nodekeeper\n"));
}

#[test]
fn bad_options_are_refused_with_the_flag_named() {
    let cases = [
        (
            Options {
                namespace: "Ops".into(),
                ..Default::default()
            },
            "--namespace",
        ),
        (
            Options {
                kubeconfig: "kc".into(),
                ..Default::default()
            },
            "--kubeconfig",
        ),
        (
            Options {
                log_level: "loud".into(),
                ..Default::default()
            },
            "--log-level",
        ),
        (
            Options {
                image: "".into(),
                ..Default::default()
            },
            "--image",
        ),
        (
            Options {
                metrics_address: Some("x".into()),
                ..Default::default()
            },
            "--metrics-address",
        ),
    ];
    for (o, flag) in cases {
        let err = render("daemonset", &o)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains(flag), "{flag}: {err}");
    }
}

#[test]
fn metrics_off_drops_ports_and_probes() {
    let o = Options {
        metrics_address: Some("off".into()),
        ..Default::default()
    };
    let ds = daemonset(&o);
    let c = &ds["spec"]["template"]["spec"]["containers"][0];
    assert!(c.get("livenessProbe").is_none() && c.get("ports").is_none());
    assert!(c["args"].to_string().contains("off"));
}

#[test]
fn multi_file_targets_need_a_folder_unless_they_are_one_yaml_stream() {
    let o = Options::default();
    let k3s = render("k3s", &o).unwrap_or_default();
    assert!(to_stdout("k3s", &k3s).is_ok_and(|s| s.contains("kind: DaemonSet")));
    let talos = render("talos", &o).unwrap_or_default();
    let err = to_stdout("talos", &talos)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(
        err.contains("--out DIR") && err.contains("manifest.yaml"),
        "{err}"
    );
}
