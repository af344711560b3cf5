//! Opening a checkpoint: resolves what the user named to backing sources and validated headers.
//!
//! Everything that can be wrong with the input is found here, before anything is mounted.

use std::fmt;
use std::path::Path;
use std::sync::Arc;

use crate::format::{self, Header};
use crate::source::{LocalFile, Source};

/// One opened shard: its source and its header.
pub struct OpenedShard {
    /// The backing source, pinned.
    pub source: Arc<dyn Source>,
    /// The validated header.
    pub header: Header,
}

/// A checkpoint ready to mount: one or more shards with unique tensor names.
pub struct Checkpoint {
    /// Shards in the order their tensors appear.
    pub shards: Vec<OpenedShard>,
}

/// A problem with the input, naming the file (or URL) it concerns.
#[derive(Debug)]
pub struct OpenError {
    /// The file or URL the problem is in.
    pub path: String,
    /// What is wrong, one line.
    pub problem: String,
}

impl OpenError {
    /// A problem with `path`.
    pub fn new(path: impl Into<String>, problem: impl fmt::Display) -> OpenError {
        OpenError { path: path.into(), problem: problem.to_string() }
    }
}

impl fmt::Display for OpenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.problem)
    }
}

impl std::error::Error for OpenError {}

/// Opens and validates a single safetensors file.
pub fn open_file(path: &Path) -> Result<OpenedShard, OpenError> {
    let name = path.display().to_string();
    let file = LocalFile::open(path).map_err(|e| {
        // LocalFile's errors may already start with the path; the message names it once.
        let text = describe_io(&e);
        let text = text.strip_prefix(&format!("{name}: ")).map(|t| describe_io(&std::io::Error::other(t.to_string()))).unwrap_or(text);
        OpenError::new(&name, text)
    })?;
    let source: Arc<dyn Source> = Arc::new(file);
    open_source(source)
}

/// Reads and validates the header of an already opened source.
pub fn open_source(source: Arc<dyn Source>) -> Result<OpenedShard, OpenError> {
    let mut stream = source.open_stream().map_err(|e| OpenError::new(source.name(), describe_io(&e)))?;
    let header = format::read_header(stream.as_mut(), source.len()).map_err(|e| OpenError::new(source.name(), e))?;
    Ok(OpenedShard { source, header })
}

/// Opens what the user named: a `.safetensors` file.
pub fn open(spec: &str) -> Result<Checkpoint, OpenError> {
    let shard = open_file(Path::new(spec))?;
    Ok(Checkpoint { shards: vec![shard] })
}

/// An I/O error as a short lower-case phrase ("no such file or directory").
pub fn describe_io(e: &std::io::Error) -> String {
    let text = e.to_string();
    // std appends " (os error N)"; the phrase alone reads better in a one-line message.
    let text = match text.find(" (os error") {
        Some(i) => text[..i].to_string(),
        None => text,
    };
    let mut chars = text.chars();
    match chars.next() {
        Some(c) => c.to_lowercase().chain(chars).collect(),
        None => text,
    }
}
