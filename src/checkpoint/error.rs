//! [`OpenError`]: a problem with the input, naming the file or URL it is in, with the typed error
//! behind it kept as its [`source`](std::error::Error::source).

use std::fmt;
use std::io;

use crate::format::index::{IndexError, ShardError};
use crate::format::{FormatError, PrintablePath};
use crate::source::http::HttpError;
use crate::source::hub::HubError;
use crate::util::describe_io;

/// A problem with the input, naming the file (or URL) it concerns: `PATH: problem` on one line (the
/// path shown with [`PrintablePath`], so a hostile name cannot make a second line).
#[derive(Debug)]
pub struct OpenError {
    /// The file or URL the problem is in, as the user named it (a URL without credentials).
    pub path: String,
    /// What is wrong.
    pub problem: OpenProblem,
}

/// What is wrong with a file, URL or directory that was named.
#[derive(Debug)]
pub enum OpenProblem {
    /// Opening or reading it failed (shown as a short lower-case phrase).
    Io(io::Error),
    /// It is not a valid safetensors file.
    Format(FormatError),
    /// The remote object could not be opened.
    Http(HttpError),
    /// It is not a usable `*.index.json`.
    Index(IndexError),
    /// An `hf://` repository could not be resolved to a checkpoint.
    Hub(HubError),
    /// Its shards do not make one checkpoint.
    Shards(ShardError),
    /// A directory holds no `*.safetensors` file.
    NoShardFiles,
    /// An object store's prefix (`s3://BUCKET/PREFIX/`) lists no object.
    EmptyPrefix,
    /// A directory with folders holds no `*.safetensors` file in it or in them (within the depth
    /// a mount looks).
    NothingLoadable {
        /// How many folders down a mount looks.
        depth: usize,
    },
    /// A directory holds more folders with a checkpoint than one mount takes.
    TooManyComponents {
        /// How many (with the root's own, if any).
        count: usize,
        /// The limit.
        limit: usize,
    },
    /// A directory's folders hold more entries than a mount reads.
    TooManyEntries {
        /// The limit.
        limit: usize,
    },
    /// A folder holds several index files and none of the standard names.
    Ambiguous(Vec<String>),
    /// A command that reads one checkpoint was given a folder whose checkpoints are all in folders
    /// below it (a diffusers pipeline).
    OnlyInFolders(Vec<String>),
    /// An index file is larger than any real one.
    IndexTooLarge {
        /// Its length in bytes.
        len: usize,
        /// The largest length read.
        limit: usize,
    },
    /// A `scheme://` name of no known source kind.
    UnknownScheme(String),
    /// A shard was never tried because an earlier one failed (not reported in practice: the
    /// earlier failure is).
    NotOpened,
}

impl OpenError {
    /// A problem with `path`.
    pub fn new(path: impl Into<String>, problem: impl Into<OpenProblem>) -> OpenError {
        OpenError { path: path.into(), problem: problem.into() }
    }
}

impl fmt::Display for OpenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", PrintablePath(&self.path), self.problem)
    }
}

impl std::error::Error for OpenError {
    /// The typed error behind the problem, if there is one.
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.problem.source()
    }
}

impl fmt::Display for OpenProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OpenProblem::Io(error) => f.write_str(&describe_io(error)),
            OpenProblem::Format(error) => write!(f, "{error}"),
            OpenProblem::Http(error) => write!(f, "{error}"),
            OpenProblem::Index(error) => write!(f, "{error}"),
            OpenProblem::Hub(error) => write!(f, "{error}"),
            OpenProblem::Shards(error) => write!(f, "{error}"),
            OpenProblem::NoShardFiles => f.write_str("directory holds no *.safetensors files"),
            OpenProblem::EmptyPrefix => f.write_str("no objects under this prefix"),
            OpenProblem::NothingLoadable { depth } => write!(
                f,
                "directory holds no *.safetensors files, in it or in its folders (looked {depth} folders down): \
                 small files alone are nothing to mount"
            ),
            OpenProblem::TooManyComponents { count, limit } => write!(
                f,
                "holds {count} folders with a checkpoint (the root's own included), over the limit of {limit} for \
                 one mount: mount a folder of it"
            ),
            OpenProblem::TooManyEntries { limit } => {
                write!(f, "its folders hold over {limit} entries, more than a mount reads: mount a folder of it")
            }
            OpenProblem::Ambiguous(files) => {
                write!(f, "several checkpoints in one folder ({}): mount one of them by its path", files.join(", "))
            }
            OpenProblem::OnlyInFolders(folders) => write!(
                f,
                "holds no checkpoint of its own, only in its folders ({}): name one of them",
                folders.join(", ")
            ),
            OpenProblem::IndexTooLarge { len, limit } => write!(f, "index of {len} bytes is over the limit of {limit}"),
            OpenProblem::NotOpened => f.write_str("was not opened"),
            OpenProblem::UnknownScheme(scheme) => {
                write!(
                    f,
                    "unknown scheme {scheme}:// (stfs reads local paths, http://, https://, hf://, s3:// and gs://)"
                )
            }
        }
    }
}

impl std::error::Error for OpenProblem {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            OpenProblem::Io(error) => Some(error),
            OpenProblem::Format(error) => Some(error),
            OpenProblem::Http(error) => Some(error),
            OpenProblem::Index(error) => Some(error),
            OpenProblem::Hub(error) => Some(error),
            OpenProblem::Shards(error) => Some(error),
            OpenProblem::NoShardFiles
            | OpenProblem::EmptyPrefix
            | OpenProblem::NothingLoadable { .. }
            | OpenProblem::TooManyComponents { .. }
            | OpenProblem::TooManyEntries { .. }
            | OpenProblem::Ambiguous(_)
            | OpenProblem::OnlyInFolders(_)
            | OpenProblem::IndexTooLarge { .. }
            | OpenProblem::NotOpened
            | OpenProblem::UnknownScheme(_) => None,
        }
    }
}

impl From<io::Error> for OpenProblem {
    fn from(error: io::Error) -> OpenProblem {
        OpenProblem::Io(error)
    }
}

impl From<FormatError> for OpenProblem {
    fn from(error: FormatError) -> OpenProblem {
        OpenProblem::Format(error)
    }
}

impl From<HttpError> for OpenProblem {
    fn from(error: HttpError) -> OpenProblem {
        OpenProblem::Http(error)
    }
}

impl From<IndexError> for OpenProblem {
    fn from(error: IndexError) -> OpenProblem {
        OpenProblem::Index(error)
    }
}

impl From<ShardError> for OpenProblem {
    fn from(error: ShardError) -> OpenProblem {
        OpenProblem::Shards(error)
    }
}

impl From<HubError> for OpenProblem {
    fn from(error: HubError) -> OpenProblem {
        OpenProblem::Hub(error)
    }
}
