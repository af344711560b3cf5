//! The Prometheus text exposition format (0.0.4) of a stats document (`.stfs/stats.json`): which
//! metric each counter becomes, its type, unit and help text, the labels of a mount and their
//! escaping. `stfs stats --prometheus`, the `--metrics-file` and the `--metrics-addr` listener all
//! render through [`render`], so the three say the same thing.

use std::fmt::Write;

use serde_json::Value;

/// The `Content-Type` of the text format, for an HTTP reply.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// A metric's type, as its `# TYPE` line names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// Only goes up (until the daemon restarts); its name ends in `_total`.
    Counter,
    /// Goes up and down.
    Gauge,
}

/// One number of the stats document as one metric.
struct Metric {
    /// Its key in stats.json.
    key: &'static str,
    /// The metric's name, `stfs_` first, the unit and `_total` (counters) last.
    name: &'static str,
    kind: Kind,
    /// The document's value is divided by this to reach the metric's base unit (1e6: microseconds
    /// to seconds).
    divisor: f64,
    help: &'static str,
}

const fn counter(key: &'static str, name: &'static str, help: &'static str) -> Metric {
    Metric { key, name, kind: Kind::Counter, divisor: 1.0, help }
}

const fn gauge(key: &'static str, name: &'static str, help: &'static str) -> Metric {
    Metric { key, name, kind: Kind::Gauge, divisor: 1.0, help }
}

/// A metric in seconds of a document value in microseconds.
const fn from_micros(key: &'static str, name: &'static str, kind: Kind, help: &'static str) -> Metric {
    Metric { key, name, kind, divisor: 1e6, help }
}

/// Every plain number of stats.json, in its order (docs/metrics.md lists the same).
const METRICS: &[Metric] = &[
    counter("fuse_reads", "stfs_fuse_reads_total", "Read requests served (FUSE, or files copied by extract)."),
    counter("fuse_read_bytes", "stfs_fuse_read_bytes_total", "Bytes returned by read requests."),
    counter("read_errors", "stfs_read_errors_total", "Read requests that failed with an errno."),
    counter(
        "kernel_open_requests",
        "stfs_kernel_open_requests_total",
        "OPEN requests the kernel sent (at most one per mount: then the kernel opens files itself).",
    ),
    counter("opens", "stfs_opens_total", "Former name of stfs_kernel_open_requests_total (the same value)."),
    counter("cache_hits", "stfs_cache_hits_total", "Block lookups found in the memory cache (loading included)."),
    counter("cache_misses", "stfs_cache_misses_total", "Block lookups that had to start a backing read."),
    counter(
        "single_flight_waits",
        "stfs_single_flight_waits_total",
        "Block lookups that waited for a load another thread had started.",
    ),
    counter(
        "backing_reads",
        "stfs_backing_reads_total",
        "Backing reads issued (block loads and mapped prefetch advice).",
    ),
    counter("backing_read_bytes", "stfs_backing_read_bytes_total", "Bytes read from (or asked of) the backing source."),
    counter("backing_errors", "stfs_backing_errors_total", "Backing reads that failed."),
    counter("mapped_reads", "stfs_mapped_reads_total", "Replies the kernel copied straight from a source's mapping."),
    counter("mapped_read_bytes", "stfs_mapped_read_bytes_total", "Bytes of replies copied from a mapping."),
    counter("spliced_reads", "stfs_spliced_reads_total", "Replies spliced from the file into the FUSE device."),
    counter("spliced_read_bytes", "stfs_spliced_read_bytes_total", "Bytes of spliced replies."),
    counter(
        "mapping_releases",
        "stfs_mapping_releases_total",
        "Times the daemon dropped its page-table entries of a mapping.",
    ),
    counter(
        "opening_reads",
        "stfs_opening_reads_total",
        "Reads answered from the bytes a remote source's opening request fetched.",
    ),
    counter("opening_read_bytes", "stfs_opening_read_bytes_total", "Bytes of reads answered from the opening request."),
    counter("prefetched_bytes", "stfs_prefetched_bytes_total", "Bytes loaded by readahead rather than on demand."),
    counter("prefetch_unused_bytes", "stfs_prefetch_unused_bytes_total", "Prefetched bytes evicted before any read."),
    counter("evictions", "stfs_cache_evictions_total", "Blocks evicted from the memory cache."),
    gauge("resident_bytes", "stfs_cache_resident_bytes", "Bytes the memory cache holds now."),
    gauge("peak_resident_bytes", "stfs_cache_peak_resident_bytes", "Most bytes the memory cache ever held."),
    gauge("streams", "stfs_readahead_streams", "Sequential streams tracked now."),
    gauge("window_bytes", "stfs_readahead_window_bytes", "Sum of the current readahead windows of all streams."),
    counter("http_requests", "stfs_http_requests_total", "HTTP exchanges sent to a remote source (each redirect hop)."),
    counter("http_bytes", "stfs_http_received_bytes_total", "Body bytes received from a remote source."),
    counter("http_retries", "stfs_http_retries_total", "HTTP requests repeated after a transient failure."),
    from_micros(
        "http_request_max_micros",
        "stfs_http_request_max_duration_seconds",
        Kind::Gauge,
        "The longest HTTP attempt so far, send to last body byte.",
    ),
    counter("disk_cache_hits", "stfs_disk_cache_hits_total", "Blocks found, verified, in the disk cache."),
    counter("disk_cache_hit_bytes", "stfs_disk_cache_hit_bytes_total", "Bytes of blocks found in the disk cache."),
    counter("disk_cache_misses", "stfs_disk_cache_misses_total", "Blocks looked up in the disk cache and not there."),
    counter("disk_cache_written_bytes", "stfs_disk_cache_written_bytes_total", "Bytes written to the disk cache."),
    counter("disk_cache_evictions", "stfs_disk_cache_evictions_total", "Block files this mount evicted from disk."),
    counter("disk_cache_errors", "stfs_disk_cache_errors_total", "Disk cache writes or reads that failed."),
    counter(
        "disk_cache_corrupt",
        "stfs_disk_cache_corrupt_total",
        "Block files that failed their checksum or length check.",
    ),
    counter(
        "disk_cache_write_drops",
        "stfs_disk_cache_write_drops_total",
        "Blocks not written to the disk cache because its write queue was full.",
    ),
    counter(
        "disk_cache_extents_written",
        "stfs_disk_cache_extents_written_total",
        "Extent files (one tensor file's bytes) written.",
    ),
    counter("passthrough_opens", "stfs_passthrough_opens_total", "Opens answered with FUSE passthrough."),
    counter("passthrough_open_bytes", "stfs_passthrough_open_bytes_total", "Bytes of the files opened by passthrough."),
    counter(
        "passthrough_refused",
        "stfs_passthrough_refused_total",
        "Opens the kernel refused to pass through (served the ordinary way).",
    ),
    counter(
        "passthrough_checkpoint_opens",
        "stfs_passthrough_checkpoint_opens_total",
        "Opens of a re-served checkpoint file passed through to the local file.",
    ),
    counter(
        "passthrough_files_changed",
        "stfs_passthrough_files_changed_total",
        "Local files handed to the kernel that changed while mounted (no longer handed over).",
    ),
    gauge("passthrough_enabled", "stfs_passthrough_enabled", "1 while the kernel agreed to FUSE passthrough."),
    gauge("max_request_bytes", "stfs_max_request_bytes", "Largest read request the kernel agreed to send."),
    gauge("io_uring_enabled", "stfs_io_uring_enabled", "1 while requests go through FUSE over io_uring."),
    counter("io_uring_requests", "stfs_io_uring_requests_total", "Requests answered on the io_uring transport."),
    gauge("disk_cache_bytes", "stfs_disk_cache_bytes", "Bytes the disk cache holds, as last counted."),
    gauge("disk_cache_limit", "stfs_disk_cache_limit_bytes", "The disk cache's bound (0: no disk cache)."),
    // The daemon's process, under the names every Prometheus client library's process collector
    // uses (so existing dashboards and alerts apply), and the kernel's share of its CPU time,
    // which on a FUSE daemon is mostly copying replies.
    from_micros(
        "process_cpu_micros",
        "process_cpu_seconds_total",
        Kind::Counter,
        "Total user and system CPU time spent in seconds.",
    ),
    from_micros(
        "process_cpu_system_micros",
        "stfs_process_cpu_system_seconds_total",
        Kind::Counter,
        "The kernel-mode part of process_cpu_seconds_total (FUSE replies, socket reads).",
    ),
    gauge("process_resident_bytes", "process_resident_memory_bytes", "Resident memory size in bytes."),
    gauge("process_open_fds", "process_open_fds", "Number of open file descriptors."),
    gauge("process_max_fds", "process_max_fds", "Maximum number of open file descriptors."),
    gauge(
        "process_start_time_seconds",
        "process_start_time_seconds",
        "Start time of the process since unix epoch in seconds.",
    ),
];

/// A histogram of stats.json: an object of buckets keyed `"<BOUND"` and `">=LAST"`, and a sum.
struct Histogram {
    /// The key of its buckets.
    buckets: &'static str,
    /// The key of the sum of its observations.
    sum: &'static str,
    name: &'static str,
    /// The bucket bounds are divided by this to reach seconds.
    bound_divisor: f64,
    /// The sum is divided by this to reach seconds.
    sum_divisor: f64,
    help: &'static str,
}

const HISTOGRAMS: &[Histogram] = &[
    Histogram {
        buckets: "backing_read_latency_us",
        sum: "backing_read_micros",
        name: "stfs_backing_request_duration_seconds",
        bound_divisor: 1e6,
        sum_divisor: 1e6,
        help: "Backing reads of the store (block loads), from the request to the last block landed.",
    },
    Histogram {
        buckets: "http_request_latency_ms",
        sum: "http_request_micros",
        name: "stfs_http_request_duration_seconds",
        bound_divisor: 1e3,
        sum_divisor: 1e6,
        help: "HTTP attempts to a remote source, from sending to the last body byte.",
    },
];

/// A label value as the text format writes it between quotes: `\`, `"` and newline escaped.
pub fn escape_label_value(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

/// `# HELP` text as the format wants it: `\` and newline escaped.
fn escape_help(text: &str) -> String {
    text.replace('\\', "\\\\").replace('\n', "\\n")
}

/// `{a="x",b="y"}` (empty for no labels); names must be valid label names.
fn label_set(labels: &[(&str, &str)]) -> String {
    if labels.is_empty() {
        return String::new();
    }
    let pairs: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{}\"", escape_label_value(v))).collect();
    format!("{{{}}}", pairs.join(","))
}

/// A number in the text format: integers as they are, others in Rust's shortest round-trip form.
fn number(value: f64) -> String {
    if value.is_infinite() {
        return if value > 0.0 { "+Inf".into() } else { "-Inf".into() };
    }
    format!("{value}")
}

/// A document value scaled to base units: integers stay exact when the divisor is 1.
fn scaled(value: u64, divisor: f64) -> String {
    if divisor == 1.0 {
        value.to_string()
    } else {
        number(value as f64 / divisor)
    }
}

/// Renders a stats document in the text format, every sample labelled with `labels` (e.g.
/// `mountpoint`, `source`). A key the document lacks (a daemon older than this renderer) leaves
/// its metric out; keys this renderer does not know are left out too.
pub fn render(doc: &Value, labels: &[(&str, &str)]) -> String {
    let mut out = String::new();
    let plain = label_set(labels);
    for m in METRICS {
        let Some(value) = doc.get(m.key).and_then(Value::as_u64) else { continue };
        let kind = match m.kind {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
        };
        let _ = writeln!(out, "# HELP {} {}", m.name, escape_help(m.help));
        let _ = writeln!(out, "# TYPE {} {kind}", m.name);
        let _ = writeln!(out, "{}{plain} {}", m.name, scaled(value, m.divisor));
    }
    for h in HISTOGRAMS {
        let (Some(buckets), Some(sum)) =
            (doc.get(h.buckets).and_then(buckets_of), doc.get(h.sum).and_then(Value::as_u64))
        else {
            continue;
        };
        let _ = writeln!(out, "# HELP {} {}", h.name, escape_help(h.help));
        let _ = writeln!(out, "# TYPE {} histogram", h.name);
        // Cumulative: each `le` counts every observation below its bound; +Inf counts them all,
        // and so does _count (the same sum, so the two always agree).
        let mut cumulative = 0u64;
        for (bound, count) in &buckets {
            cumulative = cumulative.saturating_add(*count);
            let le = bound.map_or(f64::INFINITY, |b| b as f64 / h.bound_divisor);
            let mut with_le: Vec<(&str, &str)> = labels.to_vec();
            let le = number(le);
            with_le.push(("le", &le));
            let _ = writeln!(out, "{}_bucket{} {cumulative}", h.name, label_set(&with_le));
        }
        let _ = writeln!(out, "{}_sum{plain} {}", h.name, number(sum as f64 / h.sum_divisor));
        let _ = writeln!(out, "{}_count{plain} {cumulative}", h.name);
    }
    out
}

/// The buckets of a histogram object in bound order, `None` (+Inf) last: `"<5": 3` is `(Some(5),
/// 3)`, `">=5000": 1` is `(None, 1)`. `None` if the object is not of that shape.
fn buckets_of(value: &Value) -> Option<Vec<(Option<u64>, u64)>> {
    let mut buckets = Vec::new();
    let mut rest = None;
    for (key, count) in value.as_object()? {
        let count = count.as_u64()?;
        if let Some(bound) = key.strip_prefix('<') {
            buckets.push((Some(bound.parse().ok()?), count));
        } else if key.starts_with(">=") {
            rest = Some(count);
        } else {
            return None;
        }
    }
    buckets.sort_by_key(|(bound, _)| *bound);
    buckets.push((None, rest?));
    Some(buckets)
}

/// The stats.json keys [`render`] turns into metrics (tests hold every counter to having one).
pub fn covered_keys() -> impl Iterator<Item = &'static str> {
    METRICS.iter().map(|m| m.key).chain(HISTOGRAMS.iter().flat_map(|h| [h.buckets, h.sum]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::{Stats, BACKING_LATENCY_BOUNDS_US};

    /// The samples of a rendering: (name with labels, value).
    fn samples(text: &str) -> Vec<(String, String)> {
        text.lines()
            .filter(|l| !l.starts_with('#'))
            .map(|l| {
                let (name, value) = l.rsplit_once(' ').unwrap();
                (name.to_string(), value.to_string())
            })
            .collect()
    }

    #[test]
    fn every_number_of_the_stats_document_has_a_metric() {
        // A counter added to Stats without a line here would be missing from every scrape.
        let doc = Stats::default().to_json();
        let covered: Vec<&str> = covered_keys().collect();
        for key in doc.as_object().unwrap().keys() {
            assert!(covered.contains(&key.as_str()), "stats.json's {key} has no Prometheus metric");
        }
        for key in &covered {
            assert!(doc.get(key).is_some(), "{key} is not in stats.json");
        }
    }

    #[test]
    fn names_follow_the_conventions_and_each_family_is_typed_once() {
        let text = render(&Stats::default().to_json(), &[("mountpoint", "/m")]);
        let mut typed = Vec::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').unwrap();
                assert!(!typed.contains(&name.to_string()), "{name} typed twice");
                typed.push(name.to_string());
                let standard = ["process_cpu_seconds_total", "process_resident_memory_bytes", "process_open_fds"];
                let standard = [&standard[..], &["process_max_fds", "process_start_time_seconds"]].concat();
                assert!(name.starts_with("stfs_") || standard.contains(&name), "{name}");
                assert!(name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'), "{name}");
                assert_eq!(kind == "counter", name.ends_with("_total"), "{name} is a {kind}");
                assert!(!name.contains("micros") && !name.ends_with("_ms"), "{name}: base units are seconds");
            }
        }
        assert_eq!(typed.len(), METRICS.len() + HISTOGRAMS.len());
    }

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(escape_label_value(r#"a\b"c"#), r#"a\\b\"c"#);
        assert_eq!(escape_label_value("line\nbreak"), "line\\nbreak");
        assert_eq!(escape_label_value("/mnt/ü m"), "/mnt/ü m");
        let text = render(&Stats::default().to_json(), &[("mountpoint", "/tmp/a\"b\\c\nd"), ("source", "x")]);
        assert!(text.contains(r#"stfs_fuse_reads_total{mountpoint="/tmp/a\"b\\c\nd",source="x"} 0"#), "{text}");
        // No sample line is broken by the newline in the value.
        assert!(
            text.lines().all(|l| l.starts_with('#') || l.starts_with("stfs_") || l.starts_with("process_")),
            "{text}"
        );
    }

    #[test]
    fn values_are_the_documents_in_base_units() {
        let stats = Stats::default();
        Stats::add(&stats.fuse_reads, 7);
        Stats::add(&stats.backing_read_bytes, 1 << 40);
        stats.add_resident(4096);
        stats.record_http_latency(2_500_000);
        let text = render(&stats.to_json(), &[]);
        let got = samples(&text);
        let value = |name: &str| got.iter().find(|(n, _)| n == name).map(|(_, v)| v.clone()).unwrap();
        assert_eq!(value("stfs_fuse_reads_total"), "7");
        assert_eq!(value("stfs_backing_read_bytes_total"), (1u64 << 40).to_string());
        assert_eq!(value("stfs_cache_resident_bytes"), "4096");
        assert_eq!(value("stfs_http_request_max_duration_seconds"), "2.5");
        assert_eq!(value("stfs_http_request_duration_seconds_sum"), "2.5");
        assert_eq!(value("stfs_http_request_duration_seconds_bucket{le=\"1\"}"), "0");
        assert_eq!(value("stfs_http_request_duration_seconds_bucket{le=\"5\"}"), "1");
        assert_eq!(value("stfs_backing_request_duration_seconds_bucket{le=\"0.0001\"}"), "0");
    }

    #[test]
    fn histogram_buckets_are_cumulative_and_inf_equals_count() {
        let stats = Stats::default();
        for micros in [50, 50, 700, 30_000, 30_000, 30_000, 9_000_000, 60_000_000] {
            stats.record_backing_latency(micros);
        }
        let text = render(&stats.to_json(), &[("mountpoint", "/m")]);
        let name = "stfs_backing_request_duration_seconds";
        let buckets: Vec<(String, u64)> = samples(&text)
            .into_iter()
            .filter(|(n, _)| n.starts_with(&format!("{name}_bucket")))
            .map(|(n, v)| (n, v.parse().unwrap()))
            .collect();
        assert_eq!(buckets.len(), BACKING_LATENCY_BOUNDS_US.len() + 1);
        assert!(buckets.windows(2).all(|w| w[0].1 <= w[1].1), "{buckets:?}");
        let bounds: Vec<f64> = buckets
            .iter()
            .map(|(n, _)| {
                let le = n.split("le=\"").nth(1).unwrap().trim_end_matches("\"}");
                if le == "+Inf" {
                    f64::INFINITY
                } else {
                    le.parse().unwrap()
                }
            })
            .collect();
        assert!(bounds.windows(2).all(|w| w[0] < w[1]), "{bounds:?}");
        assert_eq!(bounds[0], 0.0001);
        assert_eq!(bounds[bounds.len() - 1], f64::INFINITY);
        let count = samples(&text).into_iter().find(|(n, _)| n.starts_with(&format!("{name}_count"))).unwrap().1;
        assert_eq!(buckets.last().unwrap().1.to_string(), count);
        assert_eq!(count, "8");
        // le="0.001" (1 ms) holds the two 50 us reads and the 700 us one.
        assert!(text.contains(&format!("{name}_bucket{{mountpoint=\"/m\",le=\"0.001\"}} 3")), "{text}");
        let sum = samples(&text).into_iter().find(|(n, _)| n.starts_with(&format!("{name}_sum"))).unwrap().1;
        assert_eq!(sum.parse::<f64>().unwrap(), 69.0908);
    }

    #[test]
    fn an_older_document_renders_what_it_has() {
        let doc = serde_json::json!({"fuse_reads": 3, "http_request_latency_ms": {"<1": 1, "bogus": 2}});
        let text = render(&doc, &[]);
        assert!(text.contains("stfs_fuse_reads_total 3\n"), "{text}");
        assert!(!text.contains("stfs_cache_hits_total") && !text.contains("histogram"), "{text}");
    }
}
