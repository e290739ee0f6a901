//! Reads `board-configs/$LEANSTREAM_BOARD.toml` (default `host`), validates it and emits the
//! board's consts into `$OUT_DIR/board.rs`. An invalid board fails the build, naming the field.

#[path = "firmware/board/config.rs"]
mod config;

use std::{env, fs, path::PathBuf, process};

fn main() {
    let board = env::var("LEANSTREAM_BOARD").unwrap_or_else(|_| "host".to_string());
    println!("cargo:rerun-if-env-changed=LEANSTREAM_BOARD");
    println!("cargo:rerun-if-changed=board-configs");
    println!("cargo:rerun-if-changed=firmware/board/config.rs");
    let path = PathBuf::from("board-configs").join(format!("{board}.toml"));
    let text = match fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) => fail(&format!(
            "cannot read {}: {e} (LEANSTREAM_BOARD={board})",
            path.display()
        )),
    };
    let valid = match config::parse_board(&text) {
        Ok(v) => v,
        Err(e) => fail(&format!("invalid board config {}: {e}", path.display())),
    };
    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR")).join("board.rs");
    if let Err(e) = fs::write(&out, config::emit_consts(&valid)) {
        fail(&format!("cannot write {}: {e}", out.display()));
    }
}

fn fail(message: &str) -> ! {
    eprintln!("error: {message}");
    process::exit(1);
}
