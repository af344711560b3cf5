//! File names for tensor names: a reversible escaping that turns any header string into a safe name.
//!
//! Tensor names are arbitrary JSON strings; file names are not. The rules, in order:
//!
//! 1. `%` becomes `%25`, `/` becomes `%2F`, NUL becomes `%00`. Every other character is kept as it
//!    is (no Unicode normalisation: names that differ in bytes stay different files).
//! 2. The empty name becomes `%` (a lone `%` cannot come out of rule 1).
//! 3. `.` and `..`, and names that collide with a reserved name of the mount root
//!    (`metadata.json`, `.stfs`, and the files served beside the tensors: the checkpoint's own,
//!    an `hf://` repository's `config.json` and the like), get their first byte escaped too: `.`
//!    becomes `%2E`, `..` becomes `%2E.`, `metadata.json` becomes `%6Detadata.json`.
//! 4. A result longer than 255 bytes (NAME_MAX), counting the extension a view adds (`.npy`), is
//!    cut at a character boundary to 200 bytes and given the suffix `%~` plus 16 hex digits of a
//!    hash of the full name, then the view's extension; `%~` cannot come out of the other rules, so
//!    a shortened name never equals an escaped one. So every name of every view and layout fits
//!    NAME_MAX ([`escape_view`]; the tree layout escapes each component by the same rules).
//!
//! Rules 1-3 are undone by [`unescape`]; for rule 4, metadata.json maps every file to its tensor.

/// Longest file name Linux accepts (NAME_MAX).
pub const NAME_MAX: usize = 255;
/// Bytes of the escaped name kept before the hash suffix when a name is too long.
const LONG_NAME_KEEP: usize = 200;

/// Escapes a tensor name into a file name, given the names reserved in the directory it lives in.
pub fn escape(name: &str, reserved: &[&str]) -> String {
    shorten(escape_unbounded(name, reserved), name, 0)
}

/// The name of a view's file: [`escape`]'s name with `extension` (`.npy`, or `""` for the raw file)
/// appended, the whole within [`NAME_MAX`] (rule 4 counts the extension). With `guard`, a name
/// that itself ends in `guard` has that dot escaped (`x.npy` becomes `x%2Enpy`), so a raw file
/// never looks like a view's file.
pub fn escape_view(name: &str, reserved: &[&str], extension: &str, guard: Option<&str>) -> String {
    let mut out = escape_unbounded(name, reserved);
    if let Some(ext) = guard.and_then(|g| g.strip_prefix('.').map(|rest| (g, rest))) {
        if out.ends_with(ext.0) {
            out.truncate(out.len() - ext.0.len());
            out.push_str("%2E");
            out.push_str(ext.1);
        }
    }
    let mut out = shorten(out, name, extension.len());
    out.push_str(extension);
    out
}

/// Rule 4: `out` (the escaped form of `name`) cut and hashed if it and `extra` more bytes would
/// not fit [`NAME_MAX`].
fn shorten(out: String, name: &str, extra: usize) -> String {
    if out.len() + extra <= NAME_MAX {
        return out;
    }
    // `%~` and 16 hex digits.
    let mut cut = LONG_NAME_KEEP.min(NAME_MAX.saturating_sub(extra + 18));
    while !out.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}%~{:016x}", &out[..cut], fnv1a64(name.as_bytes()))
}

/// Rules 1-3 of the module doc.
fn escape_unbounded(name: &str, reserved: &[&str]) -> String {
    if name.is_empty() {
        return "%".to_string();
    }
    let mut out = String::with_capacity(name.len());
    for c in name.chars() {
        match c {
            '%' => out.push_str("%25"),
            '/' => out.push_str("%2F"),
            '\0' => out.push_str("%00"),
            c => out.push(c),
        }
    }
    if out == "." || out == ".." || reserved.contains(&out.as_str()) {
        let first = out.as_bytes()[0];
        out = format!("%{first:02X}{}", &out[1..]);
    }
    out
}

/// Undoes rules 1-3 of [`escape`]; `None` for a shortened name (rule 4) or a string it never makes.
pub fn unescape(file_name: &str) -> Option<String> {
    if file_name == "%" {
        return Some(String::new());
    }
    let bytes = file_name.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes.get(i + 1..i + 3)?;
            let hex = std::str::from_utf8(hex).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// 64-bit FNV-1a: a stable, dependency-free hash for the long-name suffix (not for security; a
/// collision is detected and resolved by the namespace).
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

#[cfg(test)]
mod tests {
    use super::*;

    const RESERVED: &[&str] = &["metadata.json", ".stfs"];

    #[test]
    fn plain_names_are_kept() {
        for n in ["model.layers.0.mlp.weight", "lm_head.weight", "ünïcode", " spaced name "] {
            assert_eq!(escape(n, RESERVED), n);
        }
    }

    #[test]
    fn hostile_names_are_escaped_and_reversible() {
        let cases = [
            ("", "%"),
            (".", "%2E"),
            ("..", "%2E."),
            ("a/b", "a%2Fb"),
            ("../../etc/passwd", "..%2F..%2Fetc%2Fpasswd"),
            ("/", "%2F"),
            ("a\0b", "a%00b"),
            ("100%", "100%25"),
            ("a%2Fb", "a%252Fb"),
            ("metadata.json", "%6Detadata.json"),
            (".stfs", "%2Estfs"),
        ];
        for (name, file) in cases {
            assert_eq!(escape(name, RESERVED), file, "escape({name:?})");
            assert_eq!(unescape(file).as_deref(), Some(name), "unescape({file:?})");
        }
    }

    #[test]
    fn long_names_fit_name_max_and_stay_distinct() {
        let a = "x".repeat(4096);
        let b = format!("{}y", "x".repeat(4095));
        let (ea, eb) = (escape(&a, RESERVED), escape(&b, RESERVED));
        assert!(ea.len() <= NAME_MAX && eb.len() <= NAME_MAX);
        assert_ne!(ea, eb);
        assert!(ea.contains("%~"));
        assert_eq!(unescape(&ea), None);
        // Multi-byte characters are never split.
        let wide = "é".repeat(300);
        assert!(escape(&wide, RESERVED).len() <= NAME_MAX);
    }

    proptest::proptest! {
        #[test]
        fn escape_is_injective_and_safe(a in ".{0,40}", b in ".{0,40}") {
            let (ea, eb) = (escape(&a, RESERVED), escape(&b, RESERVED));
            proptest::prop_assert!(!ea.is_empty() && !ea.contains('/') && !ea.contains('\0'));
            proptest::prop_assert!(ea != "." && ea != ".." && !RESERVED.contains(&ea.as_str()));
            proptest::prop_assert_eq!(unescape(&ea), Some(a.clone()));
            if a != b { proptest::prop_assert_ne!(ea, eb); }
        }
    }
}
