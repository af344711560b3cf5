//! One ring thread: its own io_uring with one entry (a header buffer and a payload buffer) on
//! queue `qid`. It registers the entry, then loops: a completion brings a request, which goes
//! to the session's filesystem through fuser's [`Dispatcher`]; the reply is committed with the
//! next fetch in one submission. One entry per thread, so that a request that waits (a remote
//! store) holds up no other request queued behind it on the same thread. A handler that panics
//! is caught here: its request is answered EIO and committed, and the entry serves on.
//!
//! The kernel gives a request only to the queue of the CPU it was made on, so a queue left without
//! an entry strands that CPU's requests until unmount. A thread therefore keeps its entry with the
//! kernel while the connection lives: a wait that fails is tried again (at once for EINTR and its
//! like, after a growing pause otherwise), a full submission queue is flushed before the next
//! push, and a COMMIT_AND_FETCH the kernel refuses is followed by a fresh REGISTER of the entry.
//! Where that cannot be done (waits failing for [`GIVE_UP_AFTER`], the entry refused again, a
//! reply that cannot be queued) the connection is ended ([`end_connection`]): every request then
//! fails at once, and none waits.
//!
//! The buffers are never freed: the kernel keeps their addresses until its own teardown of the
//! ring, which may end after this thread; they are bounded (the `uring` module doc) and live as long as
//! the session, which the process does not outlive. [`Shared`] is what the threads of a mount
//! share: which queues have an entry, for stats.json.

use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use io_uring::{cqueue, squeue, types, IoUring};
use log::{debug, warn};

use super::abi::{self, InHeader, ReqHeader, IN_HEADER_BYTES, OP_IN_BYTES, OUT_HEADER_BYTES};
use super::answer::Answer;
use super::ending::end_connection;
use super::fault::WaitFault;
use crate::stats::Stats;
use crate::util::lock;

/// How long a thread waits for a completion before it looks whether the session ended.
const POLL: Duration = Duration::from_secs(1);
/// How long a thread waits after its REGISTER for the kernel to refuse it, before it counts the
/// entry as registered.
const REFUSAL_WAIT: Duration = Duration::from_millis(20);
/// REGISTERs answered EAGAIN (the kernel has not finished the handshake) are retried this many
/// times, 10 ms apart.
const AGAIN_TRIES: u32 = 200;
/// The pause after a wait that failed; it doubles with each failure in a row, up to
/// [`RETRY_PAUSE_MOST`].
const RETRY_PAUSE_LEAST: Duration = Duration::from_millis(10);
/// The longest pause between two waits that fail.
const RETRY_PAUSE_MOST: Duration = Duration::from_millis(500);
/// Waits that keep failing for this long mean the thread's ring cannot be used: the connection
/// is ended.
const GIVE_UP_AFTER: Duration = Duration::from_secs(3);
/// Fresh REGISTERs one thread may make after the kernel refused its COMMIT_AND_FETCH; one more
/// refusal ends the connection.
const MOST_REGISTERS_AGAIN: u32 = 16;
/// Tries at queueing one submission, each after submitting what fills the queue.
const PUSH_TRIES: u32 = 8;
/// How long [`Queue::refuse`] waits for the kernel's answer to its malformed REGISTER.
const REFUSAL_ANSWER_WAIT: Duration = Duration::from_secs(1);
/// `user_data` of the entry's REGISTER and COMMIT_AND_FETCH.
const ENTRY: u64 = 0;
/// `user_data` of a malformed REGISTER ([`Queue::refuse`]).
const REFUSAL: u64 = 1;

/// The io_uring one thread uses: 128-byte SQEs for the command area.
pub type Ring = IoUring<squeue::Entry128, cqueue::Entry>;

/// Shared by the ring threads of a mount: which queues have an entry with the kernel, and whether
/// the ring was refused, for stats.json (`io_uring_enabled`).
pub struct Shared {
    stats: Arc<Stats>,
    payload_bytes: usize,
    threads: usize,
    /// Entries with the kernel, by queue.
    live: Vec<AtomicUsize>,
    registered: AtomicUsize,
    refused: AtomicBool,
    /// Held while `io_uring_enabled` is worked out and stored, so that the last word stands.
    showing: Mutex<()>,
}

impl Shared {
    /// For `threads` ring threads on `queues` queues with payload buffers of `payload_bytes`,
    /// counting into `stats`.
    pub fn new(stats: Arc<Stats>, payload_bytes: usize, threads: usize, queues: usize) -> Shared {
        Shared {
            stats,
            payload_bytes,
            threads,
            live: (0..queues).map(|_| AtomicUsize::new(0)).collect(),
            registered: AtomicUsize::new(0),
            refused: AtomicBool::new(false),
            showing: Mutex::new(()),
        }
    }

    /// An entry of queue `qid` is with the kernel.
    fn registered(&self, qid: u16) {
        if let Some(live) = self.live.get(usize::from(qid)) {
            live.fetch_add(1, Relaxed);
        }
        if self.registered.fetch_add(1, Relaxed) + 1 == self.threads {
            debug!(
                "FUSE over io_uring on: {} ring threads, one entry each, payload buffers of {} KiB",
                self.threads,
                self.payload_bytes >> 10
            );
        }
        self.show();
    }

    /// An entry of queue `qid` is no longer with the kernel (it is registered again, or the
    /// connection ends).
    fn lost(&self, qid: u16) {
        if let Some(live) = self.live.get(usize::from(qid)) {
            live.fetch_sub(1, Relaxed);
        }
        self.show();
    }

    /// The kernel refused the first REGISTER of one of queue `qid`'s threads, which ends. Only the
    /// ring of this thread is refused: the kernel takes the connection's ring once every queue has
    /// an entry, whichever threads registered them, and keeps it (a later thread refused while the
    /// other entries serve changes nothing), so `io_uring_enabled` goes on following the entries.
    pub fn entry_refused(&self, qid: u16, why: &io::Error) {
        debug!(
            "FUSE over io_uring: a REGISTER of queue {qid} refused ({why}): its thread ends; requests go through \
             /dev/fuse unless every queue has an entry"
        );
        self.show();
    }

    /// The kernel (or this process) refused the ring: requests go through /dev/fuse.
    pub fn refused(&self, why: &str) {
        if !self.refused.swap(true, Relaxed) {
            debug!("FUSE over io_uring refused ({why}): requests go through /dev/fuse");
        }
        self.show();
    }

    /// `io_uring_enabled`: 1 while the ring was not refused and every queue has an entry (the
    /// kernel takes the ring only then, and a queue without one strands its CPU's requests).
    fn show(&self) {
        let _showing = lock(&self.showing);
        let on = !self.refused.load(Relaxed) && self.live.iter().all(|n| n.load(Relaxed) > 0);
        self.stats.io_uring_enabled.store(u64::from(on), Relaxed);
    }
}

/// One ring thread's state.
pub struct Queue {
    ring: Ring,
    pub qid: u16,
    /// The failing waits a test asked for (debug builds only).
    fault: Option<WaitFault>,
}

/// What the thread is waiting for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// The answer to its REGISTER: a refusal comes at once.
    Registering,
    /// Requests.
    Serving,
}

/// The entry's buffers: the header, the payload, and the two iovecs that name them to the kernel.
/// Never freed (module doc).
struct Buffers {
    header: *mut ReqHeader,
    payload: *mut u8,
    iovecs: *const libc::iovec,
}

impl Buffers {
    /// Buffers with a payload of `capacity` bytes.
    fn new(capacity: usize) -> Buffers {
        let header: *mut ReqHeader = Box::into_raw(Box::<ReqHeader>::default());
        let payload: *mut u8 = Box::into_raw(vec![0u8; capacity].into_boxed_slice()).cast();
        let iovecs: *mut [libc::iovec; 2] = Box::into_raw(Box::new([
            libc::iovec { iov_base: header.cast(), iov_len: std::mem::size_of::<ReqHeader>() },
            libc::iovec { iov_base: payload.cast(), iov_len: capacity },
        ]));
        Buffers { header, payload, iovecs: iovecs.cast() }
    }
}

/// Whether a completion's error says the connection ended (unmounted, aborted, the ring torn
/// down): the thread ends with it.
fn connection_ended(errno: i32) -> bool {
    matches!(errno, libc::ENOTCONN | libc::ECONNABORTED | libc::ECANCELED)
}

impl Queue {
    /// The thread of queue `qid`, on `ring`.
    pub fn new(ring: Ring, qid: u16) -> Queue {
        Queue { ring, qid, fault: WaitFault::for_queue(qid) }
    }

    /// Serves requests until the connection ends (or the kernel refuses the ring).
    pub fn run<FS: fuser::Filesystem>(mut self, dispatcher: fuser::Dispatcher<FS>, shared: Arc<Shared>) {
        pin_to_cpu(self.qid);
        let qid = self.qid;
        let capacity = shared.payload_bytes;
        let buffers = Buffers::new(capacity);
        // Open as long as the dispatcher lives.
        let fd = types::Fd(dispatcher.device().as_raw_fd());
        let register = abi::register(fd, qid, buffers.iovecs, ENTRY);
        let mut request = Vec::with_capacity(IN_HEADER_BYTES + OP_IN_BYTES + 4096);
        if let Err(e) = self.push(&register) {
            shared.refused(&format!("queue {qid}: {e}"));
            return;
        }
        let mut phase = Phase::Registering;
        // EAGAINs answered to this REGISTER, and REGISTERs made again after a refused reply.
        let (mut again, mut registers_again) = (0, 0);
        loop {
            let wait = if phase == Phase::Registering { REFUSAL_WAIT } else { POLL };
            let res = match self.wait_for_entry(wait, &dispatcher) {
                Ok(Some(res)) => res,
                Ok(None) => {
                    if phase == Phase::Registering {
                        phase = Phase::Serving;
                        self.serving(&shared);
                    }
                    if dispatcher.session_ended() {
                        return;
                    }
                    continue;
                }
                Err(why) => end_connection(qid, &why),
            };
            if res == -libc::EAGAIN && phase == Phase::Registering && again < AGAIN_TRIES {
                again += 1;
                std::thread::sleep(Duration::from_millis(10));
                if let Err(e) = self.push(&register) {
                    end_connection(qid, &format!("its REGISTER cannot be queued: {e}"));
                }
                continue;
            }
            if res < 0 {
                let e = io::Error::from_raw_os_error(-res);
                if connection_ended(-res) {
                    debug!("FUSE over io_uring, queue {qid}: {e}; the thread ends");
                    return;
                }
                match phase {
                    // The kernel held no request for this entry yet: refusing it dropped the
                    // ring for the connection (requests go through /dev/fuse), unless the
                    // handshake never ended.
                    Phase::Registering if registers_again == 0 && res != -libc::EAGAIN => {
                        shared.entry_refused(qid, &e);
                        return;
                    }
                    Phase::Registering => end_connection(qid, &format!("the kernel refused its entry: {e}")),
                    Phase::Serving => {
                        // The request named is ended by the kernel, or was gone; the entry is no
                        // longer the kernel's to give requests to: registered afresh, with the same
                        // buffers (the kernel's old entry is given no request again, and its
                        // teardown does not touch them).
                        shared.lost(qid);
                        registers_again += 1;
                        if registers_again > MOST_REGISTERS_AGAIN {
                            end_connection(
                                qid,
                                &format!("the kernel refused {registers_again} replies, the last: {e}"),
                            );
                        }
                        warn!("FUSE over io_uring, queue {qid}: the kernel refused a reply ({e}); registering the entry again");
                        if let Err(e) = self.push(&register) {
                            end_connection(qid, &format!("its REGISTER cannot be queued: {e}"));
                        }
                        (phase, again) = (Phase::Registering, 0);
                        continue;
                    }
                }
            }
            if phase == Phase::Registering {
                phase = Phase::Serving;
                self.serving(&shared);
            }
            // SAFETY: a completion means the kernel put a request in the entry and leaves the
            // buffers to us until the COMMIT_AND_FETCH below.
            let commit_id = unsafe { serve_one(&dispatcher, buffers.header, buffers.payload, capacity, &mut request) };
            Stats::add(&shared.stats.io_uring_requests, 1);
            if let Err(e) = self.push(&abi::commit_and_fetch(fd, qid, commit_id, ENTRY)) {
                end_connection(qid, &format!("the reply to request {commit_id} cannot be queued: {e}"));
            }
        }
    }

    /// The entry is registered: requests may come.
    fn serving(&mut self, shared: &Shared) {
        shared.registered(self.qid);
        if let Some(fault) = &mut self.fault {
            fault.arm();
        }
    }

    /// Submits what is queued and waits up to `timeout` for the entry's completion: its result,
    /// or None if none came. A wait that fails is tried again after a pause, until it has failed
    /// for [`GIVE_UP_AFTER`] (the error, worded for the log) or the session ends (None).
    fn wait_for_entry<FS: fuser::Filesystem>(
        &mut self,
        timeout: Duration,
        dispatcher: &fuser::Dispatcher<FS>,
    ) -> Result<Option<i32>, String> {
        let mut failing: Option<(Instant, Duration)> = None;
        loop {
            let waited = self.wait(timeout);
            // A completion that came is served, whatever the wait says.
            if let Some(res) = self.entry_completion() {
                return Ok(Some(res));
            }
            let Err(e) = waited else { return Ok(None) };
            let (since, pause) = match failing {
                None => {
                    warn!("FUSE over io_uring, queue {}: waiting for requests failed: {e}; waiting again", self.qid);
                    (Instant::now(), RETRY_PAUSE_LEAST)
                }
                Some((since, pause)) => (since, (pause * 2).min(RETRY_PAUSE_MOST)),
            };
            if since.elapsed() >= GIVE_UP_AFTER {
                return Err(format!("waiting for requests has failed for {} s: {e}", GIVE_UP_AFTER.as_secs()));
            }
            if dispatcher.session_ended() {
                return Ok(None);
            }
            std::thread::sleep(pause);
            failing = Some((since, pause));
        }
    }

    /// The result of the entry's completion, if one came (others are passed over).
    fn entry_completion(&mut self) -> Option<i32> {
        self.ring.completion().find(|c| c.user_data() == ENTRY).map(|c| c.result())
    }

    /// Makes the kernel drop the ring for the connection with a malformed REGISTER (one iovec
    /// where two are due): it answers EINVAL and lets the requests it holds through /dev/fuse.
    /// The iovecs live until that answer came (the kernel may issue the REGISTER after the
    /// submission returns), for at most [`REFUSAL_ANSWER_WAIT`]; without an answer by then they
    /// are never freed. Returns the kernel's answer (a negative errno), if it came in time.
    pub fn refuse(&mut self, device: RawFd) -> Option<i32> {
        let iovecs = Box::new([libc::iovec { iov_base: std::ptr::null_mut(), iov_len: 0 }; 2]);
        let sqe = abi::with_len(abi::register(types::Fd(device), self.qid, iovecs.as_ptr(), REFUSAL), 1);
        let deadline = Instant::now() + REFUSAL_ANSWER_WAIT;
        let mut answer = None;
        if self.push(&sqe).is_ok() {
            while answer.is_none() {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                let waited = self.wait(left);
                answer = self.ring.completion().find(|c| c.user_data() == REFUSAL).map(|c| c.result());
                if answer.is_none() && waited.is_err() {
                    // A wait that fails at once is not tried again at once: no busy loop.
                    std::thread::sleep(RETRY_PAUSE_LEAST.min(left));
                }
            }
        }
        match answer {
            Some(res) => debug!("FUSE over io_uring: the kernel answered the refusing REGISTER with {res}"),
            None => {
                warn!("FUSE over io_uring: the kernel did not answer the refusing REGISTER in time");
                // The kernel may still read them.
                Box::leak(iovecs);
            }
        }
        answer
    }

    /// Queues `sqe` (submitted by the next wait); a full submission queue is submitted first.
    fn push(&mut self, sqe: &squeue::Entry128) -> io::Result<()> {
        for _ in 0..PUSH_TRIES {
            // SAFETY: the SQE's iovecs and buffers outlive its completion (module doc, `refuse`).
            if unsafe { self.ring.submission().push(sqe) }.is_ok() {
                return Ok(());
            }
            if let Err(e) = self.ring.submit() {
                if !matches!(e.raw_os_error(), Some(libc::EINTR | libc::EAGAIN | libc::EBUSY)) {
                    return Err(e);
                }
                std::thread::sleep(RETRY_PAUSE_LEAST);
            }
        }
        Err(io::Error::other("the submission queue stays full"))
    }

    /// Submits what is queued and waits up to `timeout` for a completion.
    fn wait(&mut self, timeout: Duration) -> io::Result<()> {
        if let Some(e) = self.fault.as_mut().and_then(WaitFault::next_wait) {
            return Err(e);
        }
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
    let mut panicked = false;
    let parsed = match op_in_len {
        Some(op_in_len) if payload_len <= capacity => {
            request.clear();
            request.extend_from_slice(&in_out[..IN_HEADER_BYTES]);
            request.extend_from_slice(&op_in[..op_in_len]);
            // SAFETY: `payload_len` <= `capacity`, and the kernel wrote that much.
            request.extend_from_slice(unsafe { std::slice::from_raw_parts(payload, payload_len) });
            // A handler that panics unwinds to here: fuser's reply, dropped on the way, answered
            // EIO into the entry (or nothing did, and the EIO below does); the entry is committed
            // and goes on serving either way, instead of the thread ending with it uncommitted.
            let dispatched = std::panic::catch_unwind(AssertUnwindSafe(|| {
                answer.dispatching(|| dispatcher.dispatch(request, Arc::clone(&answer) as Arc<dyn fuser::ReplySink>))
            }));
            dispatched.unwrap_or_else(|_| {
                warn!(
                    "FUSE over io_uring: request {} (opcode {}) panicked in its handler: answered EIO; the entry \
                     serves on",
                    head.unique, head.opcode
                );
                panicked = true;
                true
            })
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
        if parsed && !panicked {
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

/// The affinity mask of CPU `cpu` alone, laid out as the kernel reads one (bit `cpu` of an array of
/// longs) and as long as it needs: `CPU_SET`'s fixed 1,024 bits stop short on larger machines.
fn cpu_mask(cpu: usize) -> Vec<libc::c_ulong> {
    let bits = libc::c_ulong::BITS as usize;
    let mut mask = vec![0; cpu / bits + 1];
    mask[cpu / bits] = 1 << (cpu % bits);
    mask
}

/// Runs the calling thread on CPU `cpu`, where the requests of its queue come from; best effort
/// (a CPU that is possible but offline refuses it: one debug line).
fn pin_to_cpu(cpu: u16) {
    let mask = cpu_mask(usize::from(cpu));
    let bytes = std::mem::size_of_val(mask.as_slice());
    // SAFETY: the kernel reads `bytes` bytes of the live mask; it takes any length.
    if unsafe { libc::sched_setaffinity(0, bytes, mask.as_ptr().cast()) } != 0 {
        debug!("FUSE over io_uring: queue {cpu}'s thread stays unpinned: {}", io::Error::last_os_error());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cpu_mask_grows_past_cpu_setsize() {
        let bits = libc::c_ulong::BITS as usize;
        assert_eq!(cpu_mask(0), vec![1]);
        assert_eq!(cpu_mask(bits + 1), vec![0, 2]);
        let large = cpu_mask(libc::CPU_SETSIZE as usize + 5);
        assert_eq!(large.len(), libc::CPU_SETSIZE as usize / bits + 1);
        assert_eq!(large.iter().map(|w| w.count_ones()).sum::<u32>(), 1);
        assert_eq!(large[large.len() - 1], 1 << 5);
    }

    /// A ring of two entries; `None` (the test skipped, saying so) where io_uring is refused, which
    /// fails the test under `CI=true`.
    fn small_ring() -> Option<Ring> {
        match Ring::builder().build(2) {
            Ok(ring) => Some(ring),
            Err(e) if std::env::var("CI").is_ok_and(|v| v == "true") => panic!("no io_uring here: {e}"),
            Err(e) => {
                eprintln!("skipped: no io_uring here: {e}");
                None
            }
        }
    }

    /// The refusing REGISTER waits for the kernel's own answer (here, to a command on a file that
    /// takes none), not a fixed time.
    #[test]
    fn a_refusal_returns_the_kernels_answer() {
        let Some(ring) = small_ring() else { return };
        let file = tempfile::tempfile().unwrap();
        let started = Instant::now();
        let answer = Queue::new(ring, 0).refuse(file.as_raw_fd());
        assert!(answer.is_some_and(|res| res < 0), "{answer:?}");
        assert!(started.elapsed() < REFUSAL_ANSWER_WAIT);
    }

    /// A refusing REGISTER whose waits fail at once pauses between them until its bound, instead
    /// of spinning through a second of failed waits.
    #[test]
    fn a_refusal_whose_waits_fail_does_not_spin() {
        let Some(ring) = small_ring() else { return };
        let file = tempfile::tempfile().unwrap();
        let mut queue = Queue::new(ring, 0);
        queue.fault = Some(WaitFault::always());
        assert_eq!(queue.refuse(file.as_raw_fd()), None, "no wait got through to the kernel");
        let waits = queue.fault.as_ref().unwrap().failed();
        assert!(waits <= REFUSAL_ANSWER_WAIT.as_millis() as u64 / 10 + 1, "{waits} waits in a second");
    }

    /// A later thread of a queue refused its first REGISTER leaves `io_uring_enabled` as the
    /// entries are: 1 while every queue has one (the kernel keeps the ring), 0 while one lacks it.
    #[test]
    fn a_refused_register_counts_only_the_entries_it_leaves() {
        let stats = Arc::new(Stats::default());
        let shared = Shared::new(Arc::clone(&stats), 4096, 3, 2);
        shared.registered(0);
        shared.registered(1);
        shared.entry_refused(1, &io::Error::from_raw_os_error(libc::EINVAL));
        assert_eq!(stats.io_uring_enabled.load(Relaxed), 1, "queue 1's other entry still serves");
        let alone = Shared::new(Arc::clone(&stats), 4096, 2, 2);
        alone.registered(0);
        alone.entry_refused(1, &io::Error::from_raw_os_error(libc::EINVAL));
        assert_eq!(stats.io_uring_enabled.load(Relaxed), 0, "queue 1 has no entry");
    }

    /// Queue numbers past `CPU_SETSIZE` (1,024) on larger machines: no panic, and a CPU this
    /// machine lacks leaves the thread as it was.
    #[test]
    fn pinning_to_a_cpu_past_cpu_setsize_does_not_panic() {
        let pinned = std::thread::spawn(|| {
            let before = affinity();
            pin_to_cpu(1024);
            pin_to_cpu(u16::MAX);
            (before, affinity())
        });
        let (before, after) = pinned.join().expect("pin_to_cpu panicked");
        assert_eq!(before, after, "no such CPU here: the thread keeps its CPUs");
    }

    /// The calling thread's affinity mask (up to 65,536 CPUs).
    fn affinity() -> Vec<libc::c_ulong> {
        let mut mask = vec![0 as libc::c_ulong; 65536 / libc::c_ulong::BITS as usize];
        let bytes = std::mem::size_of_val(mask.as_slice());
        // SAFETY: the kernel writes at most `bytes` bytes into the live mask.
        assert!(unsafe { libc::sched_getaffinity(0, bytes, mask.as_mut_ptr().cast()) } >= 0);
        mask
    }
}
