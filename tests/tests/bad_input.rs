//! Bad input gets a CNI error object with the right code and a message an operator can act on, and
//! leaves nothing behind: no table, no iptables chain, no record.

use cnimesh_e2e::cni::{Call, exec_raw};
use cnimesh_e2e::pod::container_id;
use cnimesh_e2e::{Netns, Network, bins, require_root};
use serde_json::{Value, json};

struct Case {
    what: &'static str,
    stdin: String,
    command: &'static str,
    netns: bool,
    code: u64,
    needle: &'static str,
}

fn conf(net: &Network, extra: Value) -> Value {
    let mut c = net.plugin_conf(1, Some(&json!({"cniVersion": "1.0.0", "ips": [{"address": "10.244.0.9/24"}]})));
    if let (Some(o), Some(e)) = (c.as_object_mut(), extra.as_object()) {
        o.extend(e.clone());
    }
    c
}

fn assert_nothing_installed(ns: &Netns, net: &Network, what: &str) {
    let tables = ns.exec("nft", &["list", "tables"]).unwrap();
    assert!(tables.trim().is_empty(), "{what}: nftables left: {tables}");
    for tool in ["iptables-legacy-save", "ip6tables-legacy-save", "iptables-nft-save", "ip6tables-nft-save"] {
        let saved = ns.exec(tool, &["-t", "nat"]).unwrap_or_else(|e| panic!("{what}: {tool}: {e}"));
        assert!(!saved.contains("CNIMESH"), "{what}: {tool} shows our chains: {saved}");
    }
    let records = std::fs::read_dir(net.state_dir().join("attachments")).map_or(0, |d| d.count());
    assert_eq!(records, 0, "{what}: a record was left");
}

#[test]
fn bad_input_is_reported_and_leaves_nothing() {
    if !require_root("bad_input_is_reported_and_leaves_nothing") {
        return;
    }
    let net = Network::bridge(&bins!(), json!({})).unwrap();
    let with = |extra: Value| conf(&net, extra).to_string();
    let mut no_prev = conf(&net, json!({}));
    no_prev.as_object_mut().unwrap().remove("prevResult");
    let cases = vec![
        Case {
            what: "malformed JSON",
            stdin: "{\"cniVersion\": \"1.0.0\",".into(),
            command: "ADD",
            netns: true,
            code: 6,
            needle: "not valid JSON",
        },
        Case {
            what: "unknown cniVersion",
            stdin: with(json!({"cniVersion": "0.2.0"})),
            command: "ADD",
            netns: true,
            code: 1,
            needle: "0.2.0",
        },
        Case {
            what: "future cniVersion",
            stdin: with(json!({"cniVersion": "2.0.0"})),
            command: "ADD",
            netns: true,
            code: 1,
            needle: "supported",
        },
        Case {
            what: "port too large",
            stdin: with(json!({"skipInboundPorts": ["70000"]})),
            command: "ADD",
            netns: true,
            code: 7,
            needle: "70000",
        },
        Case {
            what: "port not a number",
            stdin: with(json!({"skipOutboundPorts": ["a-b"]})),
            command: "ADD",
            netns: true,
            code: 7,
            needle: "a-b",
        },
        Case {
            what: "bad subnet",
            stdin: with(json!({"skipOutboundSubnets": ["10.0.0.0/40"]})),
            command: "ADD",
            netns: true,
            code: 7,
            needle: "invalid",
        },
        Case {
            what: "unknown backend",
            stdin: with(json!({"backend": "bpf"})),
            command: "ADD",
            netns: true,
            code: 7,
            needle: "bpf",
        },
        Case {
            what: "missing CNI_NETNS",
            stdin: with(json!({})),
            command: "ADD",
            netns: false,
            code: 4,
            needle: "CNI_NETNS",
        },
        Case {
            what: "no prevResult",
            stdin: no_prev.to_string(),
            command: "ADD",
            netns: true,
            code: 7,
            needle: "chained after a primary CNI",
        },
        Case { what: "unknown command", stdin: with(json!({})), command: "FROB", netns: true, code: 4, needle: "FROB" },
        Case {
            what: "CHECK on 0.3.1",
            stdin: with(json!({"cniVersion": "0.3.1"})),
            command: "CHECK",
            netns: true,
            code: 1,
            needle: "0.4.0",
        },
        Case {
            what: "unwritable state dir",
            stdin: with(json!({"stateDir": "/proc/version/x"})),
            command: "ADD",
            netns: true,
            code: 5,
            needle: "attachment record",
        },
    ];
    for case in cases {
        let ns = Netns::new().unwrap();
        let netns_path = ns.path().display().to_string();
        let cid = container_id();
        let call = Call {
            container_id: &cid,
            netns: if case.netns { &netns_path } else { "" },
            ifname: "eth0",
            args: "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=p",
        };
        let out = exec_raw(net.cni_path(), "cnimesh-cni", case.command, &call, case.stdin.as_bytes()).unwrap();
        assert!(!out.success, "{}: must fail", case.what);
        let err: Value = serde_json::from_str(out.stdout.trim())
            .unwrap_or_else(|_| panic!("{}: not JSON: {}", case.what, out.stdout));
        assert_eq!(err["code"], case.code, "{}: {err}", case.what);
        assert!(err["cniVersion"].is_string(), "{}: {err}", case.what);
        let text = format!("{} {}", err["msg"], err["details"]);
        assert!(text.contains(case.needle), "{}: {text}", case.what);
        assert_nothing_installed(&ns, &net, case.what);
    }
}

#[test]
fn missing_netns_is_container_unknown() {
    if !require_root("missing_netns_is_container_unknown") {
        return;
    }
    let net = Network::bridge(&bins!(), json!({})).unwrap();
    let cid = container_id();
    let call = Call { container_id: &cid, netns: "/var/run/netns/cnimesh-no-such-ns", ifname: "eth0", args: "" };
    let out =
        exec_raw(net.cni_path(), "cnimesh-cni", "ADD", &call, conf(&net, json!({})).to_string().as_bytes()).unwrap();
    let err: Value = serde_json::from_str(out.stdout.trim()).unwrap();
    assert_eq!(err["code"], 3, "{err}");
    assert!(err["details"].as_str().unwrap().contains("does not exist"), "{err}");
}
