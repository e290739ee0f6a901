//! Fuzzes the llama2.c tokenizer loader (`Tokenizer::from_llama2c_bytes`, the in-memory form of
//! `from_llama2c`). Input: a u32 (LE) vocabulary size (as a checkpoint header gives it, so any
//! value), then the `tok*.bin` bytes. A tokenizer that loads must encode and decode sample texts
//! without panicking, every id in its vocabulary, `encode_into` agreeing with `encode`.
//!
//! Run: `RUSTC_BOOTSTRAP=1 cargo fuzz run llama2c_tok -- -max_len=8192` (seed corpus: small
//! tokenizer files from gen-seeds.py).
#![no_main]

use leanstream::tokenizer::{EncodeScratch, Tokenizer};
use libfuzzer_sys::fuzz_target;

const SAMPLES: [&str; 3] = ["Once upon a time, there was a", "  é\n\n日本 🙂", ""];

fuzz_target!(|data: &[u8]| {
    let Some((head, file)) = data.split_first_chunk::<4>() else {
        return;
    };
    let vocab = u32::from_le_bytes(*head) as usize;
    let Ok(tok) = Tokenizer::from_llama2c_bytes(file, vocab) else {
        return;
    };
    assert_eq!(tok.vocab_size(), vocab);
    for text in SAMPLES {
        for add_bos in [false, true] {
            let ids = tok.encode(text, add_bos);
            assert!(ids.iter().all(|&id| (id as usize) < vocab), "{ids:?}");
            let mut scratch = EncodeScratch::new(text.len());
            let mut out = vec![0u32; ids.len()];
            assert_eq!(
                tok.encode_into(text, add_bos, false, &mut scratch, &mut out),
                Ok(ids.len())
            );
            assert_eq!(out, ids);
            let _ = tok.decode(&ids);
        }
    }
});
