//! A connection run until the server's shutdown instruction reaches its stage, cheaply: a
//! wake-up of the connection costs two atomic loads, not a poll of the watch.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use pin_project_lite::pin_project;
use tokio::sync::watch;

use super::Stop;

pin_project! {
    /// `conn`, until the server's instruction reaches `at` (or the server is gone): `Some` with
    /// its output if it ends first, else `None`.
    ///
    /// Why not `select!` on `stop.wait_for(..)`: that polls the watch on every wake-up of the
    /// connection (a lock, the runtime's budget), two or three a request. Here a wake-up pays two
    /// atomic loads (`has_changed`, the registration's `NotingWaker`); the watch is polled only to
    /// register this task's waker, again when the waker changes, after the instruction changed,
    /// or when the registration fired without a change (see [`NotingWaker`]).
    pub(super) struct UntilStop<'a, C> {
        #[pin]
        conn: C,
        stop: &'a mut watch::Receiver<Stop>,
        at: Stop,
        // Resolves at the next change of the instruction; polled with the `NotingWaker` waker.
        registration: Option<(Pin<Box<dyn Future<Output = ()> + Send>>, Arc<NotingWaker>, Waker)>,
    }
}

impl<'a, C: Future> UntilStop<'a, C> {
    pub(super) fn new(conn: C, stop: &'a mut watch::Receiver<Stop>, at: Stop) -> Self {
        Self {
            conn,
            stop,
            at,
            registration: None,
        }
    }
}

impl<C: Future> Future for UntilStop<'_, C> {
    type Output = Option<C::Output>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        if let Poll::Ready(output) = this.conn.poll(cx) {
            return Poll::Ready(Some(output));
        }
        loop {
            match this.stop.has_changed() {
                // The server is gone: nothing will say more.
                Err(_) => return Poll::Ready(None),
                // A change, or the first look: as with `wait_for`, the instruction in force
                // counts, even one already seen (both stages' may come before a poll).
                Ok(changed) => {
                    if changed || this.registration.is_none() {
                        if *this.stop.borrow_and_update() >= *this.at {
                            return Poll::Ready(None);
                        }
                        // A change woke the registration: a new one is needed.
                        *this.registration = None;
                    }
                }
            }
            if let Some((next, fired, own)) = this.registration {
                if fired.task.will_wake(cx.waker()) {
                    if !fired.fired.swap(false, Ordering::AcqRel) {
                        // Armed, and nothing changed.
                        return Poll::Pending;
                    }
                    // It woke the task: polled, to arm it again or to see the change.
                    if next
                        .as_mut()
                        .poll(&mut Context::from_waker(own))
                        .is_pending()
                    {
                        return Poll::Pending;
                    }
                    *this.registration = None;
                    continue;
                }
            }
            let mut stop = this.stop.clone();
            let mut next: Pin<Box<dyn Future<Output = ()> + Send>> = Box::pin(async move {
                let _ = stop.changed().await;
            });
            let fired = Arc::new(NotingWaker {
                fired: AtomicBool::new(false),
                task: cx.waker().clone(),
            });
            let own = Waker::from(Arc::clone(&fired));
            if next
                .as_mut()
                .poll(&mut Context::from_waker(&own))
                .is_pending()
            {
                *this.registration = Some((next, fired, own));
                return Poll::Pending;
            }
            // Changed (or closed) since the load above: looked at again.
        }
    }
}

/// The waker an [`UntilStop`] registration is polled with: it notes that the registration woke
/// the task, so the next poll polls the registration again. A registration's waking is not
/// always a change: the watch, out of runtime budget, asks to be polled again instead of waiting
/// (tokio's cooperative scheduling), and a change's notice can reach a registration made just
/// after it. Unpolled after either, the registration would wait for nothing, and the next
/// instruction would never reach the connection.
struct NotingWaker {
    fired: AtomicBool,
    task: Waker,
}

impl std::task::Wake for NotingWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.fired.store(true, Ordering::Release);
        self.task.wake_by_ref();
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// A connection runs until the instruction reaches its stage (a lower one does not end
    /// it), ends with its own output when it finishes first, and stops when the server is gone;
    /// a wake-up that is not the watch's leaves the registration in place.
    #[tokio::test(start_paused = true)]
    async fn a_connection_runs_until_the_instruction_reaches_its_stage() {
        use std::future::poll_fn;

        let (tx, mut rx) = watch::channel(Stop::Serve);
        let mut polls = 0;
        let conn = poll_fn(|_| {
            polls += 1;
            Poll::<()>::Pending
        });
        let mut until = std::pin::pin!(UntilStop::new(conn, &mut rx, Stop::Close));
        let waker = std::task::Waker::noop();
        let mut cx = Context::from_waker(waker);
        assert!(until.as_mut().poll(&mut cx).is_pending());
        assert!(until.registration.is_some(), "registered at the first wait");
        assert!(until.as_mut().poll(&mut cx).is_pending());
        tx.send(Stop::Finish).unwrap();
        assert!(
            until.as_mut().poll(&mut cx).is_pending(),
            "Finish is not Close"
        );
        tx.send(Stop::Close).unwrap();
        assert_eq!(until.as_mut().poll(&mut cx), Poll::Ready(None));
        assert_eq!(polls, 4);

        // An instruction already seen counts: both stages' sent before the first stage looked.
        let (tx, mut rx) = watch::channel(Stop::Serve);
        tx.send(Stop::Close).unwrap();
        let first = UntilStop::new(std::future::pending::<()>(), &mut rx, Stop::Finish).await;
        let second = UntilStop::new(std::future::pending::<()>(), &mut rx, Stop::Close);
        let second = tokio::time::timeout(Duration::from_secs(10), second).await;
        assert_eq!((first, second), (None, Ok(None)));

        let (tx, mut rx) = watch::channel(Stop::Serve);
        let done = UntilStop::new(std::future::ready(7), &mut rx, Stop::Finish).await;
        assert_eq!(done, Some(7));
        let gone = UntilStop::new(std::future::pending::<()>(), &mut rx, Stop::Finish);
        drop(tx);
        assert_eq!(gone.await, None);

        // Woken by the watch: each change after the task went to sleep wakes it, the one
        // after a lower stage too.
        let (tx, mut rx) = watch::channel(Stop::Serve);
        let waiting = tokio::spawn(async move {
            UntilStop::new(std::future::pending::<()>(), &mut rx, Stop::Close).await
        });
        tokio::task::yield_now().await;
        tx.send(Stop::Finish).unwrap();
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        tx.send(Stop::Close).unwrap();
        let woken = tokio::time::timeout(Duration::from_secs(10), waiting).await;
        assert_eq!(woken.expect("woken by the change").unwrap(), None);
    }

    /// A registration made when the task's runtime budget is spent is not armed: the watch
    /// asks to be polled again instead. The next poll must arm it, or the next instruction
    /// never wakes the connection. (This ended about one shutdown in ten under load with a
    /// connection waiting on its upstream until that request's own timeout: its first stage
    /// ended in a poll that had spent the budget, so the second registered unarmed.)
    #[tokio::test(start_paused = true)]
    async fn a_registration_made_without_budget_is_armed_at_the_next_poll() {
        let (tx, mut rx) = watch::channel(Stop::Finish);
        let mut spent = false;
        // A connection whose first poll spends the task's whole budget, as a busy one can.
        let conn = std::future::poll_fn(move |cx| {
            if !std::mem::replace(&mut spent, true) {
                while std::pin::pin!(tokio::task::coop::consume_budget())
                    .poll(cx)
                    .is_ready()
                {}
                assert!(!tokio::task::coop::has_budget_remaining());
            }
            Poll::<()>::Pending
        });
        let waiting = tokio::spawn(async move { UntilStop::new(conn, &mut rx, Stop::Close).await });
        // Polled again (the watch asked for it), then left waiting.
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert!(!waiting.is_finished());
        tx.send(Stop::Close).unwrap();
        let woken = tokio::time::timeout(Duration::from_secs(10), waiting).await;
        assert_eq!(woken.expect("woken by Stop::Close").unwrap(), None);
    }
}
