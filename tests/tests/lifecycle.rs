//! The CNI lifecycle against a real kernel: idempotent ADD and DEL, CHECK naming drift, GC with a
//! partial valid list, STATUS, many pods at once, and the ruleset `nft` reads back.

use std::path::Path;

use cnimesh_cni::backend::Backend;
use cnimesh_cni::rules::Ruleset;
use cnimesh_cni::spec::RedirectSpec;
use cnimesh_e2e::cni::{Call, exec_plugin};
use cnimesh_e2e::pod::zero_counters;
use cnimesh_e2e::{Network, Pod, bins, require_root};
use serde_json::{Value, json};

fn records(net: &Network) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(net.state_dir().join("attachments"))
        .map(|d| d.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default();
    names.sort();
    names
}

fn network(settings: Value) -> Network {
    Network::bridge(&bins!(), settings).expect("network")
}

/// The ruleset block of the CNI reference page (between the `ruleset` markers).
fn documented_ruleset() -> String {
    let page = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/reference/cni-config.md");
    let readme = std::fs::read_to_string(page).unwrap();
    let start = readme.find("<!-- ruleset:begin -->").expect("the CNI reference has the ruleset block");
    let end = readme.find("<!-- ruleset:end -->").expect("the CNI reference ends the ruleset block");
    let block = &readme[start..end];
    let body = block.split_once("```\n").expect("fenced").1;
    body.rsplit_once("```").expect("fenced").0.to_string()
}

#[test]
fn add_twice_leaves_one_documented_ruleset() {
    if !require_root("add_twice_leaves_one_documented_ruleset") {
        return;
    }
    let net = network(json!({}));
    let pod = Pod::new(&net, "default").unwrap();
    let again = net.exec_cnimesh("ADD", &pod.call()).expect("second ADD succeeds");
    assert_eq!(again.as_ref(), Some(&pod.result), "ADD is idempotent in its result too");

    let listed = zero_counters(&pod.nft_table().expect("table present"));
    assert_eq!(listed, documented_ruleset(), "nft reads back the documented ruleset");
    assert_eq!(listed, Ruleset::from_spec(&RedirectSpec::default()).to_string());
    let all = pod.netns.exec("nft", &["list", "tables"]).unwrap();
    assert_eq!(all.trim(), "table inet cnimesh", "exactly one table");
    assert_eq!(records(&net).len(), 1);
}

#[test]
fn add_prints_prev_result_in_the_requested_version() {
    if !require_root("add_prints_prev_result_in_the_requested_version") {
        return;
    }
    let mut net = network(json!({}));
    net.conflist["cniVersion"] = json!("0.4.0");
    let pod = Pod::new(&net, "default").unwrap();
    assert_eq!(pod.result["cniVersion"], "0.4.0");
    let versions: Vec<&str> =
        pod.result["ips"].as_array().unwrap().iter().map(|ip| ip["version"].as_str().unwrap()).collect();
    assert_eq!(versions, ["4", "6"]);
}

#[test]
fn del_is_idempotent() {
    if !require_root("del_is_idempotent") {
        return;
    }
    let net = network(json!({}));
    let pod = Pod::new(&net, "default").unwrap();
    pod.del().expect("first DEL (with prevResult)");
    assert!(net.cached_result(&pod.call()).is_none());
    pod.del().expect("second DEL (no prevResult)");
    // containerd's second DEL may come with no netns at all.
    let call = Call { netns: "", ..pod.call() };
    let conf = net.plugin_conf(1, None);
    exec_plugin(net.cni_path(), &conf, "DEL", &call).expect("DEL without netns");
    assert!(pod.nft_table().is_none(), "table removed");
    assert!(records(&net).is_empty(), "record removed");
}

#[test]
fn del_after_netns_is_gone() {
    if !require_root("del_after_netns_is_gone") {
        return;
    }
    let net = network(json!({}));
    let mut pod = Pod::new(&net, "default").unwrap();
    pod.netns.delete().unwrap();
    pod.del().expect("DEL succeeds when the netns is gone");
    assert!(records(&net).is_empty());
}

fn rule_handle(pod: &Pod<'_>, chain: &str, needle: &str) -> String {
    let listing = pod.netns.exec("nft", &["-a", "list", "chain", "inet", "cnimesh", chain]).unwrap();
    let line = listing.lines().find(|l| l.contains(needle)).unwrap_or_else(|| panic!("no {needle} in {listing}"));
    line.rsplit_once("handle ").unwrap().1.trim().to_string()
}

#[test]
fn check_names_the_drift() {
    if !require_root("check_names_the_drift") {
        return;
    }
    let net = network(json!({}));
    let pod = Pod::new(&net, "default").unwrap();
    net.check(&pod.call()).expect("CHECK passes right after ADD");

    let handle = rule_handle(&pod, "inbound", "dport 4191");
    pod.netns.exec("nft", &["delete", "rule", "inet", "cnimesh", "inbound", "handle", &handle]).unwrap();
    let e = net.check(&pod.call()).expect_err("CHECK fails after a rule is deleted");
    assert_eq!(e.code, Some(101), "{e}");
    assert!(e.msg.contains("chain inbound rule 2: missing `tcp dport 4191 counter return`"), "{e}");

    let handle = rule_handle(&pod, "outbound", "redirect");
    pod.netns
        .exec(
            "nft",
            &[
                "replace", "rule", "inet", "cnimesh", "outbound", "handle", &handle, "meta", "l4proto", "tcp",
                "counter", "redirect", "to", ":4999",
            ],
        )
        .unwrap();
    let e = net.check(&pod.call()).expect_err("CHECK fails on a changed port");
    assert!(
        e.msg.contains(
            "expected `meta l4proto tcp counter redirect to :4140`, found `meta l4proto tcp counter redirect to :4999`"
        ),
        "{e}"
    );

    pod.netns.exec("nft", &["delete", "table", "inet", "cnimesh"]).unwrap();
    let e = net.check(&pod.call()).expect_err("CHECK fails without the table");
    assert!(e.msg.contains("table inet cnimesh is missing"), "{e}");

    net.exec_cnimesh("ADD", &pod.call()).expect("ADD repairs");
    net.check(&pod.call()).expect("CHECK passes again");
}

#[test]
fn check_names_iptables_drift() {
    if !require_root("check_names_iptables_drift") {
        return;
    }
    let net = network(json!({"backend": "iptables-legacy"}));
    let pod = Pod::new(&net, "default").unwrap();
    net.check(&pod.call()).expect("CHECK passes right after ADD");
    pod.netns
        .exec(
            "ip6tables-legacy",
            &[
                "-t",
                "nat",
                "-D",
                "CNIMESH_OUTPUT",
                "-o",
                "lo",
                "-m",
                "comment",
                "--comment",
                "cnimesh/loopback",
                "-j",
                "RETURN",
            ],
        )
        .unwrap();
    let e = net.check(&pod.call()).expect_err("CHECK fails after a rule is deleted");
    assert!(e.msg.contains("ip6tables nat rule") && e.msg.contains("missing `-A CNIMESH_OUTPUT -o lo"), "{e}");
    assert!(!e.msg.contains("iptables nat rule"), "IPv4 did not drift: {e}");
}

#[test]
fn gc_removes_only_unlisted_attachments() {
    if !require_root("gc_removes_only_unlisted_attachments") {
        return;
    }
    let net = network(json!({}));
    let keep = Pod::new(&net, "default").unwrap();
    let stale = Pod::new(&net, "default").unwrap();
    let mut gone = Pod::new(&net, "default").unwrap();
    gone.netns.delete().unwrap();
    assert_eq!(records(&net).len(), 3);

    let conf = net.cnimesh_conf_v11(json!({
        "cni.dev/valid-attachments": [{"containerID": keep.container_id, "ifname": "eth0"}]
    }));
    let call = Call { container_id: "", netns: "", ifname: "", args: "" };
    let e = exec_plugin(net.cni_path(), &net.cnimesh_conf_v11(json!({})), "GC", &call).expect_err("no list, no GC");
    assert_eq!(e.code, Some(7), "{e}");
    assert_eq!(records(&net).len(), 3, "a refused GC removes nothing");
    exec_plugin(net.cni_path(), &conf, "GC", &call).expect("GC succeeds");

    assert_eq!(records(&net).len(), 1, "only the listed attachment keeps its record");
    assert!(records(&net)[0].contains(&keep.container_id));
    assert!(keep.nft_table().is_some(), "listed pod keeps its rules");
    assert!(stale.nft_table().is_none(), "unlisted pod's rules are removed");
}

#[test]
fn status_reports_whether_adds_can_be_served() {
    if !require_root("status_reports_whether_adds_can_be_served") {
        return;
    }
    let net = network(json!({}));
    let call = Call { container_id: "", netns: "", ifname: "", args: "" };
    exec_plugin(net.cni_path(), &net.cnimesh_conf_v11(json!({})), "STATUS", &call).expect("STATUS ok");

    let conf = net.cnimesh_conf_v11(json!({"stateDir": "/proc/version/cnimesh"}));
    let e = exec_plugin(net.cni_path(), &conf, "STATUS", &call).expect_err("unwritable state dir");
    assert_eq!(e.code, Some(50), "{e}");
    assert!(e.msg.contains("state directory"), "{e}");

    // An unprivileged caller cannot use nftables: STATUS says so instead of letting ADDs fail.
    let stdin = net.cnimesh_conf_v11(json!({"stateDir": "/tmp"})).to_string();
    let out = cnimesh_e2e::cni::exec_as(&bins!().plugin, Some(65534), "STATUS", &call, stdin.as_bytes()).unwrap();
    assert!(!out.success);
    let e: Value = serde_json::from_str(out.stdout.trim()).unwrap();
    assert_eq!(e["code"], 50, "{e}");
    assert!(e["msg"].as_str().unwrap().contains("nftables backend cannot be used"), "{e}");

    let old = json!({"cniVersion": "1.0.0", "type": "cnimesh-cni"});
    let e = exec_plugin(net.cni_path(), &old, "STATUS", &call).expect_err("STATUS needs 1.1.0");
    assert_eq!(e.code, Some(1), "{e}");

    let out = exec_plugin(net.cni_path(), &old, "VERSION", &call).unwrap().unwrap();
    assert_eq!(out["supportedVersions"], json!(["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"]));
}

#[test]
fn twenty_pods_at_once_leave_nothing_behind() {
    if !require_root("twenty_pods_at_once_leave_nothing_behind") {
        return;
    }
    let net = network(json!({}));
    let pods: Vec<Pod<'_>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..20).map(|_| s.spawn(|| Pod::new(&net, "default"))).collect();
        handles.into_iter().map(|h| h.join().unwrap().expect("concurrent ADD")).collect()
    });
    assert_eq!(records(&net).len(), 20);
    for pod in &pods {
        assert!(pod.nft_table().is_some());
    }
    let names: Vec<String> = pods.iter().map(|p| p.netns.name().to_string()).collect();
    std::thread::scope(|s| {
        for pod in &pods {
            s.spawn(move || pod.del().expect("concurrent DEL"));
        }
    });
    for pod in &pods {
        assert!(pod.nft_table().is_none(), "table left in {}", pod.netns.name());
    }
    assert!(records(&net).is_empty(), "records left: {:?}", records(&net));
    drop(pods);
    let listed = cnimesh_e2e::host::run("ip", &["netns", "list"]).unwrap();
    for name in names {
        assert!(!listed.lines().any(|l| l.split_whitespace().next() == Some(&name)), "netns {name} left");
    }
}

/// A spec exercising every kind of match: ranges, subnets of both families and prefix shapes.
fn wide_spec() -> RedirectSpec {
    RedirectSpec {
        proxy_gid: Some(2103),
        skip_inbound_ports: vec!["22".parse().unwrap(), "4567-4568".parse().unwrap()],
        skip_inbound_subnets: vec!["10.0.0.0/8".parse().unwrap(), "192.168.1.7/32".parse().unwrap()],
        skip_outbound_subnets: vec!["172.16.0.0/12".parse().unwrap(), "fd00::/20".parse().unwrap()],
        ..Default::default()
    }
    .normalized()
}

#[test]
fn our_bytes_and_nfts_bytes_agree() {
    if !require_root("our_bytes_and_nfts_bytes_agree") {
        return;
    }
    let spec = wide_spec();
    let ruleset = Ruleset::from_spec(&spec);

    // What we write, nft reads back as the documented text...
    let ours = cnimesh_e2e::Netns::new().unwrap();
    Backend::Nftables.apply(&ours.path(), &ruleset).unwrap();
    let listed = zero_counters(&ours.exec("nft", &["list", "table", "inet", "cnimesh"]).unwrap());
    assert_eq!(listed, ruleset.to_string());

    // ...and what nft writes from that text, we read back as the same rules.
    let theirs = cnimesh_e2e::Netns::new().unwrap();
    let script = std::env::temp_dir().join(format!("cnimesh-{}.nft", theirs.name()));
    std::fs::write(&script, ruleset.to_string()).unwrap();
    theirs.exec("nft", &["-f", script.to_str().unwrap()]).unwrap();
    let _ = std::fs::remove_file(&script);
    assert_eq!(Backend::Nftables.drift(&theirs.path(), &ruleset).unwrap(), Vec::<String>::new());
    // A different spec is drift against nft's table.
    let drift = Backend::Nftables.drift(&theirs.path(), &Ruleset::from_spec(&RedirectSpec::default())).unwrap();
    assert!(drift.iter().any(|d| d.contains("tcp dport 4567-4568")), "{drift:?}");
}

#[test]
fn auto_backend_picks_nftables_here() {
    if !require_root("auto_backend_picks_nftables_here") {
        return;
    }
    let net = network(json!({"backend": "auto"}));
    let pod = Pod::new(&net, "default").unwrap();
    let record = &records(&net)[0];
    let body: Value =
        serde_json::from_slice(&std::fs::read(net.state_dir().join("attachments").join(record)).unwrap()).unwrap();
    assert_eq!(body["backend"], "nftables");
    assert!(pod.nft_table().is_some());
    net.check(&pod.call()).unwrap();
}

/// Runs the cnimesh plugin alone with `conf` for a call in `netns`.
fn run_alone(
    net: &Network,
    command: &str,
    netns: &cnimesh_e2e::Netns,
    ifname: &str,
    conf: &Value,
) -> Result<Option<Value>, cnimesh_e2e::CniFailure> {
    let path = netns.path().display().to_string();
    let cid = format!("alone-{}", netns.name());
    let call = Call { container_id: &cid, netns: &path, ifname, args: "K8S_POD_NAMESPACE=default;K8S_POD_NAME=alone" };
    exec_plugin(net.cni_path(), conf, command, &call)
}

#[test]
fn prev_result_is_converted_between_versions() {
    if !require_root("prev_result_is_converted_between_versions") {
        return;
    }
    let net = network(json!({}));
    let v1 = json!({"cniVersion": "1.0.0", "interfaces": [{"name": "eth0", "mtu": 1400}],
        "ips": [{"interface": 0, "address": "10.244.0.9/24"}, {"interface": 0, "address": "fd44::9/64"}]});
    let v04 = json!({"cniVersion": "0.4.0", "interfaces": [{"name": "eth0"}],
        "ips": [{"version": "4", "interface": 0, "address": "10.244.0.9/24"}]});
    for (version, prev, tagged) in
        [("0.3.1", &v1, true), ("0.4.0", &v1, true), ("1.0.0", &v04, false), ("1.1.0", &v04, false)]
    {
        let ns = cnimesh_e2e::Netns::new().unwrap();
        let mut conf = net.plugin_conf(1, Some(prev));
        conf["cniVersion"] = json!(version);
        let out = run_alone(&net, "ADD", &ns, "eth0", &conf).unwrap().unwrap();
        assert_eq!(out["cniVersion"], version);
        for ip in out["ips"].as_array().unwrap() {
            assert_eq!(ip.get("version").is_some(), tagged, "{version}: {out}");
        }
        if version != "1.1.0" {
            assert!(out["interfaces"][0].get("mtu").is_none(), "{version}: 1.1-only field kept: {out}");
        }
        assert!(ns.nft_table().is_some(), "{version}: rules installed");
    }
}

#[test]
fn largest_allowed_ruleset_installs_and_checks() {
    if !require_root("largest_allowed_ruleset_installs_and_checks") {
        return;
    }
    let net = network(json!({}));
    let ports: Vec<u16> = (10000..10200).collect();
    let subnets: Vec<String> = (0..200).map(|i| format!("10.99.{}.{}/32", i / 250, i % 250)).collect();
    let prev = json!({"cniVersion": "1.0.0", "ips": [{"address": "10.244.0.9/24"}]});
    let mut conf = net.plugin_conf(1, Some(&prev));
    conf["skipInboundPorts"] = json!(ports);
    conf["skipOutboundSubnets"] = json!(subnets);
    conf["skipOutboundPorts"] = json!([]);
    let ns = cnimesh_e2e::Netns::new().unwrap();
    run_alone(&net, "ADD", &ns, "eth0", &conf).expect("400 skip entries install");
    run_alone(&net, "CHECK", &ns, "eth0", &conf).expect("and check clean");
    let listing = ns.nft_table().unwrap();
    // 400 skip rules, plus the proxy-UID and loopback returns.
    assert_eq!(listing.matches("return").count(), 402, "every rule is there");

    conf["skipOutboundPorts"] = json!([1]);
    let other = cnimesh_e2e::Netns::new().unwrap();
    let e = run_alone(&net, "ADD", &other, "eth0", &conf).expect_err("401 entries are refused");
    assert_eq!(e.code, Some(7), "{e}");
    assert!(e.msg.contains("limit of 400"), "{e}");
    assert!(other.nft_table().is_none());
}

#[test]
fn check_reports_a_disabled_table_and_a_dropping_policy() {
    if !require_root("check_reports_a_disabled_table_and_a_dropping_policy") {
        return;
    }
    let net = network(json!({}));
    let pod = Pod::new(&net, "default").unwrap();
    pod.netns.exec("nft", &["add", "table", "inet", "cnimesh", "{ flags dormant; }"]).unwrap();
    let e = net.check(&pod.call()).expect_err("a dormant table captures nothing");
    assert!(e.msg.contains("dormant"), "{e}");

    net.exec_cnimesh("ADD", &pod.call()).unwrap();
    net.check(&pod.call()).unwrap();
    pod.netns.exec("nft", &["add", "chain", "inet", "cnimesh", "output", "{ policy drop; }"]).unwrap();
    let e = net.check(&pod.call()).expect_err("a dropping policy is drift");
    assert!(e.msg.contains("chain output has policy drop"), "{e}");
}

#[test]
fn del_without_a_netns_uses_the_recorded_one() {
    if !require_root("del_without_a_netns_uses_the_recorded_one") {
        return;
    }
    let net = network(json!({}));
    let pod = Pod::new(&net, "default").unwrap();
    net.exec_cnimesh("DEL", &Call { netns: "", ..pod.call() }).expect("DEL with an empty CNI_NETNS");
    assert!(pod.nft_table().is_none(), "the recorded netns was cleaned");
    assert!(records(&net).is_empty());
}

#[test]
fn a_second_network_of_the_pod_does_not_remove_capture() {
    if !require_root("a_second_network_of_the_pod_does_not_remove_capture") {
        return;
    }
    // Multus-style: two networks chain cnimesh-cni into the same pod (one state dir per node).
    let primary = network(json!({}));
    let secondary = network(json!({"stateDir": primary.state_dir()}));
    let pod = Pod::new(&primary, "default").unwrap();
    let netns = pod.netns.path().display().to_string();
    let call = Call { ifname: "net1", netns: &netns, ..pod.call() };
    let prev = json!({"cniVersion": "1.0.0", "ips": [{"address": "192.168.50.2/24"}]});
    exec_plugin(secondary.cni_path(), &secondary.plugin_conf(1, Some(&prev)), "ADD", &call).expect("second attachment");
    assert_eq!(records(&primary).len(), 2);

    let gc = secondary
        .cnimesh_conf_v11(json!({"cni.dev/valid-attachments": [{"containerID": pod.container_id, "ifname": "net1"}]}));
    let none = Call { container_id: "", netns: "", ifname: "", args: "" };
    exec_plugin(secondary.cni_path(), &gc, "GC", &none).expect("GC of the other network");
    assert_eq!(records(&primary).len(), 2, "GC leaves other networks' records alone");

    exec_plugin(secondary.cni_path(), &secondary.plugin_conf(1, None), "DEL", &call)
        .expect("DEL of the second attachment");
    assert_eq!(records(&primary).len(), 1);
    assert!(pod.nft_table().is_some(), "capture stays while the pod's first attachment exists");
    primary.check(&pod.call()).expect("and it is intact");
}
