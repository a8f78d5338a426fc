//! `daemonset/multicluster/`: the Link CRD is exactly what
//! `cnimesh_mirror::crd` derives (so the schema the API server enforces is the one
//! the mirror controller parses with), and every document `cnimesh multicluster install` prints
//! passes the strict k8s-openapi round trip every other manifest passes.
//! `UPDATE_GOLDEN=1 cargo nextest run -p cnimesh-cli --test multicluster_manifests` rewrites the CRD
//! after a change to the types.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Secret, Service, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;
use serde_json::Value;

#[path = "../../tests/src/manifest_check.rs"]
mod manifest_check;

const FILE: &str = "multicluster/link-crd.yaml";
const HEADER: &str = "# The Link custom resource (group multicluster.cnimesh.io, version v1alpha1), generated from\n# mirror/src/crd.rs: do not edit by hand. `UPDATE_GOLDEN=1 cargo nextest run -p\n# cnimesh-cli --test multicluster_manifests` rewrites this file.\n";

#[test]
fn the_checked_in_link_crd_equals_the_derived_one() {
    let path = manifest_check::daemonset_dir().join(FILE);
    let derived = serde_json::to_value(cnimesh_mirror::crd::Link::crd()).unwrap();
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        let text = format!("{HEADER}{}", cnimesh_cli::yaml::render(std::slice::from_ref(&derived)));
        std::fs::write(&path, text).unwrap();
    }
    let docs = manifest_check::documents(&path);
    assert_eq!(docs.len(), 1, "{}: one CRD", path.display());
    manifest_check::strict::<CustomResourceDefinition>(&docs[0]).unwrap();
    assert_eq!(docs[0], derived, "{} differs from the derive (UPDATE_GOLDEN=1 rewrites it)", path.display());
    assert_eq!(derived["spec"]["names"]["kind"], "Link");
    assert!(derived["spec"]["versions"][0]["subresources"]["status"].is_object(), "the status subresource");
}

fn strict(doc: &Value) -> Result<(), String> {
    match doc["kind"].as_str().unwrap_or_default() {
        "CustomResourceDefinition" => manifest_check::strict::<CustomResourceDefinition>(doc).map(drop),
        "Namespace" => manifest_check::strict::<Namespace>(doc).map(drop),
        "ServiceAccount" => manifest_check::strict::<ServiceAccount>(doc).map(drop),
        "Deployment" => manifest_check::strict::<Deployment>(doc).map(drop),
        "Service" => manifest_check::strict::<Service>(doc).map(drop),
        "Secret" => manifest_check::strict::<Secret>(doc).map(drop),
        "ClusterRole" => manifest_check::strict::<ClusterRole>(doc).map(drop),
        "ClusterRoleBinding" => manifest_check::strict::<ClusterRoleBinding>(doc).map(drop),
        "Role" => manifest_check::strict::<Role>(doc).map(drop),
        "RoleBinding" => manifest_check::strict::<RoleBinding>(doc).map(drop),
        other => Err(format!("unknown kind {other:?}: teach cli/tests/multicluster_manifests.rs about it")),
    }
}

#[test]
fn every_multicluster_document_round_trips_through_k8s_openapi_as_printed_and_as_shipped() {
    for (name, _) in cnimesh_cli::manifests::MULTICLUSTER_FILES {
        let path = manifest_check::daemonset_dir().join(name.trim_start_matches("daemonset/"));
        for (i, doc) in manifest_check::documents(&path).iter().enumerate() {
            strict(doc).unwrap_or_else(|e| panic!("{}: {e}", manifest_check::describe(&path, i, doc)));
        }
    }
    let anchor = cnimesh_identity::ca::new_trust_anchor("west.local", std::time::Duration::from_secs(86400)).unwrap();
    let args = cnimesh_cli::multicluster::install::InstallArgs::default();
    let printed = cnimesh_cli::multicluster::install::render(&args, &anchor.cert_pem, "west.local").unwrap();
    let printed = manifest_check::parse(&cnimesh_cli::yaml::render(&printed)).unwrap();
    for doc in &printed {
        strict(doc).unwrap_or_else(|e| panic!("printed {}: {e}", doc["metadata"]["name"]));
    }
}

#[test]
fn the_mirrors_rbac_grants_exactly_what_the_mirror_uses_and_no_secret() {
    let path = manifest_check::daemonset_dir().join("multicluster/mirror.yaml");
    let mut grants = Vec::new();
    for doc in manifest_check::documents(&path) {
        let scope = doc["metadata"]["namespace"].as_str().unwrap_or("*").to_string();
        for rule in doc["rules"].as_array().into_iter().flatten() {
            let names: Vec<&str> =
                rule["resourceNames"].as_array().into_iter().flatten().filter_map(|n| n.as_str()).collect();
            let names = if names.is_empty() { String::new() } else { format!("[{}]", names.join(",")) };
            for resource in rule["resources"].as_array().unwrap() {
                for verb in rule["verbs"].as_array().unwrap() {
                    grants.push(format!("{scope} {}{names} {}", resource.as_str().unwrap(), verb.as_str().unwrap()));
                }
            }
        }
    }
    grants.sort();
    let mut want: Vec<String> = Vec::new();
    for resource in ["services", "endpointslices"] {
        for verb in ["get", "list", "watch", "create", "update", "patch", "delete"] {
            want.push(format!("* {resource} {verb}"));
        }
    }
    for verb in ["get", "list", "watch"] {
        want.push(format!("* pods {verb}"));
        want.push(format!("cnimesh links {verb}"));
    }
    for verb in ["get", "patch", "update"] {
        want.push(format!("cnimesh links/status {verb}"));
    }
    want.push("cnimesh leases create".into());
    for verb in ["get", "update"] {
        want.push(format!("cnimesh leases[cnimesh-control-mirror-write] {verb}"));
    }
    want.sort();
    assert_eq!(grants, want, "a Link's Secret is readable only through the Role `multicluster link` prints");
}
