//! The async runtime: one smol executor, with every future wrapped in
//! `async_compat::Compat`.
//!
//! **Threads.** By default spawned tasks run on one helper thread and a
//! caller of [`block_on`] only waits for its own future (what smol's
//! global executor did). A node agent runs without the helper
//! ([`tasks_on_callers_only`]): its tasks run on the thread waiting in
//! [`block_on`], beside the service's loop. Every response it reads
//! passes from async-compat's tokio thread (the sockets) to the thread
//! that runs the waiting task, and a third thread in that hand-off cost a
//! sixth of the node role's CPU per drain (tests/README.md, "Where the
//! node role's CPU goes"). The cluster role keeps the helper: its passes
//! over thousands of nodes must not hold up its watches, and sharing both
//! threads between loop and tasks measured no better for it.
//!
//! **Architecture invariant:** kube's client (hyper, tower, tokio timers)
//! needs a tokio reactor and panics with "no reactor running" when polled
//! without one. We run no tokio runtime of our own; `Compat` lends one to each
//! poll. Every future that may touch kube is started through [`block_on`] or
//! [`spawn`] here, and nowhere else calls `smol::block_on` or `smol::spawn`.

use std::future::Future;
use std::time::Duration;

use std::cell::Cell;
use std::sync::LazyLock;
use std::sync::atomic::{AtomicBool, Ordering};

use async_compat::Compat;

/// Every task of the process.
static EXECUTOR: LazyLock<smol::Executor<'static>> = LazyLock::new(smol::Executor::new);

/// Whether a helper thread runs the tasks (the default), or the callers of
/// [`block_on`] do while they wait.
static HELPER: AtomicBool = AtomicBool::new(true);

/// The helper thread, started by the first [`spawn`] or [`block_on`].
static HELPER_STARTED: std::sync::Once = std::sync::Once::new();

thread_local! {
    /// Set while this thread runs the executor inside [`block_on`]: a
    /// `block_on` nested in a task only waits, it never runs other tasks
    /// inside that task's poll.
    static RUNNING_TASKS: Cell<bool> = const { Cell::new(false) };
}

/// Run tasks on the threads waiting in [`block_on`], with no helper
/// thread. Call it before the first [`spawn`] and [`block_on`]; the node
/// role's start-up does (see the module's comment for why).
pub fn tasks_on_callers_only() {
    HELPER.store(false, Ordering::Relaxed);
}

/// A mutex's guard, a poisoned one as it is: a panicked holder (a test's,
/// a bug's) must not take every later reader down with it. The one
/// helper for every `Mutex` of the service.
pub fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Run `fut` to completion on the current thread, inside `Compat`; with no
/// helper thread ([`tasks_on_callers_only`]), running the executor's tasks
/// while it waits.
pub fn block_on<F: Future>(fut: F) -> F::Output {
    if RUNNING_TASKS.get() {
        return wait_here(fut);
    }
    if HELPER.load(Ordering::Relaxed) {
        HELPER_STARTED.call_once(start_helper);
    }
    if HELPER.load(Ordering::Relaxed) {
        return wait_here(fut);
    }
    run_tasks_until(Compat::new(fut))
}

/// Run the executor's tasks on this thread until `fut` is done.
fn run_tasks_until<F: Future>(fut: F) -> F::Output {
    /// Clears the flag however the wait ends, a panic included.
    struct Running;
    impl Drop for Running {
        fn drop(&mut self) {
            RUNNING_TASKS.set(false);
        }
    }
    RUNNING_TASKS.set(true);
    let _running = Running;
    smol::block_on(EXECUTOR.run(fut))
}

/// Run `fut` to completion on the current thread, inside `Compat`, and
/// nothing else: for a thread that must not take tasks (one of
/// `smol::unblock`'s, or a task's own nested wait).
pub fn wait_here<F: Future>(fut: F) -> F::Output {
    smol::block_on(Compat::new(fut))
}

/// Spawn `fut` on the executor, inside `Compat`. Dropping the task cancels
/// it; call `.detach()` to let it run on.
pub fn spawn<F>(fut: F) -> smol::Task<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    if HELPER.load(Ordering::Relaxed) {
        HELPER_STARTED.call_once(start_helper);
    }
    EXECUTOR.spawn(Compat::new(fut))
}

/// One thread that runs tasks for as long as the process lives, started
/// by the first [`spawn`] or [`block_on`]. If it cannot be started, the
/// callers of [`block_on`] run the tasks instead.
fn start_helper() {
    let started = std::thread::Builder::new()
        .name("tasks".into())
        .spawn(|| run_tasks_until(std::future::pending::<()>()));
    if let Err(e) = started {
        log::warn!("no helper thread for tasks ({e}); the main thread runs them");
        HELPER.store(false, Ordering::Relaxed);
    }
}

/// Runs hyper's connection tasks (an HTTP/2 connection is a task of its
/// own) on smol, inside `Compat`, like every other future of ours.
#[derive(Clone, Copy)]
pub(crate) struct SmolExecutor;

impl<F> hyper::rt::Executor<F> for SmolExecutor
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    fn execute(&self, fut: F) {
        spawn(fut).detach();
    }
}

/// Await every future at once, their outputs in order (smol has `zip`
/// for two; the futures crate's `join_all` is not a dependency).
pub async fn join_all<F: Future>(futures: Vec<F>) -> Vec<F::Output> {
    let mut futures: Vec<std::pin::Pin<Box<F>>> = futures.into_iter().map(Box::pin).collect();
    let mut done: Vec<Option<F::Output>> = futures.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (f, out) in futures.iter_mut().zip(done.iter_mut()) {
            if out.is_none() {
                match f.as_mut().poll(cx) {
                    std::task::Poll::Ready(v) => *out = Some(v),
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    })
    .await;
    done.into_iter().flatten().collect()
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

/// A one-way gate that any number of tasks can wait on: once [`Latch::open`]
/// is called, every current and future [`Latch::wait`] returns at once.
///
/// Why not kube-runtime's `Store::wait_until_ready`: in kube-runtime 5 it is
/// a oneshot channel behind a `DelayedInit`, which keeps the waker of the
/// last poller only. The `Controller` itself waits on its node store that
/// way, so a second waiter on the same store (our readiness task did) steals
/// the controller's waker or has its own stolen: the loser sleeps forever.
/// That is how an agent started, served /metrics and never reconciled. A
/// closed channel wakes every listener (event-listener's notify-all).
#[derive(Clone)]
pub struct Latch {
    open: std::sync::Arc<std::sync::Mutex<Option<smol::channel::Sender<()>>>>,
    waiter: smol::channel::Receiver<()>,
}

impl Default for Latch {
    fn default() -> Self {
        let (tx, rx) = smol::channel::bounded(1);
        Latch {
            open: std::sync::Arc::new(std::sync::Mutex::new(Some(tx))),
            waiter: rx,
        }
    }
}

impl Latch {
    /// Open the gate (idempotent): closing the channel wakes every waiter.
    pub fn open(&self) {
        let sender = self.open.lock().unwrap_or_else(|p| p.into_inner()).take();
        drop(sender);
    }

    pub fn is_open(&self) -> bool {
        self.waiter.is_closed()
    }

    /// Resolve once the gate is open.
    pub async fn wait(&self) {
        // Nothing is ever sent: recv() returns only when the channel closes.
        let _ = self.waiter.recv().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The regression that kube-runtime's single-waker readiness caused:
    /// every one of many concurrent waiters must wake, not only the last.
    #[test]
    fn a_latch_wakes_every_waiter() {
        let latch = Latch::default();
        let waiters: Vec<_> = (0..16)
            .map(|_| {
                let l = latch.clone();
                spawn(async move { l.wait().await })
            })
            .collect();
        assert!(!latch.is_open());
        block_on(async {
            // Let every waiter register before the gate opens.
            for _ in 0..16 {
                smol::future::yield_now().await;
            }
            latch.open();
            latch.open();
            let all = async {
                for w in waiters {
                    w.await;
                }
            };
            assert!(timeout(Duration::from_secs(5), all).await.is_ok());
        });
        assert!(latch.is_open());
        block_on(latch.wait());
    }
}
