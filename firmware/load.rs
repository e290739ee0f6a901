//! Opening a model file and the tokenizer that goes with it, for the CLI and the daemon.

use crate::model::{FormatError, ModelFile};
use crate::tokenizer::{Tokenizer, TokenizerError};
use std::fmt;
use std::path::{Path, PathBuf};

/// Why a model or its tokenizer could not be opened; each names the file.
#[derive(Debug)]
pub enum LoadError {
    /// The model file (or a GGUF file given for its tokenizer) at `path` does not read.
    Model { path: PathBuf, source: FormatError },
    /// The tokenizer a GGUF file at `path` carries cannot be built.
    GgufTokenizer {
        path: PathBuf,
        source: TokenizerError,
    },
    /// The llama2.c tokenizer file at `path` cannot be read or built.
    Llama2cTokenizer {
        path: PathBuf,
        source: TokenizerError,
    },
    /// A llama2.c checkpoint with no tokenizer given and none beside it.
    NoTokenizer { model: PathBuf, vocab: usize },
    /// A flash image that cannot be opened (it names the file).
    Image(crate::model::flash::FlashError),
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LoadError::Model { path, source } => write!(f, "{}: {source}", path.display()),
            LoadError::Image(e) => write!(f, "{e}"),
            LoadError::GgufTokenizer { path, source } => {
                write!(f, "{}: tokenizer: {source}", path.display())
            }
            // These name the file already.
            LoadError::Llama2cTokenizer {
                source:
                    source @ (TokenizerError::Io { .. } | TokenizerError::Llama2cTruncated { .. }),
                ..
            } => write!(f, "{source}"),
            LoadError::Llama2cTokenizer { path, source } => {
                write!(f, "{}: {source}", path.display())
            }
            LoadError::NoTokenizer { model, vocab } => write!(
                f,
                "{} is a llama2.c checkpoint: give its tokenizer with --tokenizer (no tok{vocab}.bin or tokenizer.bin beside it)",
                model.display()
            ),
        }
    }
}

impl std::error::Error for LoadError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            LoadError::Model { source, .. } => Some(source),
            LoadError::GgufTokenizer { source, .. }
            | LoadError::Llama2cTokenizer { source, .. } => Some(source),
            LoadError::NoTokenizer { .. } => None,
            LoadError::Image(e) => Some(e),
        }
    }
}

/// The CLI's commands report errors as their message: `?` takes this one there.
impl From<LoadError> for String {
    fn from(e: LoadError) -> String {
        e.to_string()
    }
}

/// Opens `model` and its tokenizer: GGUF files carry their own; a llama2.c checkpoint takes
/// `tokenizer`, or else `tok{vocab}.bin` or `tokenizer.bin` beside it.
pub fn open_model(
    model: &Path,
    tokenizer: Option<&Path>,
) -> Result<(ModelFile, Tokenizer), LoadError> {
    let model_error = |path: &Path, source| LoadError::Model {
        path: path.into(),
        source,
    };
    let tokenizer_error = |path: &Path, source| LoadError::GgufTokenizer {
        path: path.into(),
        source,
    };
    let file = if crate::model::flash::is_flash_image(model) {
        // A flash image: its dense part is the model the engine boots (the FFN streams).
        crate::model::flash::FlashImage::open(model)
            .and_then(|i| i.dense_model())
            .map_err(LoadError::Image)?
    } else {
        ModelFile::open(model).map_err(|e| model_error(model, e))?
    };
    let tok = match (&file, tokenizer) {
        (ModelFile::Gguf(g), None) => {
            Tokenizer::from_gguf(g).map_err(|e| tokenizer_error(model, e))?
        }
        (ModelFile::Gguf(_), Some(p)) => {
            let g = crate::model::gguf::Gguf::open(p).map_err(|e| model_error(p, e))?;
            Tokenizer::from_gguf(&g).map_err(|e| tokenizer_error(p, e))?
        }
        (ModelFile::Llama2c(_), given) => {
            let vocab = file.hyper().map_err(|e| model_error(model, e))?.vocab_size;
            let path = match given {
                Some(p) => p.to_path_buf(),
                None => llama2c_tokenizer_beside(model, vocab).ok_or_else(|| {
                    LoadError::NoTokenizer {
                        model: model.to_path_buf(),
                        vocab,
                    }
                })?,
            };
            Tokenizer::from_llama2c(&path, vocab)
                .map_err(|source| LoadError::Llama2cTokenizer { path, source })?
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::tests::tiny;

    /// A model that reads but carries no tokenizer is the tokenizer's failure, and a file that
    /// is not there the model's; each keeps what went wrong as its source.
    #[test]
    fn model_and_tokenizer_failures_are_told_apart() {
        let dir = std::env::temp_dir().join(format!("leanstream-load-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("no-tokenizer.gguf");
        std::fs::write(&path, tiny("llama", false, true).build()).unwrap();
        let e = open_model(&path, None).unwrap_err();
        assert!(
            matches!(&e, LoadError::GgufTokenizer { path: p, source: TokenizerError::MissingKey(_) } if p == &path),
            "{e}"
        );
        assert!(
            e.to_string()
                .starts_with(&format!("{}: tokenizer: ", path.display())),
            "{e}"
        );

        let absent = dir.join("absent.gguf");
        let e = open_model(&absent, None).unwrap_err();
        assert!(
            matches!(
                &e,
                LoadError::Model {
                    source: FormatError::Io { .. },
                    ..
                }
            ),
            "{e}"
        );
        assert!(std::error::Error::source(&e).is_some());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
