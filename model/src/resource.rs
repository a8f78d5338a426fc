//! What an operator names on the command line and in a tap query: a resource kind (kubectl's
//! names) and maybe a name, `deploy/web`. The tap relay selects pods by it and `cnimesh stat`,
//! `edges`, `tap` and `top` aggregate by it, so it lives here, below both.
//!
//! Layer: model (pure).

/// What `stat` and `edges` aggregate by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    Namespace,
    Deployment,
    StatefulSet,
    DaemonSet,
    ReplicaSet,
    Job,
    CronJob,
    Pod,
    /// Traffic to an EgressNetwork's destinations, by hostname (`egress/<hostname>`):
    /// a destination only (`stat egress`, `edges`, `tap --to`), never a set of pods.
    Egress,
}

impl Kind {
    /// Lower case, as in the owner labels (`cnimesh.io/proxy-deployment`).
    pub fn name(self) -> &'static str {
        match self {
            Kind::Namespace => "namespace",
            Kind::Deployment => "deployment",
            Kind::StatefulSet => "statefulset",
            Kind::DaemonSet => "daemonset",
            Kind::ReplicaSet => "replicaset",
            Kind::Job => "job",
            Kind::CronJob => "cronjob",
            Kind::Pod => "pod",
            Kind::Egress => "egress",
        }
    }
}

impl std::str::FromStr for Kind {
    type Err = String;
    /// kubectl's names, short names and plurals.
    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s.to_ascii_lowercase().as_str() {
            "ns" | "namespace" | "namespaces" => Kind::Namespace,
            "deploy" | "deployment" | "deployments" => Kind::Deployment,
            "sts" | "statefulset" | "statefulsets" => Kind::StatefulSet,
            "ds" | "daemonset" | "daemonsets" => Kind::DaemonSet,
            "rs" | "replicaset" | "replicasets" => Kind::ReplicaSet,
            "job" | "jobs" => Kind::Job,
            "cj" | "cronjob" | "cronjobs" => Kind::CronJob,
            "po" | "pod" | "pods" => Kind::Pod,
            "egress" | "egresses" => Kind::Egress,
            other => {
                return Err(format!(
                    "unknown resource kind {other:?}: expected namespace, deployment, statefulset, daemonset, \
                     replicaset, job, cronjob, pod (or their short names) or egress"
                ));
            }
        })
    }
}

/// `<kind>[/<name>]`, e.g. `deploy/web` or `deployments`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resource {
    pub kind: Kind,
    pub name: Option<String>,
}

impl std::str::FromStr for Resource {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let (kind, name) = match s.split_once('/') {
            Some((_, "")) => return Err(format!("{s:?}: a name must follow the '/'")),
            Some((kind, name)) => (kind, Some(name.to_string())),
            None => (s, None),
        };
        Ok(Self { kind: kind.parse()?, name })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resources_parse_with_kubectls_names_and_mistakes_are_named() {
        let r: Resource = "deploy/web".parse().unwrap();
        assert_eq!((r.kind, r.name.as_deref()), (Kind::Deployment, Some("web")));
        assert_eq!("sts".parse::<Resource>().unwrap().kind, Kind::StatefulSet);
        assert!("widgets/x".parse::<Resource>().unwrap_err().contains("unknown resource kind \"widgets\""));
        assert!("deploy/".parse::<Resource>().unwrap_err().contains("a name must follow"));
        let egress: Resource = "egress/api.example.test".parse().unwrap();
        assert_eq!((egress.kind, egress.name.as_deref()), (Kind::Egress, Some("api.example.test")));
    }
}
