//! Where the log goes: env_logger to stderr (the foreground) or the log file, else syslog.

/// Sets up env_logger: `RUST_LOG`, by default `info` into a log file (mount, unmount, final
/// counters, read failures) and `warn` on a terminal; to `log_file` if given, else to stderr.
pub fn init_logging(log_file: Option<&std::path::Path>) {
    let default = if log_file.is_some() { "stfs=info,warn" } else { "warn" };
    let mut builder = env_logger::Builder::from_env(env_logger::Env::default().default_filter_or(default));
    if log_file.is_some() {
        // The daemon's stderr already points at the log file (see daemon::daemonize).
        builder.format_timestamp_millis();
    }
    let _ = builder.try_init();
}

/// Sets up env_logger for `-d`: debug logging of stfs to stderr (`RUST_LOG` still wins if set).
pub fn init_debug_logging() {
    let env = env_logger::Env::default().default_filter_or("stfs=debug,info");
    let _ = env_logger::Builder::from_env(env).format_timestamp_millis().try_init();
}

/// Sets up the background daemon's log without `--log-file`: warnings and errors (`RUST_LOG`
/// still wins if set) to syslog as `stfs[PID]` (see [`crate::mount::syslog`]).
pub fn init_syslog() {
    let filter = env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).build();
    let max = filter.filter();
    if log::set_boxed_logger(Box::new(crate::mount::syslog::SyslogLogger::new(filter))).is_ok() {
        log::set_max_level(max);
    }
}
