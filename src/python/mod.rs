//! The Python extension module `stfs._native` (`--features python`, built by maturin): the second
//! face of the library beside the FUSE adapter. It opens a source as `stfs mount` does
//! (`cli::unmounted`), lists its tensors and reads them through the same filesystem and engine into
//! buffers the caller owns (long runs straight from the store, the rest through the engine's
//! blocks: `plan`, `reads`), in this process, with no mount; it samples whether a file is in the
//! page cache and takes a mapped file's cached pages into the page tables ahead of their reader
//! (`pages`); and it runs the `stfs` command for the wheel's console script (`command`).
//! `python/stfs` is the Python side built on it.

mod buffers;
mod command;
mod error;
mod opened;
mod pages;
mod plan;
mod reads;

use pyo3::prelude::*;

/// The `stfs._native` module.
#[pymodule]
fn _native(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_function(wrap_pyfunction!(command::main, module)?)?;
    module.add_class::<opened::Opened>()?;
    module.add_function(wrap_pyfunction!(pages::fault_in_idle, module)?)?;
    module.add_class::<pages::StopFlag>()?;
    module.add_function(wrap_pyfunction!(pages::pages_cached, module)?)?;
    Ok(())
}
