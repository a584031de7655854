//! Serving the routes on a TCP listener, bounded: a cap on the connections served at once, a
//! header-read timeout, a send timeout (a client that reads nothing is closed: `send_timeout`),
//! an accept loop that waits out a full file table instead of spinning
//! (the open-file limit itself: `file_limit`), and a graceful shutdown bounded by a grace
//! period (each connection runs `until_stop`).
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

mod file_limit;
mod send_timeout;
mod until_stop;

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::response::Response;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};

use crate::config::GatewayConfig;
use file_limit::is_out_of_files;
pub use file_limit::{raise_file_limit, warn_if_file_limit_is_low};
use send_timeout::SendTimeout;
use until_stop::UntilStop;

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
    /// A connection whose writes have been stuck this long (its client reads nothing) is
    /// closed, and the response it was sending ends and settles.
    pub send_timeout: Duration,
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
            send_timeout: config.send_timeout,
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
        let stream = SendTimeout::new(stream, limits.send_timeout);
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
