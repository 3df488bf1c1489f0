//! The server's log: `tracing` events, written to stderr by `tracing-subscriber`
//! as readable lines (the default) or JSON objects (`--log-format json`), each
//! with a timestamp and a level. What is logged is chosen so that the log's
//! volume follows events an operator cares about, never traffic: nothing per
//! frame or per accepted write; one line per refused request, connection or
//! checkpoint (connections at `debug`: thousands of clients would bury the rest).
//!
//! stdout is not the log: it keeps the few lines a person or a script waits for
//! (`listening on http://...`, the demo's address), as before.

use tracing_subscriber::EnvFilter;

use crate::cli::LogFormat;

/// Installs the subscriber. `filter` is `--log-level` (or its variable or file
/// key); without it `RUST_LOG`, else `info`.
pub fn init(format: LogFormat, filter: Option<&str>) -> Result<(), String> {
    let filter = match filter {
        Some(filter) => EnvFilter::try_new(filter).map_err(|error| format!("--log-level `{filter}`: {error}"))?,
        None => EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Colour codes only for a person at a terminal: a file or a pipe gets plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    let installed = match format {
        LogFormat::Human => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).with_current_span(false).try_init(),
    };
    installed.map_err(|error| format!("cannot install the log: {error}"))
}

/// A line on stdout for the person or script watching (`listening on ...`,
/// `stopping`). Unlike `println!`, a stdout that is gone (the reading process
/// ended, a closed pipe) loses the line and nothing else: the server must
/// still stop gracefully, not panic on its way out.
macro_rules! say {
    ($($arg:tt)*) => {
        $crate::logging::say_line(format_args!($($arg)*))
    };
}
pub(crate) use say;

pub fn say_line(line: std::fmt::Arguments<'_>) {
    use std::io::Write as _;
    let mut stdout = std::io::stdout().lock();
    let _ = stdout.write_fmt(line).and_then(|()| stdout.write_all(b"\n")).and_then(|()| stdout.flush());
}
