//! Shutdown signals, shared by the gateway and the mock upstream binaries, and the one that ends
//! the streams still running when the shutdown grace period is over.

/// Listens for SIGINT (Ctrl-C) and, on Unix, SIGTERM from the moment it is called, and returns
/// what resolves at the first of them. Called before the process says it is ready: a signal
/// sent in between would otherwise be lost (tokio sees only signals after it listens).
pub fn shutdown_signal() -> impl std::future::Future<Output = ()> + Send {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let mut terminate = signal(SignalKind::terminate()).ok();
        let mut interrupt = signal(SignalKind::interrupt()).ok();
        async move {
            tokio::select! {
                () = next(&mut terminate) => {},
                () = next(&mut interrupt) => {},
            }
        }
    }
    #[cfg(not(unix))]
    async {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// The next delivery of `signal`; never if it could not be listened for.
#[cfg(unix)]
async fn next(signal: &mut Option<tokio::signal::unix::Signal>) {
    match signal {
        Some(s) => {
            s.recv().await;
        }
        None => std::future::pending().await,
    }
}

/// Listens for SIGHUP from the moment it is called (so one sent before the returned future runs
/// is not lost, nor does it end the process), and returns what runs `on_signal` at every SIGHUP
/// for as long as the process lives (on other platforms, never).
pub fn on_hangup<F, Fut>(on_signal: F) -> impl std::future::Future<Output = ()> + Send
where
    F: Fn() -> Fut + Send,
    Fut: std::future::Future<Output = ()> + Send,
{
    #[cfg(unix)]
    let hangups = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup());
    async move {
        #[cfg(unix)]
        {
            let Ok(mut hangups) = hangups else {
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
