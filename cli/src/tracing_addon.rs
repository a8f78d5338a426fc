//! `cnimesh tracing install`: the tracing add-on on stdout, for `kubectl apply -f -`:
//! namespace `cnimesh-tracing`, an OpenTelemetry Collector (OTLP/gRPC 4317 and OTLP/HTTP 4318 in,
//! OTLP out to Jaeger) and Jaeger v2 (in-memory store, UI on 16686). The objects are those of
//! `daemonset/tracing/tracing.yaml`, with the images and the cluster domain filled in and the
//! `app.kubernetes.io/*` labels added (`part-of: cnimesh-tracing`, so that `cnimesh prune`, which
//! looks for `part-of: cnimesh`, never offers to delete the add-on).
//!
//! The module is not called `tracing`: inside this crate that name is the logging library's.
//!
//! Layer: runtime (operator CLI), beside install.

use anyhow::Context;
use serde_json::{Value, json};

use super::install::labels;
use super::yaml;

pub const FILE: (&str, &str) = ("daemonset/tracing/tracing.yaml", include_str!("../../daemonset/tracing/tracing.yaml"));
pub const NAMESPACE: &str = "cnimesh-tracing";
pub const COLLECTOR: &str = "otel-collector";
pub const JAEGER: &str = "jaeger";
/// OTLP/gRPC, where proxies and the control plane export.
pub const OTLP_GRPC_PORT: u16 = 4317;
pub const JAEGER_UI_PORT: u16 = 16686;
/// The images the file names (Docker Hub), as `<registry>/<name>:<tag>`.
pub const COLLECTOR_IMAGE: &str = "otel/opentelemetry-collector:0.160.0";
pub const JAEGER_IMAGE: &str = "jaegertracing/jaeger:2.21.0";

#[derive(Debug, clap::Subcommand)]
pub enum TracingCommand {
    /// Print the tracing add-on (OpenTelemetry Collector + Jaeger in namespace cnimesh-tracing)
    /// for `kubectl apply -f -` (`| kubectl delete -f -` removes it), and on stderr the setting
    /// that sends the mesh's spans to it.
    Install(TracingInstallArgs),
}

#[derive(Debug, Clone, Default, clap::Args)]
pub struct TracingInstallArgs {
    /// The registry (and path) both images are pulled from instead of Docker Hub, e.g.
    /// registry.example.com/mirror (`<registry>/opentelemetry-collector:<tag>`, `<registry>/jaeger:<tag>`).
    #[arg(long, value_name = "REGISTRY")]
    pub registry: Option<String>,
    /// The collector's whole image reference; wins over --registry.
    #[arg(long, value_name = "IMAGE")]
    pub collector_image: Option<String>,
    /// Jaeger's whole image reference (a Jaeger v2 image); wins over --registry.
    #[arg(long, value_name = "IMAGE")]
    pub jaeger_image: Option<String>,
    /// The cluster's DNS domain, for the Services' names the mesh and the collector are given.
    #[arg(long, default_value = cnimesh_model::inject::DEFAULT_CLUSTER_DOMAIN)]
    pub cluster_domain: String,
}

/// The rendered add-on and what to tell the operator after it.
#[derive(Debug, Clone)]
pub struct Rendered {
    pub documents: Vec<Value>,
    /// `http://otel-collector.cnimesh-tracing.svc.<domain>:4317`
    pub collector_address: String,
}

impl Rendered {
    pub fn yaml(&self) -> String {
        yaml::render(&self.documents)
    }

    /// How to point the mesh at the collector: cluster-wide, per namespace, and the UI.
    pub fn next_steps(&self) -> String {
        let address = &self.collector_address;
        format!(
            "# Send every meshed pod's spans to the collector (the injector reads it; pods get it when next created):\n\
             #   cnimesh upgrade --set proxy.tracing.collector={address} | kubectl apply -f -\n\
             # or only a namespace's (or a pod's):\n\
             #   kubectl annotate namespace NAME config.cnimesh.io/trace-collector={address}\n\
             # Requests that carry no trace context are traced only with a sampling ratio, e.g.\n\
             #   --set proxy.tracing.sampling=0.05   or   config.cnimesh.io/trace-sampling=0.05\n\
             # Jaeger's UI: kubectl -n {NAMESPACE} port-forward svc/{JAEGER} {JAEGER_UI_PORT}  then http://localhost:{JAEGER_UI_PORT}\n"
        )
    }
}

pub fn main(command: TracingCommand, out: &mut impl std::io::Write) -> anyhow::Result<()> {
    match command {
        TracingCommand::Install(args) => {
            let rendered = render(&args)?;
            out.write_all(rendered.yaml().as_bytes())?;
            // stderr: stdout goes to kubectl, the operator still reads this.
            eprint!("{}", rendered.next_steps());
        }
    }
    Ok(())
}

/// The add-on's objects for these options.
pub fn render(args: &TracingInstallArgs) -> anyhow::Result<Rendered> {
    if let Some(registry) = &args.registry
        && (registry.is_empty() || registry.ends_with('/'))
    {
        anyhow::bail!("--registry {registry:?}: expected a registry and path without a trailing slash");
    }
    if args.cluster_domain.is_empty() || args.cluster_domain.starts_with('.') || args.cluster_domain.ends_with('.') {
        anyhow::bail!("--cluster-domain {:?}: expected a DNS domain such as cluster.local", args.cluster_domain);
    }
    let image = |given: &Option<String>, default: &str| match (given, &args.registry) {
        (Some(image), _) => image.clone(),
        (None, Some(registry)) => format!("{registry}/{}", default.rsplit('/').next().unwrap_or(default)),
        (None, None) => default.to_string(),
    };
    let images =
        [(COLLECTOR, image(&args.collector_image, COLLECTOR_IMAGE)), (JAEGER, image(&args.jaeger_image, JAEGER_IMAGE))];
    let domain = &args.cluster_domain;
    let jaeger_otlp = format!("{JAEGER}.{NAMESPACE}.svc.{domain}:{OTLP_GRPC_PORT}");
    let mut documents = yaml::documents(FILE.1, FILE.0).context("the shipped tracing manifest")?;
    for doc in &mut documents {
        let name = doc.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default().to_string();
        match doc.get("kind").and_then(Value::as_str) {
            Some("Deployment") => {
                let (_, image) =
                    images.iter().find(|(n, _)| *n == name).with_context(|| format!("an unknown Deployment {name}"))?;
                let container = doc
                    .pointer_mut("/spec/template/spec/containers/0")
                    .with_context(|| format!("the Deployment {name} has no container"))?;
                container["image"] = json!(image);
            }
            Some("ConfigMap") if name == COLLECTOR => {
                let config = doc["data"]["config.yaml"].as_str().context("the collector's config.yaml")?;
                let mut parsed: Value = serde_saphyr::from_str(config).context("the collector's config.yaml")?;
                parsed["exporters"]["otlp"]["endpoint"] = json!(jaeger_otlp);
                doc["data"]["config.yaml"] = json!(serde_saphyr::to_string(&parsed).context("the collector's config")?);
            }
            _ => {}
        }
    }
    labels::apply_as(&mut documents, NAMESPACE, component);
    Ok(Rendered {
        documents,
        collector_address: format!("http://{COLLECTOR}.{NAMESPACE}.svc.{domain}:{OTLP_GRPC_PORT}"),
    })
}

/// `collector`, `jaeger`, or `tracing` for the namespace.
fn component(doc: &Value) -> &'static str {
    let name = doc.pointer("/metadata/labels/app.kubernetes.io~1name").and_then(Value::as_str);
    match name {
        Some(COLLECTOR) => "collector",
        Some(JAEGER) => "jaeger",
        _ => "tracing",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn find<'a>(docs: &'a [Value], kind: &str, name: &str) -> &'a Value {
        docs.iter()
            .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("no {kind}/{name}"))
    }

    /// The output as kubectl would read it: parsed back from the printed YAML.
    fn printed(args: &TracingInstallArgs) -> (Vec<Value>, Rendered) {
        let rendered = render(args).unwrap();
        (yaml::documents(&rendered.yaml(), "output").unwrap(), rendered)
    }

    fn default_args() -> TracingInstallArgs {
        TracingInstallArgs { cluster_domain: "cluster.local".into(), ..Default::default() }
    }

    #[test]
    fn the_output_parses_and_every_object_carries_the_four_labels_of_the_add_on() {
        let (docs, _) = printed(&default_args());
        let kinds: Vec<String> = docs.iter().map(yaml::describe).collect();
        assert_eq!(
            kinds,
            [
                "Namespace/cnimesh-tracing",
                "ConfigMap/cnimesh-tracing/otel-collector",
                "Deployment/cnimesh-tracing/otel-collector",
                "Service/cnimesh-tracing/otel-collector",
                "Deployment/cnimesh-tracing/jaeger",
                "Service/cnimesh-tracing/jaeger",
            ]
        );
        for doc in &docs {
            let labels = &doc["metadata"]["labels"];
            assert_eq!(labels[labels::PART_OF], "cnimesh-tracing", "{}", yaml::describe(doc));
            assert_eq!(labels[labels::MANAGED_BY], "cnimesh");
            assert_eq!(labels[labels::VERSION], env!("CARGO_PKG_VERSION"));
            assert!(["tracing", "collector", "jaeger"].contains(&labels[labels::COMPONENT].as_str().unwrap()));
            assert_ne!(labels[labels::PART_OF], "cnimesh", "cnimesh prune would offer to delete it");
        }
        assert_eq!(find(&docs, "Namespace", NAMESPACE)["metadata"]["labels"]["cnimesh.io/inject"], "disabled");
    }

    #[test]
    fn both_workloads_run_as_non_root_with_requests_and_no_privilege() {
        let (docs, _) = printed(&default_args());
        for name in [COLLECTOR, JAEGER] {
            let pod = &find(&docs, "Deployment", name)["spec"]["template"]["spec"];
            assert_eq!(pod["securityContext"]["runAsNonRoot"], true, "{name}");
            let container = &pod["containers"][0];
            assert!(container["resources"]["requests"]["cpu"].is_string(), "{name}");
            assert!(container["resources"]["requests"]["memory"].is_string(), "{name}");
            assert!(container["resources"]["limits"]["memory"].is_string(), "{name}");
            assert_eq!(container["securityContext"]["allowPrivilegeEscalation"], false, "{name}");
            assert_eq!(container["securityContext"]["capabilities"]["drop"], json!(["ALL"]), "{name}");
        }
    }

    #[test]
    fn the_collector_exports_to_the_jaeger_service_and_the_printed_address_is_the_collectors_service() {
        let args = TracingInstallArgs { cluster_domain: "corp.internal".into(), ..Default::default() };
        let (docs, rendered) = printed(&args);
        let config = find(&docs, "ConfigMap", COLLECTOR)["data"]["config.yaml"].as_str().unwrap();
        let config: Value = serde_saphyr::from_str(config).unwrap();
        // Jaeger's Service, by name, namespace, domain and its OTLP/gRPC port.
        let jaeger = find(&docs, "Service", JAEGER);
        let port = jaeger["spec"]["ports"].as_array().unwrap().iter().find(|p| p["name"] == "otlp-grpc").unwrap();
        let expected = format!("{JAEGER}.{NAMESPACE}.svc.corp.internal:{}", port["port"]);
        assert_eq!(config["exporters"]["otlp"]["endpoint"], expected);
        assert_eq!(config["service"]["pipelines"]["traces"]["exporters"], json!(["otlp"]));
        assert_eq!(config["service"]["pipelines"]["traces"]["receivers"], json!(["otlp"]));
        // The Service selects Jaeger's pods, whose container serves that port.
        let jaeger_pod = &find(&docs, "Deployment", JAEGER)["spec"]["template"];
        assert_eq!(
            jaeger["spec"]["selector"]["app.kubernetes.io/name"],
            jaeger_pod["metadata"]["labels"]["app.kubernetes.io/name"]
        );
        let ports = jaeger_pod["spec"]["containers"][0]["ports"].as_array().unwrap();
        assert!(ports.iter().any(|p| p["name"] == port["targetPort"] && p["containerPort"] == port["port"]));
        assert!(ports.iter().any(|p| p["containerPort"] == JAEGER_UI_PORT));

        // The address printed for the mesh is the collector's Service and its OTLP/gRPC port,
        // which the collector's receiver listens on; and the injector accepts it.
        let collector = find(&docs, "Service", COLLECTOR);
        let grpc = collector["spec"]["ports"].as_array().unwrap().iter().find(|p| p["name"] == "otlp-grpc").unwrap();
        let service = format!(
            "http://{}.{}.svc.corp.internal:{}",
            collector["metadata"]["name"].as_str().unwrap(),
            collector["metadata"]["namespace"].as_str().unwrap(),
            grpc["port"]
        );
        assert_eq!(rendered.collector_address, service);
        assert_eq!(config["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"], format!("0.0.0.0:{}", grpc["port"]));
        cnimesh_model::inject::check_trace_collector(&rendered.collector_address).unwrap();
        let steps = rendered.next_steps();
        assert!(steps.contains(&format!("--set proxy.tracing.collector={service}")), "{steps}");
        assert!(steps.contains(&format!("config.cnimesh.io/trace-collector={service}")), "{steps}");
        // The line's --set is one the values accept.
        let mut overrides = crate::install::values::Overrides::default();
        overrides.set(&format!("proxy.tracing.collector={service}")).unwrap();
        assert_eq!(overrides.resolve().unwrap().proxy.tracing.collector.as_deref(), Some(service.as_str()));
    }

    #[test]
    fn registry_and_image_flags_replace_the_images() {
        let image_of = |docs: &[Value], name| {
            find(docs, "Deployment", name)["spec"]["template"]["spec"]["containers"][0]["image"].clone()
        };
        let (docs, _) = printed(&default_args());
        assert_eq!(image_of(&docs, COLLECTOR), COLLECTOR_IMAGE);
        assert_eq!(image_of(&docs, JAEGER), JAEGER_IMAGE);
        let args = TracingInstallArgs { registry: Some("mirror.example/team".into()), ..default_args() };
        let (docs, _) = printed(&args);
        assert_eq!(image_of(&docs, COLLECTOR), "mirror.example/team/opentelemetry-collector:0.160.0");
        assert_eq!(image_of(&docs, JAEGER), "mirror.example/team/jaeger:2.21.0");
        let args = TracingInstallArgs { jaeger_image: Some("j.example/jaeger:2.22.0".into()), ..args };
        let (docs, _) = printed(&args);
        assert_eq!(image_of(&docs, JAEGER), "j.example/jaeger:2.22.0", "the whole reference wins");
        assert_eq!(image_of(&docs, COLLECTOR), "mirror.example/team/opentelemetry-collector:0.160.0");
        let error = render(&TracingInstallArgs { registry: Some("r.example/".into()), ..default_args() }).unwrap_err();
        assert!(error.to_string().contains("\"r.example/\""), "{error}");
    }
}
