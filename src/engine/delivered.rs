//! What the kernel holds of a source's re-served checkpoint file: the byte ranges it was given by
//! reads of that file. The kernel keeps the pages of every file of the mount it was given (they
//! are opened with `FOPEN_KEEP_CACHE`: the bytes never change), so it does not ask for them
//! again, and prefetching them again is a fetch from the store for nothing: a loader that maps the
//! checkpoint faults in the pages around every tensor's start first, then reads the tensors in
//! another order, and each tensor's stream ran its window over those pages again (issue 45: 95 MB
//! of a 1.2 GB pipeline load). The prefetch of a stream reading that file skips the blocks it
//! covers whole.
//!
//! A read of bytes the kernel was already given means it dropped pages (memory pressure,
//! `drop_caches`, a reader bypassing the page cache): the record is forgotten, and prefetch covers
//! everything again, as it does without one. So is a record of more than
//! [`MAX_DELIVERED_RANGES`] separate ranges (a random reader), which bounds its memory.

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::Mutex;

use crate::util::lock;

/// Most separate ranges remembered per source: a loader's faults at every tensor's start of a
/// checkpoint of a few thousand tensors; beyond it (a random reader) the record is dropped.
pub(crate) const MAX_DELIVERED_RANGES: usize = 8192;

/// The byte ranges of a source given to the kernel through its checkpoint file; see the module doc.
#[derive(Default)]
pub(crate) struct Delivered {
    /// Disjoint, non-touching ranges: start -> end.
    ranges: Mutex<BTreeMap<u64, u64>>,
}

impl Delivered {
    /// Records that the kernel asked for `range` (not empty) of the checkpoint file and is given
    /// it; if it was given any of it before, everything recorded is forgotten first.
    pub(crate) fn read(&self, range: Range<u64>) {
        if range.is_empty() {
            return;
        }
        let mut ranges = lock(&self.ranges);
        if overlaps(&ranges, &range) || ranges.len() >= MAX_DELIVERED_RANGES {
            ranges.clear();
        }
        let (mut start, mut end) = (range.start, range.end);
        if let Some((&s, &e)) = ranges.range(..=start).next_back() {
            if e >= start {
                ranges.remove(&s);
                (start, end) = (s, end.max(e));
            }
        }
        while let Some((&s, &e)) = ranges.range(start..=end).next() {
            ranges.remove(&s);
            end = end.max(e);
        }
        ranges.insert(start, end);
    }

    /// Whether every byte of `range` was given to the kernel (and not asked for again since).
    pub(crate) fn covers(&self, range: Range<u64>) -> bool {
        let ranges = lock(&self.ranges);
        ranges.range(..=range.start).next_back().is_some_and(|(_, &e)| e >= range.end)
    }
}

/// Whether any recorded range shares a byte with `range`.
fn overlaps(ranges: &BTreeMap<u64, u64>, range: &Range<u64>) -> bool {
    let before = ranges.range(..=range.start).next_back().is_some_and(|(_, &e)| e > range.start);
    before || ranges.range(range.start..range.end).next().is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn touching_reads_merge_and_cover_what_they_span() {
        let d = Delivered::default();
        d.read(100..200);
        d.read(300..400);
        d.read(200..300);
        assert!(d.covers(100..400));
        assert!(!d.covers(99..150) && !d.covers(350..401));
        assert_eq!(lock(&d.ranges).len(), 1);
    }

    #[test]
    fn a_read_of_bytes_given_before_forgets_the_record() {
        let d = Delivered::default();
        d.read(0..1000);
        d.read(5000..6000);
        d.read(900..1100);
        assert!(d.covers(900..1100), "the read itself is recorded");
        assert!(!d.covers(0..100) && !d.covers(5000..6000), "the pages given before may be gone");
    }

    #[test]
    fn the_record_is_bounded() {
        let d = Delivered::default();
        for i in 0..MAX_DELIVERED_RANGES as u64 + 10 {
            d.read(i * 10..i * 10 + 5);
        }
        assert!(lock(&d.ranges).len() <= MAX_DELIVERED_RANGES);
    }
}
