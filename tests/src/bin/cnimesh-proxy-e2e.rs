//! The `cnimesh-proxy` sidecar, built inside this package so tests and benches always run a binary
//! from the current sources (`CARGO_BIN_EXE_cnimesh-proxy-e2e`). Same entry point as the real one.

fn main() -> std::process::ExitCode {
    cnimesh_proxy::app::cli::main()
}
