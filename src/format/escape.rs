//! Showing untrusted strings (tensor names, serde messages quoting the input) in error messages:
//! non-printables escaped, long ones cut, so a hostile header cannot drive the terminal.

use std::fmt;

/// Longest part of a name (in bytes) that error messages show before cutting it with an ellipsis.
const MAX_SHOWN_NAME: usize = 200;

/// Shows an untrusted string safely: non-printable characters escaped like `{:?}` does (quotes
/// kept as they are), and anything past [`MAX_SHOWN_NAME`] bytes cut off with an ellipsis.
pub(super) struct Printable<'a>(pub(super) &'a str);

impl fmt::Display for Printable<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_escaped(f, self.0, MAX_SHOWN_NAME)
    }
}

/// Writes `text` escaped as [`Printable`] does, cut after `max_bytes` bytes.
pub(super) fn write_escaped(out: &mut impl fmt::Write, text: &str, max_bytes: usize) -> fmt::Result {
    let mut cut = text.len().min(max_bytes);
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    let (shown, hidden) = text.split_at(cut);
    for c in shown.chars() {
        if c == '"' || c == '\'' {
            out.write_char(c)?;
        } else {
            write!(out, "{}", c.escape_debug())?;
        }
    }
    if !hidden.is_empty() {
        write!(out, "…[{} more bytes]", hidden.len())?;
    }
    Ok(())
}
