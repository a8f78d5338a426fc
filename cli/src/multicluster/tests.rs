//! `cnimesh multicluster …` against what it reads: a mocked API server for the kube path (the
//! one thing faked), real directories for local mode, a real TLS listener standing in for the
//! gateway (its certificate from the mesh's own CA code), and a real TLS listener answering as a
//! remote API server that refuses the credentials.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use base64::Engine;
use cnimesh_identity::ca::{CaPem, Signer, new_csr, new_issuer, new_trust_anchor};
use k8s_openapi::ByteString;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::super::check::mock::MockApi;
use super::super::check::{Category, Status, render_table};
use super::super::yaml;
use super::check::run;
use super::gateways::{render_table as gateways_table, rows};
use super::install::{InstallArgs, render as render_install};
use super::link::{LinkArgs, Target, kube_target, render};
use super::source::Source;
use cnimesh_apiserver::{ClusterApi, Served};
use cnimesh_mirror::crd::{GatewayStatus, LinkState, LinkStatus, MirrorCollision, MirrorStatus};

const DAY: Duration = Duration::from_secs(86400);

fn b64(bytes: &[u8]) -> Value {
    serde_json::to_value(ByteString(bytes.to_vec())).unwrap()
}

fn link_args(name: &str) -> LinkArgs {
    LinkArgs {
        cluster_name: name.into(),
        gateway_address: None,
        gateway_port: None,
        api_server_address: None,
        cluster_domain: None,
        local: None,
    }
}

fn install_args() -> InstallArgs {
    InstallArgs { proxy_image: "ghcr.io/cnimesh/cnimesh-proxy:test".into(), ..Default::default() }
}

#[test]
fn install_args_default_to_what_the_command_line_gives_without_flags() {
    #[derive(clap::Parser)]
    struct Command {
        #[command(flatten)]
        args: InstallArgs,
    }
    let parsed = <Command as clap::Parser>::try_parse_from(["install"]).unwrap();
    assert_eq!(parsed.args, InstallArgs::default());
}

#[test]
fn install_prints_the_crd_the_gateway_the_reader_and_the_control_planes_rbac_with_this_clusters_identity() {
    let anchor = new_trust_anchor("west.local", DAY).unwrap();
    let docs = render_install(&install_args(), &anchor.cert_pem, "west.local").unwrap();
    let docs = yaml::documents(&yaml::render(&docs), "output").unwrap();
    let kinds: Vec<String> = docs.iter().map(yaml::describe).collect();
    for want in [
        "CustomResourceDefinition/links.multicluster.cnimesh.io",
        "Namespace/cnimesh-multicluster",
        "ServiceAccount/cnimesh-multicluster/cnimesh-gateway",
        "Deployment/cnimesh-multicluster/cnimesh-gateway",
        "Service/cnimesh-multicluster/cnimesh-gateway",
        "ServiceAccount/cnimesh-multicluster/cnimesh-mirror-reader",
        "ClusterRole/cnimesh-mirror-reader",
        "Secret/cnimesh-multicluster/cnimesh-mirror-reader-token",
        "ServiceAccount/cnimesh/cnimesh-mirror",
        "ClusterRole/cnimesh-mirror",
        "Role/cnimesh/cnimesh-mirror",
        "Deployment/cnimesh/cnimesh-mirror",
    ] {
        assert!(kinds.contains(&want.to_string()), "{want} missing from {kinds:#?}");
    }
    let deployment = docs.iter().find(|d| d["kind"] == "Deployment").unwrap();
    let containers = deployment["spec"]["template"]["spec"]["containers"].as_array().unwrap();
    assert_eq!(containers.len(), 1, "the proxy is the gateway's only container");
    let env: Vec<(&str, &str)> = containers[0]["env"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| Some((e["name"].as_str()?, e["value"].as_str()?)))
        .collect();
    let var = |n: &str| env.iter().find(|(k, _)| *k == n).map(|(_, v)| *v).unwrap_or_else(|| panic!("no {n}"));
    assert_eq!(var("CNIMESH_PROXY_MODE"), "gateway");
    assert_eq!(
        var("CNIMESH_PROXY_IDENTITY_NAME"),
        "cnimesh-gateway.cnimesh-multicluster.serviceaccount.identity.cnimesh.west.local"
    );
    assert_eq!(var("CNIMESH_PROXY_IDENTITY_TRUST_ANCHORS_PEM"), anchor.cert_pem);
    assert_eq!(
        var("CNIMESH_PROXY_IDENTITY_SVC_NAME"),
        "cnimesh-control.cnimesh.serviceaccount.identity.cnimesh.west.local"
    );
    assert_eq!(containers[0]["image"], "ghcr.io/cnimesh/cnimesh-proxy:test");
    let service = docs.iter().find(|d| d["kind"] == "Service").unwrap();
    assert_eq!(service["spec"]["type"], "LoadBalancer");
    let ports: Vec<(String, i64)> = service["spec"]["ports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p["name"].as_str().unwrap().to_string(), p["port"].as_i64().unwrap()))
        .collect();
    assert_eq!(ports, [("mc-gateway".to_string(), 4143), ("mc-probe".to_string(), 4191)]);
    for doc in &docs {
        assert_eq!(
            doc["metadata"]["labels"]["app.kubernetes.io/part-of"],
            "cnimesh-multicluster",
            "{}",
            yaml::describe(doc)
        );
    }
    let reader =
        docs.iter().find(|d| d["kind"] == "ClusterRole" && d["metadata"]["name"] == "cnimesh-mirror-reader").unwrap();
    let verbs: Vec<&Value> =
        reader["rules"].as_array().unwrap().iter().flat_map(|r| r["verbs"].as_array().unwrap()).collect();
    assert!(
        verbs.iter().all(|v| ["get", "list", "watch"].contains(&v.as_str().unwrap())),
        "the reader only reads: {verbs:?}"
    );
}

#[test]
fn install_refuses_anchors_without_a_certificate_and_a_bad_trust_domain_by_name() {
    let e = render_install(&install_args(), "not a pem", "west.local").unwrap_err();
    assert!(format!("{e:#}").contains("trust anchors"), "{e:#}");
    let anchor = new_trust_anchor("west.local", DAY).unwrap();
    let e = render_install(&install_args(), &anchor.cert_pem, "bad domain!").unwrap_err();
    assert!(e.to_string().contains("bad domain!"), "{e}");
}

/// The gateway's `CNIMESH_PROXY_TRACE_COLLECTOR` in what `install` renders with `args`.
fn gateway_collector(args: &InstallArgs) -> anyhow::Result<Option<String>> {
    let anchor = new_trust_anchor("west.local", DAY).unwrap();
    let docs = render_install(args, &anchor.cert_pem, "west.local")?;
    let gateway =
        docs.iter().find(|d| d["kind"] == "Deployment" && d["metadata"]["name"] == "cnimesh-gateway").unwrap();
    let env = gateway["spec"]["template"]["spec"]["containers"][0]["env"].as_array().unwrap();
    Ok(env.iter().find(|e| e["name"] == "CNIMESH_PROXY_TRACE_COLLECTOR").map(|e| e["value"].as_str().unwrap().into()))
}

#[test]
fn install_gives_the_gateway_the_span_collector_of_the_control_plane_or_the_one_given_and_none_when_off() {
    assert_eq!(gateway_collector(&install_args()).unwrap(), None, "no tracing by default");
    let with = |collector: &str| InstallArgs { trace_collector: Some(collector.into()), ..install_args() };
    assert_eq!(gateway_collector(&with("otel.tracing:4317")).unwrap().as_deref(), Some("otel.tracing:4317"));
    assert_eq!(gateway_collector(&with("off")).unwrap(), None);
    let e = gateway_collector(&with("http://bad host:4317")).unwrap_err();
    assert!(e.to_string().contains("--trace-collector") && e.to_string().contains("bad host"), "{e}");

    // Where `install` takes the default from: the control plane's Deployment, flag or environment.
    let control = |container: Value| -> k8s_openapi::api::apps::v1::Deployment {
        serde_json::from_value(json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "cnimesh-control", "namespace": "cnimesh"},
            "spec": {"selector": {}, "template": {"spec": {"containers": [container]}}}}))
        .unwrap()
    };
    let collector_of = |container| super::target::proxy_trace_collector_of(&control(container));
    let flag =
        json!({"name": "cnimesh-control", "args": ["serve", "--proxy-trace-collector=http://otel.tracing:4317"]});
    assert_eq!(collector_of(flag).as_deref(), Some("http://otel.tracing:4317"));
    let env = json!({"name": "cnimesh-control", "env": [{"name": "CNIMESH_CONTROL_PROXY_TRACE_COLLECTOR", "value": "otel:4317"}]});
    assert_eq!(collector_of(env).as_deref(), Some("otel:4317"));
    assert_eq!(
        collector_of(json!({"name": "cnimesh-control", "args": ["serve", "--trust-domain", "west.local"]})),
        None
    );
}

#[test]
fn a_collector_read_from_the_control_planes_deployment_cannot_smuggle_env_or_yaml_into_the_gateway() {
    // What whoever edits the control plane's Deployment could put there: a second variable after
    // a newline, YAML, a `$(VAR)` reference the kubelet would expand, a URL with a path or user.
    for smuggled in [
        "otel:4317\n- name: CNIMESH_PROXY_IDENTITY_NAME\n  value: admin",
        "otel:4317\"}, {\"name\": \"X\", \"value\": \"y",
        "$(CNIMESH_PROXY_IDENTITY_TRUST_ANCHORS_PEM):4317",
        "http://user@otel:4317",
        "http://otel:4317/v1/traces?x=1",
    ] {
        let control =
            json!({"name": "cnimesh-control", "args": ["serve", format!("--proxy-trace-collector={smuggled}")]});
        let deployment: k8s_openapi::api::apps::v1::Deployment = serde_json::from_value(json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "cnimesh-control", "namespace": "cnimesh"},
            "spec": {"selector": {}, "template": {"spec": {"containers": [control]}}}}))
        .unwrap();
        let collector = super::target::proxy_trace_collector_of(&deployment);
        assert_eq!(collector.as_deref(), Some(smuggled), "read as it stands");
        let args = InstallArgs { trace_collector: collector, ..install_args() };
        let e = gateway_collector(&args).expect_err(smuggled);
        assert!(e.to_string().contains("--trace-collector"), "{e}");
    }
}

const DEPLOYMENT: &str = "/apis/apps/v1/namespaces/cnimesh/deployments/cnimesh-control";
const GATEWAY_SERVICE: &str = "/api/v1/namespaces/cnimesh-multicluster/services/cnimesh-gateway";
const TOKEN_SECRET: &str = "/api/v1/namespaces/cnimesh-multicluster/secrets/cnimesh-mirror-reader-token";

/// Cluster B as `link` reads it: a control plane with --trust-domain west.local, a gateway
/// Service with a LoadBalancer address, the reader's token.
fn cluster_b() -> MockApi {
    let mut mock = MockApi::default();
    mock.get(
        DEPLOYMENT,
        json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "cnimesh-control", "namespace": "cnimesh"},
               "spec": {"selector": {}, "template": {"spec": {"containers": [
                   {"name": "cnimesh-control", "args": ["serve", "--trust-domain", "west.local"]}]}}}}),
    );
    mock.get(
        GATEWAY_SERVICE,
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "cnimesh-gateway", "namespace": "cnimesh-multicluster"},
               "spec": {"type": "LoadBalancer", "ports": [{"name": "mc-gateway", "port": 4143}, {"name": "mc-probe", "port": 4191}]},
               "status": {"loadBalancer": {"ingress": [{"ip": "203.0.113.7"}]}}}),
    );
    mock.get(
        TOKEN_SECRET,
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "cnimesh-mirror-reader-token", "namespace": "cnimesh-multicluster"},
               "type": "kubernetes.io/service-account-token",
               "data": {"token": b64(b"reader-token"), "ca.crt": b64(api_ca().cert_pem.as_bytes())}}),
    );
    mock
}

fn decoded_kubeconfig(secret: &Value) -> Value {
    let data = secret["data"]["kubeconfig"].as_str().unwrap();
    let text = String::from_utf8(base64::engine::general_purpose::STANDARD.decode(data).unwrap()).unwrap();
    yaml::documents(&text, "kubeconfig").unwrap().remove(0)
}

#[tokio::test]
async fn link_against_a_cluster_prints_the_link_and_a_kubeconfig_for_the_mirror_reader() {
    let client = cluster_b().client();
    let target = kube_target(&client, &link_args("west"), "https://api.west.example:6443".into()).await.unwrap();
    let docs = yaml::documents(&yaml::render(&render(&target).unwrap()), "output").unwrap();
    let (secret, link) = (&docs[0], &docs[1]);
    assert_eq!(
        (secret["kind"].as_str(), secret["metadata"]["name"].as_str()),
        (Some("Secret"), Some("cluster-credentials-west"))
    );
    assert_eq!(secret["type"], "mirror.cnimesh.io/remote-kubeconfig");
    assert_eq!(secret["metadata"]["namespace"], "cnimesh");
    assert_eq!(link["apiVersion"], "multicluster.cnimesh.io/v1alpha1");
    assert_eq!(link["metadata"]["name"], "west");
    let spec = &link["spec"];
    assert_eq!(spec["targetClusterName"], "west");
    assert_eq!(spec["targetTrustDomain"], "west.local");
    assert_eq!(spec["targetClusterDomain"], "cluster.local");
    assert_eq!(spec["clusterCredentialsSecret"], "cluster-credentials-west");
    assert_eq!(spec["gatewayAddress"], "203.0.113.7");
    assert_eq!(spec["gatewayPort"], 4143);
    assert_eq!(
        spec["gatewayIdentity"],
        "cnimesh-gateway.cnimesh-multicluster.serviceaccount.identity.cnimesh.west.local"
    );
    let config = decoded_kubeconfig(secret);
    assert_eq!(config["clusters"][0]["cluster"]["server"], "https://api.west.example:6443");
    assert!(config["clusters"][0]["cluster"]["certificate-authority-data"].is_string());
    assert_eq!(config["users"][0]["name"], "cnimesh-mirror-reader");
    assert_eq!(config["users"][0]["user"]["token"], "reader-token");
    // The Link parses as the mirror controller's type.
    let _: cnimesh_mirror::crd::Link = serde_json::from_value(link.clone()).unwrap();
}

#[tokio::test]
async fn link_without_a_gateway_address_names_the_flag_that_gives_one() {
    let mut mock = cluster_b();
    mock.json_mut(GATEWAY_SERVICE)["status"] = json!({});
    let e = kube_target(&mock.client(), &link_args("west"), "https://api:6443".into()).await.unwrap_err();
    assert!(e.to_string().contains("--gateway-address"), "{e}");
    let mut args = link_args("west");
    args.gateway_address = Some("198.51.100.1".into());
    let target = kube_target(&mock.client(), &args, "https://api:6443".into()).await.unwrap();
    assert_eq!(target.gateway, Some(("198.51.100.1".into(), 4143)));
    mock.remove(GATEWAY_SERVICE);
    let e = kube_target(&mock.client(), &link_args("west"), "https://api:6443".into()).await.unwrap_err();
    assert!(e.to_string().contains("cnimesh multicluster install"), "{e}");
    let e = kube_target(&cluster_b().client(), &link_args("west"), "api:6443".into()).await.unwrap_err();
    assert!(e.to_string().contains("\"api:6443\""), "{e}");
}

#[test]
fn a_bad_cluster_name_is_refused_by_name() {
    for bad in ["West", "-a", "a_b", ""] {
        let e = super::check_cluster_name(bad).unwrap_err();
        assert!(e.contains(&format!("{bad:?}")), "{e}");
    }
}

/// A cluster (the in-process API server, served on loopback so a Link's kubeconfig reaches it)
/// with its trust anchors, and what `multicluster install` leaves for `link` to read: the control
/// plane's Deployment (`trust_domain`), the gateway Service (`gateway`, `ip:port`, as its load
/// balancer's address) and the mirror reader's token.
async fn cluster(trust_domain: &str, gateway: Option<&str>, anchor: &CaPem) -> (Arc<ClusterApi>, Served) {
    let api = ClusterApi::new();
    let served = api.serve().await;
    api.put(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cnimesh-identity-trust-anchors", "namespace": "cnimesh"},
        "data": {"ca.crt": anchor.cert_pem}}));
    api.put(json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "cnimesh-control", "namespace": "cnimesh"},
        "spec": {"selector": {}, "template": {"spec": {"containers": [
            {"name": "cnimesh-control", "args": ["serve", "--trust-domain", trust_domain]}]}}}}));
    if let Some(gateway) = gateway {
        let (ip, port) = gateway.rsplit_once(':').unwrap();
        api.put(json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "cnimesh-gateway", "namespace": "cnimesh-multicluster"},
            "spec": {"type": "LoadBalancer", "ports": [{"name": "mc-gateway", "port": port.parse::<u16>().unwrap()}]},
            "status": {"loadBalancer": {"ingress": [{"ip": ip}]}}}));
    }
    api.put(json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "cnimesh-mirror-reader-token", "namespace": "cnimesh-multicluster"},
        "type": "kubernetes.io/service-account-token",
        "data": {"token": b64(b"reader-token"), "ca.crt": b64(served.ca_pem.as_bytes())}}));
    (api, served)
}

/// `link` run against B (its gateway from `--gateway-address` when it has no Service), its
/// Secret and Link applied to A.
async fn linked(a: &ClusterApi, b: &(Arc<ClusterApi>, Served), name: &str) -> Target {
    let mut args = link_args(name);
    if b.0.get("v1", "Service", "cnimesh-multicluster", "cnimesh-gateway").is_none() {
        (args.gateway_address, args.gateway_port) = (Some("127.0.0.1".into()), Some(9));
    }
    let target = kube_target(&b.0.client(), &args, b.1.server()).await.unwrap();
    for doc in render(&target).unwrap() {
        a.put(doc);
    }
    target
}

/// A gateway stand-in: TLS 1.3 on loopback with a certificate for `identity` from `issuer`
/// (chain leaf + issuer), no client authentication. Returns its port.
async fn gateway(issuer: &CaPem, identity: &str) -> u16 {
    let signer = Signer::new(issuer).unwrap();
    let name = cnimesh_identity::Name::parse(identity).unwrap();
    let (key, _) = new_csr(&name).unwrap();
    let now = SystemTime::now();
    let leaf = signer.sign(&name, &key, now - Duration::from_secs(60), now + DAY).unwrap();
    let mut chain = vec![leaf];
    chain.extend(cnimesh_identity::pem::certs(issuer.cert_pem.as_bytes(), "issuer").unwrap());
    let key = rustls_pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into());
    let config = rustls::ServerConfig::builder_with_provider(cnimesh_identity::tls::provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let _ = acceptor.accept(tcp).await;
            });
        }
    });
    port
}

fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_seconds(t).to_string()
}

/// The Link's status, as the mirror controller writes it.
fn write_status(a: &ClusterApi, name: &str, status: &LinkStatus) {
    let mut link = a.get("multicluster.cnimesh.io/v1alpha1", "Link", "cnimesh", name).unwrap();
    link["status"] = serde_json::to_value(status).unwrap();
    a.put(link);
}

fn up_status(now: SystemTime) -> LinkStatus {
    LinkStatus {
        state: Some(LinkState::Up),
        reason: None,
        last_sync: Some(rfc3339(now - Duration::from_secs(2))),
        last_heartbeat: Some(rfc3339(now - Duration::from_secs(1))),
        gateway: Some(GatewayStatus {
            alive: true,
            latency_ms: Some(1.5),
            last_probe: Some(rfc3339(now)),
            error: None,
        }),
        mirrors: vec![MirrorStatus {
            mirror: "demo/web-west".into(),
            remote: "demo/web".into(),
            mode: "gateway".into(),
            endpoints: 1,
            last_sync: Some(rfc3339(now)),
        }],
        collisions: Vec::new(),
        cluster_name_conflicts: Vec::new(),
    }
}

fn find<'a>(checks: &'a [super::super::check::Check], name: &str) -> &'a super::super::check::Check {
    checks.iter().find(|c| c.name == name).unwrap_or_else(|| panic!("no check {name}: {}", render_table(checks)))
}

#[tokio::test]
async fn check_of_a_healthy_link_passes_every_check_and_gateways_lists_it() {
    let anchor = new_trust_anchor("cluster.local", DAY).unwrap();
    let west_issuer = new_issuer(&anchor, "west.local", DAY).unwrap();
    let identity = super::gateway_identity("west.local");
    let port = gateway(&west_issuer, &identity).await;
    let (a, _a_served) = cluster("cluster.local", None, &anchor).await;
    let b = cluster("west.local", Some(&format!("127.0.0.1:{port}")), &anchor).await;
    linked(&a, &b, "west").await;
    let now = SystemTime::now();
    write_status(&a, "west", &up_status(now));
    let source = Source::Cluster(a.client());
    let checks = run(&source, now).await;
    let table = render_table(&checks);
    assert!(checks.iter().all(|c| c.status == Status::Ok), "{table}");
    for name in [
        "link is valid",
        "credentials",
        "remote API",
        "gateway reachable",
        "gateway certificate",
        "linked issuer constrained",
        "trust anchors match",
        "link status",
        "mirrors",
        "mirror names",
    ] {
        find(&checks, name);
    }
    assert!(table.contains("demo/web-west <- demo/web [gateway] 1 endpoints"), "{table}");
    // A mirror name another Link's export claims too: check fails, naming both.
    let mut contested = up_status(now);
    contested.collisions = vec![MirrorCollision {
        mirror: "demo/web-us-west".into(),
        remote: "demo/web-us".into(),
        holder: false,
        with: vec!["us-west's demo/web".into()],
    }];
    write_status(&a, "west", &contested);
    let failed = run(&source, now).await;
    let names = find(&failed, "mirror names");
    assert_eq!(names.status, Status::Fail, "{}", render_table(&failed));
    let text = render_table(&failed);
    assert!(
        text.contains("demo/web-us-west <- demo/web-us (refused to this link)") && text.contains("us-west's demo/web"),
        "{text}"
    );
    write_status(&a, "west", &up_status(now));
    let rows = rows(&source).await.unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!((rows[0].alive, rows[0].latency_ms, rows[0].mirrored_services), (Some(true), Some(1.5), 1));
    let text = gateways_table(&rows);
    assert!(text.starts_with("CLUSTER"), "{text}");
    assert!(text.contains(&format!("west     127.0.0.1:{port}  up    yes    1.5ms    1")), "{text}");
}

#[tokio::test]
async fn a_gateway_with_a_certificate_from_another_anchor_is_named_with_that_reason() {
    let anchor = new_trust_anchor("cluster.local", DAY).unwrap();
    let other_anchor = new_trust_anchor("west.local", DAY).unwrap();
    let foreign_issuer = new_issuer(&other_anchor, "west.local", DAY).unwrap();
    let identity = super::gateway_identity("west.local");
    let port = gateway(&foreign_issuer, &identity).await;
    let (a, _a_served) = cluster("cluster.local", None, &anchor).await;
    let b = cluster("west.local", Some(&format!("127.0.0.1:{port}")), &other_anchor).await;
    linked(&a, &b, "west").await;
    let now = SystemTime::now();
    write_status(&a, "west", &up_status(now));
    let checks = run(&Source::Cluster(a.client()), now).await;
    let cert = find(&checks, "gateway certificate");
    assert_eq!(cert.status, Status::Fail, "{}", render_table(&checks));
    assert!(cert.message.contains("does not chain to this cluster's trust anchors"), "{}", cert.message);
    assert!(cert.message.contains("root.cnimesh.west.local"), "names the other anchor: {}", cert.message);
    let anchors = find(&checks, "trust anchors match");
    assert_eq!(anchors.status, Status::Fail);
    assert!(anchors.message.contains("no common anchor"), "{}", anchors.message);
    // A gateway with the right anchor but another identity is named too.
    let shared = new_issuer(&anchor, "west.local", DAY).unwrap();
    let port = gateway(&shared, &super::gateway_identity("north.local")).await;
    let chain_check = super::probe::probe("127.0.0.1", port, &identity).await.unwrap();
    let e = super::probe::judge(&chain_check.chain, &anchor.cert_pem, &identity).unwrap_err();
    assert!(e.contains("north.local") && e.contains("not the Link's gatewayIdentity"), "{e}");
}

#[test]
fn link_liveness_is_the_heartbeat_not_the_last_change() {
    use super::super::check::Check;
    let now = SystemTime::now();
    let judge = |status: &LinkStatus| -> Check {
        let mut checks = Vec::new();
        super::check::freshness(Some(status), now, &Category::Link("west".to_string()), &mut checks);
        checks.into_iter().find(|c| c.name == "link status").unwrap()
    };
    let heartbeat = cnimesh_mirror::crd::HEARTBEAT_STALE_AFTER;

    // Healthy and idle: the remote last changed an hour ago, the heartbeat is fresh.
    let mut idle = up_status(now);
    idle.last_sync = Some(rfc3339(now - Duration::from_secs(3600)));
    idle.last_heartbeat = Some(rfc3339(now - heartbeat + Duration::from_secs(1)));
    let check = judge(&idle);
    assert_eq!(check.status, Status::Ok, "{}", check.message);
    assert!(check.message.starts_with("up: heartbeat"), "{}", check.message);

    // The mirror controller died: its last heartbeat goes past the bound, however recent the last change.
    let mut dead = up_status(now);
    dead.last_heartbeat = Some(rfc3339(now - heartbeat - Duration::from_secs(1)));
    let check = judge(&dead);
    assert_eq!(check.status, Status::Fail, "{}", check.message);
    assert!(check.message.contains("no heartbeat from the mirror controller"), "{}", check.message);
    assert!(!check.hint.unwrap().contains("is the control plane"), "the hint names the mirror controller");

    // A control plane that writes no heartbeat: neither green nor a false red.
    let mut old = up_status(now);
    old.last_heartbeat = None;
    assert_eq!(judge(&old).status, Status::Warn);
}

#[tokio::test]
async fn a_lost_stale_or_missing_status_and_an_unreachable_gateway_fail_with_their_reasons() {
    let anchor = new_trust_anchor("cluster.local", DAY).unwrap();
    // Nothing listens on the gateway's port.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let (a, _a_served) = cluster("cluster.local", None, &anchor).await;
    let b = cluster("west.local", Some(&format!("127.0.0.1:{closed}")), &anchor).await;
    linked(&a, &b, "west").await;
    let now = SystemTime::now();
    let source = Source::Cluster(a.client());
    let checks = run(&source, now).await;
    assert_eq!(find(&checks, "gateway reachable").status, Status::Fail);
    assert_eq!(find(&checks, "gateway certificate").status, Status::Skip);
    let status = find(&checks, "link status");
    assert!(status.status == Status::Fail && status.message.contains("no status yet"), "{}", status.message);

    let mut lost = up_status(now);
    lost.state = Some(LinkState::Lost);
    lost.reason = Some("the target's API is unreachable: connection refused".into());
    write_status(&a, "west", &lost);
    let checks = run(&source, now).await;
    let status = find(&checks, "link status");
    assert!(
        status.status == Status::Fail && status.message.contains("lost: the target's API is unreachable"),
        "{}",
        status.message
    );
    let mirrors = find(&checks, "mirrors");
    assert!(
        mirrors.status == Status::Fail && mirrors.message.contains("keep the endpoints last seen"),
        "{}",
        mirrors.message
    );

    let stale = up_status(now - Duration::from_secs(600));
    write_status(&a, "west", &stale);
    let checks = run(&source, now).await;
    let status = find(&checks, "link status");
    assert!(status.status == Status::Fail && status.message.starts_with("stale"), "{}", status.message);
    let hint = status.hint.clone().unwrap_or_default();
    assert!(hint.contains("mirror controller") && hint.contains("cnimesh-control-mirror-write"), "{hint}");

    // B's API server gone: the remote API is named.
    drop(b);
    let checks = run(&source, now).await;
    let remote = find(&checks, "remote API");
    assert!(remote.status == Status::Fail && remote.message.contains("unreachable"), "{}", remote.message);
}

const LINKS: &str = "/apis/multicluster.cnimesh.io/v1alpha1/namespaces/cnimesh/links";
const ANCHORS_CM: &str = "/api/v1/namespaces/cnimesh/configmaps/cnimesh-identity-trust-anchors";

/// An API server's CA, as a cluster's token Secrets carry it.
fn api_ca() -> CaPem {
    cnimesh_identity::ca::new_private_ca("kube-apiserver", DAY).unwrap()
}

/// A remote API server (HTTPS on 127.0.0.1, its certificate from `ca`) that refuses every request
/// with 401, as one does for a revoked token.
async fn refusing_api(ca: &CaPem) -> u16 {
    let leaf = Signer::new(ca).unwrap().new_server_cert(&["127.0.0.1".into()], DAY).unwrap();
    let chain = cnimesh_identity::pem::certs(leaf.cert_pem.as_bytes(), "leaf").unwrap();
    let key = cnimesh_identity::pem::key(leaf.key_pem.as_bytes(), "key").unwrap();
    let config = rustls::ServerConfig::builder_with_provider(cnimesh_identity::tls::provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(tcp).await else { return };
                let mut buf = [0u8; 4096];
                let _ = tls.read(&mut buf).await;
                let body = r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"Unauthorized","reason":"Unauthorized","code":401}"#;
                let reply = format!(
                    "HTTP/1.1 401 Unauthorized\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = tls.write_all(reply.as_bytes()).await;
                let _ = tls.shutdown().await;
            });
        }
    });
    port
}

fn cluster_a(anchor: &CaPem, links: Vec<Value>, secrets: Vec<(String, Value)>) -> MockApi {
    let mut mock = MockApi::default();
    mock.get(LINKS, json!({"apiVersion": "multicluster.cnimesh.io/v1alpha1", "kind": "LinkList", "metadata": {"resourceVersion": "1"}, "items": links}));
    mock.get(ANCHORS_CM, json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cnimesh-identity-trust-anchors", "namespace": "cnimesh"}, "data": {"ca.crt": anchor.cert_pem}}));
    for (name, secret) in secrets {
        mock.get(&format!("/api/v1/namespaces/cnimesh/secrets/{name}"), secret);
    }
    mock
}

#[tokio::test]
async fn check_against_a_cluster_names_refused_credentials_a_file_server_and_a_missing_secret() {
    let anchor = new_trust_anchor("cluster.local", DAY).unwrap();
    let ca = api_ca();
    let port = refusing_api(&ca).await;
    let target = |name: &str, server: String| Target {
        cluster_name: name.into(),
        cluster_domain: "cluster.local".into(),
        trust_domain: "west.local".into(),
        gateway: None,
        server,
        ca_pem: Some(ca.cert_pem.clone().into_bytes()),
        token: Some("revoked".into()),
    };
    let mut links = Vec::new();
    let mut secrets = Vec::new();
    for (name, server) in [
        ("west", format!("https://127.0.0.1:{port}")),
        ("files", "file:///etc".to_string()),
        ("gone", "https://x".into()),
    ] {
        let docs = render(&target(name, server)).unwrap();
        if name != "gone" {
            secrets.push((format!("cluster-credentials-{name}"), docs[0].clone()));
        }
        let mut link = docs[1].clone();
        link["status"] = serde_json::to_value(up_status(SystemTime::now())).unwrap();
        links.push(link);
    }
    let mock = cluster_a(&anchor, links, secrets);
    let checks = run(&Source::Cluster(mock.client()), SystemTime::now()).await;
    let table = render_table(&checks);
    let of = |link: &str, name: &str| {
        checks
            .iter()
            .find(|c| c.category == Category::Link(link.to_string()) && c.name == name)
            .unwrap_or_else(|| panic!("link {link}/{name}: {table}"))
            .clone()
    };
    let west = of("west", "remote API");
    assert!(west.status == Status::Fail && west.message.contains("credentials were refused (401"), "{table}");
    let files = of("files", "credentials");
    assert!(files.status == Status::Fail && files.message.contains("file:///etc: not an API server"), "{table}");
    let gone = of("gone", "credentials");
    assert!(gone.status == Status::Fail && gone.message.contains("cluster-credentials-gone does not exist"), "{table}");
    assert_eq!(of("gone", "remote API").status, Status::Skip);
    assert_eq!(of("west", "gateway").status, Status::Ok, "no gateway: remote discovery only");
    assert_eq!(of("west", "link status").status, Status::Ok, "{table}");
}

#[tokio::test]
async fn check_with_no_links_warns_and_an_invalid_link_is_refused_by_name() {
    let anchor = new_trust_anchor("cluster.local", DAY).unwrap();
    let checks = run(&Source::Cluster(cluster_a(&anchor, vec![], vec![]).client()), SystemTime::now()).await;
    assert_eq!(find(&checks, "links").status, Status::Warn);
    let mut link = render(&Target {
        cluster_name: "west".into(),
        cluster_domain: "cluster.local".into(),
        trust_domain: "west.local".into(),
        gateway: Some(("10.0.0.1".into(), 4143)),
        server: "https://x".into(),
        ca_pem: Some(api_ca().cert_pem.into_bytes()),
        token: Some("t".into()),
    })
    .unwrap()[1]
        .clone();
    link["spec"]["gatewayPort"] = json!(0);
    let checks = run(&Source::Cluster(cluster_a(&anchor, vec![link], vec![]).client()), SystemTime::now()).await;
    let valid = find(&checks, "link is valid");
    assert!(valid.status == Status::Fail && valid.message.contains("gatewayPort is 0"), "{}", valid.message);
}

#[test]
fn unlink_against_a_cluster_prints_the_link_its_secret_and_the_mirrors_role_for_it_for_kubectl_delete() {
    let text = super::link::unlink_main(&super::link::UnlinkArgs { cluster_name: "west".into() }).unwrap();
    let docs = yaml::documents(&text, "unlink").unwrap();
    let described: Vec<String> = docs.iter().map(yaml::describe).collect();
    assert_eq!(
        described,
        [
            "Link/cnimesh/west",
            "Secret/cnimesh/cluster-credentials-west",
            "Role/cnimesh/cluster-credentials-west",
            "RoleBinding/cnimesh/cluster-credentials-west"
        ]
    );
}

#[tokio::test]
async fn link_writes_only_credentials_the_control_plane_accepts_and_refuses_a_plaintext_server() {
    let client = cluster_b().client();
    let error = kube_target(&client, &link_args("west"), "http://api.west.example:8080".into()).await.unwrap_err();
    assert!(error.to_string().contains("https://"), "{error}");
    let mut target = kube_target(&client, &link_args("west"), "https://api.west.example:6443".into()).await.unwrap();
    let secret = &render(&target).unwrap()[0];
    let text = serde_json::to_string(&decoded_kubeconfig(secret)).unwrap();
    let parsed = cnimesh_mirror::kubeconfig::parse(&text).unwrap();
    assert!(matches!(parsed, cnimesh_mirror::kubeconfig::LinkKubeconfig::Api(_)));
    target.ca_pem = None;
    let error = render(&target).unwrap_err();
    assert!(error.to_string().contains("certificate-authority-data"), "{error}");
}

#[tokio::test]
async fn check_refuses_credentials_that_run_a_command_or_read_a_file_by_the_fields_name() {
    let anchor = new_trust_anchor("cluster.local", DAY).unwrap();
    let ca = b64(api_ca().cert_pem.as_bytes());
    let mut links = Vec::new();
    let mut secrets = Vec::new();
    for (name, user, field) in [
        ("exec", json!({"exec": {"command": "/bin/sh", "args": ["-c", "exit 1"]}}), "users[0].user.exec"),
        ("file", json!({"tokenFile": "/etc/shadow"}), "users[0].user.tokenFile"),
    ] {
        let kubeconfig = json!({"clusters": [{"name": name, "cluster": {"server": "https://127.0.0.1:1", "certificate-authority-data": ca}}],
            "users": [{"name": "u", "user": user}]});
        let docs = render(&Target {
            cluster_name: name.into(),
            cluster_domain: "cluster.local".into(),
            trust_domain: "west.local".into(),
            gateway: None,
            server: "file:///etc".into(),
            ca_pem: None,
            token: None,
        })
        .unwrap();
        let mut secret = docs[0].clone();
        secret["data"]["kubeconfig"] = b64(kubeconfig.to_string().as_bytes());
        secrets.push((format!("cluster-credentials-{name}"), secret));
        links.push((docs[1].clone(), field));
    }
    let fields: Vec<(String, &str)> =
        links.iter().map(|(l, f)| (l["metadata"]["name"].as_str().unwrap().to_string(), *f)).collect();
    let mock = cluster_a(&anchor, links.into_iter().map(|(l, _)| l).collect(), secrets);
    let checks = run(&Source::Cluster(mock.client()), SystemTime::now()).await;
    for (name, field) in fields {
        let check = checks
            .iter()
            .find(|c| c.category == Category::Link(name.clone()) && c.name == "credentials")
            .unwrap_or_else(|| panic!("{name}: {}", render_table(&checks)));
        assert!(check.status == Status::Fail && check.message.contains(field), "{name}: {}", check.message);
    }
}

#[tokio::test]
async fn check_fails_on_two_links_whose_cluster_names_overlap_naming_both() {
    let anchor = new_trust_anchor("cluster.local", DAY).unwrap();
    let (a, _a_served) = cluster("cluster.local", None, &anchor).await;
    let b = cluster("west.local", None, &anchor).await;
    linked(&a, &b, "west").await;
    let checks = run(&Source::Cluster(a.client()), SystemTime::now()).await;
    assert_eq!(find(&checks, "cluster names").status, Status::Ok, "{}", render_table(&checks));
    linked(&a, &b, "us-west").await;
    let checks = run(&Source::Cluster(a.client()), SystemTime::now()).await;
    let text = render_table(&checks);
    assert_eq!(find(&checks, "cluster names").status, Status::Fail, "{text}");
    // Neither has a creationTimestamp here: by name, us-west is the earlier one.
    assert!(text.contains("Link west is refused: its cluster name overlaps Link us-west's (\"us-west\")"), "{text}");
}
