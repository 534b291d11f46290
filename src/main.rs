//! `offload-operator`: the operator binary (controller and admission webhook).

// Functions fit on a screen (clippy.toml has the threshold).
#![cfg_attr(not(test), warn(clippy::too_many_lines))]
// No unwrap or expect outside tests (clippy.toml allows them there) and start-up, where each
// is allowed by name.
#![warn(clippy::unwrap_used, clippy::expect_used)]

use std::process::ExitCode;

use clap::Parser;

mod cli;

/// mimalloc, not the system allocator: the admission path allocates and frees many small JSON
/// values per request, and glibc's malloc took a third of its time (docs/benchmarks/scale.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    cli::dispatch(cli::Cli::parse())
}
