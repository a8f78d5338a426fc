//! The policy CRDs under `daemonset/control-policy-crds.yaml` are exactly what the Rust types in
//! `cnimesh_model::policy::crd` derive (so the schema the API server enforces is the one the
//! control plane parses with), and they pass the same strict k8s-openapi round trip as every
//! other manifest. `UPDATE_GOLDEN=1 cargo nextest run -p cnimesh-cli --test policy_crds`
//! rewrites the file after a change to the types.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use serde_json::Value;

#[path = "../../tests/src/manifest_check.rs"]
mod manifest_check;

const FILE: &str = "control-policy-crds.yaml";
const HEADER: &str = "# The control plane's custom resources (the policy kinds, group policy.cnimesh.io, and ExternalWorkload,\n# group workload.cnimesh.io; version v1alpha1), generated from model/src/policy/crd.rs and\n# model/src/external/crd.rs: do not edit by hand. `UPDATE_GOLDEN=1 cargo nextest run -p\n# cnimesh-cli --test policy_crds` rewrites this file; cli/tests/policy_crds.rs checks it.\n";

fn derived() -> Vec<Value> {
    cnimesh_model::policy::crd::definitions().iter().map(|crd| serde_json::to_value(crd).unwrap()).collect()
}

#[test]
fn checked_in_crds_equal_the_derived_ones() {
    let path = manifest_check::daemonset_dir().join(FILE);
    let derived = derived();
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        let text = format!("{HEADER}{}", cnimesh_cli::yaml::render(&derived));
        std::fs::write(&path, text).unwrap();
    }
    let docs = manifest_check::documents(&path);
    assert_eq!(docs.len(), derived.len(), "{}: one CRD per kind", path.display());
    for (i, (doc, want)) in docs.iter().zip(&derived).enumerate() {
        let what = manifest_check::describe(&path, i, doc);
        manifest_check::strict::<CustomResourceDefinition>(doc).unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(doc, want, "{what} differs from the derive (UPDATE_GOLDEN=1 rewrites it)");
    }
}

#[test]
fn crds_name_the_group_version_and_kinds_the_design_fixes() {
    let kinds: Vec<(String, String, String)> = cnimesh_model::policy::crd::definitions()
        .into_iter()
        .map(|crd| (crd.spec.group, crd.spec.versions[0].name.clone(), crd.spec.names.kind))
        .collect();
    // Rate limiting adds HTTPLocalRateLimitPolicy, egress EgressNetwork.
    let want = [
        "Server",
        "AuthorizationPolicy",
        "MeshTLSAuthentication",
        "NetworkAuthentication",
        "HTTPLocalRateLimitPolicy",
        "EgressNetwork",
    ]
    .map(|k| ("policy.cnimesh.io".to_string(), "v1alpha1".to_string(), k.to_string()));
    let external = ("workload.cnimesh.io".to_string(), "v1alpha1".to_string(), "ExternalWorkload".to_string());
    assert_eq!(kinds, [want.as_slice(), &[external]].concat());
}

#[test]
fn schemas_constrain_what_a_schema_can() {
    let docs = derived();
    let server = &docs[0]["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"];
    assert_eq!(
        server["proxyProtocol"]["enum"],
        serde_json::json!(["unknown", "HTTP/1", "HTTP/2", "gRPC", "opaque", "TLS"])
    );
    assert_eq!(server["port"]["x-kubernetes-int-or-string"], true);
    let ops = &server["podSelector"]["properties"]["matchExpressions"]["items"]["properties"]["operator"]["enum"];
    assert_eq!(*ops, serde_json::json!(["In", "NotIn", "Exists", "DoesNotExist"]));
    let authn = &docs[2]["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"];
    assert!(authn["identities"]["items"]["pattern"].is_string(), "{authn}");
    let target = &docs[1]["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["targetRef"]
        ["properties"]["kind"]["enum"];
    assert_eq!(*target, serde_json::json!(["Server", "Namespace", "HTTPRoute"]));
    // Audit mode and rate limits.
    assert_eq!(
        server["accessPolicy"]["enum"],
        serde_json::json!(["deny", "audit", "all-unauthenticated", "all-authenticated", "cluster-authenticated"])
    );
    let limit = &docs[4]["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"];
    assert_eq!(limit["targetRef"]["properties"]["kind"]["enum"], serde_json::json!(["Server"]));
    let rps = &limit["total"]["properties"]["requestsPerSecond"];
    assert_eq!((rps["minimum"].as_f64(), rps["maximum"].as_f64()), (Some(1.0), Some(1_000_000.0)), "{rps}");
    assert_eq!(limit["overrides"]["items"]["properties"]["clientRefs"]["minItems"], 1);
}

/// Every property (at any depth, array items included) of a schema, with its path.
fn properties<'a>(path: &str, schema: &'a Value, out: &mut Vec<(String, &'a Value)>) {
    if let Some(props) = schema.get("properties").and_then(Value::as_object) {
        for (name, prop) in props {
            let here = format!("{path}.{name}");
            out.push((here.clone(), prop));
            properties(&here, prop, out);
        }
    }
    if let Some(items) = schema.get("items") {
        properties(&format!("{path}[]"), items, out);
    }
}

#[test]
fn every_kind_and_field_has_a_description_kubectl_explain_can_show() {
    let mut missing = Vec::new();
    for crd in derived() {
        let kind = crd["spec"]["names"]["kind"].as_str().unwrap().to_string();
        for version in crd["spec"]["versions"].as_array().unwrap() {
            let root = &version["schema"]["openAPIV3Schema"];
            let mut all = vec![(kind.clone(), root)];
            properties(&kind, root, &mut all);
            for (path, schema) in all {
                let description = schema.get("description").and_then(Value::as_str).unwrap_or("").trim();
                if description.is_empty() || description.contains("Auto-generated derived type") {
                    missing.push(path);
                }
            }
        }
    }
    assert!(missing.is_empty(), "no description, or kube-derive's placeholder, at: {missing:#?}");
}

#[test]
fn every_kind_prints_columns_beyond_name_and_age() {
    for crd in derived() {
        let kind = crd["spec"]["names"]["kind"].as_str().unwrap();
        let columns = crd["spec"]["versions"][0]["additionalPrinterColumns"].as_array().cloned().unwrap_or_default();
        let names: Vec<&str> = columns.iter().filter_map(|c| c["name"].as_str()).collect();
        assert!(names.len() >= 2 && names.contains(&"Age"), "{kind}: printer columns {names:?}");
        for column in &columns {
            let path = column["jsonPath"].as_str().unwrap();
            assert!(path.starts_with(".spec.") || path == ".metadata.creationTimestamp", "{kind}: column path {path}");
        }
    }
}
