//! Where the log goes: env_logger to stderr (the foreground) or the log file, else syslog; and
//! what never goes there: the HTTP library's trace records, which hold the wire bytes.

use log::{Level, Log, Metadata, Record};

/// Sets up env_logger: `RUST_LOG`, by default `info` into a log file (mount, unmount, final
/// counters, read failures) and `warn` on a terminal; to `log_file` if given, else to stderr.
pub fn init_logging(log_file: Option<&std::path::Path>) {
    let default = if log_file.is_some() { "stfs=info,warn" } else { "warn" };
    let mut builder = env_logger::Builder::from_env(env_logger::Env::default().default_filter_or(default));
    if log_file.is_some() {
        // The daemon's stderr already points at the log file (see daemon::daemonize).
        builder.format_timestamp_millis();
    }
    install(NoWireTrace(builder.build()));
}

/// Sets up env_logger for `-d`: debug logging of stfs to stderr (`RUST_LOG` still wins if set).
pub fn init_debug_logging() {
    let env = env_logger::Env::default().default_filter_or("stfs=debug,info");
    install(NoWireTrace(env_logger::Builder::from_env(env).format_timestamp_millis().build()));
}

/// Sets up the background daemon's log without `--log-file`: warnings and errors (`RUST_LOG`
/// still wins if set) to syslog as `stfs[PID]` (see [`crate::mount::syslog`]).
pub fn init_syslog() {
    let filter = env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).build();
    install(NoWireTrace(crate::mount::syslog::SyslogLogger::new(filter)));
}

/// Installs `logger` (once: a second call keeps the first) with its own level ceiling.
fn install<L: Log + MaxLevel + 'static>(logger: NoWireTrace<L>) {
    let max = logger.0.max_level();
    if log::set_boxed_logger(Box::new(logger)).is_ok() {
        log::set_max_level(max);
    }
}

/// The most verbose level a logger lets through.
trait MaxLevel {
    fn max_level(&self) -> log::LevelFilter;
}

impl MaxLevel for env_logger::Logger {
    fn max_level(&self) -> log::LevelFilter {
        self.filter()
    }
}

impl MaxLevel for crate::mount::syslog::SyslogLogger {
    fn max_level(&self) -> log::LevelFilter {
        self.filter()
    }
}

/// Drops the trace records of ureq and ureq-proto, whatever `RUST_LOG` asks: they dump each
/// request's bytes (`Authorization`, `x-amz-security-token`) and full URLs (presigned queries,
/// redirect `Location`s). ureq checks the trace level before logging a URL in full, so with this
/// filter its debug records show them redacted.
struct NoWireTrace<L>(L);

/// Whether a record is one of the HTTP library's wire traces.
fn is_wire_trace(metadata: &Metadata<'_>) -> bool {
    metadata.level() == Level::Trace && {
        let target = metadata.target();
        target == "ureq" || target.starts_with("ureq::") || target.starts_with("ureq_proto")
    }
}

impl<L: Log> Log for NoWireTrace<L> {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        !is_wire_trace(metadata) && self.0.enabled(metadata)
    }

    fn log(&self, record: &Record<'_>) {
        if !is_wire_trace(record.metadata()) {
            self.0.log(record);
        }
    }

    fn flush(&self) {
        self.0.flush();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_traces_are_dropped_at_any_filter() {
        let all = env_logger::Builder::new().parse_filters("trace").build();
        let logger = NoWireTrace(all);
        let at = |level, target| logger.enabled(&Metadata::builder().level(level).target(target).build());
        assert!(!at(Level::Trace, "ureq_proto::util"));
        assert!(!at(Level::Trace, "ureq::unversioned::transport::tcp"));
        assert!(!at(Level::Trace, "ureq"));
        assert!(at(Level::Debug, "ureq::pool"));
        assert!(at(Level::Trace, "stfs::source::http"));
        assert!(at(Level::Trace, "ureqx"));
    }
}
