//! `cnimesh check`: placeholder, written next.

use std::process::ExitCode;

use super::ClusterArgs;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    Table,
    Json,
}

#[derive(Debug, clap::Args)]
pub struct CheckArgs {
    /// Check what `install` needs instead of an installed mesh.
    #[arg(long)]
    pub pre: bool,
    #[arg(short = 'o', long, value_enum, default_value_t = Output::Table)]
    pub output: Output,
}

pub async fn main(_cluster: &ClusterArgs, _args: CheckArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!("check is not written yet")
}
