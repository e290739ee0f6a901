//! Inputs the fuzz targets (fuzz/, docs/FUZZING.md) found crashing, kept as regression tests.

use leanstream::tokenizer::{Tokenizer, TokenizerError};

/// fuzz target llama2c_tok: a vocabulary size far past what the file holds (a checkpoint header's
/// vocab_size is any i32) made the loader reserve room for that many entries up front: 24 bytes
/// each, so an out-of-memory abort before reading the first entry. It must be a clear error.
#[test]
fn llama2c_tokenizer_with_a_huge_vocab_size_is_truncated_not_an_abort() {
    for vocab in [u32::MAX as usize, 1 << 40] {
        match Tokenizer::from_llama2c_bytes(&[0, 0, 0, 0], vocab) {
            Err(TokenizerError::Llama2cTruncated { entry: 0, .. }) => {}
            other => panic!("vocab {vocab}: {other:?}"),
        }
    }
}

/// fuzz target gguf: a tensor whose row length (ne0) is 0 passed the size checks (the product of
/// all dims is 0) while the product of the other dims, its row count, overflows: reading the
/// tensor through `ModelFile::tensor` then panicked on the multiplication. It must be refused.
#[test]
fn gguf_tensor_with_empty_rows_and_overflowing_row_count_is_refused() {
    let mut f = b"GGUF".to_vec();
    f.extend_from_slice(&3u32.to_le_bytes()); // version
    f.extend_from_slice(&1u64.to_le_bytes()); // tensors
    f.extend_from_slice(&0u64.to_le_bytes()); // metadata entries
    let name = b"token_embd.weight";
    f.extend_from_slice(&(name.len() as u64).to_le_bytes());
    f.extend_from_slice(name);
    f.extend_from_slice(&3u32.to_le_bytes()); // n_dims
    for d in [0u64, 1 << 40, 1 << 40] {
        f.extend_from_slice(&d.to_le_bytes());
    }
    f.extend_from_slice(&0u32.to_le_bytes()); // F32
    f.extend_from_slice(&0u64.to_le_bytes()); // offset
    f.resize(f.len().next_multiple_of(32) + 32, 0);
    match leanstream::model::ModelFile::from_bytes(f) {
        Err(e) => assert!(e.to_string().contains("larger than the file"), "{e}"),
        Ok(m) => panic!(
            "accepted: {:?}",
            m.tensor("token_embd.weight").map(|t| t.rows)
        ),
    }
}
