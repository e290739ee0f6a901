//! Tokenizers built from small hand-made vocabularies (no files needed).

use leanstream::tokenizer::{Tokenizer, VocabSpec};

/// Byte-level BPE vocabulary: the 256 mapped byte chars, then merged tokens, then a control token.
fn bpe_spec(pre: &str) -> VocabSpec {
    let mut tokens: Vec<String> = Vec::new();
    for b in 0..=255u8 {
        let keep =
            (0x21..=0x7E).contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b);
        let c = if keep {
            char::from(b)
        } else {
            let n = (0..b)
                .filter(|&x| {
                    !((0x21..=0x7E).contains(&x)
                        || (0xA1..=0xAC).contains(&x)
                        || (0xAE..=0xFF).contains(&x))
                })
                .count();
            char::from_u32(256 + n as u32).unwrap()
        };
        tokens.push(c.to_string());
    }
    for t in ["Ġt", "he", "Ġthe", "ĠĠ", "<|im_end|>"] {
        tokens.push(t.to_string());
    }
    let mut types = vec![1; tokens.len()];
    *types.last_mut().unwrap() = 3;
    VocabSpec {
        model: "gpt2".into(),
        pre: Some(pre.into()),
        tokens,
        token_types: types,
        merges: vec!["Ġ t".into(), "h e".into(), "Ġt he".into(), "Ġ Ġ".into()],
        eos: Some(260),
        ..VocabSpec::default()
    }
}

#[test]
fn byte_level_bpe_merges_by_rank() {
    let tok = Tokenizer::from_spec(bpe_spec("gpt-2")).unwrap();
    // " the" -> Ġt + he -> Ġthe
    assert_eq!(tok.encode(" the", false), [258]);
    assert_eq!(tok.encode("the", false), [b't' as u32, 257]);
    assert_eq!(tok.decode(&tok.encode("héllo\n the", false)), "héllo\n the");
    assert_eq!(
        tok.encode_with_special("a<|im_end|>", false, true),
        [b'a' as u32, 260]
    );
    assert!(tok.is_end_of_generation(260));
    assert_eq!(tok.token_bytes(258), b" the");
    assert_eq!(tok.token_bytes(260), b"");
    assert_eq!(tok.token_bytes(9999), b"");
}

#[test]
fn unsupported_model_and_pre_tokenizer_are_clear_errors() {
    let err = Tokenizer::from_spec(bpe_spec("xyz-made-up")).unwrap_err();
    assert_eq!(err.to_string(), "unsupported pre-tokenizer 'xyz-made-up'");
    let mut spec = bpe_spec("gpt-2");
    spec.model = "bert".into();
    assert_eq!(
        Tokenizer::from_spec(spec).unwrap_err().to_string(),
        "unsupported tokenizer model 'bert'"
    );
    let mut spec = bpe_spec("gpt-2");
    spec.eos = Some(100_000);
    assert!(Tokenizer::from_spec(spec)
        .unwrap_err()
        .to_string()
        .contains("out of range"));
}

#[test]
fn sentencepiece_merges_by_score_with_byte_fallback() {
    let mut tokens: Vec<String> = vec!["<unk>".into(), "<s>".into(), "</s>".into()];
    let mut types = vec![2, 3, 3];
    let mut scores = vec![0.0f32; 3];
    for b in 0..=255u32 {
        tokens.push(format!("<0x{b:02X}>"));
        types.push(6);
        scores.push(0.0);
    }
    for (t, s) in [
        ("▁", -1.0),
        ("h", -2.0),
        ("i", -2.0),
        ("hi", -3.0),
        ("▁hi", -4.0),
        ("▁▁", -5.0),
    ] {
        tokens.push(t.into());
        types.push(1);
        scores.push(s);
    }
    let id = |t: &str| tokens.iter().position(|x| x == t).unwrap() as u32;
    let (sp, hi, sphi, spsp) = (id("▁"), id("hi"), id("▁hi"), id("▁▁"));
    let tok = Tokenizer::from_spec(VocabSpec {
        model: "llama".into(),
        tokens: tokens.clone(),
        scores,
        token_types: types,
        bos: Some(1),
        eos: Some(2),
        ..VocabSpec::default()
    })
    .unwrap();
    assert!(tok.add_bos_default());
    assert_eq!(tok.encode("hi", true), [1, sphi]);
    // "hi" (-3) beats "▁h" (absent); then "▁hi" (-4).
    assert_eq!(tok.encode("hi hi", false), [sphi, sphi]);
    // "é" has no token: UTF-8 bytes C3 A9 -> <0xC3> <0xA9> (ids 3 + byte).
    assert_eq!(tok.encode("é", false), [sp, 3 + 0xC3, 3 + 0xA9]);
    assert_eq!(tok.decode(&tok.encode("é hi", true)), "é hi");
    // "▁▁hi": "hi" (-3) first, then "▁hi" (-4) beats "▁▁" (-5).
    assert_eq!(tok.encode(" hi", false), [sp, sphi]);
    assert_eq!(tok.decode(&[1, sp, sphi]), " hi");
    assert_eq!(tok.decode(&[1, spsp, hi]), " hi");
    // After a control token the prefix space is added again.
    assert_eq!(tok.encode_with_special("</s>hi", false, true), [2, sphi]);
    assert_eq!(tok.encode("", true), [1]);
    assert!(tok.encode("", false).is_empty());
}
