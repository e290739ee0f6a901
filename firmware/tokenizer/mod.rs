//! Tokenizers: byte-level BPE (GPT-2 style, `tokenizer.ggml.model = "gpt2"`), SentencePiece-style BPE
//! (`"llama"`), llama2.c `tok*.bin` vocabularies, and chat templates ([`chat`]).
//!
//! The algorithms follow llama.cpp (src/llama-vocab.cpp, src/unicode.cpp) so that token ids agree
//! with its conformance vectors:
//! - byte-level BPE: text is split into chunks by the pre-tokenizer selected by
//!   `tokenizer.ggml.pre` ([`PreTokenizer`]), each chunk's bytes are mapped to chars by the GPT-2
//!   byte->unicode map and merged pairwise by merge rank (lowest first, leftmost on ties);
//! - SentencePiece BPE: spaces become `▁`, one `▁` is prepended (`add_space_prefix`), chars are
//!   merged pairwise by the highest score of the merged piece, and chars left without a token fall
//!   back to `<0xXX>` byte tokens;
//! - llama2.c: the same score-driven merge with a dummy-prefix space and no `▁` escaping.
//!
//! Control tokens (`<|im_start|>`, `<s>`, ...) in text are parsed as such only when asked
//! ([`Tokenizer::encode_with_special`]); user-defined tokens are always matched, as in llama.cpp.

pub mod chat;
mod decode;
mod encode;
mod merge;
mod pretok;
mod unicode;
mod unicode_tables;
mod vocab;

pub use chat::{ChatFormat, ChatMessage, RenderError};
pub use encode::{EncodeError, EncodeLimit, EncodeScratch};
pub use pretok::PreTokenizer;
pub use vocab::{TokenType, VocabSpec};

use std::collections::HashMap;
use std::fmt;
use std::path::Path;

use vocab::FxBuild;

/// Why a tokenizer could not be built or a chat template not used.
#[derive(Debug)]
pub enum TokenizerError {
    /// A required GGUF key is absent or of the wrong type.
    MissingKey(&'static str),
    /// `tokenizer.ggml.model` names a tokenizer this crate does not implement.
    UnsupportedModel(String),
    /// `tokenizer.ggml.pre` names a pre-tokenizer this crate does not implement.
    UnsupportedPreTokenizer(String),
    /// The vocabulary is inconsistent (array lengths, ids out of range, ...).
    InvalidVocab(String),
    /// A llama2.c tokenizer file ended inside entry `entry` (0-based), or before its header.
    Llama2cTruncated { path: String, entry: usize },
    /// A file could not be read.
    Io {
        path: String,
        source: std::io::Error,
    },
    /// `tokenizer.chat_template` is not one of the formats [`ChatFormat`] knows.
    UnsupportedChatTemplate(String),
}

impl fmt::Display for TokenizerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TokenizerError::MissingKey(k) => {
                write!(f, "tokenizer key '{k}' missing or of the wrong type")
            }
            TokenizerError::UnsupportedModel(m) => write!(f, "unsupported tokenizer model '{m}'"),
            TokenizerError::UnsupportedPreTokenizer(p) => {
                write!(f, "unsupported pre-tokenizer '{p}'")
            }
            TokenizerError::InvalidVocab(why) => write!(f, "invalid tokenizer vocabulary: {why}"),
            TokenizerError::Llama2cTruncated { path, entry } => {
                write!(
                    f,
                    "llama2.c tokenizer file {path} truncated at entry {entry}"
                )
            }
            TokenizerError::Io { path, source } => {
                write!(f, "cannot read tokenizer file {path}: {source}")
            }
            TokenizerError::UnsupportedChatTemplate(t) => {
                write!(f, "chat template not supported: {t}")
            }
        }
    }
}

impl std::error::Error for TokenizerError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            TokenizerError::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// Which merge algorithm the vocabulary uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Algo {
    /// Byte-level BPE with ranked merges.
    Bpe {
        pre: PreTokenizer,
        ignore_merges: bool,
    },
    /// SentencePiece BPE by score, with `▁` for spaces.
    Spm,
    /// llama2.c: BPE by score on raw text with a dummy-prefix space.
    Llama2c,
}

/// A loaded vocabulary with its encoder and decoder.
pub struct Tokenizer {
    algo: Algo,
    /// Token text as stored in the vocabulary -> id (the last id wins on duplicates, as in llama.cpp).
    token_to_id: HashMap<Box<[u8]>, u32, FxBuild>,
    scores: Vec<f32>,
    types: Vec<TokenType>,
    /// Decoded bytes of every token: `pieces[piece_off[i]..piece_off[i + 1]]`.
    pieces: Vec<u8>,
    piece_off: Vec<u32>,
    /// Byte-level BPE: (left id, right id) -> (rank, merged id).
    merges: HashMap<(u32, u32), (u32, u32), FxBuild>,
    /// Byte-level BPE: the token of each byte's mapped char.
    byte_char_token: [Option<u32>; 256],
    /// SPM / llama2.c: the `<0xXX>` token of each byte.
    byte_token: [Option<u32>; 256],
    /// Tokens matched literally in text: (id, text, is user-defined), longest text first.
    specials: Vec<(u32, Box<[u8]>, bool)>,
    bos: Option<u32>,
    eos: Option<u32>,
    eog: Vec<u32>,
    add_bos: bool,
    add_space_prefix: bool,
    /// SPM / llama2.c: the word separator at which text may be cut before merging (see
    /// `score_merge`), if the vocabulary allows it.
    word_sep: Option<Box<[u8]>>,
}

impl fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tokenizer")
            .field("algo", &self.algo)
            .field("vocab_size", &self.vocab_size())
            .field("bos", &self.bos)
            .field("eos", &self.eos)
            .field("add_bos", &self.add_bos)
            .finish_non_exhaustive()
    }
}

// `Full`, the fixed-buffer helpers, `IdSink` and `find` are shared by `encode` and `merge` (and
// `Full` by `pretok`): in either child the two would depend on each other.

/// A fixed-capacity buffer ran out of room (internal; [`Tokenizer::encode_into`] reports it as
/// [`EncodeError::TooLong`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Full;

/// Pushes `v` onto `buf` only if that cannot reallocate.
fn push_fixed<T>(buf: &mut Vec<T>, v: T) -> Result<(), Full> {
    if buf.len() < buf.capacity() {
        buf.push(v);
        Ok(())
    } else {
        Err(Full)
    }
}

/// Appends `bytes` to `buf` only if that cannot reallocate.
fn extend_fixed(buf: &mut Vec<u8>, bytes: &[u8]) -> Result<(), Full> {
    if buf.capacity() - buf.len() >= bytes.len() {
        buf.extend_from_slice(bytes);
        Ok(())
    } else {
        Err(Full)
    }
}

/// Where encoded ids go: `out` while it has room; past it only counted, so that the error can say
/// how many ids the text needs.
struct IdSink<'o> {
    out: &'o mut [u32],
    n: usize,
}

impl IdSink<'_> {
    fn push(&mut self, id: u32) {
        if let Some(slot) = self.out.get_mut(self.n) {
            *slot = id;
        }
        self.n += 1;
    }
}

impl Tokenizer {
    /// Builds the tokenizer of a GGUF file's `tokenizer.*` metadata.
    pub fn from_gguf(g: &crate::model::gguf::Gguf) -> Result<Tokenizer, TokenizerError> {
        Tokenizer::from_spec(VocabSpec::from_gguf(g)?)
    }

    /// Builds the tokenizer from plain vocabulary data (what `from_gguf` reads).
    pub fn from_spec(spec: VocabSpec) -> Result<Tokenizer, TokenizerError> {
        vocab::build(spec)
    }

    /// Loads a llama2.c tokenizer file (`tok*.bin`: i32 max_token_length, then per token an f32
    /// score, an i32 byte length and the bytes) with `vocab_size` entries.
    pub fn from_llama2c(path: &Path, vocab_size: usize) -> Result<Tokenizer, TokenizerError> {
        vocab::load_llama2c(path, vocab_size)
    }

    /// As [`from_llama2c`](Self::from_llama2c), from the file's bytes held in memory.
    pub fn from_llama2c_bytes(data: &[u8], vocab_size: usize) -> Result<Tokenizer, TokenizerError> {
        vocab::parse_llama2c(data, vocab_size, "(llama2.c tokenizer in memory)".into())
    }

    fn lookup(&self, bytes: &[u8]) -> Option<u32> {
        self.token_to_id.get(bytes).copied()
    }

    /// The beginning-of-sequence token, if the vocabulary has one.
    pub fn bos(&self) -> Option<u32> {
        self.bos
    }

    /// The end-of-sequence token, if the vocabulary has one.
    pub fn eos(&self) -> Option<u32> {
        self.eos
    }

    /// Whether generation stops at `id`: EOS, EOT/EOM, and the tokens llama.cpp treats so by their
    /// text (`<|im_end|>`, `<|endoftext|>`, `<|eot_id|>`, `<|end|>`, `<end_of_turn>`, ...).
    pub fn is_end_of_generation(&self, id: u32) -> bool {
        self.eog.contains(&id)
    }

    /// Whether the model expects BOS at the start of a prompt (`tokenizer.ggml.add_bos_token`).
    pub fn add_bos_default(&self) -> bool {
        self.add_bos
    }

    /// The number of tokens in the vocabulary.
    pub fn vocab_size(&self) -> usize {
        self.types.len()
    }

    /// The id of the token whose vocabulary text is `text` (as stored: e.g. `<|im_end|>`, or `Ġthe`
    /// in byte-level BPE, `▁the` in SentencePiece).
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.lookup(text.as_bytes())
    }

    /// The vocabulary text of token `id` if it is one matched literally in text (control,
    /// user-defined or unknown, e.g. `<s>`, `<|im_end|>`); these may decode to no bytes.
    pub fn special_text(&self, id: u32) -> Option<&[u8]> {
        self.specials
            .iter()
            .find(|(i, ..)| *i == id)
            .map(|(_, t, _)| &t[..])
    }

    /// The type of token `id` (normal, control, byte, ...).
    pub fn token_type(&self, id: u32) -> Option<TokenType> {
        self.types.get(id as usize).copied()
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.len() > hay.len() {
        return None;
    }
    let first = needle[0];
    let mut i = 0;
    while i + needle.len() <= hay.len() {
        match hay[i..=hay.len() - needle.len()]
            .iter()
            .position(|&b| b == first)
        {
            None => return None,
            Some(p) => {
                i += p;
                if &hay[i..i + needle.len()] == needle {
                    return Some(i);
                }
                i += 1;
            }
        }
    }
    None
}
