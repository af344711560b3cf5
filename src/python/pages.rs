//! Mapped pages taken into this process's page tables ahead of their reader ([`fault_in`]).

use pyo3::prelude::*;

use super::buffers::held_buffers;

/// Reads one byte every `stride` bytes of `buffer[start..end]` (a mapping of a file in the page
/// cache, writable as a private mapping is, held exported meanwhile), the GIL released, so that
/// each fault maps the cached pages around it (a whole 2 MiB folio, or the kernel's fault-around
/// window of small ones) into this process before the caller's first touch does. A fault takes only its mapping's own lock, where
/// `MADV_POPULATE_READ` holds the process's memory-map lock and stalls every other thread's `mmap`
/// meanwhile. The bytes are read, never written.
#[pyfunction]
pub fn fault_in(py: Python<'_>, buffer: &Bound<'_, PyAny>, start: usize, end: usize, stride: usize) -> PyResult<()> {
    // Checked to hold `end` bytes (ValueError otherwise), and held exported until this returns.
    let held = held_buffers(py, &[(buffer.clone(), end)])?;
    let base = held.addresses[0];
    if stride == 0 || start >= end {
        return Ok(());
    }
    py.allow_threads(|| {
        for at in (start..end).step_by(stride) {
            // SAFETY: `at` lies inside the buffer, which `held` keeps exported (alive, unmoved)
            // until this returns; a volatile read so the touch is not optimised away.
            unsafe { std::ptr::read_volatile((base + at) as *const u8) };
        }
    });
    Ok(())
}
