//! `cnimesh-control`: see the library.

/// jemalloc with background threads, as the proxy: every pod can reach the gRPC port, and after
/// a burst of streams (a flood, or a mass restart of proxies) glibc's heap stays at its peak,
/// while jemalloc's background thread purges the freed pages. Measured by
/// tests/tests/attack_control_plane.rs (RSS after a stream flood).
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> std::process::ExitCode {
    cnimesh_control::cli::main()
}
