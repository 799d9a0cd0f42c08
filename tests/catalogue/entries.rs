//! The catalogue's vocabulary: what is expected of each object, the
//! checks of what an object reports on itself, and the test's world.

use crate::support::GROUP_LABEL;
use serde_json::{Value, json};

pub const NODE_KEY: &str = "nodekeeper.test/catalogue";
pub const VERSION_KEY: &str = "nodekeeper.test/version";

pub type Check = Box<dyn Fn(&Value) -> bool>;

pub enum Expect {
    /// Refused by the API server; what it says names this field.
    Refused(&'static str),
    /// Accepted; what it reports on itself, and how to see it.
    Reported(&'static str, Check),
}

pub struct Entry {
    /// The kind as kubectl names it (plural, lower case).
    pub kind: &'static str,
    pub object: Value,
    pub expect: Expect,
}

impl Entry {
    pub fn name(&self) -> String {
        self.object["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    }
}

pub fn condition(t: &'static str, s: &'static str) -> Check {
    Box::new(move |v| {
        v["status"]["conditions"]
            .as_array()
            .is_some_and(|cs| cs.iter().any(|c| c["type"] == t && c["status"] == s))
    })
}

pub fn any_condition_false() -> Check {
    Box::new(|v| {
        v["status"]["conditions"]
            .as_array()
            .is_some_and(|cs| cs.iter().any(|c| c["status"] == "False"))
    })
}

pub fn node_reason(node: String, reason: &'static str) -> Check {
    Box::new(move |v| {
        v["status"]["nodes"].as_array().is_some_and(|ns| {
            ns.iter()
                .any(|e| e["name"] == node && e["reason"] == reason)
        })
    })
}

pub fn phase(p: &'static str) -> Check {
    Box::new(move |v| v["status"]["phase"] == p)
}

pub fn message(part: &'static str) -> Check {
    Box::new(move |v| {
        v["status"]["message"]
            .as_str()
            .is_some_and(|m| m.contains(part))
    })
}

pub fn merge(a: &mut Value, b: Value) {
    match (a, b) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in b {
                merge(a.entry(k).or_insert(Value::Null), v);
            }
        }
        (a, b) => *a = b,
    }
}

/// The test's id, namespace and nodes `a`, `b`, `c`.
pub struct World<'a> {
    pub id: &'a str,
    pub ns: &'a str,
    pub nodes: &'a [String; 3],
}

impl World<'_> {
    /// One of the test's nodes (`a`, `b`, `c`; anything else: none).
    pub fn sel(&self, which: &str) -> Value {
        json!({"matchLabels": {GROUP_LABEL: self.id, NODE_KEY: which}})
    }

    /// The test's nodes by an expression on their catalogue label.
    pub fn expr(&self, op: &str, values: Value) -> Value {
        json!({"matchLabels": {GROUP_LABEL: self.id},
               "matchExpressions": [{"key": NODE_KEY, "operator": op, "values": values}]})
    }

    /// A window that is as good as never open.
    pub fn closed() -> Value {
        json!([{"days": ["Sun"], "start": "03:17", "end": "03:18", "timeZone": "UTC"}])
    }

    /// A Job spec that is one.
    pub fn job() -> Value {
        json!({"template": {"spec": {"restartPolicy": "Never",
            "containers": [{"name": "c", "image": "check"}]}}})
    }
}
