//! `cnimesh-control`, built inside this package so tests always run a binary from the current
//! sources (`CARGO_BIN_EXE_cnimesh-control-e2e`). Same entry point, and the same allocator, as the
//! real one (the attack tests measure its memory).

#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> std::process::ExitCode {
    cnimesh_control::cli::main()
}
