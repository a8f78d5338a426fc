//! `cnimesh-mirror`: see the library.

fn main() -> std::process::ExitCode {
    cnimesh_mirror::cli::main()
}
