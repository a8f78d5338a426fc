//! `cnimesh ca init`, `cnimesh ca issuer` and `cnimesh ca webhook`: the certificates an operator
//! makes before the control plane runs (a trust anchor and an issuer; another cluster's issuer
//! signed by an existing anchor, so that linked clusters share one trust anchor; the
//! webhook's serving certificate and its CA). They were `cnimesh-control ca …`; the files and their layout are the control plane's
//! ([`cnimesh_model::ca_init`], [`cnimesh_model::inject::generate_webhook_cert`]), the
//! command is the operator's.
//!
//! Layer: commands (writes files).

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Subcommand};
use cnimesh_identity::DEFAULT_TRUST_DOMAIN;
use cnimesh_model::ca_init::{self, CaInit};
use cnimesh_model::inject::{
    DEFAULT_CLUSTER_DOMAIN, DEFAULT_CONTROL_NAMESPACE, generate_webhook_cert, webhook_dns_names,
};
use cnimesh_runtime::process::parse_duration;

#[derive(Debug, Subcommand)]
pub enum CaCommand {
    /// Generate a trust anchor and an issuer: DIR/ca.crt, ca.key, tls.crt, tls.key. The issuer
    /// may issue identities of --trust-domain only (an X.509 name constraint, permitted DNS
    /// subtree identity.cnimesh.<trust-domain>).
    Init(CaInitArgs),
    /// A new issuer for another cluster (its own trust domain) signed by an existing trust
    /// anchor: reads ANCHOR_DIR/ca.crt and ca.key, writes DIR/ca.crt (the same anchors),
    /// tls.crt and tls.key, the layout `install --identity-*-file` and `serve --issuer-dir` read.
    /// The issuer may issue identities of --trust-domain only (an X.509 name constraint), so
    /// clusters that share the anchor cannot issue each other's identities.
    Issuer(CaIssuerArgs),
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
pub struct CaIssuerArgs {
    /// Where the new issuer goes.
    #[arg(long)]
    dir: PathBuf,
    /// The directory holding the trust anchor's certificate and key (`ca init`'s ca.crt, ca.key).
    #[arg(long)]
    anchor_dir: PathBuf,
    /// The new cluster's trust domain (its identities end in `identity.cnimesh.<trust-domain>`).
    #[arg(long, default_value = DEFAULT_TRUST_DOMAIN)]
    trust_domain: String,
    #[arg(long, default_value = "365d", value_parser = parse_duration)]
    issuer_lifetime: Duration,
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
        CaCommand::Issuer(args) => issuer(&args)?,
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

/// `ca issuer`: the anchor's key signs a new issuer; nothing is written when a file exists
/// (without --force) or when the anchor's files are unreadable or do not make a CA.
fn issuer(args: &CaIssuerArgs) -> anyhow::Result<Vec<PathBuf>> {
    use cnimesh_model::ca_init::ANCHOR_KEY_FILE;
    use cnimesh_model::identity::issuer::{ANCHORS_FILE, ISSUER_CERT_FILE, ISSUER_KEY_FILE};
    if args.trust_domain.is_empty()
        || cnimesh_identity::Name::for_service_account("a", "b", &args.trust_domain).is_err()
    {
        anyhow::bail!("--trust-domain {:?}: expected a DNS domain such as west.local", args.trust_domain);
    }
    let read = |file: &str| {
        let path = args.anchor_dir.join(file);
        std::fs::read_to_string(&path).with_context(|| format!("reading the trust anchor's {}", path.display()))
    };
    let anchor = cnimesh_identity::ca::CaPem { cert_pem: read(ANCHORS_FILE)?, key_pem: read(ANCHOR_KEY_FILE)? };
    let files = [ANCHORS_FILE, ISSUER_KEY_FILE, ISSUER_CERT_FILE].map(|f| args.dir.join(f));
    if !args.force
        && let Some(existing) = files.iter().find(|p| p.symlink_metadata().is_ok())
    {
        anyhow::bail!("{} exists; pass --force to overwrite", existing.display());
    }
    let issuer = cnimesh_identity::ca::new_issuer(&anchor, &args.trust_domain, args.issuer_lifetime)
        .with_context(|| format!("signing an issuer with the anchor in {}", args.anchor_dir.display()))?;
    std::fs::create_dir_all(&args.dir).with_context(|| format!("creating {}", args.dir.display()))?;
    // The key first, the certificate last (a watching control plane never pairs a new
    // certificate with an old key for long); the key is 0600 from creation.
    for (path, pem, mode) in [
        (&files[1], &issuer.key_pem, 0o600),
        (&files[0], &anchor.cert_pem, 0o644),
        (&files[2], &issuer.cert_pem, 0o644),
    ] {
        cnimesh_common::fs::write_atomic(path, pem.as_bytes(), Some(mode))
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(files.to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_issuer_for_another_trust_domain_chains_to_the_existing_anchor() {
        let dir = tempfile::tempdir().unwrap();
        let (east, west) = (dir.path().join("east"), dir.path().join("west"));
        ca_init::run(&CaInit::new(&east)).unwrap();
        let args = CaIssuerArgs {
            dir: west.clone(),
            anchor_dir: east.clone(),
            trust_domain: "west.local".into(),
            issuer_lifetime: Duration::from_secs(86400),
            force: false,
        };
        let mut out = Vec::new();
        main(CaCommand::Issuer(args), &mut out).unwrap();
        assert_eq!(String::from_utf8(out).unwrap().lines().count(), 3);
        assert_eq!(std::fs::read(west.join("ca.crt")).unwrap(), std::fs::read(east.join("ca.crt")).unwrap());
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(west.join("tls.key")).unwrap().permissions().mode() & 0o777, 0o600);
        // The control plane's issuer loads it, and a leaf it signs for west.local verifies
        // against east's anchors.
        let issuer = cnimesh_identity::ca::CaPem {
            cert_pem: std::fs::read_to_string(west.join("tls.crt")).unwrap(),
            key_pem: std::fs::read_to_string(west.join("tls.key")).unwrap(),
        };
        let signer = cnimesh_identity::ca::Signer::new(&issuer).unwrap();
        let name = cnimesh_identity::Name::for_service_account("web", "demo", "west.local").unwrap();
        let (key, _csr) = cnimesh_identity::ca::new_csr(&name).unwrap();
        let now = std::time::SystemTime::now();
        let leaf = signer.sign(&name, &key, now - Duration::from_secs(60), now + Duration::from_secs(3600)).unwrap();
        let anchors = cnimesh_identity::pem::certs(&std::fs::read(east.join("ca.crt")).unwrap(), "anchors").unwrap();
        let roots = cnimesh_identity::tls::roots(&anchors).unwrap();
        let issuer_der = cnimesh_identity::pem::certs(issuer.cert_pem.as_bytes(), "issuer").unwrap();
        let chain: Vec<_> = std::iter::once(leaf).chain(issuer_der.clone()).collect();
        cnimesh_identity::tls::verify(roots.clone(), &chain, &name).unwrap();
        // The issuer is west's alone: a leaf it signs for east's trust domain does not verify.
        let east_name = cnimesh_identity::Name::for_service_account("client", "demo", "cluster.local").unwrap();
        let forged = signer.sign(&east_name, &key, now - Duration::from_secs(60), now + Duration::from_secs(3600));
        let forged: Vec<_> = std::iter::once(forged.unwrap()).chain(issuer_der).collect();
        assert!(cnimesh_identity::tls::verify(roots, &forged, &east_name).is_err(), "west's issuer named east");
    }

    #[test]
    fn an_issuer_is_refused_without_a_readable_anchor_or_over_existing_files() {
        let dir = tempfile::tempdir().unwrap();
        let args = |anchor: &std::path::Path, force| CaIssuerArgs {
            dir: dir.path().join("west"),
            anchor_dir: anchor.to_path_buf(),
            trust_domain: "west.local".into(),
            issuer_lifetime: Duration::from_secs(86400),
            force,
        };
        let missing = dir.path().join("nowhere");
        let e = issuer(&args(&missing, false)).unwrap_err();
        assert!(format!("{e:#}").contains("nowhere/ca.crt"), "{e:#}");
        assert!(!dir.path().join("west").exists(), "nothing is written");
        let east = dir.path().join("east");
        ca_init::run(&CaInit::new(&east)).unwrap();
        issuer(&args(&east, false)).unwrap();
        let e = issuer(&args(&east, false)).unwrap_err();
        assert!(e.to_string().contains("pass --force"), "{e}");
        issuer(&args(&east, true)).unwrap();
        let mut bad = args(&east, true);
        bad.trust_domain = "not a domain".into();
        assert!(issuer(&bad).unwrap_err().to_string().contains("not a domain"));
    }
}
