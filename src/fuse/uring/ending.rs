//! The last resort of a ring thread that can no longer keep an entry on its queue (`queue`): the
//! kernel gives a CPU's requests to that CPU's queue only, so they would wait until unmount. The
//! daemon ends the connection instead, and says why in one error line: it exits, and the kernel,
//! as it closes the daemon's FUSE device and rings, ends every request with an error (ENOTCONN or
//! ECONNABORTED), as for a killed daemon; `stfs umount` then detaches the mount.
//!
//! Exiting is the one way that needs nothing else: `/sys/fs/fuse/connections/N/abort` needs the
//! fusectl filesystem mounted and the connection's number, and a device descriptor closed alone
//! ends nothing while the other rings' commands hold it.

/// Exit status of a daemon that ended its connection this way (`EX_SOFTWARE`).
const EXIT_STATUS: i32 = 70;

/// Ends the connection because queue `qid`'s thread cannot serve (`why`), saying so.
pub fn end_connection(qid: u16, why: &str) -> ! {
    log::error!(
        "FUSE over io_uring, queue {qid}: {why}; nothing else serves this CPU's requests, so the connection ends: \
         the daemon exits, reads fail (ENOTCONN) until `stfs umount`"
    );
    log::logger().flush();
    // SAFETY: _exit ends the process at once, running no destructor or atexit handler under the
    // threads still working (as a signal's default action would).
    unsafe { libc::_exit(EXIT_STATUS) }
}
