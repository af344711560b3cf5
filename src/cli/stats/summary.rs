//! The human summary of a stats document that `stfs stats MNT` prints: the bytes programs read
//! from the mount, the bytes stfs read from the source for them (and how), opens handed to the
//! kernel, cache hit rates, throughput, the transport (`/dev/fuse` or FUSE over io_uring) and
//! errors, a few lines a person reads at a glance, in a reader's words rather than the counters'
//! names (`--json` prints the document itself). Under `--watch` the throughput is over the last
//! interval, from the previous document.

use std::fmt::Write;

use serde_json::Value;

use crate::cli::progress::human;

/// A counter of the document (0 where absent: an older daemon, or a field only some mounts have).
fn n(doc: &Value, key: &str) -> u64 {
    doc.get(key).and_then(Value::as_u64).unwrap_or(0)
}

/// `part` of `whole` as a percentage with one decimal, or `-` when nothing was counted.
fn percent(part: u64, whole: u64) -> String {
    if whole == 0 {
        "-".to_string()
    } else {
        format!("{:.1}%", part as f64 * 100.0 / whole as f64)
    }
}

/// `count` things, the noun in the plural unless there is one: `1 request`, `2 requests`.
fn things(count: u64, noun: &str) -> String {
    if count == 1 {
        format!("1 {noun}")
    } else {
        format!("{count} {noun}s")
    }
}

/// Seconds as `1h 02m`, `3m 05s` or `12s`.
fn duration(seconds: u64) -> String {
    match seconds {
        s if s >= 3600 => format!("{}h {:02}m", s / 3600, s % 3600 / 60),
        s if s >= 60 => format!("{}m {:02}s", s / 60, s % 60),
        s => format!("{s}s"),
    }
}

/// The bytes that came from the store: what HTTP(S)/S3/GCS requests received for a remote
/// source; for a local one, what the block cache read (or asked the kernel to prefetch) plus the
/// replies the kernel copied or spliced straight from the file.
fn store_bytes(doc: &Value) -> u64 {
    if n(doc, "http_requests") > 0 {
        n(doc, "http_bytes")
    } else {
        n(doc, "backing_read_bytes") + n(doc, "mapped_read_bytes")
    }
}

/// The throughput line: over the last `interval` seconds from `previous` under `--watch`, else the
/// average since the daemon started (`now` is the time of day in seconds).
fn throughput(doc: &Value, previous: Option<(&Value, f64)>, now: u64) -> String {
    let (served, store, seconds, over) = match previous {
        Some((before, interval)) => (
            n(doc, "fuse_read_bytes").saturating_sub(n(before, "fuse_read_bytes")),
            store_bytes(doc).saturating_sub(store_bytes(before)),
            interval,
            format!("over the last {interval:.1} s"),
        ),
        None => {
            let up = now.saturating_sub(n(doc, "process_start_time_seconds")).max(1);
            (n(doc, "fuse_read_bytes"), store_bytes(doc), up as f64, "on average since the mount".to_string())
        }
    };
    let rate = |bytes: u64| human(bytes as f64 / seconds.max(0.001));
    format!("{}/s read by programs, {}/s from the source, {over}", rate(served), rate(store))
}

/// Where the bytes from the source came from, in a reader's words: HTTP requests for a remote
/// source; for a local one, the requests answered directly from the file (spliced or copied from
/// its mapping) and the reads stfs made into its block cache (or prefetch advice of a mapping).
fn source_reads(doc: &Value) -> String {
    if n(doc, "http_requests") > 0 {
        format!(
            "in {} ({} repeated after a failure)",
            things(n(doc, "http_requests"), "HTTP request"),
            n(doc, "http_retries")
        )
    } else {
        format!(
            "{} answered directly from the local file, {} into the block cache",
            things(n(doc, "mapped_reads"), "request"),
            things(n(doc, "backing_reads"), "read")
        )
    }
}

/// The summary of `doc` for mount point `shown`; `previous` is the document read `interval`
/// seconds before (under `--watch`); `now` is the time of day in seconds.
pub fn render(doc: &Value, shown: &str, previous: Option<(&Value, f64)>, now: u64) -> String {
    let mut out = String::new();
    let started = n(doc, "process_start_time_seconds");
    let up = if started > 0 { format!(", daemon up {}", duration(now.saturating_sub(started))) } else { String::new() };
    let _ = writeln!(out, "{shown}: stfs mount{up}");
    let served = n(doc, "fuse_read_bytes");
    let _ = writeln!(
        out,
        "  read          {} by programs ({} from the kernel)",
        human(served as f64),
        things(n(doc, "fuse_reads"), "request")
    );
    let store = store_bytes(doc);
    let ratio = if served > 0 {
        format!("{:.2}x what programs read", store as f64 / served as f64)
    } else {
        "programs have read nothing yet".to_string()
    };
    let separator = if n(doc, "http_requests") > 0 { ", " } else { ": " };
    let _ = writeln!(out, "  from source   {}, {ratio}{separator}{}", human(store as f64), source_reads(doc));
    let handed = n(doc, "passthrough_opens");
    if handed > 0 {
        let _ = writeln!(
            out,
            "  handed over   {} to the kernel (FUSE passthrough): reads of those files skip stfs and are not counted above",
            things(handed, "open")
        );
    }
    let (hits, misses) = (n(doc, "cache_hits"), n(doc, "cache_misses"));
    let _ = writeln!(
        out,
        "  memory cache  {} hits ({hits} of {} block lookups); holds {} now, {} at its peak",
        percent(hits, hits + misses),
        hits + misses,
        human(n(doc, "resident_bytes") as f64),
        human(n(doc, "peak_resident_bytes") as f64)
    );
    if n(doc, "disk_cache_limit") > 0 {
        let (hits, misses) = (n(doc, "disk_cache_hits"), n(doc, "disk_cache_misses"));
        let _ = writeln!(
            out,
            "  disk cache    {} hits ({hits} of {} lookups); holds {} of {}",
            percent(hits, hits + misses),
            hits + misses,
            human(n(doc, "disk_cache_bytes") as f64),
            human(n(doc, "disk_cache_limit") as f64)
        );
    }
    let _ = writeln!(out, "  throughput    {}", throughput(doc, previous, now));
    let transport = if n(doc, "io_uring_enabled") == 1 {
        format!("FUSE over io_uring ({} requests on the ring)", n(doc, "io_uring_requests"))
    } else {
        "/dev/fuse".to_string()
    };
    let _ = writeln!(out, "  transport     {transport}");
    let errors = [
        ("failed reads", "read_errors"),
        ("source errors", "backing_errors"),
        ("disk cache errors", "disk_cache_errors"),
    ];
    let listed: Vec<String> = errors.iter().map(|(what, key)| format!("{what} {}", n(doc, key))).collect();
    let total: u64 = errors.iter().map(|(_, key)| n(doc, key)).sum();
    let verdict = if total == 0 { "none" } else { "see the daemon's log" };
    let _ = writeln!(out, "  errors        {verdict} ({})", listed.join(", "));
    out
}

#[cfg(test)]
mod tests {
    use crate::cli::stats::summary::*;

    fn doc(json: &str) -> Value {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn a_remote_mount_shows_bytes_ratio_hit_rate_average_throughput_and_errors() {
        let d = doc(r#"{"fuse_reads": 10, "fuse_read_bytes": 1073741824, "http_requests": 256,
            "http_bytes": 1084227584, "http_retries": 2, "cache_hits": 90, "cache_misses": 10,
            "resident_bytes": 1048576, "peak_resident_bytes": 536870912, "backing_errors": 1,
            "process_start_time_seconds": 1000}"#);
        let text = render(&d, "/mnt/m", None, 1010);
        assert!(text.starts_with("/mnt/m: stfs mount, daemon up 10s\n"), "{text}");
        assert!(text.contains("\n  read          1.0 GiB by programs (10 requests from the kernel)\n"), "{text}");
        assert!(
            text.contains(
                "\n  from source   1.0 GiB, 1.01x what programs read, in 256 HTTP requests (2 repeated after a failure)\n"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "memory cache  90.0% hits (90 of 100 block lookups); holds 1.0 MiB now, 512.0 MiB at its peak"
            ),
            "{text}"
        );
        assert!(
            text.contains("throughput    102.4 MiB/s read by programs, 103.4 MiB/s from the source, on average"),
            "{text}"
        );
        assert!(
            text.contains("errors        see the daemon's log (failed reads 0, source errors 1, disk cache errors 0)"),
            "{text}"
        );
        assert!(text.contains("transport     /dev/fuse\n"), "{text}");
        assert!(!text.contains("disk cache    "), "no disk cache line without --cache-dir: {text}");
        assert!(!text.contains("handed over"), "no passthrough line when nothing was handed over: {text}");
    }

    /// The demo's case (a local file, as the issue quoted it): no counter names, no "served", no
    /// "block reads", no "replies straight from the file"; what each number is, in words.
    #[test]
    fn a_local_mount_says_where_its_bytes_came_from_in_words() {
        let d = doc(r#"{"fuse_reads": 5, "fuse_read_bytes": 12595, "mapped_reads": 2,
            "mapped_read_bytes": 8294, "backing_reads": 0, "passthrough_opens": 1}"#);
        let text = render(&d, "/tmp/stfs-demo", None, 0);
        assert!(text.contains("\n  read          12.3 KiB by programs (5 requests from the kernel)\n"), "{text}");
        assert!(
            text.contains(
                "\n  from source   8.1 KiB, 0.66x what programs read: 2 requests answered directly from the local \
                 file, 0 reads into the block cache\n"
            ),
            "{text}"
        );
        assert!(
            text.contains("\n  handed over   1 open to the kernel (FUSE passthrough): reads of those files skip stfs"),
            "{text}"
        );
        for jargon in ["served", "block reads", "replies straight", "from store", "of served"] {
            assert!(!text.contains(jargon), "{jargon:?} in {text}");
        }
    }

    #[test]
    fn under_watch_the_throughput_is_over_the_interval_and_nothing_counted_reads_as_a_dash() {
        let before = doc(r#"{"fuse_read_bytes": 0, "backing_read_bytes": 0, "disk_cache_limit": 4096}"#);
        let now = doc(r#"{"fuse_read_bytes": 2097152, "backing_read_bytes": 1048576, "disk_cache_limit": 4096}"#);
        let text = render(&now, "/m", Some((&before, 2.0)), 0);
        assert!(
            text.contains("throughput    1.0 MiB/s read by programs, 512.0 KiB/s from the source, over the last 2.0 s"),
            "{text}"
        );
        assert!(
            text.contains("from source   1.0 MiB, 0.50x what programs read: 0 requests answered directly"),
            "{text}"
        );
        assert!(text.contains("memory cache  - hits (0 of 0 block lookups)"), "{text}");
        assert!(text.contains("disk cache    - hits (0 of 0 lookups); holds 0.0 B of 4.0 KiB"), "{text}");
        assert!(text.contains("errors        none (failed reads 0, source errors 0, disk cache errors 0)"), "{text}");
        let ring = doc(r#"{"io_uring_enabled": 1, "io_uring_requests": 7}"#);
        let text = render(&ring, "/m", None, 0);
        assert!(text.contains("transport     FUSE over io_uring (7 requests on the ring)"), "{text}");
        assert!(text.contains("from source   0.0 B, programs have read nothing yet: "), "{text}");
        assert_eq!(
            (things(1, "request"), things(0, "read"), things(2, "open")),
            ("1 request".into(), "0 reads".into(), "2 opens".into())
        );
        assert_eq!(duration(3725), "1h 02m");
        assert_eq!(duration(185), "3m 05s");
    }
}
