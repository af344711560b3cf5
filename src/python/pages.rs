//! A file's pages and this process's page tables: whether sampled pages of a file are in the page
//! cache ([`pages_cached`]), and mapped pages taken into the page tables ahead of their reader
//! ([`fault_in`]).

use std::os::fd::BorrowedFd;

use pyo3::exceptions::PyValueError;
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

/// Whether the page holding each of `offsets` of the file open as descriptor `fd` (`size` bytes)
/// is in the page cache (`crate::source::resident::pages_resident`: mincore where the kernel tells
/// it, else one-byte reads that do not wait), the GIL released: a load's sample of 130 places
/// costs tens of µs here, where ctypes calls one by one cost 0.4 ms.
#[pyfunction]
pub fn pages_cached(py: Python<'_>, fd: i32, size: u64, offsets: Vec<u64>) -> PyResult<bool> {
    if fd < 0 {
        return Err(PyValueError::new_err("stfs: a negative file descriptor"));
    }
    // SAFETY: the caller's descriptor, open for the length of this call (Python holds it); only
    // borrowed, never closed here.
    let file = unsafe { BorrowedFd::borrow_raw(fd) };
    Ok(py.allow_threads(|| crate::source::resident::pages_resident(file, size, &offsets)))
}
