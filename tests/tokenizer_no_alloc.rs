//! Fixed memory: after boot (tokenizers loaded, one `EncodeScratch` and the output buffers made),
//! `Tokenizer::encode_into` and `ChatFormat::render_into` allocate nothing on the heap, and give
//! what the allocating `encode_with_special` / `render` give. A counting global allocator watches
//! 100 varied texts per tokenizer and 100 chat renderings (each then encoded as the daemon does,
//! `encode_chat_into`: control tokens only from the template's markers).
//! It runs without the libtest harness (`harness = false`), whose own threads may allocate.

mod common;

use leanstream::model::gguf::Gguf;
use leanstream::serve::alloc_count::{count_allocations, CountingAllocator};
use leanstream::tokenizer::{
    ChatFormat, ChatMessage, EncodeError, EncodeLimit, EncodeScratch, RenderError, Tokenizer,
};
use std::path::PathBuf;

#[global_allocator]
static GLOBAL: CountingAllocator = CountingAllocator;

const MAX_TEXT_BYTES: usize = 16 * 1024;
const MAX_IDS: usize = 16 * 1024;

const SEEDS: &[&str] = &[
    "Hello world",
    "The capital of France is Paris.",
    "  leading spaces and trailing   ",
    "Café, naïve, résumé, São Paulo, Ærøskøbing, Łódź",
    "Привет, мир! Как дела?",
    "日本語のテキストと中文文本，还有한국어 문장.",
    "emoji: 🦙🔥👍🏽 👨‍👩‍👧‍👦 ✨ and flags 🇫🇷🇯🇵",
    "digits 0123456789 1,234,567.89 3.14159 2024-06-01 ½ ² ٣",
    "fn main() {\n    let x: Vec<u32> = (0..10).map(|i| i * 2).collect();\n    println!(\"{x:?}\");\n}\n",
    "def f(a, b=2):\n\treturn a ** b  # comment\n\n\nprint(f(3))",
    "\n\n\n   \t\t  \r\n  \u{3000} \u{a0} whitespace runs     end",
    "I'm sure they'll say it's what we've done, isn't it? I'M SURE THEY'LL",
    "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
    "text with <|endoftext|> in the middle and <s> and </s> and [INST]",
    "<<SYS>> system <</SYS>> <unk> <|im_end|><|im_end|>",
    "a",
    " ",
    "",
    "https://example.com/path?query=1&other=%20x#frag",
    "मैं हिंदी बोलता हूँ। ภาษาไทย العربية עברית",
    "\u{1f600}\u{1f600}\u{1f600}aaa\u{1f600}   \u{200d}\u{fe0f}",
    "ǅungla ǈ ǋ ΐΰ ﬃ ﬀ",
    "!!!???...,,,;;;:::---___+++===***&&&%%%$$$###@@@",
    "   \n   \n   x",
];

/// 100 different texts: every seed, then seeds joined and repeated in different ways.
fn texts() -> Vec<String> {
    let mut v: Vec<String> = SEEDS.iter().map(|s| s.to_string()).collect();
    let n = SEEDS.len();
    let mut k = 0;
    while v.len() < 100 {
        let a = SEEDS[k % n];
        let b = SEEDS[(k * 7 + 3) % n];
        let t = match k % 4 {
            0 => format!("{a} {b}"),
            1 => format!("{a}\n{b}{k}"),
            2 => a.repeat(2 + k % 5),
            _ => format!("{b}<|im_start|>{a}<|im_end|>{}", k * 31),
        };
        if !v.contains(&t) {
            v.push(t);
        }
        k += 1;
    }
    v
}

struct Vocab {
    label: &'static str,
    tok: Tokenizer,
    format: ChatFormat,
}

fn load(label: &'static str, path: Option<PathBuf>, fallback: ChatFormat) -> Option<Vocab> {
    let path = path?;
    let g = Gguf::open(&path).expect("open gguf");
    let tok = Tokenizer::from_gguf(&g).expect("tokenizer from gguf");
    let format = match g.get_str("tokenizer.chat_template") {
        Some(t) => ChatFormat::detect(Some(t)).expect("chat template"),
        None => fallback,
    };
    eprintln!("{label}: {:?}, chat format {format:?}", tok);
    Some(Vocab { label, tok, format })
}

/// Encodes every text (alternating `add_bos` and `parse_special`) into one scratch and one
/// output buffer, counting the allocations; returns how many results differ from `encode*`.
fn check_encode(v: &Vocab, texts: &[String], scratch: &mut EncodeScratch, out: &mut [u32]) {
    let want: Vec<Vec<u32>> = texts
        .iter()
        .enumerate()
        .map(|(i, t)| v.tok.encode_with_special(t, i % 2 == 0, i % 3 == 0))
        .collect();
    // encode (no special parsing) is the same function as encode_with_special(.., false).
    assert_eq!(v.tok.encode(&texts[4], true), want[4]); // text 4: add_bos, no parse_special
    let mut total_ids = 0usize;
    let ((bad, errors), allocs) = count_allocations(|| {
        let mut bad = 0usize;
        let mut errors = 0usize;
        for (i, t) in texts.iter().enumerate() {
            match v.tok.encode_into(t, i % 2 == 0, i % 3 == 0, scratch, out) {
                Ok(n) => {
                    total_ids += n;
                    if out[..n] != want[i][..] {
                        bad += 1;
                    }
                }
                Err(_) => errors += 1,
            }
        }
        (bad, errors)
    });
    eprintln!(
        "{}: encode_into of {} texts ({total_ids} ids): {bad} mismatches, {errors} errors, {allocs} allocations",
        v.label,
        texts.len()
    );
    assert_eq!(errors, 0, "{}: encode_into failed", v.label);
    assert_eq!(bad, 0, "{}: encode_into differs from encode", v.label);
    assert_eq!(allocs, 0, "{}: encode_into allocated", v.label);

    // Too small a scratch or output: errors, not panics nor allocations.
    let long = &texts[8];
    let mut small = EncodeScratch::new(4);
    let needed = v.tok.encode(long, false).len();
    let ((e1, e2), allocs) = count_allocations(|| {
        let e1 = v.tok.encode_into(long, false, false, &mut small, out);
        let e2 = v
            .tok
            .encode_into(long, false, false, scratch, &mut out[..3]);
        (e1, e2)
    });
    assert_eq!(
        e1,
        Err(EncodeError::TooLong {
            what: EncodeLimit::TextBytes,
            needed: long.len(),
            limit: 4
        })
    );
    assert_eq!(
        e2,
        Err(EncodeError::TooLong {
            what: EncodeLimit::OutputIds,
            needed,
            limit: 3
        })
    );
    assert_eq!(allocs, 0, "{}: the error paths allocated", v.label);
}

/// Renders 100 conversations (ChatML, Llama 2 and Llama 3 formats) into a fixed buffer and
/// encodes each prompt with `encode_chat_into`, counting the allocations.
fn check_chat(
    v: &Vocab,
    texts: &[String],
    scratch: &mut EncodeScratch,
    out: &mut [u32],
    prompt: &mut [u8],
) {
    let formats = [v.format.clone(), ChatFormat::Llama2, ChatFormat::Llama3];
    let roles = ["system", "user", "assistant", "user", "tool", "user"];
    // Conversation i: format i % 3, messages i % 5 + 1 taken from the texts.
    let convs: Vec<(usize, Vec<ChatMessage>, bool)> = (0..100)
        .map(|i| {
            let n = i % 5 + 1;
            let msgs = (0..n)
                .map(|j| ChatMessage {
                    role: roles[(i + j) % roles.len()],
                    content: &texts[(i * 3 + j * 11) % texts.len()],
                })
                .collect();
            (i % 3, msgs, i % 4 != 3)
        })
        .collect();
    let want: Vec<(String, Vec<u32>)> = convs
        .iter()
        .map(|(f, msgs, gen)| {
            v.tok
                .encode_chat(&formats[*f], msgs, *gen, v.tok.add_bos_default())
        })
        .collect();
    let (bad, allocs) = count_allocations(|| {
        let mut bad = 0usize;
        for (i, (f, msgs, gen)) in convs.iter().enumerate() {
            let Ok(len) = formats[*f].render_into(msgs, *gen, prompt) else {
                bad += 1;
                continue;
            };
            if &prompt[..len] != want[i].0.as_bytes() {
                bad += 1;
                continue;
            }
            let Ok(text) = std::str::from_utf8(&prompt[..len]) else {
                bad += 1;
                continue;
            };
            match v.tok.encode_chat_into(
                &formats[*f],
                msgs,
                *gen,
                text,
                v.tok.add_bos_default(),
                scratch,
                out,
            ) {
                Ok(n) if out[..n] == want[i].1[..] => {}
                _ => bad += 1,
            }
        }
        bad
    });
    eprintln!(
        "{}: render_into + encode_chat_into of 100 chat prompts: {bad} mismatches, {allocs} allocations",
        v.label
    );
    assert_eq!(bad, 0, "{}: render_into/encode_into differ", v.label);
    assert_eq!(allocs, 0, "{}: chat rendering allocated", v.label);

    let (r, allocs) =
        count_allocations(|| formats[0].render_into(&convs[1].1, true, &mut prompt[..5]));
    let needed = formats[0].render(&convs[1].1, true).len();
    assert_eq!(r, Err(RenderError::TooLong { needed, limit: 5 }));
    assert_eq!(allocs, 0);
}

fn main() {
    let vocabs: Vec<Vocab> = [
        load(
            "smollm2",
            common::model(common::SMOLLM2),
            ChatFormat::ChatMl {
                default_system: None,
            },
        ),
        load(
            "qwen2.5",
            common::model(common::QWEN05),
            ChatFormat::ChatMl {
                default_system: None,
            },
        ),
        load(
            "llama-spm",
            common::shared("data/tokenizer-fixtures/ggml-vocab-llama-spm.gguf"),
            ChatFormat::Llama2,
        ),
    ]
    .into_iter()
    .flatten()
    .collect();
    if vocabs.is_empty() {
        eprintln!(
            "skipped: no tokenizer found (none of SmolLM2, Qwen2.5, llama-spm): nothing checked"
        );
        return;
    }
    let texts = texts();
    assert_eq!(texts.len(), 100);
    for t in &texts {
        assert!(t.len() <= MAX_TEXT_BYTES);
    }
    // Boot: one scratch and one output buffer for every tokenizer and request.
    let mut scratch = EncodeScratch::new(MAX_TEXT_BYTES);
    let mut out = vec![0u32; MAX_IDS];
    let mut prompt = vec![0u8; 64 * 1024];
    eprintln!("scratch: {scratch:?}");
    for v in &vocabs {
        check_encode(v, &texts, &mut scratch, &mut out);
        check_chat(v, &texts, &mut scratch, &mut out, &mut prompt);
    }
    eprintln!(
        "tokenizer_no_alloc: {} tokenizer(s) checked, no allocations",
        vocabs.len()
    );
}
