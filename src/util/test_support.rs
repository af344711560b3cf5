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

/// A writer of a FIFO at `fifo`, waiting in its open until something opens the FIFO for
/// reading: what [`FifoWatch::opened`] tells.
pub(crate) struct FifoWatch {
    pub(crate) fifo: std::path::PathBuf,
    opened: std::sync::mpsc::Receiver<()>,
    writer: Option<std::thread::JoinHandle<()>>,
}

impl FifoWatch {
    pub(crate) fn new(fifo: &std::path::Path) -> FifoWatch {
        make_fifo(fifo);
        let (tx, opened) = std::sync::mpsc::channel();
        let path = fifo.to_path_buf();
        let writer = std::thread::spawn(move || {
            let _ = std::fs::OpenOptions::new().write(true).open(&path);
            let _ = tx.send(());
        });
        FifoWatch { fifo: fifo.to_path_buf(), opened, writer: Some(writer) }
    }

    /// Whether anything opened the FIFO for reading (the writer's open returned) within 300 ms.
    pub(crate) fn opened(&self) -> bool {
        self.opened.recv_timeout(Duration::from_millis(300)).is_ok()
    }
}

impl Drop for FifoWatch {
    fn drop(&mut self) {
        // Releases the writer (a reader that never waits), so the thread ends either way.
        use std::os::unix::fs::OpenOptionsExt;
        let _reader = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(&self.fifo);
        let _ = self.writer.take().map(std::thread::JoinHandle::join);
    }
}
