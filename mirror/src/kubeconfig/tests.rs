use base64::Engine;
use serde_json::{Value, json};

use super::*;

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// A self-signed certificate and its key (PEM).
fn certificate() -> (String, String) {
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let cert = rcgen::CertificateParams::new(vec!["kubernetes".to_string()]).unwrap().self_signed(&key).unwrap();
    (cert.pem(), key.serialize_pem())
}

/// What `cnimesh multicluster link` writes: one cluster with its CA inline, one user with a
/// token, one context naming both.
fn linked() -> Value {
    let (ca, _) = certificate();
    json!({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "west", "cluster": {"server": "https://10.0.0.1:6443", "certificate-authority-data": b64(ca.as_bytes())}}],
        "users": [{"name": "cnimesh-mirror-reader", "user": {"token": "abc"}}],
        "contexts": [{"name": "west", "context": {"cluster": "west", "user": "cnimesh-mirror-reader"}}],
        "current-context": "west",
    })
}

fn refused(config: &Value) -> KubeconfigError {
    parse(&config.to_string()).expect_err("refused")
}

/// `config` with `field` (a JSON pointer) set to `value`.
fn with(mut config: Value, pointer: &str, key: &str, value: Value) -> Value {
    config.pointer_mut(pointer).unwrap().as_object_mut().unwrap().insert(key.into(), value);
    config
}

fn user_with(key: &str, value: Value) -> Value {
    with(linked(), "/users/0/user", key, value)
}

fn cluster_with(key: &str, value: Value) -> Value {
    with(linked(), "/clusters/0/cluster", key, value)
}

#[test]
fn what_link_writes_is_accepted_and_becomes_a_client_config_of_exactly_that_data() {
    let LinkKubeconfig::Api(api) = parse(&linked().to_string()).unwrap() else { panic!("an API server") };
    assert_eq!(
        (api.server.scheme_str(), api.server.host(), api.server.port_u16()),
        (Some("https"), Some("10.0.0.1"), Some(6443))
    );
    assert_eq!(api.ca.len(), 1);
    assert_eq!(api.user, Credential::Token("abc".into()));
    assert!(!format!("{api:?}").contains("abc"), "the token stays out of Debug: {api:?}");
    let config = api.client_config().unwrap();
    assert_eq!(config.root_cert.as_ref().map(Vec::len), Some(1));
    assert!(!config.accept_invalid_certs && config.proxy_url.is_none() && config.root_cert_file.is_none());
    assert!(!config.default_retry);
    let user = &config.auth_info;
    assert!(user.token.is_some());
    assert!(user.exec.is_none() && user.auth_provider.is_none() && user.token_file.is_none());
    assert!(user.client_certificate.is_none() && user.client_key.is_none());
}

#[test]
fn an_inline_client_certificate_and_key_are_accepted() {
    let (cert, key) = certificate();
    let mut config = linked();
    config["users"][0]["user"] =
        json!({"client-certificate-data": b64(cert.as_bytes()), "client-key-data": b64(key.as_bytes())});
    let LinkKubeconfig::Api(api) = parse(&config.to_string()).unwrap() else { panic!("an API server") };
    assert!(matches!(api.user, Credential::ClientCertificate { .. }));
    let client = api.client_config().unwrap();
    assert!(client.auth_info.client_certificate_data.is_some() && client.auth_info.client_key_data.is_some());
}

#[test]
fn a_local_mode_directory_needs_no_ca_and_no_user_but_must_be_absolute() {
    let config = json!({"clusters": [{"name": "west", "cluster": {"server": "file:///var/west/cluster"}}],
        "users": [{"name": "r", "user": {}}]});
    assert_eq!(parse(&config.to_string()).unwrap(), LinkKubeconfig::Files("/var/west/cluster".into()));
    let relative = json!({"clusters": [{"name": "west", "cluster": {"server": "file://west"}}], "users": [{"name": "r", "user": {}}]});
    assert_eq!(refused(&relative).field(), Some("clusters[0].cluster.server"));
}

#[test]
fn an_exec_stanza_is_refused_by_name() {
    let error = refused(&user_with("exec", json!({"apiVersion": "client.authentication.k8s.io/v1", "command": "sh"})));
    assert_eq!(error, KubeconfigError::Command { field: "users[0].user.exec".into() });
    assert!(error.to_string().contains("users[0].user.exec"), "{error}");
}

#[test]
fn an_auth_provider_is_refused_by_name() {
    let error = refused(&user_with("auth-provider", json!({"name": "gcp", "config": {"cmd-path": "/bin/sh"}})));
    assert_eq!(error, KubeconfigError::Command { field: "users[0].user.auth-provider".into() });
}

#[test]
fn a_token_file_is_refused_by_name() {
    let error = refused(&user_with("tokenFile", json!("/etc/shadow")));
    assert_eq!(error, KubeconfigError::FilePath { field: "users[0].user.tokenFile".into() });
}

#[test]
fn a_client_certificate_path_is_refused_by_name() {
    let error = refused(&user_with("client-certificate", json!("/var/run/issuer/tls.crt")));
    assert_eq!(error, KubeconfigError::FilePath { field: "users[0].user.client-certificate".into() });
}

#[test]
fn a_client_key_path_is_refused_by_name() {
    let error = refused(&user_with("client-key", json!("/var/run/issuer/tls.key")));
    assert_eq!(error, KubeconfigError::FilePath { field: "users[0].user.client-key".into() });
}

#[test]
fn a_certificate_authority_path_is_refused_by_name() {
    let error = refused(&cluster_with("certificate-authority", json!("/etc/ssl/ca.crt")));
    assert_eq!(error, KubeconfigError::FilePath { field: "clusters[0].cluster.certificate-authority".into() });
}

#[test]
fn a_proxy_url_is_refused_by_name() {
    let error = refused(&cluster_with("proxy-url", json!("socks5://198.51.100.66:1080")));
    assert_eq!(error, KubeconfigError::Proxy { field: "clusters[0].cluster.proxy-url".into() });
}

#[test]
fn insecure_skip_tls_verify_is_refused_by_name_and_false_is_harmless() {
    let error = refused(&cluster_with("insecure-skip-tls-verify", json!(true)));
    assert_eq!(error, KubeconfigError::InsecureTls { field: "clusters[0].cluster.insecure-skip-tls-verify".into() });
    assert!(parse(&cluster_with("insecure-skip-tls-verify", json!(false)).to_string()).is_ok());
}

#[test]
fn an_http_server_is_refused_by_name() {
    let error = refused(&cluster_with("server", json!("http://10.0.0.1:8080")));
    assert_eq!(
        error,
        KubeconfigError::Scheme { field: "clusters[0].cluster.server".into(), server: "http://10.0.0.1:8080".into() }
    );
    assert_eq!(
        refused(&cluster_with("server", json!("unix:///run/k8s.sock"))).field(),
        Some("clusters[0].cluster.server")
    );
}

#[test]
fn an_https_server_without_its_ca_inline_is_refused_by_name() {
    let mut config = linked();
    config["clusters"][0]["cluster"].as_object_mut().unwrap().remove("certificate-authority-data");
    assert_eq!(refused(&config).field(), Some("clusters[0].cluster.certificate-authority-data"));
    assert_eq!(
        refused(&cluster_with("certificate-authority-data", json!(b64(b"not a certificate")))).field(),
        Some("clusters[0].cluster.certificate-authority-data")
    );
}

#[test]
fn several_clusters_users_or_contexts_are_refused_as_ambiguous() {
    let mut config = linked();
    let cluster = config["clusters"][0].clone();
    config["clusters"].as_array_mut().unwrap().push(cluster);
    assert_eq!(refused(&config), KubeconfigError::NotOne { field: "clusters".into(), count: 2 });
    let mut config = linked();
    let user = config["users"][0].clone();
    config["users"].as_array_mut().unwrap().push(user);
    assert_eq!(refused(&config), KubeconfigError::NotOne { field: "users".into(), count: 2 });
    let mut config = linked();
    let context = config["contexts"][0].clone();
    config["contexts"].as_array_mut().unwrap().push(context);
    assert_eq!(refused(&config), KubeconfigError::NotOne { field: "contexts".into(), count: 2 });
}

#[test]
fn a_context_or_current_context_naming_something_else_is_refused() {
    let mut config = linked();
    config["contexts"][0]["context"]["user"] = json!("admin");
    assert_eq!(refused(&config).field(), Some("contexts[0].context.user"));
    let mut config = linked();
    config["current-context"] = json!("prod");
    assert_eq!(refused(&config).field(), Some("current-context"));
}

#[test]
fn an_unknown_field_anywhere_is_refused_by_name() {
    assert_eq!(
        refused(&user_with("as", json!("system:admin"))),
        KubeconfigError::Unknown { field: "users[0].user.as".into() }
    );
    assert_eq!(
        refused(&user_with("username", json!("admin"))),
        KubeconfigError::Unknown { field: "users[0].user.username".into() }
    );
    assert_eq!(
        refused(&cluster_with("extensions", json!([]))),
        KubeconfigError::Unknown { field: "clusters[0].cluster.extensions".into() }
    );
    assert_eq!(
        refused(&with(linked(), "", "extensions", json!([]))),
        KubeconfigError::Unknown { field: "extensions".into() }
    );
}

#[test]
fn a_user_without_a_credential_or_with_half_of_one_is_refused_by_name() {
    let mut config = linked();
    config["users"][0]["user"] = json!({});
    assert_eq!(refused(&config).field(), Some("users[0].user"));
    let (cert, _) = certificate();
    config["users"][0]["user"] = json!({"client-certificate-data": b64(cert.as_bytes())});
    assert_eq!(refused(&config).field(), Some("users[0].user.client-key-data"));
    assert!(matches!(parse("clusters: [3"), Err(KubeconfigError::Invalid(_))));
}
