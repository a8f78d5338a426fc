//! A pod: a network namespace with loopback up (Debian's `loopback` plugin, as runtimes do it) and
//! one attachment to a [`Network`]. Dropping it runs DEL and deletes the namespace.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::{Value, json};

use crate::cni::{Call, CniFailure, Network, exec_plugin};
use crate::host::unique_name;
use crate::netns::Netns;

pub struct Pod<'n> {
    pub network: &'n Network,
    pub container_id: String,
    pub namespace: String,
    pub name: String,
    pub result: Value,
    netns_path: String,
    args: String,
    // Dropped last: DEL runs while the namespace still exists.
    pub netns: Netns,
}

/// A 64-hex-digit id like a containerd sandbox id, unique per process and call.
pub fn container_id() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    format!("{:032x}{:032x}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed))
}

impl<'n> Pod<'n> {
    /// A pod in Kubernetes namespace `namespace`, attached as `eth0`.
    pub fn new(network: &'n Network, namespace: &str) -> anyhow::Result<Self> {
        Self::named(network, namespace, &unique_name("pod-"))
    }

    /// Like [`Pod::new`], with a given pod name (to match objects a mocked API serves).
    pub fn named(network: &'n Network, namespace: &str, name: &str) -> anyhow::Result<Self> {
        Self::attached(network, namespace, name, Network::add)
    }

    /// A pod attached through the primary CNI only: never captured.
    pub fn unmeshed(network: &'n Network, namespace: &str, name: &str) -> anyhow::Result<Self> {
        Self::attached(network, namespace, name, Network::add_primary)
    }

    fn attached(
        network: &'n Network,
        namespace: &str,
        name: &str,
        add: fn(&Network, &Call<'_>) -> Result<Value, CniFailure>,
    ) -> anyhow::Result<Self> {
        let mut pod = Self::unattached(network, namespace, name)?;
        let lo = json!({"cniVersion": "1.0.0", "name": "cni-loopback", "type": "loopback"});
        exec_plugin(network.cni_path(), &lo, "ADD", &Call { ifname: "lo", ..pod.call() })?;
        pod.result = add(network, &pod.call())?;
        Ok(pod)
    }

    /// The namespace and identity of a pod, before the runtime has run ADD.
    pub fn unattached(network: &'n Network, namespace: &str, name: &str) -> anyhow::Result<Self> {
        let netns = Netns::new()?;
        let container_id = container_id();
        let name = name.to_string();
        let args = format!(
            "K8S_POD_UID=uid-{name};IgnoreUnknown=1;K8S_POD_NAMESPACE={namespace};K8S_POD_NAME={name};K8S_POD_INFRA_CONTAINER_ID={container_id}"
        );
        Ok(Self {
            network,
            container_id,
            namespace: namespace.into(),
            name,
            result: Value::Null,
            netns_path: netns.path().display().to_string(),
            args,
            netns,
        })
    }

    pub fn call(&self) -> Call<'_> {
        Call { container_id: &self.container_id, netns: &self.netns_path, ifname: "eth0", args: &self.args }
    }

    fn address(&self, v6: bool) -> Option<IpAddr> {
        self.result["ips"].as_array()?.iter().find_map(|ip| {
            let addr: IpAddr = ip["address"].as_str()?.split('/').next()?.parse().ok()?;
            (addr.is_ipv6() == v6).then_some(addr)
        })
    }

    pub fn ipv4(&self) -> Ipv4Addr {
        match self.address(false) {
            Some(IpAddr::V4(a)) => a,
            _ => panic!("pod has no IPv4 address in {}", self.result),
        }
    }

    pub fn ipv6(&self) -> Ipv6Addr {
        match self.address(true) {
            Some(IpAddr::V6(a)) => a,
            _ => panic!("pod has no IPv6 address in {}", self.result),
        }
    }

    /// Runs DEL now (the drop's DEL then finds nothing to do, as DEL is idempotent).
    pub fn del(&self) -> Result<(), CniFailure> {
        self.network.del(&self.call())
    }

    /// `nft list table inet cnimesh` inside the pod; `None` only when the table does not exist
    /// (any other failure, e.g. a missing `nft`, panics rather than passing as "no table").
    pub fn nft_table(&self) -> Option<String> {
        self.netns.nft_table()
    }
}

impl Drop for Pod<'_> {
    fn drop(&mut self) {
        let _ = self.network.del(&self.call());
    }
}

/// `nft list` output with every counter reset to zero, for comparison with documentation.
pub fn zero_counters(listing: &str) -> String {
    let mut out = String::with_capacity(listing.len());
    let mut zero_next = false;
    for (i, word) in listing.split(' ').enumerate() {
        if i > 0 {
            out.push(' ');
        }
        let digits = word.chars().take_while(char::is_ascii_digit).count();
        if zero_next && digits > 0 {
            out.push('0');
            out.push_str(&word[digits..]);
        } else {
            out.push_str(word);
        }
        zero_next = word == "packets" || word == "bytes";
    }
    out
}
