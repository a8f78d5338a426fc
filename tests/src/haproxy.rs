//! One haproxy HTTP hop in a pod: the reference the proxy benchmarks measure a cnimesh hop against.

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::netns::Netns;

/// haproxy (`mode http`, one thread, keep-alive both sides) in `netns`, listening on `listen`
/// and forwarding to `backend`; panics when haproxy is not installed (`apt-get install haproxy`).
pub fn haproxy_in(netns: &Netns, listen: SocketAddr, backend: SocketAddr) -> Child {
    let cfg = std::env::temp_dir().join(format!("cnimesh-haproxy-{}.cfg", netns.name()));
    std::fs::write(
        &cfg,
        format!(
            "global\n  maxconn 4096\n  nbthread 1\ndefaults\n  mode http\n  timeout connect 5s\n  timeout client 30s\n  timeout server 30s\n  option http-keep-alive\nfrontend f\n  bind {listen}\n  default_backend b\nbackend b\n  http-reuse always\n  server app {backend}\n"
        ),
    )
    .unwrap();
    let child = Command::new("ip")
        .args(["netns", "exec", netns.name(), "haproxy", "-db", "-f"])
        .arg(&cfg)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("haproxy starts (apt-get install haproxy)");
    std::thread::sleep(Duration::from_millis(500));
    child
}
