//! Shared helpers for integration tests that need files outside the repository.
#![allow(dead_code)]

use std::path::PathBuf;

/// Path of a real model file from `$LEANSTREAM_MODELS` or `~/.cache/leanstream/models`,
/// or None (after printing a visible skip line) when it is absent.
pub fn model(name: &str) -> Option<PathBuf> {
    let dirs = [
        std::env::var_os("LEANSTREAM_MODELS").map(PathBuf::from),
        std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/leanstream/models")),
    ];
    for d in dirs.into_iter().flatten() {
        let p = d.join(name);
        if p.is_file() {
            return Some(p);
        }
    }
    eprintln!("skipped: {name} not found (run scripts/fetch-model.sh)");
    None
}

/// Path under `../shared` (relative to the repository root), or None after printing a skip line.
pub fn shared(rel: &str) -> Option<PathBuf> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared");
    if !root.is_dir() {
        eprintln!("skipped: ../shared not found");
        return None;
    }
    let p = root.join(rel);
    if !p.is_file() {
        eprintln!("skipped: ../shared/{rel} not found");
        return None;
    }
    Some(p)
}
