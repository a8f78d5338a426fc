//! `cnimesh-proxy`: see the library. Configuration comes from `CNIMESH_PROXY_*` variables (or the
//! flags of the same names, `--help`).

fn main() -> std::process::ExitCode {
    cnimesh_proxy::cli::main()
}
