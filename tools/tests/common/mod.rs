//! The tools' integration tests share the root crate's helpers (tests/common), plus where the
//! daemon binary is: it belongs to the root crate, so Cargo gives these tests no
//! `CARGO_BIN_EXE_leanstreamd`.
#![allow(dead_code, unused_imports)]

#[path = "../../../tests/common/mod.rs"]
mod root;
pub use root::*;

pub mod daemon;
pub mod smol_image;
pub mod tables;

use std::path::{Path, PathBuf};

/// `leanstreamd`, built beside this crate's `leanstream`: the workspace's `cargo test` builds
/// both crates' binaries before it runs any test.
pub fn leanstreamd() -> PathBuf {
    let p = Path::new(env!("CARGO_BIN_EXE_leanstream")).with_file_name("leanstreamd");
    assert!(
        p.is_file(),
        "{} is not built: run `cargo test` at the repository root (it builds both crates)",
        p.display()
    );
    p
}

/// Runs the `leanstream` CLI built beside these tests, from the repository root.
pub fn leanstream(args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_leanstream"))
        .args(args)
        .current_dir(repo_root())
        .output()
        .unwrap()
}
