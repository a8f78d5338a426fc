//! `cnimesh`, the operator's command line: see the library, `cnimesh_cli`.

fn main() -> std::process::ExitCode {
    cnimesh_cli::main()
}
