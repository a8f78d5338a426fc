//! Process entry point: logging with a reloadable filter, configuration, signals, runtime. In the
//! library so the end-to-end harness can build an identical binary of its own.

use std::process::ExitCode;

use parking_lot::Mutex;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Registry, reload};

use crate::app::admin::LogLevel;
use clap::error::ErrorKind;

use crate::app::config::{Args, Config, ConfigError};

struct ReloadableLevel {
    handle: reload::Handle<EnvFilter, Registry>,
    current: Mutex<String>,
}

impl LogLevel for ReloadableLevel {
    fn get(&self) -> String {
        self.current.lock().clone()
    }

    fn set(&self, directive: &str) -> Result<(), String> {
        let filter = EnvFilter::try_new(directive).map_err(|e| e.to_string())?;
        self.handle.reload(filter).map_err(|e| e.to_string())?;
        *self.current.lock() = directive.to_string();
        Ok(())
    }
}

async fn signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("SIGINT handler");
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}

/// A proxy holds two descriptors per proxied connection: raise the soft descriptor limit to the
/// hard one, so a default soft limit of 1024 does not cap it at ~500 connections.
fn raise_fd_limit() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    if let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE)
        && soft < hard
        && let Err(e) = setrlimit(Resource::RLIMIT_NOFILE, hard, hard)
    {
        tracing::warn!(soft, hard, error = %e, "could not raise the open-file limit");
    }
}

pub fn main() -> ExitCode {
    // Configuration is the `CNIMESH_PROXY_*` environment (flags of the same names for a proxy run
    // by hand); `--version` answers image checks and operators.
    let args = match <Args as clap::Parser>::try_parse() {
        Ok(args) => args,
        Err(e) if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) => {
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("cnimesh-proxy: invalid configuration: {}", ConfigError::from_clap(&e));
            return ExitCode::from(2);
        }
    };
    let config = match Config::try_from(args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("cnimesh-proxy: invalid configuration: {e}");
            return ExitCode::from(2);
        }
    };
    // The format from CNIMESH_LOG_FORMAT (plain or json), refused by name like any other setting.
    let format = match cnimesh_common::logging::format_from_env() {
        Ok(format) => format,
        Err(e) => {
            eprintln!("cnimesh-proxy: invalid configuration: {e}");
            return ExitCode::from(2);
        }
    };
    let filter = EnvFilter::try_new(&config.log_level).unwrap_or_else(|_| EnvFilter::new("info"));
    let (layer, handle) = reload::Layer::new(filter);
    tracing_subscriber::registry().with(layer).with(cnimesh_common::logging::layer(format)).init();
    raise_fd_limit();
    let log = Box::new(ReloadableLevel { handle, current: Mutex::new(config.log_level.clone()) });
    let runtime = match config.workers {
        1 => tokio::runtime::Builder::new_current_thread().enable_all().build(),
        n => tokio::runtime::Builder::new_multi_thread().worker_threads(n).enable_all().build(),
    }
    .expect("tokio runtime");
    match runtime.block_on(crate::app::run::run(config, log, signal())) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cnimesh-proxy: {e:#}");
            ExitCode::FAILURE
        }
    }
}
