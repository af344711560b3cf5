//! Helpers shared by the unit tests.

use std::time::{Duration, Instant};

/// Polls `done` until it holds or 5 s pass: waits for background work without timing claims.
pub(crate) fn eventually(what: &str, done: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Makes a FIFO at `path`: opening it to read blocks until a writer comes, reading it from a
/// writer that never comes blocks forever.
pub(crate) fn make_fifo(path: &std::path::Path) {
    let c_path = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).expect("a temporary path has no NUL");
    // SAFETY: mkfifo reads a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0, "mkfifo {}", path.display());
}

/// Writes `bytes` to a new file at `path`, created exclusively: never through a link, never over
/// a file already there.
pub(crate) fn write_new(path: &std::path::Path, bytes: impl AsRef<[u8]>) {
    use std::io::Write;
    let mut file = std::fs::File::create_new(path).unwrap_or_else(|e| panic!("create {}: {e}", path.display()));
    file.write_all(bytes.as_ref()).unwrap();
}
