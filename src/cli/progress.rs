//! A one-line progress bar on stderr for long copies: drawn only when stderr is a terminal and the
//! work is large, redrawn at most a few times a second, erased when done.

use std::io::Write;
use std::time::{Duration, Instant};

use crate::format::prints_as_itself;

/// Work below this many bytes finishes too fast for a bar to help.
pub const MIN_BYTES_FOR_BAR: u64 = 64 << 20;
/// Least time between two redraws.
const REDRAW_EVERY: Duration = Duration::from_millis(100);
/// Cells of the bar itself.
const BAR_CELLS: u64 = 30;

/// Progress through `total` bytes.
pub struct Progress {
    total: u64,
    done: u64,
    started: Instant,
    last_draw: Option<Instant>,
    enabled: bool,
}

impl Progress {
    /// A bar for `total` bytes, shown only when stderr is a terminal and `total` is large.
    pub fn new(total: u64) -> Progress {
        // SAFETY: isatty only inspects the descriptor.
        let terminal = unsafe { libc::isatty(libc::STDERR_FILENO) } == 1;
        Progress::with_display(total, terminal && total >= MIN_BYTES_FOR_BAR)
    }

    fn with_display(total: u64, enabled: bool) -> Progress {
        Progress { total, done: 0, started: Instant::now(), last_draw: None, enabled }
    }

    /// Counts `n` more bytes done, labelled with what is being copied.
    pub fn advance(&mut self, n: u64, label: &str) {
        self.done = self.done.saturating_add(n);
        if !self.enabled || self.last_draw.is_some_and(|t| t.elapsed() < REDRAW_EVERY) {
            return;
        }
        self.last_draw = Some(Instant::now());
        let line = render(self.done, self.total, self.started.elapsed(), label);
        let _ = write!(std::io::stderr(), "\r{line}\x1b[K");
    }

    /// Erases the bar (the terminal is left as it was found).
    pub fn finish(&mut self) {
        if self.enabled && self.last_draw.is_some() {
            let _ = write!(std::io::stderr(), "\r\x1b[K");
        }
        self.enabled = false;
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.finish();
    }
}

/// The bar's text: `[#######.......]  45%  1.2 GiB / 2.6 GiB  310.0 MiB/s  label`.
fn render(done: u64, total: u64, elapsed: Duration, label: &str) -> String {
    let fraction = if total == 0 { 1.0 } else { (done.min(total) as f64) / (total as f64) };
    let filled = ((fraction * BAR_CELLS as f64) as u64).min(BAR_CELLS) as usize;
    let bar = format!("{}{}", "#".repeat(filled), ".".repeat(BAR_CELLS as usize - filled));
    let seconds = elapsed.as_secs_f64();
    let rate = if seconds > 0.0 { done as f64 / seconds } else { 0.0 };
    // Names from untrusted headers could hold terminal escapes, or bidirectional overrides that
    // reorder the line: show only characters that print as themselves.
    let label: String = label.chars().map(|c| if prints_as_itself(c) { c } else { '?' }).take(40).collect();
    format!(
        "[{bar}] {:>3}%  {} / {}  {}/s  {label}",
        (fraction * 100.0) as u32,
        human(done as f64),
        human(total as f64),
        human(rate)
    )
}

/// Bytes with one decimal and a binary unit (`781.5 KiB`).
pub(crate) fn human(bytes: f64) -> String {
    let mut value = bytes;
    for unit in ["B", "KiB", "MiB", "GiB"] {
        if value < 1024.0 {
            return format!("{value:.1} {unit}");
        }
        value /= 1024.0;
    }
    format!("{value:.1} TiB")
}

#[cfg(test)]
mod tests {
    use crate::cli::progress::*;

    #[test]
    fn bar_shows_fraction_sizes_and_rate() {
        let line = render(3 << 29, 3 << 30, Duration::from_secs(2), "model.w");
        assert!(line.starts_with(&format!("[{}{}]  50%", "#".repeat(15), ".".repeat(15))), "{line}");
        assert!(
            line.contains("1.5 GiB / 3.0 GiB") && line.contains("768.0 MiB/s") && line.ends_with("model.w"),
            "{line}"
        );
        let full = render(10, 10, Duration::ZERO, "x");
        assert!(full.starts_with(&format!("[{}] 100%", "#".repeat(30))), "{full}");
    }

    #[test]
    fn labels_cannot_drive_the_terminal() {
        let line = render(1, 2, Duration::from_secs(1), "a\x1b[2Jb\n");
        assert!(line.ends_with("a?[2Jb?"), "{line}");
        // No control characters, but they reorder or break the line: a bidirectional override,
        // a line separator, a C1 control. Plain non-ASCII stays.
        let line = render(1, 2, Duration::from_secs(1), "x\u{202e}y\u{2028}z\u{9b}\u{e9}");
        assert!(line.ends_with("x?y?z?\u{e9}"), "{line}");
    }

    #[test]
    fn disabled_bar_only_counts() {
        let mut p = Progress::with_display(100, false);
        p.advance(60, "x");
        p.advance(60, "x");
        assert_eq!((p.done, p.last_draw.is_none()), (120, true));
    }
}
