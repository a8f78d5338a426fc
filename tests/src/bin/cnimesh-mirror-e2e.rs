//! `cnimesh-mirror`, built inside this package so tests always run a binary from the current
//! sources (`CARGO_BIN_EXE_cnimesh-mirror-e2e`). Same entry point as the real one.

fn main() -> std::process::ExitCode {
    cnimesh_mirror::cli::main()
}
