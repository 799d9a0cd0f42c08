//! What an `UpgradePlan` reports: its `status`, one entry per node it
//! looked at, each in an [`UpgradePhase`], and what its channel answered.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use serde::{Deserialize, Serialize};

/// Where one node is in its upgrade.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, schemars::JsonSchema)]
pub enum UpgradePhase {
    /// Not at the version; not looked at yet.
    Pending,
    /// Not at the version and not admitted; `reason` says why.
    Waiting,
    /// Admitted: running the before hooks.
    PreHooks,
    /// Its NodeMaintenance is draining it.
    Draining,
    /// Drained; the upgrade command is issued or about to be.
    Upgrading,
    /// Reports the version; waiting for Ready.
    Verifying,
    /// Verified; running the after hooks.
    PostHooks,
    /// Upgraded and given back; keeps its slot for `gates.settleSeconds`
    /// and until `gates.health` is met.
    Settling,
    /// At the version.
    Done,
    /// Not upgraded, or upgraded and not verified; the message says why.
    Failed,
}

impl UpgradePhase {
    pub fn as_str(self) -> &'static str {
        match self {
            UpgradePhase::Pending => "Pending",
            UpgradePhase::Waiting => "Waiting",
            UpgradePhase::PreHooks => "PreHooks",
            UpgradePhase::Draining => "Draining",
            UpgradePhase::Upgrading => "Upgrading",
            UpgradePhase::Verifying => "Verifying",
            UpgradePhase::PostHooks => "PostHooks",
            UpgradePhase::Settling => "Settling",
            UpgradePhase::Done => "Done",
            UpgradePhase::Failed => "Failed",
        }
    }

    /// Admitted and not finished: holds a budget slot.
    pub fn admitted(self) -> bool {
        matches!(
            self,
            UpgradePhase::PreHooks
                | UpgradePhase::Draining
                | UpgradePhase::Upgrading
                | UpgradePhase::Verifying
                | UpgradePhase::PostHooks
                | UpgradePhase::Settling
        )
    }
}

/// One node's upgrade as the plan records it. Admitted entries are the
/// admission record (written guarded by the plan's resourceVersion before
/// anything touches the node), and the hook Job named here is recorded
/// before it is created.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeUpgrade {
    /// The node.
    pub name: String,
    pub phase: UpgradePhase,
    /// When the node entered this phase (or this hook).
    pub since: Time,
    /// The node's group, when the plan has groups.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// The version this admission upgrades to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// The plan's generation when the node was admitted (or failed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt: Option<i64>,
    /// The node's boot ID at admission.
    #[serde(
        default,
        rename = "bootIDBefore",
        skip_serializing_if = "Option::is_none"
    )]
    pub boot_id_before: Option<String>,
    /// The hook running (PreHooks, PostHooks) or that failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hook: Option<String>,
    /// Its Job (a hook's, or the upgrade Job of type Job), `namespace/name`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job: Option<String>,
    /// The Job named in `job` was seen on the API server. Gone before its
    /// result was seen, someone deleted it to stop it: it is not created
    /// again (reason `JobDeleted`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub job_seen: bool,
    /// While Upgrading: when the cluster role first found the node's
    /// NodeMaintenance gone before the node reported the version. Its agent
    /// writes the version and then deletes the maintenance, and the two
    /// reach the cluster role through different watches; the upgrade counts
    /// as interrupted only if the version is still not seen 10 s later.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub maintenance_gone_at: Option<Time>,
    /// What is happening, or why it waits or failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Machine-readable: why Waiting (`Budget`, `Window`, `Paused`, `Group`,
    /// `BlockingPod`, `NotReady`, `InMaintenance`, `HeldByOther`, `Gate`,
    /// `InvalidSpec`, `Failure`), or what failed (`HookFailed`, `DrainFailed`,
    /// `CommandFailed`, `UpgradeTimeout`, `VerifyTimeout`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UpgradePlanStatus {
    /// Per selected node.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<NodeUpgrade>,
    /// The group being upgraded (the first one not finished).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// Nodes not at the version and not admitted.
    #[serde(default)]
    pub pending: i32,
    /// Nodes admitted and not finished.
    #[serde(default)]
    pub upgrading: i32,
    /// Nodes at the version.
    #[serde(default)]
    pub done: i32,
    /// Nodes whose upgrade failed.
    #[serde(default)]
    pub failed: i32,
    /// The generation of the spec this status was decided on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Valid` (the spec can be used), `Paused` (no admissions: the spec
    /// says so, or a failure with onFailure Pause) and `Complete` (every
    /// selected node in a group is at the version).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::api::nodemaintenance::conditions_schema")]
    pub conditions: Option<Vec<Condition>>,
    /// How the notifications fared.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notifications: Option<crate::api::common::NotificationStatus>,
    /// What `spec.channel` last answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub channel: Option<ChannelStatus>,
}

/// What the plan's channel last answered.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ChannelStatus {
    /// The channel asked (the spec's, when it was asked).
    pub url: String,
    /// The version it named; kept when a later question fails.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// When it last answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resolved: Option<Time>,
    /// Why the last question failed, if it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}
