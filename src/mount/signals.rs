//! The signals that end a mount (SIGINT, SIGTERM, SIGHUP): blocked in every thread, then taken by
//! one thread that waits for them and unmounts; while the checkpoint opens (nothing mounted yet),
//! taken by a watcher that ends the process at once, saying why ([`interruptible`], [`exit_saying`]).

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

/// The name of a signal of [`SIGNALS`] as a message says it: `SIGTERM`; another's number.
pub fn signal_name(signal: libc::c_int) -> String {
    match signal {
        libc::SIGINT => "SIGINT".to_string(),
        libc::SIGTERM => "SIGTERM".to_string(),
        libc::SIGHUP => "SIGHUP".to_string(),
        other => format!("signal {other}"),
    }
}

/// Writes `line` and a newline to `fd`, then ends the process with `status` at once (`_exit`),
/// from any thread: for a signal that stops the opening. No destructor, `atexit` handler or
/// buffer flush runs, so nothing waits on the state another thread left half-changed (the opening
/// may be inside TLS, a lock of the runtime, a thread-local's destructor); `std::process::exit`
/// would run them on this thread while the opening goes on in another. `fd` is a pipe, a terminal
/// or a file; the line is written whole (a `write` again after EINTR or a short one), or as much of
/// it as `fd` takes. Only then is `logged` given to the log and the logger flushed, on a thread of
/// its own given [`LAST_LOG_WAIT`]: a log file on a stuck filesystem delays the exit by that much
/// at most, and never the line the waiting parent prints.
pub fn exit_saying(fd: std::os::fd::BorrowedFd<'_>, line: &str, logged: Option<String>, status: u8) -> ! {
    use std::os::fd::AsRawFd;
    let text = format!("{line}\n");
    let mut rest = text.as_bytes();
    while !rest.is_empty() {
        // SAFETY: writing at most `rest.len()` bytes from a live slice to a descriptor the caller lends.
        let n = unsafe { libc::write(fd.as_raw_fd(), rest.as_ptr().cast(), rest.len()) };
        if n < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
            continue;
        }
        if n <= 0 {
            break;
        }
        rest = &rest[n as usize..];
    }
    let (done, logged_in_time) = std::sync::mpsc::channel();
    let logging = std::thread::Builder::new().name("last-log".into()).spawn(move || {
        if let Some(logged) = logged {
            log::warn!("{logged}");
        }
        log::logger().flush();
        let _ = done.send(());
    });
    if logging.is_ok() {
        let _ = logged_in_time.recv_timeout(LAST_LOG_WAIT);
    }
    // SAFETY: _exit ends the process without running any user-space code; always sound.
    unsafe { libc::_exit(status.into()) }
}

/// How long [`exit_saying`] waits for its last log line to be written before it exits anyway.
pub const LAST_LOG_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// Runs `opening` (nothing is mounted while it runs) so that SIGINT, SIGTERM or SIGHUP still end
/// the process: they are blocked in every thread (see [`block_signals`]), so a watcher thread
/// waits for one of them on a signalfd beside `opening` and calls `on_signal` (which must end the
/// process, with [`exit_saying`]) if one comes; once `opening` returns, the watcher is woken
/// through an eventfd and ends without taking any signal, which the serving thread then takes as
/// usual. A slow or stuck open
/// (a hard NFS mount, a credential helper that hangs) is so never beyond Ctrl-C or `kill`.
pub fn interruptible<T>(opening: impl FnOnce() -> T, on_signal: impl FnOnce(libc::c_int) + Send + 'static) -> T {
    let set = signal_set();
    // SAFETY: set is initialised; signalfd and eventfd return new descriptors or -1.
    let (signals, wake) = unsafe { (libc::signalfd(-1, &set, libc::SFD_CLOEXEC), libc::eventfd(0, libc::EFD_CLOEXEC)) };
    if signals < 0 || wake < 0 {
        // SAFETY: closing only descriptors made above.
        unsafe {
            if signals >= 0 {
                libc::close(signals);
            }
            if wake >= 0 {
                libc::close(wake);
            }
        }
        log::debug!("no signal watcher while opening: {}", std::io::Error::last_os_error());
        return opening();
    }
    // SAFETY: both descriptors were just made and are owned here alone.
    let (signals, wake) = unsafe {
        use std::os::fd::FromRawFd;
        (std::os::fd::OwnedFd::from_raw_fd(signals), std::os::fd::OwnedFd::from_raw_fd(wake))
    };
    let watch = {
        use std::os::fd::AsRawFd;
        let (signal_fd, wake_fd) = (signals.as_raw_fd(), wake.as_raw_fd());
        std::thread::Builder::new().name("stfs-opening".into()).spawn(move || {
            let mut fds = [
                libc::pollfd { fd: signal_fd, events: libc::POLLIN, revents: 0 },
                libc::pollfd { fd: wake_fd, events: libc::POLLIN, revents: 0 },
            ];
            loop {
                // SAFETY: fds is a valid array of two pollfds for the duration of the call.
                let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
                if n < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                if fds[1].revents != 0 || n < 0 {
                    return;
                }
                if fds[0].revents != 0 {
                    // SAFETY: info is a zeroed signalfd_siginfo we own, read into whole.
                    let mut info: libc::signalfd_siginfo = unsafe { std::mem::zeroed() };
                    let size = std::mem::size_of::<libc::signalfd_siginfo>();
                    // SAFETY: reading at most `size` bytes into `info`.
                    let got = unsafe { libc::read(signal_fd, (&mut info as *mut libc::signalfd_siginfo).cast(), size) };
                    if got == size as isize {
                        on_signal(info.ssi_signo as libc::c_int);
                        return;
                    }
                }
            }
        })
    };
    let result = opening();
    if let Ok(watch) = watch {
        use std::os::fd::AsRawFd;
        let one: u64 = 1;
        // SAFETY: writing 8 bytes from `one` to the eventfd we own.
        unsafe { libc::write(wake.as_raw_fd(), (&one as *const u64).cast(), 8) };
        let _ = watch.join();
    }
    drop((signals, wake));
    result
}
