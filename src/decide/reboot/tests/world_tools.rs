//! Tools of the random worlds (`worlds.rs`, and the maintenance worlds): a seeded xorshift generator
//! (a failing world is replayed from its seed, no crate needed), the
//! worlds' pool selectors and budgets, and the JSON merge patch the worlds
//! apply node patches with.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde_json::{Value, json};

/// xorshift64: cheap, seeded, good enough to pick events.
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    pub(crate) fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// RFC 7386 merge patch.
pub(crate) fn merge(target: &mut Value, patch: &Value) {
    match patch {
        Value::Object(p) => {
            if !target.is_object() {
                *target = json!({});
            }
            if let Value::Object(t) = target {
                for (k, v) in p {
                    if v.is_null() {
                        t.remove(k);
                    } else {
                        merge(t.entry(k.clone()).or_insert(Value::Null), v);
                    }
                }
            }
        }
        other => *target = other.clone(),
    }
}

/// Every node, pool a or pool b, a third of the time each.
pub(super) fn pool_selector(rng: &mut Rng) -> Option<LabelSelector> {
    let pool = match rng.below(3) {
        0 => return None,
        1 => "a",
        _ => "b",
    };
    Some(LabelSelector {
        match_labels: Some([("pool".to_string(), pool.to_string())].into()),
        ..Default::default()
    })
}

/// A budget's node count (a percentage never limits the worlds' pools).
pub(super) fn budget_of(max_unavailable: &IntOrString) -> usize {
    match max_unavailable {
        IntOrString::Int(i) => *i as usize,
        IntOrString::String(_) => usize::MAX,
    }
}
