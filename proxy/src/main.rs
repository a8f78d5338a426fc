//! `cnimesh-proxy`: see the library. Configuration comes from `CNIMESH_PROXY_*` variables.

fn main() -> std::process::ExitCode {
    cnimesh_proxy::cli::main()
}
