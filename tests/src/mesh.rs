//! A small mesh on the real kernel: `cnimesh-control` in a pod of its own issuing certificates
//! to a client and a server pod, both captured, each with its proxy; the server runs the test
//! apps ([`crate::apps`]).

use crate::apps::Apps;
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
    let mut server_env = control.proxy_env("shop", "server", &control.token("shop", "server").unwrap());
    // The server's proxy gets its trust anchors as PEM text, as the injector passes them; the
    // client's reads them from a file.
    for (var, value) in &mut server_env {
        if var == "CNIMESH_PROXY_IDENTITY_TRUST_ANCHORS" {
            *var = "CNIMESH_PROXY_IDENTITY_TRUST_ANCHORS_PEM".into();
            *value = std::fs::read_to_string(control.trust_anchors()).unwrap();
        }
    }
    let server_proxy = Sidecar::start(&bins.proxy, &server.netns, &env_refs(&server_env)).unwrap();
    let mut client_env = control.proxy_env("shop", "client", &control.token("shop", "client").unwrap());
    client_env.push((
        "CNIMESH_PROXY_OUTBOUND_IDENTITIES".into(),
        format!("{}={}", server.ipv4(), identity("shop", "server")),
    ));
    client_env.extend(client_settings.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    let client_proxy = Sidecar::start(&bins.proxy, &client.netns, &env_refs(&client_env)).unwrap();
    Meshed { control, client, server, client_proxy, server_proxy, _apps: apps, _control_pod: control_pod }
}
