//! Tables made offline (calibrated thresholds, KV cost-model constants, later predictors) and
//! loaded at boot. Every table file is one postcard-encoded payload behind a fixed header that
//! says what it is, which format version, which model it was made for, and a checksum of the
//! payload: a table for another model, another version, or a damaged file is a clear refusal.
//!
//! Layout (little-endian): magic `LSTB` | kind: 8 bytes, NUL-padded | version: u32 |
//! model identity: u64 | payload length: u64 | payload checksum (FNV-1a 64): u64 | payload.

use crate::model::ModelFile;
use serde::{de::DeserializeOwned, Serialize};
use std::fmt;
use std::path::{Path, PathBuf};

const MAGIC: &[u8; 4] = b"LSTB";
const HEADER_BYTES: usize = 4 + 8 + 4 + 8 + 8 + 8;

/// Why a table could not be loaded.
#[derive(Debug)]
pub enum TableError {
    /// The file could not be read or written.
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    NotATable,
    WrongKind {
        expected: String,
        found: String,
    },
    WrongVersion {
        expected: u32,
        found: u32,
    },
    OtherModel {
        expected: u64,
        found: u64,
    },
    Damaged(String),
}

impl fmt::Display for TableError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TableError::Io { path, source } => write!(f, "table: {}: {source}", path.display()),
            TableError::NotATable => write!(f, "not a LeanStream table file (bad magic)"),
            TableError::WrongKind { expected, found } => {
                write!(f, "table holds '{found}', expected '{expected}'")
            }
            TableError::WrongVersion { expected, found } => write!(
                f,
                "table format version {found}, this build reads version {expected}: rebuild the table"
            ),
            TableError::OtherModel { expected, found } => write!(
                f,
                "table was made for another model (identity {found:016x}, this model is {expected:016x})"
            ),
            TableError::Damaged(m) => write!(f, "table is damaged: {m}"),
        }
    }
}

impl std::error::Error for TableError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            TableError::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

pub use crate::model::checksum::{fnv64, Fnv64};

/// A model's identity for tables: its hyperparameters and, for every tensor the engine uses,
/// the name, type, shape and a sample of the bytes (first, middle and last 256). Two files of
/// the same model in different quantizations differ.
pub fn model_identity(model: &ModelFile) -> u64 {
    let mut h = Fnv64::default();
    let Ok(hy) = model.hyper() else {
        return 0;
    };
    h.write(format!("{hy:?}").as_bytes());
    for (name, _, _) in ModelFile::expected_tensors(&hy) {
        let Ok(t) = model.tensor(&name) else {
            continue;
        };
        h.write(name.as_bytes());
        h.write(t.ty.name().as_bytes());
        h.write(&(t.rows as u64).to_le_bytes());
        h.write(&(t.cols as u64).to_le_bytes());
        let n = t.data.len();
        let s = 256.min(n);
        h.write(&t.data[..s]);
        h.write(&t.data[n / 2 - s / 2..][..s]);
        h.write(&t.data[n - s..]);
    }
    h.finish()
}

fn kind_bytes(kind: &str) -> [u8; 8] {
    assert!(kind.len() <= 8, "table kind '{kind}' longer than 8 bytes");
    let mut k = [0u8; 8];
    k[..kind.len()].copy_from_slice(kind.as_bytes());
    k
}

/// Encodes `payload` behind the header.
pub fn encode<T: Serialize>(kind: &str, version: u32, model_id: u64, payload: &T) -> Vec<u8> {
    let body = postcard::to_allocvec(payload).expect("postcard encodes every table type");
    let mut out = Vec::with_capacity(HEADER_BYTES + body.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&kind_bytes(kind));
    out.extend_from_slice(&version.to_le_bytes());
    out.extend_from_slice(&model_id.to_le_bytes());
    out.extend_from_slice(&(body.len() as u64).to_le_bytes());
    out.extend_from_slice(&fnv64(&body).to_le_bytes());
    out.extend_from_slice(&body);
    out
}

/// Checks the header against what the caller expects and decodes the payload.
pub fn decode<T: DeserializeOwned>(
    bytes: &[u8],
    kind: &str,
    version: u32,
    model_id: u64,
) -> Result<T, TableError> {
    if bytes.len() < HEADER_BYTES || &bytes[..4] != MAGIC {
        return Err(if bytes.len() >= 4 && &bytes[..4] == MAGIC {
            TableError::Damaged(format!("{} bytes, shorter than the header", bytes.len()))
        } else {
            TableError::NotATable
        });
    }
    let u32_at = |o: usize| u32::from_le_bytes(bytes[o..o + 4].try_into().unwrap());
    let u64_at = |o: usize| u64::from_le_bytes(bytes[o..o + 8].try_into().unwrap());
    let found_kind = &bytes[4..12];
    if found_kind != kind_bytes(kind) {
        let end = found_kind.iter().position(|&b| b == 0).unwrap_or(8);
        return Err(TableError::WrongKind {
            expected: kind.into(),
            found: String::from_utf8_lossy(&found_kind[..end]).into_owned(),
        });
    }
    let found_version = u32_at(12);
    if found_version != version {
        return Err(TableError::WrongVersion {
            expected: version,
            found: found_version,
        });
    }
    let found_model = u64_at(16);
    if found_model != model_id {
        return Err(TableError::OtherModel {
            expected: model_id,
            found: found_model,
        });
    }
    let len = u64_at(24);
    let body = &bytes[HEADER_BYTES..];
    if body.len() as u64 != len {
        return Err(TableError::Damaged(format!(
            "payload is {} bytes, header says {len}",
            body.len()
        )));
    }
    if fnv64(body) != u64_at(32) {
        return Err(TableError::Damaged("checksum mismatch".into()));
    }
    postcard::from_bytes(body).map_err(|e| TableError::Damaged(format!("payload: {e}")))
}

pub fn write<T: Serialize>(
    path: &Path,
    kind: &str,
    version: u32,
    model_id: u64,
    payload: &T,
) -> Result<(), TableError> {
    std::fs::write(path, encode(kind, version, model_id, payload)).map_err(|source| {
        TableError::Io {
            path: path.to_path_buf(),
            source,
        }
    })
}

pub fn read<T: DeserializeOwned>(
    path: &Path,
    kind: &str,
    version: u32,
    model_id: u64,
) -> Result<T, TableError> {
    decode(&read_bytes(path)?, kind, version, model_id)
}

/// A table file's bytes, undecoded.
pub fn read_bytes(path: &Path) -> Result<Vec<u8>, TableError> {
    std::fs::read(path).map_err(|source| TableError::Io {
        path: path.to_path_buf(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Serialize, serde::Deserialize, PartialEq, Debug)]
    struct T {
        a: Vec<f32>,
        b: u8,
    }

    fn sample() -> Vec<u8> {
        encode(
            "thresh",
            3,
            42,
            &T {
                a: vec![1.0, 2.5],
                b: 7,
            },
        )
    }

    #[test]
    fn round_trips() {
        let t: T = decode(&sample(), "thresh", 3, 42).unwrap();
        assert_eq!(
            t,
            T {
                a: vec![1.0, 2.5],
                b: 7
            }
        );
    }

    #[test]
    fn refuses_mixups_and_damage() {
        let s = sample();
        let e = |r: Result<T, TableError>| r.unwrap_err().to_string();
        assert!(e(decode(&s, "kvcost", 3, 42)).contains("holds 'thresh'"));
        assert!(e(decode(&s, "thresh", 4, 42)).contains("version 3"));
        assert!(e(decode(&s, "thresh", 3, 43)).contains("another model"));
        assert!(e(decode(b"GGUF....", "thresh", 3, 42)).contains("not a LeanStream table"));
        for cut in [5, HEADER_BYTES, s.len() - 1] {
            assert!(e(decode(&s[..cut], "thresh", 3, 42)).contains("damaged"));
        }
        let mut flipped = s.clone();
        *flipped.last_mut().unwrap() ^= 1;
        assert!(e(decode(&flipped, "thresh", 3, 42)).contains("checksum"));
    }
}
