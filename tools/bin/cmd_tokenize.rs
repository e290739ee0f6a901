//! `leanstream tokenize`: the token ids a prompt becomes (as llama.cpp's `llama-tokenize` prints
//! them), or the text of given ids, to check the tokenizer against another tool without tracing
//! the engine.

use clap::Args;
use leanstream::load::open_model;
use leanstream::tokenizer::Tokenizer;
use std::fmt::Write as _;
use std::path::PathBuf;

#[derive(Args)]
pub struct TokenizeArgs {
    /// GGUF file or llama2.c checkpoint (only its tokenizer is used).
    #[arg(long)]
    model: PathBuf,
    /// Tokenizer file for a llama2.c checkpoint (tok*.bin; default: one beside the model).
    #[arg(long)]
    tokenizer: Option<PathBuf>,
    /// The text to tokenize.
    #[arg(long, allow_hyphen_values = true, conflicts_with_all = ["file", "decode"])]
    text: Option<String>,
    /// A file whose text (UTF-8) to tokenize.
    #[arg(long, conflicts_with = "decode")]
    file: Option<PathBuf>,
    /// Print the text of these token ids (comma-separated) instead.
    #[arg(long, value_delimiter = ',', num_args = 1)]
    decode: Vec<String>,
    /// Print only the list of ids, as `[1, 2, 3]`.
    #[arg(long)]
    ids: bool,
    /// Parse control-token text (`<|im_start|>`, `<s>`, ...) as control tokens (off: encoded as
    /// plain text, as the daemon encodes prompts and chat messages).
    #[arg(long)]
    special: bool,
    /// Do not add BOS (default: as `generate` would, the model's `add_bos_token`, and always
    /// for an empty text).
    #[arg(long)]
    no_bos: bool,
}

pub fn cmd_tokenize(a: TokenizeArgs) -> Result<String, String> {
    let (_, tok) = open_model(&a.model, a.tokenizer.as_deref())?;
    if !a.decode.is_empty() {
        let ids = parse_ids(&a.decode, tok.vocab_size())?;
        return Ok(format!("{}\n", tok.decode(&ids)));
    }
    let text = match (&a.text, &a.file) {
        (Some(t), None) => t.clone(),
        (None, Some(f)) => {
            let bytes = std::fs::read(f).map_err(|e| format!("{}: {e}", f.display()))?;
            String::from_utf8(bytes)
                .map_err(|e| format!("{}: not UTF-8 text ({e})", f.display()))?
        }
        _ => {
            return Err("give the text with --text TEXT or --file F (or ids with --decode)".into())
        }
    };
    let add_bos = !a.no_bos && (tok.add_bos_default() || text.is_empty());
    let ids = tok.encode_with_special(&text, add_bos, a.special);
    Ok(if a.ids {
        let list: Vec<String> = ids.iter().map(u32::to_string).collect();
        format!("[{}]\n", list.join(", "))
    } else {
        let mut out = String::new();
        for &id in &ids {
            let _ = writeln!(out, "{id}\t'{}'", piece(&tok, id));
        }
        out
    })
}

/// `1,2,3` (spaces allowed) as ids of a vocabulary of `vocab` tokens.
fn parse_ids(parts: &[String], vocab: usize) -> Result<Vec<u32>, String> {
    parts
        .iter()
        .map(|p| {
            let p = p
                .trim()
                .trim_start_matches('[')
                .trim_end_matches(']')
                .trim();
            let id: u32 = p
                .parse()
                .map_err(|_| format!("--decode: '{p}' is not a token id"))?;
            if id as usize >= vocab {
                return Err(format!(
                    "--decode: id {id} is outside the vocabulary of {vocab} tokens"
                ));
            }
            Ok(id)
        })
        .collect()
}

/// The text of token `id` for a listing: its bytes (invalid UTF-8 as `\xNN`, control chars
/// escaped, so a token is one line), or its vocabulary text for tokens that decode to nothing
/// (control tokens such as `<|im_end|>`; `<s>` and `</s>` for llama2.c's BOS and EOS).
fn piece(tok: &Tokenizer, id: u32) -> String {
    let bytes = tok.token_bytes(id);
    if bytes.is_empty() {
        if let Some(t) = tok.special_text(id) {
            return escape(t);
        }
        // llama2.c vocabularies list no control tokens: BOS and EOS by their usual names.
        if Some(id) == tok.bos() {
            return "<s>".into();
        }
        if Some(id) == tok.eos() {
            return "</s>".into();
        }
    }
    escape(bytes)
}

fn escape(bytes: &[u8]) -> String {
    let mut out = String::new();
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            match c {
                '\n' => out.push_str("\\n"),
                '\t' => out.push_str("\\t"),
                '\r' => out.push_str("\\r"),
                '\\' => out.push_str("\\\\"),
                c if c.is_control() => {
                    let _ = write!(out, "\\u{{{:x}}}", c as u32);
                }
                c => out.push(c),
            }
        }
        for b in chunk.invalid() {
            let _ = write!(out, "\\x{b:02x}");
        }
    }
    out
}
