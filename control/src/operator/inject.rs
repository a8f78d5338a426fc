//! `cnimesh inject` / `uninject`.

use std::io::Write;

use super::ClusterArgs;

#[derive(Debug, clap::Args)]
pub struct InjectArgs {}

#[derive(Debug, clap::Args)]
pub struct UninjectArgs {}

pub async fn inject_main(_cluster: &ClusterArgs, _args: InjectArgs, _out: &mut impl Write) -> anyhow::Result<()> {
    anyhow::bail!("not written yet")
}

pub fn uninject_main(_args: UninjectArgs, _out: &mut impl Write) -> anyhow::Result<()> {
    anyhow::bail!("not written yet")
}
