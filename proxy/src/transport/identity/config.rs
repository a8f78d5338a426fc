//! Where the workload's certificate comes from: the identity to request, the trust anchors, the
//! token and the Identity service. Parsed from the environment by [`crate::app::config`].

use std::path::PathBuf;
use std::time::Duration;

use cnimesh_identity::Name;

/// Where the proxy gets its certificate.
#[derive(Debug, Clone)]
pub struct IdentityConfig {
    pub name: Name,
    pub trust_anchors: TrustAnchors,
    /// The projected service-account token (audience `identity.cnimesh.io`), re-read on every
    /// refresh because the kubelet rotates it.
    pub token_file: PathBuf,
    /// The Identity service, `host:port`.
    pub control_addr: String,
    /// The identity the Identity service must prove.
    pub control_name: Name,
    /// Longest wait between failed refreshes (jittered exponential backoff up to this).
    pub max_backoff: Duration,
    /// Running as an ExternalWorkload: a join token instead of `token_file`, renewals with the
    /// certificate, state kept on disk ([`super::external`]).
    pub external: Option<super::external::ExternalIdentity>,
}

/// Where the PEM trust anchors come from: one of the two variables, or both with an endorsing
/// signer.
#[derive(Clone, PartialEq, Eq)]
pub enum TrustAnchors {
    /// A file (`CNIMESH_PROXY_IDENTITY_TRUST_ANCHORS`), e.g. a mounted ConfigMap.
    File(PathBuf),
    /// The PEM text itself (`CNIMESH_PROXY_IDENTITY_TRUST_ANCHORS_PEM`), as the injector passes
    /// it, so a proxy needs no volume (Linkerd's `LINKERD2_PROXY_IDENTITY_TRUST_ANCHORS` does the
    /// same).
    Pem(String),
    /// The PEM text at start, then the file whenever `signer` endorses what it holds
    /// (`CNIMESH_PROXY_IDENTITY_TRUST_ANCHORS_ENDORSED_BY`, [`cnimesh_identity::endorsement`]):
    /// the injector's form on a cluster, the file a ConfigMap the control plane writes into the
    /// pod's namespace, so a rotation reaches running proxies without restarts and a ConfigMap
    /// writer cannot add an anchor.
    /// `since`: when the injector gave the pod its anchors
    /// (`CNIMESH_PROXY_IDENTITY_TRUST_ANCHORS_ENDORSED_SINCE`, Unix seconds); an endorsement made
    /// before it is passed over, so a replayed older bundle cannot add back an anchor a rotation
    /// dropped before the pod was admitted.
    Endorsed { pem: String, file: PathBuf, signer: Name, since: Option<u64> },
}

pub const TRUST_ANCHORS_FILE_VAR: &str = "CNIMESH_PROXY_IDENTITY_TRUST_ANCHORS";
pub const TRUST_ANCHORS_PEM_VAR: &str = "CNIMESH_PROXY_IDENTITY_TRUST_ANCHORS_PEM";
pub const TRUST_ANCHORS_ENDORSED_BY_VAR: &str = "CNIMESH_PROXY_IDENTITY_TRUST_ANCHORS_ENDORSED_BY";
pub const TRUST_ANCHORS_ENDORSED_SINCE_VAR: &str = "CNIMESH_PROXY_IDENTITY_TRUST_ANCHORS_ENDORSED_SINCE";

impl TrustAnchors {
    /// Where the anchors came from, for messages: the file's path, or the variable's name
    /// (never the PEM itself).
    pub fn source(&self) -> String {
        match self {
            Self::File(path) => format!("{} ({TRUST_ANCHORS_FILE_VAR})", path.display()),
            Self::Pem(_) | Self::Endorsed { .. } => TRUST_ANCHORS_PEM_VAR.to_string(),
        }
    }
}

/// Debug output (a config can end up in a log line or a panic) names the PEM variable, not its
/// text.
impl std::fmt::Debug for TrustAnchors {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::File(path) => f.debug_tuple("File").field(path).finish(),
            Self::Pem(pem) => write!(f, "Pem({TRUST_ANCHORS_PEM_VAR}, {} bytes)", pem.len()),
            Self::Endorsed { pem, file, signer, .. } => {
                write!(
                    f,
                    "Endorsed({TRUST_ANCHORS_PEM_VAR}, {} bytes, then {} endorsed by {signer})",
                    pem.len(),
                    file.display()
                )
            }
        }
    }
}
