//! Clearing secrets from this process's command line as other users see it (`ps`,
//! `/proc/PID/cmdline`): header values and URL query strings and passwords are overwritten in place
//! once the arguments have been copied, so the daemon (a fork, which keeps the same memory) never
//! shows them for the life of the mount.
//!
//! Linux keeps the argument strings in one NUL-separated block of the process's own memory, from
//! `arg_start` to `arg_end` (fields 48 and 49 of `/proc/self/stat`), and `/proc/PID/cmdline` is read
//! from that block. [`hide_secret_arguments`] finds the secret byte ranges in the block as
//! `/proc/self/cmdline` shows it, checks that the block is where the kernel says and holds exactly
//! those bytes, and overwrites the ranges with `*`. The unsafe code is confined to that last step.

use std::io;
use std::ops::Range;

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

/// Overwrites, in this process's argument block, every header value and every URL query string
/// and password, and says what it found. Call once the arguments have been copied (std's
/// `args_os` reads the same block) and before any thread starts.
pub fn hide_secret_arguments() -> io::Result<Scrubbed> {
    let cmdline = std::fs::read("/proc/self/cmdline")?;
    let (ranges, found) = secret_ranges(&cmdline);
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

/// `args` as a message may show them: the bytes [`secret_ranges`] finds in them (header values, URL
/// passwords and query strings) starred, as `ps` shows this process's arguments.
pub fn starred(args: &[&str]) -> Vec<String> {
    let mut block = args.join("\0").into_bytes();
    for range in secret_ranges(&block).0 {
        block[range].fill(b'*');
    }
    block.split(|b| *b == 0).map(|arg| String::from_utf8_lossy(arg).into_owned()).collect()
}

/// The secret byte ranges of a NUL-separated argument block (`/proc/self/cmdline`): the value of
/// each header given as `--header V`, `--header=V`, `-o header=V` or `-oheader=V` (after its `:`,
/// or all of it without one), and in every argument naming a URL (`SCHEME://`) its password and
/// its query string.
pub fn secret_ranges(block: &[u8]) -> (Vec<Range<usize>>, Scrubbed) {
    let mut ranges = Vec::new();
    let mut found = Scrubbed::default();
    let mut offset = 0;
    let mut previous: &[u8] = b"";
    for arg in block.split(|b| *b == 0) {
        let at = |r: Range<usize>| r.start + offset..r.end + offset;
        let mut headers = Vec::new();
        let options = previous == b"-o" || (arg.starts_with(b"-o") && !arg.starts_with(b"--"));
        if previous == b"--header" {
            headers.push(0..arg.len());
        } else if let Some(value) = arg.strip_prefix(b"--header=") {
            headers.push(arg.len() - value.len()..arg.len());
        } else if options {
            let skip = if previous == b"-o" { 0 } else { 2 };
            headers.extend(option_headers(&arg[skip..]).map(|r| r.start + skip..r.end + skip));
        }
        for header in headers {
            let value = header_value(&arg[header.clone()]);
            if !value.is_empty() {
                found.header = true;
                ranges.push(at(value.start + header.start..value.end + header.start));
            }
        }
        for r in url_secrets(arg, options) {
            found.url = true;
            ranges.push(at(r));
        }
        offset += arg.len() + 1;
        previous = arg;
    }
    (ranges, found)
}

/// The `header=...` items of a comma-separated `-o` list (`\,` inside a value), as ranges of their
/// values.
fn option_headers(list: &[u8]) -> impl Iterator<Item = Range<usize>> + '_ {
    option_list::item_ranges(list).into_iter().filter_map(move |item| {
        let value = list[item.clone()].strip_prefix(b"header=")?;
        Some(item.end - value.len()..item.end)
    })
}

/// Where the value of a `Name: value` header is (after the first `:`, spaces kept out); all of it
/// when there is no `:`.
fn header_value(header: &[u8]) -> Range<usize> {
    let Some(colon) = header.iter().position(|b| *b == b':') else { return 0..header.len() };
    let start = colon + 1 + header[colon + 1..].iter().take_while(|b| **b == b' ').count();
    start..header.len()
}

/// The password (`scheme://user:PASSWORD@host`) and query string (`?QUERY`, up to a `#`) of every
/// URL in `arg`: each `://` starts one, up to the end of `arg`, or in a `-o` list (`options`) up to
/// the next `,`.
fn url_secrets(arg: &[u8], options: bool) -> Vec<Range<usize>> {
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(found) = find(&arg[from..], b"://") {
        let start = from + found + 3;
        let comma = arg[start..].iter().position(|b| options && *b == b',');
        let end = comma.map_or(arg.len(), |p| start + p);
        let url = &arg[start..end];
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
        from = end;
    }
    out
}

/// The first position of `needle` in `haystack`.
fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The block with every secret range masked.
    fn masked(args: &[&str]) -> (String, Scrubbed) {
        let mut block = args.join("\0").into_bytes();
        block.push(0);
        let (ranges, found) = secret_ranges(&block);
        for r in ranges {
            block[r].fill(MASK);
        }
        (String::from_utf8(block).unwrap().trim_end_matches('\0').replace('\0', " "), found)
    }

    #[test]
    fn header_values_are_masked_in_every_spelling() {
        let (text, found) = masked(&[
            "stfs",
            "mount",
            "--header",
            "Authorization: Bearer abc",
            "--header=X-Key:k1",
            "-o",
            r"cache_size=1G,header=X-A: v2\,v3,threads=2",
            "-oheader=X-B: v3",
            "--header-file",
            "/etc/h",
            "src",
            "/mnt",
        ]);
        assert_eq!(
            text,
            "stfs mount --header Authorization: ********** --header=X-Key:** -o cache_size=1G,header=X-A: ******,threads=2 \
             -oheader=X-B: ** --header-file /etc/h src /mnt"
        );
        assert_eq!(found, Scrubbed { header: true, url: false });
        assert_eq!(masked(&["stfs", "--header", "nocolon"]).0, "stfs --header *******");
    }

    #[test]
    fn url_queries_and_passwords_are_masked_and_the_rest_kept() {
        let (text, found) = masked(&[
            "stfs",
            "mount",
            "https://user:pw@host/m.safetensors?X-Amz-Signature=abc&X-Amz-Credential=k,x#frag",
            "/mnt/m",
            "-o",
            "endpoint_url=http://h:9000/?sig=1,region=x",
        ]);
        assert_eq!(
            text,
            "stfs mount https://user:**@host/m.safetensors?****************************************#frag /mnt/m \
             -o endpoint_url=http://h:9000/?*****,region=x"
        );
        assert_eq!(found, Scrubbed { header: false, url: true });
        let (plain, found) = masked(&["stfs", "mount", "https://user@host/a?", "/mnt/a?b"]);
        assert_eq!(plain, "stfs mount https://user@host/a? /mnt/a?b");
        assert_eq!(found, Scrubbed::default());
    }

    #[test]
    fn starred_arguments_show_no_secret_and_keep_the_rest() {
        let shown = starred(&[
            "https://u:pw@host/m.safetensors?X-Amz-Signature=abc",
            "-o",
            "npy,header=X-Key: s3cr\\,et,timeout=5s",
        ]);
        assert_eq!(shown.len(), 3);
        for secret in ["pw", "abc", "s3cr", "et,timeout"] {
            assert!(!shown.iter().any(|a| a.contains(secret)), "{secret} in {shown:?}");
        }
        assert!(shown[0].starts_with("https://u:") && shown[0].contains("@host/m.safetensors?"), "{shown:?}");
        assert!(shown[2].starts_with("npy,header=X-Key: *") && shown[2].ends_with(",timeout=5s"), "{shown:?}");
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

    /// The real thing, on this test process: its own block is where the kernel says, and a block
    /// without secrets is left alone.
    #[test]
    fn this_process_has_a_readable_argument_area() {
        let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
        let area = argument_area(&stat).unwrap();
        assert_eq!(area.len(), std::fs::read("/proc/self/cmdline").unwrap().len());
        assert!(writable_mapping_covers(&std::fs::read_to_string("/proc/self/maps").unwrap(), &area));
    }
}
