//! Showing untrusted strings (tensor names, serde messages quoting the input, paths and shard names)
//! in error messages: non-printables escaped, long ones cut, so a hostile header, index or file name
//! cannot drive the terminal or forge a second line.

use std::fmt;

/// Longest part of a name (in bytes) that error messages show before cutting it with an ellipsis.
const MAX_SHOWN_NAME: usize = 200;

/// Longest part of a path (in bytes) that error messages show: longer than any real one (Linux's
/// PATH_MAX), so only a hostile shard name of an index is ever cut.
const MAX_SHOWN_PATH: usize = 4096;

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
    write_cut(out, text, max_bytes, |c| c == '"' || c == '\'')
}

/// Writes `text`, each character that `as_is` refuses escaped as `{:?}` escapes it, cut after
/// `max_bytes` bytes (at a character boundary) with an ellipsis giving the bytes left out.
fn write_cut(out: &mut impl fmt::Write, text: &str, max_bytes: usize, as_is: impl Fn(char) -> bool) -> fmt::Result {
    let mut cut = text.len().min(max_bytes);
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    let (shown, hidden) = text.split_at(cut);
    for c in shown.chars() {
        if as_is(c) {
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

/// Shows a path, URL or shard name safely, as close to how it is written as that allows: a
/// character that does not print (control characters, U+2028 and U+2029, bidirectional and
/// other format characters) is escaped as `{:?}` escapes it (`\n`, `\u{1b}`, `\u{2028}`); every
/// other character, backslashes, quotes and combining marks included, is shown as it is. Past
/// [`MAX_SHOWN_PATH`] bytes it is cut off with an ellipsis.
pub struct PrintablePath<'a>(pub &'a str);

impl fmt::Display for PrintablePath<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_cut(f, self.0, MAX_SHOWN_PATH, prints_as_itself)
    }
}

/// Whether `c` shows as itself: `str::escape_debug` escapes exactly what does not print, plus
/// backslashes and quotes (which do) and, as a string's first character only, combining marks
/// (which print over what comes before them); asked about `c` after a letter, it tells which.
/// [`PrintablePath`]'s rule, for callers that escape or replace characters their own way.
pub fn prints_as_itself(c: char) -> bool {
    if matches!(c, '\\' | '"' | '\'') {
        return true;
    }
    let mut pair = [b'a'; 5];
    let len = 1 + c.encode_utf8(&mut pair[1..]).len();
    let pair = std::str::from_utf8(&pair[..len]).expect("a character after an ASCII letter is UTF-8");
    pair.escape_debug().nth(1) == Some(c)
}

#[cfg(test)]
mod tests {
    use super::PrintablePath;

    #[test]
    fn paths_show_as_written_except_what_does_not_print() {
        let shown = |path: &str| PrintablePath(path).to_string();
        for ordinary in
            [r#"/data/my model\v2/'a' "b".safetensors"#, "/données/modèle/e\u{301}.safetensors", "/模型/😀.json"]
        {
            assert_eq!(shown(ordinary), ordinary);
        }
        assert_eq!(shown("m\n\x1b[2Jfake: line.safetensors"), r"m\n\u{1b}[2Jfake: line.safetensors");
        assert_eq!(shown("a\tb\rc\0d\u{7f}e"), r"a\tb\rc\0d\u{7f}e");
        assert_eq!(shown("a\u{2028}b\u{2029}c\u{202e}d\u{85}e"), r"a\u{2028}b\u{2029}c\u{202e}d\u{85}e");
        let long = "x".repeat(5000);
        assert_eq!(shown(&long), format!("{}…[904 more bytes]", "x".repeat(4096)));
    }
}
