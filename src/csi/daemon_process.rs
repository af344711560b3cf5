//! The mount daemon of a shared volume as a process: found once after it starts by the marker in
//! its environment, then known by its pid and start time (a pid reused by another process is not
//! taken for it), told alive from dead without touching its mount, and stopped. The plugin is not
//! its parent (the daemon runs in a session of its own), so this is all from /proc.

use std::io;
use std::path::Path;
use std::time::{Duration, Instant};

/// The environment variable whose value names the volume a daemon serves.
pub const MARKER: &str = "STFS_CSI_VOLUME";

/// A daemon process: its pid and its start time (clock ticks after boot, /proc/PID/stat field 22).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DaemonProcess {
    /// Its process id.
    pub pid: i32,
    /// When it started, which tells it from a later process given the same pid.
    pub start_time: u64,
}

/// The state letter and start time of process `pid`, from /proc/PID/stat.
fn state_and_start(pid: i32) -> Option<(char, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The name (field 2) may hold spaces and parentheses: the fields after it follow the last `)`.
    let after = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = after.split_whitespace().collect();
    // Field 3 (the state) is the first after the name; field 22 (starttime) the 20th.
    Some((fields.first()?.chars().next()?, fields.get(19)?.parse().ok()?))
}

impl DaemonProcess {
    /// The process whose environment holds `MARKER=volume`, not a zombie (the newest if several).
    pub fn find(volume: &str) -> Option<DaemonProcess> {
        let wanted = format!("{MARKER}={volume}");
        let mut found: Option<DaemonProcess> = None;
        for entry in std::fs::read_dir("/proc").ok()?.flatten() {
            let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else { continue };
            let Ok(environment) = std::fs::read(entry.path().join("environ")) else { continue };
            if !environment.split(|&b| b == 0).any(|v| v == wanted.as_bytes()) {
                continue;
            }
            match state_and_start(pid) {
                Some((state, start_time))
                    if !matches!(state, 'Z' | 'X') && found.is_none_or(|f| f.start_time <= start_time) =>
                {
                    found = Some(DaemonProcess { pid, start_time });
                }
                _ => {}
            }
        }
        found
    }

    /// Whether the process still runs (not gone, not a zombie, not another process with its pid).
    pub fn is_alive(&self) -> bool {
        matches!(state_and_start(self.pid), Some((state, start)) if start == self.start_time && !matches!(state, 'Z' | 'X'))
    }

    /// Reaps it if it is a zombie child of this process (a plugin that is its container's first
    /// process inherits the daemons); anything else is left alone.
    pub fn reap(&self) {
        // SAFETY: waitpid with a null status pointer and WNOHANG only reaps a zombie child.
        unsafe { libc::waitpid(self.pid, std::ptr::null_mut(), libc::WNOHANG) };
    }

    /// Sends SIGTERM and waits up to `patience` for it to go, then SIGKILL and waits as long; only
    /// while it is this process (pid and start time).
    pub fn stop(&self, patience: Duration) {
        for signal in [libc::SIGTERM, libc::SIGKILL] {
            if !self.is_alive() {
                break;
            }
            // SAFETY: kill with a pid and a signal number.
            unsafe { libc::kill(self.pid, signal) };
            let deadline = Instant::now() + patience;
            while Instant::now() < deadline {
                self.reap();
                if !self.is_alive() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        self.reap();
    }

    /// The record's text: `PID START_TIME`.
    pub fn to_record(self) -> String {
        format!("{} {}\n", self.pid, self.start_time)
    }

    /// Reads a record written by [`DaemonProcess::to_record`] (None: missing or not of that form).
    pub fn read_record(path: &Path) -> io::Result<Option<DaemonProcess>> {
        let text = match std::fs::read_to_string(path) {
            Ok(text) => text,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        let mut parts = text.split_whitespace().map(str::parse::<u64>);
        Ok(match (parts.next(), parts.next()) {
            (Some(Ok(pid)), Some(Ok(start_time))) => {
                i32::try_from(pid).ok().map(|pid| DaemonProcess { pid, start_time })
            }
            _ => None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_is_found_by_its_marker_and_dead_once_it_exits() {
        let volume = format!("test-{}", std::process::id());
        let mut child =
            std::process::Command::new("sleep").arg("30").env(MARKER, &volume).spawn().expect("spawn sleep");
        // Until the child has exec'd, its environment is still this process's: look until then.
        let deadline = Instant::now() + Duration::from_secs(5);
        let found = loop {
            match DaemonProcess::find(&volume) {
                Some(found) => break found,
                None if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
                None => panic!("not found by its marker within 5 s"),
            }
        };
        assert_eq!(found.pid, child.id() as i32);
        assert!(found.is_alive());
        let record = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(record.path(), found.to_record()).unwrap();
        assert_eq!(DaemonProcess::read_record(record.path()).unwrap(), Some(found));
        // A zombie (killed, not yet reaped) is dead already.
        child.kill().unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        while found.is_alive() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(!found.is_alive());
        assert_eq!(DaemonProcess::find(&volume), None);
        child.wait().unwrap();
        let other = DaemonProcess { start_time: found.start_time + 1, ..found };
        assert!(!other.is_alive());
    }
}
