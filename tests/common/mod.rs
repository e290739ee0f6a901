//! Shared by the integration tests: where the shared data and the fetched models are. A test
//! whose data is absent prints a visible `skipped:` line and returns.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

pub const SMOLLM2: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
pub const QWEN05: &str = "qwen2.5-coder-0.5b-instruct.gguf";

/// The models folder: $LEANSTREAM_MODELS, else ~/.cache/leanstream/models.
pub fn models_dir() -> PathBuf {
    match std::env::var_os("LEANSTREAM_MODELS") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(std::env::var_os("HOME").unwrap_or_default())
            .join(".cache/leanstream/models"),
    }
}

/// A fetched model, or None after a `skipped:` line saying how to fetch it.
pub fn model(name: &str) -> Option<PathBuf> {
    let p = models_dir().join(name);
    if p.is_file() {
        return Some(p);
    }
    let how = if name == SMOLLM2 {
        "scripts/fetch-model.sh"
    } else {
        "../shared/scripts/fetch-models.sh qwen2.5-0.5b"
    };
    eprintln!("skipped: model {} not found (run {how})", p.display());
    None
}

/// The repository's root (the workspace's, which holds Cargo.lock), for the root crate's tests
/// and for the tools' (tools/tests include this file).
pub fn repo_root() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest
        .ancestors()
        .find(|d| d.join("Cargo.lock").is_file())
        .unwrap_or(manifest)
        .to_path_buf()
}

/// A file under `../shared` (beside the repository), or None after a `skipped:` line.
pub fn shared(rel: &str) -> Option<PathBuf> {
    let root = repo_root().join("../shared");
    if !root.is_dir() {
        eprintln!("skipped: ../shared not found (needed for {rel})");
        return None;
    }
    let p = root.join(rel);
    if !p.is_file() {
        eprintln!("skipped: ../shared/{rel} not found");
        return None;
    }
    Some(p)
}

/// The stories260K checkpoint and its tokenizer from `../shared` (each test's skip line printed
/// by [`shared`] when absent).
pub fn stories260k() -> Option<(PathBuf, PathBuf)> {
    Some((
        shared("data/stories260K/stories260K.bin")?,
        shared("data/stories260K/tok512.bin")?,
    ))
}
