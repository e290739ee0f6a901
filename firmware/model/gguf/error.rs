//! What can be wrong with a model file, GGUF or llama2.c, and how it reads to a person.

use std::fmt;
use std::path::PathBuf;

/// Everything that can be wrong with a model file (GGUF or llama2.c).
#[derive(Debug)]
pub enum FormatError {
    /// Opening or mapping the file failed.
    Io { path: PathBuf, err: std::io::Error },
    /// The file ends before `what` (which starts at `offset`) is complete.
    Truncated {
        offset: usize,
        what: String,
        need: usize,
        have: usize,
    },
    /// The first four bytes are not "GGUF".
    BadMagic { found: [u8; 4] },
    /// A GGUF version other than 2 or 3.
    UnsupportedVersion { version: u32, note: &'static str },
    /// A malformed header or metadata field at `offset`.
    Invalid { offset: usize, msg: String },
    /// A tensor whose description is wrong.
    Tensor { name: String, msg: String },
    /// A metadata key that is missing or has the wrong type.
    Key { key: String, msg: String },
    /// A tensor the model needs is absent.
    MissingTensor { name: String },
    /// A tensor has the wrong shape (cols = ne0, rows = ne1).
    Shape {
        name: String,
        expected: (usize, usize),
        found: (usize, usize),
    },
    /// `general.architecture` names an architecture this engine does not run.
    UnknownArch { arch: String },
    /// A model-level inconsistency (hyperparameters, llama2.c header, file size).
    Model { msg: String },
}

impl fmt::Display for FormatError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            // Callers name the file (`path: error`), as for every other variant.
            FormatError::Io { err, .. } => write!(f, "{err}"),
            FormatError::Truncated {
                offset,
                what,
                need,
                have,
            } => write!(
                f,
                "truncated file: {what} at offset {offset} needs {need} bytes, only {have} remain"
            ),
            FormatError::BadMagic { found } => {
                write!(
                    f,
                    "not a GGUF file: magic is {:?}, expected \"GGUF\"",
                    found.escape_ascii().to_string()
                )
            }
            FormatError::UnsupportedVersion { version, note } => {
                write!(
                    f,
                    "unsupported GGUF version {version} (only 2 and 3 are read){note}"
                )
            }
            FormatError::Invalid { offset, msg } => {
                write!(f, "invalid GGUF at offset {offset}: {msg}")
            }
            FormatError::Tensor { name, msg } => write!(f, "tensor '{name}': {msg}"),
            FormatError::Key { key, msg } => write!(f, "metadata key '{key}': {msg}"),
            FormatError::MissingTensor { name } => write!(f, "missing tensor '{name}'"),
            FormatError::Shape {
                name,
                expected,
                found,
            } => write!(
                f,
                "tensor '{name}' has shape (cols {}, rows {}), expected (cols {}, rows {})",
                found.0, found.1, expected.0, expected.1
            ),
            FormatError::UnknownArch { arch } => {
                write!(
                    f,
                    "unsupported architecture '{arch}' (supported: llama, qwen2)"
                )
            }
            FormatError::Model { msg } => f.write_str(msg),
        }
    }
}

impl std::error::Error for FormatError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            FormatError::Io { err, .. } => Some(err),
            _ => None,
        }
    }
}
