//! `cnimesh-local`'s command line: `up`, `down` and the hidden commands local mode runs itself with
//! inside its pods. Lives in the library so test packages can build the same binary from current
//! sources.

use std::process::ExitCode;

use clap::Parser;
use cnimesh_node::debug::Format;

use crate::LocalCmd;

#[derive(Parser)]
#[command(name = "cnimesh-local", version, about = "cnimesh local mode: a demo mesh on this host")]
struct Cli {
    /// Output format of the summary.
    #[arg(short = 'o', long, value_enum, default_value_t = Format::Human, global = true)]
    output: Format,
    #[command(subcommand)]
    command: LocalCmd,
}

pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_env("CNIMESH_LOG").unwrap_or_else(|_| "info".into());
    // The format from CNIMESH_LOG_FORMAT (plain or json); an unknown one is refused by name.
    if let Err(error) = cnimesh_common::logging::init(filter) {
        eprintln!("cnimesh-local: {error}");
        return ExitCode::from(2);
    }
    // Multi-threaded: `up` and `down` block in place on the workers.
    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("tokio runtime");
    match runtime.block_on(crate::main(&cli.command, cli.output)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("cnimesh-local: {e:#}");
            ExitCode::from(2)
        }
    }
}
