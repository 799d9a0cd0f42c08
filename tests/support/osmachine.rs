//! Machines that boot a real OS image (`tests/osimage/machine.sh`; the image:
//! `tests/osimage/image.sh`): Debian with systemd as PID 1 under
//! systemd-nspawn, containerd, the kubelet and nodekeeper.service baked in
//! as the README's systemd mode installs it, each a node of the test
//! cluster with its own root file system and boot ID. `systemctl reboot` in
//! one is systemd's own shutdown; nspawn exits 133 and the machine's
//! supervisor boots it again.
//!
//! What the tests assert comes from here, never from nodekeeper: the
//! machines' own records (`machine.log`: every `boot` with its boot ID read
//! from inside, every `down` with nspawn's exit status, host-clock
//! milliseconds; `console.log`: systemd's messages), commands run inside,
//! and the API server.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use crate::realmachine::now_ms;

/// The label every OS-image machine's Node carries.
pub const LABEL_KEY: &str = "nodekeeper.test/os-machine";

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/osimage/machine.sh")
}

/// The nodekeeper binary baked into the image: the static release binary
/// the suite ships (`$NODEKEEPER_IMAGE_BIN`, which `just test` and
/// tests/check set), never a debug build.
pub fn shipped_binary() -> PathBuf {
    let bin = std::env::var_os("NODEKEEPER_IMAGE_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("target/x86_64-unknown-linux-musl/release/nodekeeper")
        });
    assert!(
        bin.is_file(),
        "no static nodekeeper binary at {} to bake into the OS image: build it with `just build-static` (or set NODEKEEPER_IMAGE_BIN)",
        bin.display()
    );
    bin
}

/// The system extension image of the shipped binary (`image/sysext.sh`),
/// built once per test binary: machine 1 takes nodekeeper from it.
fn sysext_image() -> &'static Path {
    static RAW: OnceLock<PathBuf> = OnceLock::new();
    RAW.get_or_init(|| {
        let out = crate::support::scratch().join("osimage-sysext");
        let built = Command::new(Path::new(env!("CARGO_MANIFEST_DIR")).join("image/sysext.sh"))
            .arg(&out)
            .arg(shipped_binary())
            .output()
            .unwrap_or_else(|e| panic!("running image/sysext.sh: {e}"));
        assert!(
            built.status.success(),
            "image/sysext.sh failed:\n{}",
            String::from_utf8_lossy(&built.stderr)
        );
        PathBuf::from(String::from_utf8_lossy(&built.stdout).trim())
    })
}

/// The machine that takes nodekeeper from its system extension.
pub const SYSEXT_MACHINE: usize = 1;

/// `machine.sh ARGS`: its status and its output.
fn machine_sh(args: &[&str]) -> (bool, String) {
    let mut cmd = Command::new("bash");
    if args.first() == Some(&"up") {
        let spec = format!("{SYSEXT_MACHINE}:{}", sysext_image().display());
        cmd.env("NODEKEEPER_OSIMAGE_SYSEXT", spec);
    }
    let out = cmd
        .arg(script())
        .args(args)
        .env("NODEKEEPER_OSIMAGE_NODEKEEPER", shipped_binary())
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("running machine.sh {args:?}: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// One OS-image machine, as `machine.sh env` describes it.
#[derive(Clone, Debug)]
pub struct OsMachine {
    pub name: String,
    /// Its folder on the host: records, overlay layers.
    pub dir: PathBuf,
    /// Its root file system, as mounted on the host while it is up.
    pub root: PathBuf,
    /// nodekeeper.service's metrics port (the machines share the host's
    /// network).
    pub metrics_port: u16,
    /// How nodekeeper is installed: `package` (dpkg in the image being
    /// built) or `sysext NAME.raw` (merged by systemd-sysext at boot).
    pub install: String,
}

/// Two machines booted with the `reboot` profile of nodekeeper.service,
/// once per test binary (or found up): os-0 with nodekeeper from its Debian
/// package, os-1 ([`SYSEXT_MACHINE`]) from its system extension. Fails loudly with machine.sh's
/// output if they cannot start: never a skip.
pub fn machines() -> &'static [OsMachine] {
    static MACHINES: OnceLock<Vec<OsMachine>> = OnceLock::new();
    MACHINES.get_or_init(|| {
        crate::support::cluster();
        let started = now_ms();
        let (ok, out) = machine_sh(&["up", "2"]);
        assert!(ok, "the OS-image machines did not start:\n{out}");
        let env: HashMap<String, String> = out
            .lines()
            .filter(|l| l.starts_with("NODEKEEPER_OSIMAGE_"))
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_string(), v.trim_matches('\'').to_string()))
            .collect();
        let get = |k: String| {
            env.get(&k)
                .cloned()
                .unwrap_or_else(|| panic!("machine.sh up printed no {k}:\n{out}"))
        };
        println!(
            "OS-image machines up in {} ms (image {})",
            now_ms() - started,
            get("NODEKEEPER_OSIMAGE_IMAGE".into())
        );
        (0..2)
            .map(|i| OsMachine {
                name: get(format!("NODEKEEPER_OSIMAGE_{i}_NAME")),
                dir: PathBuf::from(get(format!("NODEKEEPER_OSIMAGE_{i}_DIR"))),
                root: PathBuf::from(get(format!("NODEKEEPER_OSIMAGE_{i}_ROOT"))),
                metrics_port: get(format!("NODEKEEPER_OSIMAGE_{i}_METRICS_PORT"))
                    .parse()
                    .expect("a metrics port"),
                install: get(format!("NODEKEEPER_OSIMAGE_{i}_INSTALL")),
            })
            .collect()
    })
}

impl OsMachine {
    /// Run `argv` inside the machine (its namespaces, its PATH): whether it
    /// exited 0, and its output.
    pub fn exec(&self, argv: &[&str]) -> (bool, String) {
        let mut args = vec!["exec", self.name.as_str()];
        args.extend_from_slice(argv);
        machine_sh(&args)
    }

    /// [`OsMachine::exec`] that must succeed; its output.
    pub fn run(&self, argv: &[&str]) -> String {
        let (ok, out) = self.exec(argv);
        assert!(ok, "{}: {argv:?} failed:\n{out}", self.name);
        out
    }

    /// A property of nodekeeper.service (`systemctl show -p`).
    pub fn unit(&self, property: &str) -> String {
        self.exec(&[
            "systemctl",
            "show",
            "-p",
            property,
            "--value",
            "nodekeeper.service",
        ])
        .1
        .trim()
        .to_string()
    }

    /// Records of `what` (`boot`, `down`) since `from`: (ms, the rest of
    /// the line: the boot ID, or `exit=RC`).
    pub fn records_since(&self, what: &str, from: u64) -> Vec<(u64, String)> {
        std::fs::read_to_string(self.dir.join("machine.log"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| {
                let mut w = l.split_whitespace();
                (w.next()? == what).then_some(())?;
                let ms: u64 = w.next()?.parse().ok()?;
                (ms >= from).then(|| (ms, w.collect::<Vec<_>>().join(" ")))
            })
            .collect()
    }

    /// The boot ID of its current boot, as read from inside.
    pub fn boot_id(&self) -> String {
        std::fs::read_to_string(self.dir.join("boot_id"))
            .unwrap_or_default()
            .trim()
            .to_string()
    }

    /// The machine's console (systemd's boot and shutdown messages).
    pub fn console(&self) -> String {
        std::fs::read_to_string(self.dir.join("console.log")).unwrap_or_default()
    }

    /// The journal of nodekeeper.service in this boot (for failure reports).
    pub fn journal(&self) -> String {
        self.exec(&["journalctl", "-u", "nodekeeper", "--no-pager", "-n", "60"])
            .1
    }

    /// Switch nodekeeper.service to another profile of its package (`[]`,
    /// `["--reboot"]` or `["--upgrade"]`), as an operator would: link that
    /// profile's drop-in (README, Debian package), reload, restart.
    pub fn use_profile(&self, flags: &[&str]) {
        let dropin = match flags {
            [] => None,
            ["--reboot"] => Some("reboot-cap-sys-admin.conf"),
            ["--upgrade"] => Some("upgrade-host-root.conf"),
            other => panic!("no packaged profile for {other:?}"),
        };
        let dir = "/etc/systemd/system/nodekeeper.service.d";
        self.run(&[
            "rm",
            "-f",
            &format!("{dir}/reboot-cap-sys-admin.conf"),
            &format!("{dir}/upgrade-host-root.conf"),
        ]);
        if let Some(name) = dropin {
            self.run(&[
                "ln",
                "-s",
                &format!("/usr/share/nodekeeper/systemd/{name}"),
                dir,
            ]);
        }
        self.run(&["systemctl", "daemon-reload"]);
        self.run(&["systemctl", "restart", "nodekeeper.service"]);
    }
}
