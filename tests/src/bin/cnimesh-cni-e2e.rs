//! The `cnimesh-cni` plugin, built inside this package so tests and benches always exec a binary
//! from the current sources (`CARGO_BIN_EXE_cnimesh-cni-e2e`). Same entry point as the real one.

fn main() -> std::process::ExitCode {
    cnimesh_cni::cli::main()
}
