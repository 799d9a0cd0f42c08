//! Test machines that reboot for real (`tests/realnode/node.sh up 3
//! --machine`; how a machine works: tests/realnode/machine.sh): a real
//! kubelet and containerd in a PID + mount namespace of their own, whose
//! PID 1 ends on `systemctl reboot` and is booted again with a new boot ID.
//!
//! What the tests assert comes from here, never from nodekeeper: the
//! machines' own records (`machine.log`: every reboot request, shutdown,
//! PID-1 exit and boot, with the host clock's milliseconds), the host's
//! processes, and [`NodeLog`], a watch of the Nodes as the API shows them.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use nodekeeper::runtime::Latch;
use smol::stream::StreamExt;

use crate::realnode;
use crate::support::block_on;

/// Milliseconds since the epoch on the host clock (the machines' records
/// use the same clock).
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or_default()
}

/// One test machine, as `node.sh env` describes it.
#[derive(Clone, Debug)]
pub struct Machine {
    pub name: String,
    /// Its folder on the host: records, disks, configuration.
    pub dir: PathBuf,
    /// The kubelet's staticPodPath.
    pub manifests: PathBuf,
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/realnode/node.sh")
}

/// `node.sh ARGS`: its status and its output.
fn node_sh(args: &[&str]) -> (bool, String) {
    let out = Command::new("bash")
        .arg(script())
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("running node.sh {args:?}: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// Three machines, booted once per test binary (or found up), with the
/// nodekeeper image in their containerd stores (which survive reboots).
/// Fails loudly, with the components' logs, if they cannot start.
pub fn machines() -> &'static [Machine] {
    static MACHINES: OnceLock<Vec<Machine>> = OnceLock::new();
    MACHINES.get_or_init(|| {
        let archive = realnode::image_archive();
        let env = realnode::up(&["3", "--machine"], "the test machines");
        let get = |k: String| {
            env.get(&k)
                .cloned()
                .unwrap_or_else(|| panic!("node.sh env has no {k}"))
        };
        assert_eq!(get("NODEKEEPER_REALNODE_MODE".into()), "machine");
        // Into their containerd stores, which outlive reboots; again when
        // the machines were found up (the image may be newer).
        let (ok, out) = node_sh(&["import", &archive.display().to_string()]);
        assert!(ok, "importing the image into the machines: {out}");
        (0..3)
            .map(|i| Machine {
                name: get(format!("NODEKEEPER_REALNODE_{i}_NAME")),
                dir: PathBuf::from(get(format!("NODEKEEPER_REALNODE_{i}_DIR"))),
                manifests: PathBuf::from(get(format!("NODEKEEPER_REALNODE_{i}_MANIFESTS"))),
            })
            .collect()
    })
}

impl Machine {
    /// Its records since `from` (ms): `(what, ms)` for `boot`,
    /// `reboot-requested`, `shutdown` and `down`.
    pub fn records_since(&self, from: u64) -> Vec<(String, u64)> {
        std::fs::read_to_string(self.dir.join("machine.log"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| {
                let mut w = l.split_whitespace();
                let what = w.next()?.to_string();
                let ms = w.next()?.parse().ok()?;
                (ms >= from).then_some((what, ms))
            })
            .collect()
    }

    /// How many times `what` was recorded since `from`.
    pub fn count_since(&self, what: &str, from: u64) -> usize {
        self.records_since(from)
            .iter()
            .filter(|(w, _)| w == what)
            .count()
    }

    /// When `what` was first recorded since `from`.
    pub fn first_since(&self, what: &str, from: u64) -> Option<u64> {
        self.records_since(from)
            .into_iter()
            .find(|(w, _)| w == what)
            .map(|(_, ms)| ms)
    }

    /// The boot ID of its current (or last) boot.
    pub fn boot_id(&self) -> String {
        std::fs::read_to_string(self.dir.join("boot_id"))
            .unwrap_or_default()
            .trim()
            .to_string()
    }

    /// Run a command inside the machine; whether it exited 0.
    pub fn exec(&self, argv: &[&str]) -> bool {
        let mut args = vec!["exec", self.name.as_str()];
        args.extend_from_slice(argv);
        node_sh(&args).0
    }

    /// A knob file of the machine (machine.sh): `off`, `shutdown-delay`.
    pub fn set(&self, knob: &str, value: Option<&str>) {
        let path = self.dir.join(knob);
        match value {
            Some(v) => std::fs::write(&path, v).expect("writing a machine knob"),
            None => {
                let _ = std::fs::remove_file(&path);
            }
        }
    }

    /// The host PID of its running PID 1.
    pub fn init_pid(&self) -> Option<u32> {
        let pid: u32 = std::fs::read_to_string(self.dir.join("init.pid"))
            .ok()?
            .trim()
            .parse()
            .ok()?;
        Path::new(&format!("/proc/{pid}")).exists().then_some(pid)
    }

    /// Host PIDs of the processes in this machine (its current boot) whose
    /// command line holds every one of `words`.
    pub fn processes_with(&self, words: &[&str]) -> Vec<u32> {
        let Some(init) = self.init_pid() else {
            return Vec::new();
        };
        let ns = |pid: u32| std::fs::read_link(format!("/proc/{pid}/ns/pid")).ok();
        let ours = ns(init);
        realnode::processes_with(words)
            .into_iter()
            .map(|(pid, _)| pid)
            .filter(|pid| ours.is_some() && ns(*pid) == ours)
            .collect()
    }
}

/// What the node watch saw: one entry per change of a node's cordon,
/// readiness, boot ID or lifecycle conditions.
#[derive(Clone, Debug, PartialEq)]
pub struct Seen {
    pub ms: u64,
    pub node: String,
    pub cordoned: bool,
    pub ready: bool,
    pub boot: String,
    /// The KEP-5683 lifecycle conditions, `Type=Status/Reason` joined by
    /// spaces, in type order.
    pub lifecycle: String,
}

/// An independent watch of the machines' Nodes, from the test's start.
pub struct NodeLog {
    stop: Latch,
    thread: Option<std::thread::JoinHandle<Vec<Seen>>>,
}

impl NodeLog {
    pub fn start(client: Client) -> NodeLog {
        NodeLog::start_labelled(client, &format!("{}=true", realnode::REAL_NODE_KEY))
    }

    /// A watch of the Nodes that match the label selector `labels`.
    pub fn start_labelled(client: Client, labels: &str) -> NodeLog {
        let labels = labels.to_string();
        let stop = Latch::default();
        let stop2 = stop.clone();
        let thread = std::thread::spawn(move || {
            block_on(async move {
                let mut seen: Vec<Seen> = Vec::new();
                let mut last: BTreeMap<String, Seen> = BTreeMap::new();
                let nodes = watcher(
                    Api::<Node>::all(client),
                    watcher::Config::default().labels(&labels),
                );
                let mut nodes = std::pin::pin!(nodes);
                let run = async {
                    while let Some(ev) = nodes.next().await {
                        let n = match ev {
                            Ok(watcher::Event::Apply(n) | watcher::Event::InitApply(n)) => n,
                            _ => continue,
                        };
                        let status = n.status.clone().unwrap_or_default();
                        let mut lifecycle: Vec<String> = status
                            .conditions
                            .iter()
                            .flatten()
                            .filter(|c| {
                                nodekeeper::api::nodemaintenance::LIFECYCLE_CONDITIONS
                                    .contains(&c.type_.as_str())
                            })
                            .map(|c| {
                                format!(
                                    "{}={}/{}",
                                    c.type_,
                                    c.status,
                                    c.reason.as_deref().unwrap_or_default()
                                )
                            })
                            .collect();
                        lifecycle.sort();
                        let s = Seen {
                            ms: now_ms(),
                            node: n.name_any(),
                            cordoned: n.spec.as_ref().and_then(|s| s.unschedulable) == Some(true),
                            ready: status
                                .conditions
                                .unwrap_or_default()
                                .iter()
                                .any(|c| c.type_ == "Ready" && c.status == "True"),
                            boot: status.node_info.map(|i| i.boot_id).unwrap_or_default(),
                            lifecycle: lifecycle.join(" "),
                        };
                        let changed = last.get(&s.node).is_none_or(|l| {
                            (l.cordoned, l.ready, &l.boot, &l.lifecycle)
                                != (s.cordoned, s.ready, &s.boot, &s.lifecycle)
                        });
                        if changed {
                            last.insert(s.node.clone(), s.clone());
                            seen.push(s);
                        }
                    }
                };
                smol::future::or(run, stop2.wait()).await;
                seen
            })
        });
        NodeLog {
            stop,
            thread: Some(thread),
        }
    }

    /// Stop; every change seen, in order.
    pub fn finish(mut self) -> Vec<Seen> {
        self.stop.open();
        self.thread
            .take()
            .map(|t| t.join().expect("the node watch panicked"))
            .unwrap_or_default()
    }
}

impl Drop for NodeLog {
    fn drop(&mut self) {
        self.stop.open();
    }
}

/// The most machines unavailable (cordoned or not Ready) at once over the
/// log, and which they were then.
pub fn most_unavailable(log: &[Seen]) -> (usize, Vec<String>) {
    let mut now: BTreeMap<&str, bool> = BTreeMap::new();
    let mut most = (0, Vec::new());
    for s in log {
        now.insert(&s.node, s.cordoned || !s.ready);
        let down: Vec<String> = now
            .iter()
            .filter(|(_, d)| **d)
            .map(|(n, _)| n.to_string())
            .collect();
        if down.len() > most.0 {
            most = (down.len(), down);
        }
    }
    most
}

/// The node's state as the watch last saw it at or before `ms`.
pub fn state_at<'a>(log: &'a [Seen], node: &str, ms: u64) -> Option<&'a Seen> {
    log.iter().rfind(|s| s.node == node && s.ms <= ms)
}

/// The first change of `node` at or after `from` for which `f` holds.
pub fn first_after<'a>(
    log: &'a [Seen],
    node: &str,
    from: u64,
    f: impl Fn(&Seen) -> bool,
) -> Option<&'a Seen> {
    log.iter().find(|s| s.node == node && s.ms >= from && f(s))
}

/// GET http://ADDR/PATH (a pod's metrics on the pod network): the body.
pub fn http_body(addr: &str, path: &str) -> Option<String> {
    use std::io::{Read, Write};
    let mut s =
        std::net::TcpStream::connect_timeout(&addr.parse().ok()?, Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    text.split_once("\r\n\r\n").map(|(_, b)| b.to_string())
}
