//! Fuzzes the llama2.c checkpoint reader: `Llama2c::from_bytes` and the `ModelFile` view on an
//! arbitrary image. A checkpoint that parses must have exactly the file's size in tensors, each
//! tensor's bytes inside the file and of its stated length, and hyperparameters that validate.
//!
//! Run: `RUSTC_BOOTSTRAP=1 cargo fuzz run llama2c -- -max_len=4096` (seed corpus: tiny
//! checkpoints from gen-seeds.py).
#![no_main]

use leanstream::model::llama2c::{Llama2c, HEADER_BYTES};
use leanstream::model::ModelFile;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(m) = Llama2c::from_bytes(data.to_vec()) else {
        return;
    };
    let c = m.config;
    assert!(c.dim > 0 && c.n_heads > 0 && c.dim % c.n_heads == 0);
    assert!(c.head_size() % 2 == 0 && c.n_heads % c.n_kv_heads == 0);
    let mut total = 0usize;
    for t in &m.tensors {
        let bytes = m.tensor_data(t);
        assert_eq!(bytes.len(), t.n_bytes, "{}", t.name);
        assert_eq!(t.n_bytes, t.cols * t.rows * 4, "{}", t.name);
        assert!(t.offset >= HEADER_BYTES && t.offset + t.n_bytes <= data.len());
        assert_eq!(m.tensor(&t.name), Some(t));
        total += t.n_bytes;
    }
    assert!(HEADER_BYTES + total <= data.len());
    if data.starts_with(b"GGUF") {
        return;
    }
    let mf = ModelFile::from_bytes(data.to_vec()).expect("parsed above");
    let h = mf.hyper().expect("a parsed header has hyperparameters");
    let _ = mf.validate(&h);
    let _ = leanstream::tables::model_identity(&mf);
    let _ = mf.tensor("token_embd.weight");
});
