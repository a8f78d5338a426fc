//! `cnimesh multicluster check [--local DIR] [-o table|json]`: every Link of this cluster, checked
//! the way `cnimesh check` checks the mesh (named checks, reasons, hints; the same renderers):
//! the Link is valid; its credentials Secret exists and the remote API answers with it; the
//! gateway is reachable and its certificate chains to THIS cluster's anchors and names the Link's
//! gatewayIdentity, from an issuer constrained to the Link's trust domain; both clusters' anchors
//! match; the link is up and the mirror controller's heartbeat fresh (`lastHeartbeat`, written
//! every few seconds while it follows the target: an idle link's `lastSync` is old and says
//! nothing about liveness); each mirror's last sync; no mirror name is claimed
//! by two exports. A failure does not hide the next check; checks that cannot run say why.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, SystemTime};

use super::super::ClusterArgs;
use super::super::check::{Category, Check, Output, render, success};
use super::check_cluster_name;
use super::source::{Found, Remote, Source};
use super::{issuer_constraints, probe};
use cnimesh_mirror::controller::MIRROR_WRITE;
use cnimesh_mirror::crd::{HEARTBEAT_STALE_AFTER, Link, LinkState, LinkStatus};
use cnimesh_runtime::leader::lease_name;

#[derive(Debug, Clone, clap::Args)]
pub struct CheckArgs {
    /// Local mode's directory of this cluster (`cnimesh-local up --dir DIR`): its cluster, a
    /// shorthand for `--kubeconfig DIR/kubeconfig`.
    #[arg(long, value_name = "DIR")]
    pub local: Option<PathBuf>,
    #[arg(short = 'o', long, value_enum, default_value_t = Output::Table)]
    pub output: Output,
}

pub async fn main(cluster: &ClusterArgs, args: &CheckArgs, out: &mut impl Write) -> anyhow::Result<ExitCode> {
    let checks = match cluster.or_local(args.local.as_deref()).client().await {
        Ok(client) => run(&Source::Cluster(client), SystemTime::now()).await,
        Err(e) => vec![Check::fail(
            &Category::Multicluster,
            "kubernetes-api",
            format!("{e:#}"),
            "pass --kubeconfig / --context, or --local DIR",
        )],
    };
    out.write_all(render(args.output, &checks).as_bytes())?;
    Ok(ExitCode::from(if success(&checks) { 0 } else { 1 }))
}

/// Every check for every Link of `source`; `now` judges freshness.
pub async fn run(source: &Source, now: SystemTime) -> Vec<Check> {
    let mut checks = Vec::new();
    let links = match source.links().await {
        Ok(links) => links,
        Err(e) => {
            checks.push(Check::fail(
                &Category::Multicluster,
                "links",
                format!("{e:#}"),
                "apply `cnimesh multicluster install` on this cluster",
            ));
            return checks;
        }
    };
    let anchors = source.anchors().await;
    match &anchors {
        Ok(_) => {}
        Err(e) => checks.push(Check::fail(
            &Category::Multicluster,
            "trust anchors",
            format!("{e:#}"),
            "is the mesh installed here?",
        )),
    }
    if links.is_empty() {
        checks.push(Check::warn(
            &Category::Multicluster,
            "links",
            "no Link in this cluster",
            "run `cnimesh multicluster link --cluster-name NAME` against the other cluster and apply its output here",
        ));
        return checks;
    }
    checks.push(Check::ok(&Category::Multicluster, "links", format!("{} Link(s): {}", links.len(), names(&links))));
    cluster_names(&links, &mut checks);
    for found in &links {
        check_link(source, found, anchors.as_ref().ok().map(String::as_str), now, &mut checks).await;
    }
    checks
}

/// Fails for every pair of Links whose cluster names overlap (equal, or one a `-`-suffix of the
/// other): their mirrors could share names, and the controller refuses the later-created one.
fn cluster_names(links: &[Found], checks: &mut Vec<Check>) {
    use cnimesh_mirror::overlap;
    let valid: Vec<&Link> = links.iter().filter_map(|f| f.link.as_ref().ok()).collect();
    let conflicts = overlap::conflicts(&valid);
    let pairs: Vec<String> = conflicts
        .iter()
        .flat_map(|(name, with)| with.iter().filter(|c| c.refused).map(move |c| (name, c)))
        .map(|(later, earlier)| {
            format!(
                "Link {later} is refused: its cluster name overlaps Link {}'s ({:?}), created earlier",
                earlier.link, earlier.cluster
            )
        })
        .collect();
    if pairs.is_empty() {
        checks.push(Check::ok(&Category::Multicluster, "cluster names", "no two Links' cluster names overlap"));
        return;
    }
    checks.push(
        Check::fail(
            &Category::Multicluster,
            "cluster names",
            format!("{} pair(s) of Links whose mirrors <service>-<cluster> could share names", pairs.len()),
            "unlink one of each pair, or link it under a cluster name that neither equals nor ends in '-<other>'",
        )
        .details(pairs),
    );
}

fn names(links: &[Found]) -> String {
    links.iter().map(|f| f.name.as_str()).collect::<Vec<_>>().join(", ")
}

async fn check_link(source: &Source, found: &Found, anchors: Option<&str>, now: SystemTime, checks: &mut Vec<Check>) {
    let category = Category::Link(found.name.clone());
    let cat = &category;
    let link = match &found.link {
        Ok(link) => link,
        Err(e) => {
            checks.push(Check::fail(
                cat,
                "link is valid",
                e.clone(),
                "fix the Link (re-run `cnimesh multicluster link`)",
            ));
            return;
        }
    };
    match validate(link) {
        Ok(()) => checks.push(Check::ok(cat, "link is valid", describe(link))),
        Err(e) => {
            checks.push(Check::fail(
                cat,
                "link is valid",
                e,
                "re-run `cnimesh multicluster link` against that cluster and apply its output",
            ));
            return;
        }
    }
    let spec = &link.spec;
    let secret = &spec.cluster_credentials_secret;
    let remote = match source.credentials(secret).await {
        Err(e) => {
            checks.push(Check::fail(
                cat,
                "credentials",
                e,
                "apply the Secret `cnimesh multicluster link` printed with the Link",
            ));
            None
        }
        Ok(kubeconfig) => match Remote::connect(&kubeconfig).await {
            Err(e) => {
                checks.push(Check::fail(
                    cat,
                    "credentials",
                    e,
                    "re-run `cnimesh multicluster link` against that cluster",
                ));
                None
            }
            Ok(remote) => {
                checks.push(Check::ok(cat, "credentials", format!("Secret {secret} holds a kubeconfig")));
                Some(remote)
            }
        },
    };
    match &remote {
        None => checks.push(Check::skip(cat, "remote API", "skipped: no usable credentials")),
        Some(remote) => match remote.answers().await {
            Ok(what) => checks.push(Check::ok(cat, "remote API", what)),
            Err(e) => checks.push(Check::fail(
                cat,
                "remote API",
                e,
                "is the API server address reachable from here, and the mirror reader's token still valid? re-run `link`",
            )),
        },
    }
    check_gateway(link, anchors, cat, checks).await;
    match (&remote, anchors) {
        (Some(remote), Some(local)) => match remote.anchors().await {
            Err(e) => checks.push(Check::fail(cat, "trust anchors match", format!("the linked cluster's anchors: {e}"), "does the mirror reader may read the trust anchors ConfigMap? (cnimesh multicluster install)")),
            Ok(theirs) => match anchors_match(local, &theirs) {
                Ok(()) => checks.push(Check::ok(cat, "trust anchors match", "both clusters trust a common anchor")),
                Err(e) => checks.push(Check::fail(
                    cat,
                    "trust anchors match",
                    e,
                    "install both clusters with the same anchor: `install --identity-trust-anchors-file` and an issuer from `cnimesh ca issuer`",
                )),
            },
        },
        _ => checks.push(Check::skip(cat, "trust anchors match", "skipped: the credentials or this cluster's anchors are unusable")),
    }
    match source.status(link) {
        Err(e) => checks.push(Check::fail(cat, "link status", e, "the mirror controller writes it; see its logs")),
        Ok(status) => {
            freshness(status.as_ref(), now, cat, checks);
            if let Some(status) = &status {
                mirror_names(status, cat, checks);
            }
        }
    }
}

/// Fails while a mirror name of this link is claimed twice (the controller keeps the holder's
/// mirror and refuses the other claimants: one of the exports is not mirrored).
fn mirror_names(status: &LinkStatus, cat: &Category, checks: &mut Vec<Check>) {
    if status.collisions.is_empty() {
        checks.push(Check::ok(cat, "mirror names", "no mirror name is claimed twice"));
        return;
    }
    let details = status
        .collisions
        .iter()
        .map(|c| {
            let outcome = if c.holder { "kept by this link" } else { "refused to this link" };
            format!("{} <- {} ({outcome}); also claimed by {}", c.mirror, c.remote, c.with.join(", "))
        })
        .collect();
    checks.push(
        Check::fail(
            cat,
            "mirror names",
            format!("{} mirror name(s) claimed by more than one Service", status.collisions.len()),
            "rename one of the exported Services (or unexport it): a mirror is <service>-<cluster>, so names can collide across Links",
        )
        .details(details),
    );
}

async fn check_gateway(link: &Link, anchors: Option<&str>, cat: &Category, checks: &mut Vec<Check>) {
    let spec = &link.spec;
    let (Some(address), Some(identity)) = (&spec.gateway_address, &spec.gateway_identity) else {
        checks.push(Check::ok(cat, "gateway", "none: only remote-discovery exports are mirrored"));
        return;
    };
    let port = spec.gateway_port;
    match probe::probe(address, port, identity).await {
        Err(e) => {
            checks.push(Check::fail(
                cat,
                "gateway reachable",
                e,
                "is the gateway's Service address reachable from this cluster's nodes?",
            ));
            checks.push(Check::skip(cat, "gateway certificate", "skipped: the gateway is not reachable"));
        }
        Ok(p) => {
            checks.push(Check::ok(
                cat,
                "gateway reachable",
                format!("{address}:{port} (TCP connect {:.1} ms)", p.connect.as_secs_f64() * 1000.0),
            ));
            match anchors {
                None => checks.push(Check::skip(cat, "gateway certificate", "skipped: this cluster's anchors are unreadable")),
                Some(anchors) => match probe::judge(&p.chain, anchors, identity) {
                    Ok(id) => {
                        checks.push(Check::ok(cat, "gateway certificate", format!("{id}, chained to this cluster's anchors")));
                        checks.push(issuer_constraints::check(cat, &p.chain, &spec.target_trust_domain));
                    }
                    Err(e) => checks.push(
                        Check::fail(
                            cat,
                            "gateway certificate",
                            e,
                            "the gateway's cluster must use an issuer signed by this cluster's anchor (`cnimesh ca issuer`), and the Link its identity",
                        )
                        .details(vec![p.handshake]),
                    ),
                },
            }
        }
    }
}

/// The Link's own consistency (what the mirror controller would refuse).
pub fn validate(link: &Link) -> Result<(), String> {
    let spec = &link.spec;
    check_cluster_name(&spec.target_cluster_name).map_err(|e| format!("targetClusterName: {e}"))?;
    if link.metadata.name.as_deref() != Some(spec.target_cluster_name.as_str()) {
        return Err(format!(
            "the Link is named {:?} but targets {:?}: they must be equal",
            link.metadata.name.as_deref().unwrap_or_default(),
            spec.target_cluster_name
        ));
    }
    if spec.target_trust_domain.is_empty() {
        return Err("targetTrustDomain is empty".into());
    }
    if spec.cluster_credentials_secret.is_empty() {
        return Err("clusterCredentialsSecret is empty".into());
    }
    if spec.gateway_address.is_some() != spec.gateway_identity.is_some() {
        return Err("gatewayAddress and gatewayIdentity go together".into());
    }
    if spec.gateway_address.is_some() && spec.gateway_port == 0 {
        return Err("gatewayPort is 0".into());
    }
    humantime::parse_duration(&spec.probe.period).map_err(|e| format!("probe.period {:?}: {e}", spec.probe.period))?;
    Ok(())
}

fn describe(link: &Link) -> String {
    let spec = &link.spec;
    match &spec.gateway_address {
        Some(a) => format!(
            "{} (trust domain {}), gateway {a}:{}",
            spec.target_cluster_name, spec.target_trust_domain, spec.gateway_port
        ),
        None => format!("{} (trust domain {}), no gateway", spec.target_cluster_name, spec.target_trust_domain),
    }
}

/// Ok when the two bundles share a certificate.
pub fn anchors_match(ours: &str, theirs: &str) -> Result<(), String> {
    let parse = |pem: &str, what: &str| cnimesh_identity::pem::certs(pem.as_bytes(), what).map_err(|e| e.to_string());
    let (ours, theirs) = (parse(ours, "this cluster's anchors")?, parse(theirs, "the linked cluster's anchors")?);
    if theirs.iter().any(|t| ours.contains(t)) {
        Ok(())
    } else {
        Err(format!("no common anchor: this cluster trusts {}, the linked one {}", subjects(&ours), subjects(&theirs)))
    }
}

fn subjects(certs: &[rustls_pki_types::CertificateDer<'static>]) -> String {
    let names: Vec<String> = certs.iter().filter_map(cnimesh_identity::tls::subject_of).collect();
    names.join(" + ")
}

/// How old an RFC 3339 time is at `now` (None when it does not parse).
fn age(time: &Option<String>, now: SystemTime) -> Option<Duration> {
    let at = humantime::parse_rfc3339_weak(time.as_deref()?).ok()?;
    Some(now.duration_since(at).unwrap_or_default())
}

/// What to do about a heartbeat gone old: the mirror controller stopped following the Link (the
/// remote cluster being idle never stops it).
fn stale_hint() -> String {
    let lease = lease_name(MIRROR_WRITE);
    format!(
        "the mirror controller stopped following this Link (an idle remote cluster still gets a heartbeat): is a \
         cnimesh-mirror replica running and holding the Lease {lease} (`kubectl -n cnimesh get lease \
         {lease}`)? Its logs say why it stopped (`kubectl -n cnimesh logs deploy/cnimesh-mirror`)"
    )
}

pub(super) fn freshness(status: Option<&LinkStatus>, now: SystemTime, cat: &Category, checks: &mut Vec<Check>) {
    let Some(status) = status else {
        checks.push(Check::fail(
            cat,
            "link status",
            "no status yet: the mirror controller has not synced this Link",
            "is the mirror running (`kubectl -n cnimesh get deploy/cnimesh-mirror`, installed by `cnimesh multicluster install`)?",
        ));
        checks.push(Check::skip(cat, "mirrors", "skipped: no status"));
        return;
    };
    let bound = HEARTBEAT_STALE_AFTER;
    let last = status.last_sync.clone().unwrap_or_else(|| "never".into());
    let mirrors = &status.mirrors;
    match status.state {
        Some(LinkState::Lost) => {
            let reason = status.reason.clone().unwrap_or_else(|| "no reason given".into());
            checks.push(Check::fail(
                cat,
                "link status",
                format!("lost: {reason} (the target's API last answered {last})"),
                "the mirrors keep their last endpoints until the link is back; check the remote API above",
            ));
            let details = mirrors
                .iter()
                .map(|m| format!("{} <- {} ({} endpoints as of {last})", m.mirror, m.remote, m.endpoints))
                .collect();
            checks.push(
                Check::fail(
                    cat,
                    "mirrors",
                    format!("{} mirror(s) keep the endpoints last seen {last}", mirrors.len()),
                    "they follow again once the link is up",
                )
                .details(details),
            );
            return;
        }
        None => {
            checks.push(Check::fail(
                cat,
                "link status",
                status.reason.clone().unwrap_or_else(|| "no state".into()),
                "see the mirror controller's logs",
            ));
        }
        Some(LinkState::Up) => match (age(&status.last_heartbeat, now), status.last_heartbeat.as_deref()) {
            (Some(a), _) if a <= bound => checks.push(Check::ok(
                cat,
                "link status",
                format!("up: heartbeat {} s ago, last change synced {last}", a.as_secs()),
            )),
            (Some(a), Some(beat)) => checks.push(Check::fail(
                cat,
                "link status",
                format!(
                    "stale: no heartbeat from the mirror controller for {} s (more than {} s); up as of {beat}",
                    a.as_secs(),
                    bound.as_secs()
                ),
                stale_hint(),
            )),
            (None, None) => checks.push(Check::warn(
                cat,
                "link status",
                format!("up as of {last}, but without a heartbeat: liveness cannot be told"),
                "the control plane predates the Link heartbeat (status.lastHeartbeat): upgrade it",
            )),
            (_, beat) => checks.push(Check::fail(
                cat,
                "link status",
                format!("up, but lastHeartbeat {beat:?} is not a time"),
                "see the mirror controller's logs",
            )),
        },
    }
    let details: Vec<String> = mirrors
        .iter()
        .map(|m| {
            let synced = m.last_sync.as_deref().unwrap_or("never");
            format!("{} <- {} [{}] {} endpoints, synced {synced}", m.mirror, m.remote, m.mode, m.endpoints)
        })
        .collect();
    checks.push(Check::ok(cat, "mirrors", format!("{} mirror(s)", mirrors.len())).details(details));
}
