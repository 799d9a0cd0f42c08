//! The scheduler loop of the cluster role's tasks (the cluster passes,
//! replacement): [`Kick`]s that ask for a pass, and [`run_passes`], which
//! runs one pass at a time, folds the changes made during a pass into one
//! more, wakes when a pass asked to look again, and never spins: a floor
//! between passes, and a closed leader gate skips passes without ending
//! the loop.

use std::time::Duration;

/// A handle that asks for one more pass. Cloning it is cheap; kicking a
/// scheduler that already has a pass asked for does nothing.
#[derive(Clone)]
pub struct Kick(smol::channel::Sender<()>);

impl Kick {
    /// A kick and the receiving end its scheduler waits on.
    pub fn new() -> (Kick, smol::channel::Receiver<()>) {
        let (tx, rx) = smol::channel::bounded(1);
        (Kick(tx), rx)
    }

    /// Ask for a pass (coalesced with any pending one).
    pub fn kick(&self) {
        let _ = self.0.try_send(());
    }
}

/// How soon a scheduler looks again while the leader gate is closed (a
/// renewal is late; it reopens when one succeeds).
const GATE_RECHECK: std::time::Duration = std::time::Duration::from_secs(1);

/// The loop of a scheduler task (the cluster passes, replacement): one
/// pass at start, then one per burst of kicks or when the last pass asked
/// to look again (`pass` returns when), until `kicks` closes.
///
/// A closed leader gate skips passes and looks again soon; it never ends
/// the loop. The gate closes while a renewal is merely late (an API server
/// restart) and reopens when one succeeds; a loop that returned then left
/// a leader that renewed its lease for ever and decided nothing. A lease
/// really lost ends the process (`service::run`), not this loop.
pub async fn run_passes<F, Fut>(
    gate: &crate::effects::gate::LeaderGate,
    kicks: &smol::channel::Receiver<()>,
    mut pass: F,
) where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<std::time::Duration>>,
{
    use std::time::Instant;
    let mut due: Option<Instant> = Some(Instant::now());
    // Passes in a row that only the timer started and that asked to look
    // again within a second: a decision asking for "soon" again and again
    // while nothing changes. Past a point such passes are spaced out.
    let mut quick = 0u32;
    loop {
        let kicked = async { kicks.recv().await.map(|()| Some(true)).unwrap_or(None) };
        let timer = async {
            match due {
                Some(t) => {
                    smol::Timer::at(t).await;
                    Some(false)
                }
                None => smol::future::pending().await,
            }
        };
        let Some(by_kick) = smol::future::or(kicked, timer).await else {
            return;
        };
        // Kicks that came with this one are answered by this pass.
        while kicks.try_recv().is_ok() {}
        if gate.may_act().is_err() {
            due = Some(Instant::now() + GATE_RECHECK);
            continue;
        }
        let wake = pass().await;
        if by_kick || wake.is_none_or(|d| d >= Duration::from_secs(1)) {
            quick = 0;
        } else {
            quick = quick.saturating_add(1);
        }
        due = wake.map(|d| Instant::now() + pass_floor(d, quick));
        if gate.may_act().is_err() {
            // Effects refused mid-pass left no wake-up of their own.
            due = Some(Instant::now() + GATE_RECHECK);
        }
    }
}

/// The shortest wait any pass or reconcile asks for.
pub const MIN_WAKE: Duration = Duration::from_millis(100);

/// The shortest wait between passes: no pass ever asks for "now" (a
/// deadline that has passed means "look again later"), and after
/// [`QUICK_PASSES`] timer-started passes in a row that each asked for less
/// than a second, a second: a decision that keeps asking for "soon" while
/// nothing changes is a defect to see in the log, not a core to burn.
fn pass_floor(asked: Duration, quick: u32) -> Duration {
    let floor = if quick > QUICK_PASSES {
        Duration::from_secs(1)
    } else {
        MIN_WAKE
    };
    if quick == QUICK_PASSES + 1 {
        log::warn!(
            "a scheduler pass asked to run again within {asked:?} {QUICK_PASSES} times in a row with nothing changing; spacing its passes 1 s apart until something does"
        );
    }
    asked.max(floor)
}

const QUICK_PASSES: u32 = 50;

/// A watch's inspector that kicks `kicks` at every event (never for a
/// watch error) if `enabled` (the cluster role).
pub fn on_event<K>(
    enabled: bool,
    kicks: Vec<Kick>,
) -> impl Fn(&std::result::Result<kube::runtime::watcher::Event<K>, kube::runtime::watcher::Error>)
{
    move |ev| {
        if enabled && ev.is_ok() {
            kicks.iter().for_each(Kick::kick);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::effects::gate::LeaderGate;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    /// Regression: a kick while the leader gate was closed (a renewal late
    /// during an API server restart) ended the loop for good, so the
    /// leader renewed its lease and decided nothing again.
    #[test]
    fn a_closed_gate_skips_passes_and_never_ends_the_loop() {
        crate::runtime::block_on(async {
            let gate = LeaderGate::closed_for_test();
            let (kick, kicks) = Kick::new();
            let passes = AtomicUsize::new(0);
            let looping = run_passes(&gate, &kicks, || async {
                passes.fetch_add(1, Ordering::SeqCst);
                None
            });
            let test = async {
                kick.kick();
                crate::runtime::sleep(Duration::from_millis(300)).await;
                assert_eq!(
                    passes.load(Ordering::SeqCst),
                    0,
                    "a pass ran behind a closed gate"
                );
                gate.open_for_test(Duration::from_secs(60));
                let mut waited = Duration::ZERO;
                while passes.load(Ordering::SeqCst) == 0 {
                    assert!(
                        waited < Duration::from_secs(5),
                        "no pass after the gate reopened"
                    );
                    crate::runtime::sleep(Duration::from_millis(20)).await;
                    waited += Duration::from_millis(20);
                }
                kick.kick();
                let mut waited = Duration::ZERO;
                while passes.load(Ordering::SeqCst) < 2 {
                    assert!(waited < Duration::from_secs(5), "a kick started no pass");
                    crate::runtime::sleep(Duration::from_millis(20)).await;
                    waited += Duration::from_millis(20);
                }
            };
            // The loop only ends when its kicks close; the test ends first.
            smol::future::or(
                async {
                    looping.await;
                    panic!("the pass loop ended")
                },
                test,
            )
            .await;
        });
    }
}
