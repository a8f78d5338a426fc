//! A small mesh on the real kernel: `cnimesh-control` in a pod of its own issuing certificates
//! to a client and a server pod, both captured, each with its proxy; the server runs the test
//! apps ([`crate::apps`]).

use std::path::Path;

use crate::apps::Apps;
use crate::bench::Row;
use crate::cni::{Bins, Network};
use crate::control::{Control, env_refs, identity};
use crate::pod::Pod;
use crate::sidecar::Sidecar;

pub struct Meshed<'n> {
    pub control: Control,
    pub client: Pod<'n>,
    pub server: Pod<'n>,
    pub client_proxy: Sidecar,
    pub server_proxy: Sidecar,
    _apps: Apps,
    // Dropped after the control plane that runs in it.
    _control_pod: Pod<'n>,
}

/// A control plane, and a client and a server pod whose proxies hold certificates; the client
/// knows the server's address is meshed (as discovery will tell it).
pub fn meshed<'n>(bins: &Bins, net: &'n Network, control_args: &[&str]) -> Meshed<'n> {
    meshed_with(bins, net, control_args, &[])
}

/// [`meshed`], with more settings for the client's proxy.
pub fn meshed_with<'n>(
    bins: &Bins,
    net: &'n Network,
    control_args: &[&str],
    client_settings: &[(&str, &str)],
) -> Meshed<'n> {
    let control_pod = Pod::unmeshed(net, "cnimesh", "control").unwrap();
    let control = Control::start(&bins.control, &control_pod, control_args).unwrap();
    let client = Pod::named(net, "shop", "client").unwrap();
    let server = Pod::named(net, "shop", "server").unwrap();
    let apps = Apps::start(&server.netns.path(), server.ipv4().into(), "server").unwrap();
    let (client_proxy, server_proxy) = proxies(&control, &bins.proxy, &client, &server, client_settings);
    Meshed { control, client, server, client_proxy, server_proxy, _apps: apps, _control_pod: control_pod }
}

/// The proxies (running `proxy`) of a meshed `client` and `server` pod of namespace `shop`, with
/// certificates from `control`; the client knows the server's address is meshed (as discovery
/// would tell it). Returns (client's, server's).
pub fn proxies(
    control: &Control,
    proxy: &Path,
    client: &Pod<'_>,
    server: &Pod<'_>,
    client_settings: &[(&str, &str)],
) -> (Sidecar, Sidecar) {
    proxies_with(control, proxy, client, server, client_settings, &[], &Sidecar::start)
}

/// How a proxy is started: its binary, pod and settings.
pub type Starter<'s> = &'s dyn Fn(&Path, &crate::netns::Netns, &[(&str, &str)]) -> anyhow::Result<Sidecar>;

/// [`proxies`], with more settings for the server's proxy too, each proxy started by `start`
/// ([`Sidecar::start`], or under an instrumenting wrapper).
pub fn proxies_with(
    control: &Control,
    proxy: &Path,
    client: &Pod<'_>,
    server: &Pod<'_>,
    client_settings: &[(&str, &str)],
    server_settings: &[(&str, &str)],
    start: Starter<'_>,
) -> (Sidecar, Sidecar) {
    let mut server_env = control.proxy_env("shop", &server.name, &control.token("shop", &server.name).unwrap());
    // The server's proxy gets its trust anchors as PEM text, as the injector passes them; the
    // client's reads them from a file.
    for (var, value) in &mut server_env {
        if var == "CNIMESH_PROXY_IDENTITY_TRUST_ANCHORS" {
            *var = "CNIMESH_PROXY_IDENTITY_TRUST_ANCHORS_PEM".into();
            *value = std::fs::read_to_string(control.trust_anchors()).unwrap();
        }
    }
    server_env.extend(server_settings.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    let server_proxy = start(proxy, &server.netns, &env_refs(&server_env)).unwrap();
    let mut client_env = control.proxy_env("shop", &client.name, &control.token("shop", &client.name).unwrap());
    client_env.push((
        "CNIMESH_PROXY_OUTBOUND_IDENTITIES".into(),
        format!("{}={}", server.ipv4(), identity("shop", &server.name)),
    ));
    client_env.extend(client_settings.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    let client_proxy = start(proxy, &client.netns, &env_refs(&client_env)).unwrap();
    (client_proxy, server_proxy)
}

/// A meshed client and server pod with their proxies and the test apps on the server: one row
/// of a proxy benchmark.
pub struct Pair<'n> {
    pub client: Pod<'n>,
    pub server: Pod<'n>,
    pub client_proxy: Sidecar,
    pub server_proxy: Sidecar,
    /// The server app's `/hello`, by the server's address.
    pub url: String,
    _apps: Apps,
}

impl<'n> Pair<'n> {
    /// Pods `<name>-client` and `<name>-server` in `net`, meshed by [`proxies`].
    pub fn start(control: &Control, proxy: &Path, net: &'n Network, name: &str) -> Self {
        Self::start_with(control, proxy, net, name, &[])
    }

    /// [`Pair::start`], with `settings` for both proxies.
    pub fn start_with(
        control: &Control,
        proxy: &Path,
        net: &'n Network,
        name: &str,
        settings: &[(&str, &str)],
    ) -> Self {
        let (client, server) = Self::pods(net, name);
        Self::of(control, proxy, client, server, settings, settings, &Sidecar::start)
    }

    /// Pods `<name>-client` and `<name>-server` of namespace `shop` in `net`.
    fn pods(net: &'n Network, name: &str) -> (Pod<'n>, Pod<'n>) {
        let client = Pod::named(net, "shop", &format!("{name}-client")).unwrap();
        let server = Pod::named(net, "shop", &format!("{name}-server")).unwrap();
        (client, server)
    }

    /// `client` and `server`, pods made beforehand (the cluster's YAML names their addresses),
    /// meshed by [`proxies_with`] with these settings for each proxy, each started by `start`.
    pub fn of(
        control: &Control,
        proxy: &Path,
        client: Pod<'n>,
        server: Pod<'n>,
        client_settings: &[(&str, &str)],
        server_settings: &[(&str, &str)],
        start: Starter<'_>,
    ) -> Self {
        let apps = Apps::start(&server.netns.path(), server.ipv4().into(), &server.name).unwrap();
        let (client_proxy, server_proxy) =
            proxies_with(control, proxy, &client, &server, client_settings, server_settings, start);
        let url = format!("http://{}:{}/hello", server.ipv4(), crate::apps::HTTP_PORT);
        Self { client, server, client_proxy, server_proxy, url, _apps: apps }
    }

    /// Pods `<name>-client` and `<name>-server` in `net`, meshed, each proxy started by `start`
    /// (e.g. under valgrind).
    pub fn start_by(control: &Control, proxy: &Path, net: &'n Network, name: &str, start: Starter<'_>) -> Self {
        let (client, server) = Self::pods(net, name);
        Self::of(control, proxy, client, server, &[], &[], start)
    }

    /// [`Pair::of`] whose server's proxy follows its workload's inbound policy from `control`
    /// when `policy` is set (none otherwise): a row of the inbound policy benchmarks
    /// (`proxy_policy`, `proxy_ratelimit`).
    pub fn policed(control: &Control, proxy: &Path, client: Pod<'n>, server: Pod<'n>, policy: bool) -> Self {
        let (destination, workload) = (control.addr.to_string(), format!("shop:{}", server.name));
        let settings = [
            ("CNIMESH_PROXY_DESTINATION_ADDR", destination.as_str()),
            ("CNIMESH_PROXY_POLICY_WORKLOAD", workload.as_str()),
        ];
        Self::of(control, proxy, client, server, &[], if policy { &settings } else { &[] }, &Sidecar::start)
    }

    /// Sends requests from the client until the server's proxy metrics contain `needle` (the
    /// policy a benchmark measures is in force before it measures); panics after 30 s.
    pub fn wait_for_server_metric(&self, needle: &str) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        let server = format!("{}:{}", self.server.ipv4(), crate::apps::HTTP_PORT);
        while !self.server_proxy.metrics().contains(needle) {
            assert!(
                std::time::Instant::now() < deadline,
                "the server's proxy never counted {needle}:\n{}",
                self.server_proxy.metrics()
            );
            let _ = crate::sidecar::http_in(&self.client.netns.path(), &server, "GET", "/hello", "");
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }

    /// The two proxies' PIDs (what a benchmark charges CPU to).
    pub fn pids(&self) -> Vec<u32> {
        vec![self.client_proxy.pid(), self.server_proxy.pid()]
    }

    /// This pair as a benchmark row named `name`: requests from its client, CPU of its proxies.
    pub fn row<'a>(&'a self, name: &'a str) -> Row<'a> {
        Row { name, netns: &self.client.netns, url: self.url.clone(), pids: self.pids() }
    }
}
