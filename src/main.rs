//! The `stfs` binary: parse the command line, run it, turn the result into an exit status.

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    stfs::cli::run(stfs::cli::Cli::parse())
}
