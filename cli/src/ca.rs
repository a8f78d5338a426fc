//! `cnimesh ca init` and `cnimesh ca webhook`: the certificates an operator makes before the
//! control plane runs (a trust anchor and an issuer; the webhook's serving certificate and its
//! CA). They were `cnimesh-control ca …`; the files and their layout are the control plane's
//! ([`cnimesh_control::ca_init`], [`cnimesh_control::inject::generate_webhook_cert`]), the
//! command is the operator's.
//!
//! Layer: commands (writes files).

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Subcommand};
use cnimesh_control::ca_init::{self, CaInit};
use cnimesh_control::cli::parse_duration;
use cnimesh_control::inject::{
    DEFAULT_CLUSTER_DOMAIN, DEFAULT_CONTROL_NAMESPACE, generate_webhook_cert, webhook_dns_names,
};
use cnimesh_identity::DEFAULT_TRUST_DOMAIN;

#[derive(Debug, Subcommand)]
pub enum CaCommand {
    /// Generate a trust anchor and an issuer: DIR/ca.crt, ca.key, tls.crt, tls.key.
    Init(CaInitArgs),
    /// Generate the webhook's serving certificate and its CA: DIR/ca.crt (the caBundle),
    /// tls.crt, tls.key.
    Webhook(CaWebhookArgs),
}

#[derive(Debug, Args)]
pub struct CaWebhookArgs {
    #[arg(long)]
    dir: PathBuf,
    /// The control plane's namespace (the webhook Service lives there).
    #[arg(long, default_value = DEFAULT_CONTROL_NAMESPACE)]
    namespace: String,
    #[arg(long, default_value = DEFAULT_CLUSTER_DOMAIN)]
    cluster_domain: String,
    #[arg(long, default_value = "365d", value_parser = parse_duration)]
    lifetime: Duration,
    /// Overwrite existing files.
    #[arg(long)]
    force: bool,
}

#[derive(Debug, Args)]
pub struct CaInitArgs {
    #[arg(long)]
    dir: PathBuf,
    #[arg(long, default_value = DEFAULT_TRUST_DOMAIN)]
    trust_domain: String,
    /// e.g. 3650d, 365d, 24h.
    #[arg(long, default_value = "3650d", value_parser = parse_duration)]
    anchor_lifetime: Duration,
    #[arg(long, default_value = "365d", value_parser = parse_duration)]
    issuer_lifetime: Duration,
    /// Overwrite existing files.
    #[arg(long)]
    force: bool,
}

/// Writes the files and prints their paths, one a line.
pub fn main(command: CaCommand, out: &mut impl Write) -> anyhow::Result<()> {
    let written = match command {
        CaCommand::Init(args) => {
            let opts = CaInit {
                dir: args.dir,
                trust_domain: args.trust_domain,
                anchor_lifetime: args.anchor_lifetime,
                issuer_lifetime: args.issuer_lifetime,
                force: args.force,
            };
            ca_init::run(&opts).context("ca init")?
        }
        CaCommand::Webhook(args) => {
            let names = webhook_dns_names(&args.namespace, &args.cluster_domain);
            generate_webhook_cert(&args.dir, &names, args.lifetime, args.force).context("ca webhook")?
        }
    };
    for path in written {
        writeln!(out, "{}", path.display())?;
    }
    Ok(())
}
