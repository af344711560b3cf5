//! Unit tests of `engine::readahead`: the decisions for read patterns, one stream at a time.

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
