//! `cnimesh-proxy`: the sidecar data-plane proxy.
//!
//! Only the skeleton exists so far, so that the workspace layout is fixed and every crate is built
//! and linted from day one. Its behaviour arrives with its own issue.

fn main() {
    eprintln!("cnimesh-proxy {}: the sidecar data-plane proxy; not implemented yet", env!("CARGO_PKG_VERSION"));
    std::process::exit(2);
}
