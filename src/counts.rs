//! Labelled counters for `/metrics`, kept where the counting happens (API
//! requests under kube's client, Events as they are written, provider
//! calls as they return) so no layer needs a handle to the metrics server,
//! which reads them with [`Counts::snapshot`]. Labels are small, fixed sets
//! (verbs, resources, reasons), never object names.

use std::collections::BTreeMap;
use std::sync::Mutex;

/// Counts per label tuple `K`, process-global.
pub struct Counts<K>(Mutex<BTreeMap<K, u64>>);

impl<K: Ord + Clone> Counts<K> {
    pub const fn new() -> Counts<K> {
        Counts(Mutex::new(BTreeMap::new()))
    }

    /// Count one occurrence of `key`.
    pub fn add(&self, key: K) {
        *self
            .0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(key)
            .or_default() += 1;
    }

    /// Every count so far.
    pub fn snapshot(&self) -> BTreeMap<K, u64> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

impl<K: Ord + Clone> Default for Counts<K> {
    fn default() -> Self {
        Counts::new()
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn counts_per_key() {
        static C: super::Counts<(&str, u16)> = super::Counts::new();
        C.add(("get", 200));
        C.add(("get", 200));
        C.add(("get", 404));
        let s = C.snapshot();
        assert_eq!(s.get(&("get", 200)), Some(&2));
        assert_eq!(s.get(&("get", 404)), Some(&1));
    }
}
