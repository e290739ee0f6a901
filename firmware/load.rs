//! Opening a model file and the tokenizer that goes with it, for the CLI and the daemon.

use crate::model::ModelFile;
use crate::tokenizer::{Tokenizer, TokenizerError};
use std::path::{Path, PathBuf};

/// Opens `model` and its tokenizer: GGUF files carry their own; a llama2.c checkpoint takes
/// `tokenizer`, or else `tok{vocab}.bin` or `tokenizer.bin` beside it.
pub fn open_model(
    model: &Path,
    tokenizer: Option<&Path>,
) -> Result<(ModelFile, Tokenizer), String> {
    let file = ModelFile::open(model).map_err(|e| format!("{}: {e}", model.display()))?;
    let tok = match (&file, tokenizer) {
        (ModelFile::Gguf(g), None) => {
            Tokenizer::from_gguf(g).map_err(|e| format!("{}: tokenizer: {e}", model.display()))?
        }
        (ModelFile::Gguf(_), Some(p)) => {
            let g =
                crate::model::gguf::Gguf::open(p).map_err(|e| format!("{}: {e}", p.display()))?;
            Tokenizer::from_gguf(&g).map_err(|e| format!("{}: tokenizer: {e}", p.display()))?
        }
        (ModelFile::Llama2c(_), given) => {
            let vocab = file
                .hyper()
                .map_err(|e| format!("{}: {e}", model.display()))?
                .vocab_size;
            let path = match given {
                Some(p) => p.to_path_buf(),
                None => llama2c_tokenizer_beside(model, vocab).ok_or_else(|| {
                    format!(
                        "{} is a llama2.c checkpoint: give its tokenizer with --tokenizer (no tok{vocab}.bin or tokenizer.bin beside it)",
                        model.display()
                    )
                })?,
            };
            Tokenizer::from_llama2c(&path, vocab).map_err(|e| match e {
                // These name the file already.
                TokenizerError::Io { .. } | TokenizerError::Llama2cTruncated { .. } => {
                    e.to_string()
                }
                _ => format!("{}: {e}", path.display()),
            })?
        }
    };
    Ok((file, tok))
}

fn llama2c_tokenizer_beside(model: &Path, vocab: usize) -> Option<PathBuf> {
    let dir = model.parent()?;
    [format!("tok{vocab}.bin"), "tokenizer.bin".to_string()]
        .into_iter()
        .map(|n| dir.join(n))
        .find(|p| p.is_file())
}
