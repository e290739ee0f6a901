//! Tokenizers of the real models and of the llama2.c vocabulary: sensible ids, special tokens,
//! end-of-generation tokens, chat templates from the GGUF, and encoding speed on WikiText-2.

mod common;

use std::path::Path;
use std::time::Instant;

use leanstream::model::gguf::Gguf;
use leanstream::tokenizer::{ChatFormat, ChatMessage, Tokenizer, TokenizerError};

fn load(path: &Path) -> (Gguf, Tokenizer) {
    let g = Gguf::open(path).expect("open gguf");
    let t = Tokenizer::from_gguf(&g).expect("tokenizer from gguf");
    (g, t)
}

#[test]
fn smollm2_tokenizes_a_prompt() {
    let Some(path) = common::model("SmolLM2-135M-Instruct.Q4_1.gguf") else {
        return;
    };
    let (g, tok) = load(&path);
    assert_eq!(g.get_str("tokenizer.ggml.pre"), Some("smollm"));
    assert_eq!(tok.vocab_size(), 49152);
    assert!(!tok.add_bos_default());
    let ids = tok.encode("The capital of France is", false);
    let pieces: Vec<String> = ids
        .iter()
        .map(|&i| String::from_utf8_lossy(tok.token_bytes(i)).into_owned())
        .collect();
    eprintln!("smollm2: {ids:?} = {pieces:?}");
    assert_eq!(pieces, ["The", " capital", " of", " France", " is"]);
    assert_eq!(tok.decode(&ids), "The capital of France is");
    // Digits are split one by one (the `smollm` pre-tokenizer).
    assert_eq!(tok.encode("2024", false).len(), 4);
    // Special tokens: literal text unless asked.
    let im_start = tok.token_id("<|im_start|>").expect("<|im_start|>");
    let im_end = tok.token_id("<|im_end|>").expect("<|im_end|>");
    assert_eq!(
        tok.encode_with_special("<|im_start|>user", false, true)[0],
        im_start
    );
    assert!(!tok.encode("<|im_start|>user", false).contains(&im_start));
    assert!(tok.is_end_of_generation(im_end));
    assert!(tok.is_end_of_generation(tok.token_id("<|endoftext|>").unwrap()));
    assert!(!tok.is_end_of_generation(im_start));
    assert_eq!(
        tok.token_bytes(im_end),
        b"",
        "control tokens decode to nothing"
    );
    // Its chat template injects a default system prompt.
    let fmt = ChatFormat::detect(g.get_str("tokenizer.chat_template")).expect("chat template");
    let prompt = fmt.render(
        &[ChatMessage {
            role: "user",
            content: "Hi",
        }],
        true,
    );
    assert_eq!(
        prompt,
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n\
         <|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    );
    let ids = tok.encode_with_special(&prompt, false, true);
    assert_eq!(ids[0], im_start);
    assert_eq!(
        tok.decode(&ids),
        prompt.replace("<|im_start|>", "").replace("<|im_end|>", "")
    );
}

#[test]
fn qwen25_special_tokens_and_template() {
    let Some(path) = common::model("qwen2.5-coder-0.5b-instruct.gguf") else {
        return;
    };
    let (g, tok) = load(&path);
    assert_eq!(g.get_str("tokenizer.ggml.pre"), Some("qwen2"));
    assert_eq!(tok.eos(), Some(151645));
    assert_eq!(tok.bos(), Some(151643));
    assert!(!tok.add_bos_default());
    assert!(tok.is_end_of_generation(151645) && tok.is_end_of_generation(151643));
    assert_eq!(
        tok.encode_with_special("<|im_start|>user\nhi<|im_end|>", false, true)[0],
        151644
    );
    // User-defined tokens are matched even without parse_special (as llama.cpp).
    assert_eq!(tok.encode("<tool_call>", false), [151657]);
    let fmt = ChatFormat::detect(g.get_str("tokenizer.chat_template")).expect("chat template");
    let msgs = [ChatMessage {
        role: "user",
        content: "Write hello world in C.",
    }];
    assert_eq!(
        fmt.render(&msgs, true),
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n\
         <|im_start|>user\nWrite hello world in C.<|im_end|>\n<|im_start|>assistant\n"
    );
}

#[test]
fn llama2c_vocab_decodes_the_reference_story() {
    let Some(tok_path) = common::shared("data/stories260K/tok512.bin") else {
        return;
    };
    let Some(greedy) = common::shared("data/stories260K/greedy_tokens.txt") else {
        return;
    };
    let tok = Tokenizer::from_llama2c(&tok_path, 512).expect("tok512.bin");
    assert_eq!(
        (tok.bos(), tok.eos(), tok.vocab_size()),
        (Some(1), Some(2), 512)
    );
    let text = std::fs::read_to_string(greedy).unwrap();
    let ids: Vec<u32> = text
        .lines()
        .filter(|l| !l.starts_with('#'))
        .flat_map(|l| l.split_whitespace().map(|t| t.parse::<u32>().unwrap()))
        .collect();
    assert_eq!(ids[0], 1);
    let story = tok.decode(&ids);
    eprintln!("stories260K greedy: {story:?}");
    assert!(story.starts_with("Once upon a time"), "{story:?}");
    // Encoding: BOS, dummy-prefix space merged into the first word, and back.
    let enc = tok.encode("Once upon a time, there was a little girl.", true);
    assert_eq!(enc[0], 1);
    assert_eq!(
        tok.decode(&enc),
        "Once upon a time, there was a little girl."
    );
    // Unknown chars fall back to byte tokens and still round-trip.
    let enc = tok.encode("naïve 🦙", false);
    assert_eq!(tok.decode(&enc), "naïve 🦙");
}

#[test]
fn llama2c_truncated_file_is_an_error() {
    let Some(tok_path) = common::shared("data/stories260K/tok512.bin") else {
        return;
    };
    let data = std::fs::read(tok_path).unwrap();
    let dir = std::env::temp_dir().join(format!("leanstream-tok-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cut = dir.join("tok512-cut.bin");
    // Header (4) + 17 entries of "<0xXX>"-sized or shorter pieces lie within the first 200 bytes;
    // cut in the middle of a later entry.
    std::fs::write(&cut, &data[..200]).unwrap();
    let err = Tokenizer::from_llama2c(&cut, 512).unwrap_err();
    let msg = err.to_string();
    assert!(
        matches!(err, TokenizerError::Llama2cTruncated { .. }),
        "{msg}"
    );
    assert!(msg.contains("truncated at entry"), "{msg}");
    let err = Tokenizer::from_llama2c(&dir.join("absent.bin"), 512).unwrap_err();
    assert!(
        err.to_string().contains("cannot read tokenizer file"),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

fn time_wikitext(label: &str, tok: &Tokenizer, text: &str) {
    let t0 = Instant::now();
    let ids = tok.encode(text, false);
    let dt = t0.elapsed();
    eprintln!(
        "{label}: {} bytes -> {} tokens in {:.2?}",
        text.len(),
        ids.len(),
        dt
    );
    assert_eq!(tok.decode(&ids), text, "{label}: wikitext round trip");
    // Generous bound for debug-ish CI builds; release is well under a second per model.
    assert!(
        dt.as_secs_f64() < 20.0,
        "{label}: encoding too slow: {dt:?}"
    );
}

#[test]
fn wikitext_encodes_quickly() {
    let Some(wiki) = common::shared("data/wikitext-2/wiki.test.raw") else {
        return;
    };
    let text = std::fs::read_to_string(wiki).unwrap();
    if let Some(path) = common::model("SmolLM2-135M-Instruct.Q4_1.gguf") {
        time_wikitext("smollm2", &load(&path).1, &text);
    }
    if let Some(path) = common::model("qwen2.5-coder-0.5b-instruct.gguf") {
        time_wikitext("qwen2.5", &load(&path).1, &text);
    }
    if let Some(path) = common::shared("data/tokenizer-fixtures/ggml-vocab-llama-spm.gguf") {
        time_wikitext("llama-spm", &load(&path).1, &text);
    }
}
