//! [`Recorder`]: the request path's side of the record. A sampled request's line is handed to a
//! bounded channel (`try_send`: never a wait) with its body's meter; a thread of its own reads
//! the meter's tokens into the line (a JSON body is parsed there, not on the request path),
//! serialises and writes the lines ([`RotatingFile`]). When the channel is full the line is dropped and counted
//! (`gateway_record_dropped_total`), so a slow disk costs lines, never requests.

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use prometheus_client::metrics::counter::Counter;
use tokio::sync::mpsc;
use tower_priority_limit::meter::{Tokens, UsageMeter};

use super::file::RotatingFile;
use super::line::{caller_hash, RecordLine};
use super::settings::{sampled, RecordSettings};

/// Lines waiting for the writer at most: with [`WRITE_INTERVAL`], up to 327,680 lines a second
/// are written before any is dropped.
pub const CHANNEL_LINES: usize = 16 * 1024;
/// Callers whose record name a [`Recorder`] remembers at most.
pub const MAX_CALLERS: usize = 100_000;
/// How often the writer takes what is waiting: lines reach the file within this time (and one
/// write call per interval, whatever the traffic).
pub const WRITE_INTERVAL: std::time::Duration = std::time::Duration::from_millis(50);

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
            let (tokens, output) = meter.tokens_and_output();
            line.tokens = tokens.get();
            line.reported = matches!(tokens, Tokens::Reported(_));
            line.output_tokens = output;
        }
        line
    }
}

/// Hands sampled requests' lines to the writer thread.
#[derive(Debug)]
pub struct Recorder {
    settings: RecordSettings,
    /// The name on every line ([`RecordSettings::gateway`], else drawn at start).
    gateway: Arc<str>,
    /// Callers' hashes ([`caller_hash`]: a SHA-256 each, the record's largest cost per request)
    /// by a keyed 64-bit hash of the key, so a caller's is computed once: no key is kept, and a
    /// collision (about one in 2⁶⁴ per pair) would only name the wrong caller in a line.
    callers: Mutex<HashMap<u64, Arc<str>>>,
    hasher: std::collections::hash_map::RandomState,
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
                let mut report = |e: &dyn std::fmt::Display| {
                    if !failed {
                        tracing::error!(path = %path.display(), %e, "cannot write the record; its lines are dropped (counted in gateway_record_dropped_total)");
                        failed = true;
                    }
                };
                loop {
                    // Woken by time, not by each line: a sender never has a thread to wake.
                    std::thread::sleep(WRITE_INTERVAL);
                    let open = loop {
                        match rx.try_recv() {
                            Ok(submitted) => {
                                let line = submitted.into_line();
                                buf.clear();
                                line.write_json(&mut buf);
                                buf.push(b'\n');
                                let result = file.write_line(&buf);
                                if let Err(e) = result {
                                    d.inc();
                                    report(&e);
                                } else {
                                    w.inc();
                                }
                            }
                            Err(mpsc::error::TryRecvError::Empty) => break true,
                            Err(mpsc::error::TryRecvError::Disconnected) => break false,
                        }
                    };
                    // What was waiting reaches the file in one write (or a few, 64 KiB each).
                    if let Err(e) = file.flush() {
                        report(&e);
                    }
                    if !open {
                        return;
                    }
                }
            })?;
        let gateway: Arc<str> = match &settings.gateway {
            Some(name) => Arc::from(name.as_str()),
            None => Arc::from(format!("{:08x}", rand::random::<u32>())),
        };
        Ok(Arc::new(Self {
            settings,
            gateway,
            callers: Mutex::new(HashMap::new()),
            hasher: std::collections::hash_map::RandomState::new(),
            lines: tx,
            seen: AtomicU64::new(0),
            written,
            dropped,
        }))
    }

    /// The name this process's lines carry.
    pub fn gateway(&self) -> &Arc<str> {
        &self.gateway
    }

    /// The record's name for the caller with `key` ([`caller_hash`]), computed once per caller
    /// (at most [`MAX_CALLERS`] remembered; past that the memory starts afresh).
    pub fn caller(&self, key: &str) -> Arc<str> {
        let id = self.hasher.hash_one(key);
        let mut callers = self.callers.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(hash) = callers.get(&id) {
            return Arc::clone(hash);
        }
        if callers.len() >= MAX_CALLERS {
            callers.clear();
        }
        let hash: Arc<str> = Arc::from(caller_hash(key));
        callers.insert(id, Arc::clone(&hash));
        hash
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
            gateway: None,
            model: "m".into(),
            name: None,
            endpoint: "/chat/completions".into(),
            key: "0123456789abcdef".into(),
            team: None,
            priority: None,
            flow: 0,
            prompt_tokens: 1,
            max_tokens: None,
            max_wait_ms: None,
            stream: false,
            status: 200,
            outcome: Outcome::Served,
            limits: vec![],
            deployment: None,
            failed_attempts: 0,
            queued_ms: None,
            tokens: 1,
            reported: true,
            output_tokens: None,
            head_ms: 0,
            latency_ms: 0,
        }
    }

    /// A fresh directory named for `test`, and settings recording everything into it.
    fn settings(test: &str) -> (std::path::PathBuf, RecordSettings) {
        let dir = std::env::temp_dir().join(format!("{test}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let settings = RecordSettings {
            path: dir.join("r.jsonl"),
            sample: 1.0,
            max_file_bytes: u64::MAX,
            keep: 0,
            gateway: None,
        };
        (dir, settings)
    }

    #[test]
    fn a_callers_name_is_computed_once_and_is_its_hash() {
        let (dir, settings) = settings("record-callers");
        let recorder = Recorder::start(settings).unwrap();
        let first = recorder.caller("sk-one");
        assert_eq!(&*first, caller_hash("sk-one"));
        assert!(
            Arc::ptr_eq(&first, &recorder.caller("sk-one")),
            "remembered"
        );
        assert_eq!(&*recorder.caller("sk-two"), caller_hash("sk-two"));
        drop(recorder);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A channel of one line, handed lines faster than a file takes them: every line is written
    /// or counted as dropped, none waits, and the file holds exactly the written ones.
    #[test]
    fn a_full_channel_drops_and_counts_never_waits() {
        let (dir, settings) = settings("record-writer");
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
