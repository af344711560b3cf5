//! `stfs._native.main`: the `stfs` command run inside the extension, for the console script the
//! wheel puts on PATH (one wheel holds an extension or a binary, not both: pyproject.toml).

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::process::ExitCode;

use pyo3::prelude::*;

/// Runs the command line `argv` (`argv[0]` included) as the `stfs` binary would and ends the
/// process with its exit status; it never returns to Python. `stfs mount` forks its daemon from
/// here: the daemon runs this same call, never Python, and ends the same way.
///
/// The process is first made the binary's: the descriptors Python opened are noted as inherited
/// (the daemon closes them), and SIGINT and SIGXFSZ get their default actions back (Python sets
/// its own, which would leave a Ctrl-C waiting for a return to Python that never comes).
#[pyfunction]
pub fn main(py: Python<'_>, argv: Vec<Vec<u8>>) -> PyResult<()> {
    crate::mount::daemon::note_inherited_descriptors();
    for signal in [libc::SIGINT, libc::SIGXFSZ] {
        // SAFETY: restoring a signal's default action has no preconditions.
        unsafe { libc::signal(signal, libc::SIG_DFL) };
    }
    let args: Vec<OsString> = argv.into_iter().map(OsString::from_vec).collect();
    let code = py.allow_threads(|| crate::cli::run_args(args));
    std::process::exit(exit_status(code))
}

/// The number an [`ExitCode`] stands for (std gives no accessor; every code is one of a `u8`).
fn exit_status(code: ExitCode) -> i32 {
    (0..=u8::MAX).find(|&n| ExitCode::from(n) == code).map_or(1, i32::from)
}
