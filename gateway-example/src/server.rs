//! Serving the routes on a TCP listener, bounded: a cap on the connections served at once, a
//! header-read timeout, an accept loop that waits out a full file table instead of spinning, and
//! a graceful shutdown bounded by a grace period.
//!
//! Shutdown: accepting stops, idle connections are closed, and in-flight requests may finish for
//! up to the grace period. Then the streams still running are told to end (each gets its last
//! event and ends, so its lease settles what was metered), and whatever is still running a
//! moment later ([`FORCE_CLOSE_AFTER`]) is dropped: its connection closes, and a response body
//! dropped settles its lease too.
//!
//! At the cap no connection is accepted: new ones wait in the kernel's backlog until one ends.
//! Hyper starts the header-read timer when a connection begins waiting for a request head (just
//! accepted, or idle after a response), so the same timeout closes a client that sends its head
//! slowly and a keep-alive connection left idle.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use axum::response::Response;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use pin_project_lite::pin_project;
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};

use crate::config::GatewayConfig;

/// How long the accept loop sleeps after the process or the system ran out of file handles.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);
/// At most one log line per this long about accept errors.
const ACCEPT_LOG_EVERY: Duration = Duration::from_secs(1);
/// After the grace period, how long the streams told to end have to send their last event
/// before their connections are dropped.
pub const FORCE_CLOSE_AFTER: Duration = Duration::from_secs(1);

/// A connection's instruction, in the order they are given: serve; finish what is in flight,
/// then close; close now. A later one includes the earlier (a connection waits for `>=`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Stop {
    Serve,
    Finish,
    Close,
}

/// The connection limits [`serve`] applies.
#[derive(Debug, Clone, Copy)]
pub struct ServerLimits {
    /// A connection that has not sent a whole request head this long after it began waiting
    /// for one is closed.
    pub header_read_timeout: Duration,
    /// Connections served at once (at least 1).
    pub max_connections: usize,
    /// After the shutdown signal, how long in-flight requests may still run.
    pub shutdown_grace: Duration,
}

impl ServerLimits {
    /// The limits a gateway config sets (`general_settings`).
    pub fn from_config(config: &GatewayConfig) -> Self {
        Self {
            header_read_timeout: config.header_read_timeout,
            max_connections: config.max_connections,
            shutdown_grace: config.shutdown_grace,
        }
    }
}

/// Serves `app` on `listener` until `shutdown` resolves; then stops accepting, lets the
/// connections' in-flight requests finish (idle connections are closed) for up to
/// `limits.shutdown_grace`, then calls `end_streams` and, [`FORCE_CLOSE_AFTER`] later, closes
/// the connections still open; returns when every connection is closed.
pub async fn serve<S>(
    listener: TcpListener,
    app: S,
    limits: ServerLimits,
    shutdown: impl Future<Output = ()>,
    end_streams: impl FnOnce(),
) where
    S: tower::Service<http::Request<Incoming>, Response = Response, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    let max = limits
        .max_connections
        .clamp(1, Semaphore::MAX_PERMITS.min(u32::MAX as usize));
    let slots = Arc::new(Semaphore::new(max));
    let (stop_tx, stop_rx) = watch::channel(Stop::Serve);
    let mut last_log: Option<Instant> = None;
    tokio::pin!(shutdown);
    loop {
        // A slot first: at the cap, nothing is accepted and new connections wait in the backlog.
        let permit = tokio::select! {
            () = &mut shutdown => break,
            permit = slots.clone().acquire_owned() => match permit {
                Ok(p) => p,
                Err(_) => break,
            },
        };
        let stream = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    on_accept_error(&e, &mut last_log);
                    // Out of file handles (or another passing error): wait a little rather than
                    // spin, and try again; the slot goes back meanwhile.
                    drop(permit);
                    tokio::select! {
                        () = &mut shutdown => break,
                        () = tokio::time::sleep(ACCEPT_BACKOFF) => {},
                    }
                    continue;
                }
            },
        };
        // Each response part (a head, a stream's event) goes out when written: with Nagle's
        // algorithm a small write waits for the client's (delayed) ACK of the previous one.
        let _ = stream.set_nodelay(true);
        let service = TowerToHyperService::new(app.clone());
        let header_read_timeout = limits.header_read_timeout;
        let mut stop = stop_rx.clone();
        tokio::spawn(async move {
            let _permit = permit;
            // Heads and body chunks are small: copied into one buffer and written with one
            // `write` they cost less than a `writev` of their pieces (benches/notes/proxy-path.md).
            let conn = http1::Builder::new()
                .writev(false)
                .timer(TokioTimer::new())
                .header_read_timeout(header_read_timeout)
                .serve_connection(TokioIo::new(stream), service);
            tokio::pin!(conn);
            match UntilStop::new(conn.as_mut(), &mut stop, Stop::Finish).await {
                Some(result) => return log_connection_end(result),
                None => conn.as_mut().graceful_shutdown(),
            }
            // Else dropped, with the response it was sending (its lease settles on drop).
            if let Some(result) = UntilStop::new(conn.as_mut(), &mut stop, Stop::Close).await {
                log_connection_end(result);
            }
        });
    }
    drop(listener);
    let _ = stop_tx.send(Stop::Finish);
    // Every connection holds a slot until it ends: all slots back means all connections ended.
    let all_closed = || slots.acquire_many(max as u32);
    if tokio::time::timeout(limits.shutdown_grace, all_closed())
        .await
        .is_ok()
    {
        return;
    }
    let open = max - slots.available_permits();
    tracing::warn!(
        connections = open,
        "shutdown grace period ({:.1} s) over: ending the requests still running",
        limits.shutdown_grace.as_secs_f64()
    );
    end_streams();
    if tokio::time::timeout(FORCE_CLOSE_AFTER, all_closed())
        .await
        .is_err()
    {
        let _ = stop_tx.send(Stop::Close);
        let _ = all_closed().await;
    }
}

pin_project! {
    /// `conn`, until the server's instruction reaches `at` (or the server is gone): `Some` with
    /// its output if it ends first, else `None`.
    ///
    /// Why not `select!` on `stop.wait_for(..)`: that polls the watch on every wake-up of the
    /// connection (a lock, the runtime's budget), two or three a request. Here a wake-up pays two
    /// atomic loads (`has_changed`, the registration's `NotingWaker`); the watch is polled only to
    /// register this task's waker, again when the waker changes, after the instruction changed,
    /// or when the registration fired without a change (see [`NotingWaker`]).
    struct UntilStop<'a, C> {
        #[pin]
        conn: C,
        stop: &'a mut watch::Receiver<Stop>,
        at: Stop,
        // Resolves at the next change of the instruction; polled with the `NotingWaker` waker.
        registration: Option<(Pin<Box<dyn Future<Output = ()> + Send>>, Arc<NotingWaker>, Waker)>,
    }
}

impl<'a, C: Future> UntilStop<'a, C> {
    fn new(conn: C, stop: &'a mut watch::Receiver<Stop>, at: Stop) -> Self {
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

fn log_connection_end(result: Result<(), hyper::Error>) {
    if let Err(e) = result {
        tracing::debug!("connection ended: {e}");
    }
}

/// Logs an accept error, at most once per [`ACCEPT_LOG_EVERY`].
fn on_accept_error(e: &io::Error, last_log: &mut Option<Instant>) {
    let now = Instant::now();
    if last_log.is_some_and(|t| now.duration_since(t) < ACCEPT_LOG_EVERY) {
        return;
    }
    *last_log = Some(now);
    if is_out_of_files(e) {
        tracing::warn!(
            "accept error: {e}; backing off (raise the open-file limit, or lower \
             general_settings.max_connections)"
        );
    } else {
        tracing::warn!("accept error: {e}; backing off");
    }
}

/// Raises the soft open-file limit to the hard one, where the system allows it, so that
/// `max_connections` rather than a default of 1024 decides how many clients are served. Logs
/// what it did; a failure (or a platform without the limit) changes nothing and is logged.
pub fn raise_file_limit() {
    let before = open_file_limits().and_then(|(soft, _)| soft);
    match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(after) => match before {
            Some(before) if after > before => {
                tracing::info!("raised the open-file limit from {before} to {after}");
            }
            _ => tracing::debug!("open-file limit {after}"),
        },
        Err(e) => tracing::warn!("could not raise the open-file limit: {e}"),
    }
}

/// The process's soft and hard open-file limits, read from `/proc/self/limits` (Linux; `None`
/// elsewhere or when unreadable).
pub fn open_file_limits() -> Option<(Option<u64>, Option<u64>)> {
    let text = std::fs::read_to_string("/proc/self/limits").ok()?;
    parse_open_file_limits(&text)
}

/// The "Max open files" line of a `/proc/<pid>/limits` text: (soft, hard), `None` meaning
/// unlimited.
fn parse_open_file_limits(text: &str) -> Option<(Option<u64>, Option<u64>)> {
    let line = text.lines().find(|l| l.starts_with("Max open files"))?;
    let mut fields = line["Max open files".len()..].split_whitespace();
    let mut limit = || match fields.next()? {
        "unlimited" => Some(None),
        n => n.parse().ok().map(Some),
    };
    Some((limit()?, limit()?))
}

/// Warns at start-up when `max_connections` leaves no room under the soft open-file limit (each
/// connection is one file; the gateway needs some more of its own: upstream and Redis
/// connections, the key store).
pub fn warn_if_file_limit_is_low(max_connections: usize) {
    let Some((Some(soft), hard)) = open_file_limits() else {
        return;
    };
    let wanted = max_connections as u64 + 256;
    if soft < wanted {
        let hard = hard.map_or("unlimited".to_owned(), |h| h.to_string());
        tracing::warn!(
            "the open-file limit ({soft}, hard limit {hard}) is below general_settings.\
             max_connections ({max_connections}) plus room for upstream connections: raise it \
             (ulimit -n) or lower max_connections; when files run out, accepting pauses"
        );
    }
}

/// EMFILE (the process's file limit) or ENFILE (the system's).
fn is_out_of_files(e: &io::Error) -> bool {
    // EMFILE is 24 and ENFILE 23 on Linux and the BSDs.
    matches!(e.raw_os_error(), Some(23 | 24))
}

#[cfg(test)]
mod tests {
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

    #[test]
    fn out_of_files_is_emfile_or_enfile() {
        assert!(is_out_of_files(&io::Error::from_raw_os_error(24)));
        assert!(is_out_of_files(&io::Error::from_raw_os_error(23)));
        assert!(!is_out_of_files(&io::Error::from_raw_os_error(104)));
        assert!(!is_out_of_files(&io::Error::other("x")));
    }

    #[test]
    fn accept_errors_are_logged_at_most_once_a_second() {
        let mut last = None;
        let e = io::Error::from_raw_os_error(24);
        on_accept_error(&e, &mut last);
        let first = last;
        assert!(first.is_some());
        on_accept_error(&e, &mut last);
        assert_eq!(
            last, first,
            "a second error within the second is not logged"
        );
    }

    #[test]
    fn the_open_file_limits_are_read_from_proc_limits() {
        let text = "Limit                     Soft Limit           Hard Limit           Units     \n\
                    Max processes             63704                63704                processes \n\
                    Max open files            1024                 524288               files     \n";
        assert_eq!(
            parse_open_file_limits(text),
            Some((Some(1024), Some(524_288)))
        );
        let unlimited =
            "Max open files            unlimited            unlimited            files\n";
        assert_eq!(parse_open_file_limits(unlimited), Some((None, None)));
        assert_eq!(parse_open_file_limits("nothing here"), None);
    }
}
