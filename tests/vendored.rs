//! The vendored fuser (`vendor/fuser/`) is described the same in both places that describe it: its
//! `PATCHES.md`, one `## Patch N, ...` section per patch, and the comment above
//! `[patch.crates-io]` in `Cargo.toml`, which must give the same number of patches and name the
//! API of each (the names a section's heading puts in backquotes, file paths left out). A patch
//! added to one and not the other fails here (issue 44, item 8: the comment said "one method
//! added" while PATCHES.md listed a transport API too).

use std::path::Path;

const NUMBERS: [&str; 6] = ["no", "one", "two", "three", "four", "five"];

fn read(path: &str) -> String {
    let full = Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
    std::fs::read_to_string(&full).unwrap_or_else(|e| panic!("{}: {e}", full.display()))
}

/// The names `text` puts in backquotes.
fn quoted(text: &str) -> Vec<&str> {
    text.split('`').skip(1).step_by(2).collect()
}

/// The comment lines right above `[patch.crates-io]`, joined with spaces.
fn patch_comment(manifest: &str) -> String {
    let lines: Vec<&str> = manifest.lines().collect();
    let at = lines.iter().position(|l| l.trim() == "[patch.crates-io]").expect("Cargo.toml has [patch.crates-io]");
    let mut comment: Vec<&str> =
        lines[..at].iter().rev().take_while(|l| l.starts_with('#')).map(|l| l.trim_start_matches('#').trim()).collect();
    comment.reverse();
    comment.join(" ")
}

/// "with two patches" (or one, three...) in `text`: the number, if given.
fn patches_counted(text: &str) -> Option<usize> {
    NUMBERS.iter().position(|n| text.contains(&format!("with {n} patch")))
}

#[test]
fn cargo_toml_and_patches_md_describe_the_same_fuser_patches() {
    let patches = read("vendor/fuser/PATCHES.md");
    let comment = patch_comment(&read("Cargo.toml"));
    let headings: Vec<&str> = patches.lines().filter(|l| l.starts_with("## Patch ")).collect();
    assert!(!headings.is_empty(), "PATCHES.md has no `## Patch N, ...` section");
    let title = patches.lines().next().unwrap_or_default();
    assert_eq!(patches_counted(title), Some(headings.len()), "PATCHES.md's title counts its sections: {title}");
    assert_eq!(
        patches_counted(&comment),
        Some(headings.len()),
        "Cargo.toml's comment gives the number of patches PATCHES.md has ({}): {comment}",
        headings.len()
    );
    assert!(comment.contains("vendor/fuser/PATCHES.md"), "Cargo.toml's comment points at PATCHES.md: {comment}");
    for heading in headings {
        let names: Vec<&str> =
            quoted(heading).into_iter().filter(|n| !n.contains('/') && !n.ends_with(".rs")).collect();
        assert!(!names.is_empty(), "this heading names no API: {heading}");
        for name in names {
            assert!(
                quoted(&comment).contains(&name),
                "Cargo.toml's comment does not name `{name}` ({heading}): {comment}"
            );
        }
    }
}

#[test]
fn the_checks_catch_a_comment_that_counts_or_names_too_few() {
    let old =
        "[dependencies]\n# fuser 0.18.0 with one method added (`ReplyData::sent_elsewhere`, for replies stfs splices\n\
               # into /dev/fuse itself); see vendor/fuser/PATCHES.md.\n[patch.crates-io]\nfuser = {}\n";
    let comment = patch_comment(old);
    assert!(comment.starts_with("fuser 0.18.0 with one method") && comment.ends_with("PATCHES.md."), "{comment}");
    assert_eq!(patches_counted(&comment), None, "\"one method added\" counts no patches");
    assert_eq!(patches_counted("fuser, with two patches"), Some(2));
    assert_eq!(quoted(&comment), ["ReplyData::sent_elsewhere"]);
}
