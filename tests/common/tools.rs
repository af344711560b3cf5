//! What a test does when a tool it needs is missing: fail under `CI=true`, else skip with a message.

/// Called where a test cannot run because `tool` is not installed: under `CI=true` (where the test
/// command installs every tool) it fails the test; elsewhere it prints why the test is skipped.
pub fn tool_missing(tool: &str, install: &str) {
    let ci = std::env::var("CI").is_ok_and(|v| v == "true" || v == "1");
    assert!(!ci, "{tool} is not installed, and CI=true: the test command must install it ({install})");
    println!("skipping: {tool} is not installed ({install})");
}
