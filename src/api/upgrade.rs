//! The `UpgradePlan` API (`nodekeeper.io/v1alpha1`): in-place upgrades of
//! the nodes it selects, group by group, a few nodes at a time — per node:
//! before-hook Jobs (run off the node), drain through a NodeMaintenance, the
//! upgrade command on the host (optionally followed by a reboot), verify the
//! version the node reports, after-hook Jobs, give the node back. Budget,
//! windows, gates and drain settings are RebootPolicy's types
//! ([`super::common`]). The node annotations and Job labels the feature
//! writes are constants here, so the CLI, the loop and the docs agree.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use super::common::{Budget, DrainSpec, Gates, NodeLabels, Window};

mod status;
pub use status::{ChannelStatus, NodeUpgrade, UpgradePhase, UpgradePlanStatus};

/// The owner label value on NodeMaintenances an UpgradePlan creates.
pub const OWNER_KIND: &str = "UpgradePlan";
/// On the node: `<plan>/<version>/<boot ID>` of the upgrade command last
/// issued, written before the command runs. At most one command per plan,
/// version and boot: while that record stands, nothing runs it again.
pub const ISSUED_ANNOTATION: &str = "nodekeeper.io/upgrade-issued";
/// On the node: `<plan>/<version>/<boot ID> ok` or `… failed: <message>`,
/// written when the command returns.
pub const RESULT_ANNOTATION: &str = "nodekeeper.io/upgrade-result";
/// On the node, written by its agent before the node can be admitted:
/// `<plan>/<generation>/<uid> ok` when the plan's commands can run on this
/// host, or `… cannot run: <why>`. The plan admits a node only once its
/// agent said `ok` for the plan's current spec, so a command that does not
/// exist never drains a node.
pub const CHECK_ANNOTATION: &str = "nodekeeper.io/upgrade-command-check";
/// Labels on every hook Job: which plan, node, stage (`before`/`after`) and
/// hook it belongs to. The plan label is also what the cluster role
/// watches Jobs by.
pub const PLAN_LABEL: &str = "nodekeeper.io/upgrade-plan";
pub const NODE_LABEL: &str = "nodekeeper.io/upgrade-node";
pub const STAGE_LABEL: &str = "nodekeeper.io/upgrade-stage";
/// The stage label's value on upgrade Jobs (hooks have `before`/`after`):
/// a drain reads it too, to keep the plan's own upgrade Job on its node.
pub const UPGRADE_STAGE: &str = "upgrade";
pub const HOOK_LABEL: &str = "nodekeeper.io/upgrade-hook";
/// Environment appended to every container of a hook Job.
pub const ENV_NODE: &str = "NODE_NAME";
pub const ENV_PLAN: &str = "NODEKEEPER_PLAN";
pub const ENV_VERSION: &str = "NODEKEEPER_VERSION";

/// Upgrades the selected nodes in place to `version`, group by group,
/// within a budget, windows and gates.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "nodekeeper.io",
    version = "v1alpha1",
    kind = "UpgradePlan",
    plural = "upgradeplans",
    shortname = "upp",
    status = "UpgradePlanStatus",
    doc = "UpgradePlan upgrades the selected nodes in place to a version, group by group and within a budget, windows and gates: per node, before-hook Jobs, a drain through a NodeMaintenance, the upgrade command on the host, verification of the reported version, after-hook Jobs.",
    printcolumn(
        name = "Version",
        type_ = "string",
        json_path = ".spec.version",
        description = "the version nodes are upgraded to"
    ),
    printcolumn(
        name = "Group",
        type_ = "string",
        json_path = ".status.group",
        description = "the group being upgraded"
    ),
    printcolumn(
        name = "Pending",
        type_ = "integer",
        json_path = ".status.pending",
        description = "nodes not at the version and not admitted"
    ),
    printcolumn(
        name = "Upgrading",
        type_ = "integer",
        json_path = ".status.upgrading",
        description = "nodes admitted: hooks, draining, upgrading or verifying"
    ),
    printcolumn(
        name = "Done",
        type_ = "integer",
        json_path = ".status.done",
        description = "nodes at the version"
    ),
    printcolumn(
        name = "Failed",
        type_ = "integer",
        json_path = ".status.failed",
        description = "nodes whose upgrade failed"
    ),
    printcolumn(
        name = "Paused",
        type_ = "string",
        json_path = ".status.conditions[?(@.type=='Paused')].status",
        priority = 1
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.version) != has(self.channel)").message("exactly one of version and channel: a fixed version, or a channel whose answer names it"))]
pub struct UpgradePlanSpec {
    /// Which nodes the plan covers (empty: every node).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<LabelSelector>,
    /// Groups upgraded in this order: a group starts when every node of
    /// the previous one is done. A node belongs to the first group whose
    /// selector matches it; a selected node in no group is not upgraded.
    /// Empty: one group of every selected node.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    #[x_kube(validation = Rule::new("self.all(g, self.exists_one(h, h.name == g.name))").message("group names must be unique"))]
    pub groups: Vec<NodeGroup>,
    /// The version every selected node is upgraded to (or `channel`):
    /// 1 to 128 letters, digits, `.`, `_`, `+` or `-`, as an image tag may
    /// be (plus the `+` of k3s versions), since it fills `{version}` in
    /// commands, images and labels. In an image it is written as
    /// system-upgrade-controller writes it, `+` as `-`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(length(min = 1, max = 128))]
    #[x_kube(validation = Rule::new(VERSION_RULE).message("version must be 1 to 128 letters, digits, '.', '_', '+' or '-', starting with a letter or digit (it fills {version} in commands, images and labels)"))]
    pub version: String,
    /// Instead of `version`: a URL whose answer names the version, as
    /// system-upgrade-controller resolves a channel. A `302` names it in
    /// the last path element of its `Location` (a release page's
    /// `…/releases/tag/v1.33.1+k3s1`); any other `2xx`/`3xx` in the last
    /// path element of the URL itself. Asked again every
    /// `run --channel-interval` (15 minutes), at once when the URL
    /// changes; the answer is `status.channel`, and a new version is
    /// rolled out like an edit of `version`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 1024))]
    #[x_kube(validation = Rule::new(CHANNEL_RULE).message("channel must be an http:// or https:// URL with a host"))]
    pub channel: Option<String>,
    /// Where a node reports its version.
    #[serde(default)]
    pub version_from: VersionFrom,
    /// How a node is upgraded.
    pub strategy: Strategy,
    /// Jobs run per node before the drain and after verification.
    #[serde(default)]
    pub hooks: Hooks,
    /// What a failed node does to the plan: `Pause` (default) admits no
    /// further node until the spec changes; `Continue` goes on with the
    /// next node (a group with a failed node still counts as finished).
    #[serde(default = "pause")]
    #[x_kube(validation = Rule::new("self in ['Pause', 'Continue']").message("onFailure must be Pause or Continue"))]
    pub on_failure: String,
    /// Admit no further node (nodes in progress finish).
    #[serde(default)]
    pub paused: bool,
    /// How many selected nodes may be unavailable at once.
    #[serde(default)]
    pub budget: Budget,
    /// When upgrades may start (empty: any time).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub windows: Vec<Window>,
    /// What must hold before a node is admitted.
    #[serde(default)]
    pub gates: Gates,
    /// How the NodeMaintenance taking each node drains it.
    #[serde(default)]
    pub drain: DrainSpec,
    /// Deadlines of the upgrade and verification stages.
    #[serde(default)]
    pub deadlines: Deadlines,
    /// Labels on a node while the plan has it and after it is at the
    /// version (`{version}` in a value replaced).
    #[serde(default, skip_serializing_if = "NodeLabels::is_empty")]
    pub node_labels: NodeLabels,
    /// Never run beside another exclusive UpgradePlan (SUC's `exclusive`):
    /// while one has a node admitted, the others' nodes wait (reason
    /// `Exclusive`), e.g. an OS plan and a Kubernetes plan on the same
    /// fleet.
    #[serde(default)]
    pub exclusive: bool,
    /// While a node is to be upgraded and waits its turn, taint it
    /// `nodekeeper.io/waiting=upgrade:PreferNoSchedule`. Removed when it is
    /// taken.
    #[serde(default)]
    pub prefer_no_schedule_while_waiting: bool,
    /// Who is told when a node's drain starts, its upgrade is issued, it
    /// is back, it failed or was not verified in time. Absent: the
    /// cluster-wide default (`run --notify-default SECRET`), if any; empty:
    /// none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 8))]
    pub notifications: Option<Vec<super::common::Notification>>,
}

fn pause() -> String {
    "Pause".into()
}

/// A named set of nodes upgraded together.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NodeGroup {
    /// Names the group in status (`status.group`, each node's `group`).
    #[schemars(length(min = 1, max = 63))]
    pub name: String,
    /// Its nodes (a node is in the first group whose selector matches).
    pub node_selector: LabelSelector,
}

/// Where a node reports its version: a field of `status.nodeInfo`, or a
/// label or annotation of the node.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("(self.source in ['Label', 'Annotation']) == has(self.key)").message("versionFrom.key is required for Label and Annotation, and only for them"))]
pub struct VersionFrom {
    /// `KubeletVersion` (default; equal to `version`), `OSImage` or
    /// `KernelVersion` (containing `version`), `Label` or `Annotation`
    /// (named by `key`; equal to `version`).
    #[serde(default = "kubelet_version")]
    #[x_kube(validation = Rule::new("self in ['KubeletVersion', 'OSImage', 'KernelVersion', 'Label', 'Annotation']").message("source must be KubeletVersion, OSImage, KernelVersion, Label or Annotation"))]
    pub source: String,
    /// The label's or annotation's key (source `Label` or `Annotation`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 317))]
    pub key: Option<String>,
}

impl Default for VersionFrom {
    fn default() -> Self {
        VersionFrom {
            source: kubelet_version(),
            key: None,
        }
    }
}

fn kubelet_version() -> String {
    "KubeletVersion".into()
}

/// How a node is upgraded: `InPlace` runs a command on the host; `Talos`
/// installs an image through Talos's machine API and reboots.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.type != 'InPlace' || size(self.command) > 0").message("strategy.command needs at least the program").field_path(".command"))]
#[x_kube(validation = Rule::new("self.type != 'Talos' || has(self.image)").message("strategy.image is required for type Talos").field_path(".image"))]
#[x_kube(validation = Rule::new("self.type == 'Talos' || !has(self.image)").message("strategy.image is for type Talos only").field_path(".image"))]
#[x_kube(validation = Rule::new("(self.type == 'Job') == has(self.job)").message("strategy.job is required for type Job, and only for it").field_path(".job"))]
#[x_kube(validation = Rule::new("self.type != 'Job' || !has(self.command) || size(self.command) == 0").message("strategy.command is for type InPlace; a Job's command is strategy.job.command").field_path(".command"))]
#[x_kube(validation = Rule::new("self.type != 'Job' || !self.reboot").message("strategy.reboot is not for type Job: an upgrade image that must reboot the node does so itself, and the new version is what is verified").field_path(".reboot"))]
pub struct Strategy {
    /// `InPlace`: the node agent runs `command` on the host. `Talos`: the
    /// node agent asks machined (Talos's machine API, on the socket the
    /// Talos extension mounts) to install `image`
    /// (`LifecycleService/Upgrade`, or the staged `MachineService/Upgrade`
    /// on Talos before 1.13), then reboots it through the API.
    /// `Job`: the cluster role runs `job`'s image as a Job pinned to the
    /// drained node, privileged, with the host's root at `/host` and the
    /// host's PID, network and IPC namespaces (system-upgrade-controller's
    /// `upgrade` container), once per node and version.
    #[serde(rename = "type", default = "in_place")]
    #[x_kube(validation = Rule::new("self in ['InPlace', 'Talos', 'Job']").message("strategy.type must be InPlace, Talos or Job (Replace is not available yet)"))]
    pub type_: String,
    /// The upgrade command (argv, no shell), run on the drained node's
    /// host by its node agent, at most once per version and boot. `{version}`
    /// and `{node}` are replaced. Exit 0 is success. Type `InPlace` only.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub command: Vec<String>,
    /// Type `Talos`: the installer image to upgrade to, `{version}`
    /// replaced (e.g. `factory.talos.dev/installer/ID:{version}`), installed
    /// at most once per version and boot and always followed by a reboot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 512))]
    pub image: Option<String>,
    /// Type `Job`: the upgrade container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job: Option<UpgradeJob>,
    /// Reboot after a successful command (verified by a new boot ID).
    /// Type `Talos` always reboots.
    #[serde(default)]
    pub reboot: bool,
    /// The reboot command (default `systemctl reboot`); type `Talos`
    /// reboots through the API instead.
    #[serde(default = "reboot_command")]
    #[x_kube(validation = Rule::new("self.size() > 0").message("strategy.rebootCommand needs at least the program"))]
    #[schemars(length(max = 64))]
    pub reboot_command: Vec<String>,
}

impl Strategy {
    /// Whether the node is rebooted after the upgrade.
    pub fn reboots(&self) -> bool {
        self.reboot || self.type_ == "Talos"
    }

    /// The upgrade runs as a Job (type `Job`), not by the node agent.
    pub fn job(&self) -> Option<&UpgradeJob> {
        self.job.as_ref().filter(|_| self.type_ == "Job")
    }
}

/// The upgrade container of type `Job` (SUC's `upgrade`): how k3s and RKE2
/// nodes are upgraded, by an image that replaces the binaries on the host.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct UpgradeJob {
    /// Namespace the Job runs in; its Pod Security level must admit
    /// privileged pods. It becomes part of a request's path.
    #[schemars(length(min = 1, max = 63))]
    #[x_kube(validation = Rule::new("self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')").message("strategy.job.namespace must be a lowercase RFC 1123 label (a-z, 0-9 and '-')"))]
    pub namespace: String,
    /// The image, `{version}` replaced (e.g. `rancher/k3s-upgrade:{version}`
    /// with `+` in the version as SUC writes it, `-`).
    #[schemars(length(min = 1, max = 512))]
    pub image: String,
    /// The container's command (default: the image's entrypoint);
    /// `{version}` and `{node}` replaced.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub command: Vec<String>,
    /// Its arguments, `{version}` and `{node}` replaced.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub args: Vec<String>,
    /// More environment; `NODE_NAME`, `NODEKEEPER_PLAN`,
    /// `NODEKEEPER_VERSION` and SUC's `SYSTEM_UPGRADE_NODE_NAME`,
    /// `SYSTEM_UPGRADE_PLAN_NAME`, `SYSTEM_UPGRADE_PLAN_LATEST_VERSION` are
    /// always set.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub env: Vec<JobEnv>,
    /// Secrets of the Job's namespace mounted read-only (SUC's `secrets`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 8))]
    pub secrets: Vec<JobSecret>,
    /// The ServiceAccount the pod runs as (default: the namespace's default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub service_account_name: Option<String>,
}

/// One environment variable of the upgrade container.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct JobEnv {
    /// The variable's name.
    #[schemars(
        length(min = 1, max = 253),
        regex(pattern = r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
    )]
    pub name: String,
    /// Its value; `{version}` and `{node}` are replaced.
    #[serde(default)]
    pub value: String,
}

/// A Secret mounted into the upgrade container.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct JobSecret {
    /// The Secret, in the Job's namespace.
    #[schemars(
        length(min = 1, max = 253),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
    )]
    pub name: String,
    /// Where it is mounted (absolute).
    #[schemars(length(min = 2, max = 512), regex(pattern = r"^/"))]
    pub path: String,
}

fn in_place() -> String {
    "InPlace".into()
}

fn reboot_command() -> Vec<String> {
    super::reboot::DEFAULT_COMMAND
        .iter()
        .map(|s| s.to_string())
        .collect()
}

/// Jobs per node, each run to completion in order.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Hooks {
    /// Before the node is drained (it still runs its workloads).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 8))]
    pub before: Vec<Hook>,
    /// After the node reports the new version and is Ready, before it is
    /// given back.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 8))]
    pub after: Vec<Hook>,
}

/// One Job run per node. It never runs on the node being upgraded (a
/// `kubernetes.io/hostname NotIn [node]` term is added to its node
/// affinity), and `NODE_NAME`, `NODEKEEPER_PLAN` and `NODEKEEPER_VERSION`
/// are appended to every container's environment (a variable the template
/// already sets keeps its value).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Hook {
    /// Names the hook in Job labels and status.
    #[x_kube(validation = Rule::new("self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')").message("hook names are lowercase letters, digits and '-'"))]
    #[schemars(length(min = 1, max = 40))]
    pub name: String,
    /// Namespace the Job runs in. It becomes part of a request's path, so
    /// it must be a namespace name.
    #[schemars(length(min = 1, max = 63))]
    #[x_kube(validation = Rule::new("self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')").message("a hook's namespace must be a lowercase RFC 1123 label (a-z, 0-9 and '-')"))]
    pub namespace: String,
    /// Seconds the Job may run (its `activeDeadlineSeconds` is at most
    /// this). Default 600.
    #[serde(default = "six_hundred")]
    #[schemars(range(min = 1, max = 86400))]
    pub deadline_seconds: i64,
    /// A failed or timed-out Job: `Stop` (default) fails the node; `Ignore`
    /// records it and goes on.
    #[serde(default = "stop")]
    #[x_kube(validation = Rule::new("self in ['Stop', 'Ignore']").message("onFailure must be Stop or Ignore"))]
    pub on_failure: String,
    /// Seconds a finished Job is kept for inspection. Default 86400.
    #[serde(default = "day")]
    #[schemars(range(min = 600, max = 2592000))]
    pub ttl_seconds_after_finished: i32,
    /// A `batch/v1` JobSpec (checked when the Job is created).
    #[schemars(schema_with = "job_spec")]
    pub job: serde_json::Value,
}

fn six_hundred() -> i64 {
    600
}

fn stop() -> String {
    "Stop".into()
}

fn day() -> i32 {
    86400
}

/// A JobSpec kept as given: the API server checks it when the Job is
/// created (a full JobSpec schema would triple the CRD's size).
fn job_spec(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true,
        "required": ["template"],
        "description": "a batch/v1 JobSpec"
    })
}

/// Deadlines of the stages after the drain. Past either, the node fails
/// and stays in maintenance (cordoned, drained) for a person to look at.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Deadlines {
    /// From the drain's end until the node reports the version (and, with
    /// `reboot`, a new boot ID). Default 1800.
    #[serde(default = "thirty_minutes")]
    #[schemars(range(min = 10, max = 86400))]
    pub upgrade_seconds: i64,
    /// From then until the node is Ready. Default 900.
    #[serde(default = "fifteen_minutes")]
    #[schemars(range(min = 10, max = 86400))]
    pub verify_seconds: i64,
}

impl Default for Deadlines {
    fn default() -> Self {
        Deadlines {
            upgrade_seconds: thirty_minutes(),
            verify_seconds: fifteen_minutes(),
        }
    }
}

fn thirty_minutes() -> i64 {
    1800
}

fn fifteen_minutes() -> i64 {
    900
}

/// CEL: a version (`crate::decide::version::PATTERN`, the same rule).
pub const VERSION_RULE: &str = "self.matches('^[A-Za-z0-9][A-Za-z0-9._+-]{0,127}$')";

/// CEL: an http(s) URL with a host and no spaces.
pub const CHANNEL_RULE: &str =
    "self.matches('^https?://[A-Za-z0-9.-]+(:[0-9]{1,5})?([/?][!-~]*)?$')";

impl UpgradePlan {
    /// The version nodes are upgraded to: `spec.version`, or what the
    /// channel named (empty while it has named nothing, or only for
    /// another URL).
    pub fn target_version(&self) -> &str {
        match &self.spec.channel {
            None => &self.spec.version,
            Some(url) => self
                .status
                .as_ref()
                .and_then(|s| s.channel.as_ref())
                .filter(|c| &c.url == url)
                .and_then(|c| c.version.as_deref())
                .unwrap_or_default(),
        }
    }

    pub fn entry(&self, node: &str) -> Option<&NodeUpgrade> {
        self.status.as_ref()?.nodes.iter().find(|e| e.name == node)
    }
}

#[cfg(test)]
mod tests;
