//! Logging for a short-lived plugin: to `logFile` when configured (runtimes often drop a plugin's
//! stderr), else to stderr. Output on stdout is reserved for the CNI result.

use std::fs::OpenOptions;
use std::sync::Arc;

use tracing_subscriber::EnvFilter;

use crate::config::PluginSettings;

pub fn init(settings: &PluginSettings) {
    let level = settings.log_level.as_deref().unwrap_or("warn");
    let filter = EnvFilter::try_new(level).unwrap_or_else(|_| EnvFilter::new("warn"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_ansi(false).with_target(false);
    let file = settings.log_file.as_ref().and_then(|p| OpenOptions::new().create(true).append(true).open(p).ok());
    // A second init (tests run several calls per process) is harmless: keep the first.
    // `Arc<File>` writes through `&File` without a lock: the formatter hands each event over in
    // one write, and the file is opened for appending.
    let _ = match file {
        Some(f) => builder.with_writer(Arc::new(f)).try_init(),
        None => builder.with_writer(std::io::stderr).try_init(),
    };
}
