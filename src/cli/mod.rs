//! The command line: dispatch of the parsed arguments to one module per subcommand, and the exit
//! status. The clap definitions are in `args`, their validation in `options`, and the one-line
//! failure report in `report`; the subcommand modules use those and never this dispatch.
//!
//! Exit status: 0 success, 1 failure (bad input, mount or unmount failed, I/O), 2 usage error (a
//! bad flag or `-o` option alike); as mount(8)'s helper, mount(8)'s: 32 failure, 1 usage error.

mod args;
mod cache;
mod csi;
mod defaults;
mod extract;
mod headers;
mod helper;
mod inspect;
mod mount;
mod mount_info;
mod option_list;
mod options;
mod progress;
mod report;
pub mod scrub;
mod stats;
mod umount;
mod unprivileged;

use std::ffi::OsString;
use std::process::ExitCode;

use clap::{CommandFactory, Parser};

pub use args::{
    BadDuration, CacheAction, CacheArgs, CatArgs, Cli, Command, CsiArgs, ExtractArgs, InspectArgs, InstallHelperArgs,
    MetricsArgs, MountArgs, MountInfoArgs, RemoteArgs, StatsArgs, UmountArgs,
};
pub use options::{ConfigError, MountConfig};
pub use report::{Failure, EXIT_FAILURE, EXIT_HELPER_FAILURE, EXIT_HELPER_USAGE, EXIT_OK, EXIT_USAGE};

/// Runs the parsed command line; errors are printed as one line prefixed with `stfs: `.
pub fn run(cli: Cli) -> ExitCode {
    let result = match cli.command {
        Command::Mount(args) => option_list::with_env_lists(*args, std::env::vars_os())
            .map_err(|name| Failure::from(ConfigError::EnvOptionsNotUtf8(name)))
            .and_then(mount::run),
        Command::Umount(args) => umount::run(args),
        Command::Inspect(args) => inspect::run(args),
        Command::Stats(args) => stats::run(args),
        Command::Cache(args) => cache::run(args),
        Command::Extract(args) => extract::run_extract(args),
        Command::Cat(args) => extract::run_cat(args),
        Command::InstallHelper(args) => helper::install(args),
        Command::MountInfo(args) => mount_info::run(args),
        Command::Csi(args) => csi::run(args),
    };
    report::finish(result)
}

/// Runs a whole command line (`args[0]` included): as mount(8)'s helper when called as one (see
/// `helper`: `mount.fuse.stfs SRC MP -o OPTS`, or `stfs SRC MP -o OPTS` from fuse3's mount.fuse),
/// otherwise as the `stfs` subcommands.
pub fn run_args(args: Vec<OsString>) -> ExitCode {
    let command = Cli::command();
    let names: Vec<&str> =
        command.get_subcommands().flat_map(|c| std::iter::once(c.get_name()).chain(c.get_all_aliases())).collect();
    if helper::is_helper_call(&args, &names) {
        let call = helper::parse(args.get(1..).unwrap_or_default()).map_err(Failure::usage);
        if let Ok(call) = &call {
            hide_secrets(&scrub::Secrets::of_source_and_options(&call.source, &call.options));
        }
        return report::finish_helper(call.and_then(helper::run));
    }
    match Cli::try_parse_from(&args) {
        Ok(cli) => {
            hide_secrets(&scrub::Secrets::of_command(&cli.command));
            run(cli)
        }
        // clap's own message names no argument and runs to several lines.
        Err(e) if e.kind() == clap::error::ErrorKind::InvalidUtf8 => report::finish(Err(not_utf8(&args))),
        Err(e) => e.exit(),
    }
}

/// Clears `secrets` from what other users see of this process's command line (the background daemon
/// is a fork of this process and would show them for the life of the mount), and warns when a
/// header value was there. Called right after parsing, before any thread starts.
fn hide_secrets(secrets: &scrub::Secrets) {
    match scrub::hide_secret_arguments(secrets) {
        Ok(found) if found.header => eprintln!(
            "stfs: warning: a header value on the command line was visible to other users until now; \
             use --header-file or STFS_HEADER_* variables"
        ),
        Ok(_) => {}
        Err(e) => eprintln!("stfs: warning: could not clear secrets from the command line: {e}"),
    }
}

/// The usage failure for an argument that is not UTF-8 (a path in Latin-1): one line naming it,
/// its bytes escaped. Sources, tensor names and options are UTF-8 text to stfs.
fn not_utf8(args: &[OsString]) -> Failure {
    use std::os::unix::ffi::OsStrExt;
    let arg = args.iter().skip(1).find(|a| a.to_str().is_none()).map_or(&[][..], |a| a.as_bytes());
    let shown = arg.escape_ascii().to_string();
    Failure::usage(format!(
        "{}: not UTF-8; stfs takes paths and names in UTF-8 only (reach the file through a link whose path is UTF-8)",
        crate::format::PrintablePath(&shown)
    ))
}
