//! The signals that end a mount (SIGINT, SIGTERM, SIGHUP): blocked in every thread, then taken by
//! one thread that waits for them and unmounts.

/// The signals that unmount cleanly.
const SIGNALS: [libc::c_int; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

fn signal_set() -> libc::sigset_t {
    // SAFETY: sigemptyset/sigaddset initialise and fill a zeroed sigset_t we own.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in SIGNALS {
            libc::sigaddset(&mut set, s);
        }
        set
    }
}

/// Blocks SIGINT, SIGTERM and SIGHUP in the calling thread and every thread it starts afterwards,
/// so that only [`wait_for_signal`] receives them. Call before starting any thread.
pub fn block_signals() {
    let set = signal_set();
    // SAFETY: set is initialised; a null old-set pointer is allowed.
    unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
}

/// Waits for one of the blocked signals and returns its number.
pub fn wait_for_signal() -> libc::c_int {
    let set = signal_set();
    let mut sig = 0;
    // SAFETY: set is initialised and sig is a valid out-pointer.
    unsafe { libc::sigwait(&set, &mut sig) };
    sig
}
