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
        Output::Stdout => logs.init(),
        Output::Stderr => logs.with_writer(std::io::stderr).init(),
    }
}
