//! The reply to one request taken from a ring entry: fuser's reply types write it here (as a
//! [`fuser::ReplySink`]), or a read of a local file's bytes `pread`s straight into the entry's
//! payload buffer ([`Answer::reply_from_file`]). Either way the reply lands in the entry's
//! buffers, once; the queue's thread then commits it. A reply that comes after the thread took
//! the entry back (a filesystem that answered from another thread, late) is refused, never
//! written into a buffer the kernel may be filling with the next request.

use std::cell::RefCell;
use std::io::{self, IoSlice};
use std::os::fd::{AsRawFd, BorrowedFd};
use std::sync::{Arc, Mutex};

use super::abi::{out_header, ReqHeader, OUT_HEADER_BYTES};
use crate::util::lock;

/// Where one entry's reply goes: its header buffer and payload buffer, while the request is
/// ours.
#[derive(Debug)]
struct Slot {
    /// The queue's thread has not taken the entry back yet.
    live: bool,
    header: *mut ReqHeader,
    payload: *mut u8,
    capacity: usize,
    /// Bytes of payload of the reply written, once one is.
    sent: Option<u32>,
}

// SAFETY: the pointers are only written through while `live`, under the mutex, and the queue's
// thread owns the buffers (the kernel does not touch them) until it clears `live` under the same
// mutex and commits.
unsafe impl Send for Slot {}

/// One request's reply; see the module doc.
#[derive(Debug)]
pub struct Answer {
    unique: u64,
    slot: Mutex<Slot>,
}

/// Why a reply from a file was not written.
#[derive(Debug)]
pub enum FromFile {
    /// Nothing was written (the reply is too large for the payload buffer, or already sent): the
    /// caller answers the ordinary way.
    NotSent,
    /// The file could not give the bytes (it ended early, or failed); the caller answers with an
    /// error.
    Failed(io::Error),
}

thread_local! {
    /// The answer of the request this ring thread is dispatching now.
    static CURRENT: RefCell<Option<Arc<Answer>>> = const { RefCell::new(None) };
}

/// The answer of the request the calling thread dispatches from a ring entry; None on any
/// other thread (a `/dev/fuse` thread).
pub fn current() -> Option<Arc<Answer>> {
    CURRENT.with(|c| c.borrow().clone())
}

impl Answer {
    /// The answer to request `unique`, written into `header` and `payload` (of `capacity` bytes).
    /// Both must stay valid and untouched by the kernel until [`Answer::finish`].
    pub fn new(unique: u64, header: *mut ReqHeader, payload: *mut u8, capacity: usize) -> Arc<Answer> {
        Arc::new(Answer { unique, slot: Mutex::new(Slot { live: true, header, payload, capacity, sent: None }) })
    }

    /// Runs `dispatch` with this answer as the thread's [`current`] one; the thread has none again
    /// once it returns, or unwinds (a handler that panicked).
    pub fn dispatching<T>(self: &Arc<Self>, dispatch: impl FnOnce() -> T) -> T {
        /// Clears [`CURRENT`] when dropped.
        struct Dispatched;
        impl Drop for Dispatched {
            fn drop(&mut self) {
                CURRENT.with(|c| *c.borrow_mut() = None);
            }
        }
        CURRENT.with(|c| *c.borrow_mut() = Some(Arc::clone(self)));
        let _dispatched = Dispatched;
        dispatch()
    }

    /// Takes the entry back: no reply is written after this. Returns the payload bytes of the
    /// reply written, or None if none was (the caller writes an error reply itself).
    pub fn finish(&self) -> Option<u32> {
        let mut slot = lock(&self.slot);
        slot.live = false;
        slot.sent
    }

    /// Answers with `len` bytes of `file` at `offset`, read straight into the payload buffer.
    pub fn reply_from_file(&self, file: BorrowedFd<'_>, offset: u64, len: usize) -> Result<(), FromFile> {
        let mut slot = lock(&self.slot);
        if !slot.live || slot.sent.is_some() || len > slot.capacity {
            return Err(FromFile::NotSent);
        }
        let Ok(total) = u32::try_from(OUT_HEADER_BYTES + len) else { return Err(FromFile::NotSent) };
        let mut done = 0;
        while done < len {
            let Ok(at) = libc::off_t::try_from(offset + done as u64) else { return Err(FromFile::NotSent) };
            // SAFETY: the payload buffer holds `capacity` >= `len` bytes and is ours while `live`.
            let n = unsafe { libc::pread(file.as_raw_fd(), slot.payload.add(done).cast(), len - done, at) };
            match n {
                0 => return Err(FromFile::Failed(io::Error::new(io::ErrorKind::UnexpectedEof, "the file shrank"))),
                n if n > 0 => done += n as usize,
                _ => {
                    let e = io::Error::last_os_error();
                    if e.kind() != io::ErrorKind::Interrupted {
                        return Err(FromFile::Failed(e));
                    }
                }
            }
        }
        write_header(&slot, &out_header(total, 0, self.unique));
        slot.sent = Some(len as u32);
        Ok(())
    }
}

/// Writes `header` at the start of the entry's `in_out`.
fn write_header(slot: &Slot, header: &[u8; OUT_HEADER_BYTES]) {
    // SAFETY: `in_out` has 128 bytes; the buffer is ours while `live` (checked by the callers).
    unsafe { std::ptr::copy_nonoverlapping(header.as_ptr(), (*slot.header).in_out.as_mut_ptr(), OUT_HEADER_BYTES) }
}

impl fuser::ReplySink for Answer {
    fn send(&self, data: &[IoSlice<'_>]) -> io::Result<()> {
        let mut slot = lock(&self.slot);
        if !slot.live || slot.sent.is_some() {
            return Err(io::Error::new(io::ErrorKind::NotFound, "the ring entry was already answered"));
        }
        let total: usize = data.iter().map(|d| d.len()).sum();
        let Some(body) = total.checked_sub(OUT_HEADER_BYTES).filter(|&b| b <= slot.capacity) else {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("a reply of {total} bytes")));
        };
        let mut header = [0u8; OUT_HEADER_BYTES];
        let mut at = 0;
        for piece in data {
            let mut piece: &[u8] = piece;
            if at < OUT_HEADER_BYTES {
                let n = piece.len().min(OUT_HEADER_BYTES - at);
                header[at..at + n].copy_from_slice(&piece[..n]);
                piece = &piece[n..];
                at += n;
            }
            let into = at - OUT_HEADER_BYTES.min(at);
            if !piece.is_empty() {
                // SAFETY: `into + piece.len()` <= `body` <= `capacity`; the buffer is ours while `live`.
                unsafe { std::ptr::copy_nonoverlapping(piece.as_ptr(), slot.payload.add(into), piece.len()) };
                at += piece.len();
            }
        }
        write_header(&slot, &header);
        slot.sent = Some(body as u32);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fuser::ReplySink;
    use std::os::fd::AsFd;

    fn buffers(capacity: usize) -> (Box<ReqHeader>, Vec<u8>) {
        (Box::default(), vec![0; capacity])
    }

    #[test]
    fn a_reply_in_pieces_lands_header_then_payload() {
        let (mut h, mut p) = buffers(64);
        let a = Answer::new(9, &mut *h, p.as_mut_ptr(), p.len());
        let header = out_header(16 + 5, 0, 9);
        a.send(&[IoSlice::new(&header[..10]), IoSlice::new(&header[10..]), IoSlice::new(b"ab"), IoSlice::new(b"cde")])
            .unwrap();
        assert_eq!(a.finish(), Some(5));
        assert_eq!(h.in_out[..16], header);
        assert_eq!(&p[..5], b"abcde");
    }

    #[test]
    fn a_second_or_late_or_oversized_reply_is_refused() {
        let (mut h, mut p) = buffers(4);
        let a = Answer::new(1, &mut *h, p.as_mut_ptr(), p.len());
        let header = out_header(16 + 8, 0, 1);
        assert!(a.send(&[IoSlice::new(&header), IoSlice::new(&[1; 8])]).is_err(), "larger than the buffer");
        assert!(a.send(&[IoSlice::new(&header[..8])]).is_err(), "shorter than a header");
        a.send(&[IoSlice::new(&out_header(16, -2, 1))]).unwrap();
        assert!(a.send(&[IoSlice::new(&out_header(16, 0, 1))]).is_err(), "answered twice");
        assert_eq!(a.finish(), Some(0));
        let late = Answer::new(2, &mut *h, p.as_mut_ptr(), p.len());
        assert_eq!(late.finish(), None);
        assert!(late.send(&[IoSlice::new(&out_header(16, 0, 2))]).is_err(), "after the entry was taken back");
    }

    #[test]
    fn a_dispatch_that_panics_leaves_the_thread_without_a_current_answer() {
        let (mut h, mut p) = buffers(4);
        let a = Answer::new(3, &mut *h, p.as_mut_ptr(), p.len());
        let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            a.dispatching(|| {
                assert!(current().is_some());
                panic!("a handler that panics")
            })
        }));
        assert!(unwound.is_err());
        assert!(current().is_none(), "the panicked request's answer is still the thread's current one");
    }

    #[test]
    fn a_file_reply_reads_into_the_payload_and_fails_on_a_short_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, (0..100u8).collect::<Vec<_>>()).unwrap();
        let file = std::fs::File::open(&path).unwrap();
        let (mut h, mut p) = buffers(64);
        let a = Answer::new(5, &mut *h, p.as_mut_ptr(), p.len());
        assert!(matches!(a.reply_from_file(file.as_fd(), 0, 65), Err(FromFile::NotSent)));
        a.reply_from_file(file.as_fd(), 10, 20).unwrap();
        assert_eq!(a.finish(), Some(20));
        assert_eq!(h.in_out[..16], out_header(36, 0, 5));
        assert_eq!(p[..20], (10..30u8).collect::<Vec<_>>()[..]);
        let b = Answer::new(6, &mut *h, p.as_mut_ptr(), p.len());
        assert!(matches!(b.reply_from_file(file.as_fd(), 90, 20), Err(FromFile::Failed(_))));
        assert_eq!(b.finish(), None);
    }
}
