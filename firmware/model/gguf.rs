//! GGUF (v2/v3, little-endian) reader over a memory map.
//!
//! Layout (all little-endian):
//! ```text
//! magic "GGUF" | version u32 | tensor_count u64 | kv_count u64
//! kv_count x { key: string, type: u32, value }
//! tensor_count x { name: string, n_dims: u32, dims: u64 x n_dims, type: u32, offset: u64 }
//! padding to `general.alignment` (default 32)
//! tensor data (each tensor's offset is relative to the start of this section)
//! ```
//! where `string` is `u64 length + bytes` (UTF-8). Every count and length is checked against
//! the bytes that remain before anything is allocated, and every tensor is checked to lie
//! inside the file, so [`Gguf::tensor_data`] never panics. No input makes the parser panic.

mod error;
mod parse;
mod reader;
mod value;

/// Builds GGUF images in memory (tests, fuzz seeds).
#[doc(hidden)]
pub mod build;

#[cfg(test)]
mod tests;

pub use error::FormatError;
pub use value::{Array, Value};

use super::ggml::GgmlType;
use parse::parse;
use std::collections::HashMap;
use std::fmt;
use std::path::Path;

/// Default `general.alignment`.
pub const DEFAULT_ALIGNMENT: usize = 32;

// GGUF metadata value type ids. They live here, not in `value`, because `build` writes them
// too and `value` uses `build::str_bytes`: in either child the two would depend on each other.
const T_U8: u32 = 0;
const T_I8: u32 = 1;
const T_U16: u32 = 2;
const T_I16: u32 = 3;
const T_U32: u32 = 4;
const T_I32: u32 = 5;
const T_F32: u32 = 6;
const T_BOOL: u32 = 7;
const T_STR: u32 = 8;
const T_ARRAY: u32 = 9;
const T_U64: u32 = 10;
const T_I64: u32 = 11;
const T_F64: u32 = 12;

/// Smallest encoding of one value of type `ty` (strings: the length; arrays: type + count).
fn min_size(ty: u32) -> Option<usize> {
    Some(match ty {
        T_U8 | T_I8 | T_BOOL => 1,
        T_U16 | T_I16 => 2,
        T_U32 | T_I32 | T_F32 => 4,
        T_U64 | T_I64 | T_F64 | T_STR => 8,
        T_ARRAY => 12,
        _ => return None,
    })
}

/// One tensor's description, validated against the file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    pub name: String,
    /// ggml order: `dims[0]` is the row length (ne0), `dims[1]` the number of rows (ne1), ...
    pub dims: Vec<usize>,
    pub ty: GgmlType,
    /// Absolute byte offset of the data in the file.
    pub offset: usize,
    /// Size of the data in bytes.
    pub n_bytes: usize,
}

impl TensorInfo {
    /// Number of values.
    pub fn n_elems(&self) -> usize {
        self.dims.iter().product()
    }
}

enum Backing {
    Mmap(memmap2::Mmap),
    Owned(Vec<u8>),
}

/// A parsed GGUF file. Owns its bytes (a memory map or a vector).
pub struct Gguf {
    backing: Backing,
    pub version: u32,
    pub alignment: usize,
    /// Absolute offset of the tensor data section.
    pub data_offset: usize,
    pub tensors: Vec<TensorInfo>,
    metadata: Vec<(String, Value)>,
    kv_index: HashMap<String, usize>,
    tensor_index: HashMap<String, usize>,
}

impl fmt::Debug for Gguf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Gguf")
            .field("version", &self.version)
            .field("alignment", &self.alignment)
            .field("n_bytes", &self.bytes().len())
            .field("n_kv", &self.metadata.len())
            .field("n_tensors", &self.tensors.len())
            .finish()
    }
}

impl Gguf {
    /// Memory-maps `path` and parses it.
    pub fn open(path: &Path) -> Result<Gguf, FormatError> {
        let io = |err| FormatError::Io {
            path: path.to_path_buf(),
            err,
        };
        let file = std::fs::File::open(path).map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        if len == 0 {
            return Err(FormatError::Truncated {
                offset: 0,
                what: "GGUF header".into(),
                need: 24,
                have: 0,
            });
        }
        // SAFETY: the map is read-only; the engine's contract is that model files are not
        // modified while they are open (as with every mmap-based GGUF reader).
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
        let parsed = parse(&map)?;
        Ok(parsed.into_gguf(Backing::Mmap(map)))
    }

    /// Memory-maps the `len` bytes of `path` from `offset` and parses them as a GGUF file: one
    /// held inside another file (a flash image's dense part, `super::flash`). Tensor offsets
    /// are relative to the GGUF's own start, so nothing moves.
    pub fn open_range(path: &Path, offset: u64, len: usize) -> Result<Gguf, FormatError> {
        let io = |err| FormatError::Io {
            path: path.to_path_buf(),
            err,
        };
        let file = std::fs::File::open(path).map_err(io)?;
        let file_len = file.metadata().map_err(io)?.len();
        if len == 0 || offset.saturating_add(len as u64) > file_len {
            return Err(FormatError::Truncated {
                offset: offset as usize,
                what: "GGUF inside the file".into(),
                need: len,
                have: file_len.saturating_sub(offset) as usize,
            });
        }
        // SAFETY: as in `open`: read-only, and the file is not modified while it is open.
        let map = unsafe {
            memmap2::MmapOptions::new()
                .offset(offset)
                .len(len)
                .map(&file)
        }
        .map_err(io)?;
        let parsed = parse(&map)?;
        Ok(parsed.into_gguf(Backing::Mmap(map)))
    }

    /// Parses a GGUF image held in memory (tests, fuzzing).
    pub fn from_bytes(bytes: Vec<u8>) -> Result<Gguf, FormatError> {
        let parsed = parse(&bytes)?;
        Ok(parsed.into_gguf(Backing::Owned(bytes)))
    }

    /// The whole file.
    pub fn bytes(&self) -> &[u8] {
        match &self.backing {
            Backing::Mmap(m) => m,
            Backing::Owned(v) => v,
        }
    }

    /// All metadata, in file order.
    pub fn metadata(&self) -> &[(String, Value)] {
        &self.metadata
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.kv_index.get(key).map(|&i| &self.metadata[i].1)
    }

    /// Any integer value that fits in a u32.
    pub fn get_u32(&self, key: &str) -> Option<u32> {
        match *self.get(key)? {
            Value::U8(v) => Some(v.into()),
            Value::U16(v) => Some(v.into()),
            Value::U32(v) => Some(v),
            Value::U64(v) => u32::try_from(v).ok(),
            Value::I8(v) => u32::try_from(v).ok(),
            Value::I16(v) => u32::try_from(v).ok(),
            Value::I32(v) => u32::try_from(v).ok(),
            Value::I64(v) => u32::try_from(v).ok(),
            _ => None,
        }
    }

    /// An F32 or F64 value (F64 rounded to f32).
    pub fn get_f32(&self, key: &str) -> Option<f32> {
        match *self.get(key)? {
            Value::F32(v) => Some(v),
            Value::F64(v) => Some(v as f32),
            _ => None,
        }
    }

    pub fn get_bool(&self, key: &str) -> Option<bool> {
        match *self.get(key)? {
            Value::Bool(b) => Some(b),
            _ => None,
        }
    }

    pub fn get_str(&self, key: &str) -> Option<&str> {
        match self.get(key)? {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }

    pub fn get_array(&self, key: &str) -> Option<&Array> {
        match self.get(key)? {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }

    pub fn get_str_array(&self, key: &str) -> Option<&[String]> {
        match self.get_array(key)? {
            Array::Str(v) => Some(v),
            _ => None,
        }
    }

    pub fn get_f32_array(&self, key: &str) -> Option<&[f32]> {
        match self.get_array(key)? {
            Array::F32(v) => Some(v),
            _ => None,
        }
    }

    pub fn get_i32_array(&self, key: &str) -> Option<&[i32]> {
        match self.get_array(key)? {
            Array::I32(v) => Some(v),
            _ => None,
        }
    }

    /// `general.architecture`.
    pub fn architecture(&self) -> Option<&str> {
        self.get_str("general.architecture")
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }

    /// The tensor's bytes. Tensors of this file were checked at parse time; a `TensorInfo`
    /// that does not belong to this file and points outside it yields an empty slice.
    pub fn tensor_data(&self, t: &TensorInfo) -> &[u8] {
        let bytes = self.bytes();
        match t.offset.checked_add(t.n_bytes) {
            Some(end) => bytes.get(t.offset..end).unwrap_or(&[]),
            None => &[],
        }
    }
}
