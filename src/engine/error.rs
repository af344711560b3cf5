//! [`ReadError`]: a read the engine could not answer, with the source, the offset and the cause.

use std::fmt;
use std::io;

/// A failed read: which source, where, and why.
#[derive(Debug)]
pub struct ReadError {
    /// Path or URL of the source.
    pub source_name: String,
    /// Absolute offset of the block that failed.
    pub offset: u64,
    /// The underlying error.
    pub error: io::Error,
}

impl fmt::Display for ReadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: read at offset {} failed: {}", self.source_name, self.offset, self.error)
    }
}

impl std::error::Error for ReadError {}
