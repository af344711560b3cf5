//! What a test does when a tool it needs is missing, or root it needs is not there: fail under
//! `CI=true`, else skip with a message.
#![allow(dead_code)] // also included alone by test binaries that use only part of it

/// Called where a test cannot run because `tool` is not installed: under `CI=true` (where the test
/// command installs every tool) it fails the test; elsewhere it prints why the test is skipped.
pub fn tool_missing(tool: &str, install: &str) {
    let ci = std::env::var("CI").is_ok_and(|v| v == "true" || v == "1");
    assert!(!ci, "{tool} is not installed, and CI=true: the test command must install it ({install})");
    println!("skipping: {tool} is not installed ({install})");
}

/// Whether the test must stop because it needs root for `why` and is not root: under `CI=true`
/// (where the test command runs as root) it fails the test instead; elsewhere it prints why the
/// test is skipped and returns true.
pub fn not_root(why: &str) -> bool {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        return false;
    }
    let ci = std::env::var("CI").is_ok_and(|v| v == "true" || v == "1");
    assert!(!ci, "not root, and CI=true: the test command runs as root ({why} needs it)");
    println!("skipping: needs root ({why})");
    true
}
