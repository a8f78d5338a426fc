//! Inbound capture takes whatever reaches the pod. A neighbour that routes another pod's address
//! through this pod must not get its connection relayed from this pod's address (bypassing
//! network policy and impersonating the pod): the proxy only serves its own pod's addresses.

use cnimesh_e2e::apps::{self, Apps};
use cnimesh_e2e::sidecar::{Sidecar, http_in};
use cnimesh_e2e::{Network, Pod, bins, require_root};
use serde_json::json;

#[test]
fn inbound_traffic_for_other_addresses_is_not_relayed() {
    if !require_root("inbound_traffic_for_other_addresses_is_not_relayed") {
        return;
    }
    let bins = bins!();
    let net = Network::bridge(&bins, json!({})).unwrap();
    let neighbour = Pod::unmeshed(&net, "shop", "neighbour").unwrap();
    let meshed = Pod::named(&net, "shop", "meshed").unwrap();
    let victim = Pod::unmeshed(&net, "shop", "victim").unwrap();
    let _apps = Apps::start(&victim.netns.path(), victim.ipv4().into(), "victim").unwrap();
    let proxy = Sidecar::start(&bins.proxy, &meshed.netns, &[]).unwrap();
    let victim_http = format!("{}:{}", victim.ipv4(), apps::HTTP_PORT);
    // Reachable directly: the app works.
    assert_eq!(http_in(&neighbour.netns.path(), &victim_http, "GET", "/hello", "").unwrap().0, 200);

    // Now the neighbour sends the victim's address to the meshed pod's MAC.
    let via = meshed.ipv4().to_string();
    neighbour.netns.exec("ip", &["route", "add", &format!("{}/32", victim.ipv4()), "via", &via]).unwrap();
    let relayed = http_in(&neighbour.netns.path(), &victim_http, "GET", "/hello", "");
    assert!(!matches!(relayed, Ok((200, _))), "the meshed pod's proxy relayed it: {relayed:?}");
    assert!(proxy.metric("tcp_refused_total") >= 1.0, "{}", proxy.metrics());
}
