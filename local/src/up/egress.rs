//! Egress for local mode's pods, as a node gives it: a default route through their bridge (the
//! primary conflist's `isDefaultGateway`) and, when the host has a default route, masquerading
//! of what they send out through the host's uplink (an nftables table of local mode's own, which
//! `down` deletes). Nothing else of the host's firewall changes: only the pod subnet's packets
//! leaving by the uplink are rewritten, forwarding itself is the bridge plugin's (`isGateway`
//! turns it on, as it always did here), and a host whose forward policy drops keeps dropping.

use anyhow::Context;

use super::Inputs;
use crate::host;
use crate::record::State;

/// The nftables table (family `ip`) of this local mode's egress masquerading.
pub fn table(prefix: &str) -> String {
    format!("cnimesh-local-{prefix}-egress")
}

/// Masquerades the pod subnet's packets out of the host's uplink, recorded first so that `down`
/// deletes the table even if `up` stops halfway. Without a default route on the host, pods have
/// no way out either: nothing is installed.
pub fn masquerade(i: &Inputs<'_>, state: &mut State) -> anyhow::Result<()> {
    let routes = host::run("ip", &["-4", "route", "show", "default"])?;
    let Some(uplink) = uplink(&routes) else {
        i.progress("no default route on this host: the pods' default route leads nowhere further");
        return Ok(());
    };
    let table = table(i.prefix);
    i.progress(&format!("egress: {} masqueraded out of {uplink} (nftables table ip {table})", i.subnet));
    state.egress_table = Some(table.clone());
    state.write(i.root)?;
    let rules = format!(
        "table ip {table} {{\n  chain postrouting {{\n    type nat hook postrouting priority srcnat; policy accept;\n    ip saddr {} oifname \"{uplink}\" counter masquerade comment \"cnimesh-local egress\"\n  }}\n}}\n",
        i.subnet
    );
    let file = i.root.join("run").join("egress.nft");
    std::fs::write(&file, rules)?;
    host::run("nft", &["-f", &file.display().to_string()]).context("installing the egress masquerading")?;
    Ok(())
}

/// The interface of the first default route in `ip -4 route show default`'s output.
fn uplink(routes: &str) -> Option<String> {
    let words: Vec<&str> = routes.lines().next()?.split_whitespace().collect();
    let dev = words.iter().position(|w| *w == "dev")?;
    words.get(dev + 1).map(|d| d.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_uplink_is_the_default_routes_device() {
        assert_eq!(uplink("default via 192.0.2.1 dev eth0 proto dhcp metric 100\n").as_deref(), Some("eth0"));
        assert_eq!(uplink("default dev wg0 scope link\n").as_deref(), Some("wg0"));
        assert_eq!(uplink(""), None);
    }
}
