//! `cnimesh uninstall`.

use super::ClusterArgs;

#[derive(Debug, clap::Args)]
pub struct UninstallArgs {
    #[arg(long)]
    pub force: bool,
}

pub async fn main(_cluster: &ClusterArgs, _args: UninstallArgs) -> anyhow::Result<String> {
    anyhow::bail!("not written yet")
}
