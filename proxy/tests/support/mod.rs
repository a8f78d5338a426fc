//! What several in-process test files share.

use std::net::SocketAddr;

use cnimesh_proxy::app::admin::LogLevel;
use cnimesh_proxy::client::target::Route;
use cnimesh_proxy::client::targets::Target;
use cnimesh_proxy::serve::shared::Shared;

/// A log filter for an in-process admin server: shown, never changed.
#[allow(dead_code)]
pub struct FixedLevel;

impl LogLevel for FixedLevel {
    fn get(&self) -> String {
        "info".into()
    }
    fn set(&self, _: &str) -> Result<(), String> {
        Ok(())
    }
}

/// A pod address (TEST-NET-1, never a real one) standing for `app` on inbound: the proxy
/// refuses loopback original destinations, so in-process tests give it this one, declared as
/// the pod's own and served by `app`.
#[allow(dead_code)]
pub fn pod_addr_for(shared: &Shared, app: SocketAddr) -> SocketAddr {
    let pod: SocketAddr = SocketAddr::new("192.0.2.10".parse().unwrap(), app.port());
    shared.inbound.local_ips.declare(pod.ip());
    let route = Route::fixed(app, None, shared.config.connect_timeout);
    shared.inbound.targets.insert(pod, Target::new(route), None);
    pod
}
