//! Single flight: the [`LoadSlot`] where every reader of a block that is loading waits for the one
//! load in flight, and gets its bytes or its error.
//!
//! The cache keeps a slot per block being loaded and hands the loader a
//! [`LoadTicket`](super::LoadTicket); when the ticket completes or fails, the slot is finished and
//! every waiter wakes. The slot knows nothing of the cache's budget or its LRU.

use std::io;
use std::sync::{Condvar, Mutex};
use std::time::Duration;

use crate::util::{lock, wait_while};

/// The bytes of one loaded block, shared by the cache and every reader holding it.
pub type BlockData = std::sync::Arc<Vec<u8>>;

/// Where readers of a block that is loading wait for its bytes or its error.
pub struct LoadSlot {
    state: Mutex<SlotState>,
    done: Condvar,
    prefetched: bool,
}

enum SlotState {
    Loading,
    Ready(BlockData),
    /// io::Error is not Clone; every waiter gets a fresh error with the same kind and text.
    Failed(io::ErrorKind, String),
}

impl LoadSlot {
    /// A slot for a load started by readahead (`prefetched`) or by a reader.
    pub(super) fn new(prefetched: bool) -> LoadSlot {
        LoadSlot { state: Mutex::new(SlotState::Loading), done: Condvar::new(), prefetched }
    }

    /// Blocks until the load finishes, or fails with `TimedOut` after `timeout`.
    pub fn wait(&self, timeout: Duration) -> io::Result<BlockData> {
        let state = lock(&self.state);
        let state = wait_while(&self.done, state, timeout, |s| matches!(s, SlotState::Loading));
        match &*state {
            SlotState::Ready(data) => Ok(BlockData::clone(data)),
            SlotState::Failed(kind, text) => Err(io::Error::new(*kind, text.clone())),
            SlotState::Loading => Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("gave up waiting for another reader's load after {timeout:?}"),
            )),
        }
    }

    /// Whether the load was started by readahead (a waiter may retry a failed prefetch itself).
    pub fn is_prefetch(&self) -> bool {
        self.prefetched
    }

    /// Hands the loaded bytes to the waiters.
    pub(super) fn ready(&self, data: BlockData) {
        self.finish(SlotState::Ready(data));
    }

    /// Hands the waiters an error of this kind and text.
    pub(super) fn failed(&self, kind: io::ErrorKind, text: String) {
        self.finish(SlotState::Failed(kind, text));
    }

    fn finish(&self, outcome: SlotState) {
        *lock(&self.state) = outcome;
        self.done.notify_all();
    }
}
