//! The Python extension module `stfs._native` (`--features python`, built by maturin): the second
//! face of the library beside the FUSE adapter. It opens a source as `stfs mount` does
//! (`cli::unmounted`), lists its tensors and reads them through the same filesystem and engine into
//! buffers the caller owns, in this process, with no mount; and it runs the `stfs` command for the
//! wheel's console script (`command`). `python/stfs` is the Python side built on it.

mod command;
mod opened;
mod reads;

use pyo3::prelude::*;

/// The `stfs._native` module.
#[pymodule]
fn _native(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_function(wrap_pyfunction!(command::main, module)?)?;
    module.add_class::<opened::Opened>()?;
    Ok(())
}

/// `stfs.StfsError(line)`: the package's one exception class (defined in `stfs._mount`, beside the
/// mount's), so a failure here and one of the binary are caught alike.
fn stfs_error(py: Python<'_>, line: String) -> PyErr {
    let class = py.import("stfs._mount").and_then(|m| m.getattr("StfsError"));
    match class.and_then(|c| c.call1((line,))) {
        Ok(error) => PyErr::from_value(error),
        Err(e) => e,
    }
}
