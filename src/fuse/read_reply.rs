//! How a read reply carrying a local file's bytes reaches the kernel, decided once per request
//! ([`ReplyPath`]): read into the ring entry's payload buffer (the request came on FUSE over
//! io_uring), spliced into `/dev/fuse`, or left to fuser, which sends the slice (`writev`, or the
//! ring entry's sink). [`ReplyPath::send`] is the one place that counts what a path sent and the
//! one place that turns a backing file's failure into EIO; the adapter's `read` only answers.

use std::io;
use std::os::fd::BorrowedFd;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use log::warn;

use super::splice::{Spliced, Splicer};
use super::uring::{self, Answer, FromFile};
use crate::source::KernelBytes;
use crate::stats::Stats;

/// The way the calling thread's read reply travels.
pub enum ReplyPath<'a> {
    /// The request came from a ring entry: a file's bytes are read into its payload buffer.
    Ring(Arc<Answer>),
    /// The session splices local files' bytes into `/dev/fuse`.
    Splice(&'a Splicer),
    /// fuser sends the bytes as they are.
    Plain,
}

/// What [`ReplyPath::send`] did with a reply.
#[derive(Debug, PartialEq, Eq)]
pub enum Sent {
    /// The reply is with the kernel: nothing more goes out for this request.
    Elsewhere,
    /// The backing file failed (logged and counted): the request is answered EIO.
    Failed,
    /// Nothing went out: fuser sends the slice.
    NotYet,
}

/// What a path's attempt at sending a file's bytes came to.
enum Attempt {
    Sent,
    NotSent,
    Failed(io::Error),
}

impl<'a> ReplyPath<'a> {
    /// The path of the request this thread is serving: the ring if it came from a ring entry,
    /// else `splicer` if the session splices, else fuser's.
    pub fn of_this_request(splicer: Option<&'a Splicer>) -> ReplyPath<'a> {
        match (uring::current(), splicer) {
            (Some(answer), _) => ReplyPath::Ring(answer),
            (None, Some(splicer)) => ReplyPath::Splice(splicer),
            (None, None) => ReplyPath::Plain,
        }
    }

    /// Sends the reply to request `unique` (a read of inode `ino` at `offset`) with `data` where
    /// this path can: a file's bytes by the ring or a splice, counted in `stats`.
    pub fn send(&self, unique: u64, ino: u64, offset: u64, data: &KernelBytes<'_>, stats: &Stats) -> Sent {
        let Some((file, at)) = data.file_range() else { return Sent::NotYet };
        match self.send_file(unique, file, at, data.len(), stats) {
            Attempt::Sent => Sent::Elsewhere,
            Attempt::NotSent => Sent::NotYet,
            Attempt::Failed(e) => {
                warn!("read of inode {ino} at {offset}: the backing file: {e}");
                Stats::add(&stats.read_errors, 1);
                Sent::Failed
            }
        }
    }

    /// Replies to `unique` with `len` bytes of `file` at `at`.
    fn send_file(&self, unique: u64, file: BorrowedFd<'_>, at: u64, len: usize, stats: &Stats) -> Attempt {
        match self {
            // No splice into a ring entry: the bytes are read straight into its payload buffer.
            ReplyPath::Ring(answer) => {
                // A debug build's test hook: a handler that panics on a ring thread.
                uring::panic_in_handler_once();
                match answer.reply_from_file(file, at, len) {
                    Ok(()) => Attempt::Sent,
                    Err(FromFile::NotSent) => Attempt::NotSent,
                    Err(FromFile::Failed(e)) => Attempt::Failed(e),
                }
            }
            ReplyPath::Splice(splicer) => {
                // Counted before the reply goes out (the reader may look at stats.json as soon as
                // it has its bytes), and taken back if it does not.
                Stats::add(&stats.spliced_reads, 1);
                Stats::add(&stats.spliced_read_bytes, len as u64);
                let outcome = splicer.reply(unique, file, at, len);
                if !matches!(outcome, Spliced::Sent) {
                    stats.spliced_reads.fetch_sub(1, Relaxed);
                    stats.spliced_read_bytes.fetch_sub(len as u64, Relaxed);
                }
                match outcome {
                    Spliced::Sent => Attempt::Sent,
                    Spliced::NotSent => Attempt::NotSent,
                    Spliced::Failed(e) => Attempt::Failed(e),
                }
            }
            ReplyPath::Plain => Attempt::NotSent,
        }
    }
}
