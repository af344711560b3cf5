//! `stfs.StfsError` raised from Rust: the package's one exception class, carrying the CLI's line.

use pyo3::prelude::*;

/// `stfs.StfsError(line)`: the package's one exception class (defined in `stfs._mount`, beside the
/// mount's), so a failure here and one of the binary are caught alike.
pub fn stfs_error(py: Python<'_>, line: String) -> PyErr {
    let class = py.import("stfs._mount").and_then(|m| m.getattr("StfsError"));
    match class.and_then(|c| c.call1((line,))) {
        Ok(error) => PyErr::from_value(error),
        Err(e) => e,
    }
}
