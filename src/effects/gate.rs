//! The gate every effect passes: whether this process may still start
//! effects as the cluster role's leader ([`LeaderGate`]), and how many are
//! running ([`InFlight`]), so that a leader stepping down hands its lease
//! over only once none is. The election that opens and closes it is
//! `service::leader`.

use std::sync::{Arc, Mutex};
#[cfg(test)]
use std::time::Duration;
use std::time::Instant;

use crate::error::{Error, Result};

/// Whether this process may still start effects as the cluster role's
/// leader. A replica that is not leader-elected (the node role) always may.
/// A leader may only until its renew deadline: 10 s after the start of its
/// last successful renewal, 5 s before the 15 s lease could pass to another
/// replica. So no effect of an old leader starts after a new one could
/// have begun, and only resourceVersion-guarded writes already in flight
/// can meet a new leader's.
///
/// It also counts the effects running, so a leader that steps down
/// (`service::leader::Leadership::step_down`) hands its lease over only once none is.
#[derive(Clone, Default)]
pub struct LeaderGate(Option<Arc<GateState>>);

#[derive(Default)]
struct GateState {
    until: Mutex<Option<Instant>>,
    in_flight: std::sync::atomic::AtomicUsize,
}

/// An effect running under the gate (counted until dropped).
pub struct InFlight(Option<Arc<GateState>>);

impl Drop for InFlight {
    fn drop(&mut self) {
        if let Some(state) = &self.0 {
            state
                .in_flight
                .fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
        }
    }
}

impl LeaderGate {
    /// A gate that never closes (no leader election).
    pub fn always() -> LeaderGate {
        LeaderGate(None)
    }

    pub(crate) fn elected() -> LeaderGate {
        LeaderGate(Some(Arc::default()))
    }

    fn slot(&self) -> Option<std::sync::MutexGuard<'_, Option<Instant>>> {
        self.0
            .as_ref()
            .map(|s| s.until.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// [`LeaderGate::may_act`], and count the effect until the guard drops.
    pub fn enter(&self) -> Result<InFlight> {
        // Counted before the check, released if it fails: checked first, a
        // step-down could revoke, read no effect in flight and hand the
        // lease over between the check and the count.
        if let Some(state) = &self.0 {
            state
                .in_flight
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
        let guard = InFlight(self.0.clone());
        self.may_act()?;
        Ok(guard)
    }

    pub(crate) fn in_flight(&self) -> usize {
        self.0
            .as_ref()
            .map_or(0, |s| s.in_flight.load(std::sync::atomic::Ordering::SeqCst))
    }

    /// `Ok` while effects may start; [`Error::LostLease`] once the lease is
    /// in doubt.
    pub fn may_act(&self) -> Result<()> {
        match self.slot() {
            None => Ok(()),
            Some(until) => match *until {
                Some(t) if Instant::now() < t => Ok(()),
                _ => Err(Error::LostLease(
                    "the leader lease was not renewed in time; starting nothing more".into(),
                )),
            },
        }
    }

    /// A leader's gate, closed until [`LeaderGate::open_for_test`].
    #[cfg(test)]
    pub fn closed_for_test() -> LeaderGate {
        LeaderGate::elected()
    }

    #[cfg(test)]
    pub fn open_for_test(&self, d: Duration) {
        self.extend(Instant::now() + d)
    }

    pub(crate) fn extend(&self, until: Instant) {
        if let Some(mut slot) = self.slot() {
            *slot = Some(until);
        }
    }

    pub(crate) fn revoke(&self) {
        if let Some(mut slot) = self.slot() {
            *slot = None;
        }
    }
}
