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
    embed_ptx();
}

/// Embeds every committed `kernels-ptx/NAME.compute_XX.ptx` as `(NAME, XX, text)` in
/// `$OUT_DIR/ptx.rs`; a `.cu` without each of its `.ptx` files fails the build.
fn embed_ptx() {
    println!("cargo:rerun-if-changed=kernels-ptx");
    let mut sources: Vec<String> = fs::read_dir("kernels-ptx")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.ends_with(".cu"))
                .collect()
        })
        .unwrap_or_default();
    sources.sort();
    let dir = env::current_dir().expect("build dir").join("kernels-ptx");
    let mut code =
        String::from("/// (module, compute capability, PTX text) for every kernel file.\n");
    code.push_str("pub const PTX: &[(&str, u32, &str)] = &[\n");
    for cu in &sources {
        let name = cu.trim_end_matches(".cu");
        for arch in [72, 87, 90] {
            let ptx = dir.join(format!("{name}.compute_{arch}.ptx"));
            if !ptx.exists() {
                fail(&format!(
                    "{} is missing: run python3 scripts/build-ptx.py",
                    ptx.display()
                ));
            }
            code.push_str(&format!(
                "    ({name:?}, {arch}, include_str!({:?})),\n",
                ptx.display().to_string()
            ));
        }
    }
    code.push_str("];\n");
    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR")).join("ptx.rs");
    if let Err(e) = fs::write(&out, code) {
        fail(&format!("cannot write {}: {e}", out.display()));
    }
}

fn fail(message: &str) -> ! {
    eprintln!("error: {message}");
    process::exit(1);
}
