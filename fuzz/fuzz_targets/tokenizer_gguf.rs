//! Fuzzes tokenizer construction from GGUF metadata: `Tokenizer::from_gguf` (and the chat
//! template's `ChatFormat::detect`) on an arbitrary GGUF image. A tokenizer that builds must
//! encode and decode sample texts without panicking, every id in its vocabulary, `encode_into`
//! agreeing with `encode_with_special`.
//!
//! Run: `RUSTC_BOOTSTRAP=1 cargo fuzz run tokenizer_gguf -- -max_len=16384` (seed corpus: small
//! GGUF files with byte-level BPE and SentencePiece vocabularies, from gen-seeds.py).
#![no_main]

use leanstream::model::gguf::Gguf;
use leanstream::tokenizer::{ChatFormat, ChatMessage, EncodeScratch, Tokenizer};
use libfuzzer_sys::fuzz_target;

const SAMPLES: [&str; 4] = [
    "Hello world, it's 2024!",
    "<|im_start|>user\nhi<|im_end|>\n<s>[INST]",
    "  \t\n\n é ü 日本 🙂 ▁x",
    "",
];

fuzz_target!(|data: &[u8]| {
    let Ok(g) = Gguf::from_bytes(data.to_vec()) else {
        return;
    };
    if let Ok(f) = ChatFormat::detect(g.get_str("tokenizer.chat_template")) {
        let msgs = [ChatMessage {
            role: "user",
            content: "hi",
        }];
        let _ = f.render(&msgs, true);
    }
    let Ok(tok) = Tokenizer::from_gguf(&g) else {
        return;
    };
    let n = tok.vocab_size();
    assert!(n > 0);
    for text in SAMPLES {
        for (add_bos, parse_special) in [(false, false), (true, true)] {
            let ids = tok.encode_with_special(text, add_bos, parse_special);
            assert!(ids.iter().all(|&id| (id as usize) < n), "{ids:?}");
            let mut scratch = EncodeScratch::new(text.len());
            let mut out = vec![0u32; ids.len()];
            assert_eq!(
                tok.encode_into(text, add_bos, parse_special, &mut scratch, &mut out),
                Ok(ids.len())
            );
            assert_eq!(out, ids);
            let _ = tok.decode(&ids);
        }
    }
    for id in [0, 1, 2, n as u32 - 1, n as u32, u32::MAX] {
        let _ = (
            tok.token_bytes(id),
            tok.token_type(id),
            tok.is_end_of_generation(id),
        );
    }
    let _ = (
        tok.bos(),
        tok.eos(),
        tok.add_bos_default(),
        tok.token_id("a"),
    );
});
