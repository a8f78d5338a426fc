//! `cnimesh-control`: the control plane (destination, identity, injection).
//!
//! Only the skeleton exists so far, so that the workspace layout is fixed and every crate is built
//! and linted from day one. Its behaviour arrives with its own issue.

fn main() {
    eprintln!(
        "cnimesh-control {}: the control plane (destination, identity, injection); not implemented yet",
        env!("CARGO_PKG_VERSION")
    );
    std::process::exit(2);
}
