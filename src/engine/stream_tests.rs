//! Tests of the stream table and of one stream's pending prefetch and advice.

use super::*;
use crate::engine::tuning::{LANES, REMOTE_LANES};

const BS: u64 = 1000;

/// A table of streams over a 100-block source, as the readahead tests configure one.
fn streams(max_window_blocks: u64, max_streams: usize) -> Streams {
    let config = ReadaheadConfig {
        block_size: BS,
        max_window_blocks,
        remote_max_window_blocks: max_window_blocks,
        max_streams,
        back_slack: 300,
        drop_behind_slack: 0,
        forward_slack: 2 * BS,
        confirm_slack: BS,
        initial_window_blocks: 1,
        file_start_window_blocks: 4,
        lanes: LANES,
        remote_lanes: REMOTE_LANES,
    };
    Streams::new(config, 0, 100 * BS)
}

/// What one read decided: (stream, sequential, prefetch).
type Outcome = (usize, bool, Range<u64>);

/// A labelled read pattern and what each of its reads should decide.
type Case = (&'static str, &'static [(u64, u64)], &'static [Outcome]);

/// Gives reads (offset, len) of the whole source to the table; returns each read's outcome.
fn classify(streams: &Streams, reads: &[(u64, u64)]) -> Vec<Outcome> {
    let mut table = lock(&streams.table);
    reads
        .iter()
        .map(|&(offset, len)| {
            let (index, d, _) = table.classify(&streams.config, offset, len, 100 * BS, (0..100 * BS).into());
            (index, d.sequential, d.prefetch)
        })
        .collect()
}

#[test]
fn reads_go_to_the_closest_stream_that_accepts_them() {
    let cases: &[Case] = &[
        (
            "a far jump starts a second, unconfirmed stream",
            &[(0, 100), (100, 100), (50_000, 100)],
            &[(0, false, 0..0), (0, true, 1..2), (1, false, 0..0)],
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
            "a new stream at a file's tail does not take over the sequential reader arriving there",
            &[
                (0, 100),
                (100, 900),
                (5_000, 500),
                (1_000, 1_000),
                (2_000, 1_000),
                (3_000, 1_000),
                (4_000, 1_000),
                (5_500, 500),
            ],
            &[
                (0, false, 0..0),
                (0, true, 1..2),
                (1, false, 0..0),
                (0, true, 2..4),
                (0, true, 4..7),
                (0, true, 7..12),
                (0, true, 12..13),
                (0, true, 13..14),
            ],
        ),
        (
            "a read close to a new stream confirms it, one within the forward slack does not",
            &[(10_000, 100), (12_000, 100), (12_500, 100), (14_500, 100)],
            &[(0, false, 0..0), (1, false, 0..0), (1, true, 13..14), (1, true, 15..17)],
        ),
    ];
    for (label, reads, expected) in cases {
        assert_eq!(&classify(&streams(8, 4), reads), expected, "{label}");
    }
}

#[test]
fn least_recently_used_stream_is_replaced() {
    let streams = streams(8, 2);
    classify(&streams, &[(0, 10), (20_000, 10), (20_010, 10)]);
    let mut table = lock(&streams.table);
    let (index, _, replaced) = table.classify(&streams.config, 60_000, 10, 100 * BS, (0..100 * BS).into());
    assert_eq!((index, replaced.map(|s| s.last_used)), (0, Some(1)));
    assert_eq!(table.streams.len(), 2);
    drop(table);
    // The surviving stream is still there and continues.
    assert!(classify(&streams, &[(20_020, 10)])[0].1);
}

/// Reads `[offset, offset + len)` of the whole source through `on_read`, with prefetch jobs
/// accepted or not; whether the read's stream is sequential.
fn read(streams: &Streams, cache: &BlockCache, spares: &Spares, stats: &Stats, at: (u64, u64), accept: bool) -> bool {
    let (offset, len) = at;
    streams.on_read(offset..offset + len, (0..100 * BS).into(), cache, spares, stats, |_, _| accept).is_some()
}

#[test]
fn a_read_feeds_back_the_lanes_refusal_and_leaves_blocks_behind() {
    let (streams, stats, spares) = (streams(8, 4), Stats::default(), Spares::default());
    let cache = BlockCache::new(1 << 20, Arc::new(Stats::default()));
    assert!(!read(&streams, &cache, &spares, &stats, (0, 500), true), "a new stream is not sequential yet");
    assert!(read(&streams, &cache, &spares, &stats, (500, 500), true), "its continuation confirms it");
    assert_eq!((counter(&stats.streams), counter(&stats.window_bytes)), (1, BS));
    for at in [(1000, 500), (1500, 500), (2000, 1000)] {
        read(&streams, &cache, &spares, &stats, at, true);
    }
    assert_eq!(counter(&stats.window_bytes), 4 * BS);
    let io = Arc::clone(&lock(&streams.table).streams[0].io);
    assert!(io.is_behind(1) && !io.is_behind(2), "the cursor (3000) is 2 blocks and the back slack past 1");
    // A lane met a full cache: the next read doubles the window, then halves it.
    io.refuse(9);
    read(&streams, &cache, &spares, &stats, (3000, 500), true);
    assert_eq!(counter(&stats.window_bytes), 4 * BS);
    assert_eq!(io.take_refusal(), None, "the read took the refusal");
}

#[test]
fn a_prefetch_the_queue_refuses_halves_the_window() {
    let (streams, stats, spares) = (streams(8, 4), Stats::default(), Spares::default());
    let cache = BlockCache::new(1 << 20, Arc::new(Stats::default()));
    for at in [(0, 500), (500, 500), (1000, 500)] {
        read(&streams, &cache, &spares, &stats, at, false);
    }
    assert_eq!(counter(&stats.window_bytes), BS, "doubled to 2 blocks, then halved");
}

fn counter(c: &AtomicU64) -> u64 {
    c.load(Relaxed)
}

/// Adds `blocks` (of 100) in chunks of `chunk_blocks` for a local stream's lanes, accepting every
/// job; the lanes started.
fn started_lanes(io: &StreamIo, blocks: Range<u64>, chunk_blocks: u64) -> Vec<usize> {
    started_lanes_of(io, blocks, chunk_blocks, LANES)
}

fn started_lanes_of(io: &StreamIo, blocks: Range<u64>, chunk_blocks: u64, of: usize) -> Vec<usize> {
    let mut lanes = Vec::new();
    assert!(io.add_pending(blocks, 100, chunk_blocks, of, |lane| {
        lanes.push(lane);
        true
    }));
    lanes
}

#[test]
fn lanes_claim_whole_chunks_in_order() {
    let io = StreamIo::default();
    // 3 whole chunks of 4 blocks and a partial one: three lanes start.
    assert_eq!(started_lanes(&io, 0..14, 4), vec![0, 1, 2]);
    assert_eq!(io.next_chunk(0, false), Some(0..4));
    assert_eq!(io.next_chunk(1, false), Some(4..8));
    assert_eq!(io.next_chunk(2, false), Some(8..12));
    // 12..14 is a partial chunk and other lanes are busy: lane 2 waits for the window.
    assert_eq!(io.next_chunk(2, false), None);
    assert_eq!(io.next_chunk(1, false), None);
    // The lone remaining lane may take the partial chunk, then continues it as it grows.
    assert_eq!(io.next_chunk(0, false), Some(12..14));
    assert!(io.add_pending(14..15, 100, 4, LANES, |_| unreachable!("lane 0 still runs")));
    assert_eq!(io.next_chunk(0, false), Some(14..15));
    assert_eq!(io.next_chunk(0, false), None);
    // The end of the source closes a chunk early, so it counts as whole.
    assert!(io.add_pending(97..100, 100, 8, LANES, |lane| lane == 0));
    assert_eq!(io.next_chunk(0, false), Some(97..100));
    assert_eq!(io.next_chunk(0, false), None);
    assert!(!io.add_pending(100..101, 101, 4, LANES, |_| false), "a full queue drops the blocks");
    assert_eq!(io.next_chunk(0, false), None);
}

#[test]
fn chunks_that_wait_start_idle_lanes_while_others_are_loading() {
    let io = StreamIo::default();
    assert_eq!(started_lanes(&io, 0..16, 4), vec![0, 1, 2, 3], "one lane per whole chunk");
    for lane in 0..4 {
        assert!(io.next_chunk(lane, false).is_some());
    }
    // The window grows by two chunks while all four lanes are loading: two more lanes go,
    // rather than the chunks waiting for a lane to finish (a round trip each on a network store).
    assert_eq!(started_lanes(&io, 16..24, 4), vec![4, 5]);
    assert_eq!(io.next_chunk(4, false), Some(16..20));
    assert_eq!(io.next_chunk(5, false), Some(20..24));
}

#[test]
fn a_stream_starts_no_more_lanes_than_it_has() {
    // Twenty whole chunks wait: a local stream starts its eight lanes, a remote one its sixteen.
    assert_eq!(started_lanes_of(&StreamIo::default(), 0..80, 4, LANES), (0..LANES).collect::<Vec<_>>());
    let io = StreamIo::default();
    assert_eq!(started_lanes_of(&io, 0..80, 4, REMOTE_LANES), (0..REMOTE_LANES).collect::<Vec<_>>());
    for lane in 0..REMOTE_LANES {
        assert_eq!(io.next_chunk(lane, false), Some(lane as u64 * 4..lane as u64 * 4 + 4));
    }
    // All sixteen are loading: more chunks wait for one of them, no seventeenth starts.
    assert!(started_lanes_of(&io, 80..100, 4, REMOTE_LANES).is_empty());
}

#[test]
fn refusal_drops_pending_blocks_and_is_reported_once() {
    let io = StreamIo::default();
    io.add_pending(0..4, 10, 1, LANES, |_| true);
    assert_eq!(io.next_chunk(0, false), Some(0..1));
    io.refuse(1);
    io.refuse(3);
    assert_eq!(io.next_chunk(0, false), None);
    assert_eq!(io.take_refusal(), Some(1));
    assert_eq!(io.take_refusal(), None);
    io.add_pending(0..4, 10, 1, LANES, |_| true);
    assert_eq!(io.next_chunk(0, true), None, "stop ends the job");
}

#[test]
fn mapped_advice_comes_in_whole_aligned_chunks() {
    let io = StreamIo::default();
    // (blocks added, reader's end block, advice taken), chunks of 8 blocks in a 100-block source.
    type Step = (Range<u64>, u64, Option<Range<u64>>);
    let steps: &[Step] = &[
        (0..4, 1, Some(0..4)),   // the reader is at the edge: all that waits, at once
        (4..6, 2, None),         // less than a chunk ahead of a reader well behind: wait
        (6..17, 3, Some(4..16)), // up to the last whole chunk's end
        (17..20, 4, None),
        (20..30, 15, Some(16..24)),   // the reader has not caught up with what was advised
        (0..0, 25, Some(24..30)),     // it has: the partial rest goes too
        (30..100, 26, Some(30..100)), // the source's end makes the last run whole
    ];
    for (step, (blocks, reader_end, advice)) in steps.iter().enumerate() {
        assert_eq!(io.take_advice(blocks.clone(), 100, 8, *reader_end), *advice, "step {step}");
    }
}

#[test]
fn mapped_advice_skips_what_the_stream_left_behind() {
    let io = StreamIo::default();
    assert_eq!(io.take_advice(10..12, 100, 8, 0), None);
    io.left_behind(14);
    assert_eq!(io.take_advice(12..40, 100, 8, 14), Some(14..40));
}
