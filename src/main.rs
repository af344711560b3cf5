//! The `stfs` binary: parse the command line, run it, turn the result into an exit status.

use std::process::ExitCode;

fn main() -> ExitCode {
    // Before anything here opens a descriptor: which ones the caller passed down.
    stfs::mount::daemon::note_inherited_descriptors();
    let args = std::env::args_os().collect();
    // Not `Cli::parse()`: the binary also answers as mount(8)'s helper, told apart by its arguments.
    // Header values and URL secrets leave the process's command line as soon as they are parsed.
    stfs::cli::run_args(args)
}
