//! `cnimesh-proxy`: see the library. Configuration comes from `CNIMESH_PROXY_*` variables (or the
//! flags of the same names, `--help`).

/// jemalloc with background threads rather than glibc malloc: after a burst of connections
/// glibc's heap stays at its peak (freed chunks below live ones are never returned), while
/// jemalloc's background thread purges freed pages. Measured by tests/benches/proxy.rs (RSS 60 s
/// after 1000 connections); mimalloc did not help there.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> std::process::ExitCode {
    cnimesh_proxy::app::cli::main()
}
