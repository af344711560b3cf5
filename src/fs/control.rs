//! The control file `.stfs/stats.json`: the live counters as a JSON document, taken anew at each
//! lookup of its name and served unchanged by every read and getattr until the next lookup.

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use crate::stats::Stats;
use crate::tree::namespace::{Content, NodeKind};
use crate::util::lock;

/// The stats document as rendered at the last lookup of stats.json, and when.
pub(crate) struct StatsFile {
    stats: Arc<Stats>,
    snapshot: Mutex<(Arc<[u8]>, SystemTime)>,
}

impl StatsFile {
    /// The document of `stats`, rendered once now.
    pub(crate) fn new(stats: Arc<Stats>) -> StatsFile {
        let file = StatsFile { stats, snapshot: Mutex::new((Arc::from(&[][..]), SystemTime::UNIX_EPOCH)) };
        file.renew();
        file
    }

    /// Renders the document anew, with an mtime later than the last one's.
    pub(crate) fn renew(&self) {
        let mut json = serde_json::to_vec_pretty(&self.stats.to_json()).unwrap_or_default();
        json.push(b'\n');
        let mut now = SystemTime::now();
        let mut current = lock(&self.snapshot);
        // A new mtime tells the kernel that its cached pages of the old document are stale.
        if now <= current.1 {
            now = current.1 + Duration::from_nanos(1);
        }
        *current = (json.into(), now);
    }

    /// The document served now, and when it was taken.
    pub(crate) fn current(&self) -> (Arc<[u8]>, SystemTime) {
        lock(&self.snapshot).clone()
    }
}

/// Whether a node is the stats document, rendered anew at each lookup.
pub(crate) fn is_stats(kind: &NodeKind) -> bool {
    matches!(kind, NodeKind::File { content: Content::Stats, .. })
}
