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

    /// The end of the stream's furthest read so far.
    pub fn cursor(&self) -> u64 {
        self.cursor
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
#[path = "readahead_tests.rs"]
mod tests;
