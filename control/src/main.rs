//! `cnimesh-control`: see the library.

fn main() -> std::process::ExitCode {
    cnimesh_control::cli::main()
}
