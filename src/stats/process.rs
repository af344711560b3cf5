//! The daemon's own process figures (CPU time, resident memory, descriptors, start time), read
//! from `/proc/self` when a stats document is taken, as Prometheus's standard `process_*` metrics
//! report them for any exporter.

use std::fs;
use std::sync::OnceLock;

/// One reading of `/proc/self`; a figure the kernel would not give is `None` (left out of the
/// document rather than reported as 0).
#[derive(Debug, Default, Clone, PartialEq)]
pub struct ProcessSample {
    /// User-mode CPU time, microseconds.
    pub cpu_user_micros: Option<u64>,
    /// Kernel-mode CPU time on the process's behalf, microseconds.
    pub cpu_system_micros: Option<u64>,
    /// Resident set size, bytes.
    pub resident_bytes: Option<u64>,
    /// Descriptors open now.
    pub open_fds: Option<u64>,
    /// The soft `RLIMIT_NOFILE`.
    pub max_fds: Option<u64>,
    /// When the process started, seconds since the Unix epoch.
    pub start_time_seconds: Option<u64>,
}

impl ProcessSample {
    /// Reads this process's figures now (a few small `/proc` reads, no lock).
    pub fn now() -> ProcessSample {
        let Constants { ticks, page_size, boot_time_seconds } = *constants();
        let stat = fs::read_to_string("/proc/self/stat").ok();
        let fields = stat.as_deref().and_then(stat_fields_after_comm);
        let field = |n: usize| fields.as_ref().and_then(|f| f.get(n)).and_then(|v| v.parse::<u64>().ok());
        // Numbered as proc(5) numbers them: (14) utime, (15) stime, (22) starttime, all in clock
        // ticks, (24) rss in pages; `fields` starts at (3), state.
        let (utime, stime, start, rss) = (field(14 - 3), field(15 - 3), field(22 - 3), field(24 - 3));
        let micros = |t: Option<u64>| Some(t?.saturating_mul(1_000_000) / ticks?);
        ProcessSample {
            cpu_user_micros: micros(utime),
            cpu_system_micros: micros(stime),
            resident_bytes: rss.zip(page_size).map(|(pages, size)| pages.saturating_mul(size)),
            open_fds: fs::read_dir("/proc/self/fd").ok().map(|d| d.count() as u64),
            max_fds: soft_nofile_limit(),
            start_time_seconds: boot_time_seconds.zip(start.zip(ticks)).map(|(boot, (s, t))| boot + s / t),
        }
    }

    /// The figures as (stats.json key, value) pairs, the missing ones left out.
    pub fn fields(&self) -> Vec<(&'static str, u64)> {
        let total = self.cpu_user_micros.zip(self.cpu_system_micros).map(|(u, s)| u + s);
        [
            ("process_cpu_micros", total),
            ("process_cpu_system_micros", self.cpu_system_micros),
            ("process_resident_bytes", self.resident_bytes),
            ("process_open_fds", self.open_fds),
            ("process_max_fds", self.max_fds),
            ("process_start_time_seconds", self.start_time_seconds),
        ]
        .into_iter()
        .filter_map(|(key, value)| Some((key, value?)))
        .collect()
    }
}

/// The space-separated fields of a `/proc/PID/stat` line after its `(comm)`, which may itself hold
/// spaces and parentheses: everything after the last `)`. The first is field (3) of proc(5),
/// the state, so field (n) is at index n - 3.
pub(crate) fn stat_fields_after_comm(line: &str) -> Option<Vec<&str>> {
    let (_, rest) = line.rsplit_once(')')?;
    Some(rest.split_ascii_whitespace().collect())
}

/// What does not change while the system runs, read once.
#[derive(Clone, Copy)]
struct Constants {
    ticks: Option<u64>,
    page_size: Option<u64>,
    boot_time_seconds: Option<u64>,
}

fn constants() -> &'static Constants {
    static CONSTANTS: OnceLock<Constants> = OnceLock::new();
    CONSTANTS.get_or_init(|| Constants {
        ticks: clock_ticks_per_second(),
        page_size: page_size(),
        boot_time_seconds: boot_time_seconds(),
    })
}

fn clock_ticks_per_second() -> Option<u64> {
    // SAFETY: sysconf reads a constant of the system and touches no memory of ours.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    u64::try_from(ticks).ok().filter(|&t| t > 0)
}

fn page_size() -> Option<u64> {
    // SAFETY: as above.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(size).ok().filter(|&s| s > 0)
}

fn soft_nofile_limit() -> Option<u64> {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes one rlimit into the struct we own.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 || limit.rlim_cur == libc::RLIM_INFINITY {
        return None;
    }
    Some(limit.rlim_cur)
}

/// The boot time, seconds since the epoch (`btime` of `/proc/stat`).
fn boot_time_seconds() -> Option<u64> {
    let stat = fs::read_to_string("/proc/stat").ok()?;
    stat.lines().find_map(|l| l.strip_prefix("btime ")).and_then(|v| v.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_command_name_with_spaces_and_parentheses_does_not_shift_the_fields() {
        let line = "4242 (a) b (c) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 75 0 0 20 0 3 0 1234 5000 300";
        let fields = stat_fields_after_comm(line).unwrap();
        assert_eq!(fields[0], "S");
        assert_eq!(fields[14 - 3], "250");
        assert_eq!(fields[15 - 3], "75");
        assert_eq!(fields[22 - 3], "1234");
        assert_eq!(fields[24 - 3], "300");
    }

    #[test]
    fn this_process_reads_as_alive_and_busy() {
        // Spend some CPU so the reading cannot be all zeros.
        let started = std::time::Instant::now();
        let mut x = 0u64;
        while started.elapsed() < std::time::Duration::from_millis(30) {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
        }
        std::hint::black_box(x);
        let sample = ProcessSample::now();
        let cpu = sample.cpu_user_micros.unwrap() + sample.cpu_system_micros.unwrap();
        assert!(cpu >= 10_000, "{sample:?}");
        assert!(sample.resident_bytes.unwrap() > 1 << 20, "{sample:?}");
        assert!(sample.open_fds.unwrap() >= 3, "{sample:?}");
        assert!(sample.max_fds.unwrap() >= sample.open_fds.unwrap(), "{sample:?}");
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
        let start = sample.start_time_seconds.unwrap();
        assert!(start <= now + 1 && start + 3600 > now, "started {start}, now {now}");
        assert_eq!(sample.fields().len(), 6);
        assert_eq!(sample.fields()[0], ("process_cpu_micros", cpu));
    }
}
