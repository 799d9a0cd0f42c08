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

/// The worlds to run: `1..=worlds`, or the one `NODEKEEPER_WORLD_SEED`
/// names (a failing world replayed).
pub(crate) fn world_seeds(worlds: u64) -> Vec<u64> {
    match std::env::var("NODEKEEPER_WORLD_SEED") {
        Ok(s) => vec![s.parse().unwrap_or(1)],
        Err(_) => (1..=worlds).collect(),
    }
}

/// Every world runs (none is replayed): the totals' assertions apply.
pub(crate) fn all_worlds() -> bool {
    std::env::var("NODEKEEPER_WORLD_SEED").is_err()
}

/// Run `check` on world `w`; a broken invariant panics again with the
/// seed, how to replay it, and the last lines of its trace
/// (`NODEKEEPER_WORLD_TRACE` of them, else `lines`).
pub(crate) fn replaying<W>(
    seed: u64,
    w: &mut W,
    trace: fn(&W) -> &[String],
    lines: usize,
    check: impl FnOnce(&mut W),
) {
    let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| check(&mut *w)));
    if let Err(e) = run {
        let why = e
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default();
        let lines = std::env::var("NODEKEEPER_WORLD_TRACE")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(lines);
        let t = trace(w);
        panic!(
            "world {seed} broke an invariant: {why}\nreplay: NODEKEEPER_WORLD_SEED={seed}\nlast steps: {:#?}",
            &t[t.len().saturating_sub(lines)..]
        );
    }
}
