//! The background daemon's log without `--log-file`: RFC 3164 datagrams to the local syslog socket
//! (/dev/log, which journald or rsyslog reads), as `stfs[PID]` with facility daemon.
//!
//! Written with std's `UnixDatagram` rather than a syslog crate: one datagram per record is all
//! it takes, and no dependency is added. The socket is non-blocking, so a slow or stuck syslog
//! daemon drops records instead of stalling a FUSE thread; a missing socket is not an error (the
//! records are dropped, and the socket is tried again at the next record).

use std::io::Write;
use std::os::unix::net::UnixDatagram;
use std::path::PathBuf;
use std::sync::Mutex;

use log::{Level, Log, Metadata, Record};

/// The socket records go to unless [`SOCKET_ENV`] names another.
pub const DEFAULT_SOCKET: &str = "/dev/log";
/// Environment variable naming another socket (a testing knob).
pub const SOCKET_ENV: &str = "STFS_SYSLOG_SOCKET";
/// Facility `daemon` (3), shifted as the priority field wants it.
const FACILITY_DAEMON: u8 = 3 << 3;
/// Longest datagram sent; longer messages are cut (syslog daemons cut them anyway).
const MAX_DATAGRAM: usize = 8 << 10;

/// A `log` logger sending the records that `filter` lets through to the syslog socket.
pub struct SyslogLogger {
    filter: env_logger::Logger,
    path: PathBuf,
    socket: Mutex<Option<UnixDatagram>>,
}

impl SyslogLogger {
    /// A logger for the socket at `$STFS_SYSLOG_SOCKET`, or /dev/log; connects at the first record.
    pub fn new(filter: env_logger::Logger) -> SyslogLogger {
        let path = std::env::var_os(SOCKET_ENV).map_or_else(|| PathBuf::from(DEFAULT_SOCKET), PathBuf::from);
        SyslogLogger { filter, path, socket: Mutex::new(None) }
    }

    /// The most verbose level `filter` lets through.
    pub fn filter(&self) -> log::LevelFilter {
        self.filter.filter()
    }

    fn connect(&self) -> Option<UnixDatagram> {
        let socket = UnixDatagram::unbound().ok()?;
        socket.connect(&self.path).ok()?;
        socket.set_nonblocking(true).ok()?;
        Some(socket)
    }

    /// Sends one datagram, connecting (again) if need be: syslog daemons restart.
    fn send(&self, datagram: &[u8]) {
        let mut socket = self.socket.lock().unwrap_or_else(|e| e.into_inner());
        for _ in 0..2 {
            if socket.is_none() {
                *socket = self.connect();
            }
            match socket.as_ref().map(|s| s.send(datagram)) {
                None => return,
                Some(Ok(_)) => return,
                Some(Err(e)) if e.kind() == std::io::ErrorKind::WouldBlock => return,
                Some(Err(_)) => *socket = None,
            }
        }
    }
}

impl Log for SyslogLogger {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        self.filter.enabled(metadata)
    }

    fn log(&self, record: &Record<'_>) {
        if self.filter.matches(record) {
            self.send(&datagram(record.level(), std::process::id(), &record.args().to_string()));
        }
    }

    fn flush(&self) {}
}

/// An RFC 3164 datagram: `<PRI>Mmm dd hh:mm:ss stfs[PID]: MESSAGE`, in local time.
pub fn datagram(level: Level, pid: u32, message: &str) -> Vec<u8> {
    let severity = match level {
        Level::Error => 3,
        Level::Warn => 4,
        Level::Info => 6,
        Level::Debug | Level::Trace => 7,
    };
    let mut out = Vec::with_capacity(64 + message.len());
    let _ = write!(out, "<{}>{} stfs[{pid}]: {message}", FACILITY_DAEMON | severity, timestamp());
    out.truncate(MAX_DATAGRAM);
    out
}

/// The local time as RFC 3164 wants it (`Jan  2 15:04:05`).
fn timestamp() -> String {
    const MONTHS: [&str; 12] = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];
    // SAFETY: time(NULL) has no preconditions; localtime_r fills the zeroed tm it is given.
    let tm = unsafe {
        let now = libc::time(std::ptr::null_mut());
        let mut tm: libc::tm = std::mem::zeroed();
        libc::localtime_r(&now, &mut tm);
        tm
    };
    let month = MONTHS[tm.tm_mon.clamp(0, 11) as usize];
    format!("{month} {:>2} {:02}:{:02}:{:02}", tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn datagrams_carry_priority_identity_and_message() {
        let d = String::from_utf8(datagram(Level::Warn, 42, "read failed")).unwrap();
        assert!(d.starts_with("<28>"), "{d}");
        assert!(d.ends_with(" stfs[42]: read failed"), "{d}");
        assert_eq!(d.len(), "<28>Jan  2 15:04:05 stfs[42]: read failed".len(), "{d}");
        assert!(String::from_utf8(datagram(Level::Error, 1, "x")).unwrap().starts_with("<27>"));
        assert_eq!(datagram(Level::Info, 1, &"y".repeat(MAX_DATAGRAM)).len(), MAX_DATAGRAM);
    }
}
