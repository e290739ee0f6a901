//! Fuzzes `Tokenizer::encode_into` on arbitrary text for every vocabulary kind, with small
//! synthetic vocabularies built once (no ../shared data needed).
//!
//! Input: byte 0 picks the vocabulary (`% KINDS`), bit 4 `parse_special`, bit 5 `add_bos`; the
//! rest is the text (invalid UTF-8 replaced by U+FFFD). Properties:
//! - `encode_into` into an exact-size buffer gives the ids of the allocating `encode_with_special`,
//!   also in a large scratch reused across runs (no state leaks between calls);
//! - one id short: `TooLong { OutputIds }` with `needed` = the id count, and the prefix written;
//!   a scratch one byte short: `TooLong { TextBytes }`, nothing else;
//! - every id is in the vocabulary;
//! - without `parse_special`, the ids decode back to the text's bytes: always for byte-level BPE;
//!   for SentencePiece and llama2.c when no special token is among the ids and (SentencePiece)
//!   the text holds no `▁` (which decodes as a space);
//! - with `parse_special`, a text holding no control token's text encodes as without it.
//!
//! Run: `RUSTC_BOOTSTRAP=1 cargo fuzz run tokenizer -- -max_len=1024`
#![no_main]

use std::cell::RefCell;
use std::sync::OnceLock;

use leanstream::tokenizer::{
    EncodeError, EncodeLimit, EncodeScratch, TokenType, Tokenizer, VocabSpec,
};
use libfuzzer_sys::fuzz_target;

/// The GPT-2 byte -> char map (bytes that print as themselves keep their char; the others map
/// to U+0100 and up, in order).
fn byte_chars() -> Vec<String> {
    let keep = |b: u8| {
        (0x21..=0x7E).contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b)
    };
    let mut n = 0;
    (0..=255u8)
        .map(|b| {
            if keep(b) {
                char::from(b).to_string()
            } else {
                n += 1;
                char::from_u32(255 + n).unwrap().to_string()
            }
        })
        .collect()
}

/// Byte-level BPE: the 256 byte chars, merged tokens (ranked merges), a whole word no merge
/// reaches (for `ignore_merges`), two control tokens and a user-defined one.
fn bpe(pre: &str) -> Tokenizer {
    let mut tokens = byte_chars();
    let mut types = vec![1; 256];
    let merges = [
        "Ġ t",
        "h e",
        "Ġt he",
        "Ġ Ġ",
        "i n",
        "Ġ a",
        "e r",
        "Ċ Ċ",
        "Ã ©",
        "1 2",
        "Ġ 1",
        "' s",
        "ĠĠ ĠĠ",
        "Ġ in",
        "in g",
    ];
    for m in merges {
        tokens.push(m.replace(' ', ""));
        types.push(1);
    }
    for (t, ty) in [
        ("Ġhello", 1),
        ("world", 1),
        ("<|im_start|>", 3),
        ("<|im_end|>", 3),
        ("<tool>", 4),
    ] {
        tokens.push(t.into());
        types.push(ty);
    }
    let eos = tokens.iter().position(|t| t == "<|im_end|>").unwrap() as u32;
    Tokenizer::from_spec(VocabSpec {
        model: "gpt2".into(),
        pre: Some(pre.into()),
        tokens,
        token_types: types,
        merges: merges.iter().map(|m| m.to_string()).collect(),
        bos: Some(eos - 1),
        eos: Some(eos),
        ..VocabSpec::default()
    })
    .unwrap()
}

/// SentencePiece BPE: <unk>, <s>, </s>, the 256 byte tokens, scored pieces, a user-defined
/// token; `cross` adds a piece with `▁` inside a word (no per-word split).
fn spm(add_space_prefix: bool, cross: bool) -> Tokenizer {
    let mut tokens: Vec<String> = vec!["<unk>".into(), "<s>".into(), "</s>".into()];
    let mut types = vec![2, 3, 3];
    let mut scores = vec![0.0f32; 3];
    for b in 0..=255u32 {
        tokens.push(format!("<0x{b:02X}>"));
        types.push(6);
        scores.push(0.0);
    }
    let mut pieces = vec![
        ("▁", -1.0),
        ("h", -2.0),
        ("e", -2.0),
        ("l", -2.0),
        ("o", -2.0),
        ("i", -2.0),
        ("hi", -3.0),
        ("▁hi", -4.0),
        ("▁▁", -5.0),
        ("he", -3.5),
        ("ll", -3.0),
        ("llo", -3.2),
        ("hello", -3.1),
        ("▁hello", -2.5),
        ("é", -6.0),
        ("▁é", f32::NEG_INFINITY),
        ("▁▁▁▁", -7.0),
        ("<tool>", 0.0),
    ];
    if cross {
        pieces.push(("o▁", -1.5));
    }
    for (t, s) in pieces {
        tokens.push(t.into());
        types.push(if t == "<tool>" { 4 } else { 1 });
        scores.push(s);
    }
    Tokenizer::from_spec(VocabSpec {
        model: "llama".into(),
        tokens,
        scores,
        token_types: types,
        bos: Some(1),
        eos: Some(2),
        add_space_prefix: Some(add_space_prefix),
        ..VocabSpec::default()
    })
    .unwrap()
}

/// A llama2.c `tok*.bin` image: <unk>, <s>, </s>, the 256 `<0xXX>` tokens, then pieces;
/// `cross` adds a piece with a space after a letter (no per-word split).
fn llama2c(cross: bool) -> Tokenizer {
    let mut entries: Vec<(Vec<u8>, f32)> = vec![
        (b"<unk>".to_vec(), 0.0),
        (b"\n<s>\n".to_vec(), 0.0),
        (b"\n</s>\n".to_vec(), 0.0),
    ];
    for b in 0..=255u32 {
        entries.push((format!("<0x{b:02X}>").into_bytes(), 0.0));
    }
    let mut pieces: Vec<(&str, f32)> = vec![
        (" ", -1.0),
        ("t", -2.0),
        ("h", -2.0),
        ("e", -2.0),
        (" t", -3.0),
        ("he", -3.0),
        (" the", -2.5),
        ("  ", -4.0),
        ("in", -3.3),
        (" in", -3.4),
        ("é", -5.0),
        ("\n", -1.0),
        ("\n\n", -1.5),
    ];
    if cross {
        pieces.push(("e ", -1.2));
    }
    for (t, s) in pieces {
        entries.push((t.as_bytes().to_vec(), s));
    }
    let mut bin = 16i32.to_le_bytes().to_vec();
    for (t, s) in &entries {
        bin.extend_from_slice(&s.to_le_bytes());
        bin.extend_from_slice(&(t.len() as i32).to_le_bytes());
        bin.extend_from_slice(t);
    }
    Tokenizer::from_llama2c_bytes(&bin, entries.len()).unwrap()
}

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Bpe,
    Spm,
    Llama2c,
}

const KINDS: usize = 9;

fn vocabs() -> &'static [(Kind, Tokenizer); KINDS] {
    static V: OnceLock<[(Kind, Tokenizer); KINDS]> = OnceLock::new();
    V.get_or_init(|| {
        [
            (Kind::Bpe, bpe("gpt-2")),
            (Kind::Bpe, bpe("smollm")),
            (Kind::Bpe, bpe("qwen2")),
            (Kind::Bpe, bpe("llama-bpe")),
            (Kind::Spm, spm(true, false)),
            (Kind::Spm, spm(false, false)),
            (Kind::Spm, spm(true, true)),
            (Kind::Llama2c, llama2c(false)),
            (Kind::Llama2c, llama2c(true)),
        ]
    })
}

const CONTROL_TEXTS: [&str; 5] = ["<|im_start|>", "<|im_end|>", "<s>", "</s>", "<unk>"];

thread_local! {
    /// A scratch reused across runs, larger than any input.
    static SCRATCH: RefCell<EncodeScratch> = RefCell::new(EncodeScratch::new(1 << 16));
}

fn encode_exact(
    tok: &Tokenizer,
    text: &str,
    add_bos: bool,
    parse_special: bool,
    n: usize,
) -> Vec<u32> {
    let mut scratch = EncodeScratch::new(text.len());
    let mut out = vec![u32::MAX; n];
    let got = tok
        .encode_into(text, add_bos, parse_special, &mut scratch, &mut out)
        .expect("exact-size buffers suffice");
    assert_eq!(got, n);
    out
}

fuzz_target!(|data: &[u8]| {
    let Some((&sel, rest)) = data.split_first() else {
        return;
    };
    let (kind, tok) = &vocabs()[sel as usize % KINDS];
    let parse_special = sel & 0x10 != 0;
    let add_bos = sel & 0x20 != 0;
    let text = String::from_utf8_lossy(rest);
    let text: &str = &text;

    let ids = tok.encode_with_special(text, add_bos, parse_special);
    let n = ids.len();
    assert!(ids.iter().all(|&id| (id as usize) < tok.vocab_size()));
    assert_eq!(encode_exact(tok, text, add_bos, parse_special, n), ids);
    SCRATCH.with(|s| {
        let mut out = vec![u32::MAX; n];
        let got = tok.encode_into(text, add_bos, parse_special, &mut s.borrow_mut(), &mut out);
        assert_eq!(got, Ok(n));
        assert_eq!(out, ids, "a reused scratch gives the same ids");
    });
    if n > 0 {
        let mut scratch = EncodeScratch::new(text.len());
        let mut out = vec![u32::MAX; n - 1];
        let e = tok.encode_into(text, add_bos, parse_special, &mut scratch, &mut out);
        assert_eq!(
            e,
            Err(EncodeError::TooLong {
                what: EncodeLimit::OutputIds,
                needed: n,
                limit: n - 1
            })
        );
        assert_eq!(out[..], ids[..n - 1]);
    }
    if !text.is_empty() {
        let mut scratch = EncodeScratch::new(text.len() - 1);
        let mut out = vec![u32::MAX; n + 4];
        let e = tok.encode_into(text, add_bos, parse_special, &mut scratch, &mut out);
        assert!(
            matches!(
                e,
                Err(EncodeError::TooLong {
                    what: EncodeLimit::TextBytes,
                    ..
                })
            ),
            "{e:?}"
        );
    }

    let body = match (add_bos, tok.bos()) {
        (true, Some(b)) => {
            assert_eq!(ids.first(), Some(&b));
            &ids[1..]
        }
        _ => &ids[..],
    };
    if !parse_special {
        let special = |id: &u32| {
            matches!(
                tok.token_type(*id),
                Some(TokenType::Control | TokenType::UserDefined | TokenType::Unknown)
            )
        };
        let round_trip = match kind {
            Kind::Bpe => true,
            Kind::Spm => !body.iter().any(special) && !text.contains('▁'),
            Kind::Llama2c => !body.iter().any(special),
        };
        if round_trip {
            if *kind == Kind::Bpe {
                let bytes: Vec<u8> = body
                    .iter()
                    .flat_map(|&id| tok.token_bytes(id))
                    .copied()
                    .collect();
                assert_eq!(bytes, text.as_bytes(), "ids {ids:?}");
            } else {
                assert_eq!(tok.decode(&ids), text, "ids {ids:?}");
            }
        }
    } else if !CONTROL_TEXTS.iter().any(|c| text.contains(c)) {
        assert_eq!(ids, tok.encode_with_special(text, add_bos, false));
    } else {
        let _ = tok.decode(&ids);
    }
});
