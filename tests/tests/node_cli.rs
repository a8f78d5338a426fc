//! The node-level debug CLI (`cnimesh-node pods|rules|verify|status`) against real pods.

use std::net::SocketAddr;

use cnimesh_e2e::probe::connect;
use cnimesh_e2e::{Listener, Network, Pod, bins, require_root};
use cnimesh_node::debug::{self, Format};
use serde_json::{Value, json};

#[test]
fn pods_rules_and_verify_show_live_state() {
    if !require_root("pods_rules_and_verify_show_live_state") {
        return;
    }
    let bins = bins!();
    let nft = Network::bridge(&bins, json!({})).unwrap();
    // Both backends in one state dir, as on a node that changed backend.
    let ipt = Network::bridge(&bins, json!({"backend": "iptables-legacy", "stateDir": nft.state_dir()})).unwrap();
    let a = Pod::named(&nft, "shop", "web-a").unwrap();
    let b = Pod::named(&nft, "shop", "web-b").unwrap();
    let c = Pod::named(&ipt, "shop", "legacy-c").unwrap();
    let state = nft.state_dir();

    // One captured inbound connection into a.
    let _l = Listener::start(&bins.probe, "a", &a.netns.path(), &[SocketAddr::from(([0, 0, 0, 0], 4143))]).unwrap();
    connect(&bins.probe, &b.netns.path(), (a.ipv4(), 8080).into(), Some(2102)).unwrap();

    let rows = debug::pods(&state).unwrap();
    assert_eq!(rows.len(), 3);
    let row = |name: &str| rows.iter().find(|r| r.pod == format!("shop/{name}")).unwrap().clone();
    assert_eq!(row("web-a").redirected_inbound, Some(1), "{rows:?}");
    assert_eq!(row("web-a").backend, "nftables");
    assert_eq!(row("legacy-c").backend, "iptables-legacy");
    assert_eq!(row("legacy-c").redirected_inbound, Some(0));
    let table = debug::render_pods(&rows, Format::Human);
    assert!(table.starts_with("POD"), "{table}");
    assert!(table.lines().any(|l| l.starts_with("shop/web-a") && l.contains("1/0")), "{table}");
    let parsed: Value = serde_json::from_str(&debug::render_pods(&rows, Format::Json)).unwrap();
    assert_eq!(parsed.as_array().unwrap().len(), 3);

    let rules = debug::rules(&state, "shop/web-a").unwrap();
    let redirect = rules.rules.iter().find(|l| l.chain == "inbound" && l.redirect).unwrap();
    assert_eq!((redirect.rule.as_str(), redirect.packets), ("meta l4proto tcp counter redirect to :4143", 1));
    let text = debug::render_rules(&rules, Format::Human);
    assert!(text.contains("redirect to :4143"), "{text}");
    let legacy = debug::rules(&state, &c.container_id).unwrap();
    assert!(
        legacy.rules.iter().any(|l| l.chain == "ip6:CNIMESH_INBOUND" && l.rule.contains("REDIRECT --to-ports 4143")),
        "{legacy:?}"
    );
    let e = debug::rules(&state, "web").unwrap_err().to_string();
    assert!(e.contains("no captured pod matches"), "{e}");
    let e = debug::rules(&state, "shop/web-").unwrap_err().to_string();
    assert!(e.contains("no captured pod"), "{e}");

    let verdicts = debug::verify(&state, None).unwrap();
    assert!(verdicts.iter().all(|v| v.ok), "{verdicts:?}");
    b.netns.exec("nft", &["flush", "chain", "inet", "cnimesh", "outbound"]).unwrap();
    c.netns.exec("iptables-legacy", &["-t", "nat", "-F", "CNIMESH_INBOUND"]).unwrap();
    let verdicts = debug::verify(&state, None).unwrap();
    let bad: Vec<&str> = verdicts.iter().filter(|v| !v.ok).map(|v| v.pod.as_str()).collect();
    assert_eq!(bad.len(), 2, "{verdicts:?}");
    let text = debug::render_verify(&verdicts, Format::Human);
    assert!(text.contains("DRIFT  shop/web-b"), "{text}");
    assert!(text.contains("missing `meta skuid 2102 counter return`"), "{text}");
    assert!(text.contains("missing `-A CNIMESH_INBOUND"), "{text}");
    assert!(text.contains("ok     shop/web-a"), "{text}");
    let one = debug::verify(&state, Some("web-a")).unwrap();
    assert_eq!(one.len(), 1);
    assert!(one[0].ok);
}

#[test]
fn status_reports_the_installation() {
    let dir = tempfile::tempdir().unwrap();
    let (bin, conf, state) = (dir.path().join("bin"), dir.path().join("net.d"), dir.path().join("state"));
    std::fs::create_dir_all(&conf).unwrap();
    std::fs::write(
        conf.join("10-flannel.conflist"),
        r#"{"name":"cbr0","cniVersion":"0.3.1","plugins":[{"type":"flannel"}]}"#,
    )
    .unwrap();
    let socket = dir.path().join("node.sock");
    let s = debug::status(&bin, &conf, &socket, &state, "not configured".into());
    assert!(!s.healthy());
    assert!(!s.plugin_installed && s.chained_in.is_none() && !s.agent_socket_present);
    let text = debug::render_status(&s, Format::Human);
    assert!(text.contains("10-flannel.conflist") && text.contains("installed: NO"), "{text}");

    cnimesh_node::install::install_binary(&bins!().plugin, &bin).unwrap();
    cnimesh_node::chain::apply(&conf, &cnimesh_node::chain::entry(&json!({}))).unwrap();
    let _listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    let s = debug::status(&bin, &conf, &socket, &state, "not configured".into());
    assert!(s.healthy(), "{s:?}");
    assert_eq!(s.plugin_versions.as_deref().unwrap().last().map(String::as_str), Some("1.1.0"));
    let parsed: Value = serde_json::from_str(&debug::render_status(&s, Format::Json)).unwrap();
    assert_eq!(parsed["captured_pods"], 0);
}
