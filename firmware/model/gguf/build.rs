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
    pub fn tensor(&mut self, name: &str, dims: &[u64], ty: GgmlType, data: Vec<u8>) -> &mut Self {
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
