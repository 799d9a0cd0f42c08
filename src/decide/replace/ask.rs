//! What replacement asks the provider before a round, and for how long
//! each answer may be used again: the cache policy is decided here, with
//! the questions, so the service only keeps what this module says to keep.

use std::time::Duration;

use serde_json::{Value, json};

/// The provider's read verbs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Read {
    /// A node's scaling group (per providerID).
    ScalingGroupId,
    /// The image a node's instance runs (per providerID).
    NodeImage,
    /// An instance's CSP state (per providerID).
    NodeState,
    /// The image a scaling group creates nodes with (per group id).
    ScalingGroupImage,
}

/// How long an answer may be used again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reuse {
    /// Ask every round.
    Never,
    /// For as long as what it is about exists (the answer cannot change).
    WhileItExists,
    /// For this long.
    For(Duration),
}

/// How long a failed read is not asked again: one provider error per
/// instance every 10 s at most, however often rounds run.
pub const ERROR_REUSE: Duration = Duration::from_secs(10);
/// How long a scaling group's image is used again: it changes by our own
/// write (which forgets it) or by someone at the cloud.
pub const GROUP_IMAGE_REUSE: Duration = Duration::from_secs(60);

impl Read {
    /// The protocol's verb.
    pub fn verb(self) -> &'static str {
        match self {
            Read::ScalingGroupId => "scaling-group-id",
            Read::NodeImage => "node-image",
            Read::NodeState => "node-state",
            Read::ScalingGroupImage => "get-scaling-group-image",
        }
    }

    /// The answer's field that holds what was asked.
    pub fn field(self) -> &'static str {
        match self {
            Read::ScalingGroupId => "groupId",
            Read::NodeImage | Read::ScalingGroupImage => "image",
            Read::NodeState => "state",
        }
    }

    /// The request for `id` (a providerID, or a lowercased group id).
    pub fn request(self, id: &str) -> Value {
        match self {
            Read::ScalingGroupImage => json!({ "groupId": id }),
            _ => json!({ "providerID": id }),
        }
    }

    /// How long an answer (`ok`) or an error may be used again.
    pub fn reuse(self, ok: bool) -> Reuse {
        match (self, ok) {
            (_, false) => Reuse::For(ERROR_REUSE),
            (Read::ScalingGroupId | Read::NodeImage, true) => Reuse::WhileItExists,
            (Read::ScalingGroupImage, true) => Reuse::For(GROUP_IMAGE_REUSE),
            // A Join's or Leave's state is what the round waits on.
            (Read::NodeState, true) => Reuse::Never,
        }
    }

    /// What `answer` says, or why it is unusable.
    pub fn answer(self, answer: &Value) -> Result<String, String> {
        field(answer, self.verb(), self.field()).map(str::to_string)
    }
}

/// One string field of an answer, or why the answer is unusable.
pub fn field<'a>(answer: &'a Value, verb: &str, key: &str) -> Result<&'a str, String> {
    answer
        .get(key)
        .and_then(|v| v.as_str())
        .filter(|s| !s.is_empty())
        .ok_or_else(|| format!("provider {verb}: the answer has no {key:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_that_cannot_change_are_kept_errors_briefly_and_states_never() {
        assert_eq!(Read::ScalingGroupId.reuse(true), Reuse::WhileItExists);
        assert_eq!(Read::NodeState.reuse(true), Reuse::Never);
        assert_eq!(Read::NodeState.reuse(false), Reuse::For(ERROR_REUSE));
        assert_eq!(Read::ScalingGroupImage.request("g")["groupId"], json!("g"));
        assert_eq!(
            Read::NodeImage.answer(&json!({"image": "img"})),
            Ok("img".to_string())
        );
        assert!(Read::NodeImage.answer(&json!({})).is_err());
    }
}
