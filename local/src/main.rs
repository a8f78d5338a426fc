//! `cnimesh-local`: see the library's `cli` module.

fn main() -> std::process::ExitCode {
    cnimesh_local::cli::main()
}
