//! A Link's kubeconfig, read as data and never as code: the one reader of the credentials a Link's
//! Secret carries, for the mirror controller and for `cnimesh multicluster check` alike.
//!
//! Whoever can hand an operator a Link can write its kubeconfig, and the process that reads it
//! (the control plane, which holds the issuer key; the operator's machine) must not run or read
//! anything the kubeconfig names. So exactly one shape is accepted, the one `cnimesh multicluster
//! link` writes: one cluster whose `server` is `https://` with its CA inline
//! (`certificate-authority-data`), one user with an inline `token` or an inline client
//! certificate and key (`client-certificate-data` + `client-key-data`), at most one context
//! naming those two. Local mode's `file:///DIR` server (the files backend) needs no CA and no
//! user. Every other field is refused by name: `exec` and `auth-provider` run commands, `tokenFile`
//! and the certificate, key and CA *paths* read files, `proxy-url` and
//! `insecure-skip-tls-verify` send the credentials elsewhere or unverified, an `http://` server
//! sends them in clear; fields this reader does not know are refused too, so a new kube feature
//! is never honoured by accident.
//!
//! The client's [`kube::Config`] is built from the parsed data by hand
//! ([`ApiCredentials::client_config`]), never through kube's kubeconfig loader, so no command or
//! file path can reach it.
//!
//! Layer: model (pure).

use std::path::PathBuf;

use base64::Engine;
use rustls_pki_types::CertificateDer;
use serde_json::{Map, Value};

/// Where a Link's kubeconfig points, and with what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LinkKubeconfig {
    /// `file:///DIR`: a cluster directory (local mode's files backend only; the caller decides
    /// whether it may be followed).
    Files(PathBuf),
    /// An API server.
    Api(ApiCredentials),
}

/// An API server and the credentials to read it, all inline.
#[derive(Clone, PartialEq, Eq)]
pub struct ApiCredentials {
    /// `https://…`.
    pub server: http::Uri,
    /// The CA the server's certificate must chain to (DER).
    pub ca: Vec<CertificateDer<'static>>,
    /// The name the server's certificate must carry, when not the server's host.
    pub tls_server_name: Option<String>,
    pub user: Credential,
}

/// How the reader authenticates.
#[derive(Clone, PartialEq, Eq)]
pub enum Credential {
    /// A bearer token.
    Token(String),
    /// A client certificate and its key, base64 of PEM as the kubeconfig carries them.
    ClientCertificate { certificate_data: String, key_data: String },
}

/// The credentials never appear in logs or errors: only their kind.
impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Credential::Token(_) => "Token(..)",
            Credential::ClientCertificate { .. } => "ClientCertificate(..)",
        })
    }
}

impl std::fmt::Debug for ApiCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiCredentials")
            .field("server", &self.server)
            .field("ca", &self.ca.len())
            .field("tls_server_name", &self.tls_server_name)
            .field("user", &self.user)
            .finish()
    }
}

/// Why a Link's kubeconfig is refused; each names the field (`users[0].user.exec`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KubeconfigError {
    #[error("the kubeconfig does not parse: {0}")]
    Invalid(String),
    #[error(
        "{field}: runs a command; a Link's credentials are data, never code (an inline token or client certificate)"
    )]
    Command { field: String },
    #[error("{field}: names a file on the reader's machine; a Link's credentials must be inline (token, *-data)")]
    FilePath { field: String },
    #[error("{field}: a Link's API server is reached directly, never through a proxy")]
    Proxy { field: String },
    #[error("{field}: a Link's API server certificate is always verified (certificate-authority-data)")]
    InsecureTls { field: String },
    #[error("{field} {server:?}: only an https:// server (or file:// in local mode) carries a Link's credentials")]
    Scheme { field: String, server: String },
    #[error("{field}: {count} entries; a Link's kubeconfig holds exactly one")]
    NotOne { field: String, count: usize },
    #[error("{field} is missing: {why}")]
    Missing { field: String, why: &'static str },
    #[error("{field}: not a field a Link's kubeconfig may carry")]
    Unknown { field: String },
    #[error("{field}: {error}")]
    BadValue { field: String, error: String },
}

impl KubeconfigError {
    /// The field refused (None when the text does not parse at all).
    pub fn field(&self) -> Option<&str> {
        match self {
            KubeconfigError::Invalid(_) => None,
            KubeconfigError::Command { field }
            | KubeconfigError::FilePath { field }
            | KubeconfigError::Proxy { field }
            | KubeconfigError::InsecureTls { field }
            | KubeconfigError::Scheme { field, .. }
            | KubeconfigError::NotOne { field, .. }
            | KubeconfigError::Missing { field, .. }
            | KubeconfigError::Unknown { field }
            | KubeconfigError::BadValue { field, .. } => Some(field),
        }
    }
}

/// Reads a Link's kubeconfig; see the module docs for what is accepted.
pub fn parse(text: &str) -> Result<LinkKubeconfig, KubeconfigError> {
    let doc: Value = serde_saphyr::from_str(text).map_err(|e| KubeconfigError::Invalid(e.to_string()))?;
    let top = object(&doc, "the kubeconfig")?;
    for (key, value) in top {
        match key.as_str() {
            "clusters" | "users" | "contexts" | "current-context" => {}
            "apiVersion" if value.as_str() == Some("v1") => {}
            "kind" if value.as_str() == Some("Config") => {}
            "apiVersion" | "kind" => return Err(bad(key, format!("{value} is not a kubeconfig's"))),
            // kubectl writes an empty `preferences: {}`; anything in it is refused.
            "preferences" if is_empty(value) => {}
            _ => return Err(unknown(key)),
        }
    }
    let (cluster_name, cluster) = one(top, "clusters", "cluster")?;
    let (user_name, user) = one(top, "users", "user")?;
    check_context(top, &cluster_name, &user_name)?;
    let server = read_cluster(&cluster)?;
    let user = read_user(&user)?;
    let field = "clusters[0].cluster.server";
    if let Some(path) = server.strip_prefix("file://") {
        if !path.starts_with('/') {
            return Err(bad(field, format!("{server:?}: a file:// server must be an absolute path")));
        }
        return Ok(LinkKubeconfig::Files(PathBuf::from(path)));
    }
    let lower = server.to_ascii_lowercase();
    if !lower.starts_with("https://") {
        return Err(KubeconfigError::Scheme { field: field.into(), server });
    }
    let uri: http::Uri = server.parse().map_err(|e| bad(field, format!("{server:?}: {e}")))?;
    if uri.host().is_none_or(str::is_empty) {
        return Err(bad(field, format!("{server:?} names no host")));
    }
    let ca = match cluster.get("certificate-authority-data") {
        Some(data) => {
            let field = "clusters[0].cluster.certificate-authority-data";
            let pem = base64_of(data, field)?;
            let certs = cnimesh_identity::pem::certs(&pem, field).map_err(|e| bad(field, e.to_string()))?;
            if certs.is_empty() {
                return Err(bad(field, "holds no certificate".into()));
            }
            certs
        }
        None => {
            return Err(KubeconfigError::Missing {
                field: "clusters[0].cluster.certificate-authority-data".into(),
                why: "an https:// server's CA must be inline",
            });
        }
    };
    let tls_server_name = cluster
        .get("tls-server-name")
        .map(|v| string(v, "clusters[0].cluster.tls-server-name").map(str::to_string))
        .transpose()?;
    let user = user.ok_or(KubeconfigError::Missing {
        field: "users[0].user".into(),
        why: "an inline token, or client-certificate-data with client-key-data",
    })?;
    Ok(LinkKubeconfig::Api(ApiCredentials { server: uri, ca, tls_server_name, user }))
}

impl ApiCredentials {
    /// A client configuration holding exactly these credentials: built field by field, so
    /// nothing but the server, the CA and the token or certificate reaches the client. kube-rs's
    /// own retries (minutes of 503s) are off: the caller's watches back off themselves and a
    /// failing server must count as failing at once.
    pub fn client_config(&self) -> Result<kube::Config, KubeconfigError> {
        let mut config = kube::Config::new(self.server.clone());
        config.root_cert = Some(self.ca.iter().map(|c| c.to_vec()).collect());
        config.tls_server_name = self.tls_server_name.clone();
        config.default_retry = false;
        let user = match &self.user {
            Credential::Token(token) => serde_json::json!({"token": token}),
            Credential::ClientCertificate { certificate_data, key_data } => {
                serde_json::json!({"client-certificate-data": certificate_data, "client-key-data": key_data})
            }
        };
        config.auth_info = serde_json::from_value(user).map_err(|e| bad("users[0].user", e.to_string()))?;
        Ok(config)
    }
}

/// The only entry of `top[list]` (`clusters`, `users`): its name and its `inner` object.
fn one(top: &Map<String, Value>, list: &str, inner: &str) -> Result<(String, Map<String, Value>), KubeconfigError> {
    let entries = match top.get(list) {
        None | Some(Value::Null) => &[][..],
        Some(Value::Array(entries)) => entries.as_slice(),
        Some(_) => return Err(bad(list, "not a list".into())),
    };
    let [entry] = entries else {
        if entries.is_empty() {
            return Err(KubeconfigError::Missing { field: list.into(), why: "a Link's kubeconfig holds exactly one" });
        }
        return Err(KubeconfigError::NotOne { field: list.into(), count: entries.len() });
    };
    let at = format!("{list}[0]");
    let entry = object(entry, &at)?;
    let mut name = String::new();
    let mut body = Map::new();
    for (key, value) in entry {
        match key.as_str() {
            "name" => name = string(value, &format!("{at}.name"))?.to_string(),
            k if k == inner => body = object(value, &format!("{at}.{inner}"))?.clone(),
            _ => return Err(unknown(&format!("{at}.{key}"))),
        }
    }
    Ok((name, body))
}

/// At most one context, and it names the one cluster and the one user; `current-context`, if
/// any, names it.
fn check_context(top: &Map<String, Value>, cluster: &str, user: &str) -> Result<(), KubeconfigError> {
    let contexts = match top.get("contexts") {
        None | Some(Value::Null) => &[][..],
        Some(Value::Array(entries)) => entries.as_slice(),
        Some(_) => return Err(bad("contexts", "not a list".into())),
    };
    let current = top.get("current-context").map(|c| string(c, "current-context")).transpose()?;
    let context = match contexts {
        [] => None,
        [context] => Some(object(context, "contexts[0]")?),
        _ => return Err(KubeconfigError::NotOne { field: "contexts".into(), count: contexts.len() }),
    };
    let mut name = None;
    if let Some(context) = context {
        for (key, value) in context {
            match key.as_str() {
                "name" => name = Some(string(value, "contexts[0].name")?),
                "context" => {
                    for (key, value) in object(value, "contexts[0].context")? {
                        let field = format!("contexts[0].context.{key}");
                        let wanted = match key.as_str() {
                            "cluster" => cluster,
                            "user" => user,
                            "namespace" => continue,
                            _ => return Err(unknown(&field)),
                        };
                        let named = string(value, &field)?;
                        if named != wanted {
                            return Err(bad(&field, format!("{named:?} is not the kubeconfig's one {key} {wanted:?}")));
                        }
                    }
                }
                _ => return Err(unknown(&format!("contexts[0].{key}"))),
            }
        }
    }
    match (current, name) {
        (None | Some(""), _) => Ok(()),
        (Some(current), Some(name)) if current == name => Ok(()),
        (Some(current), _) => Err(bad("current-context", format!("{current:?} names no context of this kubeconfig"))),
    }
}

/// The cluster's `server`, after refusing every field but the inline ones.
fn read_cluster(cluster: &Map<String, Value>) -> Result<String, KubeconfigError> {
    let at = |key: &str| format!("clusters[0].cluster.{key}");
    for (key, value) in cluster {
        match key.as_str() {
            "server" | "certificate-authority-data" | "tls-server-name" => {}
            "certificate-authority" => return Err(KubeconfigError::FilePath { field: at(key) }),
            "proxy-url" => return Err(KubeconfigError::Proxy { field: at(key) }),
            "insecure-skip-tls-verify" if value.as_bool() == Some(false) || value.is_null() => {}
            "insecure-skip-tls-verify" => return Err(KubeconfigError::InsecureTls { field: at(key) }),
            _ => return Err(unknown(&at(key))),
        }
    }
    match cluster.get("server") {
        Some(server) => Ok(string(server, &at("server"))?.trim().to_string()),
        None => Err(KubeconfigError::Missing { field: at("server"), why: "the API server's https:// URL" }),
    }
}

/// The user's inline credential (None: none given, which only a `file://` server may do).
fn read_user(user: &Map<String, Value>) -> Result<Option<Credential>, KubeconfigError> {
    let at = |key: &str| format!("users[0].user.{key}");
    for key in user.keys() {
        match key.as_str() {
            "token" | "client-certificate-data" | "client-key-data" => {}
            "exec" | "auth-provider" => return Err(KubeconfigError::Command { field: at(key) }),
            "tokenFile" | "client-certificate" | "client-key" => {
                return Err(KubeconfigError::FilePath { field: at(key) });
            }
            _ => return Err(unknown(&at(key))),
        }
    }
    let token = user.get("token").map(|t| string(t, &at("token"))).transpose()?;
    let certificate = user.get("client-certificate-data");
    let key = user.get("client-key-data");
    match (token, certificate, key) {
        (None, None, None) => Ok(None),
        (Some(token), None, None) => {
            if token.trim().is_empty() {
                return Err(bad(&at("token"), "is empty".into()));
            }
            Ok(Some(Credential::Token(token.trim().to_string())))
        }
        (None, Some(certificate), Some(key)) => {
            let (cert_field, key_field) = (at("client-certificate-data"), at("client-key-data"));
            let certs = cnimesh_identity::pem::certs(&base64_of(certificate, &cert_field)?, &cert_field)
                .map_err(|e| bad(&cert_field, e.to_string()))?;
            if certs.is_empty() {
                return Err(bad(&cert_field, "holds no certificate".into()));
            }
            cnimesh_identity::pem::key(&base64_of(key, &key_field)?, &key_field)
                .map_err(|e| bad(&key_field, e.to_string()))?;
            Ok(Some(Credential::ClientCertificate {
                certificate_data: string(certificate, &cert_field)?.trim().to_string(),
                key_data: string(key, &key_field)?.trim().to_string(),
            }))
        }
        (None, Some(_), None) => Err(KubeconfigError::Missing {
            field: at("client-key-data"),
            why: "client-certificate-data goes with its key",
        }),
        (None, None, Some(_)) => Err(KubeconfigError::Missing {
            field: at("client-certificate-data"),
            why: "client-key-data goes with its certificate",
        }),
        (Some(_), _, _) => {
            Err(bad(&at("token"), "a token and a client certificate: give one credential, not both".into()))
        }
    }
}

fn object<'v>(value: &'v Value, field: &str) -> Result<&'v Map<String, Value>, KubeconfigError> {
    value.as_object().ok_or_else(|| bad(field, "not a mapping".into()))
}

fn string<'v>(value: &'v Value, field: &str) -> Result<&'v str, KubeconfigError> {
    value.as_str().ok_or_else(|| bad(field, "not a string".into()))
}

fn is_empty(value: &Value) -> bool {
    value.is_null() || value.as_object().is_some_and(Map::is_empty)
}

fn base64_of(value: &Value, field: &str) -> Result<Vec<u8>, KubeconfigError> {
    let text: String = string(value, field)?.split_whitespace().collect();
    base64::engine::general_purpose::STANDARD.decode(text).map_err(|e| bad(field, format!("not base64: {e}")))
}

fn bad(field: &str, error: String) -> KubeconfigError {
    KubeconfigError::BadValue { field: field.to_string(), error }
}

fn unknown(field: &str) -> KubeconfigError {
    KubeconfigError::Unknown { field: field.to_string() }
}

#[cfg(test)]
mod tests;
