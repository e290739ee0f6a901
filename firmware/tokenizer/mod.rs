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
mod pretok;
mod unicode;
mod unicode_tables;
mod vocab;

pub use chat::{ChatFormat, ChatMessage, RenderError};
pub use pretok::PreTokenizer;
pub use vocab::{TokenType, VocabSpec};

use std::collections::{BinaryHeap, HashMap};
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

/// Which buffer of [`Tokenizer::encode_into`] was too small.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EncodeLimit {
    /// The text is longer (in bytes) than the [`EncodeScratch`] was made for.
    TextBytes,
    /// The ids do not fit in `out`.
    OutputIds,
}

/// Why [`Tokenizer::encode_into`] could not encode a text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EncodeError {
    /// `what` needs `needed` (bytes of text, or ids) but holds only `limit`. For
    /// [`EncodeLimit::OutputIds`], `needed` is the exact number of ids the text encodes to.
    TooLong {
        what: EncodeLimit,
        needed: usize,
        limit: usize,
    },
}

impl fmt::Display for EncodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EncodeError::TooLong {
                what: EncodeLimit::TextBytes,
                needed,
                limit,
            } => write!(
                f,
                "text of {needed} bytes is longer than the {limit} bytes the encoder scratch holds"
            ),
            EncodeError::TooLong {
                what: EncodeLimit::OutputIds,
                needed,
                limit,
            } => write!(f, "text encodes to {needed} ids, the output holds {limit}"),
        }
    }
}

impl std::error::Error for EncodeError {}

/// Every buffer [`Tokenizer::encode_into`] works in, allocated once for texts of up to
/// `max_text_bytes` bytes (about 95 bytes of memory per byte of text, see [`EncodeScratch::new`]),
/// so that encoding never allocates. One scratch serves any tokenizer.
pub struct EncodeScratch {
    max_text_bytes: usize,
    /// Byte-level BPE: the chars of a text fragment (at most one per byte).
    chars: Vec<char>,
    /// Byte-level BPE: the pre-tokenizer chunk lengths, in chars (at most one per char).
    splits: Vec<u32>,
    /// SentencePiece / llama2.c: a fragment with `▁` for spaces and the prefix space (at most 3
    /// bytes per byte, plus 3); byte-level BPE with `ignore_merges`: a chunk's mapped chars (at
    /// most 2 bytes per byte).
    text: Vec<u8>,
    /// The symbols being merged (at most one per byte, plus the prefix).
    syms: Vec<Sym>,
    /// Pending merges (at most two per symbol: one per initial pair, one more per merge).
    heap: BinaryHeap<HeapEntry>,
    /// Fragments of the text between literal special tokens, and the next pass's (at most one per
    /// byte, plus one).
    frags: Vec<Frag>,
    frags_next: Vec<Frag>,
}

impl fmt::Debug for EncodeScratch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EncodeScratch")
            .field("max_text_bytes", &self.max_text_bytes)
            .field("bytes", &self.memory_bytes())
            .finish_non_exhaustive()
    }
}

impl EncodeScratch {
    /// Allocates the buffers for texts of up to `max_text_bytes` bytes: with n =
    /// `max_text_bytes`, n chars (4n bytes), n chunk lengths (4n), 3n + 4 text bytes, n + 2
    /// symbols (20 bytes each), 2n + 4 heap entries (20 bytes each) and twice n + 1 fragments (12
    /// bytes each): about 95n bytes.
    pub fn new(max_text_bytes: usize) -> EncodeScratch {
        let n = max_text_bytes;
        EncodeScratch {
            max_text_bytes: n,
            chars: Vec::with_capacity(n),
            splits: Vec::with_capacity(n),
            text: Vec::with_capacity(3 * n + 4),
            syms: Vec::with_capacity(n + 2),
            heap: BinaryHeap::with_capacity(2 * n + 4),
            frags: Vec::with_capacity(n + 1),
            frags_next: Vec::with_capacity(n + 1),
        }
    }

    /// The longest text (in bytes) this scratch encodes.
    pub fn max_text_bytes(&self) -> usize {
        self.max_text_bytes
    }

    /// The heap memory the scratch holds, in bytes.
    pub fn memory_bytes(&self) -> usize {
        use std::mem::size_of;
        self.chars.capacity() * size_of::<char>()
            + self.splits.capacity() * size_of::<u32>()
            + self.text.capacity()
            + self.syms.capacity() * size_of::<Sym>()
            + self.heap.capacity() * size_of::<HeapEntry>()
            + (self.frags.capacity() + self.frags_next.capacity()) * size_of::<Frag>()
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

#[derive(Clone, Copy)]
struct Sym {
    start: u32,
    len: u32,
    prev: u32,
    next: u32,
    id: u32,
}

const NONE: u32 = u32::MAX;
const NO_ID: u32 = u32::MAX;

/// Merges symbol `l` with its right neighbour in the linked list (the neighbour is emptied and
/// unlinked); returns the new right neighbour of `l`. Both BPE variants merge this way.
fn absorb_right(syms: &mut [Sym], l: u32) -> u32 {
    let li = l as usize;
    let ri = syms[li].next as usize;
    syms[li].len += syms[ri].len;
    syms[ri].len = 0;
    let rn = syms[ri].next;
    syms[li].next = rn;
    if rn != NONE {
        syms[rn as usize].prev = l;
    }
    rn
}

/// A pending merge, smallest first. Byte-level BPE: (rank, left, right, left id, right id), the
/// lowest rank, leftmost on ties. Score BPE: (!score key, left, !right, !merged length, 0), the
/// highest score (in `f32::total_cmp` order), leftmost on ties.
type HeapEntry = std::cmp::Reverse<(u32, u32, u32, u32, u32)>;

/// `x` as a u32 ordered as `f32::total_cmp` orders the floats.
fn score_key(x: f32) -> u32 {
    let bits = x.to_bits();
    // Negative floats: all bits flipped (larger magnitude sorts lower); others: sign bit set.
    if bits >> 31 == 1 {
        !bits
    } else {
        bits | 0x8000_0000
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

    /// Encodes `text`, prepending BOS when `add_bos` (and the vocabulary has one). Control tokens
    /// written in the text are encoded as plain text.
    pub fn encode(&self, text: &str, add_bos: bool) -> Vec<u32> {
        self.encode_with_special(text, add_bos, false)
    }

    /// As [`encode`](Self::encode); with `parse_special`, control tokens written in the text
    /// (`<|im_start|>`, `<|endoftext|>`, ...) become their ids. Allocates a scratch sized for the
    /// text and runs [`encode_into`](Self::encode_into).
    pub fn encode_with_special(&self, text: &str, add_bos: bool, parse_special: bool) -> Vec<u32> {
        let mut scratch = EncodeScratch::new(text.len());
        // Byte-level BPE gives at most one id per byte; the rare longer result is encoded again.
        let mut out = vec![0u32; text.len() + 2];
        loop {
            match self.encode_into(text, add_bos, parse_special, &mut scratch, &mut out) {
                Ok(n) => {
                    out.truncate(n);
                    return out;
                }
                Err(EncodeError::TooLong {
                    what: EncodeLimit::OutputIds,
                    needed,
                    ..
                }) => out.resize(needed, 0),
                Err(e) => unreachable!("scratch sized for the text: {e}"),
            }
        }
    }

    /// Renders `messages` in `format` and encodes the prompt as
    /// [`encode_chat_into`](Self::encode_chat_into) does (control tokens only from the template's
    /// markers), in buffers it allocates. Returns the rendered text and its ids.
    pub fn encode_chat(
        &self,
        format: &ChatFormat,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        add_bos: bool,
    ) -> (String, Vec<u32>) {
        let text = format.render(messages, add_generation_prompt);
        let mut scratch = EncodeScratch::new(text.len());
        let mut out = vec![0u32; text.len() + 2];
        loop {
            match self.encode_chat_into(
                format,
                messages,
                add_generation_prompt,
                &text,
                add_bos,
                &mut scratch,
                &mut out,
            ) {
                Ok(n) => {
                    out.truncate(n);
                    return (text, out);
                }
                Err(EncodeError::TooLong {
                    what: EncodeLimit::OutputIds,
                    needed,
                    ..
                }) => out.resize(needed, 0),
                Err(e) => unreachable!("scratch sized for the text: {e}"),
            }
        }
    }

    /// Encodes `text` into `out` without allocating, in the buffers of `scratch`, and returns the
    /// number of ids written (the same ids as
    /// [`encode_with_special`](Self::encode_with_special)). With `add_bos`, BOS comes first (if
    /// the vocabulary has one); with `parse_special`, control tokens written in the text become
    /// their ids.
    ///
    /// Errors: [`EncodeError::TooLong`] when the text is longer than `scratch` was made for
    /// (nothing is encoded), or when the ids do not fit in `out` (then `out` holds the first
    /// `out.len()` ids and `needed` says how many there are).
    pub fn encode_into(
        &self,
        text: &str,
        add_bos: bool,
        parse_special: bool,
        scratch: &mut EncodeScratch,
        out: &mut [u32],
    ) -> Result<usize, EncodeError> {
        Self::bounded(text.len(), scratch, out, |scratch, sink| {
            self.encode_all(text, add_bos, parse_special, scratch, sink)
        })
    }

    /// Runs `encode` for a text of `text_len` bytes into `out`, with the limits and errors of
    /// [`encode_into`](Self::encode_into): the text must fit `scratch`, and the ids `out`.
    fn bounded(
        text_len: usize,
        scratch: &mut EncodeScratch,
        out: &mut [u32],
        encode: impl FnOnce(&mut EncodeScratch, &mut IdSink) -> Result<(), Full>,
    ) -> Result<usize, EncodeError> {
        let too_long_text = EncodeError::TooLong {
            what: EncodeLimit::TextBytes,
            needed: text_len,
            limit: scratch.max_text_bytes,
        };
        // Offsets are u32 (the SentencePiece buffer holds up to 3 bytes per byte).
        if text_len > scratch.max_text_bytes || text_len > (u32::MAX / 4) as usize {
            return Err(too_long_text);
        }
        let limit = out.len();
        let mut sink = IdSink { out, n: 0 };
        encode(scratch, &mut sink).map_err(|Full| too_long_text)?;
        if sink.n > limit {
            return Err(EncodeError::TooLong {
                what: EncodeLimit::OutputIds,
                needed: sink.n,
                limit,
            });
        }
        Ok(sink.n)
    }

    /// Encodes a chat prompt: `rendered` is what [`ChatFormat::render_into`] wrote for
    /// `messages` and `add_generation_prompt`. Only the template's own markers (`<|im_start|>`,
    /// `<|im_end|>`, `<|eot_id|>`, ...) become control tokens; roles and message contents are
    /// encoded as plain text, so `<|im_end|>` written in a message is its characters and a client
    /// cannot forge a turn. Ids, limits and errors as [`encode_into`](Self::encode_into) (for a
    /// conversation whose contents hold no control-token text, the same ids as `encode_into` of
    /// `rendered` with `parse_special`); no allocation.
    ///
    /// If `rendered` is not the rendering of `messages` (a caller's mistake), it is encoded
    /// whole as plain text: never with control tokens taken from it.
    #[allow(clippy::too_many_arguments)]
    pub fn encode_chat_into(
        &self,
        format: &ChatFormat,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        rendered: &str,
        add_bos: bool,
        scratch: &mut EncodeScratch,
        out: &mut [u32],
    ) -> Result<usize, EncodeError> {
        let mut pos = 0;
        let mut same = true;
        format.walk(messages, add_generation_prompt, &mut |piece, _| {
            same =
                same && rendered.as_bytes().get(pos..pos + piece.len()) == Some(piece.as_bytes());
            pos += piece.len();
        });
        if !same || pos != rendered.len() {
            return self.encode_into(rendered, add_bos, false, scratch, out);
        }
        Self::bounded(rendered.len(), scratch, out, |scratch, sink| {
            if add_bos {
                if let Some(b) = self.bos {
                    sink.push(b);
                }
            }
            // The text between two markers that are control tokens is encoded as one fragment, as
            // `encode_into` would cut it (a marker the vocabulary lacks stays part of the text).
            let mut prev_special = true;
            let mut text_start = 0;
            let mut pos = 0;
            let mut result = Ok(());
            format.walk(messages, add_generation_prompt, &mut |piece, marker| {
                let start = pos;
                pos += piece.len();
                if !marker || result.is_err() {
                    return;
                }
                let Some(id) = self.control_id(piece) else {
                    return;
                };
                result = self.encode_fragments(
                    &rendered[text_start..start],
                    false,
                    &mut prev_special,
                    scratch,
                    sink,
                );
                sink.push(id);
                prev_special = true;
                text_start = pos;
            });
            result.and_then(|()| {
                self.encode_fragments(
                    &rendered[text_start..],
                    false,
                    &mut prev_special,
                    scratch,
                    sink,
                )
            })
        })
    }

    /// The id of the token whose text is `marker`, if it is one that `parse_special` matches
    /// (control, user-defined or unknown).
    fn control_id(&self, marker: &str) -> Option<u32> {
        let id = self.lookup(marker.as_bytes())?;
        matches!(
            self.token_type(id)?,
            TokenType::Control | TokenType::UserDefined | TokenType::Unknown
        )
        .then_some(id)
    }

    fn encode_all(
        &self,
        text: &str,
        add_bos: bool,
        parse_special: bool,
        scratch: &mut EncodeScratch,
        out: &mut IdSink,
    ) -> Result<(), Full> {
        if add_bos {
            if let Some(b) = self.bos {
                out.push(b);
            }
        }
        self.encode_fragments(text, parse_special, &mut true, scratch, out)
    }

    /// Encodes `text` cut at its literal special tokens (control ones only with
    /// `parse_special`); `prev_special` says whether a special token (or the start) comes right
    /// before, and is updated.
    fn encode_fragments(
        &self,
        text: &str,
        parse_special: bool,
        prev_special: &mut bool,
        scratch: &mut EncodeScratch,
        out: &mut IdSink,
    ) -> Result<(), Full> {
        self.partition(
            text.as_bytes(),
            parse_special,
            &mut scratch.frags,
            &mut scratch.frags_next,
        )?;
        for &frag in &scratch.frags {
            match frag {
                Frag::Token(id) => {
                    out.push(id);
                    *prev_special = true;
                }
                Frag::Text { start, end } => {
                    // Fragments are cut around valid UTF-8 tokens, so at char boundaries.
                    let s = text.get(start as usize..end as usize).ok_or(Full)?;
                    self.encode_text(
                        s,
                        *prev_special,
                        &mut scratch.chars,
                        &mut scratch.splits,
                        &mut scratch.text,
                        &mut Merge {
                            syms: &mut scratch.syms,
                            heap: &mut scratch.heap,
                        },
                        out,
                    )?;
                    *prev_special = false;
                }
            }
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn encode_text(
        &self,
        text: &str,
        prev_special: bool,
        chars: &mut Vec<char>,
        splits: &mut Vec<u32>,
        buf: &mut Vec<u8>,
        work: &mut Merge,
        out: &mut IdSink,
    ) -> Result<(), Full> {
        match self.algo {
            Algo::Bpe { pre, ignore_merges } => {
                chars.clear();
                for c in text.chars() {
                    push_fixed(chars, c)?;
                }
                splits.clear();
                pre.split_into(chars, splits)?;
                let mut byte_at = 0;
                let mut char_at = 0;
                for &len in splits.iter() {
                    let len = len as usize;
                    let nbytes: usize = chars[char_at..char_at + len]
                        .iter()
                        .map(|c| c.len_utf8())
                        .sum();
                    self.bpe_word(
                        &text.as_bytes()[byte_at..byte_at + nbytes],
                        ignore_merges,
                        buf,
                        work,
                        out,
                    )?;
                    char_at += len;
                    byte_at += nbytes;
                }
            }
            Algo::Spm => {
                buf.clear();
                if self.add_space_prefix && prev_special {
                    extend_fixed(buf, "▁".as_bytes())?;
                }
                let mut utf8 = [0u8; 4];
                for c in text.chars() {
                    let c = if c == ' ' { '▁' } else { c };
                    extend_fixed(buf, c.encode_utf8(&mut utf8).as_bytes())?;
                }
                self.score_merge(buf, work, out)?;
            }
            Algo::Llama2c => {
                buf.clear();
                if prev_special && !text.is_empty() {
                    extend_fixed(buf, b" ")?;
                }
                extend_fixed(buf, text.as_bytes())?;
                self.score_merge(buf, work, out)?;
            }
        }
        Ok(())
    }

    fn lookup(&self, bytes: &[u8]) -> Option<u32> {
        self.token_to_id.get(bytes).copied()
    }

    /// Byte-level BPE of one pre-tokenizer chunk (`buf`: room for its mapped chars).
    fn bpe_word(
        &self,
        word: &[u8],
        ignore_merges: bool,
        buf: &mut Vec<u8>,
        work: &mut Merge,
        out: &mut IdSink,
    ) -> Result<(), Full> {
        if word.is_empty() {
            return Ok(());
        }
        if ignore_merges {
            let table = unicode::byte_to_char_table();
            buf.clear();
            let mut utf8 = [0u8; 4];
            for &b in word {
                extend_fixed(buf, table[b as usize].encode_utf8(&mut utf8).as_bytes())?;
            }
            if let Some(id) = self.lookup(buf) {
                out.push(id);
                return Ok(());
            }
        }
        if word.len() == 1 {
            if let Some(id) = self.byte_char_token[word[0] as usize] {
                out.push(id);
            }
            return Ok(());
        }
        let n = word.len() as u32;
        let Merge { syms, heap } = work;
        syms.clear();
        for i in 0..n {
            push_fixed(
                syms,
                Sym {
                    start: i,
                    len: 1,
                    prev: if i == 0 { NONE } else { i - 1 },
                    next: if i + 1 == n { NONE } else { i + 1 },
                    id: self.byte_char_token[word[i as usize] as usize].unwrap_or(NO_ID),
                },
            )?;
        }
        heap.clear();
        let push = |heap: &mut BinaryHeap<HeapEntry>, syms: &[Sym], l: u32, r: u32| {
            if l == NONE || r == NONE {
                return Ok(());
            }
            let (a, b) = (syms[l as usize].id, syms[r as usize].id);
            if a == NO_ID || b == NO_ID {
                return Ok(());
            }
            if let Some(&(rank, _)) = self.merges.get(&(a, b)) {
                if heap.len() == heap.capacity() {
                    return Err(Full);
                }
                heap.push(std::cmp::Reverse((rank, l, r, a, b)));
            }
            Ok(())
        };
        for i in 1..n {
            push(heap, syms, i - 1, i)?;
        }
        while let Some(std::cmp::Reverse((_, l, r, a, b))) = heap.pop() {
            let (li, ri) = (l as usize, r as usize);
            if syms[li].len == 0
                || syms[ri].len == 0
                || syms[li].id != a
                || syms[ri].id != b
                || syms[li].next != r
            {
                continue;
            }
            syms[li].id = self.merges[&(a, b)].1;
            let rn = absorb_right(syms, l);
            let lp = syms[li].prev;
            push(heap, syms, lp, l)?;
            push(heap, syms, l, rn)?;
        }
        let mut i = 0;
        while i != NONE {
            let s = syms[i as usize];
            if s.id != NO_ID {
                out.push(s.id);
            }
            i = s.next;
        }
        Ok(())
    }

    /// Score-driven BPE (SentencePiece, llama2.c) over the chars of `text`. When no token holds the
    /// word separator (`▁`, or ' ' for llama2.c) after another char, no merge can cross the start
    /// of a word, so each word is merged on its own (same result, a small heap per word).
    fn score_merge(&self, text: &[u8], work: &mut Merge, out: &mut IdSink) -> Result<(), Full> {
        let Some(sep) = self.word_sep.as_deref() else {
            return self.score_merge_span(text, work, out);
        };
        let mut start = 0;
        let mut at = 0;
        while let Some(p) = find(&text[at..], sep) {
            let pos = at + p;
            if pos > start && !text[..pos].ends_with(sep) {
                self.score_merge_span(&text[start..pos], work, out)?;
                start = pos;
            }
            at = pos + sep.len();
        }
        self.score_merge_span(&text[start..], work, out)
    }

    fn score_merge_span(
        &self,
        text: &[u8],
        work: &mut Merge,
        out: &mut IdSink,
    ) -> Result<(), Full> {
        if text.is_empty() {
            return Ok(());
        }
        let Merge { syms, heap } = work;
        syms.clear();
        let mut off = 0;
        while off < text.len() {
            let lead = text[off];
            let clen = match lead >> 4 {
                0xC | 0xD => 2,
                0xE => 3,
                0xF => 4,
                _ => 1,
            }
            .min(text.len() - off);
            let idx = syms.len() as u32;
            push_fixed(
                syms,
                Sym {
                    start: off as u32,
                    len: clen as u32,
                    prev: if idx == 0 { NONE } else { idx - 1 },
                    next: idx + 1,
                    id: NO_ID,
                },
            )?;
            off += clen;
        }
        let last = syms.len() - 1;
        syms[last].next = NONE;
        heap.clear();
        // Highest score first, then leftmost, then (as before) the larger right index and length.
        let push = |heap: &mut BinaryHeap<HeapEntry>, syms: &[Sym], l: u32, r: u32| {
            if l == NONE || r == NONE {
                return Ok(());
            }
            let (sl, sr) = (syms[l as usize], syms[r as usize]);
            let span = &text[sl.start as usize..(sr.start + sr.len) as usize];
            if let Some(id) = self.lookup(span) {
                if heap.len() == heap.capacity() {
                    return Err(Full);
                }
                let key = score_key(self.scores[id as usize]);
                heap.push(std::cmp::Reverse((!key, l, !r, !(span.len() as u32), 0)));
            }
            Ok(())
        };
        for i in 1..syms.len() as u32 {
            push(heap, syms, i - 1, i)?;
        }
        while let Some(std::cmp::Reverse((_, l, not_r, not_size, _))) = heap.pop() {
            let (r, size) = (!not_r, !not_size);
            let (li, ri) = (l as usize, r as usize);
            if syms[li].len == 0 || syms[ri].len == 0 || syms[li].len + syms[ri].len != size {
                continue;
            }
            let rn = absorb_right(syms, l);
            let lp = syms[li].prev;
            push(heap, syms, lp, l)?;
            push(heap, syms, l, rn)?;
        }
        let mut i = 0;
        while i != NONE {
            let s = syms[i as usize];
            let span = &text[s.start as usize..(s.start + s.len) as usize];
            match self.lookup(span) {
                Some(id) => out.push(id),
                None => {
                    for &b in span {
                        if let Some(id) = self.byte_token[b as usize] {
                            out.push(id);
                        }
                    }
                }
            }
            i = s.next;
        }
        Ok(())
    }

    /// Splits text into raw fragments and literal special tokens, longest token first (as llama.cpp's
    /// `tokenizer_st_partition`), into `frags` (`next`: room for a pass).
    fn partition(
        &self,
        text: &[u8],
        parse_special: bool,
        frags: &mut Vec<Frag>,
        next: &mut Vec<Frag>,
    ) -> Result<(), Full> {
        frags.clear();
        if !text.is_empty() {
            push_fixed(
                frags,
                Frag::Text {
                    start: 0,
                    end: text.len() as u32,
                },
            )?;
        }
        for (id, tok, user_defined) in &self.specials {
            if !parse_special && !user_defined {
                continue;
            }
            if tok.is_empty() {
                continue;
            }
            next.clear();
            for &f in frags.iter() {
                match f {
                    Frag::Token(_) => push_fixed(next, f)?,
                    Frag::Text { start, end } => {
                        let (mut start, end) = (start as usize, end as usize);
                        while let Some(p) = find(&text[start..end], tok) {
                            if p > 0 {
                                push_fixed(
                                    next,
                                    Frag::Text {
                                        start: start as u32,
                                        end: (start + p) as u32,
                                    },
                                )?;
                            }
                            push_fixed(next, Frag::Token(*id))?;
                            start += p + tok.len();
                        }
                        if start < end {
                            push_fixed(
                                next,
                                Frag::Text {
                                    start: start as u32,
                                    end: end as u32,
                                },
                            )?;
                        }
                    }
                }
            }
            std::mem::swap(frags, next);
        }
        Ok(())
    }

    /// The bytes token `id` decodes to: byte-level BPE tokens undo the GPT-2 byte map, SentencePiece
    /// tokens turn `▁` into spaces and `<0xAB>` into the byte 0xAB; control and unused tokens (and
    /// ids out of range) decode to no bytes.
    pub fn token_bytes(&self, id: u32) -> &[u8] {
        let i = id as usize;
        if i + 1 >= self.piece_off.len() {
            return &[];
        }
        &self.pieces[self.piece_off[i] as usize..self.piece_off[i + 1] as usize]
    }

    /// The bytes token `id` adds to a text when it follows token `prev`:
    /// [`token_bytes`](Self::token_bytes), less the leading space of a SentencePiece or llama2.c piece right
    /// after BOS (the space the encoder prepends), as llama2.c's run.c and llama.cpp drop it.
    pub fn piece_after(&self, prev: u32, id: u32) -> &[u8] {
        let piece = self.token_bytes(id);
        match piece {
            [b' ', rest @ ..] if self.strips_prefix_space() && Some(prev) == self.bos => rest,
            _ => piece,
        }
    }

    /// Whether the encoder prepends a space that decoding drops at the start of a text.
    fn strips_prefix_space(&self) -> bool {
        match self.algo {
            Algo::Spm => self.add_space_prefix,
            Algo::Llama2c => true,
            Algo::Bpe { .. } => false,
        }
    }

    /// Decodes `ids` to text (invalid UTF-8 replaced by U+FFFD). For SentencePiece and llama2.c
    /// vocabularies the one space the encoder prepends is stripped from the first text token when it
    /// is at the start or right after a leading BOS.
    pub fn decode(&self, ids: &[u32]) -> String {
        let mut bytes = Vec::with_capacity(ids.len() * 4);
        let strip = self.strips_prefix_space();
        for (k, &id) in ids.iter().enumerate() {
            let mut piece = self.token_bytes(id);
            let first_text = k == 0 || (k == 1 && Some(ids[0]) == self.bos);
            if strip && first_text && piece.first() == Some(&b' ') {
                piece = &piece[1..];
            }
            bytes.extend_from_slice(piece);
        }
        String::from_utf8_lossy(&bytes).into_owned()
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

/// A piece of the text to encode: raw text (byte offsets) or a literal special token.
#[derive(Clone, Copy)]
enum Frag {
    Text { start: u32, end: u32 },
    Token(u32),
}

/// The buffers of one merge: symbols and pending merges.
struct Merge<'s> {
    syms: &'s mut Vec<Sym>,
    heap: &'s mut BinaryHeap<HeapEntry>,
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
