//! Log set-up shared by both binaries: `RUST_LOG` filters (else the binary's default), and colour
//! only on a terminal, so logs written to a file or a pipe carry no escape codes.

use std::io::IsTerminal;

/// Where a binary writes its logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Output {
    /// Standard output (the gateway).
    Stdout,
    /// Standard error (the mock upstream, whose standard output is for its own messages).
    Stderr,
}

/// Logs to `output`, filtered by `RUST_LOG` or else `default_filter`. Colour codes are written
/// only when `output` is a terminal and `NO_COLOR` is unset.
pub fn init(default_filter: &str, output: Output) {
    let terminal = match output {
        Output::Stdout => std::io::stdout().is_terminal(),
        Output::Stderr => std::io::stderr().is_terminal(),
    };
    let colour = terminal && std::env::var_os("NO_COLOR").is_none();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| default_filter.into());
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(colour);
    match output {
        Output::Stdout => logs.with_writer(|| OneLine(std::io::stdout())).init(),
        Output::Stderr => logs.with_writer(|| OneLine(std::io::stderr())).init(),
    }
}

/// Writes each log event as one line: a line break inside it (an error's text from a library,
/// such as a Redis client's parse error) is written as `\n`, so a line-oriented log reader sees
/// one event a line. The formatter writes each event, its final line break included, at once.
struct OneLine<W>(W);

impl<W: std::io::Write> std::io::Write for OneLine<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let body = buf.strip_suffix(b"\n").unwrap_or(buf);
        if !body.contains(&b'\n') {
            return self.0.write_all(buf).map(|()| buf.len());
        }
        let mut line = Vec::with_capacity(buf.len() + 8);
        for &b in body {
            match b {
                b'\n' => line.extend_from_slice(b"\\n"),
                b'\r' => line.extend_from_slice(b"\\r"),
                b => line.push(b),
            }
        }
        if body.len() < buf.len() {
            line.push(b'\n');
        }
        self.0.write_all(&line).map(|()| buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.0.flush()
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::OneLine;

    #[test]
    fn an_event_with_line_breaks_is_written_as_one_line() {
        let mut out = OneLine(Vec::new());
        out.write_all(b"WARN error=Parse error at 1\nUnexpected `84`\r\n end\n")
            .unwrap();
        out.write_all(b"INFO plain\n").unwrap();
        assert_eq!(
            String::from_utf8(out.0).unwrap(),
            "WARN error=Parse error at 1\\nUnexpected `84`\\r\\n end\nINFO plain\n"
        );
    }
}
