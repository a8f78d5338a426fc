//! Which guard the node agents' tokens get, from the API server's version: the
//! ValidatingAdmissionPolicy and its Binding (`daemonset/cnimesh-node-admission.yaml`) where the
//! server serves `admissionregistration.k8s.io/v1` policies (1.30 and later), RBAC alone below
//! (applying the policy there fails with "no matches for kind"). `install`, `upgrade`,
//! `uninstall` and `check --pre` decide here, so they agree. An offline render has no server to
//! ask: it takes the version as given (`--kubernetes-version`), never a guessed one.

use cnimesh_model::inject::ServerVersion;

/// The first minor version whose API server serves `ValidatingAdmissionPolicy` in v1.
pub const ADMISSION_POLICY: ServerVersion = ServerVersion { major: 1, minor: 30 };

/// What a stolen agent token can do where only RBAC limits it.
pub const RESIDUAL_RISK: &str = "RBAC alone then limits the node agents' tokens: a stolen one can delete any pod \
     (with --node-repair label: relabel any pod) and patch any node in the cluster, not only its own";

/// The kinds that exist only where the policy API is served.
pub const POLICY_KINDS: [&str; 2] = ["ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"];

/// Why the guard cannot be chosen.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum GuardError {
    #[error(
        "`nodeAgent.admissionPolicy: true` asks for a ValidatingAdmissionPolicy, which Kubernetes {version} does \
         not serve (1.30 or later): drop the value (install then leaves the policy out and says so) or upgrade the cluster"
    )]
    Unserved { version: ServerVersion },
    #[error(
        "an offline render (--ignore-cluster) needs the cluster's version to choose the node agents' guard: pass \
         --kubernetes-version (e.g. 1.30), or --without-node-admission-policy for servers older than 1.30"
    )]
    NoVersion,
    #[error("--kubernetes-version {given:?}: expected MAJOR.MINOR, e.g. 1.30 (a leading v and a patch are accepted)")]
    BadVersion { given: String },
}

/// `1.30`, `v1.30.2`, `1.29+`: what `--kubernetes-version` takes.
pub fn parse_version(text: &str) -> Result<ServerVersion, GuardError> {
    let bad = || GuardError::BadVersion { given: text.to_string() };
    let mut parts = text.trim().trim_start_matches('v').split('.');
    let (major, minor) = (parts.next().ok_or_else(bad)?, parts.next().ok_or_else(bad)?);
    ServerVersion::parse(major, minor).ok_or_else(bad)
}

/// The API server's version, as install decides by it.
pub async fn server_version(client: &kube::Client) -> anyhow::Result<ServerVersion> {
    let info = client.apiserver_version().await?;
    ServerVersion::from_info(&info).ok_or_else(|| {
        anyhow::anyhow!(
            "the API server's version is not a Kubernetes version (major {:?}, minor {:?})",
            info.major,
            info.minor
        )
    })
}

/// The guard an install gets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeGuard {
    /// The policy and its binding are applied.
    AdmissionPolicy,
    /// Left out: the server is older than 1.30 (`Some`), or the operator said so (`None`).
    RbacOnly { version: Option<ServerVersion> },
}

impl NodeGuard {
    /// `explicit` is `nodeAgent.admissionPolicy` when the operator gave it; `version` the
    /// server's (or `--kubernetes-version`).
    pub fn choose(explicit: Option<bool>, version: Option<ServerVersion>) -> Result<Self, GuardError> {
        match (explicit, version) {
            (Some(false), _) => Ok(NodeGuard::RbacOnly { version: None }),
            (Some(true), Some(version)) if version < ADMISSION_POLICY => Err(GuardError::Unserved { version }),
            (Some(true), _) => Ok(NodeGuard::AdmissionPolicy),
            (None, Some(version)) if version < ADMISSION_POLICY => Ok(NodeGuard::RbacOnly { version: Some(version) }),
            (None, Some(_)) => Ok(NodeGuard::AdmissionPolicy),
            (None, None) => Err(GuardError::NoVersion),
        }
    }

    /// Whether the policy's documents are rendered.
    pub fn policy(&self) -> bool {
        matches!(self, NodeGuard::AdmissionPolicy)
    }

    /// One line for the operator (stderr, and the rendering's header).
    pub fn describe(&self) -> String {
        match self {
            NodeGuard::AdmissionPolicy => {
                "the node agents' ValidatingAdmissionPolicy limits their tokens to their own node".to_string()
            }
            NodeGuard::RbacOnly { version: Some(version) } => format!(
                "Kubernetes {version} has no ValidatingAdmissionPolicy API (1.30 or later): the node agents' policy \
                 is left out. {RESIDUAL_RISK}. Upgrade the cluster to 1.30, then `cnimesh upgrade` adds it"
            ),
            NodeGuard::RbacOnly { version: None } => format!(
                "the node agents' ValidatingAdmissionPolicy is left out (nodeAgent.admissionPolicy: false). {RESIDUAL_RISK}"
            ),
        }
    }

    /// What stderr shows: only the case that weakens the install.
    pub fn warning(&self) -> Option<String> {
        (!self.policy()).then(|| format!("warning: {}", self.describe()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(minor: u32) -> Option<ServerVersion> {
        Some(ServerVersion { major: 1, minor })
    }

    #[test]
    fn the_server_version_chooses_the_guard_and_an_explicit_value_wins_where_it_can_be_served() {
        assert_eq!(NodeGuard::choose(None, v(30)), Ok(NodeGuard::AdmissionPolicy));
        assert_eq!(NodeGuard::choose(None, v(33)), Ok(NodeGuard::AdmissionPolicy));
        assert_eq!(NodeGuard::choose(None, v(24)), Ok(NodeGuard::RbacOnly { version: v(24) }));
        assert_eq!(NodeGuard::choose(None, v(29)), Ok(NodeGuard::RbacOnly { version: v(29) }));
        assert_eq!(NodeGuard::choose(Some(false), v(33)), Ok(NodeGuard::RbacOnly { version: None }));
        assert_eq!(NodeGuard::choose(Some(true), None), Ok(NodeGuard::AdmissionPolicy));
        assert_eq!(
            NodeGuard::choose(Some(true), v(24)),
            Err(GuardError::Unserved { version: ServerVersion { major: 1, minor: 24 } })
        );
        assert_eq!(NodeGuard::choose(None, None), Err(GuardError::NoVersion));
        let warning = NodeGuard::choose(None, v(24)).unwrap().warning().unwrap();
        assert!(warning.contains("Kubernetes 1.24") && warning.contains("delete any pod"), "{warning}");
        assert_eq!(NodeGuard::AdmissionPolicy.warning(), None);
    }

    #[test]
    fn kubernetes_version_takes_what_kubectl_version_prints_and_refuses_the_rest() {
        for (text, minor) in [("1.24", 24), ("v1.30.2", 30), ("1.29+", 29), (" 1.31 ", 31)] {
            assert_eq!(parse_version(text), Ok(ServerVersion { major: 1, minor }), "{text}");
        }
        for text in ["", "1", "latest", "1.x"] {
            assert_eq!(parse_version(text), Err(GuardError::BadVersion { given: text.into() }), "{text}");
        }
    }
}
