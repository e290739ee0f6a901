//! Metadata values: their types, and their GGUF encoding both ways (read from a file, written
//! back by `leanstream requant`).

use super::build;
use super::reader::Reader;
use super::FormatError;
use super::{
    min_size, T_ARRAY, T_BOOL, T_F32, T_F64, T_I16, T_I32, T_I64, T_I8, T_STR, T_U16, T_U32, T_U64,
    T_U8,
};

/// Nested metadata arrays deeper than this are rejected (bounds recursion on hostile input).
const MAX_ARRAY_DEPTH: usize = 8;

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

impl Value {
    /// The GGUF encoding of this value: its type id and bytes, as `read_value` reads them
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

pub(super) fn read_value(
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
