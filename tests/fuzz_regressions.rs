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
