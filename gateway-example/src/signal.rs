//! Shutdown signals, shared by the gateway and the mock upstream binaries, and the one that ends
//! the streams still running when the shutdown grace period is over.

/// Resolves on SIGINT (Ctrl-C) or, on Unix, SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = terminate => {},
    }
}

/// Runs `on_signal` at every SIGHUP, for as long as the process lives (on other platforms,
/// never).
pub async fn on_hangup<F, Fut>(on_signal: F)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let Ok(mut hangups) = signal(SignalKind::hangup()) else {
            tracing::warn!("cannot listen for SIGHUP: reload with POST /config/reload");
            return;
        };
        while hangups.recv().await.is_some() {
            on_signal().await;
        }
    }
    #[cfg(not(unix))]
    let _ = on_signal;
}

/// Ends every upstream stream still running when the shutdown grace period is over (see
/// [`StreamsEnd`]); made with [`streams_end`].
#[derive(Debug)]
pub struct EndStreams(tokio::sync::watch::Sender<bool>);

/// What a running stream watches to learn it must end; resolves [`ended`](Self::ended) once
/// [`EndStreams::end`] was called (never if its sender is dropped without).
#[derive(Debug, Clone)]
pub struct StreamsEnd(tokio::sync::watch::Receiver<bool>);

/// A pair: the gateway keeps the [`EndStreams`], every stream watches a [`StreamsEnd`].
pub fn streams_end() -> (EndStreams, StreamsEnd) {
    let (tx, rx) = tokio::sync::watch::channel(false);
    (EndStreams(tx), StreamsEnd(rx))
}

impl EndStreams {
    /// Tells every stream to end now (and every stream started later to end at once).
    pub fn end(&self) {
        self.0.send_replace(true);
    }
}

impl StreamsEnd {
    /// Whether the streams are to end now (a read, no waiting and no wake-up registered).
    pub fn is_ended(&self) -> bool {
        *self.0.borrow()
    }

    /// Resolves once the streams are to end.
    pub async fn ended(mut self) {
        if self.0.wait_for(|ended| *ended).await.is_err() {
            // Dropped without being told: the gateway is gone, nothing will say so now.
            std::future::pending::<()>().await;
        }
    }
}
