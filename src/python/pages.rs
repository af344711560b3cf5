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
/// The GIL is released for the whole walk, and only then is the calling thread put at SCHED_IDLE
/// (running only on a CPU nothing else wants), its policy put back before the GIL is taken again
/// where the kernel allows (an unprivileged thread may not leave SCHED_IDLE: it then takes the GIL
/// back once, at the end): a thread that held the GIL at SCHED_IDLE between stretches kept a
/// caller copying on every CPU waiting for it. Returns whether the walk ran (false where SCHED_IDLE
/// cannot be set: nothing is touched). Stops early once `stop` is set. A fault takes only its
/// mapping's own lock, where `MADV_POPULATE_READ` holds the process's memory-map lock and stalls
/// every other thread's `mmap` meanwhile. The bytes are read, never written.
#[pyfunction]
pub fn fault_in_idle(
    py: Python<'_>,
    buffers: Vec<(Bound<'_, PyAny>, usize)>,
    stride: usize,
    stop: &StopFlag,
) -> PyResult<bool> {
    // Checked to hold their lengths (ValueError otherwise), and held exported until this returns.
    let held = held_buffers(py, &buffers, "the mapping to fault in")?;
    let ranges: Vec<(usize, usize)> = held.addresses.iter().zip(&buffers).map(|(&a, (_, len))| (a, *len)).collect();
    let stride = stride.max(1);
    Ok(py.allow_threads(|| {
        let Some(previous) = idle_policy() else {
            return false;
        };
        'walk: for (base, len) in ranges {
            let mut at = 0;
            while at < len {
                if stop.set.load(Relaxed) {
                    break 'walk;
                }
                let end = len.min(at + STOP_CHECK_BYTES);
                while at < end {
                    // SAFETY: `at` lies inside the buffer, which `held` keeps exported (alive,
                    // unmoved) until this returns; a volatile read so the touch is not optimised away.
                    unsafe { std::ptr::read_volatile((base + at) as *const u8) };
                    at += stride;
                }
            }
        }
        previous.restore();
        true
    }))
}

/// A thread's scheduling policy and its parameter, to be put back.
struct Policy {
    policy: libc::c_int,
    param: libc::sched_param,
}

impl Policy {
    /// Puts the calling thread back under this policy (refused, and kept idle, where the kernel
    /// wants a privilege for it).
    fn restore(&self) {
        // SAFETY: 0 is the calling thread; the parameter is the one read before.
        unsafe { libc::sched_setscheduler(0, self.policy, &self.param) };
    }
}

/// Puts the calling thread at SCHED_IDLE; its policy before, or None where that cannot be done.
fn idle_policy() -> Option<Policy> {
    let mut param = libc::sched_param { sched_priority: 0 };
    // SAFETY: 0 is the calling thread; sched_getparam writes the struct it is given.
    let policy = unsafe { libc::sched_getscheduler(0) };
    // SAFETY: as above.
    if policy < 0 || unsafe { libc::sched_getparam(0, &mut param) } != 0 {
        return None;
    }
    let idle = libc::sched_param { sched_priority: 0 };
    // SAFETY: 0 is the calling thread; a valid parameter for SCHED_IDLE.
    if unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &idle) } != 0 {
        return None;
    }
    Some(Policy { policy, param })
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
