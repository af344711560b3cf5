//! Clearing secrets from this process's command line as other users see it (`ps`,
//! `/proc/PID/cmdline`): once the arguments are parsed, every byte range of the argument block that
//! holds a parsed header value, URL password or URL query string is overwritten in place, whatever
//! the spelling that carried it (`--header V`, `-o=header=V`, `-fo V`, an escaped `-o` list), so the
//! daemon (a fork, which keeps the same memory) never shows them for the life of the mount.
//!
//! Linux keeps the argument strings in one NUL-separated block of the process's own memory, from
//! `arg_start` to `arg_end` (fields 48 and 49 of `/proc/self/stat`), and `/proc/PID/cmdline` is read
//! from that block. [`hide_secret_arguments`] finds the secrets' byte ranges in the block as
//! `/proc/self/cmdline` shows it, checks that the block is where the kernel says and holds exactly
//! those bytes, and overwrites the ranges with `*`. The unsafe code is confined to that last step.

use std::io;
use std::ops::Range;

use super::args::{Command, MountArgs, RemoteArgs};
use super::option_list;

/// The byte that replaces each byte of a secret.
const MASK: u8 = b'*';

/// What [`hide_secret_arguments`] found and did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Scrubbed {
    /// A header value (`--header`, `-o header=`) was on the command line.
    pub header: bool,
    /// A URL's query string or password was on the command line.
    pub url: bool,
}

/// The secrets a parsed command line holds, by value: what no other user may read in its argument
/// block.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Secrets {
    /// Header values (after the `:`, trimmed, as they are sent), or a whole `--header` without `:`.
    headers: Vec<String>,
    /// URL passwords and query strings.
    urls: Vec<String>,
}

impl Secrets {
    /// The secrets of a parsed `stfs` subcommand: its source's URL secrets, its headers (`--header`
    /// and the `header=` items of `-o` lists) and the URL secrets of its other options.
    pub fn of_command(command: &Command) -> Secrets {
        let mut secrets = Secrets::default();
        match command {
            Command::Mount(args) => secrets.add_mount(args),
            Command::Inspect(a) => secrets.add_remote(&a.source, &a.remote),
            Command::Extract(a) => secrets.add_remote(&a.source, &a.remote),
            Command::Cat(a) => secrets.add_remote(&a.source, &a.remote),
            Command::Umount(_)
            | Command::Stats(_)
            | Command::Cache(_)
            | Command::InstallHelper(_)
            | Command::MountInfo(_)
            | Command::Csi(_) => {}
        }
        secrets
    }

    /// The secrets of a source and its `-o` options (a mount(8) helper call's).
    pub fn of_source_and_options(source: &str, options: &[String]) -> Secrets {
        let mut secrets = Secrets::default();
        secrets.add_url(source);
        for option in options {
            secrets.add_option_list(option);
        }
        secrets
    }

    /// Whether there is nothing to hide.
    pub fn is_empty(&self) -> bool {
        self.headers.is_empty() && self.urls.is_empty()
    }

    fn add_mount(&mut self, args: &MountArgs) {
        self.add_remote(&args.source, &args.remote);
        for list in &args.options {
            self.add_option_list(list);
        }
    }

    fn add_remote(&mut self, source: &str, remote: &RemoteArgs) {
        self.add_url(source);
        for header in &remote.headers {
            self.add_header(header);
        }
        if let Some(url) = &remote.endpoint_url {
            self.add_url(url);
        }
    }

    /// The `header=` items of a `-o` list, and the URL secrets of every item (`endpoint_url=`).
    fn add_option_list(&mut self, list: &str) {
        for item in option_list::items(list) {
            match item.strip_prefix("header=") {
                Some(header) => self.add_header(header),
                None => self.add_url(&item),
            }
        }
    }

    fn add_header(&mut self, header: &str) {
        let value = header.split_once(':').map_or(header, |(_, value)| value).trim();
        push_new(&mut self.headers, value);
    }

    fn add_url(&mut self, text: &str) {
        for range in url_secrets(text.as_bytes()) {
            push_new(&mut self.urls, &text[range]);
        }
    }
}

/// Adds `value` to `list` unless it is empty or there already.
fn push_new(list: &mut Vec<String>, value: &str) {
    if !value.is_empty() && !list.iter().any(|v| v == value) {
        list.push(value.to_string());
    }
}

/// Overwrites, in this process's argument block, every byte range that holds one of `secrets`,
/// and says what it found. Call once the arguments have been copied (std's `args_os` reads the
/// same block) and before any thread starts.
pub fn hide_secret_arguments(secrets: &Secrets) -> io::Result<Scrubbed> {
    if secrets.is_empty() {
        return Ok(Scrubbed::default());
    }
    let cmdline = std::fs::read("/proc/self/cmdline")?;
    let (ranges, found) = secret_ranges(&cmdline, secrets);
    if ranges.is_empty() {
        return Ok(found);
    }
    let stat = std::fs::read_to_string("/proc/self/stat")?;
    let area = argument_area(&stat).ok_or_else(|| io::Error::other("no argument area in /proc/self/stat"))?;
    if area.len() != cmdline.len() {
        return Err(io::Error::other("the argument area and /proc/self/cmdline differ in length"));
    }
    let maps = std::fs::read_to_string("/proc/self/maps")?;
    if !writable_mapping_covers(&maps, &area) {
        return Err(io::Error::other("the argument area is not in one writable mapping"));
    }
    let base = area.start as *mut u8;
    // SAFETY: `[base, base + len)` is this process's argument block: the kernel reports it in
    // /proc/self/stat, /proc/self/maps shows it inside one readable and writable mapping (the
    // initial stack), and no Rust object owns it (std only keeps raw pointers into it, read by
    // `args_os`, which the caller has already copied from). Reads and writes go through raw
    // pointers, so no reference aliases it, and the process is single-threaded here.
    unsafe {
        for (i, want) in cmdline.iter().enumerate() {
            if base.add(i).read() != *want {
                return Err(io::Error::other("the argument area does not hold /proc/self/cmdline"));
            }
        }
        for range in &ranges {
            for i in range.clone() {
                base.add(i).write(MASK);
            }
        }
    }
    Ok(found)
}

/// `arg_start..arg_end` from the text of `/proc/self/stat` (fields 48 and 49; the command name,
/// field 2, is in parentheses and may hold spaces, so fields are counted after its last `)`).
fn argument_area(stat: &str) -> Option<Range<usize>> {
    let fields = crate::stats::process::stat_fields_after_comm(stat)?;
    let start = fields.get(48 - 3)?.parse().ok()?;
    let end = fields.get(49 - 3)?.parse().ok()?;
    (start > 0 && start < end).then_some(start..end)
}

/// Whether one mapping of `/proc/self/maps` that is readable and writable holds all of `area`.
fn writable_mapping_covers(maps: &str, area: &Range<usize>) -> bool {
    maps.lines().any(|line| {
        let mut fields = line.split_ascii_whitespace();
        let (Some(span), Some(perms)) = (fields.next(), fields.next()) else { return false };
        let Some((lo, hi)) = span.split_once('-') else { return false };
        let (Ok(lo), Ok(hi)) = (usize::from_str_radix(lo, 16), usize::from_str_radix(hi, 16)) else { return false };
        perms.starts_with("rw") && lo <= area.start && area.end <= hi
    })
}

/// `args` as a message may show them: every byte range holding one of `secrets` starred, as `ps`
/// shows this process's arguments.
pub fn starred(args: &[&str], secrets: &Secrets) -> Vec<String> {
    let mut block = args.join("\0").into_bytes();
    for range in secret_ranges(&block, secrets).0 {
        block[range].fill(MASK);
    }
    block.split(|b| *b == 0).map(|arg| String::from_utf8_lossy(arg).into_owned()).collect()
}

/// The byte ranges of a NUL-separated argument block (`/proc/self/cmdline`) that hold one of
/// `secrets`: in each argument, every occurrence of a secret as written, and every occurrence in
/// the argument read as a `-o` list (`\,` a comma, `\\` a backslash), mapped back to the bytes that
/// spell it.
pub fn secret_ranges(block: &[u8], secrets: &Secrets) -> (Vec<Range<usize>>, Scrubbed) {
    let mut ranges = Vec::new();
    let mut found = Scrubbed::default();
    let mut offset = 0;
    for arg in block.split(|b| *b == 0) {
        let (plain, origin) = unescaped(arg);
        for (values, kind) in [(&secrets.headers, &mut found.header), (&secrets.urls, &mut found.url)] {
            for value in values.iter().map(String::as_bytes) {
                for at in occurrences(arg, value) {
                    ranges.push(offset + at..offset + at + value.len());
                    *kind = true;
                }
                for at in occurrences(&plain, value) {
                    ranges.push(offset + origin[at]..offset + origin[at + value.len() - 1] + 1);
                    *kind = true;
                }
            }
        }
        offset += arg.len() + 1;
    }
    (ranges, found)
}

/// `arg` with `\,` and `\\` resolved as a `-o` list reads them, and for each of its bytes the
/// position in `arg` of the byte that gave it.
fn unescaped(arg: &[u8]) -> (Vec<u8>, Vec<usize>) {
    let (mut plain, mut origin) = (Vec::with_capacity(arg.len()), Vec::with_capacity(arg.len()));
    let mut at = 0;
    while at < arg.len() {
        if arg[at] == b'\\' && matches!(arg.get(at + 1), Some(b',' | b'\\')) {
            at += 1;
        }
        plain.push(arg[at]);
        origin.push(at);
        at += 1;
    }
    (plain, origin)
}

/// Every position where `needle` (not empty) starts in `haystack`, overlapping ones included.
fn occurrences<'a>(haystack: &'a [u8], needle: &'a [u8]) -> impl Iterator<Item = usize> + 'a {
    haystack
        .windows(needle.len().max(1))
        .enumerate()
        .filter(move |(_, w)| !needle.is_empty() && *w == needle)
        .map(|(i, _)| i)
}

/// The password (`scheme://user:PASSWORD@host`) and query string (`?QUERY`, up to a `#`) of the
/// URL in `text`, which starts at its first `://` and runs to the end of `text` (a source, or an
/// option's value).
fn url_secrets(text: &[u8]) -> Vec<Range<usize>> {
    let mut out = Vec::new();
    let Some(found) = occurrences(text, b"://").next() else { return out };
    let start = found + 3;
    let url = &text[start..];
    let authority = url.iter().position(|b| matches!(b, b'/' | b'?' | b'#')).unwrap_or(url.len());
    if let Some(at) = url[..authority].iter().rposition(|b| *b == b'@') {
        if let Some(colon) = url[..at].iter().position(|b| *b == b':') {
            if colon + 1 < at {
                out.push(start + colon + 1..start + at);
            }
        }
    }
    if let Some(q) = url.iter().position(|b| *b == b'?') {
        let stop = url[q..].iter().position(|b| *b == b'#').map_or(url.len(), |p| q + p);
        if q + 1 < stop {
            out.push(start + q + 1..start + stop);
        }
    }
    out
}

#[cfg(test)]
pub(crate) mod tests {
    use clap::{ArgAction, CommandFactory, Parser};

    use super::super::args::Cli;
    use super::*;

    const TOKEN: &str = "Bearer t0k,e\\n";
    const HEADER: &str = "Authorization: Bearer t0k,e\\n";
    const SOURCE: &str = "https://u:pa55@h/m.safetensors?X-Amz-Signature=s1g#frag";

    /// `value` as a `-o` list writes it: `\` and `,` escaped.
    fn escaped(value: &str) -> String {
        value.replace('\\', r"\\").replace(',', r"\,")
    }

    /// The argument block of `args` as the kernel keeps it, with every secret range starred.
    pub(crate) fn scrubbed(args: &[String], secrets: &Secrets) -> (String, Scrubbed) {
        let mut block = args.join("\0").into_bytes();
        let (ranges, found) = secret_ranges(&block, secrets);
        for r in ranges {
            block[r].fill(MASK);
        }
        (String::from_utf8(block).unwrap().replace('\0', " "), found)
    }

    /// Every way clap lets `stfs mount` carry `value` for the option `id`, generated from clap's own
    /// definition of it: each long name as `--NAME V` and `--NAME=V`, and each short one as `-oV`,
    /// `-o V` and `-o=V`, alone and after every cluster of the mount's short switches (`-fo V`).
    fn spellings(id: &str, value: &str) -> Vec<Vec<String>> {
        let command = Cli::command();
        let mount = command.find_subcommand("mount").unwrap();
        let arg = mount.get_arguments().find(|a| a.get_id() == id).unwrap();
        let switches: Vec<char> = mount
            .get_arguments()
            .filter(|a| matches!(a.get_action(), ArgAction::SetTrue))
            .filter_map(|a| a.get_short())
            .collect();
        assert!(!switches.is_empty());
        let mut clusters = vec![String::new()];
        for (i, a) in switches.iter().enumerate() {
            clusters.push(a.to_string());
            for b in &switches[i + 1..] {
                clusters.push(format!("{a}{b}"));
            }
        }
        let mut out = Vec::new();
        for long in arg.get_long().into_iter().chain(arg.get_all_aliases().into_iter().flatten()) {
            out.push(vec![format!("--{long}"), value.to_string()]);
            out.push(vec![format!("--{long}={value}")]);
        }
        for short in arg.get_short().into_iter().chain(arg.get_all_short_aliases().into_iter().flatten()) {
            for cluster in &clusters {
                out.push(vec![format!("-{cluster}{short}"), value.to_string()]);
                out.push(vec![format!("-{cluster}{short}{value}")]);
                out.push(vec![format!("-{cluster}{short}={value}")]);
            }
        }
        assert!(!out.is_empty(), "{id} has no name");
        out
    }

    /// Checks that each spelling parses, that none of `hidden` (nor any part of the source's
    /// secrets) is left in its block, that the rest is, and what was found.
    fn assert_scrubbed(spellings: Vec<Vec<String>>, hidden: &[&str], header: bool) {
        for spelling in spellings {
            let mut args: Vec<String> = ["stfs", "mount", SOURCE, "/mnt/x"].map(String::from).to_vec();
            args.extend(spelling);
            let cli = Cli::try_parse_from(&args).unwrap_or_else(|e| panic!("{args:?}: {e}"));
            let secrets = Secrets::of_command(&cli.command);
            let (text, found) = scrubbed(&args, &secrets);
            for secret in hidden.iter().chain(&["pa55", "s1g"]) {
                assert!(!text.contains(secret), "{secret:?} left in {text:?}");
            }
            assert!(text.contains(" /mnt/x") && text.contains("#frag") && text.contains("https://u:"), "{text:?}");
            assert_eq!(found, Scrubbed { header, url: true }, "{args:?}");
        }
    }

    #[test]
    fn a_header_is_scrubbed_in_every_spelling_clap_accepts() {
        let long = spellings("headers", HEADER);
        let short = spellings("options", "npy");
        assert!(long.len() >= 2 && short.len() >= 9, "{long:?} {short:?}");
        assert_scrubbed(long, &["t0k", "e\\n"], true);
        // In a -o list: first, in the middle, last, and alone; the comma and backslash escaped.
        let item = format!("header={}", escaped(HEADER));
        for list in [format!("{item},npy"), format!("ro,{item},cache_size=1G"), format!("npy,{item}"), item.clone()] {
            assert_scrubbed(spellings("options", &list), &["t0k", "e\\\\n", &escaped(TOKEN)], true);
        }
        // An unescaped backslash, which a -o list keeps as it is.
        assert_scrubbed(spellings("options", r"header=X-A: a\b"), &[r"a\b"], true);
    }

    #[test]
    fn url_secrets_are_scrubbed_in_every_spelling() {
        let endpoint = "http://k:s3cr3t@127.0.0.1:9/?sig=zz";
        assert_scrubbed(spellings("endpoint_url", endpoint), &["s3cr3t", "sig=zz"], false);
        let list = format!("endpoint_url={endpoint},npy");
        assert_scrubbed(spellings("options", &list), &["s3cr3t", "sig=zz"], false);
    }

    #[test]
    fn what_is_not_secret_is_left_alone() {
        let args: Vec<String> =
            ["stfs", "mount", "https://user@host/a?", "/mnt/a?b", "--header-file", "/etc/h", "-o", "npy,threads=2"]
                .map(String::from)
                .to_vec();
        let secrets = Secrets::of_command(&Cli::try_parse_from(&args).unwrap().command);
        assert!(secrets.is_empty(), "{secrets:?}");
        assert_eq!(scrubbed(&args, &secrets), (args.join(" "), Scrubbed::default()));
        // A header without a value hides nothing; one without a colon hides all of it.
        let mut s = Secrets::default();
        s.add_header("X-Empty:  ");
        assert!(s.is_empty());
        s.add_header("nocolon");
        assert_eq!(s.headers, ["nocolon"]);
    }

    #[test]
    fn escapes_map_back_to_the_bytes_that_spell_them() {
        let (plain, origin) = unescaped(br"a\,b\\c\d,");
        assert_eq!(plain, br"a,b\c\d,");
        assert_eq!(origin, [0, 2, 3, 5, 6, 7, 8, 9]);
        assert_eq!(occurrences(b"aaa", b"aa").collect::<Vec<_>>(), [0, 1]);
        assert_eq!(occurrences(b"abc", b"").count(), 0);
        let url = "s3://k:p@b/x?q=1#f";
        let parts: Vec<&str> = url_secrets(url.as_bytes()).into_iter().map(|r| &url[r]).collect();
        assert_eq!(parts, ["p", "q=1"]);
    }

    #[test]
    fn the_argument_area_is_read_after_the_command_name() {
        let mut fields: Vec<String> = (3..=52).map(|n| n.to_string()).collect();
        fields[48 - 3] = "4096".into();
        fields[49 - 3] = "4200".into();
        let stat = format!("123 (a) b) (c) {}", fields.join(" "));
        assert_eq!(argument_area(&stat), Some(4096..4200));
        assert_eq!(argument_area("1 (x) R 2"), None);
        let maps = "1000-2000 r--p 0 0:0 0\n3000-5000 rw-p 0 0:0 0 [stack]\n";
        assert!(writable_mapping_covers(maps, &(0x3000..0x4000)));
        assert!(!writable_mapping_covers(maps, &(0x1000..0x1800)));
        assert!(!writable_mapping_covers(maps, &(0x4000..0x5001)));
    }

    /// The real thing, on this test process: its own block is where the kernel says.
    #[test]
    fn this_process_has_a_readable_argument_area() {
        let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
        let area = argument_area(&stat).unwrap();
        assert_eq!(area.len(), std::fs::read("/proc/self/cmdline").unwrap().len());
        assert!(writable_mapping_covers(&std::fs::read_to_string("/proc/self/maps").unwrap(), &area));
    }
}
