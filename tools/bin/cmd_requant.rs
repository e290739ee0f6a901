//! `leanstream requant`: a GGUF requantized offline into a precision's GGML types
//! (`leanstream_tools::offline::requant`).

use super::*;

#[derive(Args)]
pub struct RequantArgs {
    /// The GGUF to requantize.
    model: PathBuf,
    /// f16, w8a8 or w4a8 (the targets of `--precision` at boot).
    #[arg(long)]
    precision: String,
    /// Where to write it (default: <model stem>.<precision>.gguf beside the model).
    #[arg(long)]
    out: Option<PathBuf>,
}

pub fn cmd_requant(a: RequantArgs) -> Result<(), String> {
    let precision = Precision::parse(&a.precision)?;
    let out = a.out.unwrap_or_else(|| {
        let stem = a.model.file_stem().unwrap_or_default().to_string_lossy();
        a.model.with_file_name(format!("{stem}.{precision}.gguf"))
    });
    let report = leanstream_tools::offline::requant::requant(&a.model, precision, &out)?;
    eprintln!(
        "requant: {} -> {} at {precision}:\n{report}",
        a.model.display(),
        out.display()
    );
    println!("{}", out.display());
    Ok(())
}
