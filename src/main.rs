//! The `stfs` binary: parse the command line, run it, turn the result into an exit status.

use std::process::ExitCode;

fn main() -> ExitCode {
    // Before anything here opens a descriptor: which ones the caller passed down.
    stfs::mount::daemon::note_inherited_descriptors();
    let args = std::env::args_os().collect();
    // The arguments are copied: clear header values and URL queries from what `ps` shows (the
    // background daemon is a fork of this process and would show them for the life of the mount).
    match stfs::cli::scrub::hide_secret_arguments() {
        Ok(found) if found.header => eprintln!(
            "stfs: warning: a header value on the command line was visible to other users until now; \
             use --header-file or STFS_HEADER_* variables"
        ),
        Ok(_) => {}
        Err(e) => eprintln!("stfs: warning: could not clear secrets from the command line: {e}"),
    }
    // Not `Cli::parse()`: the binary also answers as mount(8)'s helper, told apart by its arguments.
    stfs::cli::run_args(args)
}
