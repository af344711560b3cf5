//! How a command ends: its exit status, and a failure printed as the one line
//! `stfs: PATH: problem` (here and nowhere else), with the typed error behind it kept to this edge.

use std::error::Error;
use std::fmt;
use std::io::{self, Write};
use std::process::ExitCode;

use crate::format::prints_as_itself;
use crate::util::describe_io;

/// Exit status for success.
pub const EXIT_OK: u8 = 0;
/// Exit status for a runtime failure (bad file, mount or unmount failed, I/O error).
pub const EXIT_FAILURE: u8 = 1;
/// Exit status for a usage error (clap's own code): a bad flag or `-o` option alike.
pub const EXIT_USAGE: u8 = 2;
/// Exit status of mount(8)'s helper for a mount that failed: mount(8)'s own code.
pub const EXIT_HELPER_FAILURE: u8 = 32;
/// Exit status of mount(8)'s helper for a usage error, as other helpers give.
pub const EXIT_HELPER_USAGE: u8 = 1;

/// Why a command failed: what it concerns (a path, a URL, an option; none when the problem names
/// it itself) and the typed error, which stays reachable through [`Error::source`].
#[derive(Debug)]
pub struct Failure {
    context: Option<String>,
    problem: Box<dyn Error + Send + Sync + 'static>,
    /// A mistake in the command line (exit 2) rather than a failure to do what it asked (exit 1).
    usage: bool,
}

impl Failure {
    /// A failure whose problem says all (an [`crate::checkpoint::OpenError`] names its file).
    pub fn new(problem: impl Into<Box<dyn Error + Send + Sync + 'static>>) -> Failure {
        Failure { context: None, problem: problem.into(), usage: false }
    }

    /// A mistake in the command line: a bad option or argument.
    pub fn usage(problem: impl Into<Box<dyn Error + Send + Sync + 'static>>) -> Failure {
        Failure { usage: true, ..Failure::new(problem) }
    }

    /// A failure concerning `context`: printed `context: problem`.
    pub fn at(context: impl fmt::Display, problem: impl Into<Box<dyn Error + Send + Sync + 'static>>) -> Failure {
        Failure { context: Some(context.to_string()), problem: problem.into(), usage: false }
    }

    /// Whether this is a usage error.
    pub fn is_usage(&self) -> bool {
        self.usage
    }

    /// An I/O failure concerning `context`, worded as a short lower-case phrase
    /// ([`crate::util::describe_io`]): `out/w: permission denied`.
    pub fn io(context: impl fmt::Display, error: io::Error) -> Failure {
        Failure::at(context, Described(error))
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.context {
            Some(context) => write!(f, "{context}: {}", self.problem),
            None => write!(f, "{}", self.problem),
        }
    }
}

impl Error for Failure {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        Some(&*self.problem)
    }
}

/// The typed errors a command passes up with `?` as they are.
macro_rules! failure_from {
    ($($error:ty),* $(,)?) => {
        $(impl From<$error> for Failure {
            fn from(e: $error) -> Failure {
                Failure::new(e)
            }
        })*
    };
}

/// A bad flag or `-o` option is a usage error, exit 2, whichever way it was given.
impl From<crate::cli::options::ConfigError> for Failure {
    fn from(e: crate::cli::options::ConfigError) -> Failure {
        match e {
            // A header file that cannot be used is bad input, not a mistake in the command line.
            crate::cli::options::ConfigError::HeaderSource(_) => Failure::new(e),
            _ => Failure::usage(e),
        }
    }
}

failure_from!(
    crate::checkpoint::OpenError,
    crate::mount::daemon::DaemonError,
    crate::mount::session::ServeError,
    crate::tree::namespace::NameClash,
);

/// An I/O error shown as [`describe_io`] words it.
#[derive(Debug)]
struct Described(io::Error);

impl fmt::Display for Described {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&describe_io(&self.0))
    }
}

impl Error for Described {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        Some(&self.0)
    }
}

/// Turns a command's result into its exit status, printing a failure as one `stfs: ` line: 1 for
/// a failure, 2 for a usage error.
pub fn finish(result: Result<ExitCode, Failure>) -> ExitCode {
    finish_with(result, EXIT_FAILURE, EXIT_USAGE)
}

/// [`finish`] for mount(8)'s helper, with mount(8)'s codes: 32 for a failed mount, 1 for a usage
/// error.
pub fn finish_helper(result: Result<ExitCode, Failure>) -> ExitCode {
    finish_with(result, EXIT_HELPER_FAILURE, EXIT_HELPER_USAGE)
}

fn finish_with(result: Result<ExitCode, Failure>, failed: u8, usage: u8) -> ExitCode {
    match result {
        Ok(code) => code,
        Err(failure) => {
            eprintln!("{}", line(&failure));
            ExitCode::from(if failure.usage { usage } else { failed })
        }
    }
}

/// The one line a command prints for `failure`: `stfs: PATH: problem`, escaped to one line (the
/// Python module raises it as `StfsError`, word for word).
pub fn line(failure: &Failure) -> String {
    format!("stfs: {}", one_line(&failure.to_string()))
}

/// `text` with every character that does not print as itself escaped as `{:?}` escapes it (`\n`,
/// `\u{1b}`, `\u{202e}`), uncut: the last guard of the one-line promise, for a problem that quotes
/// what another program chose (a mount's source in mountinfo, a server's reason phrase). Errors
/// that show such text escape it already, and escaped text passes unchanged.
fn one_line(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if prints_as_itself(c) {
            out.push(c);
        } else {
            out.extend(c.escape_debug());
        }
    }
    out
}

/// Writes to stdout; a closed pipe (`stfs inspect x | head`) ends quietly with success.
pub fn print_out(text: &str) -> Result<ExitCode, Failure> {
    match io::stdout().lock().write_all(text.as_bytes()) {
        Ok(()) => Ok(ExitCode::SUCCESS),
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Ok(ExitCode::SUCCESS),
        Err(e) => Err(Failure::io("writing to stdout", e)),
    }
}

#[cfg(test)]
mod tests {
    use crate::cli::report::*;

    /// Whatever a problem quotes, the line printed is one line with no character that does not
    /// print as itself; text that prints as itself (non-ASCII, backslashes) is unchanged.
    #[test]
    fn the_printed_line_escapes_what_does_not_print() {
        let shown = one_line("m: tmpfs (source ev\u{1b}[31mil\nx\u{202e}y\u{9b}) caf\u{e9}e\u{301} a\\b");
        assert_eq!(shown, "m: tmpfs (source ev\\u{1b}[31mil\\nx\\u{202e}y\\u{9b}) caf\u{e9}e\u{301} a\\b");
    }

    #[test]
    fn one_line_with_its_context_and_the_cause_kept() {
        let e = Failure::io("out/w", io::Error::from_raw_os_error(libc::EACCES));
        assert_eq!(e.to_string(), "out/w: permission denied");
        let cause = e.source().and_then(Error::source).and_then(|c| c.downcast_ref::<io::Error>());
        assert_eq!(cause.and_then(io::Error::raw_os_error), Some(libc::EACCES));
        let nested = Failure::at("m.safetensors", e);
        assert_eq!(nested.to_string(), "m.safetensors: out/w: permission denied");
        assert_eq!(Failure::new(crate::mount::daemon::DaemonError::Vanished).to_string(), {
            "the mount daemon exited before the mount was ready (see --log-file)"
        });
    }
}
