//! The workloads file's `ingress:`: Debian's nginx in its meshed pod, as an ingress controller
//! whose proxy runs in ingress mode. nginx connects to each route's Service by its ClusterIP and
//! names it in `Host` (`<service>.<namespace>.svc.cluster.local`), so the ingress's proxy routes
//! by that name: the Service's HTTPRoute (a split) applies, over mTLS under the ingress's
//! identity, which the target's `allow` may list.

use std::net::SocketAddr;
use std::path::Path;

use anyhow::Context;

use super::{Inputs, Running, loopback, mkdir, wait_for};
use crate::host::spawn_detached;
use crate::nginx::{self, NGINX};
use crate::traffic::{IngressSummary, http_get_in};
use crate::workloads::{IngressSpec, Role, Workloads};

/// Where the ingress's nginx keeps its configuration and temporary files, under the root.
pub const DIR: &str = "ingress";

/// nginx's configuration for `ingress`: a server per route, answering for its host and
/// proxying to its Service, after a first (default) server that answers any other host 404.
fn config(w: &Workloads, ingress: &IngressSpec, dir: &Path) -> String {
    let listen = SocketAddr::from(([0, 0, 0, 0], ingress.port));
    let mut servers = nginx::server(listen, None, "    return 404;\n");
    for route in &ingress.routes {
        let s = w.service(&route.service).expect("validated: routes name services");
        let upstream = SocketAddr::from((s.cluster_ip, s.port)).to_string();
        let header = format!("Host {}.{}.svc.cluster.local", s.name, w.namespace);
        servers.push_str(&nginx::server(listen, Some(&route.host), &nginx::location("", &upstream, &header)));
    }
    nginx::config(dir, &servers)
}

/// nginx in the ingress's pod (its proxy already ready), started once its configuration is
/// written; returns where the host reaches it once it answers.
pub(super) fn start(i: &Inputs<'_>, pods: &[Running]) -> anyhow::Result<Option<IngressSummary>> {
    let Some(ingress) = &i.workloads.ingress else { return Ok(None) };
    let pod = pods.iter().find(|p| p.spec.role == Role::Ingress).context("the ingress's pod was not created")?;
    i.progress(&format!("starting the ingress controller (nginx in {}, its proxy in ingress mode)", pod.spec.name));
    let dir = i.root.join(DIR);
    mkdir(&dir, 0o700)?;
    let conf = dir.join("nginx.conf");
    std::fs::write(&conf, config(i.workloads, ingress, &dir)).context("writing the ingress's nginx.conf")?;
    let mut cmd = i.in_netns(&pod.spec.name, Path::new(NGINX));
    cmd.args(["-e", "stderr", "-p"]).arg(&dir).arg("-c").arg(&conf);
    spawn_detached(i.root, "nginx", cmd)?;
    let netns = i.netns(&pod.spec.name);
    wait_for(i.root, "the ingress's nginx", "nginx", || {
        http_get_in(&netns, loopback(ingress.port), "ready", "/").is_ok()
    })?;
    let address = SocketAddr::from((pod.ip, ingress.port));
    let example = match ingress.routes.first() {
        Some(route) => format!("curl -H 'Host: {}' http://{address}/", route.host),
        None => format!("curl http://{address}/"),
    };
    Ok(Some(IngressSummary {
        address: address.to_string(),
        routes: ingress.routes.iter().map(|r| (r.host.clone(), r.service.clone())).collect(),
        example,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_route_is_a_server_naming_its_service_behind_a_default_that_answers_404() {
        let w = Workloads::parse(
            "namespace: shop\nservices: [{name: web, clusterIP: 10.96.0.10, port: 80, meshed: true}]\n\
             ingress: {routes: [{host: web.shop, service: web}]}\n",
            "test.yaml",
        )
        .unwrap();
        let conf = config(&w, w.ingress.as_ref().unwrap(), Path::new("/r/ingress"));
        let default = conf.find("return 404;").unwrap();
        let route = conf.find("server_name web.shop;").unwrap();
        assert!(default < route, "{conf}");
        assert!(conf.contains("proxy_pass http://10.96.0.10:80/;"), "{conf}");
        assert!(conf.contains("proxy_set_header Host web.shop.svc.cluster.local;"), "{conf}");
        assert_eq!(conf.matches("listen 0.0.0.0:8080;").count(), 2, "{conf}");
    }
}
