//! The process entry point of `cnimesh-cni`: reads the CNI call from the environment and stdin,
//! prints the result or a CNI error object on stdout, and exits non-zero on failure.
//!
//! It lives in the library so that the test harness can build an identical binary of its own.

use std::io::{Read, Write};
use std::process::ExitCode;

use crate::error::{CniError, ErrorCode};
use crate::{env, plugin, version};

pub fn main() -> ExitCode {
    let mut stdin = Vec::new();
    let outcome = match std::io::stdin().read_to_end(&mut stdin) {
        Ok(_) => env::parse_command(std::env::var("CNI_COMMAND").ok().as_deref())
            .and_then(|command| plugin::run(command, |k| std::env::var(k).ok(), &stdin)),
        Err(e) => Err(CniError::new(ErrorCode::Io, "cannot read the network configuration from stdin")
            .with_details(e.to_string())),
    };
    let mut out = std::io::stdout().lock();
    match outcome {
        Ok(text) => {
            if let Some(text) = text {
                let _ = writeln!(out, "{text}");
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            // Errors answer in the caller's version when it is one we know.
            let _ = writeln!(out, "{}", e.to_json(&version::requested(&stdin)));
            ExitCode::FAILURE
        }
    }
}
