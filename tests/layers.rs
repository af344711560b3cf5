//! Holds `src/` to its layer rule: a module imports only from layers below its own, peers of one
//! layer do not import each other, and no two modules import each other through any chain.
//!
//! The check reads every `.rs` file under `src/` as text and resolves each path that starts with
//! `crate::`, `super::`, `self::` or a child module's name to the module file it names. The layer
//! of a module is its top-level folder or file under `src/` (`engine::cache` is in `engine`).
//! A `pub use` re-export counts for the layer rule but not as an edge of a cycle (a parent that
//! re-exports its child's items is a facade). Its own tests show that it fails on an upward
//! import, on peers and on a cycle.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// The layers from the bottom up. Layers in one inner list are peers: neither may import the other.
const LAYERS: &[&[&str]] = &[
    &["util"],
    &["stats"],
    &["format"],
    &["views"],
    &["source"],
    &["engine"],
    &["checkpoint", "tree"],
    &["fs"],
    &["fuse"],
    &["mount"],
    &["csi"],
    &["cli"],
];

/// Module path (`engine::cache`) -> source text, for every file of a tree.
type Tree = BTreeMap<String, String>;

fn rank(layer: &str) -> Option<usize> {
    LAYERS.iter().position(|peers| peers.contains(&layer))
}

/// The module path of a file below `src/`: `engine/cache/mod.rs` -> `engine::cache`.
fn module_of(relative: &Path) -> String {
    let mut parts: Vec<String> = relative.iter().map(|p| p.to_string_lossy().into_owned()).collect();
    let file = parts.pop().unwrap_or_default();
    let stem = file.trim_end_matches(".rs");
    if stem != "mod" && stem != "lib" {
        parts.push(stem.to_string());
    }
    parts.join("::")
}

fn read_tree(src: &Path) -> Tree {
    fn walk(dir: &Path, src: &Path, out: &mut Tree) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, src, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&path).unwrap();
                out.insert(module_of(path.strip_prefix(src).unwrap()), text);
            }
        }
    }
    let mut tree = Tree::new();
    walk(src, src, &mut tree);
    tree
}

/// The code of a file without comments (doc links are not imports) or string literals.
fn code_only(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        let mut in_string = false;
        let mut prev = ' ';
        let mut kept = String::new();
        let chars: Vec<char> = line.chars().collect();
        let mut i = 0;
        while i < chars.len() {
            let c = chars[i];
            if !in_string && c == '/' && chars.get(i + 1) == Some(&'/') {
                break;
            }
            if c == '"' && prev != '\\' {
                in_string = !in_string;
            } else if !in_string {
                kept.push(c);
            }
            prev = if prev == '\\' && c == '\\' { ' ' } else { c };
            i += 1;
        }
        out.push_str(&kept);
        out.push('\n');
    }
    out
}

/// Every path a piece of code names: `a::b::c`, with `use x::{y, z::w}` groups expanded.
fn paths_in(code: &str) -> Vec<String> {
    let bytes: Vec<char> = code.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let starts_word = i == 0 || !(bytes[i - 1].is_alphanumeric() || bytes[i - 1] == '_' || bytes[i - 1] == ':');
        if starts_word && (bytes[i].is_alphabetic() || bytes[i] == '_') {
            let (path, next) = read_path(&bytes, i);
            out.extend(path);
            i = next.max(i + 1);
        } else {
            i += 1;
        }
    }
    out
}

/// Reads a path starting at `i`, expanding one level of braces recursively; returns full paths.
fn read_path(chars: &[char], mut i: usize) -> (Vec<String>, usize) {
    let mut prefix = String::new();
    loop {
        let start = i;
        while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
            i += 1;
        }
        prefix.push_str(&chars[start..i].iter().collect::<String>());
        let mut j = i;
        while j < chars.len() && chars[j].is_whitespace() {
            j += 1;
        }
        if chars.get(j) == Some(&':') && chars.get(j + 1) == Some(&':') {
            j += 2;
            while j < chars.len() && chars[j].is_whitespace() {
                j += 1;
            }
            if chars.get(j) == Some(&'{') {
                // A group: each member is a path of its own after the prefix.
                let mut paths = Vec::new();
                let mut k = j + 1;
                loop {
                    while k < chars.len() && (chars[k].is_whitespace() || chars[k] == ',') {
                        k += 1;
                    }
                    if k >= chars.len() || chars[k] == '}' {
                        return (paths, k + 1);
                    }
                    if chars[k].is_alphabetic() || chars[k] == '_' || chars[k] == '*' {
                        if chars[k] == '*' {
                            paths.push(format!("{prefix}::*"));
                            k += 1;
                            continue;
                        }
                        let (inner, next) = read_path(chars, k);
                        paths.extend(inner.into_iter().map(|p| format!("{prefix}::{p}")));
                        k = next;
                    } else {
                        k += 1;
                    }
                }
            }
            prefix.push_str("::");
            i = j;
            if !(i < chars.len() && (chars[i].is_alphabetic() || chars[i] == '_')) {
                return (vec![prefix.trim_end_matches("::").to_string()], i);
            }
        } else {
            return (vec![prefix], i);
        }
    }
}

/// The child modules a file declares (`mod x;`, `pub mod x;`, `pub(crate) mod x;`).
fn children(code: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for line in code.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        if let Some(at) = words.iter().position(|w| *w == "mod") {
            if let Some(name) = words.get(at + 1) {
                let name = name.trim_end_matches(';').trim_end_matches('{');
                if !name.is_empty() && words[..at].iter().all(|w| w.starts_with("pub") || w.starts_with("#[")) {
                    out.insert(name.to_string());
                }
            }
        }
    }
    out
}

/// Resolves `path`, named in module `from`, to the module file it lands in, if it is in the crate.
fn resolve(tree: &Tree, from: &str, kids: &BTreeSet<String>, path: &str) -> Option<String> {
    let mut segments: Vec<&str> = path.split("::").collect();
    let mut base: Vec<String> = if from.is_empty() { vec![] } else { from.split("::").map(String::from).collect() };
    match segments.first().copied() {
        Some("crate") => {
            base.clear();
            segments.remove(0);
        }
        Some("self") => {
            segments.remove(0);
        }
        Some("super") => {
            while segments.first() == Some(&"super") {
                segments.remove(0);
                base.pop();
            }
        }
        Some(first) if kids.contains(first) && segments.len() > 1 => {}
        _ => return None,
    }
    let mut module = base;
    let mut found = module.join("::");
    for segment in segments {
        module.push(segment.to_string());
        let candidate = module.join("::");
        if tree.contains_key(&candidate) {
            found = candidate;
        } else {
            break;
        }
    }
    Some(found)
}

/// The code with `super::` inside an inline `mod name { ... }` block rewritten to `self::` (one
/// level): there `super` is the file's own module, not its parent.
fn inline_supers_resolved(code: &str) -> String {
    let mut out = String::with_capacity(code.len());
    let mut depth = 0usize;
    let mut inline_starts: Vec<usize> = Vec::new();
    let mut pending_inline = false;
    let chars: Vec<char> = code.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let rest: String = chars[i..chars.len().min(i + 7)].iter().collect();
        let at_word = i == 0 || !(chars[i - 1].is_alphanumeric() || chars[i - 1] == '_');
        if at_word && rest.starts_with("mod ") {
            // `mod x {` opens an inline module; `mod x;` declares a file.
            let tail: String = chars[i..].iter().take_while(|c| **c != ';' && **c != '{').collect();
            pending_inline = chars.get(i + tail.chars().count()) == Some(&'{');
        }
        match chars[i] {
            '{' => {
                depth += 1;
                if pending_inline {
                    inline_starts.push(depth);
                    pending_inline = false;
                }
            }
            '}' => {
                if inline_starts.last() == Some(&depth) {
                    inline_starts.pop();
                }
                depth = depth.saturating_sub(1);
            }
            _ => {}
        }
        if at_word && !inline_starts.is_empty() && rest.starts_with("super::") {
            out.push_str("self::");
            i += "super::".len();
            continue;
        }
        out.push(chars[i]);
        i += 1;
    }
    out
}

/// Module -> the modules it names, for every file of the tree (self edges left out). Without
/// `reexports`, the `pub use` lines are left out: a module that re-exports its child's items is a
/// facade over it, not a user of it (a child may then use its parent's items without a cycle).
fn imports(tree: &Tree, reexports: bool) -> BTreeMap<String, BTreeSet<String>> {
    let mut graph = BTreeMap::new();
    for (module, text) in tree {
        let mut code = inline_supers_resolved(&code_only(text));
        if !reexports {
            code = code
                .lines()
                .filter(|l| !(l.trim_start().starts_with("pub use") || l.trim_start().starts_with("pub(crate) use")))
                .collect::<Vec<_>>()
                .join("\n");
        }
        let kids = children(&code);
        let targets: BTreeSet<String> = paths_in(&code)
            .iter()
            .filter_map(|p| resolve(tree, module, &kids, p))
            .filter(|t| t != module && !t.is_empty())
            .collect();
        graph.insert(module.clone(), targets);
    }
    graph
}

fn layer_of(module: &str) -> &str {
    module.split("::").next().unwrap_or("")
}

/// Every broken rule, one line each; empty when the tree keeps them all.
fn violations(tree: &Tree) -> Vec<String> {
    let graph = imports(tree, true);
    let mut out = Vec::new();
    for (module, targets) in &graph {
        let Some(own) = rank(layer_of(module)) else {
            if !module.is_empty() && module != "main" {
                out.push(format!("{module}: in no layer (add its folder to LAYERS in tests/layers.rs)"));
            }
            continue;
        };
        for target in targets {
            let Some(theirs) = rank(layer_of(target)) else { continue };
            if theirs > own {
                out.push(format!("{module} imports {target}, a layer above it"));
            } else if theirs == own && layer_of(module) != layer_of(target) {
                out.push(format!("{module} imports {target}, a peer layer"));
            }
        }
    }
    out.extend(cycles(&imports(tree, false)).into_iter().map(|c| format!("import cycle: {}", c.join(" -> "))));
    out
}

/// The import cycles of the graph, each once, as the modules along it (first repeated at the end).
fn cycles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    let mut found = Vec::new();
    let mut seen_sets = BTreeSet::new();
    for start in graph.keys() {
        // Depth-first search for a path back to `start` through modules greater than it, so each
        // cycle is reported from its smallest module only.
        let mut stack = vec![(start.clone(), vec![start.clone()])];
        while let Some((node, path)) = stack.pop() {
            for next in graph.get(&node).into_iter().flatten() {
                if next == start {
                    let mut cycle = path.clone();
                    cycle.push(start.clone());
                    let set: BTreeSet<String> = path.iter().cloned().collect();
                    if seen_sets.insert(set) {
                        found.push(cycle);
                    }
                } else if next > start && !path.contains(next) && path.len() < 12 {
                    let mut longer = path.clone();
                    longer.push(next.clone());
                    stack.push((next.clone(), longer));
                }
            }
        }
    }
    found
}

#[test]
fn src_imports_only_go_down_and_never_in_a_cycle() {
    let tree = read_tree(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
    assert!(tree.len() > 30, "read only {} files", tree.len());
    let broken = violations(&tree);
    assert!(broken.is_empty(), "layer rule broken:\n{}", broken.join("\n"));
}

fn tree_of(files: &[(&str, &str)]) -> Tree {
    files.iter().map(|(m, t)| (m.to_string(), t.to_string())).collect()
}

#[test]
fn an_upward_import_is_caught() {
    let tree = tree_of(&[
        ("format", "pub fn parse() { crate::engine::Engine::new(); }"),
        ("engine", "use crate::format::parse;\npub struct Engine;"),
    ]);
    let broken = violations(&tree);
    assert!(broken.iter().any(|l| l == "format imports engine, a layer above it"), "{broken:?}");
}

#[test]
fn peers_may_not_import_each_other() {
    let tree = tree_of(&[("tree", "use crate::checkpoint::Checkpoint;"), ("checkpoint", "pub struct Checkpoint;")]);
    assert_eq!(violations(&tree), ["tree imports checkpoint, a peer layer"]);
}

#[test]
fn a_cycle_inside_a_layer_is_caught() {
    // engine -> readahead -> stream -> cache -> engine: the cycle this check was written against.
    let tree = tree_of(&[
        ("engine", "mod cache;\nmod readahead;\nmod stream;\nuse readahead::StreamTable;\npub type SourceId = usize;"),
        ("engine::readahead", "use super::stream::LANES;"),
        ("engine::stream", "use crate::engine::cache::lock;"),
        ("engine::cache", "use super::SourceId;"),
    ]);
    let broken = violations(&tree);
    assert_eq!(
        broken,
        ["import cycle: engine -> engine::readahead -> engine::stream -> engine::cache -> engine"],
        "{broken:?}"
    );
}

#[test]
fn comments_strings_and_outside_crates_are_not_imports() {
    let tree = tree_of(&[
        ("format", "//! See [`crate::engine::Engine`].\nconst S: &str = \"crate::engine\";\nuse std::io;"),
        ("engine", "use fuser::Filesystem;"),
    ]);
    assert!(violations(&tree).is_empty(), "{:?}", violations(&tree));
}

#[test]
fn super_in_an_inline_test_module_is_the_file_itself() {
    let tree = tree_of(&[
        ("cli", "mod extract;\npub fn run() { extract::go(); }\nuse extract::go;"),
        ("cli::extract", "pub fn go() {}\n#[cfg(test)]\nmod tests {\n    use super::go;\n}"),
    ]);
    assert!(violations(&tree).is_empty(), "{:?}", violations(&tree));
    let tree = tree_of(&[
        ("cli", "mod extract;\nuse extract::go;\npub fn run() {}"),
        ("cli::extract", "use super::run;\npub fn go() {}"),
    ]);
    assert_eq!(violations(&tree), ["import cycle: cli -> cli::extract -> cli"]);
}

#[test]
fn module_paths_follow_files() {
    assert_eq!(module_of(Path::new("engine/cache/mod.rs")), "engine::cache");
    assert_eq!(module_of(Path::new("engine/readahead.rs")), "engine::readahead");
    assert_eq!(module_of(Path::new("lib.rs")), "");
}

/// Every file under `src/` opens with a `//!` line saying what it owns and holds at most 600 lines,
/// tests included.
#[test]
fn every_source_file_says_what_it_owns_and_stays_short() {
    let tree = read_tree(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
    let mut broken = Vec::new();
    for (module, text) in &tree {
        let name = if module.is_empty() { "lib" } else { module };
        if !text.starts_with("//!") {
            broken.push(format!("{name}: does not open with a //! line"));
        }
        let lines = text.lines().count();
        if lines > 600 {
            broken.push(format!("{name}: {lines} lines (at most 600)"));
        }
    }
    assert!(broken.is_empty(), "{}", broken.join("\n"));
}
