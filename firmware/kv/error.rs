//! Why a KV layout policy could not be set up.

use super::CostModel;
use crate::tables::TableError;
use std::fmt;
use std::path::PathBuf;

#[derive(Debug)]
pub enum KvError {
    /// `--kv-layout` names no layout.
    UnknownLayout(String),
    /// The `kvcost` table could not be read, or is not this model's.
    Table { path: PathBuf, source: TableError },
    /// Cost-model constants no calibration gives (`path`: the table they came from).
    InvalidConstants {
        path: Option<PathBuf>,
        constants: CostModel,
    },
}

impl fmt::Display for KvError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KvError::UnknownLayout(s) => write!(
                f,
                "unknown KV layout '{s}' (expected adaptive, token-major or head-tiles)"
            ),
            KvError::Table { path, source } => write!(f, "{}: {source}", path.display()),
            KvError::InvalidConstants { path, constants } => {
                if let Some(p) = path {
                    write!(f, "{}: ", p.display())?;
                }
                write!(f, "kvcost table holds invalid constants: {constants:?}")
            }
        }
    }
}

impl std::error::Error for KvError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            KvError::Table { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// The CLI's commands report errors as their message: `?` takes this one there.
impl From<KvError> for String {
    fn from(e: KvError) -> String {
        e.to_string()
    }
}
