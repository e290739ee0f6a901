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

use super::ggml::GgmlType;
use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};

/// Default `general.alignment`.
pub const DEFAULT_ALIGNMENT: usize = 32;
/// Nested metadata arrays deeper than this are rejected (bounds recursion on hostile input).
const MAX_ARRAY_DEPTH: usize = 8;

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

/// One metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    Str(String),
    Array(Array),
}

/// A metadata array (homogeneous).
#[derive(Clone, Debug, PartialEq)]
pub enum Array {
    U8(Vec<u8>),
    I8(Vec<i8>),
    U16(Vec<u16>),
    I16(Vec<i16>),
    U32(Vec<u32>),
    I32(Vec<i32>),
    U64(Vec<u64>),
    I64(Vec<i64>),
    F32(Vec<f32>),
    F64(Vec<f64>),
    Bool(Vec<bool>),
    Str(Vec<String>),
    /// Arrays of arrays (each inner array may have its own element type).
    Nested(Vec<Array>),
}

impl Array {
    pub fn len(&self) -> usize {
        match self {
            Array::U8(v) => v.len(),
            Array::I8(v) => v.len(),
            Array::U16(v) => v.len(),
            Array::I16(v) => v.len(),
            Array::U32(v) => v.len(),
            Array::I32(v) => v.len(),
            Array::U64(v) => v.len(),
            Array::I64(v) => v.len(),
            Array::F32(v) => v.len(),
            Array::F64(v) => v.len(),
            Array::Bool(v) => v.len(),
            Array::Str(v) => v.len(),
            Array::Nested(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
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

struct Parsed {
    version: u32,
    alignment: usize,
    data_offset: usize,
    tensors: Vec<TensorInfo>,
    metadata: Vec<(String, Value)>,
    kv_index: HashMap<String, usize>,
    tensor_index: HashMap<String, usize>,
}

impl Parsed {
    fn into_gguf(self, backing: Backing) -> Gguf {
        Gguf {
            backing,
            version: self.version,
            alignment: self.alignment,
            data_offset: self.data_offset,
            tensors: self.tensors,
            metadata: self.metadata,
            kv_index: self.kv_index,
            tensor_index: self.tensor_index,
        }
    }
}

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    fn take(&mut self, n: usize, what: &dyn Fn() -> String) -> Result<&'a [u8], FormatError> {
        if n > self.remaining() {
            return Err(FormatError::Truncated {
                offset: self.pos,
                what: what(),
                need: n,
                have: self.remaining(),
            });
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &dyn Fn() -> String) -> Result<[u8; N], FormatError> {
        let s = self.take(N, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u32(&mut self, what: &dyn Fn() -> String) -> Result<u32, FormatError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &dyn Fn() -> String) -> Result<u64, FormatError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// A u64 length or count, bounded so that `count * min_each` bytes still remain.
    fn count(&mut self, min_each: usize, what: &dyn Fn() -> String) -> Result<usize, FormatError> {
        let at = self.pos;
        let n = self.u64(what)?;
        let max = (self.remaining() / min_each.max(1)) as u64;
        if n > max {
            return Err(FormatError::Invalid {
                offset: at,
                msg: format!(
                    "{} is {n}, but only {} bytes remain (at most {max} fit)",
                    what(),
                    self.remaining()
                ),
            });
        }
        Ok(n as usize)
    }

    fn string(&mut self, what: &dyn Fn() -> String) -> Result<String, FormatError> {
        let at = self.pos;
        let len = self.count(1, &|| format!("length of {}", what()))?;
        let bytes = self.take(len, what)?;
        String::from_utf8(bytes.to_vec()).map_err(|e| FormatError::Invalid {
            offset: at,
            msg: format!("{} is not valid UTF-8 ({e})", what()),
        })
    }
}

// GGUF metadata value type ids.
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

impl Value {
    /// The GGUF encoding of this value: its type id and bytes, as [`read_value`] reads them
    /// (`leanstream requant` copies a file's metadata through it).
    pub fn encode(&self) -> (u32, Vec<u8>) {
        match self {
            Value::U8(v) => (T_U8, vec![*v]),
            Value::I8(v) => (T_I8, v.to_le_bytes().to_vec()),
            Value::U16(v) => (T_U16, v.to_le_bytes().to_vec()),
            Value::I16(v) => (T_I16, v.to_le_bytes().to_vec()),
            Value::U32(v) => (T_U32, v.to_le_bytes().to_vec()),
            Value::I32(v) => (T_I32, v.to_le_bytes().to_vec()),
            Value::U64(v) => (T_U64, v.to_le_bytes().to_vec()),
            Value::I64(v) => (T_I64, v.to_le_bytes().to_vec()),
            Value::F32(v) => (T_F32, v.to_le_bytes().to_vec()),
            Value::F64(v) => (T_F64, v.to_le_bytes().to_vec()),
            Value::Bool(v) => (T_BOOL, vec![*v as u8]),
            Value::Str(v) => (T_STR, build::str_bytes(v)),
            Value::Array(a) => (T_ARRAY, a.encode()),
        }
    }
}

impl Array {
    /// Element type, count, then the elements (the bytes after an array's type id).
    fn encode(&self) -> Vec<u8> {
        fn prim<T: Copy, const N: usize>(ty: u32, v: &[T], le: fn(T) -> [u8; N]) -> Vec<u8> {
            let mut b = ty.to_le_bytes().to_vec();
            b.extend_from_slice(&(v.len() as u64).to_le_bytes());
            for &x in v {
                b.extend_from_slice(&le(x));
            }
            b
        }
        match self {
            Array::U8(v) => prim(T_U8, v, u8::to_le_bytes),
            Array::I8(v) => prim(T_I8, v, i8::to_le_bytes),
            Array::U16(v) => prim(T_U16, v, u16::to_le_bytes),
            Array::I16(v) => prim(T_I16, v, i16::to_le_bytes),
            Array::U32(v) => prim(T_U32, v, u32::to_le_bytes),
            Array::I32(v) => prim(T_I32, v, i32::to_le_bytes),
            Array::U64(v) => prim(T_U64, v, u64::to_le_bytes),
            Array::I64(v) => prim(T_I64, v, i64::to_le_bytes),
            Array::F32(v) => prim(T_F32, v, f32::to_le_bytes),
            Array::F64(v) => prim(T_F64, v, f64::to_le_bytes),
            Array::Bool(v) => prim(T_BOOL, v, |x: bool| [x as u8]),
            Array::Str(v) => {
                let mut b = T_STR.to_le_bytes().to_vec();
                b.extend_from_slice(&(v.len() as u64).to_le_bytes());
                for s in v {
                    b.extend(build::str_bytes(s));
                }
                b
            }
            Array::Nested(v) => {
                let mut b = T_ARRAY.to_le_bytes().to_vec();
                b.extend_from_slice(&(v.len() as u64).to_le_bytes());
                for a in v {
                    b.extend(a.encode());
                }
                b
            }
        }
    }
}

fn read_bool(r: &mut Reader, what: &dyn Fn() -> String) -> Result<bool, FormatError> {
    let at = r.pos;
    match r.array::<1>(what)?[0] {
        0 => Ok(false),
        1 => Ok(true),
        b => Err(FormatError::Invalid {
            offset: at,
            msg: format!("{} is a bool with byte {b}, not 0 or 1", what()),
        }),
    }
}

fn read_value(
    r: &mut Reader,
    ty: u32,
    what: &dyn Fn() -> String,
    depth: usize,
) -> Result<Value, FormatError> {
    let at = r.pos;
    Ok(match ty {
        T_U8 => Value::U8(u8::from_le_bytes(r.array(what)?)),
        T_I8 => Value::I8(i8::from_le_bytes(r.array(what)?)),
        T_U16 => Value::U16(u16::from_le_bytes(r.array(what)?)),
        T_I16 => Value::I16(i16::from_le_bytes(r.array(what)?)),
        T_U32 => Value::U32(u32::from_le_bytes(r.array(what)?)),
        T_I32 => Value::I32(i32::from_le_bytes(r.array(what)?)),
        T_U64 => Value::U64(u64::from_le_bytes(r.array(what)?)),
        T_I64 => Value::I64(i64::from_le_bytes(r.array(what)?)),
        T_F32 => Value::F32(f32::from_le_bytes(r.array(what)?)),
        T_F64 => Value::F64(f64::from_le_bytes(r.array(what)?)),
        T_BOOL => Value::Bool(read_bool(r, what)?),
        T_STR => Value::Str(r.string(what)?),
        T_ARRAY => Value::Array(read_array(r, what, depth)?),
        _ => {
            return Err(FormatError::Invalid {
                offset: at,
                msg: format!("{} has unknown value type {ty}", what()),
            })
        }
    })
}

fn read_array(
    r: &mut Reader,
    what: &dyn Fn() -> String,
    depth: usize,
) -> Result<Array, FormatError> {
    let at = r.pos;
    if depth >= MAX_ARRAY_DEPTH {
        return Err(FormatError::Invalid {
            offset: at,
            msg: format!("{} nests arrays deeper than {MAX_ARRAY_DEPTH}", what()),
        });
    }
    let ety = r.u32(&|| format!("element type of {}", what()))?;
    let Some(min) = min_size(ety) else {
        return Err(FormatError::Invalid {
            offset: at,
            msg: format!("{} has unknown element type {ety}", what()),
        });
    };
    let n = r.count(min, &|| format!("element count of {}", what()))?;
    let elem = |i: usize| format!("element {i} of {}", what());
    macro_rules! prim {
        ($variant:ident, $t:ty) => {{
            let size = std::mem::size_of::<$t>();
            let raw = r.take(n * size, what)?;
            Array::$variant(
                raw.chunks_exact(size)
                    .map(|c| <$t>::from_le_bytes(c.try_into().unwrap_or_default()))
                    .collect(),
            )
        }};
    }
    Ok(match ety {
        T_U8 => Array::U8(r.take(n, what)?.to_vec()),
        T_I8 => prim!(I8, i8),
        T_U16 => prim!(U16, u16),
        T_I16 => prim!(I16, i16),
        T_U32 => prim!(U32, u32),
        T_I32 => prim!(I32, i32),
        T_U64 => prim!(U64, u64),
        T_I64 => prim!(I64, i64),
        T_F32 => prim!(F32, f32),
        T_F64 => prim!(F64, f64),
        T_BOOL => {
            let mut v = Vec::with_capacity(n);
            for i in 0..n {
                v.push(read_bool(r, &|| elem(i))?);
            }
            Array::Bool(v)
        }
        T_STR => {
            let mut v = Vec::with_capacity(n);
            for i in 0..n {
                v.push(r.string(&|| elem(i))?);
            }
            Array::Str(v)
        }
        T_ARRAY => {
            let mut v = Vec::with_capacity(n);
            for i in 0..n {
                v.push(read_array(r, &|| elem(i), depth + 1)?);
            }
            Array::Nested(v)
        }
        // min_size() returned Some, so ety is one of the above.
        _ => {
            return Err(FormatError::Invalid {
                offset: at,
                msg: format!("{} has unknown element type {ety}", what()),
            })
        }
    })
}

fn parse(buf: &[u8]) -> Result<Parsed, FormatError> {
    let mut r = Reader { buf, pos: 0 };
    let magic: [u8; 4] = r.array(&|| "magic".into())?;
    if &magic != b"GGUF" {
        return Err(FormatError::BadMagic { found: magic });
    }
    let version = r.u32(&|| "version".into())?;
    if version != 2 && version != 3 {
        let note = if version.swap_bytes() == 2 || version.swap_bytes() == 3 {
            " (this looks like a big-endian GGUF; only little-endian files are read)"
        } else if version == 1 {
            " (version 1 used 32-bit counts and is obsolete; re-convert the model)"
        } else {
            ""
        };
        return Err(FormatError::UnsupportedVersion { version, note });
    }
    // Minimal encodings: a tensor info is name(8) + n_dims(4) + one dim(8) + type(4) + offset(8);
    // a kv pair is key(8) + type(4) + a one-byte value.
    let n_tensors_at = r.pos;
    let n_tensors = r.u64(&|| "tensor count".into())?;
    let n_kv = r.count(13, &|| "metadata kv count".into())?;
    let rest = r.remaining() as u64;
    if n_tensors > rest / 32 {
        return Err(FormatError::Invalid {
            offset: n_tensors_at,
            msg: format!(
                "tensor count is {n_tensors}, but only {rest} bytes remain after the header"
            ),
        });
    }
    let n_tensors = n_tensors as usize;

    let mut metadata: Vec<(String, Value)> = Vec::with_capacity(n_kv);
    let mut kv_index = HashMap::with_capacity(n_kv);
    for i in 0..n_kv {
        let key_at = r.pos;
        let key = r.string(&|| format!("key of metadata entry {i}"))?;
        let ty = r.u32(&|| format!("value type of key '{key}'"))?;
        let value = read_value(&mut r, ty, &|| format!("value of key '{key}'"), 0)?;
        if kv_index.insert(key.clone(), metadata.len()).is_some() {
            return Err(FormatError::Invalid {
                offset: key_at,
                msg: format!("duplicate metadata key '{key}'"),
            });
        }
        metadata.push((key, value));
    }

    let alignment = match kv_index.get("general.alignment").map(|&i| &metadata[i].1) {
        None => DEFAULT_ALIGNMENT,
        Some(v) => {
            let a = match *v {
                Value::U8(a) => Some(u64::from(a)),
                Value::U16(a) => Some(u64::from(a)),
                Value::U32(a) => Some(u64::from(a)),
                Value::U64(a) => Some(a),
                Value::I32(a) => u64::try_from(a).ok(),
                Value::I64(a) => u64::try_from(a).ok(),
                _ => None,
            };
            match a {
                Some(a) if a.is_power_of_two() && a <= 1 << 30 => a as usize,
                _ => {
                    return Err(FormatError::Key {
                        key: "general.alignment".into(),
                        msg: format!("must be a power of two integer (at most 2^30), found {v:?}"),
                    })
                }
            }
        }
    };

    struct Raw {
        name: String,
        at: usize,
        dims: Vec<usize>,
        ty: GgmlType,
        rel_offset: u64,
    }
    let mut raws: Vec<Raw> = Vec::with_capacity(n_tensors);
    let mut tensor_index = HashMap::with_capacity(n_tensors);
    for i in 0..n_tensors {
        let at = r.pos;
        let name = r.string(&|| format!("name of tensor {i}"))?;
        let what = |field: &str| format!("{field} of tensor '{name}'");
        let tensor_err = |msg: String| FormatError::Tensor {
            name: name.clone(),
            msg,
        };
        let n_dims = r.u32(&|| what("n_dims"))?;
        if !(1..=4).contains(&n_dims) {
            return Err(tensor_err(format!(
                "n_dims is {n_dims} (offset {at}), must be 1..=4"
            )));
        }
        let mut dims = Vec::with_capacity(n_dims as usize);
        for d in 0..n_dims {
            let v = r.u64(&|| what(&format!("dim {d}")))?;
            let v = usize::try_from(v)
                .ok()
                .filter(|&v| v <= i64::MAX as usize)
                .ok_or_else(|| tensor_err(format!("dim {d} is {v}, too large")))?;
            dims.push(v);
        }
        let ty_id = r.u32(&|| what("type"))?;
        let ty = GgmlType::from_id(ty_id)
            .ok_or_else(|| tensor_err(format!("unknown or unsupported ggml type id {ty_id}")))?;
        let rel_offset = r.u64(&|| what("offset"))?;
        if tensor_index.insert(name.clone(), raws.len()).is_some() {
            return Err(tensor_err(format!(
                "duplicate tensor name (second definition at offset {at})"
            )));
        }
        raws.push(Raw {
            name,
            at,
            dims,
            ty,
            rel_offset,
        });
    }

    let data_offset = r
        .pos
        .checked_next_multiple_of(alignment)
        .unwrap_or(usize::MAX);
    let mut tensors = Vec::with_capacity(raws.len());
    for raw in raws {
        let tensor_err = |msg: String| FormatError::Tensor {
            name: raw.name.clone(),
            msg,
        };
        let ne0 = raw.dims[0];
        let row = raw.ty.row_bytes(ne0).ok_or_else(|| {
            tensor_err(format!(
                "row length {ne0} is not a multiple of the {} block size {}",
                raw.ty.name(),
                raw.ty.block_elems()
            ))
        })?;
        let n_bytes = raw.dims[1..]
            .iter()
            .try_fold(row, |acc, &d| acc.checked_mul(d))
            .filter(|&n| {
                // All dims, and the row count alone (with ne0 = 0 the first product is 0).
                let fits = |dims: &[usize]| {
                    dims.iter()
                        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
                        .is_some()
                };
                fits(&raw.dims) && fits(&raw.dims[1..]) && n <= buf.len()
            })
            .ok_or_else(|| {
                tensor_err(format!(
                    "dims {:?} ({}) are larger than the file",
                    raw.dims,
                    raw.ty.name()
                ))
            })?;
        if raw.rel_offset % alignment as u64 != 0 {
            return Err(tensor_err(format!(
                "data offset {} is not a multiple of the alignment {alignment} (tensor info at offset {})",
                raw.rel_offset, raw.at
            )));
        }
        let offset = usize::try_from(raw.rel_offset)
            .ok()
            .and_then(|o| o.checked_add(data_offset));
        let end = offset.and_then(|o| o.checked_add(n_bytes));
        let (Some(offset), Some(end)) = (offset, end) else {
            return Err(tensor_err(format!(
                "data offset {} overflows",
                raw.rel_offset
            )));
        };
        if end > buf.len() {
            return Err(tensor_err(format!(
                "data [{offset}, {end}) ({n_bytes} bytes of {}) extends past the end of the file ({} bytes)",
                raw.ty.name(),
                buf.len()
            )));
        }
        tensors.push(TensorInfo {
            name: raw.name,
            dims: raw.dims,
            ty: raw.ty,
            offset,
            n_bytes,
        });
    }

    Ok(Parsed {
        version,
        alignment,
        data_offset,
        tensors,
        metadata,
        kv_index,
        tensor_index,
    })
}

/// Builds GGUF images in memory (tests, fuzz seeds).
#[doc(hidden)]
pub mod build {
    use super::*;

    /// A GGUF v3 writer. Values are given pre-encoded with [`Builder::kv_raw`] or the helpers.
    pub struct Builder {
        pub kv: Vec<(String, u32, Vec<u8>)>,
        pub tensors: Vec<(String, Vec<u64>, u32, Vec<u8>)>,
        pub alignment: usize,
        pub version: u32,
    }

    pub fn str_bytes(s: &str) -> Vec<u8> {
        let mut v = (s.len() as u64).to_le_bytes().to_vec();
        v.extend_from_slice(s.as_bytes());
        v
    }

    impl Default for Builder {
        fn default() -> Self {
            Builder {
                kv: vec![],
                tensors: vec![],
                alignment: DEFAULT_ALIGNMENT,
                version: 3,
            }
        }
    }

    impl Builder {
        pub fn kv_raw(&mut self, key: &str, ty: u32, value: Vec<u8>) -> &mut Self {
            self.kv.push((key.into(), ty, value));
            self
        }
        pub fn kv_u32(&mut self, key: &str, v: u32) -> &mut Self {
            self.kv_raw(key, T_U32, v.to_le_bytes().to_vec())
        }
        pub fn kv_f32(&mut self, key: &str, v: f32) -> &mut Self {
            self.kv_raw(key, T_F32, v.to_le_bytes().to_vec())
        }
        pub fn kv_str(&mut self, key: &str, v: &str) -> &mut Self {
            self.kv_raw(key, T_STR, str_bytes(v))
        }
        pub fn kv_str_array(&mut self, key: &str, v: &[&str]) -> &mut Self {
            let mut b = T_STR.to_le_bytes().to_vec();
            b.extend_from_slice(&(v.len() as u64).to_le_bytes());
            for s in v {
                b.extend(str_bytes(s));
            }
            self.kv_raw(key, T_ARRAY, b)
        }
        pub fn kv_f32_array(&mut self, key: &str, v: &[f32]) -> &mut Self {
            let mut b = T_F32.to_le_bytes().to_vec();
            b.extend_from_slice(&(v.len() as u64).to_le_bytes());
            for x in v {
                b.extend_from_slice(&x.to_le_bytes());
            }
            self.kv_raw(key, T_ARRAY, b)
        }
        pub fn kv_i32_array(&mut self, key: &str, v: &[i32]) -> &mut Self {
            let mut b = T_I32.to_le_bytes().to_vec();
            b.extend_from_slice(&(v.len() as u64).to_le_bytes());
            for x in v {
                b.extend_from_slice(&x.to_le_bytes());
            }
            self.kv_raw(key, T_ARRAY, b)
        }
        /// A tensor with ggml dims (ne0 first), type id and its data bytes.
        pub fn tensor(
            &mut self,
            name: &str,
            dims: &[u64],
            ty: GgmlType,
            data: Vec<u8>,
        ) -> &mut Self {
            self.tensors
                .push((name.into(), dims.to_vec(), ty as u32, data));
            self
        }
        /// A tensor of f32 values.
        pub fn tensor_f32(&mut self, name: &str, dims: &[u64], data: &[f32]) -> &mut Self {
            self.tensor(
                name,
                dims,
                GgmlType::F32,
                data.iter().flat_map(|x| x.to_le_bytes()).collect(),
            )
        }

        /// The file image. Tensor data is laid out in order, each aligned; the file ends right
        /// after the last tensor's data.
        pub fn build(&self) -> Vec<u8> {
            let mut out = b"GGUF".to_vec();
            out.extend_from_slice(&self.version.to_le_bytes());
            out.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
            out.extend_from_slice(&(self.kv.len() as u64).to_le_bytes());
            for (k, ty, v) in &self.kv {
                out.extend(str_bytes(k));
                out.extend_from_slice(&ty.to_le_bytes());
                out.extend_from_slice(v);
            }
            let mut rel = 0usize;
            let mut data = Vec::new();
            for (name, dims, ty, bytes) in &self.tensors {
                out.extend(str_bytes(name));
                out.extend_from_slice(&(dims.len() as u32).to_le_bytes());
                for d in dims {
                    out.extend_from_slice(&d.to_le_bytes());
                }
                out.extend_from_slice(&ty.to_le_bytes());
                rel = rel.next_multiple_of(self.alignment);
                out.extend_from_slice(&(rel as u64).to_le_bytes());
                data.resize(rel, 0);
                data.extend_from_slice(bytes);
                rel += bytes.len();
            }
            if !self.tensors.is_empty() {
                out.resize(out.len().next_multiple_of(self.alignment), 0);
                out.extend(data);
            }
            out
        }
    }
}

#[cfg(test)]
mod tests {
    use super::build::Builder;
    use super::*;

    fn sample() -> Builder {
        let mut b = Builder::default();
        b.kv_str("general.architecture", "llama")
            .kv_u32("llama.block_count", 2)
            .kv_f32("llama.rope.freq_base", 10000.0)
            .kv_raw("flag", T_BOOL, vec![1])
            .kv_raw("u64", T_U64, 7u64.to_le_bytes().to_vec())
            .kv_raw("neg", T_I32, (-3i32).to_le_bytes().to_vec())
            .kv_raw("f64", T_F64, 0.5f64.to_le_bytes().to_vec())
            .kv_str_array("tokenizer.ggml.tokens", &["a", "bc", ""])
            .kv_f32_array("tokenizer.ggml.scores", &[0.0, -1.5])
            .kv_i32_array("tokenizer.ggml.token_type", &[1, 2, 3]);
        b.tensor_f32(
            "a.weight",
            &[4, 2],
            &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0],
        );
        b.tensor("q.weight", &[32, 1], GgmlType::Q8_0, (0..34).collect());
        b
    }

    #[test]
    fn metadata_reencodes_to_the_same_values() {
        let g = Gguf::from_bytes(sample().build()).unwrap();
        let mut b = Builder::default();
        for (k, v) in g.metadata() {
            let (ty, bytes) = v.encode();
            b.kv_raw(k, ty, bytes);
        }
        // Nested arrays and every scalar type, which sample() does not hold.
        let nested = Value::Array(Array::Nested(vec![
            Array::U8(vec![1, 2]),
            Array::Bool(vec![true, false]),
            Array::F64(vec![-0.25]),
            Array::Str(vec!["x".into()]),
        ]));
        let scalars = [
            Value::U8(7),
            Value::I8(-7),
            Value::U16(700),
            Value::I16(-700),
            Value::I64(-1 << 40),
            Value::Bool(false),
            nested.clone(),
        ];
        for (i, v) in scalars.iter().enumerate() {
            let (ty, bytes) = v.encode();
            b.kv_raw(&format!("extra.{i}"), ty, bytes);
        }
        let again = Gguf::from_bytes(b.build()).unwrap();
        assert_eq!(&again.metadata()[..g.metadata().len()], g.metadata());
        for (i, v) in scalars.iter().enumerate() {
            assert_eq!(again.get(&format!("extra.{i}")), Some(v));
        }
    }

    /// A GGUF held inside another file from a page on parses in place; a range past the
    /// file's end is a truncation.
    #[test]
    fn opens_a_range_of_a_file() {
        let mut b = Builder::default();
        b.kv_str("general.architecture", "llama")
            .tensor_f32("t", &[2], &[1.0, 2.0]);
        let gguf = b.build();
        let mut file = vec![7u8; 4096];
        file.extend_from_slice(&gguf);
        file.extend_from_slice(b"trailing bytes");
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("outer.bin");
        std::fs::write(&path, &file).unwrap();
        let g = Gguf::open_range(&path, 4096, gguf.len()).unwrap();
        assert_eq!(g.architecture(), Some("llama"));
        assert_eq!(
            g.tensor_data(g.tensor("t").unwrap()),
            &gguf[gguf.len() - 8..]
        );
        let e = Gguf::open_range(&path, 4096, file.len()).unwrap_err();
        assert!(matches!(e, FormatError::Truncated { .. }), "{e}");
    }

    #[test]
    fn parses_valid_file() {
        let g = Gguf::from_bytes(sample().build()).unwrap();
        assert_eq!(g.version, 3);
        assert_eq!(g.alignment, 32);
        assert_eq!(g.architecture(), Some("llama"));
        assert_eq!(g.get_u32("llama.block_count"), Some(2));
        assert_eq!(g.get_u32("u64"), Some(7));
        assert_eq!(g.get_u32("neg"), None);
        assert_eq!(g.get_f32("llama.rope.freq_base"), Some(10000.0));
        assert_eq!(g.get_f32("f64"), Some(0.5));
        assert_eq!(g.get_bool("flag"), Some(true));
        assert_eq!(
            g.get_str_array("tokenizer.ggml.tokens").unwrap(),
            &["a", "bc", ""]
        );
        assert_eq!(
            g.get_f32_array("tokenizer.ggml.scores").unwrap(),
            &[0.0, -1.5]
        );
        assert_eq!(
            g.get_i32_array("tokenizer.ggml.token_type").unwrap(),
            &[1, 2, 3]
        );
        assert_eq!(g.get_str("missing"), None);
        let t = g.tensor("a.weight").unwrap();
        assert_eq!(t.dims, vec![4, 2]);
        assert_eq!(t.n_bytes, 32);
        assert_eq!(t.offset % 32, 0);
        let d = g.tensor_data(t);
        assert_eq!(f32::from_le_bytes(d[28..32].try_into().unwrap()), 8.0);
        let q = g.tensor("q.weight").unwrap();
        assert_eq!(g.tensor_data(q), (0..34).collect::<Vec<u8>>());
        assert_eq!(q.offset + q.n_bytes, g.bytes().len());
        // A foreign TensorInfo pointing outside yields an empty slice, not a panic.
        let bogus = TensorInfo {
            offset: usize::MAX,
            n_bytes: 10,
            ..t.clone()
        };
        assert!(g.tensor_data(&bogus).is_empty());
    }

    fn err(bytes: Vec<u8>) -> String {
        match Gguf::from_bytes(bytes) {
            Ok(_) => panic!("expected an error"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn wrong_magic() {
        let mut b = sample().build();
        b[0] = b'X';
        assert!(err(b).contains("not a GGUF file"));
    }

    #[test]
    fn version_1_and_big_endian() {
        let mut s = sample();
        s.version = 1;
        let e = err(s.build());
        assert!(e.contains("version 1"), "{e}");
        s.version = 3u32.swap_bytes();
        assert!(err(s.build()).contains("big-endian"));
        s.version = 2;
        assert!(Gguf::from_bytes(s.build()).is_ok());
    }

    #[test]
    fn truncated_everywhere() {
        let b = sample().build();
        for n in 0..b.len() {
            let e = err(b[..n].to_vec());
            assert!(!e.is_empty());
        }
        // The header itself names what is missing.
        assert!(err(b[..10].to_vec()).contains("truncated"));
    }

    #[test]
    fn huge_counts() {
        let mut b = sample().build();
        b[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(err(b.clone()).contains("tensor count"));
        let mut b2 = sample().build();
        b2[16..24].copy_from_slice(&(1u64 << 60).to_le_bytes());
        assert!(err(b2).contains("kv count"));
        // A string length beyond the file.
        let mut b3 = sample().build();
        b3[24..32].copy_from_slice(&(u64::MAX - 1).to_le_bytes());
        assert!(err(b3).contains("length of key"));
        // An array count beyond the file.
        let mut s = Builder::default();
        let mut v = T_F32.to_le_bytes().to_vec();
        v.extend_from_slice(&(1u64 << 40).to_le_bytes());
        s.kv_raw("arr", T_ARRAY, v);
        assert!(err(s.build()).contains("element count"));
    }

    #[test]
    fn offset_past_end_and_misaligned() {
        let mut s = Builder::default();
        s.tensor_f32("t", &[4], &[0.0; 4]);
        let b = s.build();
        // Tensor offset is the 8 bytes before the alignment padding; find it after the type.
        let info = 24 + 8 + 1 + 4 + 8 + 4;
        let mut b1 = b.clone();
        b1[info..info + 8].copy_from_slice(&64u64.to_le_bytes());
        let e = err(b1);
        assert!(
            e.contains("tensor 't'") && e.contains("past the end"),
            "{e}"
        );
        let mut b2 = b.clone();
        b2[info..info + 8].copy_from_slice(&4u64.to_le_bytes());
        assert!(err(b2).contains("not a multiple of the alignment"));
        let mut b3 = b;
        b3[info..info + 8].copy_from_slice(&(u64::MAX - 31).to_le_bytes());
        assert!(!err(b3).is_empty());
    }

    #[test]
    fn unknown_type_and_bad_dims() {
        let mut s = Builder::default();
        s.tensors.push(("weird".into(), vec![32], 99, vec![0; 64]));
        let e = err(s.build());
        assert!(e.contains("'weird'") && e.contains("99"), "{e}");

        let mut s = Builder::default();
        s.tensor("q", &[16], GgmlType::Q4_0, vec![0; 18]);
        assert!(err(s.build()).contains("block size"));

        let mut s = Builder::default();
        s.tensor("z", &[1, 1, 1, 1, 1], GgmlType::F32, vec![0; 4]);
        assert!(err(s.build()).contains("n_dims"));

        let mut s = Builder::default();
        s.tensor(
            "big",
            &[1 << 40, 1 << 40, 1 << 40],
            GgmlType::F32,
            vec![0; 4],
        );
        assert!(err(s.build()).contains("larger than the file"));

        let mut s = Builder::default();
        s.tensor_f32("dup", &[1], &[0.0])
            .tensor_f32("dup", &[1], &[0.0]);
        assert!(err(s.build()).contains("duplicate tensor"));
    }

    #[test]
    fn bad_alignment_and_values() {
        let mut s = sample();
        s.kv_u32("general.alignment", 48);
        assert!(err(s.build()).contains("general.alignment"));
        let mut s = sample();
        s.kv_u32("general.alignment", 0);
        assert!(err(s.build()).contains("power of two"));
        let mut s = sample();
        s.alignment = 64;
        s.kv_u32("general.alignment", 64);
        let g = Gguf::from_bytes(s.build()).unwrap();
        assert_eq!(g.alignment, 64);
        assert!(g.tensors.iter().all(|t| t.offset % 64 == 0));

        let mut s = Builder::default();
        s.kv_raw("b", T_BOOL, vec![2]);
        assert!(err(s.build()).contains("not 0 or 1"));
        let mut s = Builder::default();
        s.kv_raw("x", 13, vec![0; 8]);
        assert!(err(s.build()).contains("unknown value type 13"));
        let mut s = Builder::default();
        s.kv_raw("s", T_STR, {
            let mut v = 2u64.to_le_bytes().to_vec();
            v.extend_from_slice(&[0xff, 0xfe]);
            v
        });
        assert!(err(s.build()).contains("UTF-8"));
        let mut s = Builder::default();
        s.kv_u32("k", 1).kv_u32("k", 2);
        assert!(err(s.build()).contains("duplicate metadata key"));
    }

    #[test]
    fn nested_arrays_bounded() {
        // An array of one array of two u8, then a 100-deep nesting which must be refused.
        let mut v = T_ARRAY.to_le_bytes().to_vec();
        v.extend_from_slice(&1u64.to_le_bytes());
        v.extend_from_slice(&T_U8.to_le_bytes());
        v.extend_from_slice(&2u64.to_le_bytes());
        v.extend_from_slice(&[5, 6]);
        let mut s = Builder::default();
        s.kv_raw("n", T_ARRAY, v);
        let g = Gguf::from_bytes(s.build()).unwrap();
        assert_eq!(
            g.get("n"),
            Some(&Value::Array(Array::Nested(vec![Array::U8(vec![5, 6])])))
        );

        let mut deep = Vec::new();
        for _ in 0..100 {
            deep.extend_from_slice(&T_ARRAY.to_le_bytes());
            deep.extend_from_slice(&1u64.to_le_bytes());
        }
        deep.extend_from_slice(&T_U8.to_le_bytes());
        deep.extend_from_slice(&0u64.to_le_bytes());
        let mut s = Builder::default();
        s.kv_raw("deep", T_ARRAY, deep);
        assert!(err(s.build()).contains("deeper"));
    }

    #[test]
    fn open_missing_file() {
        let e = Gguf::open(Path::new("/nonexistent/x.gguf")).unwrap_err();
        assert!(
            matches!(&e, FormatError::Io { path, .. } if path == Path::new("/nonexistent/x.gguf"))
        );
        // The caller names the file: the message itself does not, so it is not said twice.
        assert!(!e.to_string().contains("/nonexistent"), "{e}");
    }
}
