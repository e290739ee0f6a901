//! The layering of `firmware/` (docs/ARCHITECTURE.md), checked on the sources so the next
//! change cannot quietly break it:
//!
//! 1. a module imports only from its own layer or the layers below it (`LAYERS`, the one
//!    table of the rule);
//! 2. no cycle between modules, and none between files, where a file naming a module above
//!    it in its own tree (`super::X`, the module's shared vocabulary) or below it (a parent's
//!    `pub use child::X`) does not count: those are one module talking to itself.
//!
//! 3. the daemon's crate depends on none of the tools' crates (plotters, indicatif, the tools
//!    crate).
//!
//! Test code (`tests.rs` files and `#[cfg(test)]` modules) sits above every layer and is not
//! checked. Every `crate::a::b` or `super::a` path counts, in `use` lines or inline.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Every top-level module of the library (backend split by backend) and its layer, bottom up.
const LAYERS: &[(&str, u8)] = &[
    ("board", 1),
    ("sys", 1),
    ("boot", 2),
    ("model", 3),
    ("tables", 3),
    ("tokenizer", 3),
    ("load", 3),
    ("ops", 4),
    ("quant", 5),
    ("kv", 5),
    ("sparsity", 5),
    ("predict", 5),
    ("stream", 5),
    ("control", 5),
    ("backend", 6),
    ("backend/cpu", 6),
    ("backend/cuda", 6),
    ("engine", 7),
    ("serve", 8),
    // The tools (bench, offline, client, the `leanstream` CLI) are the `tools/` crate, above
    // all of these: see `the_daemon_crate_links_no_tool`.
];

/// The crate-root macros (`crate::log_info!` and friends) are the logger's, in `sys`.
const ROOT_MACROS: &[&str] = &["log_at", "log_debug", "log_info", "log_warn", "log_error"];

struct Source {
    /// Module path: `firmware/a/b.rs` and `firmware/a/b/mod.rs` are `[a, b]`.
    module: Vec<String>,
    text: String,
}

fn firmware() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("firmware")
}

fn read_sources(dir: &Path, out: &mut BTreeMap<PathBuf, Source>) {
    for entry in std::fs::read_dir(dir).expect("read firmware/") {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            read_sources(&path, out);
            continue;
        }
        if path.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        let rel = path.strip_prefix(firmware()).expect("under firmware/");
        let mut module: Vec<String> = rel
            .with_extension("")
            .components()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect();
        if matches!(module.last().map(String::as_str), Some("mod" | "lib")) {
            module.pop();
        }
        let text = std::fs::read_to_string(&path).expect("read source");
        out.insert(path, Source { module, text });
    }
}

/// The source without comments and without `#[cfg(test)]` modules.
fn product_code(text: &str) -> String {
    let no_comments: String = text
        .lines()
        .map(|l| match l.find("//") {
            // A `//` inside a string literal is rare enough here; the paths we look for are not
            // in strings.
            Some(i) => &l[..i],
            None => l,
        })
        .collect::<Vec<_>>()
        .join("\n");
    let mut out = String::new();
    let mut rest = no_comments.as_str();
    while let Some(at) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..at]);
        let after = &rest[at + "#[cfg(test)]".len()..];
        let trimmed = after.trim_start();
        let is_mod = trimmed.starts_with("mod ")
            || trimmed.starts_with("pub mod ")
            || trimmed.starts_with("pub(crate) mod ");
        match (is_mod, after.find(['{', ';'])) {
            (true, Some(open)) if after.as_bytes()[open] == b'{' => {
                rest = &after[skip_block(after, open)..];
            }
            _ => rest = after,
        }
    }
    out.push_str(rest);
    out
}

/// The index just past the block whose `{` is at `open` (string and char literals skipped).
fn skip_block(s: &str, open: usize) -> usize {
    let b = s.as_bytes();
    let (mut i, mut depth) = (open, 0usize);
    while i < b.len() {
        match b[i] {
            b'"' => {
                i += 1;
                while i < b.len() && b[i] != b'"' {
                    i += if b[i] == b'\\' { 2 } else { 1 };
                }
            }
            b'\'' if i + 2 < b.len() && b[i + 2] == b'\'' => i += 2,
            b'{' => depth += 1,
            b'}' => {
                depth -= 1;
                if depth == 0 {
                    return i + 1;
                }
            }
            _ => {}
        }
        i += 1;
    }
    b.len()
}

/// Every path the code names from `crate::` or `super::`, as segments relative to the crate
/// root. Grouped imports (`use crate::{a::b, c::{d, e}}`) give one path per item.
fn referenced_paths(code: &str, module: &[String]) -> Vec<Vec<String>> {
    let mut paths = Vec::new();
    let bytes = code.as_bytes();
    for start in ["crate::", "super::"] {
        let mut from = 0;
        while let Some(i) = code[from..].find(start).map(|i| i + from) {
            from = i + start.len();
            if i > 0 && (bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'_') {
                continue;
            }
            // `super::super::x` is counted once, from its first `super`.
            if i >= 7 && &code[i - 7..i] == "super::" {
                continue;
            }
            let mut base: Vec<String> = if start == "crate::" {
                Vec::new()
            } else {
                module[..module.len().saturating_sub(1)].to_vec()
            };
            let mut rest = &code[from..];
            while let Some(r) = rest.strip_prefix("super::") {
                base.pop();
                rest = r;
            }
            expand(base, rest, &mut paths);
        }
    }
    paths
}

/// Appends the paths `text` starts with, under `base`: one path, or one per item of a
/// `{...}` group (recursively).
fn expand(mut base: Vec<String>, text: &str, out: &mut Vec<Vec<String>>) {
    let mut rest = text.trim_start();
    loop {
        if let Some(group) = rest.strip_prefix('{') {
            let end = skip_block(rest, 0) - 1;
            for item in split_top_level(&group[..end - 1]) {
                expand(base.clone(), item, out);
            }
            return;
        }
        let name: String = rest
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        if name.is_empty() {
            break;
        }
        rest = &rest[name.len()..];
        base.push(name);
        match rest.strip_prefix("::") {
            Some(r) => rest = r,
            None => break,
        }
    }
    if !base.is_empty() {
        out.push(base);
    }
}

fn split_top_level(s: &str) -> Vec<&str> {
    let (mut out, mut depth, mut start) = (Vec::new(), 0, 0);
    for (i, c) in s.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out
}

/// The layer module a module path belongs to (`backend/cpu` for `[backend, cpu, ..]`).
fn layer_of(path: &[String]) -> Option<(String, u8)> {
    let name = match path {
        [first, ..] if ROOT_MACROS.contains(&first.as_str()) => "sys".to_string(),
        [b, sub, ..] if b == "backend" && (sub == "cpu" || sub == "cuda") => format!("{b}/{sub}"),
        [first, ..] => first.clone(),
        [] => return None,
    };
    LAYERS
        .iter()
        .find(|(n, _)| *n == name)
        .map(|&(n, l)| (n.to_string(), l))
}

/// The file a path names: the longest prefix of it that is a file of the crate.
fn file_of(path: &[String], files: &BTreeMap<PathBuf, Source>) -> Option<PathBuf> {
    (1..=path.len()).rev().find_map(|n| {
        let base = path[..n].iter().fold(firmware(), |p, s| p.join(s));
        [base.with_extension("rs"), base.join("mod.rs")]
            .into_iter()
            .find(|c| files.contains_key(c))
    })
}

/// Whether `b`'s module contains `a`'s (b is `a`'s ancestor or `a` itself).
fn within(a: &[String], b: &[String]) -> bool {
    a.len() >= b.len() && a[..b.len()] == *b
}

struct Graph {
    /// Per file: the files it names, outside its own module tree.
    files: BTreeMap<PathBuf, BTreeSet<PathBuf>>,
    /// Per layer module: the layer modules it names, with one file that does it.
    modules: BTreeMap<String, BTreeMap<String, PathBuf>>,
    /// "file -> module (layer a -> layer b)" for each import of a higher layer.
    upward: Vec<String>,
}

fn graph() -> Graph {
    let mut files = BTreeMap::new();
    read_sources(&firmware(), &mut files);
    assert!(files.len() > 50, "read {} sources", files.len());
    let mut g = Graph {
        files: BTreeMap::new(),
        modules: BTreeMap::new(),
        upward: Vec::new(),
    };
    for (path, src) in &files {
        // Binaries sit above everything; test files are not product code.
        if src.module.first().is_some_and(|m| m == "bin")
            || path.file_name().is_some_and(|f| f == "tests.rs")
        {
            continue;
        }
        let Some((from, from_layer)) = layer_of(&src.module) else {
            // lib.rs: only declares the modules.
            continue;
        };
        let code = product_code(&src.text);
        let mut named = BTreeSet::new();
        for p in referenced_paths(&code, &src.module) {
            let Some((to, to_layer)) = layer_of(&p) else {
                continue;
            };
            if to != from {
                g.modules
                    .entry(from.clone())
                    .or_default()
                    .entry(to.clone())
                    .or_insert_with(|| path.clone());
                if to_layer > from_layer {
                    g.upward.push(format!(
                        "{} uses {} (layer {from_layer} {from} -> layer {to_layer} {to})",
                        path.strip_prefix(firmware()).unwrap().display(),
                        p.join("::")
                    ));
                }
            }
            if let Some(f) = file_of(&p, &files) {
                let target = &files[&f].module;
                if f != *path && !within(&src.module, target) && !within(target, &src.module) {
                    named.insert(f);
                }
            }
        }
        g.files.insert(path.clone(), named);
    }
    g
}

/// The cycles of a graph (its strongly connected components of more than one node).
fn cycles<T: Ord + Clone>(edges: &BTreeMap<T, BTreeSet<T>>) -> Vec<Vec<T>> {
    // Plain reachability: the graphs are small (a hundred files).
    let reach = |from: &T| {
        let mut seen = BTreeSet::new();
        let mut stack = vec![from.clone()];
        while let Some(n) = stack.pop() {
            for m in edges.get(&n).into_iter().flatten() {
                if seen.insert(m.clone()) {
                    stack.push(m.clone());
                }
            }
        }
        seen
    };
    let reach: BTreeMap<T, BTreeSet<T>> = edges.keys().map(|k| (k.clone(), reach(k))).collect();
    let mut done = BTreeSet::new();
    let mut out = Vec::new();
    for a in edges.keys() {
        if done.contains(a) || !reach[a].contains(a) {
            continue;
        }
        let comp: Vec<T> = reach[a]
            .iter()
            .filter(|b| reach.get(*b).is_some_and(|r| r.contains(a)))
            .cloned()
            .collect();
        done.extend(comp.iter().cloned());
        out.push(comp);
    }
    out
}

#[test]
fn every_top_level_module_has_a_layer() {
    for entry in std::fs::read_dir(firmware()).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_stem().unwrap().to_string_lossy().into_owned();
        if ["lib", "bin"].contains(&name.as_str()) {
            continue;
        }
        if name == "backend" {
            continue;
        }
        assert!(
            LAYERS.iter().any(|(n, _)| *n == name),
            "firmware/{name} has no layer in tests/layers.rs LAYERS (add it, and to docs/ARCHITECTURE.md)"
        );
    }
}

#[test]
fn modules_import_only_their_layer_or_below() {
    let g = graph();
    assert!(
        g.upward.is_empty(),
        "imports from a higher layer:\n  {}",
        g.upward.join("\n  ")
    );
    // The checker sees the imports it must: the engine names the CPU backend, which names quant.
    assert!(g.modules["engine"].contains_key("backend/cpu"));
    assert!(g.modules["backend/cpu"].contains_key("quant"));
}

#[test]
fn no_cycles_between_modules_or_files() {
    let g = graph();
    let module_edges: BTreeMap<String, BTreeSet<String>> = g
        .modules
        .iter()
        .map(|(k, v)| (k.clone(), v.keys().cloned().collect()))
        .collect();
    let module_cycles = cycles(&module_edges);
    assert!(module_cycles.is_empty(), "module cycles: {module_cycles:?}");
    let file_cycles: Vec<Vec<String>> = cycles(&g.files)
        .into_iter()
        .map(|c| {
            c.iter()
                .map(|p| p.strip_prefix(firmware()).unwrap().display().to_string())
                .collect()
        })
        .collect();
    assert!(file_cycles.is_empty(), "file cycles: {file_cycles:?}");
}

#[test]
fn the_checker_finds_what_it_must() {
    let m = |s: &str| s.split('/').map(String::from).collect::<Vec<_>>();
    let code = product_code(
        "use crate::{a::b, c::{d, e}};\nuse super::f::G;\nfn x() { crate::h::i(); }\n#[cfg(test)]\nmod tests { use crate::zz::y; fn s() { let _ = \"}\"; } }\nuse crate::after::z;",
    );
    let paths = referenced_paths(&code, &m("quant/view"));
    let names: Vec<String> = paths.iter().map(|p| p.join("::")).collect();
    assert_eq!(
        names,
        ["a::b", "c::d", "c::e", "h::i", "after::z", "quant::f::G"],
        "{code}"
    );
    assert_eq!(layer_of(&m("backend/cpu/matvec")).unwrap().1, 6);
    assert_eq!(layer_of(&m("log_info")).unwrap().0, "sys");
    let mut e = BTreeMap::new();
    e.insert(1, BTreeSet::from([2]));
    e.insert(2, BTreeSet::from([3]));
    e.insert(3, BTreeSet::from([1]));
    e.insert(4, BTreeSet::from([1]));
    assert_eq!(cycles(&e), vec![vec![1, 2, 3]]);
}

/// The packages a package of Cargo.lock depends on (its `dependencies = [...]` names).
fn locked_dependencies(lock: &str, package: &str) -> Vec<String> {
    let entry = lock
        .split("[[package]]")
        .find(|e| {
            e.lines()
                .any(|l| l.trim() == format!("name = \"{package}\""))
        })
        .unwrap_or_else(|| panic!("{package} not in Cargo.lock"));
    let Some(list) = entry.split("dependencies = [").nth(1) else {
        return Vec::new();
    };
    list.split(']')
        .next()
        .unwrap()
        .split(',')
        .filter_map(|d| d.trim().trim_matches('"').split(' ').next())
        .filter(|d| !d.is_empty())
        .map(String::from)
        .collect()
}

#[test]
fn the_daemon_crate_links_no_tool() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let lock = std::fs::read_to_string(root.join("Cargo.lock")).expect("read Cargo.lock");
    let daemon = locked_dependencies(&lock, "leanstream");
    let tools = locked_dependencies(&lock, "leanstream-tools");
    // The checker reads the lock file right: the tools depend on the library and on plotters.
    assert!(tools.iter().any(|d| d == "leanstream"), "{tools:?}");
    assert!(tools.iter().any(|d| d == "plotters"), "{tools:?}");
    for tool in ["plotters", "indicatif", "leanstream-tools"] {
        assert!(
            !daemon.iter().any(|d| d == tool),
            "the daemon's crate depends on {tool}: {daemon:?}"
        );
    }
    let mut files = BTreeMap::new();
    read_sources(&firmware(), &mut files);
    for (path, src) in &files {
        assert!(
            !src.text.contains("leanstream_tools"),
            "{} names the tools crate",
            path.display()
        );
    }
}
