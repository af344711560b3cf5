//! The caller's buffers a read fills, taken as Python objects ([`held_buffers`]): each checked to
//! be writable, C-contiguous and large enough, no two of one call overlapping, and each held
//! exported (so alive and unmoved) until the read ends. The native API takes no raw address.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

/// Buffers held exported for a call: their addresses stay valid while this lives.
pub struct HeldBuffers<'py> {
    /// Each buffer's address, in the order given (0 for an empty one).
    pub addresses: Vec<usize>,
    /// The exports (ctypes arrays over each buffer) that keep them alive and unmoved.
    _held: Vec<Bound<'py, PyAny>>,
}

/// Takes each `(buffer, length)`: the first `length` bytes of `buffer` (any object with the
/// buffer protocol) are to be written. ValueError names the problem: read-only, not contiguous,
/// smaller than `length`, or overlapping another buffer of the call.
pub fn held_buffers<'py>(py: Python<'py>, buffers: &[(Bound<'py, PyAny>, usize)]) -> PyResult<HeldBuffers<'py>> {
    let memoryview = py.import("builtins")?.getattr("memoryview")?;
    let ctypes = py.import("ctypes")?;
    let mut addresses = Vec::with_capacity(buffers.len());
    let mut held = Vec::with_capacity(buffers.len());
    for (buffer, length) in buffers {
        let view = memoryview.call1((buffer,))?;
        if view.getattr("readonly")?.extract::<bool>()? {
            return Err(PyValueError::new_err("stfs: the buffer to read into is read-only"));
        }
        if !view.getattr("c_contiguous")?.extract::<bool>()? {
            return Err(PyValueError::new_err("stfs: the buffer to read into is not contiguous"));
        }
        let nbytes: usize = view.getattr("nbytes")?.extract()?;
        if nbytes < *length {
            return Err(PyValueError::new_err(format!(
                "stfs: the buffer to read into holds {nbytes} bytes, fewer than the {length} to read"
            )));
        }
        if nbytes == 0 {
            addresses.push(0);
            held.push(view);
            continue;
        }
        let array = ctypes.getattr("c_char")?.call_method1("__mul__", (nbytes,))?;
        let export = array.call_method1("from_buffer", (view.call_method1("cast", ("B",))?,))?;
        addresses.push(ctypes.call_method1("addressof", (&export,))?.extract()?);
        held.push(export);
    }
    let ranges: Vec<(usize, usize)> =
        addresses.iter().zip(buffers).filter(|(_, (_, len))| *len > 0).map(|(&a, (_, len))| (a, *len)).collect();
    if overlapping(ranges) {
        return Err(PyValueError::new_err("stfs: two buffers of one read overlap"));
    }
    Ok(HeldBuffers { addresses, _held: held })
}

/// Whether any two of `(address, length)` ranges share a byte.
fn overlapping(mut ranges: Vec<(usize, usize)>) -> bool {
    ranges.sort_unstable();
    ranges.windows(2).any(|w| w[0].0.saturating_add(w[0].1) > w[1].0)
}
