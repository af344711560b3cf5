//! The `stfs` binary: parse the command line, run it, turn the result into an exit status.

use std::process::ExitCode;

fn main() -> ExitCode {
    // Not `Cli::parse()`: the binary also answers as mount(8)'s helper, told apart by its arguments.
    stfs::cli::run_args(std::env::args_os().collect())
}
