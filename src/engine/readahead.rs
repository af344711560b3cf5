//! Sequential-stream detection and readahead windows: pure decisions, no I/O.
//!
//! Each source keeps a small [`StreamTable`]. A stream remembers its *cursor* (the end of its
//! furthest read so far), a readahead *window* in blocks, and the first block it has not yet asked
//! to prefetch. A read belongs to the stream whose cursor it is closest to, if it starts no more than
//! [`BACK_SLACK`] before that cursor or [`FORWARD_SLACK`] after it: the kernel's async readahead and
//! mmap read-around deliver one sequential reader's requests slightly out of order, and those must
//! not look like seeks.
//!
//! A read that matches no stream starts a new stream, *unconfirmed* and without any prefetch, so a
//! random reader costs no backing I/O beyond the blocks it touches; the exception is a read from the
//! first byte of a file (a tensor), how sequential readers start, which prefetches up to
//! [`FILE_START_WINDOW_BYTES`] (and at least one block per prefetch lane) at once. The next read
//! that continues a stream confirms it: the window opens at [`INITIAL_WINDOW_BYTES`] and then
//! doubles each time the cursor enters a new block, up to [`ReadaheadConfig::max_window_blocks`]
//! (TCP slow start, as in mountpoint-s3 and hf-mount). After every read the stream asks for the blocks from just past the
//! read up to `window` blocks past the cursor's block, skipping those it asked for before.
//!
//! When the engine cannot carry out a prefetch (its queue is full, or the cache has no room that is
//! not holding unread data), it calls [`StreamTable::prefetch_refused`]: the window halves and the
//! refused blocks become eligible again, like mountpoint-s3 scaling down under memory pressure.
//!
//! The constants are in [`crate::engine::tuning`]. The table holds at most [`MAX_STREAMS`]; a new stream replaces the least recently used one.
//! Each stream carries a payload `T` (the engine's descriptor and prefetch queue for that stream),
//! handed back when the stream is replaced.

use std::ops::Range;

use super::tuning::{
    max_window_bytes, BACK_SLACK, CONFIRM_SLACK, FILE_START_WINDOW_BYTES, FORWARD_SLACK, INITIAL_WINDOW_BYTES, LANES,
    MAX_STREAMS,
};

/// Tuning of the stream table; [`ReadaheadConfig::new`] gives the defaults.
#[derive(Debug, Clone)]
pub struct ReadaheadConfig {
    /// Block size in bytes (at least 1).
    pub block_size: u64,
    /// Largest window in blocks; 0 turns prefetch off.
    pub max_window_blocks: u64,
    /// Most streams tracked (at least 1).
    pub max_streams: usize,
    /// Bytes before a cursor that a read may start at and still continue the stream.
    pub back_slack: u64,
    /// Bytes after a cursor that a read may start at and still continue the stream.
    pub forward_slack: u64,
    /// Bytes either side of an unconfirmed stream's cursor that a read may start at to confirm it
    /// (capped by the two slacks above).
    pub confirm_slack: u64,
    /// Window of a freshly confirmed stream, in blocks (at least 1).
    pub initial_window_blocks: u64,
    /// Blocks prefetched on a read from a file's first byte (0: none).
    pub file_start_window_blocks: u64,
}

impl ReadaheadConfig {
    /// Defaults for this block size and cache budget: the window is capped by
    /// [`max_window_bytes`] (64 MiB, and at most half the cache).
    pub fn new(block_size: u64, cache_size: u64) -> ReadaheadConfig {
        let block_size = block_size.max(1);
        ReadaheadConfig {
            block_size,
            max_window_blocks: max_window_bytes(cache_size) / block_size,
            max_streams: MAX_STREAMS,
            back_slack: BACK_SLACK,
            forward_slack: FORWARD_SLACK,
            confirm_slack: CONFIRM_SLACK,
            initial_window_blocks: (INITIAL_WINDOW_BYTES / block_size).max(1),
            file_start_window_blocks: FILE_START_WINDOW_BYTES.div_ceil(block_size).max(LANES as u64),
        }
    }
}

/// What to do about one read.
#[derive(Debug)]
pub struct Decision<T> {
    /// Index of the stream the read belongs to (valid until the next call that changes the table).
    pub stream: usize,
    /// Whether that stream has been confirmed sequential (its reads deserve its own descriptor).
    pub sequential: bool,
    /// Block indices to prefetch now, in order; often empty.
    pub prefetch: Range<u64>,
    /// The stream's readahead window in blocks (for a first read from a file's start, the blocks
    /// that read prefetches): how far ahead the stream wants data, which sizes its prefetch reads.
    pub window_blocks: u64,
    /// The payload of a stream this read's new stream replaced.
    pub evicted: Option<T>,
    /// Blocks this stream read from their first byte and has now left more than the backward
    /// slack behind: it will not come back for them, so their memory may be reused (drop-behind).
    /// A block the stream started in the middle of is never included: its head belongs to whatever
    /// comes before (often another tensor, read by another process).
    pub consumed: Range<u64>,
}

struct Stream<T> {
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
    last_used: u64,
    payload: T,
}

/// The sequential streams of one source; see the module doc.
pub struct StreamTable<T> {
    config: ReadaheadConfig,
    streams: Vec<Stream<T>>,
    clock: u64,
}

impl<T: Default> StreamTable<T> {
    /// An empty table.
    pub fn new(mut config: ReadaheadConfig) -> StreamTable<T> {
        config.block_size = config.block_size.max(1);
        config.max_streams = config.max_streams.max(1);
        StreamTable { config, streams: Vec::new(), clock: 0 }
    }

    /// Classifies a read of `[offset, offset + len)` of a source of `source_len` bytes and says
    /// which blocks to prefetch. `len` must be at least 1 and the range inside the source.
    /// `extent` is the byte range of the file being read within the source (`0..source_len` when
    /// the read is not of a file within it): prefetch does not pass its end until the stream has
    /// crossed from one file into the next.
    pub fn on_read(&mut self, offset: u64, len: u64, source_len: u64, extent: Range<u64>) -> Decision<T> {
        self.clock += 1;
        let bs = self.config.block_size;
        let end = offset.saturating_add(len.max(1));
        let last_block = (end - 1) / bs;
        let extent_end = extent.end;
        let Some(index) = self.matching_stream(offset) else {
            let is_file = extent.start > 0 || extent.end < source_len;
            let prefetch_end = if is_file && offset == extent.start {
                let window = self.config.file_start_window_blocks.min(self.config.max_window_blocks);
                (last_block + 1 + window).min(extent_end.min(source_len).div_ceil(bs))
            } else {
                0
            };
            let prefetch = if prefetch_end > last_block + 1 { last_block + 1..prefetch_end } else { 0..0 };
            let stream = Stream {
                cursor: end,
                extent_end,
                crossed: false,
                consumed_until: offset.div_ceil(bs),
                confirmed: false,
                window_blocks: 0,
                next_prefetch: (last_block + 1).max(prefetch.end),
                last_used: self.clock,
                payload: T::default(),
            };
            let (index, evicted) = self.insert(stream);
            return Decision {
                stream: index,
                sequential: false,
                window_blocks: prefetch.end - prefetch.start,
                prefetch,
                evicted,
                consumed: 0..0,
            };
        };
        let max_window = self.config.max_window_blocks;
        let stream = &mut self.streams[index];
        stream.last_used = self.clock;
        let entered_new_block = last_block > (stream.cursor - 1) / bs;
        if !stream.confirmed {
            stream.confirmed = true;
            // A reader going sequentially through a file (a tensor) almost always reads it to the
            // end: open the window over the rest of it at once, instead of ramping up, so a load of
            // tensors in any order streams each one (within the usual cap). Only for a read that
            // continues the first one exactly, as a sequential reader's do: a random reader that
            // happens to land a little after another's read gets the small window.
            let exact = offset == stream.cursor;
            let rest_of_file =
                if exact && extent_end < source_len { extent_end.saturating_sub(end).div_ceil(bs) } else { 0 };
            stream.window_blocks = rest_of_file.max(self.config.initial_window_blocks).min(max_window);
        } else if entered_new_block && max_window > 0 {
            stream.window_blocks = stream.window_blocks.saturating_mul(2).clamp(1, max_window);
        }
        if extent_end != stream.extent_end {
            // Crossing means reading a file to its end and going straight on into the next one;
            // a jump to another file within the slack is just a read of that file.
            // (Within the back slack of the end: the last reads of a file may still be in flight.)
            let finished = stream.cursor.saturating_add(self.config.back_slack) >= stream.extent_end;
            stream.crossed |= finished && offset <= stream.extent_end.saturating_add(bs);
            stream.extent_end = extent_end;
        }
        stream.cursor = stream.cursor.max(end);
        let limit = if stream.crossed { source_len } else { extent_end.min(source_len) };
        let block_count = limit.div_ceil(bs);
        let cursor_block = (stream.cursor - 1) / bs;
        let target_end = cursor_block.saturating_add(1 + stream.window_blocks).min(block_count);
        let start = stream.next_prefetch.max(last_block + 1);
        let prefetch = if start < target_end { start..target_end } else { 0..0 };
        stream.next_prefetch = stream.next_prefetch.max(prefetch.end);
        let left_behind = stream.cursor.saturating_sub(self.config.back_slack) / bs;
        let consumed = if stream.consumed_until < left_behind { stream.consumed_until..left_behind } else { 0..0 };
        stream.consumed_until = stream.consumed_until.max(left_behind);
        Decision {
            stream: index,
            sequential: true,
            window_blocks: stream.window_blocks,
            prefetch,
            evicted: None,
            consumed,
        }
    }

    /// Records that blocks from `first_block` on were not prefetched for stream `index`: halves its
    /// window and lets a later read ask for them again. A stream already at its smallest window
    /// does not rewind, so a cache under steady pressure is not asked again on every read.
    pub fn prefetch_refused(&mut self, index: usize, first_block: u64) {
        if let Some(stream) = self.streams.get_mut(index) {
            if stream.window_blocks > 1 {
                stream.window_blocks /= 2;
                stream.next_prefetch = stream.next_prefetch.min(first_block);
            }
        }
    }

    /// The payload of stream `index`, if it exists.
    pub fn payload(&self, index: usize) -> Option<&T> {
        self.streams.get(index).map(|s| &s.payload)
    }

    /// Streams tracked.
    pub fn len(&self) -> usize {
        self.streams.len()
    }

    /// Whether no stream is tracked.
    pub fn is_empty(&self) -> bool {
        self.streams.is_empty()
    }

    /// Sum of all windows, in bytes.
    pub fn window_bytes(&self) -> u64 {
        let blocks: u64 = self.streams.iter().map(|s| s.window_blocks).sum();
        blocks.saturating_mul(self.config.block_size)
    }

    fn matching_stream(&self, offset: u64) -> Option<usize> {
        let (back, forward) = (self.config.back_slack, self.config.forward_slack);
        let confirm = self.config.confirm_slack;
        self.streams
            .iter()
            .enumerate()
            .filter(|(_, s)| {
                let (back, forward) =
                    if s.confirmed { (back, forward) } else { (back.min(confirm), forward.min(confirm)) };
                offset.saturating_add(back) >= s.cursor && offset <= s.cursor.saturating_add(forward)
            })
            .min_by_key(|(_, s)| offset.abs_diff(s.cursor))
            .map(|(index, _)| index)
    }

    fn insert(&mut self, stream: Stream<T>) -> (usize, Option<T>) {
        if self.streams.len() < self.config.max_streams {
            self.streams.push(stream);
            return (self.streams.len() - 1, None);
        }
        let oldest = (0..self.streams.len()).min_by_key(|&i| self.streams[i].last_used).unwrap_or(0);
        let old = std::mem::replace(&mut self.streams[oldest], stream);
        (oldest, Some(old.payload))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BS: u64 = 1000;

    fn table(max_window_blocks: u64, max_streams: usize) -> StreamTable<u32> {
        StreamTable::new(ReadaheadConfig {
            block_size: BS,
            max_window_blocks,
            max_streams,
            back_slack: 300,
            forward_slack: 2 * BS,
            confirm_slack: BS,
            initial_window_blocks: 1,
            file_start_window_blocks: 4,
        })
    }

    #[test]
    fn file_start_window_is_eight_mib_and_at_least_a_block_per_lane() {
        let lanes = LANES as u64;
        let small = ReadaheadConfig::new(64 << 10, 512 << 20);
        assert_eq!(small.file_start_window_blocks * (64 << 10), FILE_START_WINDOW_BYTES);
        let large = ReadaheadConfig::new(4 << 20, 512 << 20);
        assert_eq!(large.file_start_window_blocks, lanes.max(FILE_START_WINDOW_BYTES / (4 << 20)));
        assert!(large.file_start_window_blocks <= large.max_window_blocks);
    }

    /// What one read decided: (stream, sequential, prefetch).
    type Outcome = (usize, bool, Range<u64>);

    /// A labelled read pattern and what each of its reads should decide.
    type Case = (&'static str, &'static [(u64, u64)], &'static [Outcome]);

    /// Feeds reads (offset, len) to a table and returns each read's outcome.
    fn run(table: &mut StreamTable<u32>, reads: &[(u64, u64)]) -> Vec<Outcome> {
        reads
            .iter()
            .map(|&(offset, len)| {
                let d = table.on_read(offset, len, 100 * BS, 0..100 * BS);
                (d.stream, d.sequential, d.prefetch)
            })
            .collect()
    }

    #[test]
    fn decisions_for_read_patterns() {
        let cases: &[Case] = &[
            ("a lone read prefetches nothing", &[(5000, 10)], &[(0, false, 0..0)]),
            (
                "a continuing read confirms the stream with a one-block window",
                &[(0, 100), (100, 100)],
                &[(0, false, 0..0), (0, true, 1..2)],
            ),
            (
                "the window doubles each time the cursor enters a new block",
                &[(0, 500), (500, 500), (1000, 500), (1500, 500), (2000, 500), (3000, 500)],
                &[
                    (0, false, 0..0),
                    (0, true, 1..2),
                    (0, true, 2..4),
                    (0, true, 0..0),
                    (0, true, 4..7),
                    (0, true, 7..12),
                ],
            ),
            (
                "a far jump starts a second, unconfirmed stream",
                &[(0, 100), (100, 100), (50_000, 100)],
                &[(0, false, 0..0), (0, true, 1..2), (1, false, 0..0)],
            ),
            (
                "an out-of-order read just behind the cursor stays in the stream",
                &[(0, 400), (600, 300), (700, 200)],
                &[(0, false, 0..0), (0, true, 1..2), (0, true, 0..0)],
            ),
            (
                "a read beyond the backward slack is a new stream",
                &[(0, 900), (900, 100), (100, 100)],
                &[(0, false, 0..0), (0, true, 1..2), (1, false, 0..0)],
            ),
            (
                "two interleaved sequential readers keep separate streams",
                &[(0, 100), (40_000, 100), (100, 100), (40_100, 100)],
                &[(0, false, 0..0), (1, false, 0..0), (0, true, 1..2), (1, true, 41..42)],
            ),
            (
                "prefetch stops at the end of the source",
                &[(98_000, 500), (98_500, 400), (98_900, 1100)],
                &[(0, false, 0..0), (0, true, 99..100), (0, true, 0..0)],
            ),
        ];
        for (label, reads, expected) in cases {
            assert_eq!(&run(&mut table(8, 4), reads), expected, "{label}");
        }
    }

    #[test]
    fn blocks_left_behind_are_reported_once_and_never_the_first_partial_one() {
        let mut t = table(8, 4);
        let mut consumed = Vec::new();
        // Starts at 500 (block 0 is partial), back slack 300.
        for offset in (500..5000).step_by(250) {
            let d = t.on_read(offset, 250, 100 * BS, 0..100 * BS);
            consumed.extend(d.consumed);
        }
        // Cursor 5000, minus slack 300: blocks up to 3 are behind; block 0 was not read whole.
        assert_eq!(consumed, vec![1, 2, 3]);
        let mut aligned = table(8, 4);
        aligned.on_read(0, 1000, 100 * BS, 0..100 * BS);
        let d = aligned.on_read(1000, 1000, 100 * BS, 0..100 * BS);
        assert_eq!(d.consumed, 0..1, "a block read from its first byte is consumed");
    }

    #[test]
    fn only_a_read_close_to_a_new_stream_confirms_it() {
        let mut t = table(8, 4);
        t.on_read(10_000, 100, 100 * BS, 0..100 * BS);
        // 1,900 past the cursor: inside the forward slack, outside the confirm slack.
        let d = t.on_read(12_000, 100, 100 * BS, 0..100 * BS);
        assert!(!d.sequential && d.prefetch.is_empty(), "{d:?}");
        assert_eq!(t.len(), 2);
        let d = t.on_read(12_500, 100, 100 * BS, 0..100 * BS);
        assert!(d.sequential, "400 past the cursor confirms");
        // Once confirmed, the whole forward slack applies.
        assert!(t.on_read(14_500, 100, 100 * BS, 0..100 * BS).sequential);
    }

    #[test]
    fn window_is_capped() {
        let mut t = table(2, 4);
        let reads: Vec<(u64, u64)> = (0..10).map(|b| (b * BS, BS)).collect();
        let got = run(&mut t, &reads);
        assert_eq!(got[9], (0, true, 11..12), "{got:?}");
        assert_eq!(t.window_bytes(), 2 * BS);
    }

    #[test]
    fn zero_max_window_disables_prefetch() {
        let mut t = table(0, 4);
        let got = run(&mut t, &[(0, 500), (500, 500), (1000, 500)]);
        assert!(got.iter().all(|(_, _, p)| p.is_empty()), "{got:?}");
        assert!(got[2].1, "the stream is still recognised as sequential");
    }

    #[test]
    fn least_recently_used_stream_is_replaced() {
        let mut t = table(8, 2);
        t.on_read(0, 10, 100 * BS, 0..100 * BS);
        t.on_read(20_000, 10, 100 * BS, 0..100 * BS);
        t.on_read(20_010, 10, 100 * BS, 0..100 * BS);
        let d = t.on_read(60_000, 10, 100 * BS, 0..100 * BS);
        assert_eq!((d.stream, d.evicted), (0, Some(0)));
        assert_eq!(t.len(), 2);
        // The surviving stream is still there and continues.
        assert!(t.on_read(20_020, 10, 100 * BS, 0..100 * BS).sequential);
    }

    #[test]
    fn refused_prefetch_halves_the_window_and_rewinds() {
        let mut t = table(8, 4);
        let got = run(&mut t, &[(0, 500), (500, 500), (1000, 500), (2000, 500)]);
        assert_eq!(got[3].2, 4..7);
        t.prefetch_refused(0, 4);
        assert_eq!(t.window_bytes(), 2 * BS);
        let d = t.on_read(2500, 100, 100 * BS, 0..100 * BS);
        assert_eq!(d.prefetch, 4..5, "refused blocks are asked for again");
    }

    #[test]
    fn prefetch_stops_at_the_file_end_until_the_reader_crosses_into_the_next() {
        let mut t = table(8, 4);
        let file_end = 10 * BS + 100;
        t.on_read(0, BS, 100 * BS, 0..file_end);
        for k in 1..10 {
            let d = t.on_read(k * BS, BS, 100 * BS, 0..file_end);
            assert!(d.prefetch.end <= 11, "read {k}: prefetch {:?} runs past the file's last block", d.prefetch);
        }
        // The reader goes on into the next file: the window runs past file ends from now on.
        let next_end = 40 * BS;
        let d = t.on_read(file_end, BS, 100 * BS, file_end..next_end);
        assert!(d.sequential);
        let d = t.on_read(file_end + BS, BS, 100 * BS, file_end..next_end);
        let d2 = t.on_read(file_end + 2 * BS, BS, 100 * BS, next_end..60 * BS);
        assert!(d.prefetch.end.max(d2.prefetch.end) > 11);
        assert!(d2.prefetch.end <= 100);
    }

    #[test]
    fn a_read_from_a_files_first_byte_prefetches_its_start_at_once() {
        let mut t = table(8, 4);
        // File [5000, 30_000): a read of its first byte prefetches the next 4 blocks (the file-start
        // window), before any second read; the stream is not confirmed yet.
        let d = t.on_read(5000, 100, 100 * BS, 5000..30 * BS);
        assert_eq!((d.sequential, d.prefetch.clone()), (false, 6..10));
        // Its exact continuation confirms it and opens the window over the rest of the file,
        // without asking again for what is already on its way.
        let d = t.on_read(5100, 900, 100 * BS, 5000..30 * BS);
        assert!(d.sequential);
        assert_eq!(d.prefetch, 10..14);
        // Near the end of a short file, the file-start window stops at the file's last block.
        let d = t.on_read(60 * BS, 100, 100 * BS, 60 * BS..62 * BS);
        assert_eq!(d.prefetch, 61..62);
        // A read inside a file, or from the start of a source that is not a file, prefetches nothing.
        assert!(t.on_read(80 * BS + 7, 100, 100 * BS, 80 * BS..90 * BS).prefetch.is_empty());
        let mut whole = table(8, 4);
        assert!(whole.on_read(0, 100, 100 * BS, 0..100 * BS).prefetch.is_empty());
    }
}
