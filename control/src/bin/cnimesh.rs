//! `cnimesh`, the operator's command line: see `cnimesh_control::operator`.

fn main() -> std::process::ExitCode {
    cnimesh_control::operator::main()
}
