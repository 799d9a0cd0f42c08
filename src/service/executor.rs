//! The one plan executor: every feature's decision is carried out here.
//!
//! A [`Plan`] is performed effect by effect (or all at once where the plan
//! says its writes are independent); each outcome goes into the mutation
//! cache and then to the feature's [`After`] hook, which records it in the
//! feature's own memory and may ask for more: effects to run next (a
//! reboot command's failure recorded on its node) or a new plan for the
//! rest (a lease held elsewhere). The first error ends the plan and is
//! returned; nothing after it runs.
//!
//! **The give-back rule.** A plan may write a status that says "given
//! back" (Settling, Done, Failed) before the writes that give the node
//! back, and those may fail. The executor does not undo the status; the
//! decisions are level-triggered instead: every phase that says given back
//! asks for the give-back again (our NodeMaintenance deleted, the need
//! cleared) on every pass until the world agrees. So a failed write at any
//! point costs one more pass, never a node held for ever.
//!
//! **Wake-ups.** What the executor returns is never "now": a wake-up is
//! floored at [`MIN_WAKE`], so no decision can make a task run back to
//! back on the one-thread executor that also drives the HTTP/2 connection,
//! the leader lease and `/healthz`.

use std::collections::VecDeque;
use std::time::Duration;

use super::context::Context;
use crate::decide::{Effect, HostAction, Outcome, Plan, Then};
use crate::error::Result;

/// The shortest wait any pass or reconcile asks for (the scheduler's
/// floors live with the scheduler).
pub use super::passes::MIN_WAKE;

/// What a feature wants after one outcome.
pub enum After {
    /// Go on with the plan.
    Go,
    /// Run these first, then go on.
    First(Vec<Effect>),
    /// Drop what is left; perform this plan instead.
    Instead(Plan),
}

/// What a feature wants before one effect is performed.
pub enum Before {
    /// Perform it.
    Perform,
    /// Leave it out (already done in this pass, or it depended on an
    /// effect that failed); its `after` is not called.
    Skip,
    /// The feature carried it out itself (a write started on a task of its
    /// own); `after` sees this outcome.
    Done(Outcome),
}

/// A feature's hooks around each effect of a plan.
pub trait Hooks {
    /// Before `effect` runs; an error ends the plan as a failed write does.
    fn before(&mut self, _effect: &Effect) -> Result<Before> {
        Ok(Before::Perform)
    }
    /// After `effect` ran with `outcome` (already in the mutation cache).
    fn after(&mut self, effect: &Effect, outcome: &Outcome) -> After;
}

/// Hooks that only look at outcomes.
struct AfterOnly<F>(F);

impl<F: FnMut(&Effect, &Outcome) -> After> Hooks for AfterOnly<F> {
    fn after(&mut self, effect: &Effect, outcome: &Outcome) -> After {
        (self.0)(effect, outcome)
    }
}

/// Perform `plan` for `who` (a name for the debug log); `after` sees every
/// outcome. Returns when to decide again (floored, see [`MIN_WAKE`]), or
/// the first error.
pub async fn execute(
    ctx: &Context,
    who: &str,
    plan: Plan,
    after: impl FnMut(&Effect, &Outcome) -> After + Send,
) -> Result<Then> {
    run(ctx, who, plan, &mut AfterOnly(after)).await
}

/// [`execute`] with a hook before each effect as well.
///
/// Effects run one after another unless the plan says `together`; a run
/// of provider calls in a row runs at once (each is a process that may
/// take seconds, and a plan puts calls in a row only when none needs
/// another's answer), their outcomes taken in order.
///
/// The hooks are a trait object: one copy of this state machine in the
/// binary for every feature, not one per closure (the static binary's
/// size budget is 8 MiB).
pub async fn run(
    ctx: &Context,
    who: &str,
    plan: Plan,
    hooks: &mut (dyn Hooks + Send),
) -> Result<Then> {
    let mut together = plan.together;
    let mut note = plan.note;
    let mut then = plan.then;
    let mut queue: VecDeque<Effect> = plan.effects.into();
    while let Some(head) = queue.pop_front() {
        let provider = matches!(head, Effect::Provider { .. });
        let mut batch = vec![head];
        while let Some(next) = queue.front() {
            if together || (provider && matches!(next, Effect::Provider { .. })) {
                batch.extend(queue.pop_front());
            } else {
                break;
            }
        }
        let mut decided = Vec::with_capacity(batch.len());
        for effect in batch {
            match hooks.before(&effect)? {
                Before::Perform => decided.push((effect, None)),
                Before::Skip => {}
                Before::Done(outcome) => decided.push((effect, Some(outcome))),
            }
        }
        let outcomes = crate::runtime::join_all(
            decided
                .iter()
                .map(|(effect, done)| async move {
                    match done {
                        Some(o) => Ok(o.clone()),
                        None => perform(ctx, who, effect).await,
                    }
                })
                .collect(),
        )
        .await;
        let (mut failed, mut instead, mut first) = (None, None, Vec::new());
        for ((effect, _), outcome) in decided.iter().zip(outcomes) {
            match outcome {
                Ok(outcome) => {
                    ctx.remember_effect(effect, &outcome);
                    match hooks.after(effect, &outcome) {
                        After::Go => {}
                        After::First(more) => first.extend(more),
                        After::Instead(plan) => instead = instead.or(Some(plan)),
                    }
                }
                Err(e) => {
                    // A create whose answer was lost may have happened: it
                    // is read as existing until the store shows it or a
                    // while passes (`FreshCache::unseen`), or two features
                    // deciding meanwhile could both take the node (the
                    // random worlds' store lag found it).
                    if e.possibly_applied() {
                        ctx.remember_unanswered(effect);
                    }
                    failed.get_or_insert(e);
                }
            }
        }
        if let Some(e) = failed {
            return Err(e);
        }
        if let Some(plan) = instead {
            together = plan.together;
            note = plan.note;
            then = plan.then;
            queue = plan.effects.into();
            continue;
        }
        for e in first.into_iter().rev() {
            queue.push_front(e);
        }
    }
    if let Some((level, line)) = &note {
        log::log!(*level, "{line}");
    }
    Ok(floor(then))
}

/// The node role's answer to "can these commands run on this host?"
/// (`decide::command_check`), asked before the node can be admitted: looked
/// at off the loop's thread, logged and written to the node only when it
/// changed (`record` gives the write, or `None` when the node says so
/// already). `what` names the object and its commands in the log.
pub async fn record_command_check(
    ctx: &Context,
    name: &str,
    what: &str,
    actions: Vec<HostAction>,
    record: impl FnOnce(&std::result::Result<(), String>) -> Option<Effect>,
) -> Result<()> {
    let argvs = actions
        .iter()
        .filter_map(|a| a.argv())
        .map(<[String]>::to_vec)
        .collect();
    let talos = actions.iter().any(|a| a.argv().is_none());
    let answer = match crate::effects::host::can_run_bounded(argvs, ctx.effects.exec).await {
        // Talos's API: machined's socket must be there (mounted into the
        // extension service).
        Ok(()) if talos => ctx.effects.talos.reachable(),
        other => other,
    };
    let Some(write) = record(&answer) else {
        return Ok(());
    };
    match &answer {
        Ok(()) => log::info!("node {name}: {what} can run here"),
        Err(why) => {
            log::warn!("node {name}: {what} cannot run here ({why}); the node is not admitted")
        }
    }
    execute_plain(ctx, &format!("node {name}"), Plan::steps(vec![write]))
        .await
        .map(|_| ())
}

/// Perform one plan and go on whatever its outcomes (for features with
/// nothing to record beyond the mutation cache).
pub async fn execute_plain(ctx: &Context, who: &str, plan: Plan) -> Result<Then> {
    execute(ctx, who, plan, |_, _| After::Go).await
}

/// Independent clean-up writes decided over every node (a feature's marks
/// its objects no longer own): performed together; a failure is seen
/// again on the next pass, which looks again within [`CLEANUP_RETRY`].
pub async fn clean_up(ctx: &Context, who: &str, effects: Vec<Effect>) -> Option<Duration> {
    if effects.is_empty() {
        return None;
    }
    let n = effects.len();
    let plan = Plan {
        effects,
        together: true,
        then: Then::Wait(None),
        note: Some((log::Level::Info, format!("{who}: removed on {n} node(s)"))),
    };
    match execute_plain(ctx, who, plan).await {
        Ok(_) => None,
        Err(e) => {
            log::warn!("{who}: {e} (trying again in {} s)", CLEANUP_RETRY.as_secs());
            Some(CLEANUP_RETRY)
        }
    }
}

/// How soon a failed clean-up is tried again.
pub const CLEANUP_RETRY: Duration = Duration::from_secs(5);

/// A wake-up no shorter than [`MIN_WAKE`].
pub fn floor(then: Then) -> Then {
    match then {
        Then::Wait(Some(d)) => Then::Wait(Some(d.max(MIN_WAKE))),
        other => other,
    }
}

/// When a scheduler pass looks again after this plan: `Again` is soon, not
/// at once (the pass decides again on the store our writes reach).
pub fn wake(then: Then) -> Option<Duration> {
    match floor(then) {
        Then::Wait(d) => d,
        Then::Again => Some(MIN_WAKE),
    }
}

async fn perform(ctx: &Context, who: &str, effect: &Effect) -> Result<Outcome> {
    log::debug!("{who}: {}", crate::effects::describe(effect));
    match ctx.effects.perform(effect).await {
        // The lifecycle conditions (KEP-5683) are a courtesy to other
        // readers: a refused write never holds up a drain, an uncordon or
        // a reboot. A Node deleted meanwhile (a replaced or decommissioned
        // node) has none to publish: not worth a warning.
        Err(e) if matches!(effect, Effect::PatchNodeStatus { .. }) => {
            let gone = matches!(&e, crate::error::Error::Kube { source: kube::Error::Api(s), .. } if s.code == 404);
            if gone {
                log::debug!("{who}: {e}; the node is gone, no lifecycle conditions");
            } else {
                log::warn!(
                    "{who}: {e}; going on without the lifecycle conditions, tried again in 60 s"
                );
            }
            Ok(Outcome::StatusRefused)
        }
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_wake_up_is_shorter_than_the_floor() {
        assert_eq!(
            floor(Then::Wait(Some(Duration::ZERO))),
            Then::Wait(Some(MIN_WAKE))
        );
        assert_eq!(wake(Then::Wait(Some(Duration::ZERO))), Some(MIN_WAKE));
        assert_eq!(wake(Then::Again), Some(MIN_WAKE));
        assert_eq!(wake(Then::Wait(None)), None);
        let long = Duration::from_secs(5);
        assert_eq!(wake(Then::Wait(Some(long))), Some(long));
    }
}
