//! Fuzzes the GGUF reader and the ModelFile view built on it: no input may panic, and every
//! tensor of a file that parses must be readable and dequantizable.
//!
//! Run: `RUSTC_BOOTSTRAP=1 cargo fuzz run gguf -- -max_len=4096` (seed corpus: small GGUF files).
#![no_main]

use leanstream::model::ggml::dequantize_row;
use leanstream::model::gguf::Gguf;
use leanstream::model::ModelFile;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(g) = Gguf::from_bytes(data.to_vec()) else {
        return;
    };
    let mut dst = Vec::new();
    for t in &g.tensors {
        let bytes = g.tensor_data(t);
        assert_eq!(bytes.len(), t.n_bytes, "{}", t.name);
        // Dequantize the first row: the parser guarantees whole blocks per row.
        let cols = t.dims[0];
        if cols > 0 && cols <= 1 << 16 {
            let rb = t.ty.row_bytes(cols).expect("row length validated");
            if bytes.len() >= rb {
                dst.resize(cols, 0.0);
                dequantize_row(t.ty, &bytes[..rb], &mut dst);
            }
        }
    }
    for (k, _) in g.metadata() {
        let _ = (g.get_u32(k), g.get_f32(k), g.get_str(k), g.get_str_array(k));
    }
    let m = ModelFile::Gguf(g);
    if let Ok(h) = m.hyper() {
        let _ = m.validate(&h);
    }
    let _ = m.tensor("token_embd.weight");
});
