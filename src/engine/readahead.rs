//! Sequential-stream detection and readahead windows for one stream: pure decisions, no I/O.
//!
//! A stream's [`Readahead`] remembers its *cursor* (the end of its furthest read so far), a
//! readahead *window* in blocks, and the first block it has not yet asked to prefetch. A read may
//! continue a stream ([`Readahead::distance`]) if it starts no more than [`BACK_SLACK`] before its
//! cursor or [`FORWARD_SLACK`] after it: the kernel's async readahead and mmap read-around deliver
//! one sequential reader's requests slightly out of order, and those must not look like seeks. The
//! engine's table of a source's streams (`engine::stream`) gives each read to the closest
//! confirmed stream that accepts it, else the closest new one, or starts a new one.
//!
//! A new stream ([`Readahead::start`]) is *unconfirmed* and prefetches nothing, so a random reader
//! costs no backing I/O beyond the blocks it touches; the exception is a read from the first byte
//! of a file (a tensor), how sequential readers start, which prefetches up to
//! [`FILE_START_WINDOW_BYTES`] (and at least one block per prefetch lane) at once. The next read
//! that continues a stream confirms it ([`Readahead::advance`]): the window opens at
//! [`INITIAL_WINDOW_BYTES`] (or over the rest of the file, for an exact continuation) and then
//! doubles each time the cursor enters a new block, up to [`ReadaheadConfig::max_window_blocks`]
//! (TCP slow start, as in mountpoint-s3 and hf-mount). After every read the stream asks for the
//! blocks from just past the read up to `window` blocks past the cursor's block, skipping those it
//! asked for before. Prefetch stops at the end of the file being read until the stream goes
//! straight on into the next one (a request for the next file's tail, which the kernel can send
//! before the rest of the file, counts as going on into it but leaves the cursor where it was).
//! Blocks the cursor has left [`DROP_BEHIND_SLACK`] behind are reported consumed, for the cache
//! to reuse their memory.
//!
//! Both jump-starts (the file-start prefetch and the window over the rest of the file) take a
//! read as a promise that the reader goes on through the file; an [`Extent`] says whether its
//! reads are that (a tensor file: a reader opens one to read it) or not (a tensor's bytes in the
//! re-served checkpoint file: loaders map that file and fault in a page here and there, and every
//! fault's read-around, two kernel requests back to back, takes in a tensor's start). A stream
//! reading the latter opens its window from [`INITIAL_WINDOW_BYTES`] and widens it as the reader
//! goes on.
//!
//! When the engine cannot carry out a prefetch (its queue is full, or the cache has no room that is
//! not holding unread data), it calls [`Readahead::refused`]: the window halves and the refused
//! blocks become eligible again, like mountpoint-s3 scaling down under memory pressure.
//!
//! The constants are in [`crate::engine::tuning`]; a prefetch read's size follows from the window
//! ([`chunk_blocks`]).

use std::ops::Range;

use super::tuning::{
    max_window_bytes, BACK_SLACK, CONFIRM_SLACK, DROP_BEHIND_SLACK, FILE_START_WINDOW_BYTES, FORWARD_SLACK,
    INITIAL_WINDOW_BYTES, LANES, MAX_STREAMS, MAX_WINDOW_BYTES, MIN_PREFETCH_CHUNK_BYTES, PREFETCH_CHUNK_BYTES,
    REMOTE_LANES, REMOTE_MAX_WINDOW_BYTES,
};

/// Tuning of the readahead; [`ReadaheadConfig::new`] gives the defaults.
#[derive(Debug, Clone)]
pub struct ReadaheadConfig {
    /// Block size in bytes (at least 1).
    pub block_size: u64,
    /// Largest window in blocks; 0 turns prefetch off.
    pub max_window_blocks: u64,
    /// What replaces `max_window_blocks` for a remote source ([`Source::remote`]).
    ///
    /// [`Source::remote`]: crate::source::Source::remote
    pub remote_max_window_blocks: u64,
    /// Most streams tracked per source (at least 1).
    pub max_streams: usize,
    /// Bytes before a cursor that a read may start at and still continue the stream.
    pub back_slack: u64,
    /// Bytes after a cursor that a read may start at and still continue the stream.
    pub forward_slack: u64,
    /// Bytes behind a cursor a block must end before it is reported consumed (at least the back
    /// slack is used).
    pub drop_behind_slack: u64,
    /// Bytes either side of an unconfirmed stream's cursor that a read may start at to confirm it
    /// (capped by the two slacks above).
    pub confirm_slack: u64,
    /// Window of a freshly confirmed stream, in blocks (at least 1).
    pub initial_window_blocks: u64,
    /// Blocks prefetched on a read from a file's first byte (0: none).
    pub file_start_window_blocks: u64,
    /// Prefetch lanes of a stream (at most [`MAX_LANES`]).
    pub lanes: usize,
    /// Prefetch lanes of a stream of a remote source (it then uses this as `lanes`).
    pub remote_lanes: usize,
}

impl ReadaheadConfig {
    /// Defaults for this block size and cache budget: the window is capped by
    /// [`max_window_bytes`] (64 MiB, 128 MiB for a remote source, and at most half the cache).
    pub fn new(block_size: u64, cache_size: u64) -> ReadaheadConfig {
        let block_size = block_size.max(1);
        ReadaheadConfig {
            block_size,
            max_window_blocks: max_window_bytes(cache_size, MAX_WINDOW_BYTES) / block_size,
            remote_max_window_blocks: max_window_bytes(cache_size, REMOTE_MAX_WINDOW_BYTES) / block_size,
            max_streams: MAX_STREAMS,
            back_slack: BACK_SLACK,
            forward_slack: FORWARD_SLACK,
            drop_behind_slack: DROP_BEHIND_SLACK,
            confirm_slack: CONFIRM_SLACK,
            initial_window_blocks: (INITIAL_WINDOW_BYTES / block_size).max(1),
            file_start_window_blocks: FILE_START_WINDOW_BYTES.div_ceil(block_size).max(LANES as u64),
            lanes: LANES,
            remote_lanes: REMOTE_LANES,
        }
    }
}

/// The file a read is of, within its source; see the module doc.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Extent {
    /// The file's bytes, in source offsets.
    pub bytes: Range<u64>,
    /// Whether the read is of the re-served checkpoint file (`bytes` is then the tensor or
    /// header it is in), which loaders map: no read of it jump-starts a stream, and the engine
    /// remembers what the kernel was given of it (`engine::delivered`). False for a tensor file
    /// (a read from its first byte, or a second read right after the first, says the reader goes
    /// on to its end) or the whole source.
    pub in_checkpoint_file: bool,
}

impl Extent {
    /// A tensor's (or the header's) bytes in the re-served checkpoint file.
    pub fn in_checkpoint_file(bytes: Range<u64>) -> Extent {
        Extent { bytes, in_checkpoint_file: true }
    }

    /// The extent cut to a source of `len` bytes.
    pub fn clipped(self, len: u64) -> Extent {
        Extent { bytes: self.bytes.start.min(len)..self.bytes.end.min(len), ..self }
    }
}

impl From<Range<u64>> for Extent {
    /// A file read to its end once read from its start (a tensor file), or the whole source.
    fn from(bytes: Range<u64>) -> Extent {
        Extent { bytes, in_checkpoint_file: false }
    }
}

/// What to do about one read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// Whether the stream has been confirmed sequential (its reads deserve its own descriptor).
    pub sequential: bool,
    /// Block indices to prefetch now, in order; often empty.
    pub prefetch: Range<u64>,
    /// The stream's readahead window in blocks (for a first read from a file's start, the blocks
    /// that read prefetches): how far ahead the stream wants data, which sizes its prefetch reads.
    pub window_blocks: u64,
    /// Blocks this stream read from their first byte and has now left more than the drop-behind
    /// slack behind: it will not come back for them, so their memory may be reused (drop-behind).
    /// A block the stream started in the middle of is never included: its head belongs to whatever
    /// comes before (often another tensor, read by another process).
    pub consumed: Range<u64>,
}

/// One stream's readahead state; see the module doc. Every method takes the same
/// [`ReadaheadConfig`], with a block size of at least 1.
#[derive(Debug)]
pub struct Readahead {
    cursor: u64,
    /// End of the extent (the file, in source offsets) the stream is reading now.
    extent_end: u64,
    /// Whether the stream has gone on from one extent into another: a loader reading files in
    /// source order. Until then prefetch stops at the extent's end, so reading one tensor costs
    /// that tensor and nothing past it.
    crossed: bool,
    /// Blocks before this one were either not read whole by this stream or already reported
    /// consumed.
    consumed_until: u64,
    confirmed: bool,
    window_blocks: u64,
    next_prefetch: u64,
    /// Bytes the recent reads asked for, and how far they moved the cursor, each decaying by an
    /// eighth per read: their ratio is how much of what the stream passes it reads.
    recent_read: u64,
    recent_moved: u64,
}

impl Readahead {
    /// Starts an unconfirmed stream with a read of `[offset, offset + len)` (`len` at least 1, the
    /// range inside a source of `source_len` bytes) that continues no other. `extent` is the byte
    /// range of the file being read within the source (`0..source_len` when the read is not of a
    /// file within it): a read from its first byte prefetches the file's start at once.
    pub fn start(
        config: &ReadaheadConfig,
        offset: u64,
        len: u64,
        source_len: u64,
        extent: impl Into<Extent>,
    ) -> (Readahead, Decision) {
        let Extent { bytes: extent, in_checkpoint_file } = extent.into();
        let reads_on = !in_checkpoint_file;
        let bs = config.block_size;
        let end = offset.saturating_add(len.max(1));
        let last_block = (end - 1) / bs;
        let is_file = extent.start > 0 || extent.end < source_len;
        let prefetch_end = if is_file && reads_on && offset == extent.start {
            let window = config.file_start_window_blocks.min(config.max_window_blocks);
            (last_block + 1 + window).min(extent.end.min(source_len).div_ceil(bs))
        } else {
            0
        };
        let prefetch = if prefetch_end > last_block + 1 { last_block + 1..prefetch_end } else { 0..0 };
        let stream = Readahead {
            cursor: end,
            extent_end: extent.end,
            crossed: false,
            consumed_until: offset.div_ceil(bs),
            confirmed: false,
            window_blocks: 0,
            next_prefetch: (last_block + 1).max(prefetch.end),
            recent_read: len.max(1),
            recent_moved: len.max(1),
        };
        let decision =
            Decision { sequential: false, window_blocks: prefetch.end - prefetch.start, prefetch, consumed: 0..0 };
        (stream, decision)
    }

    /// How far a read starting at `offset` is from this stream's cursor, if it may continue the
    /// stream: within the slacks of a confirmed stream, within the confirm slack of a new one.
    pub fn distance(&self, config: &ReadaheadConfig, offset: u64) -> Option<u64> {
        let (back, forward) = (config.back_slack, config.forward_slack);
        let confirm = config.confirm_slack;
        let (back, forward) = if self.confirmed { (back, forward) } else { (back.min(confirm), forward.min(confirm)) };
        let inside = offset.saturating_add(back) >= self.cursor && offset <= self.cursor.saturating_add(forward);
        inside.then(|| offset.abs_diff(self.cursor))
    }

    /// Continues the stream with a read it accepted ([`Readahead::distance`]); the arguments are
    /// those of [`Readahead::start`]. Prefetch does not pass the end of `extent` until the stream
    /// has crossed from one file into the next.
    pub fn advance(
        &mut self,
        config: &ReadaheadConfig,
        offset: u64,
        len: u64,
        source_len: u64,
        extent: impl Into<Extent>,
    ) -> Decision {
        let Extent { bytes: extent, in_checkpoint_file } = extent.into();
        let reads_on = !in_checkpoint_file;
        let bs = config.block_size;
        let extent_end = extent.end;
        let read_end = offset.saturating_add(len.max(1));
        // Crossing means reading a file to its end and going straight on into the next one; a
        // jump to another file within the slack is just a read of that file. (Within the back slack
        // of the end: the last reads of a file may still be in flight.)
        let into_another_file = extent_end != self.extent_end;
        let finished = self.cursor.saturating_add(config.back_slack) >= self.extent_end;
        // The kernel can ask for a file's last pages before the rest: np.fromfile's one read() of
        // a 16 MiB + 8 KiB tensor file reached the daemon as a request for the last 8 KiB, then,
        // once that was answered, the file from its start. Ending the file right after the one
        // this stream has just finished, that request is the file's tail, not the reader's
        // position: the stream crosses into the file, its cursor stays, and the file's first read
        // continues it. (Moving the cursor to the tail left the file's own reads behind it, a new
        // stream per file: two round trips per file before its prefetch started.)
        let next_file = extent.start.abs_diff(self.extent_end) <= bs;
        let tail_first = self.confirmed
            && into_another_file
            && finished
            && next_file
            && offset > extent.start
            && read_end >= extent_end;
        let end = if tail_first { self.cursor } else { read_end };
        // A reader of the checkpoint file that skips more than it reads (a loader faulting in the
        // pages around each tensor's start, one fault's read-around every few MiB) is not
        // streaming through it: its window stays at the initial size instead of growing, so its
        // prefetch does not run ahead through the tensors it skips.
        self.recent_read = self.recent_read - self.recent_read / 8 + len.max(1);
        self.recent_moved = self.recent_moved - self.recent_moved / 8 + end.saturating_sub(self.cursor);
        let skipping = in_checkpoint_file && self.recent_moved / 2 > self.recent_read;
        let last_block = (end - 1) / bs;
        let max_window = config.max_window_blocks;
        let entered_new_block = last_block > (self.cursor - 1) / bs;
        if !self.confirmed {
            self.confirmed = true;
            // A reader going sequentially through a file (a tensor) almost always reads it to the
            // end: open the window over the rest of it at once, instead of ramping up, so a load of
            // tensors in any order streams each one (within the usual cap). Only for a read that
            // continues the first one exactly, as a sequential reader's do: a random reader that
            // happens to land a little after another's read gets the small window.
            let exact = reads_on && offset == self.cursor;
            let rest_of_file =
                if exact && extent_end < source_len { extent_end.saturating_sub(end).div_ceil(bs) } else { 0 };
            self.window_blocks = rest_of_file.max(config.initial_window_blocks).min(max_window);
        } else if skipping {
            self.window_blocks = config.initial_window_blocks.min(max_window);
        } else if entered_new_block && max_window > 0 {
            self.window_blocks = self.window_blocks.saturating_mul(2).clamp(1, max_window);
        }
        if into_another_file {
            self.crossed |= finished && (offset <= self.extent_end.saturating_add(bs) || tail_first);
            self.extent_end = extent_end;
        }
        self.cursor = self.cursor.max(end);
        let limit = if self.crossed { source_len } else { extent_end.min(source_len) };
        let block_count = limit.div_ceil(bs);
        let cursor_block = (self.cursor - 1) / bs;
        let target_end = cursor_block.saturating_add(1 + self.window_blocks).min(block_count);
        let start = self.next_prefetch.max(last_block + 1);
        let prefetch = if start < target_end { start..target_end } else { 0..0 };
        self.next_prefetch = self.next_prefetch.max(prefetch.end);
        let left_behind = self.cursor.saturating_sub(config.drop_behind_slack.max(config.back_slack)) / bs;
        let consumed = if self.consumed_until < left_behind { self.consumed_until..left_behind } else { 0..0 };
        self.consumed_until = self.consumed_until.max(left_behind);
        Decision { sequential: true, window_blocks: self.window_blocks, prefetch, consumed }
    }

    /// Records that blocks from `first_block` on were not prefetched: halves the window and lets a
    /// later read ask for them again. A stream already at its smallest window does not rewind, so
    /// a cache under steady pressure is not asked again on every read.
    pub fn refused(&mut self, first_block: u64) {
        if self.window_blocks > 1 {
            self.window_blocks /= 2;
            self.next_prefetch = self.next_prefetch.min(first_block);
        }
    }

    /// Whether a read has continued this stream since it started (it is sequential).
    pub fn confirmed(&self) -> bool {
        self.confirmed
    }

    /// The readahead window, in blocks.
    pub fn window_blocks(&self) -> u64 {
        self.window_blocks
    }
}

/// Blocks per prefetch read for a stream whose window is `window_blocks`: the window shared by
/// its `lanes`, within [`MIN_PREFETCH_CHUNK_BYTES`] and [`PREFETCH_CHUNK_BYTES`], whole blocks.
pub fn chunk_blocks(window_blocks: u64, block_size: u64, lanes: usize) -> u64 {
    let share = window_blocks.saturating_mul(block_size) / lanes.max(1) as u64;
    (share.clamp(MIN_PREFETCH_CHUNK_BYTES, PREFETCH_CHUNK_BYTES) / block_size).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    const BS: u64 = 1000;
    const SOURCE: u64 = 100 * BS;

    fn config(max_window_blocks: u64) -> ReadaheadConfig {
        ReadaheadConfig {
            block_size: BS,
            max_window_blocks,
            remote_max_window_blocks: max_window_blocks,
            max_streams: 4,
            back_slack: 300,
            drop_behind_slack: 0,
            forward_slack: 2 * BS,
            confirm_slack: BS,
            initial_window_blocks: 1,
            file_start_window_blocks: 4,
            lanes: LANES,
            remote_lanes: REMOTE_LANES,
        }
    }

    /// One stream of a 100-block source: its first read starts it, every later read must continue it.
    struct One {
        config: ReadaheadConfig,
        stream: Option<Readahead>,
    }

    impl One {
        fn new(max_window_blocks: u64) -> One {
            One { config: config(max_window_blocks), stream: None }
        }

        fn read_in(&mut self, offset: u64, len: u64, extent: impl Into<Extent>) -> Decision {
            match &mut self.stream {
                None => {
                    let (stream, decision) = Readahead::start(&self.config, offset, len, SOURCE, extent);
                    self.stream = Some(stream);
                    decision
                }
                Some(stream) => {
                    assert!(stream.distance(&self.config, offset).is_some(), "a read at {offset} continues the stream");
                    stream.advance(&self.config, offset, len, SOURCE, extent)
                }
            }
        }

        /// A read of the source as a whole (not of a file within it).
        fn read(&mut self, offset: u64, len: u64) -> Decision {
            self.read_in(offset, len, 0..SOURCE)
        }

        fn accepts(&self, offset: u64) -> bool {
            self.stream.as_ref().is_some_and(|s| s.distance(&self.config, offset).is_some())
        }

        fn window_blocks(&self) -> u64 {
            self.stream.as_ref().map_or(0, Readahead::window_blocks)
        }
    }

    /// Feeds reads (offset, len) to one stream and returns each read's (sequential, prefetch).
    fn run(stream: &mut One, reads: &[(u64, u64)]) -> Vec<(bool, Range<u64>)> {
        reads
            .iter()
            .map(|&(offset, len)| {
                let d = stream.read(offset, len);
                (d.sequential, d.prefetch)
            })
            .collect()
    }

    /// A labelled read pattern of one stream and what each of its reads should decide.
    type Case = (&'static str, &'static [(u64, u64)], &'static [(bool, Range<u64>)]);

    #[test]
    fn decisions_for_read_patterns() {
        let cases: &[Case] = &[
            ("a lone read prefetches nothing", &[(5000, 10)], &[(false, 0..0)]),
            (
                "a continuing read confirms the stream with a one-block window",
                &[(0, 100), (100, 100)],
                &[(false, 0..0), (true, 1..2)],
            ),
            (
                "the window doubles each time the cursor enters a new block",
                &[(0, 500), (500, 500), (1000, 500), (1500, 500), (2000, 500), (3000, 500)],
                &[(false, 0..0), (true, 1..2), (true, 2..4), (true, 0..0), (true, 4..7), (true, 7..12)],
            ),
            (
                "an out-of-order read just behind the cursor stays in the stream",
                &[(0, 400), (600, 300), (700, 200)],
                &[(false, 0..0), (true, 1..2), (true, 0..0)],
            ),
            (
                "prefetch stops at the end of the source",
                &[(98_000, 500), (98_500, 400), (98_900, 1100)],
                &[(false, 0..0), (true, 99..100), (true, 0..0)],
            ),
        ];
        for (label, reads, expected) in cases {
            assert_eq!(&run(&mut One::new(8), reads), expected, "{label}");
        }
    }

    #[test]
    fn a_read_beyond_the_slacks_does_not_continue_the_stream() {
        let mut stream = One::new(8);
        run(&mut stream, &[(0, 900), (900, 100)]);
        assert!(!stream.accepts(100), "900 before the cursor, beyond the backward slack");
        assert!(stream.accepts(700));
        assert!(stream.accepts(3000) && !stream.accepts(3001), "the forward slack");
    }

    #[test]
    fn only_a_read_close_to_a_new_stream_confirms_it() {
        let mut stream = One::new(8);
        stream.read(10_000, 100);
        // 1,900 past the cursor: inside the forward slack, outside the confirm slack.
        assert!(!stream.accepts(12_000));
        let mut stream = One::new(8);
        stream.read(12_000, 100);
        assert!(stream.read(12_500, 100).sequential, "400 past the cursor confirms");
        // Once confirmed, the whole forward slack applies.
        assert!(stream.read(14_500, 100).sequential);
    }

    #[test]
    fn a_files_tail_asked_for_before_its_start_does_not_move_the_stream_past_the_file() {
        // Two 16 MiB + 8 KiB tensor files back to back in a 4 MiB-block source; the kernel reads
        // the second one's last 8 KiB first, then the file from its start.
        let (mib, len) = (1u64 << 20, 64u64 << 20);
        let config = ReadaheadConfig::new(4 * mib, 512 * mib);
        let first = 0..16 * mib + 8192;
        let second = first.end..first.end + first.end;
        let (mut stream, _) = Readahead::start(&config, 0, mib, len, first.clone());
        for at in (mib..first.end).step_by(mib as usize) {
            stream.advance(&config, at, mib.min(first.end - at), len, first.clone());
        }
        let tail = second.end - 8192;
        assert!(stream.distance(&config, tail).is_some(), "within the forward slack");
        let decision = stream.advance(&config, tail, 8192, len, second.clone());
        assert!(decision.prefetch.is_empty() || decision.prefetch.start <= second.start / (4 * mib) + 1);
        assert!(stream.distance(&config, second.start).is_some(), "the file's start continues the stream");
        let decision = stream.advance(&config, second.start, mib, len, second.clone());
        let reach = decision.prefetch.end.max(stream.next_prefetch);
        assert!(reach * 4 * mib > second.end, "the window runs on past the second file: {decision:?}");
    }

    #[test]
    fn a_block_is_consumed_only_when_no_request_sent_before_the_cursor_moved_on_can_still_need_it() {
        // A 4 MiB-block remote source read in 1 MiB requests; the one at 3 MiB (block 0) reaches
        // the engine late, after the requests sent after it (a daemon thread was descheduled).
        let (mib, len) = (1u64 << 20, 64u64 << 20);
        let config = ReadaheadConfig::new(4 * mib, 512 * mib);
        let (mut stream, _) = Readahead::start(&config, 0, mib, len, 0..len);
        let mut consumed: Vec<u64> = Vec::new();
        for at in (1..3).chain(4..19) {
            assert!(stream.distance(&config, at * mib).is_some());
            consumed.extend(stream.advance(&config, at * mib, mib, len, 0..len).consumed);
        }
        assert!(consumed.is_empty(), "block 0 was recycled before the request at 3 MiB got its bytes");
        consumed.extend(stream.advance(&config, 19 * mib, mib, len, 0..len).consumed);
        assert_eq!(consumed, [0], "consumed once the cursor is 16 MiB past the block's end");
    }

    #[test]
    fn blocks_left_behind_are_reported_once_and_never_the_first_partial_one() {
        let mut stream = One::new(8);
        let mut consumed = Vec::new();
        // Starts at 500 (block 0 is partial), back slack 300.
        for offset in (500..5000).step_by(250) {
            consumed.extend(stream.read(offset, 250).consumed);
        }
        // Cursor 5000, minus slack 300: blocks up to 3 are behind; block 0 was not read whole.
        assert_eq!(consumed, vec![1, 2, 3]);
        let mut aligned = One::new(8);
        aligned.read(0, 1000);
        assert_eq!(aligned.read(1000, 1000).consumed, 0..1, "a block read from its first byte is consumed");
    }

    #[test]
    fn window_is_capped() {
        let mut stream = One::new(2);
        let reads: Vec<(u64, u64)> = (0..10).map(|b| (b * BS, BS)).collect();
        let got = run(&mut stream, &reads);
        assert_eq!(got[9], (true, 11..12), "{got:?}");
        assert_eq!(stream.window_blocks(), 2);
    }

    #[test]
    fn zero_max_window_disables_prefetch() {
        let mut stream = One::new(0);
        let got = run(&mut stream, &[(0, 500), (500, 500), (1000, 500)]);
        assert!(got.iter().all(|(_, p)| p.is_empty()), "{got:?}");
        assert!(got[2].0, "the stream is still recognised as sequential");
    }

    #[test]
    fn refused_prefetch_halves_the_window_and_rewinds() {
        let mut stream = One::new(8);
        let got = run(&mut stream, &[(0, 500), (500, 500), (1000, 500), (2000, 500)]);
        assert_eq!(got[3].1, 4..7);
        stream.stream.as_mut().unwrap().refused(4);
        assert_eq!(stream.window_blocks(), 2);
        assert_eq!(stream.read(2500, 100).prefetch, 4..5, "refused blocks are asked for again");
    }

    #[test]
    fn prefetch_stops_at_the_file_end_until_the_reader_crosses_into_the_next() {
        let mut stream = One::new(8);
        let file_end = 10 * BS + 100;
        stream.read_in(0, BS, 0..file_end);
        for k in 1..10 {
            let d = stream.read_in(k * BS, BS, 0..file_end);
            assert!(d.prefetch.end <= 11, "read {k}: prefetch {:?} runs past the file's last block", d.prefetch);
        }
        // The reader goes on into the next file: the window runs past file ends from now on.
        let next_end = 40 * BS;
        assert!(stream.read_in(file_end, BS, file_end..next_end).sequential);
        let d = stream.read_in(file_end + BS, BS, file_end..next_end);
        let d2 = stream.read_in(file_end + 2 * BS, BS, next_end..60 * BS);
        assert!(d.prefetch.end.max(d2.prefetch.end) > 11);
        assert!(d2.prefetch.end <= 100);
    }

    #[test]
    fn a_read_from_a_files_first_byte_prefetches_its_start_at_once() {
        let mut stream = One::new(8);
        // File [5000, 30_000): a read of its first byte prefetches the next 4 blocks (the file-start
        // window), before any second read; the stream is not confirmed yet.
        let d = stream.read_in(5000, 100, 5000..30 * BS);
        assert_eq!((d.sequential, d.prefetch.clone()), (false, 6..10));
        // Its exact continuation confirms it and opens the window over the rest of the file,
        // without asking again for what is already on its way.
        let d = stream.read_in(5100, 900, 5000..30 * BS);
        assert!(d.sequential);
        assert_eq!(d.prefetch, 10..14);
        // Near the end of a short file, the file-start window stops at the file's last block.
        assert_eq!(One::new(8).read_in(60 * BS, 100, 60 * BS..62 * BS).prefetch, 61..62);
        // A read inside a file, or from the start of a source that is not a file, prefetches nothing.
        assert!(One::new(8).read_in(80 * BS + 7, 100, 80 * BS..90 * BS).prefetch.is_empty());
        assert!(One::new(8).read(0, 100).prefetch.is_empty());
    }

    #[test]
    fn no_read_of_the_checkpoint_file_jump_starts_a_stream() {
        // As `a_read_from_a_files_first_byte_prefetches_its_start_at_once`, through the checkpoint
        // file: a read taking in a tensor's start (every page fault's read-around does) prefetches
        // nothing, and its exact continuation opens the initial window, not the rest of the tensor.
        let tensor = || Extent::in_checkpoint_file(5000..30 * BS);
        let mut stream = One::new(8);
        let d = stream.read_in(5000, 100, tensor());
        assert_eq!((d.sequential, d.prefetch), (false, 0..0));
        let d = stream.read_in(5100, 900, tensor());
        assert_eq!((d.sequential, d.prefetch), (true, 6..7));
    }

    #[test]
    fn a_reader_skipping_through_the_checkpoint_file_keeps_the_initial_window() {
        // A loader's faults: two reads back to back around a tensor's start every 6 blocks.
        let faults = |extent: fn(Range<u64>) -> Extent| {
            let mut stream = One::new(8);
            stream.config.forward_slack = 10 * BS;
            for k in 1..12 {
                let at = k * 6 * BS;
                stream.read_in(at - 500, 500, extent(at - 6 * BS..at));
                stream.read_in(at, 500, extent(at..at + 6 * BS));
            }
            stream.window_blocks()
        };
        assert_eq!(faults(Extent::in_checkpoint_file), 1);
        assert_eq!(faults(Extent::from), 8, "the same reads of tensor files open the window");
    }

    #[test]
    fn file_start_window_is_eight_mib_and_at_least_a_block_per_lane() {
        let small = ReadaheadConfig::new(64 << 10, 512 << 20);
        assert_eq!(small.file_start_window_blocks * (64 << 10), FILE_START_WINDOW_BYTES);
        let large = ReadaheadConfig::new(4 << 20, 512 << 20);
        assert_eq!(large.file_start_window_blocks, (LANES as u64).max(FILE_START_WINDOW_BYTES / (4 << 20)));
        assert!(large.file_start_window_blocks <= large.max_window_blocks);
    }

    #[test]
    fn a_remote_source_gets_a_larger_window_within_half_the_cache() {
        let config = ReadaheadConfig::new(4 << 20, 512 << 20);
        assert_eq!(config.max_window_blocks * (4 << 20), MAX_WINDOW_BYTES);
        assert_eq!(config.remote_max_window_blocks * (4 << 20), REMOTE_MAX_WINDOW_BYTES);
        let small_cache = ReadaheadConfig::new(4 << 20, 128 << 20);
        assert_eq!((small_cache.max_window_blocks, small_cache.remote_max_window_blocks), (16, 16));
    }

    #[test]
    fn prefetch_reads_share_the_window_among_the_lanes_within_bounds() {
        let (kib, mib) = (1u64 << 10, 1u64 << 20);
        let lanes = LANES as u64;
        assert_eq!(chunk_blocks(16 * mib / (64 * kib), 64 * kib, LANES), 16 * mib / lanes / (64 * kib));
        assert_eq!(chunk_blocks(64 * mib / (64 * kib), 64 * kib, LANES), PREFETCH_CHUNK_BYTES / (64 * kib));
        assert_eq!(chunk_blocks(1, 64 * kib, LANES), MIN_PREFETCH_CHUNK_BYTES / (64 * kib));
        assert_eq!(chunk_blocks(2, 4 * mib, LANES), 1, "never less than one block");
        assert_eq!(chunk_blocks(u64::MAX, 4 * kib, LANES), PREFETCH_CHUNK_BYTES / (4 * kib));
        // A remote stream's lanes share the same window in pieces half as large, never below the floor.
        assert_eq!(
            chunk_blocks(64 * mib / (64 * kib), 64 * kib, REMOTE_LANES),
            64 * mib / REMOTE_LANES as u64 / (64 * kib)
        );
        assert_eq!(chunk_blocks(1, 64 * kib, REMOTE_LANES), MIN_PREFETCH_CHUNK_BYTES / (64 * kib));
    }
}
