//! The async runtime: smol executors, with every future wrapped in
//! `async_compat::Compat`.
//!
//! **Architecture invariant:** kube's client (hyper, tower, tokio timers)
//! needs a tokio reactor and panics with "no reactor running" when polled
//! without one. We run no tokio runtime of our own; `Compat` lends one to each
//! poll. Every future that may touch kube is started through [`block_on`] or
//! [`spawn`] here, and nowhere else calls `smol::block_on` or `smol::spawn`.

use std::future::Future;
use std::time::Duration;

use async_compat::Compat;

/// Run `fut` to completion on the current thread, inside `Compat`.
pub fn block_on<F: Future>(fut: F) -> F::Output {
    smol::block_on(Compat::new(fut))
}

/// Spawn `fut` on smol's global executor, inside `Compat`. Dropping the task
/// cancels it; call `.detach()` to let it run on.
pub fn spawn<F>(fut: F) -> smol::Task<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    smol::spawn(Compat::new(fut))
}

/// Sleep without a tokio timer (smol's timer works everywhere).
pub async fn sleep(d: Duration) {
    smol::Timer::after(d).await;
}

/// Resolve to `Err(())` if `fut` has not finished within `d`.
pub async fn timeout<F: Future>(d: Duration, fut: F) -> Result<F::Output, ()> {
    smol::future::or(async { Ok(fut.await) }, async {
        sleep(d).await;
        Err(())
    })
    .await
}

/// A future that resolves on the first SIGTERM or SIGINT. The signals are
/// read on a thread of their own so the future is `Send + Sync`, as kube's
/// `Controller::graceful_shutdown_on` requires.
pub fn shutdown_signal() -> std::io::Result<impl Future<Output = ()> + Send + Sync + 'static> {
    use async_signal::{Signal, Signals};
    let signals = Signals::new([Signal::Term, Signal::Int])?;
    let (tx, rx) = smol::channel::bounded::<()>(1);
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            smol::block_on(async {
                use smol::stream::StreamExt;
                let mut signals = signals;
                if let Some(Ok(sig)) = signals.next().await {
                    log::info!("received {sig:?}, shutting down");
                }
                drop(signals);
                let _ = tx.send(()).await;
            })
        })?;
    Ok(async move {
        let _ = rx.recv().await;
    })
}
