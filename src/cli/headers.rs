//! Headers that never touch a command line: `--header-file PATH` (one `Name: value` per line, read
//! once, refused when other users may read it) and the `STFS_HEADER_*` environment variables (one
//! `Name: value` each, taken in name order).

use std::fmt;
use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use crate::source::http::{HttpError, HttpOptions};
use crate::util::describe_io;

/// Every environment variable whose name starts with this holds one header.
pub const ENV_PREFIX: &str = "STFS_HEADER_";

/// Most bytes a header file may hold: headers, not a download.
const MAX_FILE_LEN: u64 = 1 << 20;

/// Why headers from a file or the environment cannot be used. Never holds a header's value.
#[derive(Debug)]
pub enum HeaderSourceError {
    /// The header file cannot be opened or read.
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        error: std::io::Error,
    },
    /// The header file may be read by other users (its mode is given).
    Exposed {
        /// The file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// The header file is larger than [`MAX_FILE_LEN`] or not text.
    NotHeaders {
        /// The file.
        path: PathBuf,
    },
    /// A line of the header file is not a usable header.
    Line {
        /// The file.
        path: PathBuf,
        /// Its line number, from 1.
        line: usize,
        /// What is wrong (never the value).
        error: HttpError,
    },
    /// An `STFS_HEADER_*` variable is not a usable header.
    Variable {
        /// The variable's name.
        name: String,
        /// What is wrong (never the value).
        error: HttpError,
    },
}

impl fmt::Display for HeaderSourceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HeaderSourceError::Read { path, error } => write!(f, "{}: {}", path.display(), describe_io(error)),
            HeaderSourceError::Exposed { path, mode } => {
                write!(f, "{}: header file is readable by other users (mode {mode:04o}); chmod 600 it", path.display())
            }
            HeaderSourceError::NotHeaders { path } => {
                write!(f, "{}: not a header file (more than 1 MiB, or not UTF-8 text)", path.display())
            }
            HeaderSourceError::Line { path, line, error } => write!(f, "{}: line {line}: {error}", path.display()),
            HeaderSourceError::Variable { name, error } => write!(f, "{name}: {error}"),
        }
    }
}

impl std::error::Error for HeaderSourceError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            HeaderSourceError::Read { error, .. } => Some(error),
            HeaderSourceError::Line { error, .. } | HeaderSourceError::Variable { error, .. } => Some(error),
            HeaderSourceError::Exposed { .. } | HeaderSourceError::NotHeaders { .. } => None,
        }
    }
}

/// Adds the headers of `path` to `http`: one `Name: value` per line; blank lines and lines
/// starting with `#` are skipped, a trailing `\r` is dropped. The file (or what a link to it names,
/// or a pipe such as `<(...)`) must not be readable by group or others.
pub fn add_header_file(http: &mut HttpOptions, path: &Path) -> Result<(), HeaderSourceError> {
    let read = |error| HeaderSourceError::Read { path: path.to_path_buf(), error };
    let file = std::fs::File::open(path).map_err(read)?;
    let mode = file.metadata().map_err(read)?.permissions().mode();
    if mode & 0o044 != 0 {
        return Err(HeaderSourceError::Exposed { path: path.to_path_buf(), mode: mode & 0o7777 });
    }
    let mut bytes = Vec::new();
    file.take(MAX_FILE_LEN + 1).read_to_end(&mut bytes).map_err(read)?;
    let text = match String::from_utf8(bytes) {
        Ok(text) if text.len() as u64 <= MAX_FILE_LEN => text,
        _ => return Err(HeaderSourceError::NotHeaders { path: path.to_path_buf() }),
    };
    for (index, line) in text.lines().enumerate() {
        let line = line.strip_suffix('\r').unwrap_or(line);
        if line.trim().is_empty() || line.trim_start().starts_with('#') {
            continue;
        }
        http.add_header_arg(line).map_err(|error| HeaderSourceError::Line {
            path: path.to_path_buf(),
            line: index + 1,
            error,
        })?;
    }
    Ok(())
}

/// Adds the header of every `STFS_HEADER_*` variable of `vars` (the environment), in name order.
pub fn add_env_headers(
    http: &mut HttpOptions,
    vars: impl Iterator<Item = (std::ffi::OsString, std::ffi::OsString)>,
) -> Result<(), HeaderSourceError> {
    let mut found: Vec<(String, std::ffi::OsString)> = vars
        .filter_map(|(name, value)| name.into_string().ok().filter(|n| n.starts_with(ENV_PREFIX)).map(|n| (n, value)))
        .collect();
    found.sort();
    for (name, value) in found {
        let bad = |error| HeaderSourceError::Variable { name: name.clone(), error };
        let value =
            value.into_string().map_err(|_| bad(HttpError::BadOption("the header is not UTF-8".to_string())))?;
        http.add_header_arg(&value).map_err(bad)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn names(http: &HttpOptions) -> Vec<String> {
        http.headers.iter().map(|(name, _)| name.clone()).collect()
    }

    #[test]
    fn a_private_header_file_is_read_line_by_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("h");
        std::fs::write(&path, "# comment\r\nAuthorization: Bearer s3cr3t\r\n\n  X-Key: k:v\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let mut http = HttpOptions::default();
        add_header_file(&mut http, &path).unwrap();
        assert_eq!(names(&http), ["Authorization", "X-Key"]);
        assert_eq!(http.headers[1].1.expose(), "k:v");
    }

    #[test]
    fn an_exposed_or_bad_header_file_is_refused_without_its_values() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("h");
        std::fs::write(&path, "Authorization: Bearer s3cr3t\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let error = add_header_file(&mut HttpOptions::default(), &path).unwrap_err().to_string();
        assert_eq!(
            error,
            format!("{}: header file is readable by other users (mode 0644); chmod 600 it", path.display())
        );
        std::fs::write(&path, "X-Ok: 1\nAuthorization Bearer s3cr3t\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let error = add_header_file(&mut HttpOptions::default(), &path).unwrap_err().to_string();
        assert!(error.starts_with(&format!("{}: line 2: ", path.display())), "{error}");
        assert!(!error.contains("s3cr3t"), "{error}");
        // A colon later on the line: what comes before it is no name, and may be the secret.
        std::fs::write(&path, "X-Ok: 1\n\nX-Auth user s3cr3t:x\n").unwrap();
        let error = add_header_file(&mut HttpOptions::default(), &path).unwrap_err().to_string();
        assert_eq!(
            error,
            format!(
                "{}: line 3: invalid header name before the first `:` (a header must look like 'Name: value')",
                path.display()
            )
        );
        let missing = dir.path().join("none");
        let error = add_header_file(&mut HttpOptions::default(), &missing).unwrap_err().to_string();
        assert_eq!(error, format!("{}: no such file or directory", missing.display()));
    }

    #[test]
    fn environment_headers_are_taken_in_name_order() {
        let vars = [("STFS_HEADER_B", "X-B: 2"), ("PATH", "/bin"), ("STFS_HEADER_A", "X-A: 1"), ("STFS_HEADERX", "no")];
        let mut http = HttpOptions::default();
        add_env_headers(&mut http, vars.iter().map(|(n, v)| (n.into(), v.into()))).unwrap();
        assert_eq!(names(&http), ["X-A", "X-B"]);
        let bad = [("STFS_HEADER_T", "Authorization Bearer s3cr3t")];
        let error = add_env_headers(&mut http, bad.iter().map(|(n, v)| (n.into(), v.into()))).unwrap_err().to_string();
        assert!(error.starts_with("STFS_HEADER_T: ") && !error.contains("s3cr3t"), "{error}");
    }
}
