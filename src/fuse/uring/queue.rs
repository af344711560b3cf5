//! One ring thread: its own io_uring with one entry (a header buffer and a payload buffer) on
//! queue `qid`. It registers the entry, then loops: a completion brings a request, which goes
//! to the session's filesystem through fuser's [`Dispatcher`]; the reply is committed with the
//! next fetch in one submission. One entry per thread, so that a request that waits (a remote
//! store) holds up no other request queued behind it on the same thread.
//!
//! The buffers are never freed: the kernel keeps their addresses until its own teardown of the
//! ring, which may end after this thread; they are bounded (the `uring` module doc) and live as long as
//! the session, which the process does not outlive. [`Shared`] is what the threads of a mount
//! share: whether the ring took over.

use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use io_uring::{cqueue, squeue, types, IoUring};
use log::{debug, warn};

use super::abi::{self, InHeader, ReqHeader, IN_HEADER_BYTES, OP_IN_BYTES, OUT_HEADER_BYTES};
use super::answer::Answer;
use crate::stats::Stats;

/// How long a thread waits for a completion before it looks whether the session ended.
const POLL: Duration = Duration::from_secs(1);
/// How long a thread waits after its REGISTER for the kernel to refuse it, before it counts the
/// entry as registered.
const REFUSAL_WAIT: Duration = Duration::from_millis(20);
/// REGISTERs answered EAGAIN (the kernel has not finished the handshake) are retried this many
/// times, 10 ms apart.
const AGAIN_TRIES: u32 = 200;

/// The io_uring one thread uses: 128-byte SQEs for the command area.
pub type Ring = IoUring<squeue::Entry128, cqueue::Entry>;

/// Shared by the ring threads of a mount: whether the ring took over, for stats.json.
pub struct Shared {
    stats: Arc<Stats>,
    payload_bytes: usize,
    threads: usize,
    registered: AtomicUsize,
    refused: AtomicBool,
}

impl Shared {
    /// For `threads` ring threads with payload buffers of `payload_bytes`, counting into `stats`.
    pub fn new(stats: Arc<Stats>, payload_bytes: usize, threads: usize) -> Shared {
        Shared { stats, payload_bytes, threads, registered: AtomicUsize::new(0), refused: AtomicBool::new(false) }
    }

    /// One more entry is registered; with all of them, the mount runs on the ring.
    fn registered(&self) {
        if self.registered.fetch_add(1, Relaxed) + 1 == self.threads && !self.refused.load(Relaxed) {
            self.stats.io_uring_enabled.store(1, Relaxed);
            debug!(
                "FUSE over io_uring on: {} ring threads, one entry each, payload buffers of {} KiB",
                self.threads,
                self.payload_bytes >> 10
            );
        }
    }

    /// A request came on the ring: it is on, whichever threads have registered yet (the kernel
    /// takes the ring once every CPU's queue has an entry, before the last thread registers).
    fn served(&self) {
        if self.stats.io_uring_enabled.load(Relaxed) == 0 && !self.refused.load(Relaxed) {
            self.stats.io_uring_enabled.store(1, Relaxed);
        }
    }

    /// The kernel (or this process) refused the ring: requests go through /dev/fuse.
    pub fn refused(&self, why: &str) {
        if !self.refused.swap(true, Relaxed) {
            self.stats.io_uring_enabled.store(0, Relaxed);
            debug!("FUSE over io_uring refused ({why}): requests go through /dev/fuse");
        }
    }
}

/// One ring thread's state.
pub struct Queue {
    pub ring: Ring,
    pub qid: u16,
}

/// What the thread is waiting for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// The answer to its REGISTER: a refusal comes at once.
    Registering,
    /// Requests.
    Serving,
}

impl Queue {
    /// Serves requests until the connection ends (or the kernel refuses the ring).
    pub fn run<FS: fuser::Filesystem>(mut self, dispatcher: fuser::Dispatcher<FS>, shared: Arc<Shared>) {
        pin_to_cpu(self.qid);
        let capacity = shared.payload_bytes;
        let header: *mut ReqHeader = Box::into_raw(Box::<ReqHeader>::default());
        let payload: *mut u8 = Box::into_raw(vec![0u8; capacity].into_boxed_slice()).cast();
        let iovecs: *mut [libc::iovec; 2] = Box::into_raw(Box::new([
            libc::iovec { iov_base: header.cast(), iov_len: std::mem::size_of::<ReqHeader>() },
            libc::iovec { iov_base: payload.cast(), iov_len: capacity },
        ]));
        // Open as long as the dispatcher lives.
        let fd = types::Fd(dispatcher.device().as_raw_fd());
        let register = abi::register(fd, self.qid, iovecs.cast(), 0);
        let mut request = Vec::with_capacity(IN_HEADER_BYTES + OP_IN_BYTES + 4096);
        if let Err(e) = self.push(&register) {
            shared.refused(&format!("queue {}: {e}", self.qid));
            return;
        }
        let mut phase = Phase::Registering;
        let mut again = 0;
        loop {
            let wait = if phase == Phase::Registering { REFUSAL_WAIT } else { POLL };
            match self.wait(wait) {
                Ok(()) => {}
                Err(e) => {
                    warn!("FUSE over io_uring, queue {}: waiting for requests failed: {e}", self.qid);
                    shared.refused(&e.to_string());
                    return;
                }
            }
            let Some(cqe) = self.ring.completion().next() else {
                if phase == Phase::Registering {
                    phase = Phase::Serving;
                    shared.registered();
                }
                if dispatcher.session_ended() {
                    return;
                }
                continue;
            };
            let res = cqe.result();
            if res == -libc::EAGAIN && phase == Phase::Registering && again < AGAIN_TRIES {
                again += 1;
                std::thread::sleep(Duration::from_millis(10));
                if self.push(&register).is_err() {
                    return;
                }
                continue;
            }
            if res < 0 {
                let e = io::Error::from_raw_os_error(-res);
                if phase == Phase::Registering {
                    shared.refused(&format!("registering queue {}: {e}", self.qid));
                } else {
                    // ENOTCONN or ECANCELED: the connection ended (unmounted, aborted).
                    debug!("FUSE over io_uring, queue {}: {e}; the thread ends", self.qid);
                }
                return;
            }
            if phase == Phase::Registering {
                phase = Phase::Serving;
                shared.registered();
            }
            // SAFETY: a completion means the kernel put a request in the entry and leaves the
            // buffers to us until the COMMIT_AND_FETCH below.
            let commit_id = unsafe { serve_one(&dispatcher, header, payload, capacity, &mut request) };
            Stats::add(&shared.stats.io_uring_requests, 1);
            shared.served();
            if self.push(&abi::commit_and_fetch(fd, self.qid, commit_id, 0)).is_err() {
                return;
            }
        }
    }

    /// Makes the kernel drop the ring for the connection with a malformed REGISTER (one iovec
    /// where two are due): it answers EINVAL and lets the requests it holds through /dev/fuse.
    pub fn refuse(&mut self, device: RawFd) {
        let iovecs = [libc::iovec { iov_base: std::ptr::null_mut(), iov_len: 0 }; 2];
        let sqe = abi::with_len(abi::register(types::Fd(device), self.qid, iovecs.as_ptr(), 0), 1);
        if self.push(&sqe).is_ok() {
            // The kernel reads the iovecs during the submission, which this waits for.
            let _ = self.wait(REFUSAL_WAIT);
        }
    }

    /// Queues `sqe` (submitted by the next wait).
    fn push(&mut self, sqe: &squeue::Entry128) -> io::Result<()> {
        // SAFETY: the SQE's iovecs and buffers are never freed (module doc).
        unsafe { self.ring.submission().push(sqe) }.map_err(|_| io::Error::other("the submission queue is full"))
    }

    /// Submits what is queued and waits up to `timeout` for a completion.
    fn wait(&mut self, timeout: Duration) -> io::Result<()> {
        let ts = types::Timespec::from(timeout);
        let args = types::SubmitArgs::new().timespec(&ts);
        match self.ring.submitter().submit_with_args(1, &args) {
            Ok(_) => Ok(()),
            Err(e) if matches!(e.raw_os_error(), Some(libc::ETIME | libc::EINTR | libc::EBUSY)) => Ok(()),
            Err(e) => Err(e),
        }
    }
}

/// Dispatches the request in the entry and writes its reply there (an error reply if the
/// filesystem gave none, or the request could not be read). Returns the request's commit id.
///
/// # Safety
/// The buffers must be this thread's and the kernel's request in them complete (a completion of
/// their entry came), `payload` of `capacity` bytes.
unsafe fn serve_one<FS: fuser::Filesystem>(
    dispatcher: &fuser::Dispatcher<FS>,
    header: *mut ReqHeader,
    payload: *mut u8,
    capacity: usize,
    request: &mut Vec<u8>,
) -> u64 {
    // SAFETY: per the contract, the header buffer is ours and initialised (the kernel wrote it).
    let (in_out, op_in, ent) = unsafe { ((*header).in_out, (*header).op_in, (*header).ent) };
    let head = InHeader::parse(&in_out);
    let payload_len = ent.payload_sz as usize;
    // The request as /dev/fuse gives it: the header, the operation's fixed argument (its size is
    // what the header's length leaves after the payload), then the payload.
    let op_in_len = (head.len as usize).checked_sub(IN_HEADER_BYTES + payload_len).filter(|&n| n <= OP_IN_BYTES);
    let answer = Answer::new(head.unique, header, payload, capacity);
    let parsed = match op_in_len {
        Some(op_in_len) if payload_len <= capacity => {
            request.clear();
            request.extend_from_slice(&in_out[..IN_HEADER_BYTES]);
            request.extend_from_slice(&op_in[..op_in_len]);
            // SAFETY: `payload_len` <= `capacity`, and the kernel wrote that much.
            request.extend_from_slice(unsafe { std::slice::from_raw_parts(payload, payload_len) });
            answer.dispatching(|| dispatcher.dispatch(request, Arc::clone(&answer) as Arc<dyn fuser::ReplySink>))
        }
        _ => false,
    };
    if !parsed {
        warn!(
            "FUSE over io_uring: request {} (opcode {}) of {} bytes with {payload_len} of payload is malformed",
            head.unique, head.opcode, head.len
        );
    }
    let sent = answer.finish();
    let body = sent.unwrap_or_else(|| {
        if parsed {
            warn!("FUSE over io_uring: request {} (opcode {}) got no reply in time: EIO", head.unique, head.opcode);
        }
        let h = abi::out_header(OUT_HEADER_BYTES as u32, -libc::EIO, head.unique);
        // SAFETY: the header buffer is ours (the answer was finished).
        unsafe { std::ptr::copy_nonoverlapping(h.as_ptr(), (*header).in_out.as_mut_ptr(), OUT_HEADER_BYTES) };
        0
    });
    // SAFETY: as above.
    unsafe { (*header).ent.payload_sz = body };
    ent.commit_id
}

/// Runs the calling thread on CPU `cpu`, where the requests of its queue come from; best effort
/// (a CPU that is possible but offline refuses it).
fn pin_to_cpu(cpu: u16) {
    // SAFETY: a zeroed cpu_set_t is an empty set; CPU_SET and sched_setaffinity take valid pointers.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(usize::from(cpu), &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            debug!("FUSE over io_uring: queue {cpu}'s thread stays unpinned: {}", io::Error::last_os_error());
        }
    }
}
