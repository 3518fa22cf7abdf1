//! Log output of the client crate's programs (the `floodgate` command and the example gateway):
//! `RUST_LOG` filtering, plain text or JSON lines on stderr, ANSI colours only when stderr is a
//! terminal (so files and journald get clean text). Feature `logging`.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

/// `--log-format`: `text` or `json` (parsed with `FromStr`, so a command-line parser needs
/// nothing more from this crate).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line, for log collectors.
    Json,
}

impl std::str::FromStr for LogFormat {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "text" => Ok(LogFormat::Text),
            "json" => Ok(LogFormat::Json),
            other => Err(format!("`{other}` is not a log format: use text or json")),
        }
    }
}

impl std::fmt::Display for LogFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            LogFormat::Text => "text",
            LogFormat::Json => "json",
        })
    }
}

/// Installs the process-wide subscriber, filtering by `RUST_LOG`, else by `default_filter`
/// (e.g. `info`). Call once, first thing.
pub fn init(format: LogFormat, default_filter: &str) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_filter));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.with_ansi(std::io::stderr().is_terminal()).init(),
        LogFormat::Json => builder.json().with_ansi(false).init(),
    }
}
