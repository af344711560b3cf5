//! A file's pages and this process's page tables: whether sampled pages of a file are in the page
//! cache ([`pages_cached`]), and mapped pages taken into the page tables ahead of their reader, at
//! SCHED_IDLE ([`fault_in_idle`], stopped by a [`StopFlag`]).

use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use super::buffers::held_buffers;

/// Set by whoever wants [`fault_in_idle`] to stop (a failed load, the interpreter's exit): it
/// looks between two 2 MiB stretches, with no GIL to take.
#[pyclass(module = "stfs._native", frozen)]
#[derive(Default)]
pub struct StopFlag {
    set: AtomicBool,
}

#[pymethods]
impl StopFlag {
    #[new]
    fn new() -> StopFlag {
        StopFlag::default()
    }

    /// Asks the fault-in that looks at this flag to stop.
    fn set(&self) {
        self.set.store(true, Relaxed);
    }

    /// Whether it was set.
    fn is_set(&self) -> bool {
        self.set.load(Relaxed)
    }
}

/// How often [`fault_in_idle`] looks at its [`StopFlag`]: every this many bytes touched.
const STOP_CHECK_BYTES: usize = 2 << 20;

/// Reads one byte every `stride` bytes of each of `buffers` (`(mapping, length)`: private mappings
/// of files in the page cache, writable as such mappings are, held exported meanwhile), in order,
/// so that each fault maps the cached pages around it (a whole 2 MiB folio, or the kernel's
/// fault-around window of small ones) into this process before the caller's first touch does.
/// The walk runs on a thread of its own at SCHED_IDLE (running only on a CPU nothing else wants),
/// which never holds the GIL; the calling thread waits for it with the GIL released, at its own
/// policy, and so takes the GIL back at that policy. (A thread that took the GIL back at
/// SCHED_IDLE kept the caller waiting for it: CPython's holder, asked to drop the GIL, waits until
/// the asker has it, and an idle thread gets next to no CPU on a busy machine: an unprivileged
/// load beside two CPU-bound processes took 2 s where it takes 0.1 s, as an unprivileged thread
/// may not leave SCHED_IDLE.) Returns whether the walk ran (false where the thread or SCHED_IDLE
/// cannot be had: nothing is touched). Stops early once `stop` is set. A fault takes only its
/// mapping's own lock, where `MADV_POPULATE_READ` holds the process's memory-map lock and stalls
/// every other thread's `mmap` meanwhile. The bytes are read, never written.
#[pyfunction]
pub fn fault_in_idle(
    py: Python<'_>,
    buffers: Vec<(Bound<'_, PyAny>, usize)>,
    stride: usize,
    stop: &StopFlag,
) -> PyResult<bool> {
    // Checked to hold their lengths (ValueError otherwise), and held exported until this returns,
    // after the walking thread has ended.
    let held = held_buffers(py, &buffers, "the mapping to fault in")?;
    let ranges: Vec<(usize, usize)> = held.addresses.iter().zip(&buffers).map(|(&a, (_, len))| (a, *len)).collect();
    let stride = stride.max(1);
    Ok(py.allow_threads(|| {
        std::thread::scope(|scope| {
            let walk = || set_idle() && walk_touching(&ranges, stride, stop);
            let builder = std::thread::Builder::new().name("stfs-fault-in".into());
            builder.spawn_scoped(scope, walk).ok().and_then(|walker| walker.join().ok()).unwrap_or(false)
        })
    }))
}

/// Touches a byte every `stride` bytes of each of `ranges` (`(address, length)`), looking at
/// `stop` every [`STOP_CHECK_BYTES`]; true (the walk ran, to its end or to the stop).
fn walk_touching(ranges: &[(usize, usize)], stride: usize, stop: &StopFlag) -> bool {
    for &(base, len) in ranges {
        let mut at = 0;
        while at < len {
            if stop.set.load(Relaxed) {
                return true;
            }
            let end = len.min(at + STOP_CHECK_BYTES);
            while at < end {
                // SAFETY: `at` lies inside the buffer, which fault_in_idle keeps exported (alive,
                // unmoved) until this thread has ended; a volatile read so the touch is not
                // optimised away.
                unsafe { std::ptr::read_volatile((base + at) as *const u8) };
                at += stride;
            }
        }
    }
    true
}

/// Puts the calling thread at SCHED_IDLE (for good: the thread is fault_in_idle's own); whether it
/// took.
fn set_idle() -> bool {
    let idle = libc::sched_param { sched_priority: 0 };
    // SAFETY: 0 is the calling thread; a valid parameter for SCHED_IDLE.
    unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &idle) == 0 }
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
