//! [`Recorder`]: the request path's side of the record. A sampled request's line is handed to a
//! bounded channel (`try_send`: never a wait) with its body's meter; a thread of its own reads
//! the meter's tokens into the line (a JSON body is parsed there, not on the request path),
//! serialises and writes the lines ([`RotatingFile`]). When the channel is full the line is dropped and counted
//! (`gateway_record_dropped_total`), so a slow disk costs lines, never requests.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use prometheus_client::metrics::counter::Counter;
use tokio::sync::mpsc;
use tower_priority_limit::meter::{Tokens, UsageMeter};

use super::file::RotatingFile;
use super::line::RecordLine;
use super::settings::{sampled, RecordSettings};

/// Lines waiting for the writer at most: a second of a busy gateway's traffic.
pub const CHANNEL_LINES: usize = 16 * 1024;

/// A line on its way to the writer, with the meter its tokens are read from (`None`: the line
/// is complete).
#[derive(Debug)]
struct Submitted {
    line: RecordLine,
    meter: Option<UsageMeter>,
}

impl Submitted {
    /// The line, its tokens read from the meter.
    fn into_line(self) -> RecordLine {
        let mut line = self.line;
        if let Some(meter) = self.meter {
            let tokens = meter.tokens();
            line.tokens = tokens.get();
            line.reported = matches!(tokens, Tokens::Reported(_));
            line.output_tokens = meter.output_tokens();
        }
        line
    }
}

/// Hands sampled requests' lines to the writer thread.
#[derive(Debug)]
pub struct Recorder {
    settings: RecordSettings,
    lines: mpsc::Sender<Submitted>,
    /// Requests seen (for sampling).
    seen: AtomicU64,
    /// Lines written (counted by the writer).
    written: Counter,
    /// Lines dropped because the channel was full or the writer stopped.
    dropped: Counter,
}

impl Recorder {
    /// Opens the record's file and starts its writer thread. The thread ends when the recorder
    /// is dropped, after writing what it was handed.
    pub fn start(settings: RecordSettings) -> std::io::Result<Arc<Self>> {
        Self::with_capacity(settings, CHANNEL_LINES)
    }

    /// [`start`](Self::start) with a channel of `capacity` lines.
    pub fn with_capacity(settings: RecordSettings, capacity: usize) -> std::io::Result<Arc<Self>> {
        let mut file = RotatingFile::open(&settings.path, settings.max_file_bytes, settings.keep)?;
        let (tx, mut rx) = mpsc::channel::<Submitted>(capacity.max(1));
        let written: Counter = Counter::default();
        let dropped: Counter = Counter::default();
        let (w, d) = (written.clone(), dropped.clone());
        let path = settings.path.clone();
        std::thread::Builder::new()
            .name("record-writer".into())
            .spawn(move || {
                let mut buf = Vec::with_capacity(1024);
                let mut failed = false;
                while let Some(line) = rx.blocking_recv() {
                    let mut next = Some(line);
                    // Everything waiting, then one flush: lines reach the file within a batch.
                    while let Some(submitted) = next {
                        let line = submitted.into_line();
                        buf.clear();
                        let result = serde_json::to_writer(&mut buf, &line)
                            .map_err(std::io::Error::from)
                            .and_then(|()| {
                                buf.push(b'\n');
                                file.write_line(&buf)
                            });
                        match result {
                            Ok(()) => {
                                w.inc();
                            }
                            Err(e) => {
                                d.inc();
                                if !failed {
                                    tracing::error!(path = %path.display(), %e, "cannot write the record; its lines are dropped (counted in gateway_record_dropped_total)");
                                    failed = true;
                                }
                            }
                        }
                        next = rx.try_recv().ok();
                    }
                    if let Err(e) = file.flush() {
                        if !failed {
                            tracing::error!(path = %path.display(), %e, "cannot write the record");
                            failed = true;
                        }
                    }
                }
            })?;
        Ok(Arc::new(Self {
            settings,
            lines: tx,
            seen: AtomicU64::new(0),
            written,
            dropped,
        }))
    }

    /// Whether the next request is to be recorded (`sample`).
    pub fn sample(&self) -> bool {
        let n = self.seen.fetch_add(1, Ordering::Relaxed);
        sampled(n, self.settings.sample)
    }

    /// Hands `line` to the writer, or drops and counts it when the writer is behind.
    pub fn submit(&self, line: RecordLine) {
        self.send(Submitted { line, meter: None });
    }

    /// [`submit`](Self::submit) with the meter of the line's body: the writer reads its tokens,
    /// output tokens and whether they were reported into the line.
    pub fn submit_metered(&self, line: RecordLine, meter: UsageMeter) {
        self.send(Submitted {
            line,
            meter: Some(meter),
        });
    }

    fn send(&self, submitted: Submitted) {
        if self.lines.try_send(submitted).is_err() {
            self.dropped.inc();
        }
    }

    /// What the recorder was started with.
    pub fn settings(&self) -> &RecordSettings {
        &self.settings
    }

    /// `gateway_record_lines_total`: lines written.
    pub fn written(&self) -> &Counter {
        &self.written
    }

    /// `gateway_record_dropped_total`: lines dropped (the writer behind, or the file failing).
    pub fn dropped(&self) -> &Counter {
        &self.dropped
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{Outcome, RecordLine};

    fn line(n: u64) -> RecordLine {
        RecordLine {
            time_ms: n,
            model: "m".into(),
            endpoint: "/chat/completions".into(),
            key: "0123456789abcdef".into(),
            team: None,
            priority: None,
            flow: 0,
            prompt_tokens: 1,
            max_tokens: None,
            stream: false,
            status: 200,
            outcome: Outcome::Served,
            limits: vec![],
            queued_ms: None,
            tokens: 1,
            reported: true,
            output_tokens: None,
            head_ms: 0,
            latency_ms: 0,
        }
    }

    /// A channel of one line, handed lines faster than a file takes them: every line is written
    /// or counted as dropped, none waits, and the file holds exactly the written ones.
    #[test]
    fn a_full_channel_drops_and_counts_never_waits() {
        let dir = std::env::temp_dir().join(format!("record-writer-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let settings = RecordSettings {
            path: dir.join("r.jsonl"),
            sample: 1.0,
            max_file_bytes: u64::MAX,
            keep: 0,
        };
        let recorder = Recorder::with_capacity(settings.clone(), 1).unwrap();
        let n = 20_000;
        for i in 0..n {
            recorder.submit(line(i));
        }
        let (written, dropped) = (recorder.written().clone(), recorder.dropped().clone());
        // The writer thread ends once the recorder is gone and it has written what it holds.
        drop(recorder);
        let in_file =
            || std::fs::read_to_string(&settings.path).map_or(0, |t| t.lines().count() as u64);
        for _ in 0..1000 {
            if written.get() + dropped.get() == n && in_file() == written.get() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert_eq!(written.get() + dropped.get(), n);
        assert_eq!(in_file(), written.get());
        assert!(written.get() >= 1);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
