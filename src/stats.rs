//! Counters shared by the FUSE layer and the block engine, and their JSON snapshot (with the
//! daemon's process figures of the moment).

pub mod process;
pub mod prometheus;

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Monotonic counters and gauges, updated with relaxed atomics from any thread.
#[derive(Debug, Default)]
pub struct Stats {
    /// FUSE (or extract) read requests served.
    pub fuse_reads: AtomicU64,
    /// Bytes returned by those requests.
    pub fuse_read_bytes: AtomicU64,
    /// Reads that failed with an errno.
    pub read_errors: AtomicU64,
    /// OPEN requests the kernel sent the daemon: at most one per mount, since stfs declines the
    /// first and the kernel then opens files without asking, so this does not count the files
    /// readers opened (`stfs extract` counts each file it copies). In stats.json also as `opens`,
    /// its former name, kept for readers of older documents.
    pub kernel_open_requests: AtomicU64,
    /// Block lookups found in the cache (including blocks still loading).
    pub cache_hits: AtomicU64,
    /// Block lookups that had to start a backing read.
    pub cache_misses: AtomicU64,
    /// Lookups that waited for a load another thread had started (single flight).
    pub single_flight_waits: AtomicU64,
    /// Backing reads issued: one per block load, and one per prefetch chunk of a mapped source
    /// (the kernel is asked to read it into the page cache).
    pub backing_reads: AtomicU64,
    /// Bytes read from the backing source (or asked of it, for a mapped source's prefetch).
    pub backing_read_bytes: AtomicU64,
    /// Replies the kernel copied straight from a source's mapping (no block, no user-space copy).
    pub mapped_reads: AtomicU64,
    /// Bytes of those replies.
    pub mapped_read_bytes: AtomicU64,
    /// Of those, replies spliced from the file into the FUSE device (no mapping touched).
    pub spliced_reads: AtomicU64,
    /// Bytes of those replies.
    pub spliced_read_bytes: AtomicU64,
    /// Times the daemon dropped its page-table entries of a mapping to bound its resident set
    /// (after replies copied from the mapping; spliced replies map nothing).
    pub mapping_releases: AtomicU64,
    /// Reads answered from the bytes a remote source's opening request fetched (its first 64 KiB:
    /// the header, often a first few small tensors): no block load, no request.
    pub opening_reads: AtomicU64,
    /// Bytes of those reads.
    pub opening_read_bytes: AtomicU64,
    /// Backing reads that failed.
    pub backing_errors: AtomicU64,
    /// Sum of the durations of the backing reads made of the store (block loads; not a mapped
    /// source's prefetch advice, which waits for nothing), in microseconds.
    pub backing_read_micros: AtomicU64,
    /// How many of those reads took how long: one bucket per bound of
    /// [`BACKING_LATENCY_BOUNDS_US`], plus one for the rest.
    pub backing_latency_buckets: [AtomicU64; BACKING_LATENCY_BOUNDS_US.len() + 1],
    /// Bytes loaded by readahead rather than on demand.
    pub prefetched_bytes: AtomicU64,
    /// Prefetched bytes evicted before anyone read them.
    pub prefetch_unused_bytes: AtomicU64,
    /// Blocks evicted from the cache.
    pub evictions: AtomicU64,
    /// Bytes currently held by the cache (gauge).
    pub resident_bytes: AtomicU64,
    /// Highest value `resident_bytes` ever reached.
    pub peak_resident_bytes: AtomicU64,
    /// Sequential streams currently tracked (gauge).
    pub streams: AtomicU64,
    /// Sum of the current readahead windows of all streams, in bytes (gauge).
    pub window_bytes: AtomicU64,
    /// HTTP exchanges sent to a remote source (each redirect hop counts).
    pub http_requests: AtomicU64,
    /// Body bytes received from a remote source.
    pub http_bytes: AtomicU64,
    /// HTTP requests repeated after a transient failure.
    pub http_retries: AtomicU64,
    /// Sum of the latencies of those exchanges (send to last body byte), in microseconds.
    pub http_request_micros: AtomicU64,
    /// The longest of those latencies, in microseconds.
    pub http_request_max_micros: AtomicU64,
    /// How many attempts took how long: one bucket per bound of [`HTTP_LATENCY_BOUNDS_MS`], plus
    /// one for the rest.
    pub http_latency_buckets: [AtomicU64; HTTP_LATENCY_BOUNDS_MS.len() + 1],
    /// Blocks found, verified, in the disk cache (`--cache-dir`): no store request.
    pub disk_cache_hits: AtomicU64,
    /// Bytes of those blocks.
    pub disk_cache_hit_bytes: AtomicU64,
    /// Blocks looked up in the disk cache and not there (or not whole): read from the store.
    pub disk_cache_misses: AtomicU64,
    /// Bytes written to the disk cache (block files, headers included).
    pub disk_cache_written_bytes: AtomicU64,
    /// Block files this mount evicted from the disk cache to keep it within its bound.
    pub disk_cache_evictions: AtomicU64,
    /// Disk cache writes or reads that failed (disk full, read-only directory, I/O error).
    pub disk_cache_errors: AtomicU64,
    /// Block files that failed their checksum or length check: removed and fetched again.
    pub disk_cache_corrupt: AtomicU64,
    /// Blocks not written to the disk cache because its write-behind queue was full (a reader
    /// never waits for the disk): a later mount fetches them again.
    pub disk_cache_write_drops: AtomicU64,
    /// Extent files written: one tensor file's bytes exactly, for the kernel to read directly.
    pub disk_cache_extents_written: AtomicU64,
    /// Opens answered with FUSE passthrough to an extent file: the kernel reads (and maps) it
    /// directly and sends the daemon no READ for that open.
    pub passthrough_opens: AtomicU64,
    /// Bytes of the files so opened (what those opens can read without the daemon).
    pub passthrough_open_bytes: AtomicU64,
    /// Opens of a file whose extent file was verified but that the kernel refused to pass
    /// through: served the ordinary way.
    pub passthrough_refused: AtomicU64,
    /// Of `passthrough_opens`, those of a re-served checkpoint file: passed through to the local
    /// file itself (pinned, checked unchanged at that open), or to a remote shard's whole-file
    /// extent in the disk cache.
    pub passthrough_checkpoint_opens: AtomicU64,
    /// Local files handed to the kernel (re-served checkpoint files) that were seen to change
    /// while mounted (written, truncated, renamed, deleted, attributes set): no longer handed
    /// over; readers that held one open read it as it is now.
    pub passthrough_files_changed: AtomicU64,
    /// 1 while the kernel agreed to FUSE passthrough for this mount (root, a kernel with it, and
    /// something to pass through); 0: every byte crosses the daemon, as without it (gauge).
    pub passthrough_enabled: AtomicU64,
    /// The largest read request the kernel agreed to send, in bytes (its `max_pages`, as
    /// `fs.fuse.max_pages_limit` allows; gauge, 0 until the handshake).
    pub max_request_bytes: AtomicU64,
    /// 1 while the mount's requests go through FUSE over io_uring (`--io-uring`, and the kernel
    /// agreed and took every queue's entry); 0: through `/dev/fuse` (gauge).
    pub io_uring_enabled: AtomicU64,
    /// Requests answered on the io_uring transport (the rest, and FORGET and INTERRUPT always,
    /// came through `/dev/fuse`).
    pub io_uring_requests: AtomicU64,
    /// Bytes the disk cache holds, as this mount last counted them (gauge).
    pub disk_cache_bytes: AtomicU64,
    /// The disk cache's bound in bytes (0: no disk cache).
    pub disk_cache_limit: AtomicU64,
}

/// Exclusive upper bounds, in milliseconds, of the HTTP latency histogram's buckets: from a
/// loopback or same-zone answer to a stalled one (the last bucket holds everything slower).
pub const HTTP_LATENCY_BOUNDS_MS: [u64; 9] = [1, 5, 20, 50, 100, 250, 500, 1000, 5000];

/// Exclusive upper bounds, in microseconds, of the backing read histogram's buckets: from a block
/// in the page cache (well under a millisecond) to a store that stalls (the last bucket holds
/// everything slower than 10 s).
pub const BACKING_LATENCY_BOUNDS_US: [u64; 14] = [
    100, 500, 1_000, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000, 1_000_000, 2_500_000, 5_000_000,
    10_000_000,
];

/// The bucket of `value` among exclusive upper `bounds` (`bounds.len()` for the rest).
fn bucket_of(bounds: &[u64], value: u64) -> usize {
    bounds.iter().position(|&bound| value < bound).unwrap_or(bounds.len())
}

/// A histogram as a JSON object: `"<B"` for each bound B, in order, then `">=LAST"`.
fn histogram_json(bounds: &[u64], buckets: &[AtomicU64]) -> serde_json::Value {
    let mut map = serde_json::Map::new();
    for (i, count) in buckets.iter().enumerate() {
        let key = match bounds.get(i) {
            Some(bound) => format!("<{bound}"),
            None => format!(">={}", bounds.last().copied().unwrap_or(0)),
        };
        map.insert(key, count.load(Relaxed).into());
    }
    map.into()
}

impl Stats {
    /// Adds `n` to a counter.
    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Relaxed);
    }

    /// Records one HTTP attempt (a request and its redirect hops, to the last body byte) that took
    /// `micros`: in the total, the maximum and the histogram.
    pub fn record_http_latency(&self, micros: u64) {
        Stats::add(&self.http_request_micros, micros);
        self.http_request_max_micros.fetch_max(micros, Relaxed);
        let bucket = bucket_of(&HTTP_LATENCY_BOUNDS_MS, micros / 1000);
        Stats::add(&self.http_latency_buckets[bucket], 1);
    }

    /// Records one backing read of the store that took `micros`: in the total and the histogram.
    pub fn record_backing_latency(&self, micros: u64) {
        Stats::add(&self.backing_read_micros, micros);
        Stats::add(&self.backing_latency_buckets[bucket_of(&BACKING_LATENCY_BOUNDS_US, micros)], 1);
    }

    /// Changes the resident-bytes gauge by `delta` and keeps the peak.
    pub fn add_resident(&self, delta: i64) {
        let now = if delta >= 0 {
            self.resident_bytes.fetch_add(delta as u64, Relaxed) + delta as u64
        } else {
            self.resident_bytes.fetch_sub(delta.unsigned_abs(), Relaxed) - delta.unsigned_abs()
        };
        self.peak_resident_bytes.fetch_max(now, Relaxed);
    }

    /// A point-in-time JSON object of every counter, keyed by field name.
    pub fn to_json(&self) -> serde_json::Value {
        let g = |c: &AtomicU64| serde_json::Value::from(c.load(Relaxed));
        let fields = [
            ("fuse_reads", g(&self.fuse_reads)),
            ("fuse_read_bytes", g(&self.fuse_read_bytes)),
            ("read_errors", g(&self.read_errors)),
            ("kernel_open_requests", g(&self.kernel_open_requests)),
            ("opens", g(&self.kernel_open_requests)),
            ("cache_hits", g(&self.cache_hits)),
            ("cache_misses", g(&self.cache_misses)),
            ("single_flight_waits", g(&self.single_flight_waits)),
            ("backing_reads", g(&self.backing_reads)),
            ("backing_read_bytes", g(&self.backing_read_bytes)),
            ("backing_errors", g(&self.backing_errors)),
            ("backing_read_micros", g(&self.backing_read_micros)),
            ("backing_read_latency_us", histogram_json(&BACKING_LATENCY_BOUNDS_US, &self.backing_latency_buckets)),
            ("mapped_reads", g(&self.mapped_reads)),
            ("mapped_read_bytes", g(&self.mapped_read_bytes)),
            ("spliced_reads", g(&self.spliced_reads)),
            ("spliced_read_bytes", g(&self.spliced_read_bytes)),
            ("mapping_releases", g(&self.mapping_releases)),
            ("opening_reads", g(&self.opening_reads)),
            ("opening_read_bytes", g(&self.opening_read_bytes)),
            ("prefetched_bytes", g(&self.prefetched_bytes)),
            ("prefetch_unused_bytes", g(&self.prefetch_unused_bytes)),
            ("evictions", g(&self.evictions)),
            ("resident_bytes", g(&self.resident_bytes)),
            ("peak_resident_bytes", g(&self.peak_resident_bytes)),
            ("streams", g(&self.streams)),
            ("window_bytes", g(&self.window_bytes)),
            ("http_requests", g(&self.http_requests)),
            ("http_bytes", g(&self.http_bytes)),
            ("http_retries", g(&self.http_retries)),
            ("http_request_micros", g(&self.http_request_micros)),
            ("http_request_max_micros", g(&self.http_request_max_micros)),
            ("http_request_latency_ms", histogram_json(&HTTP_LATENCY_BOUNDS_MS, &self.http_latency_buckets)),
            ("disk_cache_hits", g(&self.disk_cache_hits)),
            ("disk_cache_hit_bytes", g(&self.disk_cache_hit_bytes)),
            ("disk_cache_misses", g(&self.disk_cache_misses)),
            ("disk_cache_written_bytes", g(&self.disk_cache_written_bytes)),
            ("disk_cache_evictions", g(&self.disk_cache_evictions)),
            ("disk_cache_errors", g(&self.disk_cache_errors)),
            ("disk_cache_corrupt", g(&self.disk_cache_corrupt)),
            ("disk_cache_write_drops", g(&self.disk_cache_write_drops)),
            ("disk_cache_extents_written", g(&self.disk_cache_extents_written)),
            ("passthrough_opens", g(&self.passthrough_opens)),
            ("passthrough_open_bytes", g(&self.passthrough_open_bytes)),
            ("passthrough_refused", g(&self.passthrough_refused)),
            ("passthrough_checkpoint_opens", g(&self.passthrough_checkpoint_opens)),
            ("passthrough_files_changed", g(&self.passthrough_files_changed)),
            ("passthrough_enabled", g(&self.passthrough_enabled)),
            ("max_request_bytes", g(&self.max_request_bytes)),
            ("io_uring_enabled", g(&self.io_uring_enabled)),
            ("io_uring_requests", g(&self.io_uring_requests)),
            ("disk_cache_bytes", g(&self.disk_cache_bytes)),
            ("disk_cache_limit", g(&self.disk_cache_limit)),
        ];
        let process = process::ProcessSample::now().fields().into_iter().map(|(k, v)| (k, serde_json::Value::from(v)));
        serde_json::Value::Object(fields.into_iter().chain(process).map(|(k, v)| (k.to_string(), v)).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_latencies_land_in_their_buckets_and_the_maximum() {
        let stats = Stats::default();
        for micros in [500, 3_000, 19_999, 20_000, 7_000_000] {
            stats.record_http_latency(micros);
        }
        let json = stats.to_json();
        let histogram = &json["http_request_latency_ms"];
        for (key, want) in [("<1", 1), ("<5", 1), ("<20", 1), ("<50", 1), ("<100", 0), (">=5000", 1)] {
            assert_eq!(histogram[key], want, "{key}: {histogram}");
        }
        assert_eq!(histogram.as_object().map(|m| m.len()), Some(HTTP_LATENCY_BOUNDS_MS.len() + 1));
        assert_eq!(json["http_request_max_micros"], 7_000_000);
        assert_eq!(json["http_request_micros"], 500 + 3_000 + 19_999 + 20_000 + 7_000_000);
    }

    #[test]
    fn backing_latencies_land_in_their_buckets() {
        let stats = Stats::default();
        for micros in [0, 99, 100, 4_999, 10_000_000, u64::MAX / 2] {
            stats.record_backing_latency(micros);
        }
        let json = stats.to_json();
        let histogram = &json["backing_read_latency_us"];
        for (key, want) in [("<100", 2), ("<500", 1), ("<1000", 0), ("<5000", 1), ("<10000000", 0), (">=10000000", 2)] {
            assert_eq!(histogram[key], want, "{key}: {histogram}");
        }
        assert_eq!(histogram.as_object().map(|m| m.len()), Some(BACKING_LATENCY_BOUNDS_US.len() + 1));
        assert_eq!(json["backing_read_micros"], 99 + 100 + 4_999 + 10_000_000 + u64::MAX / 2);
    }

    #[test]
    fn latency_buckets_print_in_numeric_order() {
        // `stfs stats` prints the document as rendered: the buckets must read <1, <5, <20, ...
        let text = serde_json::to_string(&Stats::default().to_json()).unwrap();
        let at = |key: &str| text.find(&format!("\"{key}\"")).unwrap_or_else(|| panic!("{key} in {text}"));
        // Each histogram's keys, looked for after the histogram's own name (both have a "<1000").
        for (name, bounds) in [
            ("http_request_latency_ms", &HTTP_LATENCY_BOUNDS_MS[..]),
            ("backing_read_latency_us", &BACKING_LATENCY_BOUNDS_US),
        ] {
            let from = at(name);
            let after = |key: &str| from + text[from..].find(&format!("\"{key}\"")).unwrap_or(text.len());
            let mut keys: Vec<String> = bounds.iter().map(|b| format!("<{b}")).collect();
            keys.push(format!(">={}", bounds[bounds.len() - 1]));
            let places: Vec<usize> = keys.iter().map(|k| after(k)).collect();
            assert!(places.windows(2).all(|w| w[0] < w[1]) && places[keys.len() - 1] < text.len(), "{name}: {text}");
        }
        // The counters keep the order they are declared in, too.
        assert!(at("fuse_reads") < at("cache_hits") && at("cache_hits") < at("http_requests"), "{text}");
    }
}
