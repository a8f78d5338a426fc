//! `cnimesh-node`: see the library's `cli` module.

fn main() -> std::process::ExitCode {
    cnimesh_node::cli::main()
}
