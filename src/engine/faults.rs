//! A loader's page faults walking the tensor starts of a mapped checkpoint file, and the fetch of
//! the faults it will take next, before it takes them.
//!
//! `DiffusionPipeline.from_pretrained` (safetensors maps the file) touches the page at each
//! tensor's start, in file order, before it reads any tensor: one page fault per tensor, each
//! waiting for its read-around (the kernel's readahead, centred on the fault: two requests of the
//! largest read size around it) to come from the store, one after the other. Through the mount each
//! fault cost two 1 MiB transfers where the store read directly costs one 256 KiB read, so the
//! call took longer than on the folder (issue 45). The faults are predictable: the engine is told
//! where the tensors of a checkpoint start ([`FaultWalk::set_starts`]), and once reads of the
//! re-served file took in tensor starts one after the other, in file order, [`WALK_STEPS`] times
//! beyond the first (a walk), each further step asks for the read-around of the next
//! [`FAULTS_AHEAD`] tensor starts at once, on the I/O threads (`prefetch`): the faults then find
//! their bytes in the cache. Only the bytes the kernel would ask for are fetched (the largest read
//! seen either side of each start), so a walk costs no byte more than the faults themselves;
//! blocks the kernel already holds are skipped by the fetch.
//!
//! A walk reads nothing but the read-around of each start. A loader reading the file in order (or
//! several workers each reading every n-th tensor) takes in every start as well, but also reads
//! the bytes of the tensors between: a read that takes in no start and is no fault's read-around
//! (inside a tensor, further than a read from the next start) ends a walk, and the steps towards
//! one. Before that rule, every reader going through the file fetched the read-around of its next
//! 32 starts out of turn whenever it took in two starts in a row (the pipeline benchmark's 4-worker
//! file loader: 1.073x the checkpoint's bytes in 2,421 requests, against 1.019x in 949 with it;
//! docs/notes/benchmarks.md). Telling the walk by the bytes it skips instead (a step counted only
//! past a gap no read covered) was tried and dropped: where tensors are small, a walk's faults
//! read every byte too, and the call lost its lead (0.92x the folder instead of 1.2x).
//!
//! A read that takes in a start before the walk's (a second pass, another reader) starts a new
//! walk; one far ahead of it (past the starts already asked for) too. A read of the walk goes to no
//! stream (`core`) unless it is near a stream's cursor: a loader reading the file in order takes in
//! every start as well, and keeping all such reads from their streams left it without readahead
//! (tried: the pipeline benchmark's file loader went from faster than the folder to 0.66x), while
//! letting every one through let the faults, a few MiB apart, feed one stream whose window ran on
//! into the tensors between them (the call stayed at about 0.6x the folder's time;
//! docs/notes/benchmarks.md).

use std::ops::Range;
use std::sync::Mutex;

use crate::util::lock;

/// Tensor starts whose read-around is asked for ahead of a walk's last fault: at 2 MiB each, at
/// most 64 MiB in flight or waiting in the cache (a stream's largest window), enough for the I/O
/// threads to keep every lane busy while the loader faults on.
pub(crate) const FAULTS_AHEAD: usize = 32;

/// Steps in a row (reads taking in the next starts, with no read inside a tensor between them)
/// before the next faults are fetched ahead: a few faults of 330 (the pipeline's UNet) go without,
/// and workers reading every n-th tensor of the file, whose reads at tensor starts come together
/// now and then, seldom look like a walk.
pub(crate) const WALK_STEPS: usize = 3;

/// Largest read-around taken either side of a start: the kernel's requests are at most 16 MiB
/// (`fs.fuse.max_pages_limit`), but a loader's read-around is its readahead, 1 MiB by default.
const MOST_AROUND_BYTES: u64 = 4 << 20;

/// The tensor starts of one source and the walk of the faults through them; see the module doc.
#[derive(Default)]
pub(crate) struct FaultWalk {
    state: Mutex<Walk>,
}

#[derive(Default)]
struct Walk {
    /// Tensor starts (source offsets), sorted, without repeats; empty: not a checkpoint.
    starts: Vec<u64>,
    /// One past the index of the last start a read took in (0: none yet).
    last: usize,
    /// Starts below this index have had their read-around asked for.
    asked: usize,
    /// Whether the reads since the walk began form one ([`WALK_STEPS`] steps in file order).
    walking: bool,
    /// The largest read of the checkpoint file seen: the kernel's read size.
    largest_read: u64,
    /// Steps in a row, with no read inside a tensor between them, while not yet walking.
    steps: usize,
}

impl FaultWalk {
    /// Sets where the tensors of the source start (source offsets, any order).
    pub(crate) fn set_starts(&self, mut starts: Vec<u64>) {
        starts.sort_unstable();
        starts.dedup();
        *lock(&self.state) = Walk { starts, ..Walk::default() };
    }

    /// A read of `range` of the re-served checkpoint file (of a source of `len` bytes). `None`
    /// unless the read is one of a walk's faults: a step (it takes in the start past the walk's
    /// last, within those asked for) or, once walking, a read inside the read-around of a start
    /// ahead. Otherwise the byte ranges to fetch ahead now (the read-around of the walk's next
    /// starts, merged where they touch), in file order; often none.
    pub(crate) fn read(&self, range: Range<u64>, len: u64) -> Option<Vec<Range<u64>>> {
        let mut walk = lock(&self.state);
        walk.largest_read = walk.largest_read.max(range.end - range.start);
        let around = walk.largest_read.min(MOST_AROUND_BYTES);
        let first = walk.starts.partition_point(|&s| s < range.start);
        let end = walk.starts.partition_point(|&s| s < range.end);
        if first == end {
            // No start: the half of a fault's read-around before the start it faults on, or
            // a read inside a tensor, which ends a walk.
            let next = walk.starts.get(end).map(|&s| s / 4096 * 4096);
            let before_next = next.is_some_and(|page| range.start.saturating_add(around) >= page);
            if !before_next {
                (walk.walking, walk.steps) = (false, 0);
                return None;
            }
            return (walk.walking && end >= walk.last && end < walk.asked).then(Vec::new);
        }
        if end == walk.last && first + 1 >= end {
            // Only the walk's last start again: the other half of its read-around.
            return walk.walking.then(Vec::new);
        }
        // A step: the read takes in a start past the last one, and none beyond those asked for
        // (or the next one, before anything was asked).
        let reach = walk.asked.max(walk.last + 1);
        if walk.last == 0 || end <= walk.last || first > reach {
            *walk = Walk { last: end, asked: end, walking: false, steps: 0, ..std::mem::take(&mut *walk) };
            return None;
        }
        walk.last = end;
        if !walk.walking {
            walk.asked = walk.asked.max(end);
            walk.steps += 1;
            if walk.steps < WALK_STEPS {
                return None;
            }
            walk.walking = true;
        }
        let from = walk.asked.max(end);
        let to = (end + FAULTS_AHEAD).min(walk.starts.len());
        let mut regions: Vec<Range<u64>> = Vec::new();
        if from < to {
            walk.asked = to;
            for &start in &walk.starts[from..to] {
                let page = start / 4096 * 4096;
                let region = page.saturating_sub(around)..page.saturating_add(around).min(len);
                match regions.last_mut() {
                    Some(last) if region.start <= last.end => last.end = last.end.max(region.end),
                    _ => regions.push(region),
                }
            }
        }
        Some(regions)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering::Relaxed;
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;
    use crate::engine::readahead::Extent;
    use crate::engine::test_support::fake;
    use crate::engine::tuning::INITIAL_WINDOW_BYTES;
    use crate::engine::{Engine, EngineConfig, ReadaheadConfig};
    use crate::stats::Stats;
    use crate::util::test_support::eventually;

    const MIB: u64 = 1 << 20;

    fn walk(starts: &[u64]) -> FaultWalk {
        let w = FaultWalk::default();
        w.set_starts(starts.to_vec());
        w
    }

    /// The read-around of a fault at `at`: two 1 MiB requests, before and after its page.
    /// What the walk fetches for it, and whether both reads were taken as the walk's.
    fn fault(w: &FaultWalk, at: u64) -> (Vec<Range<u64>>, bool) {
        let before = w.read(at - MIB..at, 1 << 40);
        let after = w.read(at..at + MIB, 1 << 40);
        let walked = before.is_some() && after.is_some();
        (before.into_iter().chain(after).flatten().collect(), walked)
    }

    /// Faults at `starts[from..=from + WALK_STEPS]`, the last of which begins the walk: what it
    /// fetched.
    fn begin_walk(w: &FaultWalk, starts: &[u64], from: usize) -> Vec<Range<u64>> {
        for &at in &starts[from..from + WALK_STEPS] {
            assert_eq!(fault(w, at), (vec![], false), "a walk begins after {WALK_STEPS} steps");
        }
        fault(w, starts[from + WALK_STEPS]).0
    }

    /// Reads of `size` bytes from `from` to `to`, each taken as one of a walk's faults or fetching.
    fn read_through(w: &FaultWalk, from: u64, to: u64, size: u64) -> usize {
        (from..to).step_by(size as usize).filter(|&at| w.read(at..at + size, 1 << 40).is_some()).count()
    }

    #[test]
    fn faults_in_file_order_fetch_the_next_starts_read_around() {
        let starts: Vec<u64> = (1..=100).map(|i| i * 10 * MIB).collect();
        let w = walk(&starts);
        let asked = begin_walk(&w, &starts, 0);
        let expected: Vec<Range<u64>> =
            starts[WALK_STEPS + 1..WALK_STEPS + 1 + FAULTS_AHEAD].iter().map(|&s| s - MIB..s + MIB).collect();
        assert_eq!(asked, expected, "the next starts, the read size either side");
        let next = starts[WALK_STEPS + 1 + FAULTS_AHEAD];
        let (asked, walked) = fault(&w, starts[WALK_STEPS + 1]);
        assert_eq!(asked.first(), Some(&(next - MIB..next + MIB)), "one more at each step");
        assert_eq!((asked.len(), walked), (1, true));
    }

    #[test]
    fn touching_read_arounds_merge() {
        // Faults 10 MiB apart begin the walk; the starts after them lie 1 MiB apart.
        let mut starts: Vec<u64> = (1..=WALK_STEPS as u64 + 1).map(|i| i * 10 * MIB).collect();
        let dense = starts[WALK_STEPS] + MIB;
        starts.extend((0..10).map(|i| dense + i * MIB + 100));
        let w = walk(&starts);
        assert_eq!(begin_walk(&w, &starts, 0), vec![dense - MIB..dense + 10 * MIB]);
        // The faults there read on from the last one without a gap, and the walk goes on.
        assert_eq!(fault(&w, starts[WALK_STEPS + 1]), (vec![], true));
    }

    #[test]
    fn a_read_behind_the_walk_or_far_ahead_of_it_fetches_nothing() {
        let starts: Vec<u64> = (1..=100).map(|i| i * 10 * MIB).collect();
        let w = walk(&starts);
        assert_eq!(begin_walk(&w, &starts, 50).len(), FAULTS_AHEAD);
        assert_eq!(fault(&w, starts[10]), (vec![], false), "behind: a new walk");
        assert_eq!(fault(&w, starts[90]), (vec![], false), "far ahead: a new walk");
        assert!(!begin_walk(&w, &starts, 90).is_empty(), "and that one walks on");
    }

    #[test]
    fn reads_that_are_no_fault_of_the_walk_are_left_to_the_streams() {
        let starts: Vec<u64> = (1..=100).map(|i| i * 10 * MIB).collect();
        let w = walk(&starts);
        let last = starts[WALK_STEPS];
        begin_walk(&w, &starts, 0);
        assert!(w.read(last + 9 * MIB..last + 10 * MIB, 1 << 40).is_some(), "a fault's first half");
        assert!(w.read(last + 3 * MIB..last + 4 * MIB, 1 << 40).is_none(), "inside a tensor");
        // That read went through a tensor's bytes, as a reader does and a walk does not: the
        // walk is over, and the next faults begin a new one.
        assert_eq!(fault(&w, starts[WALK_STEPS + 1]), (vec![], false));
        assert!(w.read(starts[20] - 2 * MIB..starts[20] - MIB, 1 << 40).is_none(), "too far before a start");
    }

    #[test]
    fn a_reader_going_through_the_file_is_no_walk() {
        // Tensors of 3 MiB and 10 MiB, read in order by 1 MiB; and tensors of 3 MiB, each read
        // from its start (the kernel's first request at a fault takes in the start too).
        for size in [3 * MIB, 10 * MIB] {
            let starts: Vec<u64> = (0..200).map(|i| 4096 + i * size).collect();
            let w = walk(&starts);
            assert_eq!(read_through(&w, 0, 200 * size, MIB), 0, "tensors of {size} bytes");
        }
        let starts: Vec<u64> = (0..200).map(|i| i * 3 * MIB).collect();
        let w = walk(&starts);
        let reads = starts.iter().flat_map(|&s| [s - s.min(MIB), s, s + MIB, s + 2 * MIB]);
        assert_eq!(reads.filter(|&at| w.read(at..at + MIB, 1 << 40).is_some()).count(), 0);
    }

    #[test]
    fn workers_each_reading_every_fourth_tensor_seldom_walk() {
        // Tensors of 10 MiB; four workers, each reading every 4th of them through by 1 MiB, one
        // read each in turn, worker w w reads behind worker 0 (none keeps pace with another).
        // Where their reads at tensor starts come in a row (the first round), they look like a
        // walk's faults; each worker's next read, inside its tensor, ends it.
        let starts: Vec<u64> = (0..64).map(|i| 4096 + i * 10 * MIB).collect();
        let w = walk(&starts);
        let mut fetches = 0;
        for turn in 0..200 {
            for worker in 0..4_u64 {
                let Some(read) = (turn as u64).checked_sub(worker * worker) else { continue };
                let Some(&start) = starts.get((read / 10 * 4 + worker) as usize) else { continue };
                let at = start / MIB * MIB + read % 10 * MIB;
                fetches += w.read(at..at + MIB, 1 << 40).is_some_and(|asked| !asked.is_empty()) as usize;
            }
        }
        assert!(fetches <= 1, "{fetches} fetches ahead for workers reading the tensors through");
    }

    #[test]
    fn a_source_without_starts_fetches_nothing() {
        let w = FaultWalk::default();
        assert!(w.read(0..MIB, 10 * MIB).is_none() && w.read(MIB..2 * MIB, 10 * MIB).is_none());
    }

    /// A loader that maps a checkpoint and faults in the page at each tensor's start, in file order,
    /// before it reads any tensor (issue 45: `DiffusionPipeline.from_pretrained`), finds its next
    /// faults' bytes fetched before it takes them: once the walk has begun, no fault (two
    /// reads, before and after its page, as the kernel's read-around) misses the cache, and nothing
    /// but the faults' read-arounds is fetched (the faults before it began, pairs of reads, are a sequential
    /// stream's, whose first window follows them; the walk's faults then go to no stream). Before,
    /// each fault waited for its own loads.
    #[test]
    fn faults_walking_the_tensor_starts_have_their_bytes_fetched_first() {
        let bs = 64 << 10;
        let around = 256 << 10;
        let source = fake(64 << 20, Duration::from_millis(5));
        let stats = Arc::new(Stats::default());
        let config = EngineConfig {
            block_size: bs,
            cache_size: 32 << 20,
            io_threads: 4,
            map_files: true,
            source_timeout: Duration::from_secs(30),
        };
        let mut readahead = ReadaheadConfig::new(bs, 32 << 20);
        // Slack scaled to the small test blocks, as the engine's own tests do.
        (readahead.back_slack, readahead.forward_slack) = (bs / 2, 2 * bs);
        let engine = Engine::with_readahead(config, readahead, Arc::clone(&stats));
        let id = engine.add_source(Arc::new(Arc::clone(&source)));
        let starts: Vec<u64> = (0..30).map(|i| (1 << 20) + i * (2 << 20) + 3 * 4096 + 100).collect();
        engine.set_tensor_starts(id, starts.clone());
        let read_arounds: Vec<std::ops::Range<u64>> = starts
            .iter()
            .map(|s| (s / 4096 * 4096 - around) / bs * bs..(s / 4096 * 4096 + around).div_ceil(bs) * bs)
            .collect();
        let fault = |at: u64| {
            let page = at / 4096 * 4096;
            for (from, to) in [(page - around, page), (page, page + around)] {
                let extent = Extent::in_checkpoint_file(from..to);
                let got = engine.read_in(id, extent, from, (to - from) as usize, <[u8]>::to_vec).unwrap();
                assert!(got == source.data[from as usize..to as usize], "bytes at {from}");
            }
        };
        for &start in &starts[..=WALK_STEPS] {
            fault(start);
        }
        let fetched = |range: &std::ops::Range<u64>| {
            let reads = lock(&source.reads);
            (range.start..range.end)
                .step_by(bs as usize)
                .all(|block| reads.iter().any(|&(o, n)| o <= block && block < o + n as u64))
        };
        eventually("the read-around of the next faults fetched", || read_arounds[WALK_STEPS + 1..].iter().all(fetched));
        let misses = stats.cache_misses.load(Relaxed);
        for &start in &starts[WALK_STEPS + 1..] {
            fault(start);
        }
        assert_eq!(stats.cache_misses.load(Relaxed), misses, "a fault missed the cache");
        assert_eq!(stats.streams.load(Relaxed), WALK_STEPS as u64 + 1, "the walk's faults started streams");
        let with_window = |r: &std::ops::Range<u64>| r.start..r.end + INITIAL_WINDOW_BYTES;
        for &(offset, n) in lock(&source.reads).iter() {
            let inside = read_arounds.iter().map(with_window).any(|r| r.start <= offset && offset + n as u64 <= r.end);
            assert!(inside, "a backing read of {n} at {offset} is no fault's read-around");
        }
    }
}
