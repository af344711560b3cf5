//! The in-memory [`Source`] the engine's unit tests read (one fake for all of them), and checks on
//! what it was asked.

use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use super::tuning::PREFETCH_CHUNK_BYTES;
use crate::source::{Source, SourceReader};
use crate::util::lock;

/// An in-memory source that logs every backing read and can be slowed down, made to fail, made to
/// read long runs in pieces (as a local file does), or made to hold its multi-block reads after
/// their first block until a gate opens.
pub(crate) struct FakeSource {
    /// The source's bytes.
    pub(crate) data: Vec<u8>,
    /// Every read, as (offset, length), in order.
    pub(crate) reads: Mutex<Vec<(u64, usize)>>,
    /// Sleep before each read.
    pub(crate) latency: Duration,
    /// The next this many reads fail with "injected failure".
    pub(crate) failures_left: AtomicUsize,
    /// Long runs are read in pieces of this many bytes (0: in one read).
    pub(crate) piece: AtomicU64,
    /// With a gate, a multi-block read hands out its first block, then waits until it is open.
    gate: Option<(Mutex<bool>, Condvar)>,
    /// Whether it says it is remote (as an HTTP or object-store source does).
    pub(crate) remote: AtomicBool,
    /// Reads running now, and the most that ever ran at once.
    in_flight: AtomicUsize,
    pub(crate) most_in_flight: AtomicUsize,
    /// After its latency, a read waits (at most [`HOLD_AT_MOST`]) until this many run at once (0:
    /// never), so the most at once counts what the engine starts together, not how the threads
    /// running them happened to be scheduled.
    pub(crate) hold_until_in_flight: AtomicUsize,
}

/// The longest a read waits for others to join it ([`FakeSource::hold_until_in_flight`]).
const HOLD_AT_MOST: Duration = Duration::from_millis(150);

impl FakeSource {
    /// A source of `data` whose reads each take `latency`.
    pub(crate) fn new(data: Vec<u8>, latency: Duration) -> Arc<FakeSource> {
        Arc::new(FakeSource::with_gate(data, latency, None))
    }

    /// A source of `data` whose multi-block reads wait after their first block until
    /// [`FakeSource::open_gate`].
    pub(crate) fn gated(data: Vec<u8>) -> Arc<FakeSource> {
        Arc::new(FakeSource::with_gate(data, Duration::ZERO, Some((Mutex::new(false), Condvar::new()))))
    }

    fn with_gate(data: Vec<u8>, latency: Duration, gate: Option<(Mutex<bool>, Condvar)>) -> FakeSource {
        let (reads, failures_left, piece) = (Mutex::new(Vec::new()), AtomicUsize::new(0), AtomicU64::new(0));
        let (remote, in_flight, most_in_flight) = (AtomicBool::new(false), AtomicUsize::new(0), AtomicUsize::new(0));
        let hold_until_in_flight = AtomicUsize::new(0);
        FakeSource {
            data,
            reads,
            latency,
            failures_left,
            piece,
            gate,
            remote,
            in_flight,
            most_in_flight,
            hold_until_in_flight,
        }
    }

    /// Lets held reads go on (and later ones through).
    pub(crate) fn open_gate(&self) {
        if let Some((open, opened)) = &self.gate {
            *lock(open) = true;
            opened.notify_all();
        }
    }

    fn wait_for_gate(&self) {
        if let Some((open, opened)) = &self.gate {
            let open = lock(open);
            let (_open, waited) = opened.wait_timeout_while(open, Duration::from_secs(5), |o| !*o).unwrap();
            assert!(!waited.timed_out(), "the gate was never opened");
        }
    }
}

/// A fake source of `len` bytes of a pattern with a long period, whose reads each take `latency`.
pub(crate) fn fake(len: usize, latency: Duration) -> Arc<FakeSource> {
    FakeSource::new((0..len).map(|i| (i * 7 + i / 251) as u8).collect(), latency)
}

/// Every backing read of `source` covers whole aligned blocks (the last one clipped at the end),
/// and at most a prefetch chunk of them.
pub(crate) fn assert_whole_blocks(source: &FakeSource, block_size: u64) {
    let len = source.data.len() as u64;
    let chunk = (PREFETCH_CHUNK_BYTES / block_size).max(1) * block_size;
    for &(offset, n) in lock(&source.reads).iter() {
        let n = n as u64;
        assert_eq!(offset % block_size, 0, "unaligned backing read at {offset}");
        assert!(n > 0 && n <= chunk, "read of {n} at {offset}");
        assert!(n % block_size == 0 || offset + n == len, "partial block read of {n} at {offset}");
    }
}

/// A reader of a [`FakeSource`].
struct FakeReader(Arc<FakeSource>);

impl Source for Arc<FakeSource> {
    fn len(&self) -> u64 {
        self.data.len() as u64
    }
    fn name(&self) -> &str {
        "fake"
    }
    fn remote(&self) -> bool {
        self.remote.load(Relaxed)
    }
    fn open_reader(&self) -> io::Result<Box<dyn SourceReader>> {
        Ok(Box::new(FakeReader(Arc::clone(self))))
    }
}

impl SourceReader for FakeReader {
    fn read_blocks_at(&mut self, bufs: Vec<Vec<u8>>, offset: u64, landed: &mut dyn FnMut(Vec<u8>)) -> io::Result<()> {
        if self.0.gate.is_some() {
            let (many, mut at) = (bufs.len() > 1, offset);
            for (i, mut buf) in bufs.into_iter().enumerate() {
                self.read_exact_at(&mut buf, at)?;
                at += buf.len() as u64;
                landed(buf);
                if i == 0 && many {
                    self.0.wait_for_gate();
                }
            }
            return Ok(());
        }
        // As a local file does: whole buffers, at most `piece` bytes per read (0: all in one).
        let piece = match self.0.piece.load(Relaxed) as usize {
            0 => usize::MAX,
            piece => piece,
        };
        crate::source::read_in_pieces(self, bufs, offset, piece, landed)
    }

    fn read_exact_at(&mut self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let fake = &self.0;
        lock(&fake.reads).push((offset, buf.len()));
        let now = fake.in_flight.fetch_add(1, Relaxed) + 1;
        fake.most_in_flight.fetch_max(now, Relaxed);
        std::thread::sleep(fake.latency);
        let held_since = std::time::Instant::now();
        while fake.in_flight.load(Relaxed) < fake.hold_until_in_flight.load(Relaxed)
            && held_since.elapsed() < HOLD_AT_MOST
        {
            std::thread::sleep(Duration::from_millis(1));
        }
        fake.in_flight.fetch_sub(1, Relaxed);
        let injected = fake.failures_left.fetch_update(Relaxed, Relaxed, |n| n.checked_sub(1));
        if injected.is_ok() {
            return Err(io::Error::other("injected failure"));
        }
        let start = offset as usize;
        let bytes = fake.data.get(start..start + buf.len()).ok_or_else(|| io::Error::other("past end"))?;
        buf.copy_from_slice(bytes);
        Ok(())
    }
}
