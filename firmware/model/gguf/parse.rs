//! The parser: header, metadata and the tensor table, each count and tensor checked against
//! the file before anything is allocated or trusted.

use super::reader::Reader;
use super::value::read_value;
use super::{Backing, FormatError, Gguf, TensorInfo, Value, DEFAULT_ALIGNMENT};
use crate::model::ggml::GgmlType;
use std::collections::HashMap;

pub(super) struct Parsed {
    version: u32,
    alignment: usize,
    data_offset: usize,
    tensors: Vec<TensorInfo>,
    metadata: Vec<(String, Value)>,
    kv_index: HashMap<String, usize>,
    tensor_index: HashMap<String, usize>,
}

impl Parsed {
    pub(super) fn into_gguf(self, backing: Backing) -> Gguf {
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

pub(super) fn parse(buf: &[u8]) -> Result<Parsed, FormatError> {
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
