//! A comma-separated `-o` list split into its options, as mount(8)-style tools do: a comma after a
//! backslash (`\,`) stays inside the option (a header value may hold commas), and `\\` is one
//! backslash. Any other backslash is kept as it is. Also the names of the `-o` options stfs
//! acts on, for suggestions.

use std::ops::Range;

use super::args::MountArgs;

/// Every environment variable whose name starts with this holds one `-o` list for `stfs mount`,
/// taken before the command line's: how a caller (the Python package) passes options that may hold
/// a header value without any command line, which every user can read, ever showing them.
pub const ENV_PREFIX: &str = "STFS_OPTIONS_";

/// The `-o` options stfs acts on, for suggestions (the hidden `http_*` ones are left out).
pub const KNOWN_OPTIONS: &[&str] = &[
    "cache_size",
    "block_size",
    "allow_other",
    "foreground",
    "log_file",
    "threads",
    "io_threads",
    "kernel_readahead_kb",
    "max_request_kb",
    "npy",
    "as",
    "layout",
    "header",
    "header_file",
    "token_env",
    "timeout",
    "no_checkpoint_file",
    "checkpoint_file",
    "debug",
    "uid",
    "gid",
    "umask",
    "fmask",
    "dmask",
    "allow_root",
    "read_only",
    "cache_dir",
    "cache_dir_size",
    "no_passthrough",
    "auto_unmount",
    "drop_privileges",
    "no_map",
    "no_splice",
    "io_uring",
    "endpoint_url",
    "region",
    "no_sign_request",
    "metrics_file",
    "metrics_addr",
];

/// The `-o` lists of the `STFS_OPTIONS_*` variables of `vars` (the environment), in name order; the
/// error is the name of a variable whose value is not UTF-8.
pub fn lists_from_env(
    vars: impl Iterator<Item = (std::ffi::OsString, std::ffi::OsString)>,
) -> Result<Vec<String>, String> {
    let mut found: Vec<(String, std::ffi::OsString)> = vars
        .filter_map(|(name, value)| name.into_string().ok().filter(|n| n.starts_with(ENV_PREFIX)).map(|n| (n, value)))
        .collect();
    found.sort();
    found.into_iter().map(|(name, value)| value.into_string().map_err(|_| name)).collect()
}

/// Where each option of `list` lies (empty ones included), its escapes still in it: the list is cut
/// at every comma that no backslash escapes.
pub fn item_ranges(list: &[u8]) -> Vec<Range<usize>> {
    let mut ranges = Vec::new();
    let (mut start, mut at) = (0, 0);
    while at < list.len() {
        match list[at] {
            b'\\' if at + 1 < list.len() => at += 1,
            b',' => {
                ranges.push(start..at);
                start = at + 1;
            }
            _ => {}
        }
        at += 1;
    }
    ranges.push(start..list.len());
    ranges
}

/// The options of `list` as written (escapes kept, empty ones left out), to be joined with `,`
/// again.
pub fn raw_items(list: &str) -> impl Iterator<Item = &str> {
    // Commas are ASCII, so every range starts and ends on a character boundary.
    item_ranges(list.as_bytes()).into_iter().map(move |range| &list[range]).filter(|item| !item.is_empty())
}

/// The options of `list` with `\,` and `\\` resolved (empty ones left out).
pub fn items(list: &str) -> impl Iterator<Item = String> + '_ {
    raw_items(list).map(unescape)
}

/// `args` with the `-o` lists of the `STFS_OPTIONS_*` variables of `vars` (the environment) before
/// its own, so that a flag on the command line or a later `-o` option wins over them; the error is
/// the name of a variable whose value is not UTF-8.
pub fn with_env_lists(
    mut args: MountArgs,
    vars: impl Iterator<Item = (std::ffi::OsString, std::ffi::OsString)>,
) -> Result<MountArgs, String> {
    let mut lists = lists_from_env(vars)?;
    lists.append(&mut args.options);
    args.options = lists;
    Ok(args)
}

/// An option with `\,` made `,` and `\\` made `\`.
fn unescape(item: &str) -> String {
    let mut plain = String::with_capacity(item.len());
    let mut chars = item.chars().peekable();
    while let Some(c) = chars.next() {
        match (c, chars.peek()) {
            ('\\', Some(&next)) if next == ',' || next == '\\' => {
                plain.push(next);
                chars.next();
            }
            _ => plain.push(c),
        }
    }
    plain
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commas_split_unless_escaped() {
        let split = |list| items(list).collect::<Vec<_>>();
        assert_eq!(split("ro,,cache_size=1G,"), ["ro", "cache_size=1G"]);
        assert_eq!(split(r"header=X-K: a\,b,npy"), ["header=X-K: a,b", "npy"]);
        assert_eq!(split(r"header=X-K: a\\,npy"), [r"header=X-K: a\", "npy"]);
        assert_eq!(split(r"header=X-K: a\b\"), [r"header=X-K: a\b\"]);
        assert_eq!(raw_items(r"a\,b,c").collect::<Vec<_>>(), [r"a\,b", "c"]);
        assert_eq!(item_ranges(b"a,,b"), [0..1, 2..2, 3..4]);
    }

    #[test]
    fn environment_lists_are_taken_in_name_order() {
        let vars = [
            ("STFS_OPTIONS_B", "npy"),
            ("PATH", "/bin"),
            ("STFS_OPTIONS_A", r"header=X-K: a\,b"),
            ("STFS_OPTION", "x"),
        ];
        let lists = lists_from_env(vars.iter().map(|(n, v)| (n.into(), v.into()))).unwrap();
        assert_eq!(lists, [r"header=X-K: a\,b", "npy"]);
        use std::os::unix::ffi::OsStringExt;
        let bad = [("STFS_OPTIONS_X".into(), std::ffi::OsString::from_vec(vec![0xff]))];
        assert_eq!(lists_from_env(bad.into_iter()).unwrap_err(), "STFS_OPTIONS_X");
    }
}
