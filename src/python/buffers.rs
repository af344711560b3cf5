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
/// buffer protocol) are to be written, or touched as a writable private mapping is. ValueError
/// names the problem and what the buffer is for (`role`: "the buffer to read into"): read-only,
/// not contiguous, smaller than `length`, or overlapping another buffer of the call.
pub fn held_buffers<'py>(
    py: Python<'py>,
    buffers: &[(Bound<'py, PyAny>, usize)],
    role: &str,
) -> PyResult<HeldBuffers<'py>> {
    let memoryview = py.import("builtins")?.getattr("memoryview")?;
    let ctypes = py.import("ctypes")?;
    let mut addresses = Vec::with_capacity(buffers.len());
    let mut held = Vec::with_capacity(buffers.len());
    for (buffer, length) in buffers {
        let view = memoryview.call1((buffer,))?;
        if view.getattr("readonly")?.extract::<bool>()? {
            return Err(PyValueError::new_err(format!("stfs: {role} is read-only")));
        }
        if !view.getattr("c_contiguous")?.extract::<bool>()? {
            return Err(PyValueError::new_err(format!("stfs: {role} is not contiguous")));
        }
        let nbytes: usize = view.getattr("nbytes")?.extract()?;
        if nbytes < *length {
            return Err(PyValueError::new_err(format!(
                "stfs: {role} holds {nbytes} bytes, fewer than the {length} to read"
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

/// Size of a transparent huge page on x86-64 and most arm64 kernels: the alignment the advice
/// below needs to take effect.
const HUGE_PAGE: usize = 2 << 20;

/// Asks the kernel to back the not yet touched memory of `(address, length)` with transparent huge
/// pages (`MADV_HUGEPAGE` on the whole 2 MiB pages inside it): the read's first touch of fresh
/// memory then takes one fault per 2 MiB instead of one per 4 KiB (253 MiB of fresh tensors filled
/// in 0.02-0.04 s instead of 0.10-0.11 s, measured on 2026-12-02). Advice only: a refusal (memory
/// that is not anonymous, a kernel without THP) changes nothing, and the bytes are the same.
pub fn advise_huge_pages(address: usize, length: usize) {
    let start = address.next_multiple_of(HUGE_PAGE);
    let end = (address.saturating_add(length)) / HUGE_PAGE * HUGE_PAGE;
    if end > start {
        // SAFETY: madvise with MADV_HUGEPAGE changes no byte and no mapping, only how later faults
        // of the range are served; the range lies inside a buffer the caller holds exported.
        unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE) };
    }
}
