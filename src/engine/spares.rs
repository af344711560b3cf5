//! The spare descriptors of one source: readers kept open for loads outside a confirmed stream.
//!
//! A read that belongs to no confirmed stream borrows a descriptor from here and gives it back,
//! so random readers do not open a file (or a connection) per read. A stream's descriptors are
//! taken from here on first use, and return here when the stream is replaced.

use std::sync::Mutex;

use super::tuning::SPARE_DESCRIPTORS;
use crate::source::SourceReader;
use crate::util::lock;

/// Idle descriptors of one source, at most [`SPARE_DESCRIPTORS`].
#[derive(Default)]
pub(crate) struct Spares(Mutex<Vec<Box<dyn SourceReader>>>);

impl Spares {
    /// An idle descriptor, if one is kept.
    pub(crate) fn take(&self) -> Option<Box<dyn SourceReader>> {
        lock(&self.0).pop()
    }

    /// Closes every idle descriptor kept.
    pub(crate) fn clear(&self) {
        lock(&self.0).clear();
    }

    /// Keeps `descriptor` for a later read, unless enough are kept already (it is then closed).
    pub(crate) fn keep(&self, descriptor: Option<Box<dyn SourceReader>>) {
        let mut spares = lock(&self.0);
        if let Some(descriptor) = descriptor {
            if spares.len() < SPARE_DESCRIPTORS {
                spares.push(descriptor);
            }
        }
    }
}
