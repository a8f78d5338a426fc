//! `cnimesh install`.

#[derive(Debug, clap::Args)]
pub struct InstallArgs {
    /// A highly available control plane.
    #[arg(long)]
    pub ha: bool,
}

pub struct Options;
pub struct Certificates;

impl InstallArgs {
    pub fn options(&self) -> Options {
        Options
    }
}

impl Certificates {
    pub fn from_args(_args: &InstallArgs) -> anyhow::Result<Self> {
        Ok(Self)
    }
}

pub fn render(_certs: &Certificates, _options: &Options) -> anyhow::Result<String> {
    anyhow::bail!("not written yet")
}
