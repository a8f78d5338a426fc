//! `cnimesh-cni`: see the library's `cli` module.

fn main() -> std::process::ExitCode {
    cnimesh_cni::cli::main()
}
