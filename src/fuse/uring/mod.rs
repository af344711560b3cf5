//! FUSE over io_uring (Linux 6.14+, module parameter `fuse.enable_uring`), asked for with
//! `--io-uring`: the kernel hands requests to ring entries the daemon registered, one queue per
//! possible CPU (a request goes to the queue of the CPU that made it), and each reply is
//! committed together with the fetch of the next request, in one submission.
//!
//! The handshake stays on `/dev/fuse`: at INIT ([`negotiate`]) the adapter offers the kernel
//! FUSE_OVER_IO_URING only when the kernel offered it and the rings could be made; from then on
//! the kernel holds every new request until each queue has an entry, so the rings are made before
//! the reply, and a thread that cannot be started makes the kernel give the ring up
//! ([`UringTarget::start`]). Once every queue has an entry the ring takes the requests;
//! FORGET and INTERRUPT still come through `/dev/fuse`, whose threads keep running beside it. A
//! kernel that refuses a REGISTER drops the ring for the connection, and requests go on through
//! `/dev/fuse`: that, and a kernel that does not offer it, is one debug line, never an error.
//!
//! Threads: [`threads_per_queue`] per queue, each with its own ring and one entry ([`queue`]),
//! which it keeps with the kernel while the connection lives; one that cannot ends the connection
//! rather than strand its CPU's requests ([`ending`]). `stats.json`'s `io_uring_enabled` is 1
//! while every queue has an entry.
//! Memory: each entry has a payload buffer of the connection's largest request (1 MiB at the
//! default `fs.fuse.max_pages_limit` of 256), and the entries' buffers together stay within
//! [`PAYLOAD_BUDGET`] where one entry per queue allows it.

mod abi;
mod answer;
mod ending;
mod fault;
mod queue;

pub use answer::{current, Answer, FromFile};
pub use fault::panic_in_handler_once;

use queue::Shared;

use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use fuser::{InitFlags, KernelConfig};
use log::{debug, warn};

use crate::stats::Stats;
use crate::util::lock;

/// The most pages fuser asks the kernel for per request (its largest `max_write`, 16 MiB).
const MOST_PAGES: u32 = 4096;

/// Bytes the payload buffers of all entries may take together, where one entry per queue fits.
pub const PAYLOAD_BUDGET: usize = 64 << 20;

/// Rings made at INIT, waiting for the session to run.
pub struct Plan {
    queues: Vec<queue::Queue>,
    payload_bytes: usize,
}

/// Where the rings made at INIT wait for the session (made inside it) to start their threads.
#[derive(Clone, Default)]
pub struct UringTarget(Arc<Mutex<Option<Plan>>>);

impl std::fmt::Debug for UringTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UringTarget").field("planned", &lock(&self.0).is_some()).finish()
    }
}

impl UringTarget {
    pub(crate) fn set(&self, plan: Plan) {
        *lock(&self.0) = Some(plan);
    }

    /// Starts the ring threads, serving through `dispatcher` (whose `/dev/fuse` descriptor the
    /// entries are registered on). Nothing if INIT did not agree to the ring. A thread that
    /// cannot be started ends the ring for the connection (the kernel would otherwise hold the
    /// requests of the queue that lacks it forever).
    pub fn start<FS: fuser::Filesystem>(
        &self,
        dispatcher: fuser::Dispatcher<FS>,
        stats: Arc<Stats>,
    ) -> Vec<JoinHandle<()>> {
        let Some(plan) = lock(&self.0).take() else { return Vec::new() };
        let queues = plan.queues.iter().map(|q| usize::from(q.qid) + 1).max().unwrap_or(0);
        let shared = Arc::new(Shared::new(stats, plan.payload_bytes, plan.queues.len(), queues));
        let mut threads = Vec::with_capacity(plan.queues.len());
        let mut queues = plan.queues.into_iter();
        while let Some(q) = queues.next() {
            let (dispatcher2, shared2) = (dispatcher.clone(), Arc::clone(&shared));
            let qid = q.qid;
            let spawned =
                std::thread::Builder::new().name(format!("fuse-ring-{qid}")).spawn(move || q.run(dispatcher2, shared2));
            match spawned {
                Ok(t) => threads.push(t),
                Err(e) => {
                    warn!("FUSE over io_uring: starting a thread for queue {qid} failed: {e}");
                    shared.refused(&e.to_string());
                    // A deliberately malformed REGISTER: the kernel drops the ring for the
                    // connection and lets the held requests through /dev/fuse.
                    let fresh = || queue::Ring::builder().build(2).ok().map(|ring| queue::Queue::new(ring, qid));
                    match queues.next().or_else(fresh) {
                        Some(mut spare) => {
                            spare.refuse(dispatcher.device().as_raw_fd());
                        }
                        None => {
                            warn!("FUSE over io_uring: no ring left to end it with; requests may wait until unmount")
                        }
                    }
                    break;
                }
            }
        }
        threads
    }
}

/// Ring threads per queue for a mount of `threads` FUSE threads on `queues` queues with payload
/// buffers of `payload_bytes`: the FUSE threads spread over the queues (at least one each), fewer
/// where their buffers would pass [`PAYLOAD_BUDGET`].
pub fn threads_per_queue(threads: u32, queues: usize, payload_bytes: usize) -> usize {
    let queues = queues.max(1);
    let wanted = (threads as usize).div_ceil(queues).max(1);
    let affordable = PAYLOAD_BUDGET / (payload_bytes.max(1) * queues);
    wanted.min(affordable).max(1)
}

/// Queues the kernel makes: one per possible CPU (`/sys/devices/system/cpu/possible`, "0-7" or
/// "0-3,6"; its highest number plus one).
fn possible_cpus() -> usize {
    let text = std::fs::read_to_string("/sys/devices/system/cpu/possible").unwrap_or_default();
    let highest = text.trim().split([',', '-']).filter_map(|n| n.parse::<usize>().ok()).max();
    match highest {
        Some(h) => h + 1,
        // SAFETY: sysconf has no preconditions.
        None => usize::try_from(unsafe { libc::sysconf(libc::_SC_NPROCESSORS_CONF) }).unwrap_or(1).max(1),
    }
}

/// At INIT: offers the kernel FUSE over io_uring if `asked`, the kernel offers it, and the rings
/// can be made, with reads capped at `request_bytes` (the payload buffers' size follows the
/// connection's largest request: `max_write`, or `max_pages` of at most `limit_pages`).
/// `stats.json` says the outcome once the entries are registered (`io_uring_enabled`).
pub fn negotiate(
    asked: bool,
    threads: u32,
    request_bytes: u32,
    limit_pages: u32,
    config: &mut KernelConfig,
) -> Option<Plan> {
    if !asked {
        return None;
    }
    if !config.capabilities().contains(InitFlags::FUSE_OVER_IO_URING) {
        debug!(
            "FUSE over io_uring not offered by the kernel (module parameter fuse.enable_uring off, or a kernel \
             before 6.14): requests go through /dev/fuse"
        );
        return None;
    }
    if let Err(max) = config.set_max_write(request_bytes) {
        debug!(
            "FUSE over io_uring: the kernel refused max_write {request_bytes} ({max}): requests go through /dev/fuse"
        );
        return None;
    }
    // The kernel's payload size: max(FUSE_MIN_READ_BUFFER, max_write, max_pages pages), where
    // fuser asks for max_pages from max_write and max_readahead, and the kernel caps it.
    let page_limit = limit_pages.clamp(1, MOST_PAGES) as usize * 4096;
    let payload_bytes = abi::MIN_PAYLOAD_BYTES.max(request_bytes as usize).max(page_limit);
    let queues = possible_cpus();
    let per_queue = threads_per_queue(threads, queues, payload_bytes);
    let mut made = Vec::with_capacity(queues * per_queue);
    for qid in 0..queues {
        let Ok(qid) = u16::try_from(qid) else { break };
        for _ in 0..per_queue {
            match queue::Ring::builder().setup_coop_taskrun().build(4) {
                Ok(ring) => made.push(queue::Queue::new(ring, qid)),
                Err(e) => {
                    debug!("FUSE over io_uring: no ring ({e}): requests go through /dev/fuse");
                    return None;
                }
            }
        }
    }
    if let Err(missing) = config.add_capabilities(InitFlags::FUSE_OVER_IO_URING) {
        debug!("FUSE over io_uring: the kernel lacks {missing:?}: requests go through /dev/fuse");
        return None;
    }
    Some(Plan { queues: made, payload_bytes })
}
