//! The `RebootPolicy` API (`nodekeeper.io/v1alpha1`): coordinated reboots
//! of the nodes it selects — what says a node needs one (kured's sentinel
//! file or command, nodekeeper's annotation, the CoreOS reboot operator's and
//! CLUO/FLUO's annotations), the budget, windows and gates admissions obey,
//! how the NodeMaintenance it takes a node with drains, and how the node is
//! rebooted and must come back. The node annotations the feature reads and
//! writes are constants here, so the CLI, the loop and the docs agree.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector, Time};
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use super::common::{Budget, DrainSpec, Gates, NodeLabels, Window};

/// nodekeeper's own need marker (set by the node role from the host's
/// signals, or by `nodekeeper reboot-required NODE`); the value is when the
/// need was first seen (RFC 3339).
pub const NEEDED_ANNOTATION: &str = "nodekeeper.io/reboot-needed";
/// The node's boot ID when its need was stamped (written with
/// [`NEEDED_ANNOTATION`] by the node role and `reboot-required`): a need
/// stamped in an earlier boot was served by the reboot since, whoever
/// rebooted the machine and whatever the clocks say.
pub const NEEDED_BOOT_ANNOTATION: &str = "nodekeeper.io/reboot-needed-boot";
/// The CoreOS reboot operator's need marker (presence, value empty).
pub const COREOS_NEEDED_ANNOTATION: &str = "reboot-agent.v1.demo.local/reboot-needed";
/// FLUO's and CLUO's prefixes; `<prefix>reboot-needed` = "true" marks need,
/// `<prefix>reboot-paused` = "true" holds the node.
pub const FLUO_PREFIX: &str = "flatcar-linux-update.v1.flatcar-linux.net/";
pub const CLUO_PREFIX: &str = "container-linux-update.v1.coreos.com/";
/// nodekeeper's own pause marker ("true" holds the node).
pub const PAUSED_ANNOTATION: &str = "nodekeeper.io/reboot-paused";
/// The boot ID a reboot was issued in. At most one reboot is issued per
/// boot: while the node still runs this boot, nothing reboots it again.
pub const ISSUED_ANNOTATION: &str = "nodekeeper.io/reboot-issued";
/// The node agent's answer to "can the governing policy's reboot command
/// run on this host?" (`decide::command_check`): `<policy>/<generation>/
/// <uid8> ok`, or `… cannot run: why`. A node is admitted only after `ok`
/// (unless the cluster role reboots it with `reboot.remoteCommand`).
pub const CHECK_ANNOTATION: &str = "nodekeeper.io/reboot-command-check";
/// `<boot ID>: <message>` when the reboot command failed in that boot.
pub const FAILED_ANNOTATION: &str = "nodekeeper.io/reboot-failed";
/// Set by the node agent while its last look at the host's reboot signal
/// failed (a sentinel command that does not exist, is empty, hangs or
/// answers neither 0 nor 1; a sentinel file it cannot read): why, in one
/// line. Removed by the next look that works. The policy reports it per
/// node (`Unknown`, reason `SentinelFailed`).
pub const SENTINEL_FAILED_ANNOTATION: &str = "nodekeeper.io/reboot-sentinel-failed";
/// On the NodeMaintenance a policy takes a node with: the node's boot ID at
/// admission. Completion is verified against it.
pub const BOOT_ID_ANNOTATION: &str = "nodekeeper.io/boot-id-before";
/// The owner label value on NodeMaintenances a RebootPolicy creates.
pub const OWNER_KIND: &str = "RebootPolicy";
/// The default reboot command and sentinel file (kured's).
pub const DEFAULT_COMMAND: [&str; 2] = ["systemctl", "reboot"];
pub const DEFAULT_SENTINEL: &str = "/var/run/reboot-required";

/// Reboots the selected nodes that need it, a few at a time, each drained
/// first and verified after (new boot ID, Ready).
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "nodekeeper.io",
    version = "v1alpha1",
    kind = "RebootPolicy",
    plural = "rebootpolicies",
    shortname = "rp",
    status = "RebootPolicyStatus",
    doc = "RebootPolicy reboots the selected nodes that need it, within a budget, windows and gates; each node is drained through a NodeMaintenance and its reboot verified by a new boot ID.",
    printcolumn(
        name = "Needing",
        type_ = "integer",
        json_path = ".status.needing",
        description = "nodes that need a reboot and wait for one"
    ),
    printcolumn(
        name = "Rebooting",
        type_ = "integer",
        json_path = ".status.rebooting",
        description = "nodes admitted: draining, rebooting, verifying or settling"
    ),
    printcolumn(
        name = "Done",
        type_ = "integer",
        json_path = ".status.done",
        description = "nodes whose reboot was verified"
    ),
    printcolumn(
        name = "Not Returned",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"NodeNotReturned\")].status",
        description = "True while a rebooted node has missed its return deadline (the condition's message names it)"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct RebootPolicySpec {
    /// Which nodes the policy covers (empty: every node).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<LabelSelector>,
    /// What says a node needs a reboot.
    #[serde(default)]
    pub detect: Detect,
    /// How many selected nodes may be unavailable at once.
    #[serde(default)]
    pub budget: Budget,
    /// When reboots may start (empty: any time).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub windows: Vec<Window>,
    /// What must hold before a node is admitted.
    #[serde(default)]
    pub gates: Gates,
    /// How the NodeMaintenance taking each node drains it.
    #[serde(default)]
    pub drain: DrainSpec,
    /// How a node is rebooted, and how long it may take to come back.
    #[serde(default)]
    pub reboot: RebootSpec,
    /// Labels on a node while the policy has it and after its reboot.
    #[serde(default, skip_serializing_if = "NodeLabels::is_empty")]
    pub node_labels: NodeLabels,
    /// While a node needs a reboot and waits its turn, taint it
    /// `nodekeeper.io/waiting=reboot:PreferNoSchedule` (kured's
    /// `--prefer-no-schedule-taint`): the scheduler prefers other nodes for
    /// new pods before this one is drained. Removed when it is taken.
    #[serde(default)]
    pub prefer_no_schedule_while_waiting: bool,
    /// Who is told when a node's drain starts, its reboot is issued, it is
    /// back, it failed or did not come back. Absent: the cluster-wide
    /// default (`run --notify-default SECRET`), if any; empty: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 8))]
    pub notifications: Option<Vec<super::common::Notification>>,
}

/// Signals that mean "this node needs a reboot". Annotations always count:
/// `nodekeeper.io/reboot-needed`, the CoreOS reboot operator's
/// `reboot-agent.v1.demo.local/reboot-needed` and FLUO's/CLUO's
/// `…/reboot-needed=true`.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Detect {
    /// A file whose presence on the host means a reboot is needed, read by
    /// the node role (default `/var/run/reboot-required`, as kured; "" turns
    /// it off).
    #[serde(default = "sentinel")]
    #[x_kube(validation = Rule::new("self == '' || self.startsWith('/')").message("sentinelFile must be an absolute path, or empty to turn it off"))]
    #[schemars(length(max = 4096))]
    pub sentinel_file: String,
    /// A command (argv, no shell) run on the host by the node role: exit 0
    /// means a reboot is needed, 1 means not (kured's contract); anything
    /// else is reported and counts as not needed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub sentinel_command: Vec<String>,
    /// Seconds between looks at the host's signals (default 60).
    #[serde(default = "sixty")]
    #[schemars(range(min = 5, max = 86400))]
    pub period_seconds: i32,
}

impl Default for Detect {
    fn default() -> Self {
        Detect {
            sentinel_file: sentinel(),
            sentinel_command: Vec::new(),
            period_seconds: 60,
        }
    }
}

fn sentinel() -> String {
    DEFAULT_SENTINEL.into()
}

fn sixty() -> i32 {
    60
}

/// How a node is rebooted.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RebootSpec {
    /// The command (argv, no shell) the node role runs on its host
    /// (default `systemctl reboot`). `{node}` is replaced by the node name.
    #[serde(default = "default_command")]
    #[x_kube(validation = Rule::new("self.size() > 0").message("reboot.command needs at least the program"))]
    #[schemars(length(max = 64))]
    pub command: Vec<String>,
    /// How the node agent reboots its node: `Auto` (default) calls Talos's
    /// machine API (`MachineService/Reboot` on machined's socket, which the
    /// Talos extension mounts) on a node whose `status.nodeInfo.osImage`
    /// names Talos, and runs `command` on any other; `Command` always runs
    /// `command`; `Talos` always calls the API. The policy's status names
    /// the path each node takes.
    #[serde(default = "auto")]
    #[x_kube(validation = Rule::new("self in ['Auto', 'Command', 'Talos']").message("reboot.method must be Auto, Command or Talos"))]
    pub method: String,
    /// For a cluster role that runs without node agents: the command it
    /// runs itself to reboot a node (argv; `{node}` is replaced), e.g. an
    /// ssh or a BMC call. Without it such a cluster role waits for a node
    /// agent to reboot the node.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub remote_command: Vec<String>,
    /// Seconds from the reboot command until the node must be back (new
    /// boot, Ready). Past it the node keeps its slot, no further node is
    /// taken, and the policy reports NodeNotReturned. Default 900.
    #[serde(default = "return_timeout")]
    #[schemars(range(min = 10, max = 86400))]
    pub return_timeout_seconds: i32,
}

impl Default for RebootSpec {
    fn default() -> Self {
        RebootSpec {
            command: default_command(),
            method: auto(),
            remote_command: Vec::new(),
            return_timeout_seconds: return_timeout(),
        }
    }
}

fn auto() -> String {
    "Auto".into()
}

fn default_command() -> Vec<String> {
    DEFAULT_COMMAND.iter().map(|s| s.to_string()).collect()
}

fn return_timeout() -> i32 {
    900
}

/// Where one node is in its reboot.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, schemars::JsonSchema)]
pub enum RebootPhase {
    /// Needs a reboot; not looked at yet.
    Pending,
    /// Needs a reboot; not admitted, and the message says why.
    Waiting,
    /// Admitted: its NodeMaintenance is draining it.
    Draining,
    /// Drained; the reboot is issued or about to be.
    Rebooting,
    /// Came back with a new boot ID; waiting for Ready.
    Verifying,
    /// Back and given back; keeps its slot for `settleSeconds`.
    Settling,
    /// Reboot verified.
    Done,
    /// Not rebooted; the message says why. Not tried again in this boot.
    Failed,
    /// Whether it needs a reboot is not known: its agent could not read
    /// the host's reboot signal (reason `SentinelFailed`; the message says
    /// why).
    Unknown,
}

impl RebootPhase {
    pub fn as_str(self) -> &'static str {
        match self {
            RebootPhase::Pending => "Pending",
            RebootPhase::Waiting => "Waiting",
            RebootPhase::Draining => "Draining",
            RebootPhase::Rebooting => "Rebooting",
            RebootPhase::Verifying => "Verifying",
            RebootPhase::Settling => "Settling",
            RebootPhase::Done => "Done",
            RebootPhase::Failed => "Failed",
            RebootPhase::Unknown => "Unknown",
        }
    }

    /// Phases that hold one of the budget's slots.
    pub fn holds_slot(self) -> bool {
        matches!(
            self,
            RebootPhase::Draining
                | RebootPhase::Rebooting
                | RebootPhase::Verifying
                | RebootPhase::Settling
        )
    }

    /// Phases in which the node is admitted and not yet given back.
    pub fn admitted(self) -> bool {
        matches!(
            self,
            RebootPhase::Draining | RebootPhase::Rebooting | RebootPhase::Verifying
        )
    }
}

/// One node's reboot as the policy records it. The admitted entries are the
/// admission record: written (guarded by the policy's resourceVersion)
/// before the node is taken, so two decisions can never both take a slot.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeReboot {
    /// The node.
    pub name: String,
    pub phase: RebootPhase,
    /// When the node entered this phase.
    pub since: Time,
    /// The node's boot ID when it was admitted (or, Failed, the boot the
    /// failure happened in).
    #[serde(
        default,
        rename = "bootIDBefore",
        skip_serializing_if = "Option::is_none"
    )]
    pub boot_id_before: Option<String>,
    /// The need this reboot answers: the node's `reboot-needed` stamp when
    /// it was admitted. The same stamp after the node rebooted is served,
    /// whatever the clocks of the person or agent who stamped it and of
    /// the cluster role say; a different one is a new need.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub need: Option<String>,
    /// Why (Waiting, Failed), or what is happening.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// A machine-readable reason for Waiting (`Budget`, `Window`,
    /// `BlockingPod`, `NotReady`, `Paused`, `InMaintenance`, `HeldByOther`,
    /// `Gate`) and for a node that did not come back (`NotReturned`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RebootPolicyStatus {
    /// Per node that needs, is going through or went through a reboot.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<NodeReboot>,
    /// Nodes that need a reboot and are not admitted.
    #[serde(default)]
    pub needing: i32,
    /// Nodes admitted and not yet settled.
    #[serde(default)]
    pub rebooting: i32,
    /// Nodes whose reboot was verified.
    #[serde(default)]
    pub done: i32,
    /// The generation of the spec this status was decided on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Valid` (the spec can be used: time zones exist, the selector
    /// parses) and `NodeNotReturned` (a rebooted node missed its return
    /// deadline; the message names it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "super::nodemaintenance::conditions_schema")]
    pub conditions: Option<Vec<Condition>>,
    /// How the notifications fared.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notifications: Option<super::common::NotificationStatus>,
}

impl RebootPolicy {
    pub fn entry(&self, node: &str) -> Option<&NodeReboot> {
        self.status.as_ref()?.nodes.iter().find(|e| e.name == node)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::CustomResourceExt;

    #[test]
    fn crd_is_cluster_scoped_with_short_name_and_columns() {
        let crd = RebootPolicy::crd();
        assert_eq!(
            crd.metadata.name.as_deref(),
            Some("rebootpolicies.nodekeeper.io")
        );
        assert_eq!(crd.spec.scope, "Cluster");
        assert_eq!(crd.spec.names.short_names, Some(vec!["rp".to_string()]));
        let json = serde_json::to_string(&crd).unwrap_or_default();
        for needle in [
            "Needing",
            "Rebooting",
            "x-kubernetes-int-or-string",
            "HH:MM",
        ] {
            assert!(json.contains(needle), "{needle} missing");
        }
    }

    #[test]
    fn an_empty_spec_takes_the_documented_defaults() {
        let spec: RebootPolicySpec =
            serde_json::from_value(serde_json::json!({})).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(spec.detect.sentinel_file, "/var/run/reboot-required");
        assert_eq!(spec.reboot.command, vec!["systemctl", "reboot"]);
        assert_eq!(spec.reboot.return_timeout_seconds, 900);
        assert_eq!(spec.drain.timeout_seconds, 600);
        assert_eq!(spec.budget.max_control_plane, 1);
    }
}
